"""A run's per-step history in its status: every step the trainer's log tails held, once each,
across trainer restarts that resumed from a checkpoint and operator restarts, bounded."""

import json
from types import SimpleNamespace
from typing import Any, cast

import pytest
from gymkube_operator.objects import Object
from gymkube_operator.runtime import Runtime
from gymkube_operator.trainingrun import handlers, history, lifecycle, readings
from gymkube_operator.trainingrun.models import (
    HISTORY_RECENT,
    HISTORY_STEPS,
    HistoryStep,
    TrainingHistory,
    TrainingRunStatus,
)
from test_trainingrun_lifecycle import a_pod, job, pool, progress_line, running_job, started, step

pytestmark = pytest.mark.unit


def line(n: int, resumed: int = 0, **fields: Any) -> str:
    figures = {
        "meanReward": n / 10,
        "stepSeconds": 30.5,
        "episodes": 16,
        "episodesExcluded": 1,
        "episodesReplayed": 2,
        "replayCanaryFailures": 0,
        "time": f"2026-05-01T11:{n:02d}:00Z",
        "resumedFromStep": resumed,
    }
    return progress_line(n, **(figures | fields))


def log(*lines: str) -> str:
    return "\n".join(["(TaskRunner pid=7) verl says something", *lines, "Training Progress: 40%"])


def read(
    status: TrainingRunStatus, pod: str, tail: str | None, earlier_log: str | None = None
) -> TrainingRunStatus:
    """One reconcile of a running run whose trainer runs in `pod` with this log tail."""
    observed = lifecycle.Observed(
        pool=pool(),
        training=running_job(),
        trainer_pod=a_pod(pod),
        trainer_log=tail,
        earlier_trainer_log=earlier_log,
    )
    return step(observed, status).status


def steps(status: TrainingRunStatus) -> list[int]:
    assert status.history is not None
    return [s.step for s in status.history.steps]


def test_every_step_a_read_sees_is_recorded_once_with_its_figures() -> None:
    # The trainer printed three steps since the last read (validation before training at step 0
    # is no step): all three are recorded, not only the last.
    first = read(started(), "grpo-train-a", log(line(0), line(1), line(2), line(3)))
    assert steps(first) == [1, 2, 3]
    assert first.history is not None
    assert first.history.pod == "grpo-train-a"
    assert first.history.steps[0] == HistoryStep(
        step=1,
        mean_reward=0.1,
        step_seconds=30.5,
        episodes=16,
        episodes_excluded=1,
        episodes_replayed=2,
        time="2026-05-01T11:01:00Z",
    )
    assert first.progress is not None
    assert first.progress.step == 3
    # The next tail still holds steps 2 and 3: each is kept once, and only step 4 is new.
    second = read(first, "grpo-train-a", log(line(2), line(3), line(4)))
    assert steps(second) == [1, 2, 3, 4]
    # Nothing new (or no log at all): the status is the same, so it is not written.
    assert read(second, "grpo-train-a", log(line(3), line(4))) == second
    assert read(second, "grpo-train-a", None) == second


def test_a_trainer_resumed_from_its_checkpoint_replaces_the_steps_its_predecessor_ran_past_it() -> (
    None
):
    ran = read(started(), "grpo-train-a", log(*(line(n) for n in range(1, 7))))
    assert steps(ran) == [1, 2, 3, 4, 5, 6]
    # The pod is evicted after step 6; its newest checkpoint is step 4. The next pod validates at
    # step 4 (no step), then trains steps 5 and 6 again with figures of its own.
    again = [line(5, resumed=4, meanReward=0.9), line(6, resumed=4, meanReward=0.8)]
    resumed = read(ran, "grpo-train-b", log(line(4, resumed=4), *again))
    assert steps(resumed) == [1, 2, 3, 4, 5, 6]
    assert resumed.history is not None
    assert resumed.history.pod == "grpo-train-b"
    assert [s.mean_reward for s in resumed.history.steps] == [0.1, 0.2, 0.3, 0.4, 0.9, 0.8]
    # Its first line alone drops what it will train again: 5 and 6 of pod a are gone at once.
    early = read(ran, "grpo-train-b", log(line(4, resumed=4), line(5, resumed=4)))
    assert steps(early) == [1, 2, 3, 4, 5]
    # Later reads of pod b keep steps 1-4 of pod a.
    assert steps(read(resumed, "grpo-train-b", log(line(7, resumed=4)))) == list(range(1, 8))


def test_the_steps_a_replaced_pod_printed_after_the_last_read_are_read_from_it() -> None:
    ran = read(started(), "grpo-train-a", log(line(1), line(2)))
    # Pod a printed step 3 and checkpointed it, then failed; the Job keeps a failed pod, and the
    # next one resumes from step 3 and never trains it again.
    replaced_log = log(line(1), line(2), line(3, checkpointStep=3))
    after = read(ran, "grpo-train-b", log(line(4, resumed=3)), earlier_log=replaced_log)
    assert steps(after) == [1, 2, 3, 4]


def test_the_last_steps_are_read_once_more_from_the_finished_job() -> None:
    ran = read(started(), "grpo-train-a", log(line(1)))
    pod = a_pod("grpo-train-a", phase="Succeeded", exit_code=0)
    done = job("grpo-train", ("Complete", "Completed"))
    observed = lifecycle.Observed(
        pool=pool(), training=done, trainer_pod=pod, trainer_log=log(line(1), line(2))
    )
    finished = step(observed, ran)
    assert finished.status.phase == "Succeeded"
    assert steps(finished.status) == [1, 2]


def test_an_operator_restarted_reads_back_what_it_recorded_and_adds_nothing_twice() -> None:
    ran = read(started(), "grpo-train-a", log(*(line(n) for n in range(1, 5))))
    # What the API server stores and a new operator reads back.
    stored = json.loads(json.dumps(ran.to_patch()))
    back = TrainingRunStatus.model_validate(stored)
    assert back == ran
    # The first read after the restart holds steps recorded before it and the ones since.
    later = read(back, "grpo-train-a", log(*(line(n) for n in range(2, 7))))
    assert steps(later) == [1, 2, 3, 4, 5, 6]


def bare(n: int) -> str:
    return progress_line(n, meanReward=0.5, resumedFromStep=0)


def recorded_one_by_one(last: int) -> TrainingHistory | None:
    found: TrainingHistory | None = None
    for n in range(1, last + 1):
        found = history.recorded(found, "p", readings.progress_lines(bare(n)))
    return found


def test_the_history_is_bounded_and_keeps_the_whole_curve_thinned_out() -> None:
    lines = readings.progress_lines("\n".join(bare(n) for n in range(1, 2001)))
    found = history.recorded(None, "p", lines)
    assert found is not None
    kept = [s.step for s in found.steps]
    assert len(kept) <= HISTORY_STEPS
    # The last steps all, the ones before every 8th (1750 older steps in 250 places).
    assert kept[-HISTORY_RECENT:] == list(range(2001 - HISTORY_RECENT, 2001))
    assert kept[:-HISTORY_RECENT] == list(range(8, 2001 - HISTORY_RECENT, 8))
    # Whether the steps came in one read or one a read, the same ones are kept.
    one_by_one = recorded_one_by_one(2000)
    assert one_by_one is not None
    assert [s.step for s in one_by_one.steps] == kept
    # Below the bound, every step.
    short = history.recorded(None, "p", lines[:HISTORY_STEPS])
    assert short is not None
    assert [s.step for s in short.steps] == list(range(1, HISTORY_STEPS + 1))


def test_a_tail_reaches_back_when_it_holds_the_step_after_the_last_one_recorded() -> None:
    recorded = history.recorded(None, "a", readings.progress_lines(log(line(1), line(2))))
    tail = readings.progress_lines
    assert history.reaches_back(recorded, "a", tail(log(line(3))))
    assert history.reaches_back(recorded, "a", tail(log(line(2), line(3))))
    assert history.reaches_back(recorded, "a", tail("no step in this tail"))
    # Steps 3 and 4 were printed between two reads and fell out of the tail.
    assert not history.reaches_back(recorded, "a", tail(log(line(5), line(6))))
    # A new trainer's tail reaches back when it holds the step after its checkpoint.
    assert history.reaches_back(recorded, "b", tail(log(line(3, resumed=2))))
    assert not history.reaches_back(recorded, "b", tail(log(line(4, resumed=2))))
    assert not history.reaches_back(None, "a", tail(log(line(4))))


class PodLogs:
    """The API server's pods/log: each pod's log, its last `tail_lines` lines."""

    def __init__(self, logs: dict[str, str]) -> None:
        self.logs = logs
        self.asked: list[tuple[str, int]] = []

    async def pod_log(self, namespace: str, pod: str, container: str, tail_lines: int) -> str:
        self.asked.append((pod, tail_lines))
        return "\n".join(self.logs[pod].splitlines()[-tail_lines:])


async def test_a_tail_that_misses_steps_is_read_again_longer() -> None:
    noise = [f"(WorkerDict pid=9) line {i}" for i in range(handlers.LOG_TAIL_LINES)]
    logs = PodLogs({"grpo-train-a": "\n".join([line(3), line(4), *noise, line(5)])})
    rt = cast(Runtime, SimpleNamespace(client=logs))
    pod: Object = a_pod("grpo-train-a")
    recorded = history.recorded(None, "grpo-train-a", readings.progress_lines(line(2)))
    found = await handlers._trainer_log(rt, "rl", pod, recorded)
    assert [p.step for p in readings.progress_lines(found)] == [3, 4, 5]
    assert logs.asked == [
        ("grpo-train-a", handlers.LOG_TAIL_LINES),
        ("grpo-train-a", handlers.LONG_LOG_TAIL_LINES),
    ]
    # Step 4 was recorded: the first tail reaches back to it, one read.
    logs.asked.clear()
    recorded = history.recorded(recorded, "grpo-train-a", readings.progress_lines(line(4)))
    await handlers._trainer_log(rt, "rl", pod, recorded)
    assert logs.asked == [("grpo-train-a", handlers.LOG_TAIL_LINES)]
