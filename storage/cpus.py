"""How many CPUs this process may use, for the defaults of worker and thread counts.

`os.cpu_count()` is the host's count: in a container limited to 2 CPUs of a 64-core host it is 64, and
`precompute` started 64 worker processes, each loading torch and the model, with 1 torch thread each (env57 F1).
The CPUs a process may use are those it may run on (its affinity: `taskset`, a container's or a batch job's cpuset),
and no more than its cgroup's CPU quota allows in time (`docker run --cpus`, a Kubernetes CPU limit), which
leaves the affinity at the host's count. Standard library only: runners import it to build their options.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
PROC_CGROUP = Path("/proc/self/cgroup")
# Where a cgroup v1 hierarchy with the cpu controller is mounted, under CGROUP_ROOT (its name, or a common alias).
_V1_CPU_MOUNTS = ("cpu,cpuacct", "cpuacct,cpu", "cpu")


def usable_cpu_count() -> int:
    """The CPUs this process may use: its affinity's count, or fewer where a cgroup CPU quota allows less (rounded
    up: a quota of 1.5 CPUs is 2); at least 1."""
    cpus = runnable_cpu_count() or 1
    quota = cgroup_cpu_quota()
    return max(1, cpus if quota is None else min(cpus, quota))


def runnable_cpu_count() -> int | None:
    """The logical CPUs this process may run on (its affinity: `taskset`, a cpuset), or the machine's count where the
    system does not say which; None where neither is known."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()


def cgroup_cpu_quota(cgroup_root: Path = CGROUP_ROOT, proc_cgroup: Path = PROC_CGROUP) -> int | None:
    """The CPUs' worth of time the cgroup quotas of this process allow (v2 `cpu.max`, v1 `cpu.cfs_quota_us`), the
    least of its own cgroup's and its ancestors', rounded up; None without a quota, or where none can be read."""
    try:
        lines = proc_cgroup.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return None
    quotas: list[int] = []
    for line in lines:
        fields = line.split(":", 2)
        if len(fields) != 3:
            continue
        _, controllers, path = fields
        if controllers == "":  # cgroup v2: the unified hierarchy (hybrid systems mount it at ROOT/unified)
            for mount in (cgroup_root, cgroup_root / "unified"):
                quotas += (_v2_quota(folder / "cpu.max") for folder in _cgroup_folders(mount, path))
        elif "cpu" in controllers.split(","):
            for name in dict.fromkeys((controllers, *_V1_CPU_MOUNTS)):
                quotas += (_v1_quota(folder) for folder in _cgroup_folders(cgroup_root / name, path))
    found = [quota for quota in quotas if quota is not None]
    return min(found) if found else None


def _cgroup_folders(mount: Path, path: str) -> Iterator[Path]:
    """The folders of the cgroup `path` and of its ancestors under `mount`, and `mount` itself: inside a container
    without a cgroup namespace, /proc/self/cgroup names the host's path, and the container's own cgroup is the
    mount's root."""
    parts = [part for part in path.split("/") if part and part not in (".", "..")]
    for depth in range(len(parts), -1, -1):
        yield mount.joinpath(*parts[:depth])


def _v2_quota(path: Path) -> int | None:
    """CPUs from a cgroup v2 `cpu.max` ("QUOTA PERIOD", or "max PERIOD" for none), rounded up; None if none."""
    try:
        quota, _, period = path.read_text(encoding="ascii").strip().partition(" ")
        return _cpus(int(quota), int(period or "100000")) if quota != "max" else None
    except (OSError, ValueError):
        return None


def _v1_quota(folder: Path) -> int | None:
    """CPUs from a cgroup v1 folder's `cpu.cfs_quota_us` over `cpu.cfs_period_us` (-1: none), rounded up."""
    try:
        quota = int((folder / "cpu.cfs_quota_us").read_text(encoding="ascii"))
        period = int((folder / "cpu.cfs_period_us").read_text(encoding="ascii"))
    except (OSError, ValueError):
        return None
    return _cpus(quota, period)


def _cpus(quota: int, period: int) -> int | None:
    """A quota of `quota` µs per `period` µs as whole CPUs, rounded up; None for no quota (a value of 0 or less)."""
    return max(1, math.ceil(quota / period)) if quota > 0 and period > 0 else None
