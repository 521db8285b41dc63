"""Env-server test helpers: real servers, in-process (ASGI) or on a free 127.0.0.1 port.

A plain module (not conftest.py): the test folders have no __init__.py, so each conftest is
imported as the same top-level name "conftest"."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import httpx
import uvicorn
from fastapi import FastAPI
from gymkube_envserver.app import create_app
from gymkube_envserver.envs.base import EnvBackend, EnvInstance
from gymkube_envserver.settings import ServerSettings

HERE = Path(__file__).parent


def settings(**overrides: Any) -> ServerSettings:
    """Test settings: no canary unless asked, small pools, nothing read from the environment."""
    values: dict[str, Any] = {
        "env": "frozen_lake",
        "host": "127.0.0.1",
        "port": 0,
        "max_sessions": 32,
        "warm": 1,
        "idle_timeout": 0,
        "canary_interval": 0,
    }
    values.update(overrides)
    return ServerSettings.model_construct(**values)


@asynccontextmanager
async def asgi_server(**overrides: Any) -> AsyncIterator[tuple[httpx.AsyncClient, FastAPI]]:
    """An in-process server (lifespan run, warm pool filled), a client for it, and its app."""
    app = create_app(settings(**overrides))
    async with app.router.lifespan_context(app):
        await wait_ready(app)
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://envserver") as client:
            yield client, app


@asynccontextmanager
async def asgi_client(**overrides: Any) -> AsyncIterator[httpx.AsyncClient]:
    """An in-process server (lifespan run, warm pool filled) and a client for it."""
    async with asgi_server(**overrides) as (client, _):
        yield client


async def wait_ready(app: FastAPI, timeout_s: float = 120.0) -> None:
    await asyncio.wait_for(app.state.manager.warmed_event.wait(), timeout_s)


@contextmanager
def live_server(**overrides: Any) -> Iterator[tuple[str, FastAPI]]:
    """A real uvicorn server in a thread on a free port; yields its base URL and the app."""
    app = create_app(settings(**overrides))
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="on")
    )
    thread = threading.Thread(target=server.run, name="envserver", daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 60
        while not server.started:
            if not thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("env server did not start")
            time.sleep(0.02)
        port = server.servers[0].sockets[0].getsockname()[1]
        yield f"http://127.0.0.1:{port}", app
    finally:
        server.should_exit = True
        thread.join(timeout=60)


def wait_until_ready(base_url: str, timeout_s: float = 180.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if httpx.get(f"{base_url}/readyz").status_code == 200:
            return
        time.sleep(0.2)
    raise TimeoutError(f"{base_url} not ready after {timeout_s} s")


def record_env_starts(
    backend: EnvBackend, on_start: Callable[[EnvInstance], None] | None = None
) -> list[EnvInstance]:
    """Every env the backend starts from now on, in order (a JVM start for ScienceWorld).

    ``on_start`` sees each new env before it is recorded, so a test can tamper with the first.
    """
    started: list[EnvInstance] = []
    start = backend.start

    async def recorded_start(env_config: dict[str, Any]) -> EnvInstance:
        instance = await start(env_config)
        if on_start is not None:
            on_start(instance)
        started.append(instance)
        return instance

    backend.start = recorded_start  # type: ignore[method-assign]
    return started
