"""The processes a command started, ended for good when a stop leaves them hanging.

A Ctrl-C reaches Beam's worker processes too. Once, in a loaded test run, a
worker's main thread deadlocked in grpc's `_Rendezvous.__del__` as it wound
down, and the command waited for it for good in Beam's `stop_worker`, deaf to
the stop it had been given (2026-11-30). So a stop gives the processes the
command started REAP_SECONDS to end, then kills every one still there, so
that the command can end with its one line.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from pathlib import Path

# Seconds a stopped command's child processes have to end before they are killed: Beam's workers end in a few.
REAP_SECONDS = 30.0


def descendants(pid: int) -> list[int]:
    """The processes below `pid`, children first, as Linux lists them (/proc/PID/task/TID/children); none where
    there is no /proc."""
    found: list[int] = []
    pending = [pid]
    while pending:
        parent = pending.pop(0)
        for task in _tasks(parent):
            with contextlib.suppress(OSError):
                children = [int(child) for child in (task / "children").read_text().split()]
                found += children
                pending += children
    return found


def _tasks(pid: int) -> list[Path]:
    with contextlib.suppress(OSError):
        return list(Path(f"/proc/{pid}/task").iterdir())
    return []


def kill_descendants(pid: int) -> list[int]:
    """SIGKILL every process below `pid`; those signalled (a process gone meanwhile is skipped)."""
    killed = []
    for child in descendants(pid):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(child, signal.SIGKILL)
            killed.append(child)
    return killed


def reap_after(ended: threading.Event, seconds: float = REAP_SECONDS, pid: int | None = None) -> threading.Thread:
    """In `seconds`, unless `ended` is set first (the command's block is over), kill the processes below `pid`
    (this one's by default) that are still there; the daemon thread that waits. A program that ran the command in
    its own process keeps its other children: the block ends, however the command did."""

    def reap() -> None:
        if not ended.wait(seconds):
            kill_descendants(os.getpid() if pid is None else pid)

    thread = threading.Thread(target=reap, name="dilstore-stop-reaper", daemon=True)
    thread.start()
    return thread
