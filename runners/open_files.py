"""The process's open-file limit: raised to what the system allows, since a store keeps a descriptor per mapped file.

A memory-mapped chunk file holds an open file descriptor for as long as its
store is open (Python's mmap keeps its own copy), so a reader of a store of
200 shards holds about 1,800. The usual soft limit of 1,024 (systemd
services, many containers and shells) would then fail reads part-way
through; the hard limit, which a process may raise its soft limit to, is
commonly far higher.
"""

from __future__ import annotations

import resource

# What a command may set its soft limit to where the hard limit is unlimited (Linux refuses more than fs.nr_open).
_UNLIMITED_TARGET = 1 << 20


def raise_open_file_limit() -> int:
    """Raise the soft limit on open files to the hard limit, or to the highest the system accepts below it; the
    soft limit now in force.

    macOS reports an unlimited hard limit but refuses a soft limit over `kern.maxfilesperproc` (10,240 and the like)
    with EINVAL, so a single attempt at 2**20 left its default of 256 in place, and `serve` refused every store
    whose files that cannot hold (limits59 F1): the highest accepted limit is found by halving the gap instead.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = _UNLIMITED_TARGET if hard == resource.RLIM_INFINITY else hard
    if soft == resource.RLIM_INFINITY or soft >= target:
        return soft
    accepted, refused = soft, target + 1
    while refused - accepted > 1:
        trial = target if refused == target + 1 else (accepted + refused) // 2
        if _set_soft_limit(trial, hard):
            accepted = trial
        else:
            refused = trial
    return accepted


def _set_soft_limit(soft: int, hard: int) -> bool:
    """Whether the system took `soft` as the soft limit on open files (it refuses one above what it allows)."""
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    except (ValueError, OSError):
        return False
    return True
