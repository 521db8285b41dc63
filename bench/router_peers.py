"""What bench/router.py measures the router against, each run as its own process:

python bench/router_peers.py naive-proxy --backend HOST:PORT --port N   # a plain aiohttp proxy
python bench/router_peers.py canned-server --port N                     # answers in a few µs
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from typing import Any, cast

import uvloop

# -- the plain pass-through proxy we compare against ------------------------------------------


def naive_proxy(argv: list[str]) -> None:
    """A first aiohttp proxy: forward method, path, query and body to one backend."""
    import aiohttp
    from aiohttp import web

    parser = argparse.ArgumentParser(prog="naive-proxy")
    parser.add_argument("--backend", required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args(argv)
    base = f"http://{args.backend}"

    async def forward(request: web.Request) -> web.Response:
        body = await request.read()
        session: aiohttp.ClientSession = request.app["http"]
        async with session.request(
            request.method,
            base + request.path_qs,
            data=body,
            headers={"Content-Type": "application/json"},
        ) as response:
            return web.Response(
                body=await response.read(),
                status=response.status,
                content_type="application/json",
            )

    async def client_session(app: web.Application) -> Any:
        app["http"] = aiohttp.ClientSession()
        yield
        await app["http"].close()

    async def readyz(request: web.Request) -> web.Response:
        return web.json_response({"ready": True})

    app = web.Application()
    app.router.add_get("/readyz", readyz)
    app.router.add_route("*", "/{path:.*}", forward)
    app.cleanup_ctx.append(client_session)
    web.run_app(
        app,
        host=args.host,
        port=args.port,
        print=None,
        access_log=None,
        loop=uvloop.new_event_loop(),
    )


# -- a canned env server, to find the router's own floor --------------------------------------


def _canned(body: dict[str, Any]) -> bytes:
    payload = json.dumps(body).encode()
    return b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (
        len(payload),
        payload,
    )


_CANNED = {
    b"/step": _canned(
        {
            "observation": "You moved up.\nF F H F\nF P F F",
            "reward": 0.0,
            "score": 0.0,
            "done": False,
            "info": {},
        }
    ),
    b"/status": _canned(
        {
            "env": "canned",
            "active": 0,
            "capacity": 10_000,
            "warm": 0,
            "warm_target": 0,
            "draining": False,
            "served": 0,
            "ready": True,
            "canary": {},
        }
    ),
    # /reset and /readyz
    b"": _canned(
        {
            "id": "s0",
            "observation": "start",
            "task_description": "canned",
            "reward": 0.0,
            "score": 0.0,
            "done": False,
            "ready": True,
        }
    ),
}


class CannedServer(asyncio.Protocol):
    """Answers the env protocol with fixed bodies at a few µs per request.

    Not an env: it only lets the router, not the env server, be the bottleneck, so the
    router's own CPU per request shows without scheduler wake-ups between idle periods.
    """

    created = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)
        self._buffer = b""

    def data_received(self, data: bytes) -> None:
        self._buffer += data
        while (end := self._buffer.find(b"\r\n\r\n")) >= 0:
            head = self._buffer[:end].lower()
            at = head.find(b"content-length:")
            length = int(head[at + 15 :].split(b"\r\n")[0]) if at >= 0 else 0
            if len(self._buffer) < end + 4 + length:
                return
            self._buffer = self._buffer[end + 4 + length :]
            path = head.split(b" ", 2)[1]
            if path == b"/create":
                CannedServer.created += 1
                self._transport.write(_canned({"id": f"s{CannedServer.created}"}))
            else:
                self._transport.write(_CANNED.get(path, _CANNED[b""]))


def canned_server(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="canned-server")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args(argv)

    async def serve() -> None:
        server = await asyncio.get_running_loop().create_server(CannedServer, args.host, args.port)
        await server.serve_forever()

    uvloop.run(serve())


def main() -> None:
    peers = {"naive-proxy": naive_proxy, "canned-server": canned_server}
    if sys.argv[1:2] and sys.argv[1] in peers:
        peers[sys.argv[1]](sys.argv[2:])
        return
    raise SystemExit(f"usage: router_peers.py {{{','.join(peers)}}} ...")


if __name__ == "__main__":
    main()
