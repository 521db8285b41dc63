"""Free loopback ports for the servers that tests and benchmarks start."""

import socket


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now, held back from other callers.

    The port is returned in TIME_WAIT (a connection to it, closed from the listening side
    first), so for about a minute the kernel gives it to no one asking for any free port
    (`bind` to port 0, here or in another process) while a server binding it by number with
    SO_REUSEADDR, as uvicorn, Go, torch and ZeroMQ do, still gets it. Without the hold, two
    pytest workers could be handed one port while a slow server (a JVM env) was still starting.
    """
    with socket.socket() as listener:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        port: int = listener.getsockname()[1]
        with socket.create_connection(("127.0.0.1", port)):
            accepted, _ = listener.accept()
            accepted.close()
    return port
