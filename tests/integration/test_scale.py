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


def test_twenty_pools_come_up_stay_quiet_and_lose_a_frozen_pod() -> None:
    operator = Path(sys.executable).parent / "gymkube-operator"
    result = scale.run_size(POOLS, REPLICAS, steady=5.0, operator_bin=operator, settings={})

    assert result["ready_pools"] == POOLS, result
    steady = result["steady_state"]
    # Nothing changes at steady state, so the operator writes no status (and probes on time).
    assert steady["status_writes_per_second"] == 0, steady["api_requests_by_kind"]
    assert steady["probes_per_second"] >= 0.8 * steady["probes_per_second_required"], steady
    frozen = result["frozen_pod"]
    assert frozen["restart_reason"] == "NoAnswer", frozen
    assert frozen["detect_seconds"] is not None, frozen
    assert frozen["detect_seconds"] <= frozen["detect_bound_seconds"], frozen
    assert frozen["replaced_ready_seconds"] is not None, frozen
