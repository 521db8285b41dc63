"""The EnvPool resource: spec and status models. The CRD schema is generated from these."""

from pydantic import ConfigDict, Field

from gymkube_operator.conditions import CONDITIONS_SCHEMA_EXTRA, Condition, Timestamp
from gymkube_operator.kinds import CamelModel, FreeForm, ResourceRequirements, validation_rules

KIND = "EnvPool"
PLURAL = "envpools"

OPENENV = "openenv"
"""The env value of a pool whose image is any OpenEnv server instead of gymkube's env server."""
ENV_PATTERN = (
    rf"^({OPENENV}|sciworld|frozen_lake|textarena:[A-Za-z0-9_.-]+"
    r"|plugin:[A-Za-z_][A-Za-z0-9_.]*:[A-Za-z_][A-Za-z0-9_]*)$"
)


class RouterSpec(CamelModel):
    """The session router Deployment in front of the env servers."""

    # At least one: the pool URL is the router's Service, and a pool nobody can reach is no pool.
    replicas: int = Field(
        1, ge=1, le=100, description="Router pods (at least 1: they serve the pool URL)."
    )
    image: str | None = Field(
        None, min_length=1, description="Router image; the operator's default when unset."
    )
    resources: ResourceRequirements = Field(
        default_factory=ResourceRequirements, description="Router container resources."
    )


class WatchdogSpec(CamelModel):
    """How the operator probes, restarts and recycles env-server pods."""

    model_config = ConfigDict(
        json_schema_extra=validation_rules(
            (
                "self.probeTimeoutSeconds < self.probePeriodSeconds",
                "watchdog.probeTimeoutSeconds must be shorter than watchdog.probePeriodSeconds",
            ),
        )
    )

    probe_period_seconds: int = Field(
        5, ge=1, le=3600, description="Seconds between two reads of each pod's /status."
    )
    probe_timeout_seconds: int = Field(
        2, ge=1, le=600, description="A /status read slower than this counts as no answer."
    )
    failure_threshold: int = Field(
        3, ge=1, le=100, description="Consecutive failed probes before the pod is restarted."
    )
    canary_interval_seconds: int = Field(
        60,
        ge=0,
        le=86400,
        description=(
            "Seconds between the canary episodes each server runs on a spare env; 0 turns the "
            "canary off. A server whose canary stops running counts as stuck."
        ),
    )
    canary_timeout_seconds: int = Field(
        120, ge=1, le=3600, description="A canary episode slower than this fails."
    )
    max_sessions_served: int = Field(
        0,
        ge=0,
        le=100_000_000,
        description="Recycle a pod after it served this many sessions; 0 never.",
    )
    max_age_seconds: int = Field(
        0,
        ge=0,
        le=31_536_000,
        description="Recycle a pod older than this (a year at most); 0 never.",
    )
    drain_timeout_seconds: int = Field(
        300,
        ge=0,
        le=86400,
        description="How long a draining pod may keep live sessions before it is deleted.",
    )
    max_unavailable: int = Field(
        1, ge=1, le=1000, description="At most this many pods are restarted or recycled at once."
    )
    restart_budget: int = Field(
        5,
        ge=1,
        le=1000,
        description="Watchdog restarts allowed per restartWindowSeconds before it backs off.",
    )
    restart_window_seconds: int = Field(
        600, ge=1, le=86400, description="The window the restart budget counts over."
    )


class EnvReuseSpec(CamelModel):
    """How each server reuses envs across sessions, and when it replaces one."""

    enabled: bool = Field(
        True,
        description=(
            "A cleanly closed session's env goes back to its server's pool and serves a later "
            "session (for ScienceWorld: no JVM start, no warm-up); false closes it."
        ),
    )
    recycle_after_episodes: int = Field(
        1000,
        ge=0,
        le=100_000_000,
        description="Replace an env once it has played this many episodes; 0 never.",
    )
    recycle_rss_mib: int = Field(
        768,
        ge=0,
        le=1_048_576,
        description=(
            "Replace an env whose own process (ScienceWorld's JVM) holds more than this many MiB "
            "resident when its session ends; 0 never."
        ),
    )


class AutoscalingSpec(CamelModel):
    """The operator sizes the pool (it writes spec.replicas) from the demand of the runs that use
    it and from the sessions its servers hold open."""

    model_config = ConfigDict(
        json_schema_extra=validation_rules(
            (
                "self.minReplicas <= self.maxReplicas",
                "autoscaling.minReplicas must not exceed autoscaling.maxReplicas",
            ),
        )
    )

    min_replicas: int = Field(
        1,
        ge=0,
        le=1000,
        description="Fewest env-server pods; 0 lets the pool scale to zero between runs.",
    )
    max_replicas: int = Field(ge=1, le=1000, description="Most env-server pods.")
    target_utilization_percent: int = Field(
        80,
        ge=10,
        le=100,
        description="Share of capacity the open sessions may fill before the pool grows.",
    )
    scale_down_delay_seconds: int = Field(
        300,
        ge=0,
        le=86400,
        description=(
            "Fewer pods must have been enough for this long before the pool shrinks (a run's "
            "update phase, which opens no session, must not shrink it); scaling to zero waits "
            "idleTimeoutSeconds at least."
        ),
    )
    create_hold_seconds: int = Field(
        60,
        ge=0,
        le=3600,
        description=(
            "How long a router holds a new session (HTTP /create or an OpenEnv WebSocket) for "
            "room while the pool is full or at zero; held sessions count as load, so the pool "
            "grows for them. OpenEnv's client waits 60 s for its first reply."
        ),
    )


class EnvPoolSpec(CamelModel):
    """What a user asks for: which env, how many servers, how big, and how to keep them healthy."""

    model_config = ConfigDict(
        json_schema_extra=validation_rules(
            (
                "self.warmSessionsPerReplica <= self.sessionsPerReplica",
                "warmSessionsPerReplica must not exceed sessionsPerReplica",
            ),
            ("self.adminPort != self.port", "adminPort must differ from port"),
            (
                f"self.env != '{OPENENV}' || has(self.image)",
                f"env {OPENENV} runs your OpenEnv server image: set image",
            ),
        )
    )

    env: str = Field(
        max_length=200,
        description=(
            "Which env the servers host: sciworld, frozen_lake, textarena:<GameId> "
            "or plugin:<module>:<Class>; openenv runs `image` as an OpenEnv server instead "
            "(sessionsPerReplica becomes its MAX_CONCURRENT_ENVS)."
        ),
        json_schema_extra=validation_rules(
            (
                f"self.matches('{ENV_PATTERN}')",
                "env must be sciworld, frozen_lake, textarena:<GameId>, plugin:<module>:<Class> "
                "or openenv",
            )
        ),
    )
    image: str | None = Field(
        None, min_length=1, description="Env-server image; the operator's default when unset."
    )
    env_config: FreeForm = Field(
        default_factory=dict,
        description=(
            "Default env_config of every session in the pool, e.g. {size: 2} for frozen_lake; "
            "a /create body's env_config overrides keys."
        ),
    )
    args: list[str] = Field(
        default_factory=list, description="Extra command-line arguments for gymkube-envserver."
    )
    port: int = Field(
        8000, ge=1024, le=65535, description="Port of the env servers and of the pool URL."
    )
    admin_port: int = Field(
        8001,
        ge=1024,
        le=65535,
        description=(
            "Port of the env servers' /admin/* (drain), which the pool's NetworkPolicy opens to "
            "the operator only."
        ),
    )
    replicas: int = Field(
        1,
        ge=0,
        le=1000,
        description="Env-server pods (scale subresource); with autoscaling, the operator sets it.",
    )
    autoscaling: AutoscalingSpec | None = Field(
        None,
        description="Size the pool from its runs' demand and its open sessions (docs/envpool.md).",
    )
    sessions_per_replica: int = Field(
        16, ge=1, le=4096, description="Concurrent sessions one env server accepts."
    )
    warm_sessions_per_replica: int = Field(
        2, ge=0, le=4096, description="Sessions each server keeps started ahead of /create."
    )
    idle_timeout_seconds: int = Field(
        600, ge=1, le=604800, description="A session idle this long is closed by its server."
    )
    env_reuse: EnvReuseSpec = Field(
        default_factory=EnvReuseSpec,
        description="Env reuse across sessions and recycling of envs by episodes or memory.",
    )
    resources: ResourceRequirements = Field(
        default_factory=ResourceRequirements, description="Env-server container resources."
    )
    pod_template: FreeForm = Field(
        default_factory=dict,
        description=(
            "Pod spec fields merged into the env-server pods (nodeSelector, tolerations, "
            "volumes, containers by name, ...)."
        ),
    )
    router: RouterSpec = Field(default_factory=RouterSpec, description="The session router.")
    watchdog: WatchdogSpec = Field(
        default_factory=WatchdogSpec, description="Health probing, restarts and recycling."
    )
    suspend: bool = Field(
        False, description="Scale env servers and router to zero while keeping the pool."
    )


class RestartRecord(CamelModel):
    """One pod the watchdog restarted or recycled."""

    pod: str = Field(description="The pod that was deleted.")
    reason: str = Field(description="CamelCase cause, e.g. NoAnswer, CanaryFailed, Recycled.")
    message: str = Field("", description="Detail, e.g. the probe error.")
    time: Timestamp = Field(description="When the pod was deleted.")


class RestartsStatus(CamelModel):
    """What the watchdog did to keep the pool healthy."""

    count: int = Field(0, ge=0, description="Pods restarted because they failed probes.")
    recycled: int = Field(0, ge=0, description="Pods recycled for age or sessions served.")
    last_pod: str | None = Field(None, description="The most recently restarted pod.")
    last_reason: str | None = Field(None, description="Why it was restarted.")
    last_time: Timestamp | None = Field(None, description="When it was restarted.")
    recent: list[RestartRecord] = Field(
        default_factory=list,
        max_length=20,
        description="The latest restarts and recycles, newest last (the restart budget reads it).",
    )


class EnvPoolStatus(CamelModel):
    """What the operator observed, computed from the children and the watchdog's probes."""

    replicas: int = Field(0, ge=0, description="Env-server pods that exist.")
    ready_replicas: int = Field(0, ge=0, description="Env-server pods that are ready.")
    capacity: int = Field(0, ge=0, description="Sessions the ready servers can hold.")
    active_sessions: int = Field(0, ge=0, description="Sessions open right now.")
    demand: int | None = Field(
        None,
        ge=0,
        description="With autoscaling: sessions the unfinished runs using the pool keep open.",
    )
    waiting_sessions: int | None = Field(
        None,
        ge=0,
        description="With autoscaling: new sessions the routers hold for room right now.",
    )
    url: str | None = Field(None, description="The pool URL clients and TrainingRuns use.")
    selector: str | None = Field(None, description="Label selector of the env-server pods.")
    observed_generation: int = Field(0, ge=0, description="The spec generation last acted on.")
    restarts: RestartsStatus = Field(
        default_factory=RestartsStatus, description="Watchdog restarts and recycles."
    )
    conditions: list[Condition] = Field(
        default_factory=list,
        description="Ready, Progressing and Degraded, as metav1.Condition.",
        json_schema_extra=CONDITIONS_SCHEMA_EXTRA,
    )
