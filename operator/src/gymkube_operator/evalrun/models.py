"""The EvalRun resource: spec and status models. The CRD schema is generated from these."""

from enum import StrEnum
from typing import Annotated, Final, Literal

from pydantic import ConfigDict, Field, WithJsonSchema

from gymkube_operator.conditions import CONDITIONS_SCHEMA_EXTRA, Condition, Timestamp
from gymkube_operator.kinds import CamelModel, FreeForm, Quantity, ResourceRequirements
from gymkube_operator.kinds import validation_rules as rules
from gymkube_operator.trainingrun.models import NAME_PATTERN, AgentLoopSpec, Device, EnvPoolRef

KIND = "EvalRun"
PLURAL = "evalruns"

LATEST: Final = "latest"
MAX_TASKS = 5000
# A TrainingRun checkpoint: verl's global_step_<N>, or the newest one saved.
CheckpointStep = Annotated[
    Annotated[int, Field(ge=1)] | Literal["latest"],
    WithJsonSchema(
        {
            "anyOf": [{"type": "integer"}, {"type": "string"}],
            "x-kubernetes-int-or-string": True,
            **rules(
                (
                    "type(self) == int ? self >= 1 : self == 'latest'",
                    "step is latest or a step number of 1 or more",
                )
            ),
        }
    ),
]


class TrainingRunCheckpoint(CamelModel):
    """A checkpoint a TrainingRun (same namespace) saved on its checkpoints volume."""

    name: str = Field(
        min_length=1, max_length=63, pattern=NAME_PATTERN, description="TrainingRun name."
    )
    step: CheckpointStep = Field(
        LATEST, description="The checkpoint's training step, or latest: the newest saved."
    )


class EvalModelSpec(CamelModel):
    """The model scored: a path (in a volume, in the image, or a hub id), or a TrainingRun's
    checkpoint."""

    model_config = ConfigDict(
        json_schema_extra=rules(
            (
                "has(self.path) != has(self.trainingRun)",
                "model names exactly one of path and trainingRun",
            ),
            (
                "!has(self.volume) || has(self.path)",
                "model.volume goes with model.path (a trainingRun model is read from that run's "
                "checkpoints volume)",
            ),
            (
                "!has(self.volume) || self.path.startsWith(self.mountPath + '/')",
                "model.path must lie under model.mountPath when model.volume is set",
            ),
        )
    )

    path: str | None = Field(
        None, min_length=1, description="The model directory (or hub id), e.g. /models/Qwen2.5-7B."
    )
    volume: FreeForm | None = Field(
        None,
        description=(
            "A Kubernetes volume source holding the model, e.g. "
            "{persistentVolumeClaim: {claimName: models}}; mounted read-only at mountPath."
        ),
    )
    mount_path: str = Field(
        "/models", pattern=r"^/.*[^/]$", description="Where the model volume is mounted."
    )
    training_run: TrainingRunCheckpoint | None = Field(
        None,
        description=(
            "A TrainingRun's checkpoint: its spec.checkpoints volume is mounted read-only and "
            "the checkpoint's Hugging Face model is scored."
        ),
    )


class EvalDatasetSpec(CamelModel):
    """Which env tasks are played (built by gymkube-dataset, as a TrainingRun's rows)."""

    split: Literal["train", "dev", "test"] = Field("test", description="The env's split.")
    # Their per-task results fit one ConfigMap (1 MiB) with room to spare.
    size: int = Field(64, ge=1, le=MAX_TASKS, description="Tasks (rows) to play.")
    seed: int = Field(0, ge=0, description="Sampling seed of the tasks and of generation.")


class SamplingSpec(CamelModel):
    """How the model's replies are sampled."""

    temperature: float = Field(0.0, ge=0, le=10, description="0: greedy.")
    top_p: float = Field(1.0, gt=0, le=1, description="Nucleus sampling's probability mass.")
    samples_per_task: int = Field(
        1, ge=1, le=1024, description="Episodes played per task (their mean is the task's)."
    )


class EvalRunSpec(CamelModel):
    """What a user asks for: a model's score on held-out episodes of an EnvPool."""

    env_pool_ref: EnvPoolRef = Field(description="The EnvPool the episodes are played on.")
    env_pool_timeout_seconds: int = Field(
        1800,
        ge=60,
        le=604800,
        description="The eval fails (EnvPoolTimeout) when its pool has not been Ready this long "
        "before its Job exists.",
    )
    model: EvalModelSpec = Field(description="The model scored.")
    image: str | None = Field(
        None, min_length=1, description="Image with gymkube-eval; the operator's trainer image."
    )
    device: Device | None = Field(
        None,
        description="gpu (one nvidia.com/gpu) or cpu; unset: the TrainingRun's for a trainingRun "
        "model, else gpu.",
    )
    resources: ResourceRequirements = Field(
        default_factory=ResourceRequirements, description="CPU and memory of the eval pod."
    )
    shm_size: Quantity = Field("8Gi", description="Size of /dev/shm (memory-backed) for vLLM.")
    agent_loop: AgentLoopSpec | None = Field(
        None,
        description="Prompt template and turn limits; unset: the TrainingRun's for a trainingRun "
        "model (eval plays as training did), else the defaults.",
    )
    dataset: EvalDatasetSpec = Field(default_factory=EvalDatasetSpec, description="Tasks played.")
    sampling: SamplingSpec = Field(default_factory=SamplingSpec, description="Sampling.")
    backoff_limit: int = Field(0, ge=0, le=100, description="Retries of the eval Job.")
    active_deadline_seconds: int | None = Field(
        None, ge=1, description="The eval Job fails after running this long."
    )
    ttl_seconds_after_finished: int | None = Field(
        None, ge=0, description="Delete the EvalRun (and its children) this long after it ends."
    )


class Phase(StrEnum):
    PENDING = "Pending"
    WAITING_FOR_ENV_POOL = "WaitingForEnvPool"
    STARTING = "Starting"
    RUNNING = "Running"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"


class EvalProgress(CamelModel):
    """gymkube-eval's last `gymkube-eval-progress` line (or, once done, its result)."""

    # Read from a log line: whatever passes here must also pass the API server's status schema.
    model_config = ConfigDict(allow_inf_nan=False)

    episodes: int = Field(ge=0, description="Episodes played.")
    total: int = Field(ge=0, description="Episodes to play.")
    successes: int = Field(0, ge=0, description="Episodes that succeeded.")
    mean_score: float | None = Field(None, description="Mean normalised reward so far.")


Interval = Annotated[list[float], Field(min_length=2, max_length=2)]


class EvalResult(CamelModel):
    """gymkube-eval's summary without its per-task results (its termination message)."""

    model_config = ConfigDict(allow_inf_nan=False)

    model: str = Field(max_length=4096, description="The model directory scored.")
    checkpoint_step: int | None = Field(
        None, ge=0, description="The TrainingRun checkpoint's step; null for a path model."
    )
    episodes: int = Field(ge=0, description="Episodes scored (those lost to the env are not).")
    successes: int = Field(ge=0, description="Scored episodes whose reward reached 1.")
    success_rate: float = Field(ge=0, le=1, description="successes / episodes.")
    success_rate_interval: Interval = Field(description="Its 95% confidence interval [lo, hi].")
    mean_score: float = Field(
        description="Mean episode reward, normalised to 0..1 by the env's score scale."
    )
    mean_score_interval: Interval = Field(description="Its 95% confidence interval [lo, hi].")
    mean_turns: float = Field(ge=0, description="Mean assistant turns per episode.")
    env_errors: int = Field(ge=0, description="Episodes lost to the env, not scored.")


class TaskResult(CamelModel):
    """One task's episodes in gymkube-eval's summary."""

    model_config = ConfigDict(allow_inf_nan=False)

    task: str = Field(description="The task (its item id).")
    episodes: int = Field(ge=0)
    successes: int = Field(ge=0)
    mean_score: float


class EvalSummary(EvalResult):
    """gymkube-eval's whole summary: its `gymkube-eval-result` line."""

    tasks: list[TaskResult] = Field(default_factory=list, description="Per-task results.")


class EvalRunStatus(CamelModel):
    """What the operator observed, computed from the pool, the model's TrainingRun and the Job."""

    phase: Phase = Field(Phase.PENDING, description="One word for `kubectl get`.")
    model: str | None = Field(
        None, description="What is scored: the model path, or <trainingrun>@<step>."
    )
    env_pool_url: str | None = Field(None, description="The pool URL the Job plays.")
    job: str | None = Field(None, description="The eval Job.")
    progress: EvalProgress | None = Field(None, description="Episodes played so far.")
    result: EvalResult | None = Field(None, description="The score, once the eval succeeded.")
    results_config_map: str | None = Field(
        None, description="The ConfigMap holding the per-task results (tasks.json)."
    )
    start_time: Timestamp | None = Field(None, description="When the eval Job started.")
    completion_time: Timestamp | None = Field(None, description="When the eval ended.")
    observed_generation: int = Field(0, ge=0, description="The spec generation last acted on.")
    conditions: list[Condition] = Field(
        default_factory=list,
        description="EnvPoolReady, Running, Succeeded and Failed, as metav1.Condition.",
        json_schema_extra=CONDITIONS_SCHEMA_EXTRA,
    )
