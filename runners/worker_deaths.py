"""A worker process that died under a run, said in the launcher's one error line with what to do next.

A worker killed mid-run (by the OOM killer, say) ended a DirectRunner run with "the pipeline failed: Channel closed
prematurely.", which says neither that a worker died nor that a rerun goes on (dask50 F3); on Dask, with the text of
distributed's KilledWorker, which named a task key and a worker address and no next step (dask50 F4).

A DirectRunner run whose worker process died as it took the run's last bundles (the last shard's commit, Finish)
waited for ever on the dead worker: Beam's launcher waits for that worker's answer, which never comes, and only a
signal ended it (hang50). `dead_worker_wait_bounded` ends such a wait with the same one line.
"""

from __future__ import annotations

import re
import signal
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from types import FrameType

from dilstore.runners.child_processes import reap_after
from dilstore.runners.exception_chain import exception_chain
from dilstore.runners.quiet import WORKER_EXIT, worker_exit_codes
from dilstore.storage.errors import DilstoreError

# How a failed or stopped precompute says to go on; a build whose start was taken back rewrites its end, the
# pipeline's SHARDS_KEPT, to say that none was stored (pipelines/job.py `nothing_kept`).
RERUN = "run the same command again to go on (the shards it finished are kept)"
# How Beam's launcher says that a worker process went away: its data channel's error in the main thread (its
# `run_worker` thread's is `quiet.WORKER_EXIT`, which `quiet.worker_exit_codes` also notes).
_CHANNEL_CLOSED = "Channel closed prematurely"
# How long a lost channel waits for the worker's exit code (the launcher's thread that reports it, `quiet`).
EXIT_CODE_WAIT_SECONDS = 2.0
# KilledWorker's text: "Attempted to run task ... on 4 different workers, but all those workers died while running it."
_DASK_TRIES = re.compile(r"on (\d+) different workers, but all those workers died")
_SIGNAL_WORDS = {signal.SIGKILL: "killed, e.g. out of memory", signal.SIGABRT: "aborted", signal.SIGSEGV: "crashed"}


def worker_death(error: BaseException, exits: Sequence[int] | None = None) -> str | None:
    """The line for a run that failed because a worker process died (Beam's or Dask's), or None for another
    failure."""
    for each in exception_chain(error):
        if type(each).__name__ == "KilledWorker":  # by name: the launcher imports no Dask when not on Dask
            return dask_worker_death(each)
    return beam_worker_death(error, exits)


def dask_worker_death(killed: BaseException) -> str:
    """The line for Dask's KilledWorker: every worker that ran one task died (distributed's `allowed-failures`, 3 by
    default, plus one), which is a task that kills its worker, or one over its memory limit (dask50 F4). Dask's own
    text named only the task's key and its last worker."""
    tries = _DASK_TRIES.search(str(killed))
    times = f"{tries.group(1)} times" if tries else "again and again"
    return (f"a Dask worker process died {times} running one task (killed, or over its memory limit: a LocalCluster "
            f"worker gets RAM/--workers by default); {RERUN}")  # fmt: skip


def beam_worker_death(error: BaseException, exits: Sequence[int] | None = None) -> str | None:
    """The line for a run that failed because a Beam worker process died, or None for another failure.

    `exits`: the exit codes of the worker processes that died (default: those the run block noted); the first is
    named, as the deaths after it (a partner aborting) follow from it.
    """
    messages = [str(each) for each in exception_chain(error)]
    codes = [int(found.group(1)) for text in messages for found in WORKER_EXIT.finditer(text)]
    if not codes and not any(_CHANNEL_CLOSED in text for text in messages):
        return None
    return died_line(codes or list(worker_exit_codes(EXIT_CODE_WAIT_SECONDS) if exits is None else exits))


def died_line(codes: Sequence[int]) -> str:
    """The line for a Beam worker death, naming the first of `codes` (the exit codes of the workers that died)."""
    how = f" ({exit_words(codes[0])})" if codes else ""
    return f"a worker process died{how}; {RERUN}"


def exit_words(code: int) -> str:
    """An exit code in words: a shell's 128 + N (Beam starts each worker through `sh -c`) or a negative code is
    signal N's death."""
    number = code - 128 if code > 128 else -code
    try:
        name = signal.Signals(number)
    except ValueError:
        return f"exit {code}"
    return f"exit {code}: {_SIGNAL_WORDS.get(name, f'ended by {name.name}')}"


# How long Beam has, once a worker process has died, to end the run on its own (it fails within seconds when the
# worker was sending data) before the launcher stops waiting for it (hang50).
DEAD_WORKER_GRACE_SECONDS = 30.0
_EXIT_POLL_SECONDS = 1.0
# The signal that wakes the main thread out of Beam's wait: Python runs signal handlers in the main thread only,
# and only a signal interrupts its wait on a lock.
_WAKE_SIGNAL = signal.SIGUSR1


class DeadWorkerError(DilstoreError):
    """Beam's wait for a worker process that had died, ended (`dead_worker_wait_bounded`): the run's one line.

    Beam logs it as the context of its own errors closing the workers; a name that ends in "Error" is what lets the
    quiet filter know the traceback's last line (`quiet.WorkerReports`)."""


class _DeadWorkerWatch:
    """The watch of one run block: a thread that, once a worker's exit code is noted and `grace_seconds` have
    passed without the block ending, wakes the main thread with `_WAKE_SIGNAL`, whose handler raises
    DeadWorkerError there, and kills the processes the block started that are still there REAP_SECONDS later (as
    a stop does, runners/child_processes.py)."""

    def __init__(self, grace_seconds: float, previous: signal.Handlers | object) -> None:
        self.grace_seconds = grace_seconds
        self.previous = previous  # the handler in place before the block: a SIGUSR1 from elsewhere goes to it
        self.ended = threading.Event()
        self.sending = threading.Lock()  # the block does not end while the signal is being sent
        self.codes: list[int] = []  # set as the signal is sent

    def watch(self) -> None:
        """The watching thread: waits for a death, then for the grace, then ends Beam's wait."""
        codes = self._first_death()
        if not codes or self.ended.wait(self.grace_seconds):
            return
        with self.sending:
            if self.ended.is_set():
                return
            self.codes = codes
            signal.pthread_kill(threading.main_thread().ident or 0, _WAKE_SIGNAL)
        reap_after(self.ended)

    def _first_death(self) -> list[int]:
        """The exit codes noted once a worker has died; none if the block ends first."""
        while not self.ended.is_set():
            codes = worker_exit_codes(_EXIT_POLL_SECONDS)
            if codes:
                return codes
        return []

    def wake(self, number: int, frame: FrameType | None) -> None:
        """The signal handler (main thread): raise DeadWorkerError for the watch's own signal while the block runs."""
        if self.codes and not self.ended.is_set():
            raise DeadWorkerError(f"the pipeline failed: {died_line(self.codes)}")  # run_pipeline's words
        if callable(self.previous):
            self.previous(number, frame)

    def end(self) -> None:
        """The block's end: no signal is sent from here on, and one already sent does nothing."""
        self.ended.set()
        with self.sending:
            pass


@contextmanager
def dead_worker_wait_bounded(grace_seconds: float | None = None) -> Iterator[None]:
    """In the block (a Beam run, inside the run block that notes the workers' exit codes, `quiet.filtered_stderr`),
    a worker process that died and a run that has not ended `grace_seconds` later (DEAD_WORKER_GRACE_SECONDS)
    raise DeadWorkerError in the main thread: its one line names the death and the rerun that goes on.

    (hang50) A worker SIGKILLed as the last shard committed left Beam's launcher waiting for ever for the dead
    worker's answer to its last bundle. A run that fails or ends on its own within the grace is left to do so.
    Only the main thread can set a signal handler; elsewhere (a Python caller's thread) the block changes nothing.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    watch = _DeadWorkerWatch(DEAD_WORKER_GRACE_SECONDS if grace_seconds is None else grace_seconds,
                             signal.getsignal(_WAKE_SIGNAL))  # fmt: skip
    signal.signal(_WAKE_SIGNAL, watch.wake)
    watcher = threading.Thread(target=watch.watch, name="dilstore-dead-worker-watch", daemon=True)
    watcher.start()
    try:
        yield
    finally:
        watch.end()  # the watcher, up to _EXIT_POLL_SECONDS in a wait, ends on its own
        signal.signal(_WAKE_SIGNAL, signal.SIG_DFL if watch.previous is None else watch.previous)  # type: ignore[arg-type]
