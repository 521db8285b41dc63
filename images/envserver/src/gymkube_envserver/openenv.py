"""OpenEnv's protocol on the gymkube env server: the ``/ws`` session socket and its HTTP endpoints.

One WebSocket connection is one session of the server's ``SessionManager``, so WebSocket and
AgentGym HTTP sessions share capacity, the warm pool, idle reaping and draining. Frames are the
ones OpenEnv 0.10's ``EnvClient`` sends and reads (``reset`` / ``step`` / ``state`` / ``close``
in, ``observation`` / ``state`` / ``error`` out); OpenEnv's stateless HTTP ``/reset`` and ``/step``
are not served (gymkube's AgentGym ``/reset`` and ``/step`` own those paths, and neither
OpenEnv's client nor ms-swift's calls them).

The wire constants (paths, close codes, error codes, the placement header) live in
``gymkube_envserver.openenv_wire``, which the router imports too: it closes a tunnelled socket
with ``SESSION_LOST`` when the env server behind it dies or freezes.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from typing import Any

from fastapi import FastAPI, WebSocket
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.websockets import WebSocketDisconnect, WebSocketState

from gymkube_envserver import __version__
from gymkube_envserver.envs.base import EnvBackend, ResetParams
from gymkube_envserver.errors import ApiError
from gymkube_envserver.openenv_wire import (
    PLACEMENT_HEADER,
    WS_PATH,
    CloseCode,
    OpenEnvErrorCode,
    close_reason,
    error_frame,
)
from gymkube_envserver.sessions import Session, SessionManager
from gymkube_envserver.settings import ServerSettings
from gymkube_envserver.wire import MAX_ACTION_CHARS, RETRY_AFTER_CODES, ErrorCode

log = logging.getLogger(__name__)


class ResetData(BaseModel):
    """``data`` of a reset frame. Unknown keys are dropped, as OpenEnv drops kwargs ``reset``
    does not take."""

    model_config = ConfigDict(extra="ignore")

    seed: int | None = None
    episode_id: str | None = Field(default=None, max_length=255)
    data_idx: int | None = Field(default=None, description="gymkube's task index (see /tasks).")
    env_config: dict[str, Any] | None = None


class TextAction(BaseModel):
    """``data`` of a step frame: the model's text, as OpenEnv's TextArena action."""

    model_config = ConfigDict(extra="forbid")

    message: str = Field(max_length=MAX_ACTION_CHARS)
    metadata: dict[str, Any] = Field(default_factory=dict)


class TextObservation(BaseModel):
    """``data.observation`` of an observation frame (``reward``, ``done`` sit beside it)."""

    prompt: str = Field(description="What the model sees next: the env's observation text.")
    task_description: str | None = Field(default=None, description="Only in reset replies.")


class EpisodeMetadata(BaseModel):
    """``data.metadata`` of an observation frame."""

    score: float = Field(description="The episode's score in the env's own scale (see /tasks).")
    step_count: int
    info: dict[str, Any] = Field(default_factory=dict)


class SessionState(BaseModel):
    """``data`` of a state frame."""

    episode_id: str | None
    step_count: int
    session_id: str
    data_idx: int | None
    done: bool
    score: float
    episodes: int


class HealthAnswer(BaseModel):
    status: str = "healthy"


class MetadataAnswer(BaseModel):
    name: str
    description: str
    version: str
    max_sessions: int


class SchemaAnswer(BaseModel):
    action: dict[str, Any]
    observation: dict[str, Any]
    state: dict[str, Any]


_SCHEMA = SchemaAnswer(
    action=TextAction.model_json_schema(),
    observation=TextObservation.model_json_schema(),
    state=SessionState.model_json_schema(),
)
# gymkube codes that end the session, with the close code that says so.
_SESSION_ENDING = {
    ErrorCode.SESSION_LOST: CloseCode.SESSION_LOST,
    ErrorCode.SESSION_NOT_FOUND: CloseCode.SESSION_EXPIRED,
}


# OpenEnv's client reconnects by itself after a close, onto a new session that was never reset.
_NEW_SESSION_HINT = (
    " (each connection is its own session: a client that reconnected after its socket was "
    "closed must reset again)"
)


class _SessionEnded(Exception):
    def __init__(self, code: CloseCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def _problems(exc: ValidationError) -> list[dict[str, Any]]:
    # Locations and messages only: echoing the input could return a megabyte.
    return [{"loc": list(err["loc"]), "msg": err["msg"]} for err in exc.errors()[:5]]


class OpenEnvSession:
    """One WebSocket connection playing one session."""

    def __init__(self, websocket: WebSocket, manager: SessionManager, session: Session) -> None:
        self.websocket = websocket
        self.manager = manager
        self.session = session
        self.episode_id: str | None = None

    async def serve(self) -> None:
        timeout = self.manager.settings.idle_timeout
        # How often an idle socket checks whether the reaper closed its session.
        check = min(max(timeout / 4, 0.05), 5.0) if timeout > 0 else None
        while True:
            try:
                async with asyncio.timeout(check):
                    message = await self.websocket.receive()
            except TimeoutError:
                self._still_open()
                continue
            if message["type"] == "websocket.disconnect":
                return
            raw = message.get("text")
            if raw is None:
                raw = (message.get("bytes") or b"").decode(errors="replace")
            reply = await self.answer(raw)
            if reply is None:
                return
            await self.websocket.send_text(reply)

    def _still_open(self) -> None:
        if self.manager.sessions.get(self.session.id) is not self.session:
            try:
                self.manager.get(self.session.id)
            except ApiError as exc:
                raise _SessionEnded(
                    _SESSION_ENDING.get(exc.code, CloseCode.SESSION_EXPIRED), exc.message
                ) from None

    async def answer(self, raw: str) -> str | None:
        """The reply frame to one client frame; None after a close frame."""
        try:
            frame = json.loads(raw)
        except ValueError as exc:
            return error_frame(OpenEnvErrorCode.INVALID_JSON, f"Invalid JSON: {exc}")
        kind = frame.get("type") if isinstance(frame, dict) else None
        data = frame.get("data") if isinstance(frame, dict) else None
        try:
            if kind == "step":
                return await self._step(TextAction.model_validate(data or {}))
            if kind == "reset":
                return await self._reset(ResetData.model_validate(data or {}))
            if kind == "state":
                return self._state()
            if kind == "close":
                return None
        except ValidationError as exc:
            return error_frame(
                OpenEnvErrorCode.VALIDATION_ERROR, "Invalid message", errors=_problems(exc)
            )
        except ApiError as exc:
            ending = _SESSION_ENDING.get(exc.code)
            if ending is not None:
                raise _SessionEnded(ending, exc.message) from None
            code = (
                OpenEnvErrorCode.VALIDATION_ERROR
                if exc.code == ErrorCode.BAD_REQUEST
                else OpenEnvErrorCode.EXECUTION_ERROR
            )
            message = exc.message
            if exc.code == ErrorCode.EPISODE_NOT_STARTED:
                message += _NEW_SESSION_HINT
            return error_frame(code, message, gymkube_code=exc.code.value)
        return error_frame(
            OpenEnvErrorCode.UNKNOWN_TYPE,
            f"Unknown message type: {kind!r} (gymkube serves reset, step, state and close)",
        )

    async def _reset(self, data: ResetData) -> str:
        params = ResetParams(
            data_idx=data.data_idx, seed=data.seed, env_config=data.env_config or {}
        )
        _, outcome = await self.manager.reset(self.session.id, params)
        self.episode_id = data.episode_id
        observation: dict[str, Any] = {"prompt": outcome.observation}
        if outcome.task_description:
            observation["task_description"] = outcome.task_description
        return _observation_frame(
            observation, outcome.reward, outcome.done, outcome.score, 0, outcome.info
        )

    async def _step(self, action: TextAction) -> str:
        outcome = await self.manager.step(self.session.id, action.message)
        return _observation_frame(
            {"prompt": outcome.observation},
            outcome.reward,
            outcome.done,
            outcome.score,
            self.session.steps,
            outcome.info,
        )

    def _state(self) -> str:
        session = self.manager.get(self.session.id)
        state = SessionState(
            episode_id=self.episode_id,
            step_count=session.steps,
            session_id=session.id,
            data_idx=session.data_idx,
            done=session.done,
            score=session.score,
            episodes=session.episodes,
        )
        return json.dumps({"type": "state", "data": state.model_dump()})


def _observation_frame(
    observation: dict[str, Any],
    reward: float,
    done: bool,
    score: float,
    step_count: int,
    info: dict[str, Any],
) -> str:
    # Built as a plain dict: this runs on every step, and pydantic adds nothing to a fixed shape.
    metadata = {"score": score, "step_count": step_count, "info": info}
    return json.dumps(
        {
            "type": "observation",
            "data": {
                "observation": observation,
                "reward": reward,
                "done": done,
                "metadata": metadata,
            },
        },
        ensure_ascii=False,
    )


async def _close(websocket: WebSocket, code: CloseCode, reason: str) -> None:
    if websocket.application_state == WebSocketState.CONNECTED:
        with contextlib.suppress(RuntimeError, WebSocketDisconnect, OSError):
            # (raised when the client went away first)
            await websocket.close(code, close_reason(reason))


async def serve_websocket(websocket: WebSocket, manager: SessionManager) -> None:
    """One OpenEnv session for the life of the connection."""
    refusal = manager.refusal() if PLACEMENT_HEADER in websocket.headers else None
    if refusal is not None:
        await websocket.send_denial_response(refusal.response())
        return
    await websocket.accept()
    try:
        session = await manager.create({})
    except ApiError as exc:
        # OpenEnv's own answer to a full server: accept, say why, close normally. Its client
        # raises it from the first reset (ms-swift then retries after 2 s and 4 s).
        code = (
            OpenEnvErrorCode.CAPACITY_REACHED
            if exc.code in RETRY_AFTER_CODES
            else OpenEnvErrorCode.SESSION_ERROR
        )
        await websocket.send_text(
            error_frame(
                code,
                exc.message,
                gymkube_code=exc.code.value,
                active_sessions=manager.active,
                max_sessions=manager.settings.max_sessions,
            )
        )
        await _close(websocket, CloseCode.NORMAL, exc.message)
        return
    try:
        await OpenEnvSession(websocket, manager, session).serve()
    except _SessionEnded as ended:
        await _send_quietly(websocket, error_frame(OpenEnvErrorCode.SESSION_ERROR, ended.message))
        await _close(websocket, ended.code, ended.message)
    except WebSocketDisconnect:
        pass
    finally:
        manager.close(session.id)
    await _close(websocket, CloseCode.NORMAL, "session closed")


async def _send_quietly(websocket: WebSocket, text: str) -> None:
    with contextlib.suppress(RuntimeError, WebSocketDisconnect, OSError):
        await websocket.send_text(text)


def add_openenv_routes(
    app: FastAPI, manager: SessionManager, backend: EnvBackend, settings: ServerSettings
) -> None:
    """Serve OpenEnv's WebSocket session endpoint and HTTP endpoints beside AgentGym's."""

    @app.websocket(WS_PATH)
    async def openenv_session(websocket: WebSocket) -> None:
        await serve_websocket(websocket, manager)

    @app.get("/health", summary="OpenEnv liveness: the server answers.")
    async def health() -> HealthAnswer:
        return HealthAnswer()

    @app.get("/metadata", summary="OpenEnv metadata of the env this server hosts.")
    async def metadata() -> MetadataAnswer:
        return MetadataAnswer(
            name=backend.name,
            description=f"gymkube env server for {backend.name} (OpenEnv WebSocket at {WS_PATH})",
            version=__version__,
            max_sessions=settings.max_sessions,
        )

    @app.get("/schema", summary="OpenEnv JSON Schemas of the action, observation and state.")
    async def schema() -> SchemaAnswer:
        return _SCHEMA
