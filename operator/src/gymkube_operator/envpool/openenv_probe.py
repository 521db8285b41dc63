"""The watchdog's probe of an OpenEnv server (an EnvPool with ``env: openenv``).

Such a server has no ``/status``: it is alive while ``GET /health`` answers, and healthy while
a canary episode over its ``/ws`` socket (connect, reset, close) gets an observation back. A
full server (``CAPACITY_REACHED``) is healthy. Sessions are not reported, so the probe counts
none; the router's metrics count the sockets it tunnels.
"""

import json
import time

import aiohttp

from gymkube_operator.envpool.fetch import get_page
from gymkube_operator.envpool.models import WatchdogSpec
from gymkube_operator.envpool.watchdog import Failure, Probe

# When each server last ran its canary (time.monotonic()): one per canaryIntervalSeconds.
_last_canary: dict[str, float] = {}


async def probe_openenv_server(
    session: aiohttp.ClientSession, base_url: str, policy: WatchdogSpec
) -> Probe:
    _, failed = await get_page(session, base_url, "/health", policy)
    if failed is not None:
        return failed
    interval = policy.canary_interval_seconds
    now = time.monotonic()
    if not interval or now - _last_canary.get(base_url, -interval) < interval:
        return Probe(None)
    _last_canary[base_url] = now
    problem = await _canary(session, base_url, policy.canary_timeout_seconds)
    return Probe(Failure.CANARY_FAILED, f"canary failed: {problem}") if problem else Probe(None)


async def _canary(session: aiohttp.ClientSession, base_url: str, seconds: int) -> str | None:
    """None when a reset over /ws gets an observation (or the server is full), else why not."""
    try:
        async with session.ws_connect(
            f"{base_url}/ws", timeout=aiohttp.ClientWSTimeout(ws_close=seconds)
        ) as ws:
            await ws.send_str(json.dumps({"type": "reset", "data": {}}))
            reply = await ws.receive_json(timeout=seconds)
            await ws.send_str(json.dumps({"type": "close"}))
    except TimeoutError:
        return f"no reply to a reset within {seconds}s"
    except (aiohttp.ClientError, ValueError, TypeError) as error:
        return f"{type(error).__name__}: {error}"
    kind = reply.get("type") if isinstance(reply, dict) else None
    data = reply.get("data") if isinstance(reply, dict) else None
    if kind == "observation" or (
        kind == "error" and isinstance(data, dict) and data.get("code") == "CAPACITY_REACHED"
    ):
        return None
    return f"reset answered {str(reply)[:200]}"
