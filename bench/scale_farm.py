"""A loopback farm of env-server answers for thousands of fake (kwok) pods.

One aiohttp process answers the watchdog's calls for every pod, at
``http://127.0.0.1:<port>/<namespace>/<name>/<uid>`` (the operator's probe address template
``http://127.0.0.1:<port>/{namespace}/{name}/{uid}``): ``GET .../status`` with a healthy,
idle server's body, ``POST .../admin/drain``. Pods are made to fail by uid, so the pod that
replaces one answers again:

    POST /farm/freeze {"uid": ...}   its /status hangs (a hung JVM: the probe times out)
    POST /farm/kill   {"uid": ...}   its connections are dropped (a dead process)
    GET  /farm/stats                 {"probes": n, "frozen_probes": n, "uptime_seconds": s}
    GET  /farm/probes                {uid: probes of that pod, ...}

    .venv/bin/python bench/scale_farm.py [--port 0]   # prints {"port": N} once listening
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import sys
import time

from aiohttp import web

FREEZE_SECONDS = 3600.0


class Farm:
    def __init__(self) -> None:
        self.frozen: set[str] = set()
        self.dead: set[str] = set()
        self.probes = 0
        self.pod_probes: collections.Counter[str] = collections.Counter()
        self.frozen_probes = 0
        self.started = time.monotonic()

    async def status(self, request: web.Request) -> web.StreamResponse:
        uid = request.match_info["uid"]
        self.probes += 1
        self.pod_probes[uid] += 1
        if uid in self.dead:
            if request.transport is not None:
                request.transport.close()
            raise web.HTTPServiceUnavailable()
        if uid in self.frozen:
            self.frozen_probes += 1
            await asyncio.sleep(FREEZE_SECONDS)
        # What an idle, warm gymkube-envserver reports; its canary just ran.
        body = {
            "active": 0,
            "capacity": 4,
            "warm": 1,
            "served": 0,
            "draining": False,
            "ready": True,
            "canary": {"ok": True, "at": time.time(), "error": None},
        }
        return web.json_response(body)

    async def drain(self, _: web.Request) -> web.StreamResponse:
        return web.json_response({"draining": True})

    async def freeze(self, request: web.Request) -> web.StreamResponse:
        self.frozen.add((await request.json())["uid"])
        return web.json_response({"frozen": sorted(self.frozen)})

    async def kill(self, request: web.Request) -> web.StreamResponse:
        self.dead.add((await request.json())["uid"])
        return web.json_response({"dead": sorted(self.dead)})

    async def stats(self, _: web.Request) -> web.StreamResponse:
        return web.json_response(
            {
                "probes": self.probes,
                "frozen_probes": self.frozen_probes,
                "uptime_seconds": round(time.monotonic() - self.started, 3),
            }
        )

    async def probes_by_pod(self, _: web.Request) -> web.StreamResponse:
        return web.json_response(dict(self.pod_probes))


def make_app(farm: Farm) -> web.Application:
    app = web.Application()
    app.add_routes(
        [
            web.post("/farm/freeze", farm.freeze),
            web.post("/farm/kill", farm.kill),
            web.get("/farm/stats", farm.stats),
            web.get("/farm/probes", farm.probes_by_pod),
            web.get("/{namespace}/{name}/{uid}/status", farm.status),
            web.post("/{namespace}/{name}/{uid}/admin/drain", farm.drain),
        ]
    )
    return app


async def serve(port: int) -> None:
    runner = web.AppRunner(make_app(Farm()), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", port, backlog=4096)
    await site.start()
    bound = runner.addresses[0][1]
    print(json.dumps({"port": bound}), flush=True)
    await asyncio.Event().wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--port", type=int, default=0)
    options = parser.parse_args()
    try:
        asyncio.run(serve(options.port))
    except KeyboardInterrupt:
        sys.exit(0)


if __name__ == "__main__":
    main()
