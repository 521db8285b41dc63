"""A one-node run's per-step history, kept in its status from the trainer's progress lines, as pure
functions.

The operator reads a tail of the trainer's log every few seconds; each read can hold several new
`gymkube-progress` lines, and steps already recorded again. Steps are keyed by their number, so
reading a line twice (the next read, an operator restarted) changes nothing. A trainer that resumed
from a checkpoint (its pod was replaced) trains again the steps its predecessor ran past that
checkpoint: the first line of a new pod drops them, and its own take their place.
"""

from collections.abc import Sequence

from gymkube_operator.trainingrun.models import (
    HISTORY_RECENT,
    HISTORY_STEPS,
    HistoryStep,
    TrainingHistory,
    TrainingProgress,
)


def trained(line: TrainingProgress) -> bool:
    """Whether a progress line is a training step: verl also records its validation before
    training at the step it starts from (0, or the checkpoint it resumed from)."""
    return line.step > (line.resumed_from_step or 0)


def history_step(line: TrainingProgress) -> HistoryStep:
    return HistoryStep(
        step=line.step,
        mean_reward=line.mean_reward,
        step_seconds=line.step_seconds,
        episodes=line.episodes,
        episodes_excluded=line.episodes_excluded,
        episodes_replayed=line.episodes_replayed,
        time=line.time,
    )


def _bounded(steps: list[HistoryStep]) -> list[HistoryStep]:
    """At most HISTORY_STEPS steps: the last HISTORY_RECENT all, and before those the multiples
    of the smallest power of 2 that leaves at most the rest, so the curve from the first step stays
    in view. The stride follows from the step numbers alone: the same steps are kept whichever
    reads brought them."""
    older, recent = steps[:-HISTORY_RECENT], steps[-HISTORY_RECENT:]
    stride = 1
    while older and older[-1].step // stride > HISTORY_STEPS - HISTORY_RECENT:
        stride *= 2
    return [s for s in older if s.step % stride == 0] + recent


def recorded(
    history: TrainingHistory | None, pod: str, lines: Sequence[TrainingProgress]
) -> TrainingHistory | None:
    """The history with the training steps of `lines`, progress lines pod `pod` printed (oldest
    first), merged in."""
    steps = [line for line in lines if trained(line)]
    if not steps:
        return history
    known = {s.step: s for s in (history.steps if history is not None else [])}
    resumed = steps[0].resumed_from_step
    if (history is None or history.pod != pod) and resumed is not None:
        # A new trainer: the steps after its checkpoint are trained again, by it.
        known = {step: s for step, s in known.items() if step <= resumed}
    for line in steps:
        known[line.step] = history_step(line)
    ordered = [known[step] for step in sorted(known)]
    return TrainingHistory(pod=pod, steps=_bounded(ordered))


def reaches_back(
    history: TrainingHistory | None, pod: str, lines: Sequence[TrainingProgress]
) -> bool:
    """Whether `lines`, a tail of pod `pod`'s log, go back to the step after the last one recorded
    (for a new trainer, after the checkpoint it resumed from): else steps printed between two
    reads fell out of the tail, and a longer one is needed."""
    steps = [line for line in lines if trained(line)]
    if not steps:
        return True
    if history is not None and history.pod == pod and history.steps:
        return steps[0].step <= history.steps[-1].step + 1
    return steps[0].step <= (steps[0].resumed_from_step or 0) + 1
