"""The CPUs a CPU run's torch computes on: the process's affinity, within its cgroup's quota."""

import os
from pathlib import Path

import pytest
from gymkube_agentloop.cpus import usable_cpus

pytestmark = pytest.mark.unit

AFFINITY = len(os.sched_getaffinity(0))


def _cgroup(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


@pytest.mark.parametrize(
    ("files", "expected"),
    [
        ({}, AFFINITY),  # no cgroup files: the affinity
        ({"cpu.max": "max 100000\n"}, AFFINITY),  # v2, no limit
        ({"cpu.max": "100000 100000\n"}, 1),  # v2, a 1-CPU limit
        ({"cpu.max": "50000 100000\n"}, 1),  # v2, half a CPU: still one thread
        ({"cpu/cpu.cfs_quota_us": "-1\n", "cpu/cpu.cfs_period_us": "100000\n"}, AFFINITY),
        ({"cpu/cpu.cfs_quota_us": "100000\n", "cpu/cpu.cfs_period_us": "100000\n"}, 1),
        ({"cpu.max": f"{100000 * (AFFINITY + 4)} 100000\n"}, AFFINITY),  # a limit above the cores
    ],
)
def test_usable_cpus_are_the_affinity_within_the_cgroup_quota(
    tmp_path: Path, files: dict[str, str], expected: int
) -> None:
    assert usable_cpus(_cgroup(tmp_path, files)) == expected
