"""What runs inside an EvalRun's pod: gymkube-dataset's rows, gymkube-eval's command line and the
agent-loop YAML, the TrainingRun's own builders reused so an eval plays exactly as training did.

Pure functions of the spec, the pool and the model's TrainingRun, tested without a cluster.
"""

import dataclasses
from typing import Any

import yaml

from gymkube_operator.evalrun.models import LATEST, EvalRunSpec
from gymkube_operator.trainingrun import command as training
from gymkube_operator.trainingrun.command import Run, RunTarget
from gymkube_operator.trainingrun.models import (
    AgentLoopSpec,
    DatasetSpec,
    Device,
    ModelSpec,
    TrainingRunSpec,
)

ROWS_FILE = f"{training.DATA_DIR}/eval.parquet"
SETTINGS_FILE = "eval.yaml"
EVAL_RUNNER = "gymkube-eval"
# The kubelet copies this file into the pod status (4 KiB at most): gymkube-eval writes its summary
# there (without the per-task results), or on bad input or a failure its one-line reason.
TERMINATION_LOG = "/dev/termination-log"
# gymkube-eval's exit code for input no retry can fix: a missing model or checkpoint step.
EVAL_EXIT_BAD_INPUT = 2


@dataclasses.dataclass(frozen=True)
class EvalTarget:
    """One EvalRun as the builders see it: its identity, spec, pool, and the TrainingRun whose
    checkpoint it scores (None for a path model)."""

    run: Run
    spec: EvalRunSpec
    pool_url: str
    env: str
    training_run: TrainingRunSpec | None = None

    @property
    def name(self) -> str:
        return self.run.name

    @property
    def agent_loop(self) -> AgentLoopSpec:
        """The eval's own, else its TrainingRun's (so eval plays as training did)."""
        if self.spec.agent_loop is not None:
            return self.spec.agent_loop
        if self.training_run is not None:
            return self.training_run.agent_loop
        return AgentLoopSpec()

    @property
    def device(self) -> Device:
        if self.spec.device is not None:
            return self.spec.device
        return self.training_run.device if self.training_run is not None else "gpu"

    @property
    def model_path(self) -> str:
        """The model directory the eval loads, or for a checkpoint its TrainingRun's directory."""
        checkpoint = self.spec.model.training_run
        if checkpoint is not None:
            return training.checkpoint_dir(checkpoint.name)
        assert self.spec.model.path is not None  # the CRD's rule: path or trainingRun
        return self.spec.model.path

    def as_training(self) -> RunTarget:
        """The same settings as a one-node TrainingRun, for the TrainingRun's builders: the
        dataset step, the agent-loop YAML and the trainer container."""
        spec = TrainingRunSpec(
            env_pool_ref=self.spec.env_pool_ref,
            image=self.spec.image,
            model=ModelSpec(path=self.model_path),
            gpus_per_node=1,
            device=self.device,
            resources=self.spec.resources,
            shm_size=self.spec.shm_size,
            agent_loop=self.agent_loop,
            dataset=DatasetSpec(seed=self.spec.dataset.seed),
        )
        return RunTarget(run=self.run, spec=spec, pool_url=self.pool_url, env=self.env)


def described_model(spec: EvalRunSpec) -> str:
    """What is scored, in a few words: the path, or <trainingrun>@<step>."""
    checkpoint = spec.model.training_run
    if checkpoint is None:
        return spec.model.path or ""
    return f"{checkpoint.name}@{checkpoint.step}"


def dataset_command(target: EvalTarget) -> list[str]:
    data = target.spec.dataset
    return training.dataset_command(
        target.as_training(), split=data.split, size=data.size, out=ROWS_FILE
    )


def _model_args(target: EvalTarget) -> list[str]:
    checkpoint = target.spec.model.training_run
    if checkpoint is None:
        return ["--model", target.model_path]
    step = LATEST if checkpoint.step == LATEST else str(checkpoint.step)
    return ["--checkpoints", target.model_path, "--step", step]


def eval_command(target: EvalTarget) -> list[str]:
    spec, loop = target.spec, target.agent_loop
    return [
        EVAL_RUNNER,
        "--env-url",
        target.pool_url,
        "--env",
        target.env,
        "--rows",
        ROWS_FILE,
        "--agent-loop-config",
        training.AGENT_LOOP_PATH,
        *_model_args(target),
        "--temperature",
        str(spec.sampling.temperature),
        "--top-p",
        str(spec.sampling.top_p),
        "--samples-per-task",
        str(spec.sampling.samples_per_task),
        "--max-prompt-tokens",
        str(loop.max_prompt_tokens),
        "--max-response-tokens",
        str(loop.max_response_tokens),
        "--seed",
        str(spec.dataset.seed),
        "--device",
        target.device,
        "--termination-log",
        TERMINATION_LOG,
    ]


def eval_settings(target: EvalTarget) -> dict[str, Any]:
    """What the eval was rendered from, kept beside the agent-loop YAML for people reading it."""
    return {
        "evalRun": target.name,
        "envPoolUrl": target.pool_url,
        "env": target.env,
        "spec": target.spec.to_api(),
        "agentLoop": target.agent_loop.to_api(),
        "device": target.device,
        "command": eval_command(target),
    }


def config_files(target: EvalTarget) -> dict[str, str]:
    """The ConfigMap's files: the TrainingRun's agent-loop YAML (and templates), and eval.yaml in
    place of the TrainingRun's run.yaml."""
    files = training.config_files(target.as_training())
    del files[training.SETTINGS_FILE]
    files[SETTINGS_FILE] = yaml.safe_dump(eval_settings(target), sort_keys=False, width=100)
    return files
