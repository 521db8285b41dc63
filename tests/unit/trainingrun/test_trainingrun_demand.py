"""A run's demand (the env sessions it keeps open at once) from verl's real composed config, and
the advisory EnvPoolSized condition it sets against the pools' capacity."""

from typing import Any

import pytest
from gymkube_operator.objects import Object
from gymkube_operator.trainingrun import command, demand, lifecycle, overrides
from gymkube_operator.trainingrun.lifecycle import Observed
from gymkube_operator.trainingrun.models import RunDemand, TrainingRunSpec, TrainingRunStatus
from gymkube_operator.trainingrun.reasons import ConditionType, Reason
from test_trainingrun_lifecycle import NOW, RUN

pytestmark = pytest.mark.unit


def spec(*users: str, **fields: Any) -> TrainingRunSpec:
    base: dict[str, Any] = {"envPoolRef": {"name": "lake"}, "model": {"path": "/models/q"}}
    return TrainingRunSpec.model_validate({**base, **fields, "overrides": list(users)})


def demand_of(run: TrainingRunSpec) -> RunDemand:
    config = overrides.composed(command.run_overrides("grpo", run))
    assert config is not None, "verl's config composes with the run's overrides"
    return demand.of_config(config, run)


def test_a_sync_run_keeps_one_batch_of_rollouts_open_and_validation_is_all_its_rows() -> None:
    run = spec(
        "data.train_batch_size=8",
        "actor_rollout_ref.rollout.n=4",
        dataset={"size": 64, "valSize": 20},
    )
    # verl validates before training by default, every val row at once (val_batch_size unset).
    assert demand_of(run) == RunDemand(sessions=32, training=32, validation=20, pools={"lake": 32})


def test_validation_can_be_the_larger_and_off_when_verl_never_validates() -> None:
    validating = spec(
        "data.train_batch_size=2",
        "actor_rollout_ref.rollout.n=2",
        "data.val_batch_size=16",
        "actor_rollout_ref.rollout.val_kwargs.n=2",
        dataset={"valSize": 100},
    )
    assert demand_of(validating) == RunDemand(
        sessions=32, training=4, validation=32, pools={"lake": 32}
    )
    never = spec(
        "data.train_batch_size=2",
        "actor_rollout_ref.rollout.n=2",
        "trainer.val_before_train=false",
        "trainer.test_freq=-1",
    )
    assert demand_of(never).validation == 0
    assert demand_of(never).sessions == 4


def test_async_trainers_keep_their_warmup_batches_in_flight_too() -> None:
    run = spec(
        "data.train_batch_size=8",
        "actor_rollout_ref.rollout.n=4",
        "trainer.val_before_train=false",
        "trainer.v1.trainer_mode=separate_async",
        "trainer.v1.separate_async.num_warmup_batches=1.5",
    )
    # 8 prompts now and 12 ahead, 4 rollouts each.
    assert demand_of(run).training == 80


def test_several_pools_share_the_demand_by_their_weights() -> None:
    run = TrainingRunSpec.model_validate(
        {
            "envPools": [{"name": "lake", "weight": 3}, {"name": "guess", "weight": 1}],
            "model": {"path": "/models/q"},
            "overrides": [
                "data.train_batch_size=4",
                "actor_rollout_ref.rollout.n=4",
                "trainer.val_before_train=false",
            ],
        }
    )
    assert demand_of(run).pools == {"lake": 12, "guess": 4}


def pool(name: str, replicas: int, sessions: int) -> Object:
    return {
        "metadata": {"name": name},
        "spec": {"env": "frozen_lake", "replicas": replicas, "sessionsPerReplica": sessions},
        "status": {
            "url": f"http://{name}.rl.svc:8000",
            "conditions": [{"type": "Ready", "status": "True", "reason": "Ready"}],
        },
    }


def sized(found: Object, wanted: int) -> tuple[str, str, str, list[str]]:
    needs = RunDemand(sessions=wanted, training=wanted, validation=0, pools={"lake": wanted})
    plan = lifecycle.plan(RUN, spec(), TrainingRunStatus(), Observed(pool=found, demand=needs), NOW)
    assert plan.status.demand == needs
    cond = next(c for c in plan.status.conditions if c.type == ConditionType.ENV_POOL_SIZED)
    warnings = [e.message for e in plan.events if e.type == "Warning"]
    return cond.status, cond.reason, cond.message, warnings


def test_a_pool_below_the_runs_demand_warns_with_both_numbers_and_the_run_goes_on() -> None:
    status, reason, message, warnings = sized(pool("lake", 2, 8), 32)
    assert (status, reason) == ("False", Reason.CAPACITY_BELOW_DEMAND)
    assert message.startswith(
        "EnvPool lake holds 16 sessions (2 x 8 sessions per replica) for the 32 the run keeps "
        "open at once"
    )
    assert "raise replicas or sessionsPerReplica" in message
    assert warnings == [message]


def test_a_pool_that_holds_the_demand_says_so_quietly() -> None:
    status, reason, message, warnings = sized(pool("lake", 2, 16), 32)
    assert (status, reason) == ("True", Reason.CAPACITY_MEETS_DEMAND)
    assert message == (
        "EnvPool lake holds 32 sessions (2 x 16 sessions per replica) for the 32 the run keeps "
        "open at once"
    )
    assert warnings == []
