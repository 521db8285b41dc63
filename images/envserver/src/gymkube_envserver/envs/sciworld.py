"""ScienceWorld (the real ``scienceworld`` package, one JVM per instance).

``data_idx`` means what it means to AgentGym's sciworld server, so AgentGym datasets
(``item_id`` ``sciworld_<idx>``) work unchanged: ScienceWorld's task ids in order, minus
``SKIPPED_TASK_IDS``, each expanded into all of its variations (4,639 entries with scienceworld
1.2.3). Reset does what AgentGym's does: load the task variation, read the task description,
then ``look around``. Scores are ScienceWorld's own, 0-100.

The task table and ScienceWorld's train/dev/test variation splits come from a started JVM once and
are cached on disk per scienceworld version, so later starts skip the ~7 s of task loads.

Every JVM call runs in the backend's thread pool, never on the event loop.
"""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from importlib import metadata
from pathlib import Path
from typing import Any

from py4j.protocol import Py4JError, Py4JJavaError  # type: ignore[import-untyped]
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from scienceworld import ScienceWorldEnv
from scienceworld.constants import JAR_PATH

from gymkube_envserver.envs.base import (
    EnvBackend,
    EnvInstance,
    EnvLostError,
    ResetOutcome,
    ResetParams,
    StepOutcome,
    parse_env_config,
)
from gymkube_envserver.settings import ServerSettings
from gymkube_envserver.wire import ScoreScale, TaskInfo, TasksResponse

log = logging.getLogger(__name__)

SKIPPED_TASK_IDS = frozenset({"5-1", "5-2", "9-1", "9-2", "9-3", "10-1", "10-2"})
"""The tasks AgentGym's sciworld server leaves out of its data_idx table."""
SPLITS = ("train", "dev", "test")
INFO_KEYS = ("moves", "score", "reward", "variationIdx", "taskName", "simplificationStr")
"""ScienceWorld step info passed on; look/inventory/valid-action lists stay out (large)."""
JVM_EXIT_WAIT_S = 5.0
CONSTANT_IDENTITY_HASH = "-XX:+UnlockExperimentalVMOptions -XX:hashCode=2"
"""Every JVM runs with this. ScienceWorld lists objects in hash-set order, and by default an
object's identity hash depends on everything the JVM did before, so the same task variation
would read differently in a JVM that has played other tasks (measured: 'melt' lists its paint
cups in another order). With a constant identity hash, a task loads alike in a new and a
reused JVM, and steps are no slower."""


class SciWorldConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    simplifications: str = Field(
        default="", description="ScienceWorld simplifications, comma-separated (e.g. 'easy')."
    )
    step_limit: int = Field(default=100, ge=1, le=10_000, description="Moves before done.")


def parse_config(env_config: dict[str, Any]) -> SciWorldConfig:
    return parse_env_config(SciWorldConfig, env_config, "sciworld")


class TaskTable(BaseModel):
    """data_idx -> (task, variation), in AgentGym's order, plus ScienceWorld's splits."""

    task_ids: list[str]
    task_names: list[str]
    variations: list[int]
    splits: dict[str, dict[str, list[int]]] = Field(
        description="Split -> task name -> variation indices."
    )

    def entries(self) -> list[tuple[str, int]]:
        return [
            (name, variation)
            for name, count in zip(self.task_names, self.variations, strict=True)
            for variation in range(count)
        ]


def read_task_table(env: ScienceWorldEnv) -> TaskTable:
    """Ask a started JVM for the table; loads each task once for its splits (seconds)."""
    ids, names, variations = [], [], []
    splits: dict[str, dict[str, list[int]]] = {split: {} for split in SPLITS}
    for task_id, name in env.tasks.items():
        if task_id in SKIPPED_TASK_IDS:
            continue
        ids.append(task_id)
        names.append(name)
        variations.append(int(env.get_max_variations(name)))
        env.load(name, 0)
        splits["train"][name] = [int(v) for v in env.get_variations_train()]
        splits["dev"][name] = [int(v) for v in env.get_variations_dev()]
        splits["test"][name] = [int(v) for v in env.get_variations_test()]
    return TaskTable(task_ids=ids, task_names=names, variations=variations, splits=splits)


def warm_up_plan(
    task_names: Sequence[str], variations: Sequence[int], loads: int
) -> list[tuple[str, int]]:
    """(task, variation) pairs a warm-up loads: every task once, then their next variations.

    Each task builds its world with its own code, so going through the tasks warms the JIT for
    all of them; variations of a few tasks would leave it cold for the rest.
    """
    count = len(task_names)
    return [
        (task_names[load % count], load // count % variations[load % count])
        for load in range(loads)
    ]


def jvm_tool_options(configured: str, inherited: str | None) -> str:
    """JAVA_TOOL_OPTIONS for ScienceWorld JVMs: an inherited value, else ``--jvm-options``, with
    CONSTANT_IDENTITY_HASH added unless the options set the identity hash themselves."""
    options = configured if inherited is None else inherited
    if "-XX:hashCode=" in options:
        return options
    return f"{options} {CONSTANT_IDENTITY_HASH}".strip()


def jvm_rss_bytes(env: ScienceWorldEnv) -> int | None:
    process: subprocess.Popen[bytes] | None = getattr(env._gateway, "java_process", None)
    if process is None:
        return None
    try:
        status = Path(f"/proc/{process.pid}/status").read_text()
    except OSError:  # the JVM has exited
        return None
    for line in status.splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return None


def task_table_cache(cache_dir: Path) -> Path:
    version = metadata.version("scienceworld")
    jar_size = Path(JAR_PATH).stat().st_size
    return cache_dir / f"sciworld-tasks-{version}-{jar_size}.json"


def close_env(env: ScienceWorldEnv) -> None:
    """Close the env and make sure its JVM exits (py4j's shutdown alone may leave it running)."""
    process: subprocess.Popen[bytes] | None = getattr(env._gateway, "java_process", None)
    try:
        env.close()
    except Exception:
        log.debug("ScienceWorld close raised; killing its JVM", exc_info=True)
    if process is None:
        return
    try:
        process.wait(timeout=JVM_EXIT_WAIT_S)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def look_around(env: ScienceWorldEnv) -> tuple[str, int, bool, dict[str, Any]]:
    """``env.step("look around")`` without the extras a reset answer does not carry.

    The same score, reward, move and completion bookkeeping as ``ScienceWorldEnv.step`` in
    scienceworld 1.2.3, minus its look/inventory/valid-action queries: those take about half of
    a step, and the reset answer (like AgentGym's) only has observation, reward, score and done.
    """
    observation = env.server.step("look around")
    score = round(100 * env.server.getScore())
    moves = env.get_num_moves()
    reward = score - env.lastStepScore
    env.lastStepScore = score
    done = bool(env.server.getCompleted()) or moves > env.envStepLimit or score < 0
    info = {
        "moves": moves,
        "score": score,
        "reward": reward,
        "variationIdx": env.variationIdx,
        "taskName": env.taskName,
        "simplificationStr": env.simplificationStr,
    }
    return observation, reward, done, info


class SciWorldInstance(EnvInstance):
    def __init__(self, backend: SciWorldBackend, env: ScienceWorldEnv) -> None:
        self._backend = backend
        self._env = env

    async def _run(self, call: Any, *args: Any) -> Any:
        try:
            return await self._backend.run_blocking(call, *args)
        except Py4JJavaError:
            raise  # the simulator threw; its JVM is fine
        except Py4JError as exc:
            # Any other py4j error means the connection to the JVM broke (py4j reports a killed
            # JVM as a generic "error occurred while calling", often before the process exits).
            raise EnvLostError(f"its ScienceWorld JVM stopped answering ({exc})") from exc

    async def reset(self, params: ResetParams) -> ResetOutcome:
        config = parse_config(params.env_config)
        index = self._backend.check_data_idx(params.data_idx)
        task_name, variation = self._backend.entries[index]
        observation, reward, done, info, description = await self._run(
            self._load, task_name, variation, config
        )
        return ResetOutcome(
            observation=observation,
            reward=float(reward),
            score=float(info["score"]),
            done=bool(done),
            info={key: info[key] for key in INFO_KEYS},
            task_description=description,
            extra={"task_name": task_name, "var_num": variation, "deleted": False},
        )

    def _load(
        self, task_name: str, variation: int, config: SciWorldConfig
    ) -> tuple[str, int, bool, dict[str, Any], str]:
        env = self._env
        env.load(task_name, variation, config.simplifications)
        env.envStepLimit = config.step_limit
        description = env.get_task_description()
        observation, reward, done, info = look_around(env)
        return observation, reward, done, info, description

    async def warm_up(self) -> None:
        # A fresh JVM loads its first tasks several times slower than later ones (class loading,
        # JIT); paying that here keeps it off the first /reset.
        for task_name, variation in self._backend.warm_up_entries():
            await self._run(self._load, task_name, variation, SciWorldConfig())
            await self._run(self._env.step, "look around")

    def warms_up(self) -> bool:
        return self._backend.warm_up_resets > 0

    async def step(self, action: str) -> StepOutcome:
        observation, reward, done, info = await self._run(self._env.step, action)
        return StepOutcome(
            observation=observation,
            reward=float(reward),
            score=float(info["score"]),
            done=bool(done),
            info={key: info[key] for key in INFO_KEYS},
        )

    def rss_bytes(self) -> int | None:
        return jvm_rss_bytes(self._env)

    async def close(self) -> None:
        try:
            await self._backend.run_blocking(close_env, self._env)
        except Exception:
            log.exception("closing a ScienceWorld env failed")


class SciWorldBackend(EnvBackend):
    name = "sciworld"
    canary_action = "look around"

    def __init__(self, settings: ServerSettings) -> None:
        # ScienceWorld starts its JVM without options; JAVA_TOOL_OPTIONS is how flags reach it.
        os.environ["JAVA_TOOL_OPTIONS"] = jvm_tool_options(
            settings.jvm_options, os.environ.get("JAVA_TOOL_OPTIONS")
        )
        self._cache_dir = settings.cache_path
        self.warm_up_resets = settings.warm_up_resets
        self._executor = ThreadPoolExecutor(settings.thread_count, thread_name_prefix="sciworld")
        self._table: TaskTable | None = None
        self._tasks: TasksResponse | None = None
        self.entries: list[tuple[str, int]] = []
        self._spare: ScienceWorldEnv | None = None

    async def run_blocking(self, call: Any, *args: Any) -> Any:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, partial(call, *args))

    async def prepare(self) -> None:
        cache = task_table_cache(self._cache_dir)
        table = self._read_cache(cache)
        if table is None:
            env = await self.run_blocking(ScienceWorldEnv)
            table = await self.run_blocking(read_task_table, env)
            self._spare = env
            self._write_cache(cache, table)
        self._install(table)

    def _read_cache(self, cache: Path) -> TaskTable | None:
        try:
            return TaskTable.model_validate_json(cache.read_text())
        except (OSError, ValidationError):
            return None

    def _write_cache(self, cache: Path, table: TaskTable) -> None:
        try:
            cache.parent.mkdir(parents=True, exist_ok=True)
            partial_file = cache.with_suffix(f".{os.getpid()}.tmp")
            partial_file.write_text(table.model_dump_json())
            partial_file.replace(cache)
        except OSError as exc:
            log.warning("cannot cache the ScienceWorld task table at %s: %s", cache, exc)

    def _install(self, table: TaskTable) -> None:
        self._table = table
        self.entries = table.entries()
        first_idx: dict[str, int] = {}
        infos: list[TaskInfo] = []
        for name, count in zip(table.task_names, table.variations, strict=True):
            first_idx[name] = len(infos) and infos[-1].first_idx + infos[-1].count
            infos.append(TaskInfo(name=name, first_idx=first_idx[name], count=count))
        splits = {
            split: sorted(
                first_idx[name] + variation
                for name, chosen in by_task.items()
                for variation in chosen
            )
            for split, by_task in table.splits.items()
        }
        self._tasks = TasksResponse(
            env=self.name,
            count=len(self.entries),
            score_scale=ScoreScale(min=0.0, max=100.0),
            task_names=table.task_names,
            tasks=infos,
            splits=splits,
        )
        log.info("ScienceWorld: %d data_idx entries over %d tasks", len(self.entries), len(infos))

    def warm_up_entries(self) -> list[tuple[str, int]]:
        """(task, variation) pairs a warm-up loads: every task once, then next variations."""
        table = self._table
        if table is None:
            raise RuntimeError("ScienceWorld task table not loaded yet")
        return warm_up_plan(table.task_names, table.variations, self.warm_up_resets)

    def tasks(self) -> TasksResponse:
        if self._tasks is None:
            raise RuntimeError("ScienceWorld task table not loaded yet")
        return self._tasks

    def check_config(self, env_config: dict[str, Any]) -> None:
        parse_config(env_config)

    async def start(self, env_config: dict[str, Any]) -> EnvInstance:
        if self._spare is not None:
            env, self._spare = self._spare, None
        else:
            env = await self.run_blocking(ScienceWorldEnv)
        return SciWorldInstance(self, env)

    async def shutdown(self) -> None:
        if self._spare is not None:
            await self.run_blocking(close_env, self._spare)
            self._spare = None
        self._executor.shutdown(wait=False, cancel_futures=True)
