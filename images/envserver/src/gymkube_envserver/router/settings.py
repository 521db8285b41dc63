"""Settings of the session router: ``GYMKUBE_ROUTER_*`` env vars, overridden by CLI flags."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BeforeValidator, Field, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict


def _parse_address(value: str) -> str:
    host, sep, port = value.strip().rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"expected host:port, got {value!r}")
    return f"{host}:{int(port)}"


def _split_addresses(value: object) -> object:
    if isinstance(value, str):
        return [_parse_address(part) for part in value.split(",") if part.strip()]
    if isinstance(value, list):
        return [_parse_address(part) for item in value for part in str(item).split(",")]
    return value


def _dns_target(value: object) -> object:
    if isinstance(value, str) and value.strip():
        return _parse_address(value)
    return value or None


class RouterSettings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="GYMKUBE_ROUTER_",
        cli_prog_name="gymkube-router",
        cli_kebab_case=True,
        cli_implicit_flags=True,
    )

    host: str = Field(default="0.0.0.0", description="Address to listen on.")
    port: int = Field(default=8080, ge=1, le=65535, description="Port to listen on.")
    backends: Annotated[list[str], NoDecode, BeforeValidator(_split_addresses)] = Field(
        default_factory=list, description="Static env servers, comma-separated host:port."
    )
    backends_dns: Annotated[str | None, BeforeValidator(_dns_target)] = Field(
        default=None,
        description="name:port of a headless Service; every A record is an env server.",
    )
    dns_interval: float = Field(
        default=5.0, gt=0, description="Seconds between re-resolutions of --backends-dns."
    )
    poll_interval: float = Field(
        default=1.0, gt=0, description="Seconds between /status polls of each backend."
    )
    dead_after_seconds: float = Field(
        default=10.0,
        gt=0,
        description="Seconds a backend may go without answering anything (a /status poll, a "
        "proxied call) before its sessions are lost (410, WebSocket 4410). A slow server that "
        "still answers within it keeps them, as a CPU-starved one on a busy node does; a "
        "refused connect loses them at once.",
    )
    connect_timeout: float = Field(
        default=0.5,
        gt=0,
        description="TCP connect timeout to a backend; a failed connect means the session is lost.",
    )
    request_timeout: float = Field(
        default=900.0,
        gt=0,
        description="Upper bound on one backend call; env steps may legitimately take seconds.",
    )
    create_wait: float = Field(
        default=10.0, ge=0, description="Seconds /create waits for room in a full pool."
    )
    ws_create_wait: float = Field(
        default=5.0,
        ge=0,
        description="Seconds a new WebSocket session waits for room in a full pool; the socket "
        "is open meanwhile and its first message waits (OpenEnv's client waits 60 s for the "
        "reply).",
    )
    create_hold: float = Field(
        default=0.0,
        ge=0,
        description="Seconds /create and a new WebSocket session are held for room in an "
        "autoscaled pool, full or at zero (the operator counts held creates and starts servers "
        "for them); with it set, /readyz is ready without env servers. 0: only --create-wait / "
        "--ws-create-wait.",
    )
    retry_after: int = Field(
        default=2, ge=1, description="Retry-After seconds sent with 503 when the pool is full."
    )
    keepalive_timeout: float = Field(
        default=3.0,
        gt=0,
        description="Idle seconds before a pooled backend connection is closed; keep it below "
        "the env server's own keep-alive timeout.",
    )
    shutdown_delay: float = Field(
        default=0.0,
        ge=0,
        description="Seconds the router keeps serving after SIGTERM before it stops listening: "
        "long enough for the Service's endpoints to drop a terminating pod (the operator sets "
        "5), so no client connects to a closed port during a rollout.",
    )

    backend_protocol: Literal["gymkube", "openenv"] = Field(
        default="gymkube",
        description="gymkube: gymkube env servers (placement from their /status); openenv: any "
        "OpenEnv server (liveness from /health, capacity from --backend-capacity, WebSockets "
        "only).",
    )
    backend_capacity: int | None = Field(
        default=None,
        ge=1,
        description="Sessions each OpenEnv server holds (its MAX_CONCURRENT_ENVS); required "
        "with --backend-protocol openenv.",
    )

    @model_validator(mode="after")
    def _one_backend_source(self) -> RouterSettings:
        if bool(self.backends) == bool(self.backends_dns):
            raise ValueError("give exactly one of --backends or --backends-dns")
        if self.backend_protocol == "openenv" and self.backend_capacity is None:
            raise ValueError("--backend-protocol openenv needs --backend-capacity")
        return self
