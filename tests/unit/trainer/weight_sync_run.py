"""A two-step GRPO run on CPU for test_weight_sync.py: verl 0.9.1's main_ppo as the operator
renders a `device: cpu` TrainingRun (gymkube-train, the CPU overrides and environment, the
agent-loop YAML, the dataset steps), real vLLM, a tiny Qwen2 policy built here and a real
frozen_lake `gymkube-envserver`. Returns verl's own per-step metrics (its FileLogger records).

    .venv/bin/python tests/unit/trainer/weight_sync_run.py [--no-sync]

prints the figures the test asserts on; `--no-sync` runs the same with the weight sync into vLLM
turned into a no-op (weight_sync_off.py), the test's sensitivity check.

The policy answers almost every prompt with " down" or " up" (about a third each) and the lake is
one where "down" reaches the goal in the one reply an episode has, so about half the episodes
score 1 and a group of ROLLOUTS episodes almost never scores alike (GRPO's advantages are then
non-zero). It is random otherwise: 2 layers, hidden size 128, the agent-loop tests' 600-token BPE.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gymkube_agentloop.train import PROGRESS_PREFIX
from gymkube_operator.trainingrun import command, device
from gymkube_operator.trainingrun.command import Run, RunTarget
from gymkube_operator.trainingrun.models import TrainingRunSpec

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[0] / "agentloop"))

from agentloop_harness import BIN, EnvServer, build_tiny_qwen2  # noqa: E402

# Every episode plays this lake (seed 1: "F S / F G"): "down" from S reaches G, "up" meets the
# edge; one reply per episode, so a reply whose first move word is "down" scores 1, any other 0.
LAKE: dict[str, Any] = {"size": 2, "seed": 1, "max_steps": 1, "moves": "word"}
BATCH, ROLLOUTS = 2, 8
STEPS = 2
# Large on purpose: one Adam step moves every weight by about this much, so the policy after step
# 1 is clearly not the one vLLM loaded from disk.
LR = 1e-2
RESPONSE_TOKENS = 16
MODEL_DIR = "/models/tiny-qwen2"
# The policy's logit weights on the one direction every token embedding carries (see
# build_policy): the move words' and the end-of-turn token's.
MOVE_WEIGHT, EOS_WEIGHT = 0.76, 0.56
MOVE_TOKENS = ("Ġdown", "Ġup")
EOS_TOKEN = "<|im_end|>"
# Every process the run starts inherits this variable (Ray's too): how leftovers are found.
RUN_MARKER = "GYMKUBE_WEIGHT_SYNC_RUN"
# Minutes on a quiet 2-core machine; a loaded one took 13 minutes just to start training.
TIMEOUT_S = 1500.0


def build_policy(directory: Path) -> None:
    """A tiny random Qwen2 whose logits favour the move words and then the end of its turn: an
    answer that varies by sample."""
    weights = {token: MOVE_WEIGHT for token in MOVE_TOKENS} | {EOS_TOKEN: EOS_WEIGHT}
    build_tiny_qwen2(directory, weights, hidden_size=128, layers=2)


def run_spec() -> TrainingRunSpec:
    """A CPU TrainingRun of STEPS GRPO steps, with a reference policy (KL loss) and vLLM's own
    log-probs kept (calculate_log_probs), which verl then compares with the actor's."""
    actor = "actor_rollout_ref.actor"
    return TrainingRunSpec.model_validate(
        {
            "envPoolRef": {"name": "lake"},
            "device": "cpu",
            "model": {"path": MODEL_DIR},
            "agentLoop": {
                "maxTurns": 1,
                "maxObservationTokens": 64,
                "maxPromptTokens": 512,
                "maxResponseTokens": 64,
            },
            "dataset": {"size": BATCH * STEPS, "valSize": 1},
            "preflight": {"enabled": False},
            "overrides": [
                f"data.train_batch_size={BATCH}",
                f"actor_rollout_ref.rollout.n={ROLLOUTS}",
                f"{actor}.ppo_mini_batch_size={BATCH}",
                f"actor_rollout_ref.rollout.response_length={RESPONSE_TOKENS}",
                "actor_rollout_ref.rollout.gpu_memory_utilization=0.5",
                "actor_rollout_ref.rollout.calculate_log_probs=true",
                f"{actor}.use_kl_loss=true",
                f"{actor}.optim.lr={LR}",
                f"trainer.total_training_steps={STEPS}",
                "trainer.save_freq=-1",
                "trainer.test_freq=-1",
                "trainer.val_before_train=false",
                # verl's default, 8 dataloader processes, takes longer to start than the run's 4
                # rows take to load.
                "data.dataloader_num_workers=0",
                # A Ray of its own, even where someone's `ray start` cluster runs.
                "+ray_kwargs.ray_init.address=local",
                "+ray_kwargs.ray_init.include_dashboard=false",
            ],
        }
    )


def rendered_command(
    spec: TrainingRunSpec, pool_url: str, scratch: Path, metrics_file: Path
) -> list[str]:
    """The trainer command the operator renders, its in-pod paths moved under SCRATCH, with the
    agent-loop YAML, the parquet files and the model laid out as the pod has them, and verl's
    FileLogger records kept in METRICS_FILE."""
    run = Run(
        name="weight-sync", namespace="test", uid="0", trainer_image="", cpu_trainer_image="",
        preflight_image="", image_pull_policy="Never",
    )  # fmt: skip
    target = RunTarget(run=run, spec=spec, pool_url=pool_url, env="frozen_lake")
    moves = {
        command.DATA_DIR: scratch / "data",
        command.CONFIG_DIR: scratch / "config",
        command.CHECKPOINTS_DIR: scratch / "checkpoints",
        "/models": scratch / "models",
    }
    for path in moves.values():
        path.mkdir(parents=True)
    for name, text in command.config_files(target).items():
        (moves[command.CONFIG_DIR] / name).write_text(text)
    for args in command.dataset_commands(target).values():
        out = args[args.index("--out") + 1]
        args[args.index("--out") + 1] = out.replace(command.DATA_DIR, str(moves[command.DATA_DIR]))
        subprocess.run([BIN / args[0], *args[1:]], check=True, stdout=subprocess.DEVNULL)
    build_policy(moves["/models"] / Path(MODEL_DIR).name)

    def moved(arg: str) -> str:
        for old, new in moves.items():
            arg = arg.replace(old + "/", f"{new}/")
        return arg

    rendered = [moved(arg) for arg in command.trainer_command(target)]
    assert rendered[0] == command.TRAIN_WRAPPER
    rendered[0:1] = [str(BIN / rendered[0]), "--metrics-file", str(metrics_file)]
    rendered[rendered.index("python3")] = sys.executable
    return rendered


@dataclass
class TrainingResult:
    returncode: int
    seconds: float
    # verl's FileLogger records by step: the full metric dict of each step.
    metrics: dict[int, dict[str, Any]]
    progress: list[dict[str, Any]]
    output_tail: str
    skipped_syncs: int
    leftovers: list[int] = field(default_factory=list)


def marked_processes(token: str) -> list[int]:
    """Processes (other than this one) whose environment holds RUN_MARKER=token."""
    needle = f"{RUN_MARKER}={token}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue
        if needle in environ.split(b"\0"):
            found.append(int(entry.name))
    return found


def stop_marked(token: str) -> list[int]:
    """Kill what the run left running (Ray's raylet and workers, vLLM's engine): by PID, only
    the processes that carry this run's marker."""
    pids = marked_processes(token)
    for pid in pids:
        with suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return pids


@contextmanager
def lake_server() -> Iterator[EnvServer]:
    server = EnvServer(
        "frozen_lake",
        "--env-config", json.dumps(LAKE),
        "--max-sessions", str(4 * BATCH * ROLLOUTS),
        "--canary-interval", "0",
        "--log-level", "warning",
    )  # fmt: skip
    try:
        server.wait_ready(60)
        yield server
    finally:
        server.kill()


def train(scratch: Path, *, sync: bool = True, timeout_s: float = TIMEOUT_S) -> TrainingResult:
    """Run the rendered trainer to its end against a frozen_lake server; with sync=False the
    weight sync into vLLM is a no-op."""
    metrics_file = scratch / "metrics.jsonl"
    token = uuid.uuid4().hex
    env = {**os.environ, **device.CPU_ENV, RUN_MARKER: token}
    if not sync:
        env["VERL_USE_EXTERNAL_MODULES"] += ",weight_sync_off"
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(HERE), env.get("PYTHONPATH")]))
    with lake_server() as server:
        argv = rendered_command(run_spec(), server.url, scratch, metrics_file)
        started = time.monotonic()
        # In the scratch directory: Hydra writes its outputs/ where the trainer starts.
        trainer = subprocess.Popen(
            argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
            env=env,
            cwd=scratch,
        )
        lines: list[str] = []
        try:
            assert trainer.stdout is not None
            with (scratch / "trainer.log").open("w") as log:
                for line in trainer.stdout:
                    lines.append(line)
                    log.write(line)
                    log.flush()
                    if time.monotonic() - started > timeout_s:
                        break
            with suppress(subprocess.TimeoutExpired):
                trainer.wait(timeout=max(1.0, timeout_s - (time.monotonic() - started)))
        finally:
            if trainer.poll() is None:
                trainer.terminate()  # gymkube-train stops the trainer's process group
                try:
                    trainer.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    trainer.kill()
                    trainer.wait()
            leftovers = stop_marked(token)
        seconds = time.monotonic() - started
    records: dict[int, dict[str, Any]] = {}
    if metrics_file.exists():
        for raw in metrics_file.read_text().splitlines():
            record = json.loads(raw)
            if isinstance(record.get("step"), int) and isinstance(record.get("data"), dict):
                records.setdefault(record["step"], {}).update(record["data"])
    progress = [
        json.loads(line.removeprefix(PROGRESS_PREFIX))
        for line in lines
        if line.startswith(PROGRESS_PREFIX)
    ]
    return TrainingResult(
        returncode=trainer.returncode,
        seconds=seconds,
        metrics=records,
        progress=progress,
        output_tail="".join(lines[-60:]),
        skipped_syncs=sum("weight_sync_off: skipped" in line for line in lines),
        leftovers=leftovers,
    )


# What the test reads of each step, in verl 0.9.1's names.
FIGURES = (
    "critic/score/mean",
    "critic/score/min",
    "critic/score/max",
    "critic/advantages/min",
    "critic/advantages/max",
    "actor/grad_norm",
    "actor/kl_loss",
    "actor/pg_loss",
    "training/rollout_probs_diff_valid",
    "training/rollout_probs_diff_max",
    "training/rollout_probs_diff_mean",
    "training/rollout_actor_probs_pearson_corr",
    "timing_s/gen",
    "timing_s/update_actor",
    "timing_s/update_weights",
    "timing_s/step",
)


def figures(result: TrainingResult) -> dict[str, Any]:
    def shown(value: Any) -> Any:
        return round(value, 6) if isinstance(value, float) and math.isfinite(value) else value

    return {
        "returncode": result.returncode,
        "seconds": round(result.seconds, 1),
        "skipped_syncs": result.skipped_syncs,
        "leftovers": len(result.leftovers),
        "steps": {
            step: {key: shown(data.get(key)) for key in FIGURES}
            for step, data in sorted(result.metrics.items())
        },
    }


def main() -> None:
    import tempfile

    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--no-sync", action="store_true", help="make the weight sync a no-op")
    parser.add_argument("--scratch", type=Path, help="keep the run's files here (a new folder)")
    args = parser.parse_args()
    if args.scratch is not None:
        args.scratch.mkdir(parents=True)
        result = train(args.scratch, sync=not args.no_sync)
    else:
        with tempfile.TemporaryDirectory(prefix="weight-sync-") as tmp:
            result = train(Path(tmp), sync=not args.no_sync)
    if result.returncode != 0:
        print(result.output_tail, file=sys.stderr)
    print(json.dumps(figures(result), indent=1))


if __name__ == "__main__":
    main()
