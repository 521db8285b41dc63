"""Server configuration: every CLI flag also comes from a ``GYMKUBE_*`` environment variable."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

# Chosen by measurement on a 2-core box (docs/envserver.md, "JVM flags"): the serial collector keeps
# a ScienceWorld JVM a third of the default's size; full tiered JIT, warmed by the warm-up resets,
# then resets and steps 2-3x faster than C1 alone. A 256 MiB heap cap keeps a JVM that has played
# many episodes at about 345 MiB resident instead of 475 with 512 MiB, at the same speed.
DEFAULT_JVM_OPTIONS = "-Xmx256m -XX:+UseSerialGC -Xss4m -Xshare:auto"
# Chosen by measurement (docs/envserver.md, "Env reuse and recycling"): a reused ScienceWorld JVM
# levels off near 350 MiB (490 with a 512 MiB heap) within its first episodes and stays there for
# 1,000; a new JVM and its warm-up cost about 4 s of CPU, under 1% of 1,000 episodes.
DEFAULT_RECYCLE_AFTER_EPISODES = 1000
DEFAULT_RECYCLE_RSS_MIB = 768


class ServerSettings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="GYMKUBE_",
        cli_kebab_case=True,
        cli_prog_name="gymkube-envserver",
        cli_implicit_flags=False,
        extra="ignore",
    )

    env: str = Field(
        default="frozen_lake",
        description="sciworld | frozen_lake | textarena:<GameId> | plugin:<module>:<Class>",
    )
    env_config: dict[str, Any] = Field(
        default_factory=dict,
        description=(
            "Default env_config of every session, as JSON; a /create or /reset env_config "
            "overrides its keys."
        ),
    )
    host: str = Field(default="0.0.0.0", description="Address to bind.")
    port: int = Field(default=8000, ge=0, le=65_535, description="Port to bind (0: any free).")
    admin_port: int | None = Field(
        default=None,
        ge=1,
        le=65_535,
        description=(
            "A second port that alone serves /admin/* (a NetworkPolicy can then keep it to the "
            "operator); unset: /admin/* is served on --port."
        ),
    )
    max_sessions: int = Field(default=16, ge=1, description="Most open sessions at once.")
    warm: int = Field(default=2, ge=0, description="Started envs kept ready for /create.")
    warm_up_resets: int = Field(
        default=24,
        ge=0,
        description="Resets a new warm-pool env runs before it is handed out (ScienceWorld JIT).",
    )
    reuse: bool = Field(
        default=True,
        description=(
            "A cleanly closed session's env goes back to the pool for the next /create "
            "(false: it is closed, and every session beyond the warm pool starts an env)."
        ),
    )
    recycle_after_episodes: int = Field(
        default=DEFAULT_RECYCLE_AFTER_EPISODES,
        ge=0,
        description="Close an env (when its session ends, or at a reset when an idle env can "
        "take over) once it has played this many episodes (0: never).",
    )
    recycle_rss_mib: int = Field(
        default=DEFAULT_RECYCLE_RSS_MIB,
        ge=0,
        description="Close an env (when its session ends, or at a reset when an idle env can "
        "take over) if its own process (ScienceWorld's JVM) holds more than this many MiB "
        "resident (0: never).",
    )
    idle_timeout: float = Field(
        default=600.0, ge=0, description="Close sessions idle this many seconds (0: never)."
    )
    call_timeout: float = Field(
        default=300.0, gt=0, description="A reset or step running longer loses its session (410)."
    )
    canary_interval: float = Field(
        default=60.0, ge=0, description="Seconds between canary episodes (0: no canary)."
    )
    canary_timeout: float = Field(default=120.0, gt=0, description="Canary episode time limit.")
    retry_after: int = Field(
        default=2, ge=1, description="Retry-After seconds sent with 503 at capacity or draining."
    )
    jvm_options: str = Field(
        default=DEFAULT_JVM_OPTIONS,
        description="JAVA_TOOL_OPTIONS for ScienceWorld JVMs (an existing JAVA_TOOL_OPTIONS wins).",
    )
    env_threads: int = Field(
        default=0, ge=0, description="Threads for blocking env calls (0: sessions + warm + 2)."
    )
    cache_dir: Path | None = Field(
        default=None,
        description="Where computed task tables are cached ($XDG_CACHE_HOME/gymkube by default).",
    )
    log_level: str = Field(default="info", description="uvicorn log level.")

    @property
    def cache_path(self) -> Path:
        if self.cache_dir is not None:
            return self.cache_dir
        xdg = os.environ.get("XDG_CACHE_HOME")
        return (Path(xdg) if xdg else Path.home() / ".cache") / "gymkube"

    @property
    def thread_count(self) -> int:
        return self.env_threads or self.max_sessions + self.warm + 2
