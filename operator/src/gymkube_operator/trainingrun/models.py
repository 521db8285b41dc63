"""The TrainingRun resource: spec and status models. The CRD schema is generated from these."""

from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field

from gymkube_operator.conditions import CONDITIONS_SCHEMA_EXTRA, Condition, Timestamp
from gymkube_operator.kinds import (
    CamelModel,
    FreeForm,
    Quantity,
    ResourceRequirements,
    validation_rules,
)

KIND = "TrainingRun"
PLURAL = "trainingruns"

# verl 0.9.1's advantage estimators (verl.trainer.ppo.core_algos.AdvantageEstimator); "gae" is PPO.
Algorithm = Literal[
    "grpo",
    "gae",
    "rloo",
    "reinforce_plus_plus",
    "reinforce_plus_plus_baseline",
    "remax",
    "opo",
    "grpo_passk",
    "gpg",
    "rloo_vectorized",
    "grpo_vectorized",
    "optimal_token_baseline",
    "tir_optimal_token_baseline",
    "gdpo",
]

# One Hydra override: key=value, +key=value (add), ++key=value (force) or ~key (delete).
OVERRIDE_PATTERN = r"^(~[A-Za-z_][A-Za-z0-9_.@/-]*(=.*)?|(\+\+|\+)?[A-Za-z_][A-Za-z0-9_.@/-]*=.*)$"
NAME_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"

# A class as hydra's `_target_` names it: module path, then the class.
CLASS_PATH_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)+$"

# What the trainer computes on (gymkube_operator.trainingrun.device holds what cpu changes).
Device = Literal["gpu", "cpu"]


class EnvPoolRef(CamelModel):
    """The EnvPool (same namespace) whose URL the agent loop talks to."""

    name: str = Field(
        min_length=1, max_length=63, pattern=NAME_PATTERN, description="EnvPool name."
    )


# How many pools one run may mix.
MAX_POOLS = 8


class PoolShare(CamelModel):
    """One of the EnvPools (same namespace) a run mixes, and its share of the dataset."""

    # dataset-train-<name> names a container (63 characters at most).
    name: str = Field(
        min_length=1, max_length=40, pattern=NAME_PATTERN, description="EnvPool name."
    )
    weight: int = Field(
        1,
        ge=1,
        le=1000,
        description="Its share of dataset.size and dataset.valSize, in proportion to the "
        "others' (every pool gets at least one row).",
    )
    prompt_template: str | None = Field(
        None,
        min_length=1,
        description="Prompt template of its rows; agentLoop.promptTemplate, else the env's own, "
        "when unset.",
    )


class ModelSpec(CamelModel):
    """The policy model verl loads: a path inside a mounted volume, or a hub id with no volume."""

    model_config = ConfigDict(
        json_schema_extra=validation_rules(
            (
                "!has(self.volume) || self.path.startsWith(self.mountPath + '/')",
                "model.path must lie under model.mountPath when model.volume is set",
            ),
        )
    )

    path: str = Field(
        min_length=1, description="actor_rollout_ref.model.path, e.g. /models/Qwen2.5-7B-Instruct."
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


class CustomLoopSpec(CamelModel):
    """Your own verl AgentLoop, run in place of gymkube's."""

    class_name: str = Field(
        pattern=CLASS_PATH_PATTERN,
        description="module.Class of a verl AgentLoopBase subclass (hydra's _target_).",
    )
    config_map: str | None = Field(
        None,
        pattern=NAME_PATTERN,
        max_length=253,
        description="A ConfigMap in the run's namespace whose .py files hold the class: mounted "
        "in the trainer pods and put on PYTHONPATH. Unset: the trainer image holds it.",
    )
    parameters: FreeForm | None = Field(
        None,
        description="Keyword arguments of the class, as agent-loop YAML keys (name and "
        "_target_ are gymkube's).",
    )


class AgentLoopSpec(CamelModel):
    """Settings of the gymkube agent loop, written into the agent-loop YAML."""

    prompt_template: str | None = Field(
        None,
        min_length=1,
        description="Prompt template name (e.g. sciworld, frozen_lake); the env's own when unset.",
    )
    templates: dict[str, FreeForm] | None = Field(
        None,
        description="Extra prompt templates, name -> fields (see the agent loop's docs), for envs "
        "without a built-in one (plugin envs); the agent loop, dataset and preflight all get them.",
    )
    max_turns: int = Field(20, ge=1, le=1000, description="Assistant turns per episode.")
    max_observation_tokens: int = Field(
        2048, ge=16, le=1_000_000, description="Tokens of one env observation kept in context."
    )
    reward: Literal["final", "best"] = Field(
        "final",
        description="Episode reward: the final score, or the best score reached (normalised).",
    )
    max_prompt_tokens: int = Field(
        2048, ge=64, le=1_000_000, description="data.max_prompt_length: the first prompt's budget."
    )
    max_response_tokens: int = Field(
        8192,
        ge=64,
        le=1_000_000,
        description="data.max_response_length: all turns after the prompt, model and env tokens.",
    )


class DatasetSpec(CamelModel):
    """Which env tasks become verl's train and validation parquet (built by gymkube-dataset)."""

    split: Literal["train", "dev", "test"] = Field("train", description="Training split.")
    size: int = Field(2000, ge=1, le=10_000_000, description="Training rows.")
    val_split: Literal["train", "dev", "test"] = Field("dev", description="Validation split.")
    val_size: int = Field(200, ge=1, le=10_000_000, description="Validation rows.")
    seed: int = Field(0, ge=0, description="Sampling seed: same seed, same rows on every node.")


class PreflightSpec(CamelModel):
    """Scripted episodes through the pool URL on CPU before any GPU is requested."""

    enabled: bool = Field(True, description="Run the preflight before training.")
    episodes: int = Field(8, ge=1, le=10_000, description="Whole episodes to play.")
    policy: Literal["scripted", "random"] = Field("scripted", description="Non-LLM policy.")
    image: str | None = Field(
        None, min_length=1, description="Preflight image; the operator's default when unset."
    )
    active_deadline_seconds: int = Field(
        900, ge=10, le=86400, description="The preflight Job fails after this long."
    )


class TrainingRunSpec(CamelModel):
    """What a user asks for: a verl job on N nodes x G GPUs whose agent loop plays an EnvPool."""

    model_config = ConfigDict(
        json_schema_extra=validation_rules(
            (
                "has(self.envPoolRef) != has(self.envPools)",
                "set envPoolRef (one pool) or envPools (several), not both",
            ),
            (
                "!has(self.envPools) || "
                "self.envPools.all(p, self.envPools.exists_one(q, q.name == p.name))",
                "envPools names each pool once",
            ),
            (
                "!has(self.workloadPriorityClass) || has(self.queueName)",
                "workloadPriorityClass is Kueue's: set queueName too",
            ),
        )
    )

    env_pool_ref: EnvPoolRef | None = Field(None, description="The EnvPool the agent loop plays.")
    env_pools: list[PoolShare] | None = Field(
        None,
        min_length=1,
        max_length=MAX_POOLS,
        description="Several EnvPools in one run, in place of envPoolRef: the dataset mixes "
        "their tasks by weight, each row is played on its own pool, and status.progress.pools "
        "reports each.",
    )
    env_pool_timeout_seconds: int = Field(
        1800,
        ge=60,
        le=604800,
        description=(
            "The run fails (EnvPoolTimeout) when its pool has not been Ready for this long before "
            "the training child exists; there is no waiting forever."
        ),
    )
    image: str | None = Field(
        None, min_length=1, description="Trainer image (verl + vLLM + gymkube-agentloop)."
    )
    model: ModelSpec = Field(description="The policy model.")
    nodes: int = Field(
        1, ge=1, le=1024, description="1 renders a batch Job; more render a KubeRay RayJob."
    )
    gpus_per_node: int = Field(8, ge=1, le=64, description="nvidia.com/gpu per node.")
    device: Device = Field(
        "gpu",
        description=(
            "gpu: nvidia.com/gpu x gpusPerNode per node; cpu: verl on CPU (gymkube's CPU support "
            "for verl), one trainer process per node, gpusPerNode ignored."
        ),
    )
    resources: ResourceRequirements = Field(
        default_factory=ResourceRequirements,
        description="CPU and memory of each trainer pod; GPUs come from gpusPerNode.",
    )
    shm_size: Quantity = Field(
        "64Gi", description="Size of /dev/shm (memory-backed) for vLLM, NCCL and Ray."
    )
    algorithm: Algorithm = Field("grpo", description="verl algorithm.adv_estimator.")
    custom_agent_loop: CustomLoopSpec | None = Field(
        None,
        description="Your own AgentLoop in place of gymkube's; it reads the pool URL from "
        "GYMKUBE_ENV_URL (or <ENV>_ENV_BASE). agentLoop then serves the dataset, the preflight "
        "and EvalRuns only.",
    )
    agent_loop: AgentLoopSpec = Field(
        default_factory=AgentLoopSpec, description="Agent-loop settings."
    )
    dataset: DatasetSpec = Field(default_factory=DatasetSpec, description="Dataset rows.")
    overrides: list[Annotated[str, Field(pattern=OVERRIDE_PATTERN)]] = Field(
        default_factory=list,
        description=(
            "Hydra overrides for verl.trainer.main_ppo, applied after gymkube's own; checked "
            "against verl's ppo_trainer config before anything is created."
        ),
    )
    checkpoints: FreeForm | None = Field(
        None,
        description=(
            "Volume source for checkpoints (mounted at /checkpoints; the run writes "
            "/checkpoints/<name> and resumes from it). An emptyDir, lost with the pod, when unset."
        ),
    )
    pod_template: FreeForm = Field(
        default_factory=dict,
        description=(
            "Pod spec fields merged into the trainer pods (nodeSelector, tolerations, "
            "volumes, containers by name, ...)."
        ),
    )
    preflight: PreflightSpec = Field(
        default_factory=PreflightSpec, description="Preflight through the pool URL."
    )
    queue_name: str | None = Field(
        None,
        min_length=1,
        max_length=63,
        description="Kueue LocalQueue: the child is labelled and created suspended for admission.",
    )
    workload_priority_class: str | None = Field(
        None,
        min_length=1,
        max_length=63,
        description=(
            "Kueue WorkloadPriorityClass of the child: Kueue admits higher ones first and may "
            "preempt lower ones for them (a preempted run waits and resumes from its checkpoint)."
        ),
    )
    suspend: bool = Field(False, description="Suspend the training child (and hold new ones).")
    backoff_limit: int = Field(0, ge=0, le=100, description="Retries of the training child.")
    active_deadline_seconds: int | None = Field(
        None, ge=1, description="The training child fails after running this long."
    )
    ttl_seconds_after_finished: int | None = Field(
        None, ge=0, description="Delete the TrainingRun (and its children) this long after it ends."
    )

    def pools(self) -> list[PoolShare]:
        """The pools the run plays, first to last: envPools, or envPoolRef as one of weight 1."""
        if self.env_pools:
            return list(self.env_pools)
        assert self.env_pool_ref is not None, "the CRD requires envPoolRef or envPools"
        return [PoolShare(name=self.env_pool_ref.name)]


class Phase(StrEnum):
    PENDING = "Pending"
    WAITING_FOR_ENV_POOL = "WaitingForEnvPool"
    PREFLIGHT = "Preflight"
    STARTING = "Starting"
    QUEUED = "Queued"
    RUNNING = "Running"
    SUSPENDED = "Suspended"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"


class ChildRef(CamelModel):
    """The training workload the run created."""

    api_version: str = Field(description="batch/v1 or ray.io/v1.")
    kind: str = Field(description="Job or RayJob.")
    name: str = Field(description="Its name, in the run's namespace.")


class PreflightStatus(CamelModel):
    """What the preflight Job reported."""

    job_name: str | None = Field(None, description="The preflight Job.")
    passed: bool | None = Field(None, description="Unset while it runs.")
    summary: FreeForm | None = Field(None, description="gymkube-preflight's JSON summary.")
    message: str | None = Field(None, description="Output when the summary was not JSON.")


class RunDemand(CamelModel):
    """The env sessions a run keeps open at once, from its verl config (docs/trainingrun.md)."""

    sessions: int = Field(ge=0, description="Sessions in flight at most: training or validation.")
    training: int = Field(
        ge=0, description="A generation batch: train_batch_size x rollout.n, x batches in flight."
    )
    validation: int = Field(ge=0, description="A validation batch x val_kwargs.n; 0 if none.")
    pools: dict[str, int] = Field(
        default_factory=dict, description="Each pool's share of sessions, by its rows."
    )


class PoolProgress(CamelModel):
    """One pool's share of a step's training episodes (runs over envPools)."""

    model_config = ConfigDict(allow_inf_nan=False)

    episodes: int = Field(ge=0, description="Its episodes the step trained on or left out.")
    episodes_excluded: int = Field(ge=0, description="Of those, left out (their env failed).")
    episodes_replayed: int = Field(ge=0, description="Of those, replayed after a lost session.")
    env_errors: int = Field(ge=0, description="Env calls of its episodes that failed.")
    mean_reward: float | None = Field(None, description="Mean reward of its trained episodes.")
    mean_turns: float | None = Field(None, description="The model's replies per episode.")


class TrainingProgress(CamelModel):
    """The trainer's last `gymkube-progress` line: where training is, from verl's own metrics."""

    # Read from a log line: whatever passes here must also pass the API server's status schema.
    model_config = ConfigDict(allow_inf_nan=False)

    step: int = Field(ge=0, description="The training step last finished.")
    total_steps: int | None = Field(None, ge=0, description="Steps the run trains in all.")
    mean_reward: float | None = Field(None, description="Mean reward of that step's rollouts.")
    step_seconds: float | None = Field(None, description="How long that step took.")
    generation_seconds: float | None = Field(None, description="Its rollout generation time.")
    update_seconds: float | None = Field(None, description="Its actor update time.")
    eta_seconds: float | None = Field(None, description="Estimated seconds left.")
    checkpoint_step: int | None = Field(None, ge=0, description="Step of the last checkpoint.")
    checkpoint: str | None = Field(
        None, max_length=4096, description="Directory of the last checkpoint."
    )
    time: str | None = Field(None, max_length=64, description="When the trainer reported it.")
    resumed_from_step: int | None = Field(
        None,
        ge=0,
        description="The step this trainer pod started from: its newest checkpoint's, 0 if none.",
    )
    # The agent loop's episode log, that step's training episodes (validation ones are not).
    episodes: int | None = Field(
        None, ge=0, description="Episodes the step trained on or left out."
    )
    episodes_replayed: int | None = Field(
        None, ge=0, description="Of those, episodes whose lost session was rebuilt and replayed."
    )
    episodes_excluded: int | None = Field(
        None, ge=0, description="Of those, episodes left out of training (their env failed)."
    )
    replay_canary_failures: int | None = Field(
        None, ge=0, description="Replays whose replayed observation differed from the one seen."
    )
    pools: dict[str, PoolProgress] | None = Field(
        None, description="With envPools: that step's episodes by the pool that played them."
    )
    loop_errors: int | None = Field(
        None,
        ge=0,
        description=(
            "Episodes whose agent loop raised since the step before (verl trains without them, "
            "and logs each with its traceback): a user's own loop's failures show here."
        ),
    )
    last_loop_error: str | None = Field(
        None, max_length=1024, description="The exception line of the last of those episodes."
    )


# How many steps status.history keeps: every one of the last HISTORY_RECENT, and before those a
# sample of the older ones (trainingrun.history), HISTORY_STEPS in all (about 70 KB of status).
HISTORY_STEPS = 500
HISTORY_RECENT = 250


class HistoryStep(CamelModel):
    """One training step as its progress line reported it."""

    model_config = ConfigDict(allow_inf_nan=False)

    step: int = Field(ge=0, description="The training step.")
    mean_reward: float | None = Field(None, description="Mean reward of its rollouts.")
    step_seconds: float | None = Field(None, description="How long it took.")
    episodes: int | None = Field(None, ge=0, description="Episodes it trained on or left out.")
    episodes_excluded: int | None = Field(
        None, ge=0, description="Of those, episodes left out of training (their env failed)."
    )
    episodes_replayed: int | None = Field(
        None, ge=0, description="Of those, episodes whose lost session was replayed."
    )
    time: str | None = Field(None, max_length=64, description="When the trainer reported it.")


class TrainingHistory(CamelModel):
    """The run's steps, oldest first, each once: a step a lost trainer ran past its checkpoint is
    replaced by the step its successor trained again."""

    pod: str | None = Field(
        None, description="The trainer pod that reported the newest steps (one-node runs)."
    )
    steps: list[HistoryStep] = Field(
        default_factory=list,
        max_length=HISTORY_STEPS,
        description=(
            f"Oldest first: every one of the last {HISTORY_RECENT} steps and, before those, every "
            f"2nd, 4th, 8th, ... step (the smallest stride that fits): at most {HISTORY_STEPS}."
        ),
    )


# How many of a run's trainer restarts status.restarts.recent keeps.
RECENT_RESTARTS = 10


class TrainerRestart(CamelModel):
    """One trainer pod that ended and was replaced by the Job."""

    pod: str = Field(description="The pod that ended.")
    reason: str = Field(
        description="CamelCase cause: Evicted, Preempted, NodeLost, NodeTainted, Deleted, ..."
    )
    message: str = Field("", description="Detail, e.g. the pod's DisruptionTarget message.")
    time: Timestamp = Field(description="When it ended.")
    resumed_from_step: int | None = Field(
        None, ge=0, description="The step the next pod resumed from (0: from the start)."
    )


class TrainerRestarts(CamelModel):
    """The trainer pods a one-node run's Job replaced: disruptions, and retried failures."""

    count: int = Field(0, ge=0, description="Trainer pods that ended and were replaced.")
    recent: list[TrainerRestart] = Field(
        default_factory=list,
        max_length=RECENT_RESTARTS,
        description=f"The last {RECENT_RESTARTS} restarts, newest last.",
    )


class TrainingRunStatus(CamelModel):
    """What the operator observed, computed from the pool and the children."""

    phase: Phase = Field(Phase.PENDING, description="One word for `kubectl get`.")
    env_pool_url: str | None = Field(
        None, description="The pool URL the run uses (with envPools, the first pool's)."
    )
    env_pool_urls: dict[str, str] | None = Field(
        None, description="With envPools: each pool's URL, by name."
    )
    training: ChildRef | None = Field(None, description="The training Job or RayJob.")
    demand: RunDemand | None = Field(
        None, description="The env sessions the run keeps open at once."
    )
    preflight: PreflightStatus | None = Field(None, description="Preflight result.")
    progress: TrainingProgress | None = Field(
        None, description="The trainer's last reported step (one-node runs)."
    )
    history: TrainingHistory | None = Field(
        None, description="The trainer's steps so far, bounded (one-node runs)."
    )
    trainer_pod: str | None = Field(
        None, description="The pod the trainer runs in (one-node runs)."
    )
    restarts: TrainerRestarts | None = Field(
        None, description="Trainer pods the Job replaced, and why (one-node runs)."
    )
    start_time: Timestamp | None = Field(None, description="When the training child started.")
    completion_time: Timestamp | None = Field(None, description="When the run ended.")
    observed_generation: int = Field(0, ge=0, description="The spec generation last acted on.")
    conditions: list[Condition] = Field(
        default_factory=list,
        description=(
            "EnvPoolReady, EnvPoolSized, PreflightPassed, Running, Succeeded, Failed and "
            "Suspended, as metav1.Condition."
        ),
        json_schema_extra=CONDITIONS_SCHEMA_EXTRA,
    )

    def to_patch(self) -> dict[str, Any]:
        """The status as a JSON merge patch body: progress fields no longer reported are nulled,
        so the patch removes them instead of keeping an older step's values."""
        patch = self.to_api()
        if self.progress is not None:
            patch["progress"] = self.progress.model_dump(by_alias=True, mode="json")
        return patch
