"""`gymkube-train`: runs verl's trainer and says how it goes, and why it stopped.

    gymkube-train --checkpoint-dir /checkpoints/run --model-path /models/m -- python3 -m verl...

The operator starts every TrainingRun through it (a Job's command, a RayJob's entrypoint). Before
training it checks that a local model path holds a model and that a custom agent loop imports and
is an AgentLoopBase, so a wrong path or a broken loop fails in seconds, not after Ray and vLLM have
started.
While the trainer runs, its output passes through unchanged, and every step verl's FileLogger
records (on a Ray cluster, with --steps-from-log, every step line of verl's console logger)
becomes one `gymkube-progress {json}` line (step, total steps, mean reward, step times,
ETA, last checkpoint, the step this trainer resumed from, and the step's episodes from the agent
loop's episode log) that the operator copies into the run's status. When the trainer fails, its
own last error line goes to the termination log, where Kubernetes keeps it in the pod status.
On SIGTERM (its pod is deleted or evicted) it stops the trainer and exits with EXIT_STOPPED, which
the Job retries without counting it as a failure.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import dataclasses
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

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from pydantic.alias_generators import to_camel

from gymkube_agentloop.episode_log import EPISODE_LOG_ENV, EpisodeRecord

PROG = "gymkube-train"
PROGRESS_PREFIX = "gymkube-progress "
# The exit codes the training Job's podFailurePolicy acts on (the operator names them too, in
# gymkube_operator.trainingrun.command; a test holds the two equal).
# Stopped on SIGTERM: its pod was deleted. sysexits' EX_TEMPFAIL; the Job retries it uncounted.
EXIT_STOPPED = 75
# The trainer cannot start from its input (a wrong model path, a custom loop that does not
# import): the Job fails at once.
EXIT_BAD_INPUT = 2
# After SIGTERM the trainer has this long to stop before it is killed: within the 30 s Kubernetes
# gives a pod, so that the pod still ends with EXIT_STOPPED, not the kubelet's SIGKILL.
STOP_SECONDS = 20.0
# What verl's FileLogger writes (verl/utils/tracking.py), one JSON object a step.
METRICS_ENV = "VERL_FILE_LOGGER_PATH"
# verl's own line at the start of training (verl/trainer/ppo/v1/trainer_base.py).
TOTAL_STEPS = re.compile(r"Total training steps: (\d+)")
# verl's checkpoint manager records the newest step here, in the run's default_local_dir.
LATEST_CHECKPOINT = "latest_checkpointed_iteration.txt"
# Where verl's trainer starts (verl/trainer/ppo/v1/trainer_base.py, _load_checkpoint).
RESUME_MODE = "trainer.resume_mode"
RESUME_PATH = "trainer.resume_from_path"
CHECKPOINT_STEP = re.compile(r"global_step_(\d+)")
# Metric names in verl 0.9.1's step metrics.
MEAN_SCORE = "critic/score/mean"
STEP_TIME = "timing_s/step"
# Generation includes the env's time: the agent loop plays its episodes inside it.
GENERATION_TIME = "timing_s/gen"
# The policy's side of a step: recomputing log-probs, the actor update, the sync into vLLM.
UPDATE_TIMES = ("timing_s/old_log_prob", "timing_s/update_actor", "timing_s/update_weights")
# verl's console logger's line for a step (verl/utils/logger/aggregate_logger.py):
# "step:N - key:value - ...", each value a number as pprint writes it (numpy's as np.float64(0.5)).
_CONSOLE_STEP = re.compile(r"^step:(\d+) - (.*)$")
_CONSOLE_NUMBER = re.compile(r"^(?:np\.\w+\()?(-?(?:[\d.]+(?:[eE][-+]?\d+)?|nan|inf))\)?$")
# Ray prefixes every worker's line with "(Name pid=N)" and colours it.
_COLOUR = re.compile(r"\x1b\[[0-9;]*m")
_WORKER_PREFIX = re.compile(r"^\s*\([^)]*pid=\d+[^)]*\)\s*")
_ERROR_WORDS = re.compile(r"(Error|Exception|error:|Killed|OOM|Traceback)")
# verl's agent-loop worker logs this, then the traceback, for each episode whose agent loop raised
# (verl/trainer/ppo/v1/agent_loop_tq.py); verl trains the batch without that episode. The
# traceback ends in the exception's own line: "aiohttp.client_exceptions.ClientResponseError: 410".
LOOP_ERROR = "Error in _run_prompt"
_EXCEPTION_LINE = re.compile(
    r"^(?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*(?:Error|Exception|Timeout)\w*(?::|$)"
)
LOOP_ERROR_LIMIT = 1024
# The kubelet keeps 4 KiB of the termination message.
TERMINATION_LIMIT = 4096


class PoolProgress(BaseModel):
    """One pool's share of a step's training episodes."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True)

    episodes: int = Field(ge=0)
    episodes_excluded: int = Field(ge=0)
    episodes_replayed: int = Field(ge=0)
    env_errors: int = Field(ge=0, description="env calls of its episodes that failed")
    mean_reward: float | None = Field(description="over its trained episodes")
    mean_turns: float | None = Field(description="the model's replies per episode")


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
    resumed_from_step: int | None = None
    episodes: int | None = None
    episodes_replayed: int | None = None
    episodes_excluded: int | None = None
    replay_canary_failures: int | None = None
    pools: dict[str, PoolProgress] | None = None
    loop_errors: int | None = None
    last_loop_error: str | None = None

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


def _override(command: Sequence[str], key: str) -> str | None:
    """The value the trainer's command line gives a Hydra key (the last one wins, as in Hydra)."""
    found = None
    for arg in command:
        name, sep, value = arg.lstrip("+").partition("=")
        if sep and name == key:
            found = value.strip("'\"")
    return found


def resumed_step(command: Sequence[str], checkpoint_dir: Path) -> int:
    """The step verl will start from, as its resume_mode says: the newest checkpoint (auto, the
    default), the one named (resume_path), or 0 (disable, or no checkpoint yet)."""
    mode = _override(command, RESUME_MODE) or "auto"
    if mode == "resume_path":
        named = CHECKPOINT_STEP.search(_override(command, RESUME_PATH) or "")
        return int(named.group(1)) if named else 0
    step, directory = latest_checkpoint(checkpoint_dir)
    if mode != "auto" or step is None or directory is None or not Path(directory).is_dir():
        return 0
    return step


def _mean(values: Sequence[float]) -> float | None:
    return round(sum(values) / len(values), 4) if values else None


@dataclasses.dataclass
class PoolEpisodes:
    """One pool's episodes of a step."""

    episodes: int = 0
    excluded: int = 0
    replayed: int = 0
    env_errors: int = 0
    rewards: list[float] = dataclasses.field(default_factory=list)
    turns: list[int] = dataclasses.field(default_factory=list)

    def add(self, record: EpisodeRecord) -> None:
        self.episodes += 1
        self.excluded += record.excluded
        self.replayed += record.replays > 0
        self.env_errors += record.env_errors
        self.turns.append(record.turns)
        if record.reward is not None:
            self.rewards.append(record.reward)

    def progress(self) -> PoolProgress:
        return PoolProgress(
            episodes=self.episodes,
            episodes_excluded=self.excluded,
            episodes_replayed=self.replayed,
            env_errors=self.env_errors,
            mean_reward=_mean(self.rewards),
            mean_turns=_mean(self.turns),
        )


@dataclasses.dataclass
class StepEpisodes(PoolEpisodes):
    """One training step's episodes, counted from the agent loop's episode log: all of them, as
    one pool's are counted, and by pool."""

    canary_failures: int = 0
    # By the pool that served them, for episodes whose rows name one (the operator's always do).
    pools: dict[str, PoolEpisodes] = dataclasses.field(default_factory=dict)

    def add(self, record: EpisodeRecord) -> None:
        super().add(record)
        self.canary_failures += record.canary_failures
        if record.pool is not None:
            self.pools.setdefault(record.pool, PoolEpisodes()).add(record)

    def pool_progress(self) -> dict[str, PoolProgress] | None:
        return {name: pool.progress() for name, pool in self.pools.items()} or None


def progress_of(
    record: dict[str, Any],
    *,
    total_steps: int | None,
    step_times: Sequence[float],
    checkpoint: tuple[int | None, str | None],
    now: datetime.datetime,
    resumed_from_step: int | None = None,
    episodes: StepEpisodes | None = None,
    loop_errors: tuple[int, str | None] | None = None,
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
        resumed_from_step=resumed_from_step,
        episodes=episodes.episodes if episodes else None,
        episodes_replayed=episodes.replayed if episodes else None,
        episodes_excluded=episodes.excluded if episodes else None,
        replay_canary_failures=episodes.canary_failures if episodes else None,
        pools=episodes.pool_progress() if episodes else None,
        loop_errors=loop_errors[0] if loop_errors else None,
        last_loop_error=loop_errors[1] if loop_errors else None,
    )


def _cleaned(line: str) -> str:
    return _WORKER_PREFIX.sub("", _COLOUR.sub("", line)).strip()


def console_record(line: str) -> dict[str, Any] | None:
    """A FileLogger-like record ({"step", "data"}) from verl's console line for a step, with the
    metrics that read as numbers; None for any other line."""
    found = _CONSOLE_STEP.match(_cleaned(line))
    if found is None:
        return None
    metrics: dict[str, float] = {}
    for item in found.group(2).split(" - "):
        key, _, text = item.rpartition(":")
        if key and (number := _CONSOLE_NUMBER.match(text.strip())):
            metrics[key.strip()] = float(number.group(1))
    return {"step": int(found.group(1)), "data": metrics}


def last_error_line(lines: Iterable[str]) -> str:
    """The trainer's own reason for stopping: its last line that names an error, else its last."""
    cleaned = [text for line in lines if (text := _cleaned(line))]
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


def agent_loop_problem(class_path: str | None) -> str | None:
    """Why a custom agent loop (module.Class) cannot run; None when it imports and is a verl
    AgentLoopBase. The module is imported here once, so its errors show before Ray starts."""
    if not class_path:
        return None
    import importlib
    import traceback

    module_name, _, class_name = class_path.rpartition(".")
    where = f"(PYTHONPATH: {os.environ.get('PYTHONPATH') or 'unset'})"
    try:
        module = importlib.import_module(module_name)
    except Exception as error:  # any error in the user's code is the message
        # The deepest line of code on disk that is not the import machinery (or this file).
        skipped = (str(Path(importlib.__file__).parent), __file__, "<")
        frames = traceback.extract_tb(error.__traceback__)
        own = [f for f in frames if not f.filename.startswith(skipped)]
        at = f" at {Path(own[-1].filename).name}:{own[-1].lineno}" if own else ""
        return f"agent loop {class_path}: importing {module_name} failed{at}: {error!r} {where}"
    loop = getattr(module, class_name, None)
    if not isinstance(loop, type):
        return f"agent loop {class_path}: {module_name} has no class {class_name} {where}"
    from verl.experimental.agent_loop.agent_loop import AgentLoopBase

    if not issubclass(loop, AgentLoopBase):
        return (
            f"agent loop {class_path} is not a verl AgentLoopBase subclass "
            f"(its bases: {', '.join(b.__qualname__ for b in loop.__mro__[1:-1]) or 'object'})"
        )
    return None


class GrowingFile:
    """A file another process appends lines to, read a whole line at a time as it grows."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._offset = 0

    def new_lines(self) -> list[bytes]:
        """The complete lines appended since the last call (none while the file is missing)."""
        try:
            with self.path.open("rb") as handle:
                handle.seek(self._offset)
                data = handle.read()
        except OSError:
            return []
        complete = data[: data.rfind(b"\n") + 1]
        self._offset += len(complete)
        return complete.splitlines()


class Reporter:
    """Passes the trainer's output through and turns its FileLogger records (or, with
    steps_from_log, its console logger's step lines), with the episodes of each step from the
    episode log, into progress."""

    def __init__(
        self,
        out: IO[str],
        checkpoint_dir: Path,
        metrics_file: Path,
        episode_log: Path,
        resumed_from_step: int | None = None,
        steps_from_log: bool = False,
    ) -> None:
        self.out = out
        self.checkpoint_dir = checkpoint_dir
        self.metrics = GrowingFile(metrics_file)
        self.episode_log = GrowingFile(episode_log)
        self.steps_from_log = steps_from_log
        # Step records read from the trainer's output, until the next poll reports them.
        self._logged_steps: list[dict[str, Any]] = []
        self.resumed_from_step = resumed_from_step
        self.tail: collections.deque[str] = collections.deque(maxlen=200)
        self.total_steps: int | None = None
        self.step_times: list[float] = []
        # Training episodes by the step they were generated for, until that step is reported.
        self.episodes: dict[int, StepEpisodes] = collections.defaultdict(StepEpisodes)
        # Episodes whose agent loop raised since the last progress line, and the last one's
        # exception; a traceback whose exception line is still to come is pending.
        self.loop_errors = 0
        self.last_loop_error: str | None = None
        self._loop_error_pending = False
        self._lock = threading.Lock()

    def write(self, line: str) -> None:
        with self._lock:
            self.out.write(line if line.endswith("\n") else line + "\n")
            self.out.flush()

    def passthrough(self, stream: IO[str]) -> None:
        for line in stream:
            if self.total_steps is None and (found := TOTAL_STEPS.search(line)):
                self.total_steps = int(found.group(1))
            self.tail.append(line)
            self._note_loop_error(line)
            if self.steps_from_log and (record := console_record(line)) is not None:
                with self._lock:
                    self._logged_steps.append(record)
            self.write(line)

    def _note_loop_error(self, line: str) -> None:
        text = _cleaned(line)
        if LOOP_ERROR in text:
            with self._lock:
                self.loop_errors += 1
            self._loop_error_pending = True
        elif self._loop_error_pending and _EXCEPTION_LINE.match(text):
            with self._lock:
                self.last_loop_error = text[:LOOP_ERROR_LIMIT]
            self._loop_error_pending = False

    def _take_loop_errors(self) -> tuple[int, str | None]:
        """The episodes that raised since the last call, and the last exception seen."""
        with self._lock:
            count, self.loop_errors = self.loop_errors, 0
            return count, self.last_loop_error if count else None

    def count_episodes(self) -> None:
        """Count the training episodes the agent loop logged since the last call."""
        for raw in self.episode_log.new_lines():
            try:
                episode = EpisodeRecord.model_validate_json(raw)
            except ValidationError:
                continue
            if not episode.validation:
                self.episodes[episode.step].add(episode)

    def _new_records(self) -> list[dict[str, Any]]:
        """verl's step records since the last call: its console lines', or its FileLogger's."""
        if self.steps_from_log:
            with self._lock:
                logged, self._logged_steps = self._logged_steps, []
            return logged
        records = []
        for raw in self.metrics.new_lines():
            try:
                record = json.loads(raw)
            except ValueError:
                continue
            if isinstance(record, dict):
                records.append(record)
        return records

    def poll(self) -> None:
        """Report every record verl appended since the last call."""
        # Records first: a step's episodes are all logged before verl records the step, so read
        # after its record, the episode log holds them.
        records = self._new_records()
        self.count_episodes()
        for record in records:
            step_time = _number(record.get("data") or {}, STEP_TIME)
            if step_time is not None:
                self.step_times.append(step_time)
            step = record.get("step")
            progress = progress_of(
                record,
                total_steps=self.total_steps,
                step_times=self.step_times,
                checkpoint=latest_checkpoint(self.checkpoint_dir),
                now=datetime.datetime.now(datetime.UTC),
                resumed_from_step=self.resumed_from_step,
                episodes=self.episodes.pop(step, None) if isinstance(step, int) else None,
                loop_errors=self._take_loop_errors() if isinstance(step, int) else None,
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
        "--agent-loop-class", help="a custom agent loop (module.Class), imported and checked first"
    )
    parser.add_argument(
        "--metrics-file",
        type=Path,
        help=f"where verl's FileLogger writes (${METRICS_ENV}; default: a file in /tmp)",
    )
    parser.add_argument(
        "--steps-from-log",
        action="store_true",
        help="read verl's step records from its console logger's lines in the trainer's output, "
        "not from the FileLogger's file (on a Ray cluster verl's driver may run on another node)",
    )
    parser.add_argument(
        "--episode-log",
        type=Path,
        help=f"where the agent loop logs episodes (${EPISODE_LOG_ENV}; default: a file in /tmp)",
    )
    parser.add_argument(
        "--termination-log", type=Path, default=Path("/dev/termination-log"), help="(Kubernetes)"
    )
    parser.add_argument(
        "--poll-seconds", type=float, default=2.0, help="how often to read the metrics file"
    )
    parser.add_argument(
        "--stop-seconds",
        type=float,
        default=STOP_SECONDS,
        help="how long the trainer has to stop after SIGTERM before it is killed",
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
    problem = model_problem(args.model_path) or agent_loop_problem(args.agent_loop_class)
    if problem is not None:
        print(f"{PROG}: error: {problem}", file=sys.stderr)
        write_termination_message(args.termination_log, problem)
        return EXIT_BAD_INPUT
    # Files the wrapper picks for itself are removed when the trainer ends (outside a pod, /tmp
    # stays); either kind starts empty.
    scratch: list[Path] = []

    def file_for(given: Path | None, kind: str) -> Path:
        path = given or Path(f"/tmp/gymkube-train-{os.getpid()}-{kind}.jsonl")
        if given is None:
            scratch.append(path)
        path.unlink(missing_ok=True)
        return path

    metrics_file = file_for(args.metrics_file, "metrics")
    episode_log = file_for(args.episode_log, "episodes")
    try:
        return _supervise(args, metrics_file, episode_log)
    finally:
        for path in scratch:
            path.unlink(missing_ok=True)


def exit_code_of(code: int) -> int:
    """The wrapper's exit code for a trainer that ended by itself with `code`."""
    if code < 0:  # killed by a signal, as a shell says it
        return 128 - code
    # The Job would retry EXIT_STOPPED forever without counting it: the trainer's own is a failure.
    return 1 if code == EXIT_STOPPED else code


def _supervise(args: argparse.Namespace, metrics_file: Path, episode_log: Path) -> int:
    """Run the trainer, turning its metrics into progress lines, until it exits."""
    resumed = resumed_step(args.command, args.checkpoint_dir)
    reporter = Reporter(
        sys.stdout,
        args.checkpoint_dir,
        metrics_file,
        episode_log,
        resumed,
        steps_from_log=args.steps_from_log,
    )
    child = subprocess.Popen(
        args.command,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        errors="replace",
        env={**os.environ, METRICS_ENV: str(metrics_file), EPISODE_LOG_ENV: str(episode_log)},
        start_new_session=True,
    )
    stop_asked: float | None = None

    def forward(signum: int, _: object) -> None:
        # The pod is stopping: the whole trainer (Ray and its workers) goes with it.
        nonlocal stop_asked
        stop_asked = stop_asked or time.monotonic()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(child.pid, signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    assert child.stdout is not None
    reader = threading.Thread(target=reporter.passthrough, args=(child.stdout,), daemon=True)
    reader.start()
    while child.poll() is None:
        if stop_asked is not None and time.monotonic() - stop_asked > args.stop_seconds:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(child.pid, signal.SIGKILL)
        reporter.poll()
        time.sleep(args.poll_seconds)
    reader.join(timeout=10)
    reporter.poll()
    code = child.returncode
    if code != 0 and stop_asked is not None:
        reason = f"stopped on SIGTERM (its pod is being deleted); the trainer exited with {code}"
        write_termination_message(args.termination_log, reason)
        print(f"{PROG}: {reason}", file=sys.stderr)
        return EXIT_STOPPED
    if code != 0:
        reason = last_error_line(reporter.tail)
        if code < 0:
            reason = f"{reason} (the trainer was killed by signal {-code})"
        write_termination_message(args.termination_log, reason)
        print(f"{PROG}: the trainer exited with {code}: {reason}", file=sys.stderr)
        return exit_code_of(code)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
