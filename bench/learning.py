"""Watch it learn: a CPU GRPO run whose reward climbs, step by step, with a PNG of the curve.

    .venv/bin/python bench/learning.py [--seed 0] [--steps N] [--png docs/img/learning-curve.png]

It runs examples/trainingrun-frozenlake-learn.yaml exactly as the operator renders a `device: cpu`
run (bench/training.py's pieces: the same local pool of real `gymkube-envserver` + `gymkube-router`
processes, here with examples/envpool-frozenlake-learn.yaml's env config, the same trainer command
with its in-pod paths moved to a scratch directory) and prints one JSON object per step: the mean
reward (the env's own scores), verl's entropy, response length, advantages, the rollout-vs-actor
probability gap (the policy vLLM samples from is the one the actor trained), and the step's time.
Around the run, the base model and the trained checkpoint are each scored on held-out episodes
(the env's test split, never in the training rows) as an EvalRun renders it: gymkube-dataset's
rows, then `gymkube-eval` with the run's prompt template and turn limits through the same pool,
sampling as training did (temperature 1). Then a summary: the mean reward of the first 3 and the
last 3 steps, their difference and whether it reaches the target; both evals' scores with their
95 % intervals, their difference and whether it reaches its target; and the PNG of reward per
step with the two scores marked.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from gymkube_agentloop.evaluate import RESULT_PREFIX
from gymkube_operator.evalrun.command import EvalTarget, config_files, dataset_command, eval_command
from gymkube_operator.evalrun.models import (
    EvalDatasetSpec,
    EvalModelSpec,
    EvalRunSpec,
    SamplingSpec,
    TrainingRunCheckpoint,
)
from gymkube_operator.trainingrun import command, device
from gymkube_operator.trainingrun.models import EnvPoolRef, TrainingRunSpec
from PIL import Image, ImageDraw, ImageFont
from training import (
    BENCH_RUN,
    BIN,
    MODEL,
    REPO,
    LocalPool,
    PodPaths,
    manifest_spec,
    pool,
    pool_env_config,
    rendered_run,
    trainer_progress,
)

LEARN_RUN = REPO / "examples" / "trainingrun-frozenlake-learn.yaml"
LEARN_POOL = REPO / "examples" / "envpool-frozenlake-learn.yaml"
CURVE_PNG = REPO / "docs" / "img" / "learning-curve.png"
# The target: the last steps' mean reward at least this far above the first steps'.
EDGE_STEPS = 3
TARGET_GAIN = 0.25
# And the trained checkpoint's held-out score at least this far above the base model's.
EVAL_TASKS = 64
TARGET_EVAL_GAIN = 0.2
# The trainer's rollout temperature (verl's default, which the example keeps): the evals sample
# the policy as training did.
EVAL_TEMPERATURE = 1.0
# verl saves the Hugging Face copy gymkube-eval loads only when asked (docs/trainingrun.md).
SAVE_HF_MODEL = (
    "actor_rollout_ref.actor.checkpoint.save_contents=['model','optimizer','extra','hf_model']"
)
# The env server's own count of ended episodes and the sum of their last scores.
ENV_TOTALS = re.compile(r"^gymkube_envserver_(episodes|episode_score)_total (\S+)$")
# verl 0.9.1's step metrics kept in each step's JSON, by the name printed.
VERL_METRICS = {
    "entropy": "actor/entropy",
    "response_tokens": "response_length/mean",
    "response_clip_ratio": "response_length/clip_ratio",
    "turns": "training/num_turns/mean",
    "advantage_max": "critic/advantages/max",
    "advantage_min": "critic/advantages/min",
    "pg_loss": "actor/pg_loss",
    "grad_norm": "actor/grad_norm",
    "rollout_actor_prob_gap": "training/rollout_probs_diff_mean",
}


@dataclass(frozen=True)
class CurveSummary:
    """What a run's rewards per step say: first and last steps' means, and their difference."""

    steps: int
    first_mean: float
    last_mean: float
    gain: float
    target: float
    met: bool


def summarize(
    rewards: Sequence[float], edge: int = EDGE_STEPS, target: float = TARGET_GAIN
) -> CurveSummary:
    """The mean reward of the first and last EDGE steps (fewer steps: they overlap)."""
    if not rewards:
        raise ValueError("no steps to summarize")
    first = statistics.fmean(rewards[:edge])
    last = statistics.fmean(rewards[-edge:])
    gain = last - first
    return CurveSummary(
        steps=len(rewards),
        first_mean=round(first, 4),
        last_mean=round(last, 4),
        gain=round(gain, 4),
        target=target,
        met=gain >= target,
    )


# Colours of the plot (RGB).
BACKGROUND = (255, 255, 255)
INK = (40, 40, 40)
GRID = (225, 225, 225)
CURVE = (31, 119, 180)
SMOOTHED = (255, 127, 14)
BASE_EVAL = (120, 120, 120)
TRAINED_EVAL = (44, 160, 44)


def plot_rewards(
    rewards: Sequence[float],
    out: Path,
    title: str,
    size: tuple[int, int] = (800, 480),
    evals: tuple[EvalScore, EvalScore] | None = None,
) -> None:
    """A PNG of reward per step (0..1 on the y axis) with its 3-step moving mean, and the base
    and trained evals' held-out scores as lines with their 95 % intervals (at the first and the
    last step)."""
    if not rewards:
        raise ValueError("no steps to plot")
    width, height = size
    left, right, top, bottom = 70, 20, 50, 60
    image = Image.new("RGB", size, BACKGROUND)
    draw = ImageDraw.Draw(image)
    font = ImageFont.load_default(size=15)
    small = ImageFont.load_default(size=13)
    plot_w, plot_h = width - left - right, height - top - bottom
    last_step = max(len(rewards), 2)

    def at(step: float, reward: float) -> tuple[float, float]:
        x = left + (step - 1) / (last_step - 1) * plot_w
        y = top + (1.0 - min(max(reward, 0.0), 1.0)) * plot_h
        return x, y

    for tick in range(6):
        reward = tick / 5
        _, y = at(1, reward)
        draw.line([(left, y), (width - right, y)], fill=GRID)
        draw.text((left - 8, y), f"{reward:.1f}", fill=INK, font=small, anchor="rm")
    for step in range(1, len(rewards) + 1):
        x, _ = at(step, 0.0)
        draw.line([(x, top + plot_h), (x, top + plot_h + 4)], fill=INK)
        draw.text((x, top + plot_h + 8), str(step), fill=INK, font=small, anchor="mt")
    draw.rectangle([(left, top), (width - right, top + plot_h)], outline=INK)
    points = [at(step, reward) for step, reward in enumerate(rewards, start=1)]
    smoothed = [
        at(step, statistics.fmean(rewards[max(0, step - EDGE_STEPS) : step]))
        for step in range(1, len(rewards) + 1)
    ]
    if len(points) > 1:
        draw.line(points, fill=CURVE, width=2)
        draw.line(smoothed, fill=SMOOTHED, width=2)
    for x, y in points:
        draw.ellipse([(x - 4, y - 4), (x + 4, y + 4)], fill=CURVE)
    draw.text((width / 2, 18), title, fill=INK, font=font, anchor="mm")
    draw.text((width / 2, height - 18), "GRPO step", fill=INK, font=font, anchor="mm")
    draw.text((left - 8, top - 10), "reward", fill=INK, font=font, anchor="rb")
    legend = [
        (CURVE, "mean reward of the step"),
        (SMOOTHED, f"mean of the last {EDGE_STEPS} steps"),
    ]
    if evals is not None:
        for colour, score, step, label in (
            (BASE_EVAL, evals[0], 1, "base model"),
            (TRAINED_EVAL, evals[1], len(rewards), "trained"),
        ):
            _, y = at(step, score.mean_score)
            draw.line([(left, y), (width - right, y)], fill=colour, width=1)
            x, lo = at(step, score.interval[0])
            _, hi = at(step, score.interval[1])
            draw.line([(x, lo), (x, hi)], fill=colour, width=3)
            draw.rectangle([(x - 5, y - 5), (x + 5, y + 5)], fill=colour)
            lo_text, hi_text = score.interval
            legend.append(
                (
                    colour,
                    f"{label}, {score.episodes} held-out episodes: {score.mean_score:.2f} "
                    f"(95% {lo_text:.2f}-{hi_text:.2f})",
                )
            )
    legend_x = left + 12
    for row, (colour, label) in enumerate(legend):
        y = top + 14 + row * 20
        draw.line([(legend_x, y), (legend_x + 24, y)], fill=colour, width=3)
        draw.text((legend_x + 32, y), label, fill=INK, font=small, anchor="lm")
    out.parent.mkdir(parents=True, exist_ok=True)
    image.save(out, format="PNG")


@dataclass(frozen=True)
class EnvTotals:
    """The env server's episode counters at one moment."""

    episodes: float
    score: float

    def mean_since(self, earlier: EnvTotals) -> float | None:
        """The mean last score of the episodes that ended since EARLIER (None: none did)."""
        ended = self.episodes - earlier.episodes
        return round((self.score - earlier.score) / ended, 4) if ended else None


def env_totals(server_url: str) -> EnvTotals:
    with urllib.request.urlopen(server_url + "/metrics", timeout=10) as reply:
        text = reply.read().decode()
    found = {
        m.group(1): float(m.group(2)) for line in text.splitlines() if (m := ENV_TOTALS.match(line))
    }
    return EnvTotals(found["episodes"], found["episode_score"])


def step_record(
    progress: dict[str, Any], metrics: dict[int, dict[str, Any]], env_mean_score: float | None
) -> dict[str, Any]:
    """One step's JSON: gymkube-train's progress line, the verl metrics named above and the mean
    score of the step's episodes as the env server counted them (the same as the reward, or
    the reward the trainer sees is not the env's)."""
    step = int(progress["step"])
    verl = metrics.get(step, {})
    return {
        "step": step,
        "mean_reward": progress.get("meanReward"),
        "env_mean_score": env_mean_score,
        **{name: _rounded(verl.get(key)) for name, key in VERL_METRICS.items()},
        "step_s": progress.get("stepSeconds"),
        "generation_s": progress.get("generationSeconds"),
        "update_s": progress.get("updateSeconds"),
    }


def _rounded(value: Any) -> float | None:
    return round(float(value), 4) if isinstance(value, int | float) else None


def read_metrics(path: Path) -> dict[int, dict[str, Any]]:
    """verl's FileLogger records so far, by step."""
    if not path.is_file():
        return {}
    by_step: dict[int, dict[str, Any]] = {}
    for line in path.read_text().splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and isinstance(record.get("step"), int):
            by_step[record["step"]] = record.get("data") or {}
    return by_step


def learn_spec(run: Path, seed: int, steps: int | None) -> tuple[TrainingRunSpec, int]:
    """The TrainingRun manifest RUN with this seed (the training lakes, their order and vLLM's
    sampling), STEPS if given, and a Hugging Face checkpoint at its last step; and its steps."""
    overrides = [f"data.seed={seed}", f"actor_rollout_ref.rollout.seed={seed}"]
    if steps is not None:
        overrides.append(f"trainer.total_training_steps={steps}")
    spec = manifest_spec(run, overrides)
    total = next(
        int(o.split("=", 1)[1])
        for o in reversed(spec.overrides)
        if o.startswith("trainer.total_training_steps=")
    )
    spec = manifest_spec(run, [*overrides, f"trainer.save_freq={total}", SAVE_HF_MODEL])
    dataset = spec.dataset.model_copy(update={"seed": seed})
    return spec.model_copy(update={"dataset": dataset}), total


def train(
    spec: TrainingRunSpec, local: LocalPool, scratch: Path, models: Path, log: IO[str]
) -> list[dict[str, Any]]:
    """Run SPEC once against the local pool, in SCRATCH (PodPaths.under); its steps' records,
    each printed as it comes."""
    argv = rendered_run(spec, local.url, scratch, models)
    metrics_file = scratch / "metrics.jsonl"
    # gymkube-train's own option: where verl's FileLogger writes (a file in /tmp otherwise).
    argv[1:1] = ["--metrics-file", str(metrics_file)]
    records: list[dict[str, Any]] = []
    before = env_totals(local.server_urls[0])
    for progress in trainer_progress(argv, scratch, log):
        now = env_totals(local.server_urls[0])
        record = step_record(progress, read_metrics(metrics_file), now.mean_since(before))
        before = now
        print(json.dumps(record), flush=True)
        records.append(record)
    return records


@dataclass(frozen=True)
class EvalScore:
    """One gymkube-eval summary, as the bench reports it."""

    model: str
    episodes: int
    mean_score: float
    interval: tuple[float, float]
    success_rate: float
    env_errors: int
    seconds: float


def eval_score(result_line: str, seconds: float) -> EvalScore:
    summary = json.loads(result_line.removeprefix(RESULT_PREFIX))
    lo, hi = summary["meanScoreInterval"]
    return EvalScore(
        model=summary["model"],
        episodes=summary["episodes"],
        mean_score=round(summary["meanScore"], 4),
        interval=(round(lo, 4), round(hi, 4)),
        success_rate=round(summary["successRate"], 4),
        env_errors=summary["envErrors"],
        seconds=round(seconds, 1),
    )


def eval_spec(model: EvalModelSpec, tasks: int, seed: int) -> EvalRunSpec:
    return EvalRunSpec(
        env_pool_ref=EnvPoolRef(name="bench"),
        model=model,
        device="cpu",
        dataset=EvalDatasetSpec(split="test", size=tasks, seed=seed),
        sampling=SamplingSpec(temperature=EVAL_TEMPERATURE),
    )


def evaluate(
    spec: EvalRunSpec, training: TrainingRunSpec, local: LocalPool, paths: PodPaths
) -> EvalScore:
    """What an EvalRun of SPEC (its model's TrainingRun: TRAINING) scores through the pool: its
    rendered rows step and gymkube-eval, with the eval pod's paths as PATHS has them."""
    target = EvalTarget(
        run=BENCH_RUN, spec=spec, pool_url=local.url, env="frozen_lake", training_run=training
    )
    paths.make()
    paths.write_config(config_files(target))
    paths.run_step(dataset_command(target))
    argv = [str(BIN / "gymkube-eval"), *map(paths.moved, eval_command(target)[1:])]
    # No kubelet reads a termination log here.
    del argv[argv.index("--termination-log") : argv.index("--termination-log") + 2]
    started = time.monotonic()
    done = subprocess.run(
        argv, capture_output=True, text=True, env={**os.environ, **device.CPU_ENV}
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith(RESULT_PREFIX)]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"gymkube-eval exited {done.returncode}: {done.stderr[-2000:]}")
    return eval_score(lines[-1], time.monotonic() - started)


@dataclass(frozen=True)
class EvalComparison:
    base: EvalScore
    trained: EvalScore
    gain: float
    target: float
    met: bool


def compare(
    base: EvalScore, trained: EvalScore, target: float = TARGET_EVAL_GAIN
) -> EvalComparison:
    gain = round(trained.mean_score - base.mean_score, 4)
    return EvalComparison(base, trained, gain, target, gain >= target)


def eval_paths(scratch: Path, label: str) -> PodPaths:
    """An eval pod's paths: rows and config of its own, the run's checkpoints and models."""
    paths = PodPaths.under(scratch).moves
    own = {
        command.DATA_DIR: scratch / label / "data",
        command.CONFIG_DIR: scratch / label / "config",
    }
    return PodPaths({**paths, **own})


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--run", type=Path, default=LEARN_RUN, help="a TrainingRun manifest")
    parser.add_argument("--pool", type=Path, default=LEARN_POOL, help="an EnvPool manifest")
    parser.add_argument("--seed", type=int, default=0, help="dataset and sampling seed")
    parser.add_argument("--steps", type=int, help="GRPO steps (default: the example's)")
    parser.add_argument(
        "--eval-tasks", type=int, default=EVAL_TASKS, help="held-out episodes per eval"
    )
    parser.add_argument("--png", type=Path, default=CURVE_PNG, help="where the curve goes")
    parser.add_argument("--models", type=Path, default=MODEL, help="tar of /models")
    parser.add_argument(
        "--log", type=Path, default=Path(tempfile.gettempdir()) / "gymkube-learning.log",
        help="the trainer's whole output",
    )  # fmt: skip
    args = parser.parse_args()
    if not args.models.is_file():
        sys.exit(f"{args.models} is missing: `hack/build-images.sh trainer-cpu` converts the model")
    started = time.monotonic()
    spec, _ = learn_spec(args.run, args.seed, args.steps)
    base_model = EvalModelSpec(path=spec.model.path)
    trained_model = EvalModelSpec(training_run=TrainingRunCheckpoint(name=BENCH_RUN.name))
    with (
        pool(pool_env_config(args.pool), 64) as local,
        tempfile.TemporaryDirectory() as tmp,
        args.log.open("w", buffering=1) as log,
    ):
        scratch = Path(tmp)
        records = train(spec, local, scratch, args.models, log)
        scores = []
        for label, model in (("base", base_model), ("trained", trained_model)):
            score = evaluate(
                eval_spec(model, args.eval_tasks, args.seed),
                spec,
                local,
                eval_paths(scratch, label),
            )
            print(json.dumps({f"eval_{label}": dataclasses.asdict(score)}), flush=True)
            scores.append(score)
    evals = compare(*scores)
    rewards = [float(r["mean_reward"]) for r in records if r["mean_reward"] is not None]
    summary = summarize(rewards)
    plot_rewards(
        rewards,
        args.png,
        f"SmolLM2-135M-Instruct on 2x2 FrozenLake, GRPO on CPU (seed {args.seed}): "
        f"{summary.first_mean:.2f} -> {summary.last_mean:.2f}",
        evals=(evals.base, evals.trained),
    )
    print(
        json.dumps(
            {
                "summary": {
                    "seed": args.seed,
                    "rewards": rewards,
                    **vars(summary),
                    "eval": {
                        "tasks": args.eval_tasks,
                        "split": "test",
                        "temperature": EVAL_TEMPERATURE,
                        "base": evals.base.mean_score,
                        "base_interval": evals.base.interval,
                        "trained": evals.trained.mean_score,
                        "trained_interval": evals.trained.interval,
                        "gain": evals.gain,
                        "target": evals.target,
                        "met": evals.met,
                    },
                    "wall_s": round(time.monotonic() - started, 1),
                    "median_step_s": statistics.median(
                        r["step_s"] for r in records if r["step_s"] is not None
                    ),
                    "png": str(args.png),
                }
            }
        )
    )
    sys.exit(0 if summary.met and evals.met else 1)


if __name__ == "__main__":
    main()
