"""How many CPUs a process may compute on: a plain function, importable without side effects
(unlike verl_cpu, whose import patches torch)."""

import os
from pathlib import Path


def usable_cpus(cgroup_root: Path = Path("/sys/fs/cgroup")) -> int:
    """The CPUs this process may run on: its affinity, within its cgroup's quota (a pod's CPU
    limit), at least 1."""
    cpus = len(os.sched_getaffinity(0))
    quota_files = (
        (cgroup_root / "cpu.max", None),  # cgroup v2: "<quota> <period>" or "max <period>"
        (cgroup_root / "cpu" / "cpu.cfs_quota_us", cgroup_root / "cpu" / "cpu.cfs_period_us"),
    )
    for quota_file, period_file in quota_files:
        try:
            fields = quota_file.read_text().split()
            if period_file is not None:
                fields.append(period_file.read_text().strip())
        except OSError:
            continue
        quota, period = fields[0], fields[-1]
        if quota not in ("max", "-1") and int(period) > 0:
            cpus = min(cpus, max(1, int(quota) // int(period)))
        break
    return max(1, cpus)
