"""How many CPUs a process may compute on: a plain function, importable without side effects
(unlike verl_cpu, whose import patches torch)."""

import os
from pathlib import Path


def _quota(cgroup_root: Path) -> tuple[str, str] | None:
    """The cgroup's CPU quota and period as written (v2's cpu.max, else v1's cfs files)."""
    try:
        quota, period = (cgroup_root / "cpu.max").read_text().split()
        return quota, period
    except (OSError, ValueError):
        pass
    try:
        v1 = cgroup_root / "cpu"
        return (v1 / "cpu.cfs_quota_us").read_text().strip(), (
            v1 / "cpu.cfs_period_us"
        ).read_text().strip()
    except OSError:
        return None


def usable_cpus(cgroup_root: Path = Path("/sys/fs/cgroup")) -> int:
    """The CPUs this process may run on: its affinity, within its cgroup's quota (a pod's CPU
    limit), at least 1."""
    cpus = len(os.sched_getaffinity(0))
    quota = _quota(cgroup_root)
    if quota is not None and quota[0] not in ("max", "-1") and int(quota[1]) > 0:
        cpus = min(cpus, int(quota[0]) // int(quota[1]))
    return max(1, cpus)
