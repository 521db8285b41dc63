"""What runs inside the trainer pods: the verl command line, the agent-loop YAML, the dataset steps.

Pure functions of the spec and the pool, so they are tested without a cluster (and the verl
command against verl 0.9.1's own Hydra config).
"""

import dataclasses
import json
import shlex
from typing import Any

import yaml

from gymkube_operator.trainingrun import device
from gymkube_operator.trainingrun.models import PoolShare, TrainingRunSpec

# Where things live inside every trainer pod.
DATA_DIR = "/data"


def data_file(split: str, pool: str | None = None) -> str:
    """Where a split's parquet is written: train or val, with envPools one per pool."""
    return f"{DATA_DIR}/{split}{f'-{pool}' if pool else ''}.parquet"


TRAIN_FILE = data_file("train")
VAL_FILE = data_file("val")
CONFIG_DIR = "/etc/gymkube"
AGENT_LOOP_FILE = "agent-loop.yaml"
SETTINGS_FILE = "run.yaml"
AGENT_LOOP_PATH = f"{CONFIG_DIR}/{AGENT_LOOP_FILE}"
# agentLoop.templates again, as JSON for gymkube-dataset and gymkube-preflight (--templates).
TEMPLATES_FILE = "templates.json"
TEMPLATES_PATH = f"{CONFIG_DIR}/{TEMPLATES_FILE}"
CHECKPOINTS_DIR = "/checkpoints"
# verl's TensorBoard logger writes where this names (verl/utils/tracking.py, _TensorboardAdapter).
TENSORBOARD_ENV = "TENSORBOARD_DIR"

# The gymkube agent loop as verl's AgentLoopWorker instantiates it (hydra `_target_`), and the name
# dataset rows carry in their agent_name column.
AGENT_LOOP_TARGET = "gymkube_agentloop.agent_loop.GymkubeEnvAgentLoop"
AGENT_LOOP_NAME = "gymkube_env"

# Where a custom loop's ConfigMap (customAgentLoop.configMap) is mounted; on PYTHONPATH.
CUSTOM_LOOP_DIR = "/opt/gymkube/agent-loop"
# The pool URL as gymkube's own steps read it; loops written for an AgentGym-style server read
# <ENV>_ENV_BASE (SCIWORLD_ENV_BASE for sciworld), which every trainer container gets too.
ENV_URL_VAR = "GYMKUBE_ENV_URL"


def _variable(name: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in name.upper())


def env_base_var(env: str) -> str:
    """The <ENV>_ENV_BASE variable of an env name: upper case, non-alphanumerics as _."""
    return _variable(env) + "_ENV_BASE"


def pool_url_var(pool: str) -> str:
    """GYMKUBE_ENV_URL_<POOL>: one pool's URL in a run over envPools."""
    return f"{ENV_URL_VAR}_{_variable(pool)}"


# verl's own default for ppo_max_token_len_per_gpu; raised when one trajectory would not fit.
MIN_TOKENS_PER_GPU = 16384

VERL_ENTRYPOINT = ("python3", "-m", "verl.trainer.main_ppo")
# gymkube-agentloop's wrapper around verl's trainer (a one-node Job's container command, a RayJob's
# entrypoint): it checks the model path, prints `gymkube-progress` lines from verl's FileLogger and
# writes the trainer's last error line to the termination log.
TRAIN_WRAPPER = "gymkube-train"
# On a RayJob verl's processes are Ray workers on whichever node Ray places them, started by that
# node's raylet: they read the files they write from the pod's environment, not the wrapper's. Every
# node names these (verl's FileLogger's file, gymkube's agent loop's episode log). The wrapper on
# the head reads the steps from verl's console lines, which Ray forwards from any node, and the
# episodes from the head's episode log (there when verl's agent-loop worker runs on the head).
RAY_METRICS_FILE = "/tmp/gymkube-train-metrics.jsonl"
RAY_EPISODE_LOG = "/tmp/gymkube-train-episodes.jsonl"
RAY_RUN_FILES = {"VERL_FILE_LOGGER_PATH": RAY_METRICS_FILE, "GYMKUBE_EPISODE_LOG": RAY_EPISODE_LOG}
# gymkube-train's exit codes that the training Job's podFailurePolicy acts on (the wrapper names
# them too, as EXIT_STOPPED and EXIT_BAD_INPUT; the operator does not import gymkube-agentloop,
# so a test holds the two equal).
# SIGTERM stopped the trainer (its pod was deleted): sysexits' EX_TEMPFAIL, "try again later".
TRAINER_EXIT_STOPPED = 75
# The trainer cannot start from its input (a wrong model path): no retry can fix that.
TRAINER_EXIT_BAD_INPUT = 2


@dataclasses.dataclass(frozen=True)
class Run:
    """A TrainingRun's identity and the operator's default images for it."""

    name: str
    namespace: str
    uid: str
    trainer_image: str
    cpu_trainer_image: str
    preflight_image: str
    image_pull_policy: str
    generation: int = 1


@dataclasses.dataclass(frozen=True)
class ServedPool:
    """One pool of a run over envPools, as the operator found it Ready."""

    share: PoolShare
    url: str
    env: str

    @property
    def name(self) -> str:
        return self.share.name


@dataclasses.dataclass(frozen=True)
class RunTarget:
    """One TrainingRun as the builders see it: the run, its spec and the pool it plays (with
    envPools: every pool, in spec order, and pool_url and env are the first one's)."""

    run: Run
    spec: TrainingRunSpec
    pool_url: str
    env: str
    pools: tuple[ServedPool, ...] = ()

    @property
    def name(self) -> str:
        return self.run.name

    @property
    def namespace(self) -> str:
        return self.run.namespace

    @property
    def uid(self) -> str:
        return self.run.uid

    @property
    def image_pull_policy(self) -> str:
        return self.run.image_pull_policy

    @property
    def trainer_image(self) -> str:
        if self.spec.image:
            return self.spec.image
        return self.run.cpu_trainer_image if self.spec.device == "cpu" else self.run.trainer_image

    @property
    def preflight_image(self) -> str:
        return self.spec.preflight.image or self.run.preflight_image

    @property
    def checkpoint_dir(self) -> str:
        return checkpoint_dir(self.name)


def checkpoint_dir(run: str) -> str:
    # One checkpoints volume can hold many runs; a run recreated under the same name resumes.
    return f"{CHECKPOINTS_DIR}/{run}"


def tensorboard_dir(run: str) -> str:
    return f"{checkpoint_dir(run)}/tensorboard"


def keeps_checkpoints(spec: TrainingRunSpec) -> bool:
    """Whether the run's checkpoints outlive its pod (spec.checkpoints names a volume that is not
    an emptyDir, the default): only then are its TensorBoard log and Hugging Face weights written
    there, where someone can read them."""
    return spec.checkpoints is not None and "emptyDir" not in spec.checkpoints


def loggers(spec: TrainingRunSpec) -> list[str]:
    """verl's trainer.logger: its default list includes wandb, which fails without an API key;
    gymkube-train reads the file logger's records (it sets VERL_FILE_LOGGER_PATH); TensorBoard
    beside the checkpoints when they are kept."""
    return ["console", "file", *(["tensorboard"] if keeps_checkpoints(spec) else [])]


def trainer_env(name: str, spec: TrainingRunSpec) -> list[dict[str, str]]:
    """The trainer's environment for verl's loggers: where TensorBoard writes, when it logs."""
    if not keeps_checkpoints(spec):
        return []
    return [{"name": TENSORBOARD_ENV, "value": tensorboard_dir(name)}]


def apportion(total: int, weights: list[int]) -> list[int]:
    """TOTAL rows split in proportion to WEIGHTS (largest remainders), each share at least 1."""
    whole = sum(weights)
    exact = [total * weight / whole for weight in weights]
    shares = [max(1, int(value)) for value in exact]
    by_remainder = sorted(range(len(weights)), key=lambda i: int(exact[i]) - exact[i])
    for index in by_remainder[: max(0, total - sum(shares))]:
        shares[index] += 1
    return shares


def data_files(spec: TrainingRunSpec, split: str) -> list[str]:
    """The parquet files of a split (train or val): one, or with envPools one per pool."""
    if spec.env_pools is None:
        return [data_file(split)]
    return [data_file(split, pool.name) for pool in spec.env_pools]


def hydra_string(value: str) -> str:
    """Quote a string for a Hydra command-line override so paths and URLs parse as one string."""
    escaped = value.replace("\\", "\\\\").replace("'", "\\'")
    return f"'{escaped}'"


def hydra_list(values: list[str]) -> str:
    return "[" + ",".join(hydra_string(v) for v in values) + "]"


def verl_overrides(target: RunTarget) -> list[str]:
    """gymkube's overrides for verl.trainer.main_ppo, then the device's, then the user's own
    (last one wins)."""
    return run_overrides(target.name, target.spec)


def run_overrides(name: str, spec: TrainingRunSpec) -> list[str]:
    """verl_overrides from the run's name and spec alone (no pool needed), so they can be checked
    before the pool is Ready."""
    loop = spec.agent_loop
    rollout = "actor_rollout_ref.rollout"
    max_tokens_per_gpu = max(MIN_TOKENS_PER_GPU, loop.max_prompt_tokens + loop.max_response_tokens)
    ours = [
        f"algorithm.adv_estimator={spec.algorithm}",
        f"data.train_files={hydra_list(data_files(spec, 'train'))}",
        f"data.val_files={hydra_list(data_files(spec, 'val'))}",
        # The agent loop builds its own prompt from the raw messages of each row.
        "data.return_raw_chat=true",
        f"data.max_prompt_length={loop.max_prompt_tokens}",
        f"data.max_response_length={loop.max_response_tokens}",
        f"actor_rollout_ref.model.path={hydra_string(spec.model.path)}",
        # Multi-turn trajectories vary a lot in length: batch by tokens, not by samples, so a run
        # needs no per-GPU micro-batch size to start.
        "actor_rollout_ref.actor.use_dynamic_bsz=true",
        f"actor_rollout_ref.actor.ppo_max_token_len_per_gpu={max_tokens_per_gpu}",
        f"{rollout}.name=vllm",
        f"{rollout}.mode=async",
        f"{rollout}.agent.agent_loop_config_path={hydra_string(AGENT_LOOP_PATH)}",
        f"{rollout}.agent.default_agent_loop={AGENT_LOOP_NAME}",
        f"{rollout}.multi_turn.enable=true",
        f"{rollout}.multi_turn.max_assistant_turns={loop.max_turns}",
        f"{rollout}.multi_turn.max_user_turns={loop.max_turns}",
        # An episode the agent loop excludes (its env failed) leaves its group smaller; a group
        # left with none is replaced by a fresh prompt instead of failing the step.
        "trainer.v1.sampler.sync_refill_failed_groups=true",
        f"trainer.nnodes={spec.nodes}",
        f"trainer.n_gpus_per_node={spec.gpus_per_node}",
        f"trainer.default_local_dir={hydra_string(checkpoint_dir(name))}",
        # A retried trainer (its pod deleted, evicted, its node lost) goes on from the newest
        # checkpoint there: verl's default, said here so that it stays so.
        "trainer.resume_mode=auto",
        "trainer.project_name=gymkube",
        f"trainer.experiment_name={hydra_string(name)}",
        f"trainer.logger={hydra_list(loggers(spec))}",
    ]
    if spec.algorithm == "gae":
        # PPO trains a critic; verl's default critic path is a placeholder model.
        ours.append(f"critic.model.path={hydra_string(spec.model.path)}")
    # Each key once: a device setting replaces gymkube's own value in place of adding a second.
    extra = device.overrides(spec)
    replaced = {device.override_key(o) for o in extra}
    ours = [o for o in ours if device.override_key(o) not in replaced]
    return ours + extra + list(spec.overrides)


def verl_command(target: RunTarget) -> list[str]:
    return [*VERL_ENTRYPOINT, *verl_overrides(target)]


def trainer_command(target: RunTarget) -> list[str]:
    """The trainer container's command in a one-node Job: verl's, run by gymkube-train."""
    custom = target.spec.custom_agent_loop
    checked_loop = ["--agent-loop-class", custom.class_name] if custom is not None else []
    return [
        TRAIN_WRAPPER,
        "--checkpoint-dir",
        target.checkpoint_dir,
        "--model-path",
        target.spec.model.path,
        *checked_loop,
        "--",
        *verl_command(target),
    ]


def ray_entrypoint(target: RunTarget) -> str:
    """A RayJob's entrypoint, one shell string: the same command, its steps read from verl's
    console and its episodes from the log every node's environment names (RAY_RUN_FILES)."""
    wrapper, *rest = trainer_command(target)
    return shlex.join([wrapper, "--steps-from-log", "--episode-log", RAY_EPISODE_LOG, *rest])


def agent_loop_config(target: RunTarget) -> list[dict[str, Any]]:
    """verl's agent-loop YAML: one entry; every key but name and _target_ is a loop kwarg."""
    custom = target.spec.custom_agent_loop
    if custom is not None:
        # Rows name AGENT_LOOP_NAME, so the user's class takes that name, whatever parameters say.
        parameters = custom.parameters or {}
        return [{**parameters, "name": AGENT_LOOP_NAME, "_target_": custom.class_name}]
    loop = target.spec.agent_loop
    entry: dict[str, Any] = {
        "name": AGENT_LOOP_NAME,
        "_target_": AGENT_LOOP_TARGET,
        "env_url": target.pool_url,
        # Each row names its pool (extra_info.pool), which this maps to its URL.
        **({"env_urls": {p.name: p.url for p in target.pools}} if target.pools else {}),
        "max_turns": loop.max_turns,
        "max_observation_tokens": loop.max_observation_tokens,
        "reward": loop.reward,
    }
    if loop.prompt_template is not None:
        entry["prompt_template"] = loop.prompt_template
    if loop.templates:
        entry["templates"] = loop.templates
    return [entry]


def run_settings(target: RunTarget) -> dict[str, Any]:
    """What the run was rendered from, kept beside the agent-loop YAML for people reading it."""
    return {
        "trainingRun": target.name,
        "envPoolUrl": target.pool_url,
        "env": target.env,
        **({"envPools": {p.name: p.url for p in target.pools}} if target.pools else {}),
        "spec": target.spec.to_api(),
        "command": verl_command(target),
    }


def config_files(target: RunTarget) -> dict[str, str]:
    files = {
        AGENT_LOOP_FILE: yaml.safe_dump(agent_loop_config(target), sort_keys=False),
        SETTINGS_FILE: yaml.safe_dump(run_settings(target), sort_keys=False, width=100),
    }
    if target.spec.agent_loop.templates:
        files[TEMPLATES_FILE] = json.dumps(target.spec.agent_loop.templates, indent=2)
    return files


def _template_args(target: RunTarget, pool: ServedPool | None = None) -> list[str]:
    loop = target.spec.agent_loop
    template = (pool.share.prompt_template if pool else None) or loop.prompt_template
    args = ["--template", template] if template else []
    return args + (["--templates", TEMPLATES_PATH] if loop.templates else [])


def _pool_args(target: RunTarget, pool: ServedPool | None) -> list[str]:
    url, env = (pool.url, pool.env) if pool else (target.pool_url, target.env)
    return ["--env-url", url, "--env", env]


def dataset_command(
    target: RunTarget, *, split: str, size: int, out: str, pool: ServedPool | None = None
) -> list[str]:
    return [
        "gymkube-dataset",
        *_pool_args(target, pool),
        "--split",
        split,
        "--size",
        str(size),
        "--seed",
        str(target.spec.dataset.seed),
        "--out",
        out,
        *_template_args(target, pool),
        *(["--pool", pool.name] if pool else []),
    ]


def dataset_commands(target: RunTarget) -> dict[str, list[str]]:
    """The train and validation parquet steps, by container name: with envPools, a pair per pool
    (dataset-train-<pool>, dataset-val-<pool>), its rows dataset.size and valSize by weight."""
    data = target.spec.dataset
    pools: list[ServedPool | None] = list(target.pools) or [None]
    weights = [pool.share.weight if pool else 1 for pool in pools]
    sizes = apportion(data.size, weights)
    val_sizes = apportion(data.val_size, weights)
    train_files, val_files = data_files(target.spec, "train"), data_files(target.spec, "val")
    steps: dict[str, list[str]] = {}
    for index, pool in enumerate(pools):
        suffix = f"-{pool.name}" if pool else ""
        steps[f"dataset-train{suffix}"] = dataset_command(
            target, split=data.split, size=sizes[index], out=train_files[index], pool=pool
        )
        steps[f"dataset-val{suffix}"] = [
            *dataset_command(
                target, split=data.val_split, size=val_sizes[index], out=val_files[index], pool=pool
            ),
            "--validation",
        ]
    return steps


# gymkube-preflight prints its JSON summary on stdout. The script keeps it in the pod log and puts
# a compact copy into /dev/termination-log, which the kubelet copies into the pod status (4 KiB at
# most) for the operator to read; the exit code is kept, so a failed preflight fails its Job. The
# containers of a run over several pools share /tmp: each writes a file of its own.
PREFLIGHT_SCRIPT = (
    'out=$(mktemp /tmp/summary.XXXXXX); gymkube-preflight "$@" > "$out"; code=$?; cat "$out"; '
    'python3 -m json.tool --compact "$out" /dev/termination-log 2>/dev/null; exit $code'
)


def preflight_command(target: RunTarget, pool: ServedPool | None = None) -> list[str]:
    """gymkube-preflight on the training split, with the run's turn limit and template, on the
    run's pool (with envPools, on POOL)."""
    spec = target.spec
    args = [
        *_pool_args(target, pool),
        "--episodes",
        str(spec.preflight.episodes),
        "--policy",
        spec.preflight.policy,
        "--split",
        spec.dataset.split,
        "--seed",
        str(spec.dataset.seed),
        "--max-steps",
        str(spec.agent_loop.max_turns),
        *_template_args(target, pool),
    ]
    return ["sh", "-c", PREFLIGHT_SCRIPT, "gymkube-preflight", *args]
