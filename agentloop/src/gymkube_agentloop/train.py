"""`gymkube-train`: runs verl's trainer and says how it goes, and why it stopped.

    gymkube-train --checkpoint-dir /checkpoints/run --model-path /models/m -- python3 -m verl...

The operator starts every one-node TrainingRun through it. Before training it checks that a local
model path holds a model, so a wrong path fails in a second, not after Ray and vLLM have started.
While the trainer runs, its output passes through unchanged, and every step verl's FileLogger
records becomes one `gymkube-progress {json}` line (step, total steps, mean reward, step times,
ETA, last checkpoint) that the operator copies into the run's status. When the trainer fails, its
own last error line goes to the termination log, where Kubernetes keeps it in the pod status.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import datetime
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import IO, Any

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

PROG = "gymkube-train"
PROGRESS_PREFIX = "gymkube-progress "
EXIT_BAD_INPUT = 2
# What verl's FileLogger writes (verl/utils/tracking.py), one JSON object a step.
METRICS_ENV = "VERL_FILE_LOGGER_PATH"
# verl's own line at the start of training (verl/trainer/ppo/v1/trainer_base.py).
TOTAL_STEPS = re.compile(r"Total training steps: (\d+)")
# verl's checkpoint manager records the newest step here, in the run's default_local_dir.
LATEST_CHECKPOINT = "latest_checkpointed_iteration.txt"
# Metric names in verl 0.9.1's step metrics.
MEAN_SCORE = "critic/score/mean"
STEP_TIME = "timing_s/step"
# Generation includes the env's time: the agent loop plays its episodes inside it.
GENERATION_TIME = "timing_s/gen"
# The policy's side of a step: recomputing log-probs, the actor update, the sync into vLLM.
UPDATE_TIMES = ("timing_s/old_log_prob", "timing_s/update_actor", "timing_s/update_weights")
# Ray prefixes every worker's line with "(Name pid=N)" and colours it.
_COLOUR = re.compile(r"\x1b\[[0-9;]*m")
_WORKER_PREFIX = re.compile(r"^\s*\([^)]*pid=\d+[^)]*\)\s*")
_ERROR_WORDS = re.compile(r"(Error|Exception|error:|Killed|OOM|Traceback)")
# The kubelet keeps 4 KiB of the termination message.
TERMINATION_LIMIT = 4096


class TrainingProgress(BaseModel):
    """One `gymkube-progress` line: where the run is after a step."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True)

    step: int = Field(ge=0)
    total_steps: int | None = None
    mean_reward: float | None = None
    step_seconds: float | None = None
    generation_seconds: float | None = None
    update_seconds: float | None = None
    eta_seconds: float | None = None
    checkpoint_step: int | None = None
    checkpoint: str | None = None
    time: str

    def line(self) -> str:
        body = self.model_dump(by_alias=True, exclude_none=True)
        return PROGRESS_PREFIX + json.dumps(body, separators=(",", ":"))


def _number(metrics: dict[str, Any], key: str) -> float | None:
    value = metrics.get(key)
    return round(float(value), 4) if isinstance(value, int | float) else None


def latest_checkpoint(checkpoint_dir: Path) -> tuple[int | None, str | None]:
    """(step, directory) of the newest checkpoint verl recorded, if any."""
    try:
        step = int((checkpoint_dir / LATEST_CHECKPOINT).read_text().strip())
    except (OSError, ValueError):
        return None, None
    return step, str(checkpoint_dir / f"global_step_{step}")


def progress_of(
    record: dict[str, Any],
    *,
    total_steps: int | None,
    step_times: Sequence[float],
    checkpoint: tuple[int | None, str | None],
    now: datetime.datetime,
) -> TrainingProgress | None:
    """The progress line for one FileLogger record (None for a record without a step)."""
    step, metrics = record.get("step"), record.get("data")
    if not isinstance(step, int) or not isinstance(metrics, dict):
        return None
    update_times = [t for key in UPDATE_TIMES if (t := _number(metrics, key)) is not None]
    eta = None
    if total_steps is not None and step_times:
        eta = round(max(total_steps - step, 0) * sum(step_times) / len(step_times), 1)
    return TrainingProgress(
        step=step,
        total_steps=total_steps,
        mean_reward=_number(metrics, MEAN_SCORE),
        step_seconds=_number(metrics, STEP_TIME),
        generation_seconds=_number(metrics, GENERATION_TIME),
        update_seconds=round(sum(update_times), 4) if update_times else None,
        eta_seconds=eta,
        checkpoint_step=checkpoint[0],
        checkpoint=checkpoint[1],
        time=now.strftime("%Y-%m-%dT%H:%M:%SZ"),
    )


def last_error_line(lines: Iterable[str]) -> str:
    """The trainer's own reason for stopping: its last line that names an error, else its last."""
    cleaned = [_WORKER_PREFIX.sub("", _COLOUR.sub("", line)).strip() for line in lines]
    cleaned = [line for line in cleaned if line]
    for line in reversed(cleaned):
        if _ERROR_WORDS.search(line):
            return line
    return cleaned[-1] if cleaned else "the trainer exited without output"


def model_problem(model_path: str | None) -> str | None:
    """Why a local model path cannot be trained from; None when it looks like a model (or is a
    hub id, which only the trainer can check)."""
    if not model_path or not model_path.startswith("/"):
        return None
    path = Path(model_path)
    if not path.exists():
        parent = next((p for p in path.parents if p.exists()), Path("/"))
        listing = sorted(child.name for child in parent.iterdir())[:10] if parent.is_dir() else []
        return (
            f"model path {model_path} does not exist ({parent} holds: "
            f"{', '.join(listing) or 'nothing'})"
        )
    if not (path / "config.json").is_file():
        return f"model path {model_path} has no config.json: not a Hugging Face model directory"
    return None


class Reporter:
    """Passes the trainer's output through and turns its FileLogger records into progress."""

    def __init__(self, out: IO[str], checkpoint_dir: Path, metrics_file: Path) -> None:
        self.out = out
        self.checkpoint_dir = checkpoint_dir
        self.metrics_file = metrics_file
        self.tail: collections.deque[str] = collections.deque(maxlen=200)
        self.total_steps: int | None = None
        self.step_times: list[float] = []
        self._lock = threading.Lock()
        self._offset = 0

    def write(self, line: str) -> None:
        with self._lock:
            self.out.write(line if line.endswith("\n") else line + "\n")
            self.out.flush()

    def passthrough(self, stream: IO[str]) -> None:
        for line in stream:
            if self.total_steps is None and (found := TOTAL_STEPS.search(line)):
                self.total_steps = int(found.group(1))
            self.tail.append(line)
            self.write(line)

    def poll_metrics(self) -> None:
        """Report every record verl appended since the last call."""
        try:
            with self.metrics_file.open("rb") as handle:
                handle.seek(self._offset)
                data = handle.read()
        except OSError:
            return
        complete = data[: data.rfind(b"\n") + 1]
        self._offset += len(complete)
        for raw in complete.splitlines():
            try:
                record = json.loads(raw)
            except ValueError:
                continue
            if not isinstance(record, dict):
                continue
            step_time = _number(record.get("data") or {}, STEP_TIME)
            if step_time is not None:
                self.step_times.append(step_time)
            progress = progress_of(
                record,
                total_steps=self.total_steps,
                step_times=self.step_times,
                checkpoint=latest_checkpoint(self.checkpoint_dir),
                now=datetime.datetime.now(datetime.UTC),
            )
            if progress is not None:
                self.write(progress.line())


def write_termination_message(path: Path, message: str) -> None:
    with contextlib.suppress(OSError):
        path.write_text(message[-TERMINATION_LIMIT:])


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog=PROG, description=(__doc__ or "").strip().splitlines()[0])
    parser.add_argument(
        "--checkpoint-dir", type=Path, required=True, help="verl's trainer.default_local_dir"
    )
    parser.add_argument("--model-path", help="actor_rollout_ref.model.path, checked first")
    parser.add_argument(
        "--metrics-file",
        type=Path,
        help=f"where verl's FileLogger writes (${METRICS_ENV}; default: a file in /tmp)",
    )
    parser.add_argument(
        "--termination-log", type=Path, default=Path("/dev/termination-log"), help="(Kubernetes)"
    )
    parser.add_argument(
        "--poll-seconds", type=float, default=2.0, help="how often to read the metrics file"
    )
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- the trainer's command")
    args = parser.parse_args(argv)
    if args.command[:1] == ["--"]:
        args.command = args.command[1:]
    if not args.command:
        parser.error("give the trainer's command after --")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if (problem := model_problem(args.model_path)) is not None:
        print(f"{PROG}: error: {problem}", file=sys.stderr)
        write_termination_message(args.termination_log, problem)
        return EXIT_BAD_INPUT
    metrics_file: Path = args.metrics_file or Path(f"/tmp/gymkube-train-{os.getpid()}.jsonl")
    metrics_file.unlink(missing_ok=True)
    try:
        return _supervise(args, metrics_file)
    finally:
        if args.metrics_file is None:  # the wrapper's own scratch file (outside a pod, /tmp stays)
            metrics_file.unlink(missing_ok=True)


def _supervise(args: argparse.Namespace, metrics_file: Path) -> int:
    """Run the trainer, turning its metrics into progress lines, until it exits."""
    reporter = Reporter(sys.stdout, args.checkpoint_dir, metrics_file)
    child = subprocess.Popen(
        args.command,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        errors="replace",
        env={**os.environ, METRICS_ENV: str(metrics_file)},
        start_new_session=True,
    )

    def forward(signum: int, _: object) -> None:
        # The pod is stopping: the whole trainer (Ray and its workers) goes with it.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(child.pid, signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    assert child.stdout is not None
    reader = threading.Thread(target=reporter.passthrough, args=(child.stdout,), daemon=True)
    reader.start()
    while child.poll() is None:
        reporter.poll_metrics()
        time.sleep(args.poll_seconds)
    reader.join(timeout=10)
    reporter.poll_metrics()
    code = child.returncode
    if code != 0:
        reason = last_error_line(reporter.tail)
        if code < 0:
            reason = f"{reason} (the trainer was killed by signal {-code})"
        write_termination_message(args.termination_log, reason)
        print(f"{PROG}: the trainer exited with {code}: {reason}", file=sys.stderr)
        return code if code > 0 else 128 - code
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
