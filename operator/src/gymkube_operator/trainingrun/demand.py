"""How many env sessions a run keeps open at once, read from verl's composed config.

verl 0.9.1's agent loop opens one session per episode and plays a whole generation batch at once:
`data.train_batch_size` prompts x `actor_rollout_ref.rollout.n` rollouts. The sync trainer
generates one batch at a time (Sync DAPO up to `max_inflight_gen_batches`); the async trainers
keep `num_warmup_batches` more in flight. Validation plays `data.val_batch_size` rows (all of them
when unset) x `val_kwargs.n`, before training (`val_before_train`) and every `test_freq` steps.
The run's demand is the larger of the two: training and validation never overlap.
"""

import math
from typing import Any

from gymkube_operator.envpool.models import EnvPoolSpec
from gymkube_operator.objects import Object
from gymkube_operator.trainingrun.command import apportion
from gymkube_operator.trainingrun.models import RunDemand, TrainingRunSpec


def _batches_in_flight(config: dict[str, Any]) -> float:
    v1 = config["trainer"]["v1"]
    mode = v1["trainer_mode"]
    if mode != "sync":
        return 1 + float(v1.get(mode, {}).get("num_warmup_batches", 0) or 0)
    filter_groups = config["algorithm"].get("filter_groups") or {}
    if filter_groups.get("enable"):
        # Non-positive: verl sets no bound; one batch is what it starts with.
        return max(1, int(filter_groups.get("max_inflight_gen_batches", 1) or 1))
    return 1


def _validates(config: dict[str, Any]) -> bool:
    trainer = config["trainer"]
    return bool(trainer.get("val_before_train")) or int(trainer.get("test_freq") or -1) > 0


def of_config(config: dict[str, Any], spec: TrainingRunSpec) -> RunDemand:
    """The run's sessions in flight from its composed verl config; by pool in proportion to
    their rows (verl shuffles the pools' rows into one dataset)."""
    data, rollout = config["data"], config["actor_rollout_ref"]["rollout"]
    prompts = math.ceil(int(data["train_batch_size"]) * _batches_in_flight(config))
    training = prompts * int(rollout["n"])
    validation = 0
    if _validates(config):
        rows = spec.dataset.val_size
        batch = min(int(data.get("val_batch_size") or rows), rows)
        validation = batch * int((rollout.get("val_kwargs") or {}).get("n", 1) or 1)
    sessions = max(training, validation)
    shares = spec.pools()
    pools = dict(
        zip(
            [share.name for share in shares],
            apportion(sessions, [share.weight for share in shares]),
            strict=True,
        )
    )
    return RunDemand(sessions=sessions, training=training, validation=validation, pools=pools)


def _capacity(pool: Object) -> tuple[int, str]:
    """The sessions a pool's spec holds, and how (its replicas x sessions per replica)."""
    spec = EnvPoolSpec.model_validate(pool.get("spec") or {})
    held = spec.replicas * spec.sessions_per_replica
    return held, f"{spec.replicas} x {spec.sessions_per_replica} sessions per replica"


def sizing(demand: RunDemand, pools: dict[str, Object | None]) -> tuple[bool, str]:
    """(whether every pool holds its share of the run's demand, one line with both numbers of
    each pool: of those short when any is)."""
    lines: list[tuple[bool, str]] = []
    for name, wanted in demand.pools.items():
        pool = pools.get(name)
        if pool is None:
            continue
        held, how = _capacity(pool)
        lines.append(
            (
                held >= wanted,
                f"EnvPool {name} holds {held} sessions ({how}) for the {wanted} the run keeps "
                "open at once",
            )
        )
    short = [line for ok, line in lines if not ok]
    if short:
        advice = (
            "; the extra episodes wait for a free session (503, Retry-After) and steps take "
            "longer: raise replicas or sessionsPerReplica"
        )
        return False, "; ".join(short) + advice
    return True, "; ".join(line for _, line in lines)
