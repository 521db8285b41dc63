"""The operator's metrics say what its registry was told: pools and runs counted by state from
their last status, a run's progress, and every reconcile pass."""

import pytest
from gymkube_operator import metrics
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

pytestmark = pytest.mark.unit


def _samples() -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = generate_latest(metrics.REGISTRY).decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def test_pools_are_counted_by_their_last_state_until_forgotten() -> None:
    metrics.POOLS.set("EnvPool", "rl", "a", ("true", "Healthy"))
    metrics.POOLS.set("EnvPool", "rl", "b", ("false", "ImagePullFailed"))
    metrics.POOLS.set("EnvPool", "rl", "b", ("false", "Unschedulable"))  # its newest state counts
    metrics.POOLS.set("EnvPool", "other", "a", ("true", "Healthy"))
    pools = "gymkube_operator_envpools"
    healthy = (pools, (("degraded", "Healthy"), ("kind", "EnvPool"), ("ready", "true")))
    stuck = (pools, (("degraded", "Unschedulable"), ("kind", "EnvPool"), ("ready", "false")))
    pulling = (pools, (("degraded", "ImagePullFailed"), ("kind", "EnvPool"), ("ready", "false")))
    found = _samples()
    assert (found[healthy], found[stuck], found.get(pulling)) == (2, 1, None)
    for namespace, name in (("rl", "a"), ("rl", "b"), ("other", "a")):
        metrics.POOLS.forget("EnvPool", namespace, name)
    assert healthy not in _samples()


def test_a_runs_progress_is_its_status_progress() -> None:
    metrics.RUN_PROGRESS.set("rl", "grpo", 3, 12, 0.25)
    labels = (("namespace", "rl"), ("trainingrun", "grpo"))
    found = _samples()
    assert found["gymkube_operator_trainingrun_step", labels] == 3
    assert found["gymkube_operator_trainingrun_total_steps", labels] == 12
    assert found["gymkube_operator_trainingrun_mean_reward", labels] == 0.25
    metrics.RUN_PROGRESS.forget("rl", "grpo")
    assert ("gymkube_operator_trainingrun_step", labels) not in _samples()


def test_each_pass_is_counted_by_result_and_timed() -> None:
    before = _samples()
    ok = ("gymkube_operator_reconciles_total", (("kind", "EvalRun"), ("result", "ok")))
    timed = ("gymkube_operator_reconcile_duration_seconds_count", (("kind", "EvalRun"),))
    metrics.count_pass("EvalRun", "ok", 0.2)
    after = _samples()
    assert after[ok] - before.get(ok, 0) == 1
    assert after[timed] - before.get(timed, 0) == 1
