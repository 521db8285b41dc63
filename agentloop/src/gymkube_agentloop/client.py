"""Async client for a gymkube env pool (or any AgentGym-style env server).

One aiohttp session per event loop is shared by every trajectory of a worker process, so
turns reuse keep-alive connections instead of paying a TCP handshake per trajectory.
`EnvClient` objects are cheap views over that session which keep per-trajectory statistics.

Retry policy, by call:
- `create`, `reset`, `close` and GETs repeat on refused connections, dropped connections,
  timeouts and 502/503/504, within `retry_deadline_s`, sleeping `Retry-After` on a 503.
- `step` is not idempotent: it repeats only when the request provably never reached the env
  (the connection could not be opened, or a 503 refusal).
- Once a session exists, its server being unreachable for `lost_after_s` means the session is
  lost: waiting longer cannot bring the episode back.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
import weakref
from collections import Counter
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, TypeVar

import aiohttp
from pydantic import BaseModel, Field, ValidationError

from gymkube_agentloop.protocol import (
    CreateReply,
    ErrorReply,
    ResetReply,
    StepReply,
    TasksReply,
    validation_problems,
)

# Statuses a router or proxy gives when a backend hiccups.
RETRYABLE_STATUSES = frozenset({502, 503, 504})


class ReplaySettings(BaseModel):
    """When and how far an episode whose session was lost is rebuilt on another server."""

    enabled: bool = Field(
        default=True, description="False: a lost session ends its episode (env_lost)."
    )
    max_replays: int = Field(default=2, ge=0, description="Replays one episode may start.")
    budget_s: float = Field(
        default=60.0, gt=0, description="Seconds one episode's replays may take together."
    )


class EnvClientSettings(BaseModel):
    """Timeouts and retry budget of env calls."""

    request_timeout_s: float = Field(default=120.0, gt=0)
    connect_timeout_s: float = Field(default=5.0, gt=0)
    retry_deadline_s: float = Field(default=120.0, ge=0)
    lost_after_s: float = Field(default=1.0, ge=0)
    backoff_initial_s: float = Field(default=0.05, gt=0)
    backoff_max_s: float = Field(default=5.0, gt=0)
    replay: ReplaySettings = Field(default_factory=ReplaySettings)


class EnvCallError(Exception):
    """An env call that failed for good (after any retries)."""

    def __init__(
        self,
        code: str,
        message: str,
        *,
        status: int | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(code, message)
        self.code = code
        self.message = message
        self.status = status
        self.retry_after = retry_after

    def __str__(self) -> str:
        return f"{self.code}: {self.message}" if self.message else self.code

    @property
    def session_gone(self) -> bool:
        """The call's session no longer exists anywhere: lost (410), unknown to its server (404),
        or its server unreachable."""
        return isinstance(self, EnvSessionLost) or self.status == 404 or self.code == "unreachable"


class EnvSessionLost(EnvCallError):
    """The session is gone (its server died or forgot it); the episode cannot go on."""


class _Attempt(Enum):
    """How far a failed request got, which decides whether repeating it is safe."""

    NOT_SENT = "not_sent"
    REFUSED = "refused"  # the server answered 503: it did not act on the request
    UNKNOWN = "unknown"  # it may have been processed
    FINAL = "final"  # an answer that repeating cannot change


class _AttemptFailed(Exception):
    def __init__(self, error: EnvCallError, how_far: _Attempt) -> None:
        super().__init__(str(error))
        self.error = error
        self.how_far = how_far


@dataclass
class CallStats:
    """Latencies and failures of one client's calls (one trajectory or one preflight episode)."""

    latencies_s: dict[str, list[float]] = field(default_factory=dict)
    errors: Counter[str] = field(default_factory=Counter)
    retries: Counter[str] = field(default_factory=Counter)

    @property
    def total_latency_s(self) -> float:
        return sum(sum(values) for values in self.latencies_s.values())

    def record(self, call: str, seconds: float) -> None:
        self.latencies_s.setdefault(call, []).append(seconds)


_sessions: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, aiohttp.ClientSession] = (
    weakref.WeakKeyDictionary()
)


def shared_session() -> aiohttp.ClientSession:
    """The process-wide HTTP session of the running event loop."""
    loop = asyncio.get_running_loop()
    session = _sessions.get(loop)
    if session is None or session.closed:
        # limit=0: one connection per in-flight trajectory; the pool, not the client, caps load.
        connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=60)
        session = aiohttp.ClientSession(connector=connector)
        _sessions[loop] = session
    return session


async def close_shared_session() -> None:
    session = _sessions.pop(asyncio.get_running_loop(), None)
    if session is not None:
        await session.close()


def _retry_after(headers: Any) -> float | None:
    value = headers.get("Retry-After")
    try:
        return max(0.0, float(value)) if value is not None else None
    except ValueError:
        return None


def _error_from_body(status: int, body: bytes, headers: Any) -> EnvCallError:
    retry_after = _retry_after(headers)
    try:
        detail = ErrorReply.model_validate_json(body).error
        code, message = detail.code, detail.message
    except ValidationError:
        code, message = f"http_{status}", body[:200].decode("utf-8", "replace")
    if status == 410:
        return EnvSessionLost(code, message, status=status, retry_after=retry_after)
    return EnvCallError(code, message, status=status, retry_after=retry_after)


_Reply = TypeVar("_Reply", bound=BaseModel)


def _parse(model: type[_Reply], path: str, payload: Any) -> _Reply:
    try:
        return model.model_validate(payload)
    except ValidationError as exc:
        problems = validation_problems(exc, "body")
        raise EnvCallError("bad_reply", f"{path} answered an unexpected body: {problems}") from None


class EnvClient:
    """Env calls against one base URL, with retries and per-client statistics."""

    def __init__(
        self,
        base_url: str,
        settings: EnvClientSettings | None = None,
        session: aiohttp.ClientSession | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.settings = settings or EnvClientSettings()
        self.stats = CallStats()
        self._session = session
        self._timeout = aiohttp.ClientTimeout(
            total=self.settings.request_timeout_s, sock_connect=self.settings.connect_timeout_s
        )

    async def tasks(self) -> TasksReply:
        return _parse(TasksReply, "/tasks", await self._call("GET", "/tasks", idempotent=True))

    async def create(self, env_config: dict[str, Any] | None = None) -> str:
        body = {"env_config": env_config} if env_config else {}
        payload = await self._call("POST", "/create", body, idempotent=True)
        return str(_parse(CreateReply, "/create", payload).id)

    async def reset(
        self, session_id: str, data_idx: int, seed: int | None = None, *, replay: bool = False
    ) -> ResetReply:
        """Start an episode; ``replay`` tells the server it rebuilds one whose session was lost."""
        body: dict[str, Any] = {"id": session_id, "data_idx": data_idx}
        if seed is not None:
            body["seed"] = seed
        if replay:
            body["replay"] = True
        payload = await self._call("POST", "/reset", body, idempotent=True, has_session=True)
        return _parse(ResetReply, "/reset", payload)

    async def step(self, session_id: str, action: str) -> StepReply:
        body = {"id": session_id, "action": action}
        payload = await self._call("POST", "/step", body, idempotent=False, has_session=True)
        return _parse(StepReply, "/step", payload)

    async def close(self, session_id: str, *, deadline_s: float | None = None) -> None:
        """Close a session; a session the server no longer knows counts as closed."""
        await self._call(
            "POST",
            "/close",
            {"id": session_id},
            idempotent=True,
            has_session=True,
            deadline_s=deadline_s,
            gone_is_done=True,
        )

    async def _call(
        self,
        method: str,
        path: str,
        body: dict[str, Any] | None = None,
        *,
        idempotent: bool,
        has_session: bool = False,
        deadline_s: float | None = None,
        gone_is_done: bool = False,
    ) -> Any:
        call = path.strip("/")
        session = self._session or shared_session()
        started = time.monotonic()
        deadline = started + (self.settings.retry_deadline_s if deadline_s is None else deadline_s)
        unreachable_since: float | None = None
        attempt = 0
        while True:
            attempt += 1
            try:
                payload = await self._attempt(session, method, path, body)
            except _AttemptFailed as failed:
                error, how_far = failed.error, failed.how_far
                # For a close, a session the server no longer has is the result wanted.
                if gone_is_done and error.status in (404, 410):
                    self.stats.record(call, time.monotonic() - started)
                    return None
            else:
                self.stats.record(call, time.monotonic() - started)
                return payload
            now = time.monotonic()
            unreachable_since = (unreachable_since or now) if how_far is _Attempt.NOT_SENT else None
            wait = error.retry_after
            if wait is None:
                backoff = self.settings.backoff_initial_s * 2 ** (attempt - 1)
                wait = min(self.settings.backoff_max_s, backoff) * random.uniform(0.5, 1.0)
            if has_session and (
                # A session lives on one server: once that server stays unreachable, waiting
                # out the whole deadline cannot bring the episode back.
                (
                    unreachable_since is not None
                    and now + wait - unreachable_since > self.settings.lost_after_s
                )
                # A step that may have run on a server that then vanished: its state is unknowable.
                or (not idempotent and how_far is _Attempt.UNKNOWN)
            ):
                error = EnvSessionLost(error.code, error.message, status=error.status)
            retryable = how_far in (_Attempt.NOT_SENT, _Attempt.REFUSED) or (
                idempotent and how_far is _Attempt.UNKNOWN
            )
            if isinstance(error, EnvSessionLost) or not retryable or now + wait > deadline:
                self.stats.errors[error.code] += 1
                if attempt > 1:
                    error.message += f" (after {attempt} attempts in {now - started:.1f}s)"
                raise error
            self.stats.retries[error.code] += 1
            await asyncio.sleep(wait)

    async def _attempt(
        self,
        session: aiohttp.ClientSession,
        method: str,
        path: str,
        body: dict[str, Any] | None,
    ) -> Any:
        """One request: its decoded JSON reply, or `_AttemptFailed` saying how far it got."""
        url = self.base_url + path
        try:
            async with session.request(
                method, url, json=body, timeout=self._timeout, allow_redirects=False
            ) as resp:
                raw = await resp.read()
                status, headers = resp.status, resp.headers
        except (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError) as exc:
            raise _AttemptFailed(
                EnvCallError("unreachable", f"{url}: {exc}"), _Attempt.NOT_SENT
            ) from exc
        except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError) as exc:
            raise _AttemptFailed(
                EnvCallError("disconnected", f"{url}: {exc}"), _Attempt.UNKNOWN
            ) from exc
        except TimeoutError as exc:
            message = f"{url}: no answer within {self.settings.request_timeout_s:g}s"
            raise _AttemptFailed(EnvCallError("timeout", message), _Attempt.UNKNOWN) from exc
        except aiohttp.ClientError as exc:
            raise _AttemptFailed(
                EnvCallError("transport", f"{url}: {exc}"), _Attempt.UNKNOWN
            ) from exc
        if status >= 300:
            error = _error_from_body(status, raw, headers)
            if status == 503:
                raise _AttemptFailed(error, _Attempt.REFUSED)
            how_far = _Attempt.UNKNOWN if status in RETRYABLE_STATUSES else _Attempt.FINAL
            raise _AttemptFailed(error, how_far)
        try:
            payload = json.loads(raw)
        except ValueError as exc:
            error = EnvCallError("bad_reply", f"{url}: reply is not JSON", status=status)
            raise _AttemptFailed(error, _Attempt.FINAL) from exc
        # AgentGym servers report failures as HTTP 200 with a top-level "error".
        if isinstance(payload, dict) and set(payload) == {"error"}:
            error = EnvCallError("env_error", str(payload["error"]), status=status)
            raise _AttemptFailed(error, _Attempt.FINAL)
        return payload


_tasks_by_url: dict[str, TasksReply] = {}
_tasks_in_flight: dict[tuple[asyncio.AbstractEventLoop, str], asyncio.Task[TasksReply]] = {}


async def fetch_tasks(base_url: str, settings: EnvClientSettings | None = None) -> TasksReply:
    """The pool's `/tasks`, fetched once per process: concurrent first callers share one GET."""
    cached = _tasks_by_url.get(base_url)
    if cached is not None:
        return cached
    key = (asyncio.get_running_loop(), base_url)
    task = _tasks_in_flight.get(key)
    if task is None:
        task = asyncio.ensure_future(EnvClient(base_url, settings).tasks())
        _tasks_in_flight[key] = task
        task.add_done_callback(lambda _: _tasks_in_flight.pop(key, None))
    reply = await asyncio.shield(task)
    _tasks_by_url[base_url] = reply
    return reply
