"""bench/scale.py at 20 pools, so the scale harness (kwok pods, the loopback farm, the audit
log of the operator's requests) keeps working between benchmark runs (`make bench-scale` runs
100 and 1,000 pools)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import scale

pytestmark = pytest.mark.integration

POOLS, REPLICAS = 20, 5
# Long enough that a watchdog behind by most of a period on a loaded machine still probes every
# pod in it; the probe rate itself is the benchmark's figure (`make bench-scale`).
STEADY_SECONDS = 2.5 * scale.WATCHDOG.probe_period_seconds


def test_twenty_pools_come_up_stay_quiet_and_lose_a_frozen_pod() -> None:
    operator = Path(sys.executable).parent / "gymkube-operator"
    result = scale.run_size(
        POOLS, REPLICAS, steady=STEADY_SECONDS, operator_bin=operator, settings={}
    )

    assert result["ready_pools"] == POOLS, result
    steady = result["steady_state"]
    # Nothing changes at steady state, so the operator writes no status, and it watches every pod.
    assert steady["status_writes_per_second"] == 0, steady["api_requests_by_kind"]
    assert steady["pods_probed"] == steady["pods"] == POOLS * REPLICAS, steady
    frozen = result["frozen_pod"]
    assert frozen["restart_reason"] == "NoAnswer", frozen
    assert frozen["detect_seconds"] is not None, frozen
    assert frozen["detect_seconds"] <= frozen["detect_bound_seconds"], frozen
    assert frozen["replaced_ready_seconds"] is not None, frozen
