"""A stop that leaves a command's child processes hanging kills them after a grace period (runners/child_processes.py):
a Beam worker deadlocked as it wound down held a stopped `precompute` for good."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from dilstore.runners import stop_signals
from dilstore.runners.child_processes import descendants, kill_descendants, reap_after

pytestmark = pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="needs /proc")


def started_tree() -> subprocess.Popen[bytes]:
    """A shell whose child sleeps; the shell waits for it, as Beam's `sh -c python -m ...sdk_worker_main` does."""
    shell = subprocess.Popen(["sh", "-c", "sleep 60 & wait"])
    deadline = time.monotonic() + 10
    while not _sleeping(shell.pid) and time.monotonic() < deadline:  # forked, then `sleep` once it has exec'd
        time.sleep(0.01)
    return shell


def _sleeping(pid: int) -> bool:
    below = descendants(pid)
    try:
        return len(below) == 1 and Path(f"/proc/{below[0]}/cmdline").read_bytes().startswith(b"sleep")
    except OSError:
        return False


def test_every_process_below_is_found_and_killed() -> None:
    shell = started_tree()
    try:
        assert _sleeping(shell.pid)
        below = descendants(shell.pid)
        assert kill_descendants(shell.pid) == below
        shell.wait(timeout=10)  # the shell's `wait` returns once its child is killed, and the shell ends
        assert not Path(f"/proc/{below[0]}").exists(), "the shell reaped its killed child"
    finally:
        shell.kill()
        shell.wait()


# Each level starts the next and waits for it; the innermost prints its own pid and its child's once that child has
# exec'd (Popen returns only then), so the tree is whole when the line is read: no polling.
INNER = "import os, subprocess, sys; p = subprocess.Popen(['sleep', '60']); print(os.getpid(), p.pid, flush=True); " \
        "sys.exit(0 if p.wait() == -9 else 1)"
OUTER = f"import subprocess, sys; sys.exit(subprocess.Popen([sys.executable, '-c', {INNER!r}]).wait())"


def started_three_levels() -> tuple[subprocess.Popen[str], int, int]:
    """A process, its child and its grandchild `sleep`: (the process, the child's pid, the grandchild's pid)."""
    outer = subprocess.Popen([sys.executable, "-c", OUTER], stdout=subprocess.PIPE, text=True)
    child, grandchild = (int(pid) for pid in outer.stdout.readline().split())
    return outer, child, grandchild


def end_three_levels(outer: subprocess.Popen[str], grandchild: int) -> None:
    """Kill what is left of the three levels, the grandchild by its pid while it is still that `sleep`."""
    if _sleeping_pid(grandchild):
        subprocess.run(["kill", "-9", str(grandchild)], check=False)
    outer.kill()
    outer.wait()
    outer.stdout.close()


def _sleeping_pid(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().startswith(b"sleep")
    except OSError:
        return False


def test_processes_below_children_are_found_too() -> None:
    outer, child, grandchild = started_three_levels()
    try:
        assert descendants(outer.pid) == [child, grandchild]
        assert descendants(child) == [grandchild]
        assert kill_descendants(outer.pid) == [child, grandchild]
    finally:
        end_three_levels(outer, grandchild)


def test_the_reaper_kills_only_below_the_process_it_is_given() -> None:
    """Given another process, the reaper kills what runs below it, not the processes of the caller."""
    outer, child, grandchild = started_three_levels()
    try:
        reap_after(threading.Event(), seconds=0, pid=child).join(timeout=10)
        assert outer.wait(timeout=10) == 0, "the grandchild was killed, and neither the child nor its parent"
    finally:
        end_three_levels(outer, grandchild)


@pytest.mark.parametrize("ends_first", [False, True], ids=["hangs", "ends"])
def test_the_reaper_kills_only_when_the_command_is_still_there(ends_first: bool) -> None:
    shell = started_tree()
    try:
        ended = threading.Event()
        if ends_first:
            ended.set()
        reap_after(ended, seconds=0.2, pid=shell.pid).join(timeout=10)
        if ends_first:
            with pytest.raises(subprocess.TimeoutExpired):
                shell.wait(timeout=0.5)
            assert descendants(shell.pid), "a command that ended keeps its children"
        else:
            shell.wait(timeout=10)
            assert not descendants(shell.pid)
    finally:
        for pid in descendants(shell.pid):
            subprocess.run(["kill", "-9", str(pid)], check=False)
        shell.kill()
        shell.wait()


def test_a_stop_starts_a_reaper_that_the_end_of_the_command_calls_off() -> None:
    """The reaper waits for the command's block; one that ends in time (as every command here does) kills nothing,
    so a program running commands in its own process keeps its other children."""
    with stop_signals.signals_interrupt(), pytest.raises(stop_signals.Terminated):
        signal.raise_signal(signal.SIGTERM)  # not SIGINT, which pytest-xdist's workers ignore (and so the block)
    reapers = [thread for thread in threading.enumerate() if thread.name == "dilstore-stop-reaper"]
    assert reapers, "a stop starts the reaper"
    for reaper in reapers:
        reaper.join(timeout=2)
        assert not reaper.is_alive(), "the end of the block calls it off at once"
