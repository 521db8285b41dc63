"""``gymkube-router``'s entry point: settings from flags and the environment, then serve."""

from __future__ import annotations

import asyncio
import logging
import signal
import sys

from aiohttp import web
from pydantic import ValidationError
from pydantic_settings import SettingsError

from gymkube_envserver.router.app import Router
from gymkube_envserver.router.settings import RouterSettings

log = logging.getLogger("gymkube.router")


async def serve(settings: RouterSettings, started: asyncio.Event | None = None) -> None:
    """Run the router until cancelled."""
    router = Router(settings)
    await router.start()
    server = web.Server(router.handle, access_log=None)
    runner = web.ServerRunner(server)
    await runner.setup()
    site = web.TCPSite(runner, settings.host, settings.port, reuse_address=True)
    await site.start()
    log.info("gymkube-router listening on %s:%d", settings.host, settings.port)
    if started is not None:
        started.set()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    try:
        await stop.wait()
        if settings.shutdown_delay:
            log.info(
                "gymkube-router stopping in %.0f s: serving meanwhile", settings.shutdown_delay
            )
            await asyncio.sleep(settings.shutdown_delay)
        log.info("gymkube-router stopping: finishing requests in flight")
    finally:
        await router.close_tunnels()
        await runner.cleanup()
        await router.stop()
        log.info("gymkube-router stopped")


def main(argv: list[str] | None = None) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    try:
        settings = RouterSettings(_cli_parse_args=sys.argv[1:] if argv is None else argv)
    except ValidationError as exc:
        for error in exc.errors():
            where = ".".join(str(part) for part in error["loc"]) or "settings"
            print(f"gymkube-router: {where}: {error['msg']}", file=sys.stderr)
        raise SystemExit(2) from None
    except SettingsError as exc:
        print(f"gymkube-router: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    try:
        import uvloop
    except ImportError:
        runner = asyncio.Runner()
    else:
        runner = asyncio.Runner(loop_factory=uvloop.new_event_loop)
    with runner:
        runner.run(serve(settings))


if __name__ == "__main__":
    main()
