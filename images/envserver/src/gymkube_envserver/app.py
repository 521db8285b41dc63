"""The FastAPI app: the gymkube env wire protocol over one env backend."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Annotated, Any

from fastapi import Body, FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Receive, Scope, Send

from gymkube_envserver import __version__
from gymkube_envserver.canary import Canary
from gymkube_envserver.envs import EnvSpecError, load_backend
from gymkube_envserver.envs.base import EnvBackend, EnvInputError, ResetParams
from gymkube_envserver.errors import ApiError, error_json
from gymkube_envserver.metrics import MetricsMiddleware, ServerMetrics
from gymkube_envserver.openenv import add_openenv_routes
from gymkube_envserver.sessions import SessionManager
from gymkube_envserver.settings import ServerSettings
from gymkube_envserver.wire import (
    ERROR_STATUS,
    MAX_ID_CHARS,
    CloseRequest,
    CloseResponse,
    CreateRequest,
    CreateResponse,
    DetailResponse,
    DrainRequest,
    DrainResponse,
    ErrorBody,
    ErrorCode,
    HealthResponse,
    ReadyResponse,
    ResetRequest,
    ResetResponse,
    StatusResponse,
    StepRequest,
    StepResponse,
    TasksResponse,
    error_body,
)

MAX_BODY_BYTES = 2 * 1024 * 1024
"""Requests declaring a larger body are refused with 413 before it is read."""

SessionQuery = Annotated[str, Query(min_length=1, max_length=MAX_ID_CHARS)]

log = logging.getLogger(__name__)


def _errors(*codes: ErrorCode) -> dict[int | str, dict[str, Any]]:
    """OpenAPI ``responses`` entries for the error codes an endpoint can answer."""
    documented: dict[int | str, dict[str, Any]] = {}
    for code in codes:
        status = ERROR_STATUS[code]
        entry = documented.setdefault(status, {"model": ErrorBody, "description": ""})
        entry["description"] = " | ".join(filter(None, [entry["description"], code.value]))
    return documented


COMMON_ERRORS = (ErrorCode.BAD_REQUEST, ErrorCode.PAYLOAD_TOO_LARGE)
SESSION_ERRORS = (
    *COMMON_ERRORS,
    ErrorCode.SESSION_NOT_FOUND,
    ErrorCode.SESSION_LOST,
    ErrorCode.ENV_FAILURE,
)


def error_response(
    request: Request, code: ErrorCode, message: str, retry_after_s: int | None = None
) -> JSONResponse:
    request.state.error_code = code.value
    return error_json(code, message, retry_after_s)


def _validation_message(exc: RequestValidationError) -> str:
    # Only locations and messages: echoing the input back could return a megabyte.
    problems = []
    for err in exc.errors()[:5]:
        where = ".".join(str(part) for part in err.get("loc", ())) or "request"
        problems.append(f"{where}: {err.get('msg', 'invalid')}")
    return "; ".join(problems) or "invalid request"


class BodyLimitMiddleware:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            for name, value in scope["headers"]:
                if name == b"content-length" and value.isdigit() and int(value) > MAX_BODY_BYTES:
                    scope.setdefault("state", {})["error_code"] = ErrorCode.PAYLOAD_TOO_LARGE.value
                    body = error_body(
                        ErrorCode.PAYLOAD_TOO_LARGE,
                        f"request body over {MAX_BODY_BYTES} bytes",
                    )
                    response = JSONResponse(body, status_code=413)
                    await response(scope, receive, send)
                    return
        await self.app(scope, receive, send)


def _only_on_admin_port(request: Request, settings: ServerSettings) -> None:
    """With an admin port, /admin/* does not exist on the session port, so anything that can reach
    sessions cannot drain the server."""
    if settings.admin_port is None:
        return
    _, local_port = request.scope.get("server") or (None, None)
    if local_port != settings.admin_port:
        raise ApiError(ErrorCode.NOT_FOUND, f"{request.url.path} is served on the admin port only")


def create_app(settings: ServerSettings, backend: EnvBackend | None = None) -> FastAPI:
    """The env server for ``settings.env`` (or the given backend); EnvSpecError when
    ``settings.env_config`` is not a valid env_config of that env."""
    env_backend = backend or load_backend(settings)
    try:
        env_backend.check_config(settings.env_config)
    except EnvInputError as exc:
        raise EnvSpecError(f"--env-config: {exc}") from None
    manager = SessionManager(env_backend, settings)
    canary = Canary(manager, settings.canary_interval, settings.canary_timeout)
    metrics = ServerMetrics(manager, canary)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        await manager.start()
        canary.start()
        try:
            yield
        finally:
            await canary.stop()
            await manager.stop()

    app = FastAPI(
        title="gymkube env server",
        version=__version__,
        summary=f"AgentGym-compatible env server for {env_backend.name}",
        lifespan=lifespan,
    )
    app.state.manager = manager
    app.state.canary = canary
    app.state.metrics = metrics
    app.add_middleware(BodyLimitMiddleware)
    app.add_middleware(MetricsMiddleware, metrics=metrics)
    add_openenv_routes(app, manager, env_backend, settings)

    @app.exception_handler(ApiError)
    async def on_api_error(request: Request, exc: ApiError) -> JSONResponse:
        return error_response(request, exc.code, exc.message, exc.retry_after_header_s)

    @app.exception_handler(RequestValidationError)
    async def on_invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        return error_response(request, ErrorCode.BAD_REQUEST, _validation_message(exc))

    @app.exception_handler(StarletteHTTPException)
    async def on_http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        if exc.status_code == 405:
            return error_response(request, ErrorCode.METHOD_NOT_ALLOWED, "method not allowed")
        if exc.status_code == 404:
            return error_response(request, ErrorCode.NOT_FOUND, f"no endpoint {request.url.path}")
        return error_response(request, ErrorCode.BAD_REQUEST, str(exc.detail))

    @app.exception_handler(Exception)
    async def on_bug(request: Request, exc: Exception) -> JSONResponse:
        return error_response(request, ErrorCode.INTERNAL, f"{type(exc).__name__}: {exc}"[:500])

    @app.get("/", response_model=str)
    async def root() -> str:
        return f"This is the gymkube env server for {env_backend.name}."

    @app.post(
        "/create",
        responses=_errors(
            *COMMON_ERRORS,
            ErrorCode.AT_CAPACITY,
            ErrorCode.DRAINING,
            ErrorCode.NOT_READY,
            ErrorCode.ENV_FAILURE,
        ),
        summary="Open a session (503 with Retry-After at capacity or while draining).",
    )
    async def create(
        request: Request, body: Annotated[CreateRequest | None, Body()] = None
    ) -> CreateResponse:
        env_config = (body.env_config if body else None) or {}
        session = await manager.create(env_config)
        if await request.is_disconnected():
            # The client gave up while its env started (a cold JVM takes a second or more):
            # nobody will learn this id, so the env is freed now, not by the idle reaper.
            log.info("closing session %s: its client left during /create", session.id)
            manager.close(session.id)
        return CreateResponse(id=session.id)

    @app.post(
        "/reset",
        responses=_errors(*SESSION_ERRORS),
        summary="Start an episode: data_idx picks the task.",
    )
    async def reset(body: ResetRequest) -> ResetResponse:
        params = ResetParams(
            data_idx=body.data_idx, seed=body.seed, env_config=body.env_config or {}
        )
        session, outcome = await manager.reset(body.id, params, replay=body.replay)
        return ResetResponse(
            id=session.id,
            observation=outcome.observation,
            task_description=outcome.task_description,
            reward=outcome.reward,
            score=outcome.score,
            done=outcome.done,
            data_idx=body.data_idx,
            info=outcome.info,
            **outcome.extra,
        )

    @app.post(
        "/step",
        responses=_errors(*SESSION_ERRORS, ErrorCode.EPISODE_FINISHED),
        summary="Take one action (409 after done or before reset).",
    )
    async def step(body: StepRequest) -> StepResponse:
        outcome = await manager.step(body.id, body.action)
        return StepResponse(
            observation=outcome.observation,
            reward=outcome.reward,
            score=outcome.score,
            done=outcome.done,
            info=outcome.info,
        )

    @app.post("/close", responses=_errors(*COMMON_ERRORS), summary="Close a session (idempotent).")
    async def close(body: CloseRequest) -> CloseResponse:
        return CloseResponse(id=body.id, closed=True, was_open=manager.close(body.id))

    @app.get(
        "/observation",
        response_model=str,
        responses=_errors(
            *COMMON_ERRORS, ErrorCode.SESSION_NOT_FOUND, ErrorCode.EPISODE_NOT_STARTED
        ),
        summary="The session's last observation, as a JSON string.",
    )
    async def observation(id: SessionQuery) -> str:
        session = manager.get(id)
        if session.observation is None:
            raise ApiError(ErrorCode.EPISODE_NOT_STARTED, f"session {id!r} needs /reset first")
        return session.observation

    @app.get(
        "/detail",
        responses=_errors(*COMMON_ERRORS, ErrorCode.SESSION_NOT_FOUND),
        summary="What the server knows about a session's episode.",
    )
    async def detail(id: SessionQuery) -> DetailResponse:
        session = manager.get(id)
        return DetailResponse(
            id=session.id,
            env=env_backend.name,
            started=session.started,
            done=session.done,
            data_idx=session.data_idx,
            task_description=session.task_description,
            observation=session.observation,
            reward=session.reward,
            score=session.score,
            steps=session.steps,
            episodes=session.episodes,
            created_at=session.created_at,
            last_active_at=session.last_active_at,
            info=session.info,
            **session.extra,
        )

    @app.get(
        "/tasks",
        responses=_errors(ErrorCode.NOT_READY),
        summary="How many data_idx exist, task names, splits and the score scale.",
    )
    async def tasks() -> TasksResponse:
        if not manager.prepared:
            raise ApiError(ErrorCode.NOT_READY, "the env is still starting", settings.retry_after)
        return env_backend.tasks().model_copy(update={"replayable": env_backend.replayable})

    @app.get("/healthz", summary="Liveness: the server answers.")
    async def healthz() -> HealthResponse:
        return HealthResponse()

    @app.get(
        "/readyz",
        responses=_errors(ErrorCode.NOT_READY),
        summary="Readiness: warm pool filled and not draining.",
    )
    async def readyz() -> ReadyResponse:
        if not manager.ready:
            raise ApiError(ErrorCode.NOT_READY, manager.not_ready_reason, settings.retry_after)
        return ReadyResponse(ready=True, reason="ready")

    @app.get("/status", summary="Load and health for routers and the operator.")
    async def status() -> StatusResponse:
        return StatusResponse(
            env=env_backend.name,
            active=manager.active,
            capacity=settings.max_sessions,
            warm=len(manager.warm),
            warm_target=settings.warm,
            env_config=settings.env_config,
            draining=manager.draining,
            served=manager.served,
            envs_started=manager.envs_started,
            envs_reused=manager.envs_reused,
            envs_retired={reason.value: count for reason, count in manager.envs_retired.items()},
            replays=manager.replays,
            ready=manager.ready,
            canary=canary.status,
        )

    @app.get("/metrics", response_class=PlainTextResponse, summary="Prometheus metrics.")
    async def prometheus_metrics() -> Response:
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.post(
        "/admin/drain",
        responses=_errors(*COMMON_ERRORS),
        summary="Stop (or, with draining=false, resume) taking new sessions.",
    )
    async def drain(
        request: Request, body: Annotated[DrainRequest | None, Body()] = None
    ) -> DrainResponse:
        _only_on_admin_port(request, settings)
        manager.set_draining(body.draining if body else True)
        return DrainResponse(draining=manager.draining, active=manager.active)

    return app
