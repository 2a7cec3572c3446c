"""The CPUs this process may run on: its affinity, its cgroup's cpuset and CPU quota (never raises)."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

CGROUP_ROOT = "/sys/fs/cgroup"


@dataclass(frozen=True)
class CpuBudget:
    """What bounds this process's parallelism.

    ``affinity``: CPUs in its affinity mask (what a launcher's binding narrows); ``shared``: CPUs
    of the cgroup cpuset every process of the job shares (the machine's online CPUs when there is
    no cpuset); ``quota``: the cgroup's CPU quota in CPUs (cpu.max / cfs_quota_us), None if none.
    """

    affinity: int
    shared: int
    quota: float | None = None

    @property
    def bound(self) -> bool:
        """True when this process was pinned to a subset of the CPUs its cgroup allows: a
        launcher's binding (mpirun's default --bind-to core, srun --cpu-bind), one set per rank."""
        return self.affinity < self.shared

    @property
    def usable(self) -> int:
        """CPUs this process can keep busy: its affinity, capped by the quota."""
        if self.quota is None:
            return self.affinity
        return max(1, min(self.affinity, math.ceil(self.quota)))


def parse_cpu_list(text: str) -> int:
    """'0-3,8,10-11' -> 7 CPUs."""
    count = 0
    for part in text.strip().split(","):
        part = part.strip()
        if not part:
            continue
        low, _, high = part.partition("-")
        count += (int(high) - int(low) + 1) if high else 1
    return count


def _cgroup_paths() -> dict[str, str]:
    """controller -> this process's cgroup path ('' -> the unified v2 hierarchy)."""
    paths: dict[str, str] = {}
    try:
        with open("/proc/self/cgroup") as fh:
            for line in fh:
                _id, controllers, path = line.rstrip("\n").split(":", 2)
                for name in controllers.split(",") if controllers else [""]:
                    paths[name] = path
    except (OSError, ValueError):
        pass
    return paths


def _read(path: str) -> str | None:
    try:
        with open(path) as fh:
            return fh.read(4096).strip()
    except OSError:
        return None


def cgroup_quota(paths: dict[str, str]) -> float | None:
    """The CPU quota in CPUs: cgroup v2 cpu.max ('200000 100000' -> 2.0), v1 cfs_quota/period."""
    if "" in paths:
        text = _read(f"{CGROUP_ROOT}{paths['']}/cpu.max")
        if text and not text.startswith("max"):
            quota, _, period = text.partition(" ")
            return int(quota) / int(period or 100000)
    if "cpu" in paths:
        base = f"{CGROUP_ROOT}/cpu{paths['cpu']}"
        quota, period = _read(f"{base}/cpu.cfs_quota_us"), _read(f"{base}/cpu.cfs_period_us")
        if quota and period and int(quota) > 0:
            return int(quota) / int(period)
    return None


def cgroup_cpuset(paths: dict[str, str]) -> int | None:
    """CPUs of this process's cgroup cpuset (v2 cpuset.cpus.effective, v1 cpuset.cpus)."""
    candidates = []
    if "" in paths:
        candidates.append(f"{CGROUP_ROOT}{paths['']}/cpuset.cpus.effective")
    if "cpuset" in paths:
        candidates.append(f"{CGROUP_ROOT}/cpuset{paths['cpuset']}/cpuset.cpus")
    for path in candidates:
        text = _read(path)
        if text:
            return parse_cpu_list(text)
    return None


def cpu_budget() -> CpuBudget:
    affinity = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    paths = _cgroup_paths()
    try:
        quota = cgroup_quota(paths)
    except (ValueError, ZeroDivisionError):
        quota = None
    try:
        cpuset = cgroup_cpuset(paths)
    except ValueError:
        cpuset = None
    shared = cpuset or os.cpu_count() or affinity
    return CpuBudget(affinity=affinity, shared=max(shared, affinity), quota=quota)
