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
    """Raise the soft limit on open files to the hard limit; the soft limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = _UNLIMITED_TARGET if hard == resource.RLIM_INFINITY else hard
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError):  # above what the system allows: the limit stays as it was
            return soft
        return target
    return soft
