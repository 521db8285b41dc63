"""``gymkube-envserver``: run the env server (flags or GYMKUBE_* environment variables)."""

from __future__ import annotations

import logging
import socket
import sys

import uvicorn
from pydantic import ValidationError
from pydantic_settings import CliApp, SettingsError

from gymkube_envserver.app import create_app
from gymkube_envserver.envs import EnvSpecError
from gymkube_envserver.settings import ServerSettings


def main(argv: list[str] | None = None) -> None:
    try:
        settings = CliApp.run(ServerSettings, cli_args=sys.argv[1:] if argv is None else argv)
        app = create_app(settings)
    except (ValidationError, SettingsError, EnvSpecError) as exc:
        print(f"gymkube-envserver: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    logging.basicConfig(
        level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    # py4j logs every JVM shutdown with a traceback at INFO; ScienceWorld logs every task load.
    for chatty in ("py4j", "scienceworld"):
        logging.getLogger(chatty).setLevel(max(logging.WARNING, logging.getLogger().level))
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level,
        loop="uvloop",
        http="httptools",
        access_log=False,
        timeout_graceful_shutdown=30,
    )
    ports = [settings.port] if settings.admin_port is None else [settings.port, settings.admin_port]
    sockets = [_listen(settings.host, port) for port in ports]
    # One server, one event loop, one session manager on both the session and the admin port.
    uvicorn.Server(config).run(sockets=sockets)


def _listen(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        print(f"gymkube-envserver: cannot listen on {host}:{port}: {exc.strerror}", file=sys.stderr)
        raise SystemExit(2) from None
    sock.set_inheritable(True)
    return sock


if __name__ == "__main__":
    main()
