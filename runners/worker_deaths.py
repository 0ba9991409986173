"""A worker process that died under a run, said in the launcher's one error line with what to do next.

A worker killed mid-run (by the OOM killer, say) ended a DirectRunner run with "the pipeline failed: Channel closed
prematurely.", which says neither that a worker died nor that a rerun goes on (dask50 F3); on Dask, with the text of
distributed's KilledWorker, which named a task key and a worker address and no next step (dask50 F4).
"""

from __future__ import annotations

import re
import signal
from collections.abc import Iterator, Sequence

from dilstore.runners.quiet import worker_exit_codes

RERUN = "run the same command again to go on (the shards it finished are kept)"
# How Beam's launcher says that a worker process went away: its data channel's error in the main thread, and its
# `run_worker` thread's (which `quiet.worker_exit_codes` also notes).
_CHANNEL_CLOSED = "Channel closed prematurely"
_WORKER_EXIT = re.compile(r"Worker subprocess exited with return code (-?\d+)")
# How long a lost channel waits for the worker's exit code (the launcher's thread that reports it, `quiet`).
EXIT_CODE_WAIT_SECONDS = 2.0
# KilledWorker's text: "Attempted to run task ... on 4 different workers, but all those workers died while running it."
_DASK_TRIES = re.compile(r"on (\d+) different workers, but all those workers died")
_SIGNAL_WORDS = {signal.SIGKILL: "killed, e.g. out of memory", signal.SIGABRT: "aborted", signal.SIGSEGV: "crashed"}


def worker_death(error: BaseException, exits: Sequence[int] | None = None) -> str | None:
    """The line for a run that failed because a worker process died (Beam's or Dask's), or None for another
    failure."""
    for each in _chain(error):
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
    messages = [str(each) for each in _chain(error)]
    codes = [int(found.group(1)) for text in messages for found in _WORKER_EXIT.finditer(text)]
    if not codes and not any(_CHANNEL_CLOSED in text for text in messages):
        return None
    codes = codes or list(worker_exit_codes(EXIT_CODE_WAIT_SECONDS) if exits is None else exits)
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


def _chain(error: BaseException) -> Iterator[BaseException]:
    """`error` and the exceptions it was raised from or during (Beam wraps a worker's errors)."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        yield current
        seen.add(id(current))
        current = current.__cause__ or current.__context__
