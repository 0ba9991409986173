"""Ctrl-C, SIGTERM and SIGHUP stop a command with one line, its temporary files removed, its locks released.

Without this, `kill PID` (or the terminal that started the command closing)
ended `precompute` or `index` at once, with no line and status -15 or -1,
and left their temporary folders behind (`index` copies an appended store's
whole passage text into one). Ctrl-C's path already stopped cleanly. So
SIGTERM and SIGHUP are raised as `Terminated`, a KeyboardInterrupt, and every
path that handles Ctrl-C handles them too; the command line exits with 128 +
the signal's number, as a shell reports a process that signal ended. A signal
ignored when the command started (SIGHUP under `nohup`) stays ignored.

A stop also sets `stopping`, and in quiet mode it silences what the stop
itself makes the libraries report: the signal reaches Beam's worker processes
as well, and each worker's traceback, Beam's log records of the lost workers
and its threads' exceptions printed some 150 lines above the command's one
line. Python runs signal handlers in the main thread only, which may take a
second to get there while Beam's threads already report the workers the
signal ended; so a thread, woken by the signal's own wake-up byte, sets
`stopping` at once, and what other threads print waits a moment for it
(STOP_GRACE_SECONDS).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import signal
import sys
import threading
import traceback
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType

from dilstore.runners.child_processes import reap_after

STOPPING_SIGNALS: tuple[signal.Signals, ...] = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

# Set once a stopping signal has arrived, until the command's block ends.
stopping = threading.Event()
# Set as the command's block ends: the stop's reaper (runners/child_processes.py) then kills nothing.
_block_ended = threading.Event()
# How long a thread's uncaught exception (and, in `quiet.filtered_stderr`, a worker's output) waits for `stopping`
# before it is shown.
STOP_GRACE_SECONDS = 0.2


class Terminated(KeyboardInterrupt):
    """SIGTERM or SIGHUP, raised where Ctrl-C's KeyboardInterrupt would be."""

    def __init__(self, signal_number: int) -> None:
        super().__init__(signal_number)
        self.signal_number = signal_number

    def __str__(self) -> str:
        return f"stopped by {signal.Signals(self.signal_number).name}"


def interrupt_number(interrupt: KeyboardInterrupt) -> int:
    """The signal behind `interrupt`: SIGINT for Ctrl-C's, the signal's own for a Terminated."""
    return interrupt.signal_number if isinstance(interrupt, Terminated) else signal.SIGINT


def interrupt_words(interrupt: KeyboardInterrupt) -> str:
    """How a command's one line names the stop: "interrupted" (Ctrl-C) or "stopped by SIGTERM"."""
    return str(interrupt) if isinstance(interrupt, Terminated) else "interrupted"


def drop_interrupted_work(interrupt: BaseException) -> None:
    """Free what a Ctrl-C left half done, without a word, so that its one line is all the terminal shows.

    The interrupt can land inside a library's constructor (zarr's event loop,
    half built) or between making a coroutine and running it; their
    finalizers, run once the exception that holds their frames is dropped,
    printed "Exception ignored in ... BaseEventLoop.__del__" with a traceback
    and "coroutine 'open_group' was never awaited" after the line. This
    cancels the reads still running on zarr's event loop (an interrupted
    `verify` left up to 90 "Task was destroyed but it is pending!" and "Event
    loop is closed" tracebacks to the loop's close at exit), then clears the
    locals of every frame in the interrupt's chain and collects them, while
    such reports are silenced.
    """
    chain: list[BaseException] = [interrupt]
    seen: set[int] = set()
    unraisable_hook = sys.unraisablehook
    sys.unraisablehook = lambda report: None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            _cancel_zarr_tasks()
            _forget_unstarted_zarr_thread()
            while chain:
                error = chain.pop()
                if id(error) in seen:
                    continue
                seen.add(id(error))
                traceback.clear_frames(error.__traceback__)
                chain.extend(linked for linked in (error.__cause__, error.__context__) if linked is not None)
            del error
            gc.collect()
    finally:
        sys.unraisablehook = unraisable_hook


@contextmanager
def stops_ignored() -> Iterator[None]:
    """In the block, a stopping signal is ignored: a command saying it stopped and freeing what it left (up to a
    second or so, with torch's tensors to collect) is not cut short by a second Ctrl-C, which printed a traceback
    over its one line (longrun45 F2). Only the main thread may set handlers; elsewhere the block changes nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {number: signal.signal(number, signal.SIG_IGN) for number in STOPPING_SIGNALS}
    try:
        yield
    finally:
        for number, handler in previous.items():
            signal.signal(number, signal.SIG_DFL if handler is None else handler)


def _cancel_zarr_tasks(wait_seconds: float = 1.0) -> None:
    """Cancel the tasks on zarr's event loop (a thread of its own) and wait up to `wait_seconds` for them to end.

    Only when zarr is loaded: a command that never read a store does not import it here.
    """
    sync = sys.modules.get("zarr.core.sync")
    loop = sync.loop[0] if sync is not None else None
    if loop is None or not loop.is_running():
        return

    async def cancel_all() -> None:
        tasks = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    with contextlib.suppress(Exception):  # a loop closing meanwhile, or tasks that outlast the wait
        asyncio.run_coroutine_threadsafe(cancel_all(), loop).result(wait_seconds)


def _forget_unstarted_zarr_thread() -> None:
    """Close and forget the event loop of zarr's whose IO thread an interrupt kept from starting.

    zarr makes its loop's thread, then starts it (`zarr.core.sync._get_loop`); a Ctrl-C that lands between the two
    leaves a thread that never ran, and zarr's exit handler joined it: "Exception ignored in atexit callback ...
    RuntimeError: cannot join thread before it is started", a traceback under the command's one line (seen in the
    test suite, s56). zarr makes a new loop at its next use, as in a forked child. Only when zarr is loaded.
    """
    sync = sys.modules.get("zarr.core.sync")
    thread = sync.iothread[0] if sync is not None else None
    if thread is None or thread.ident is not None:  # none, or started (running or ended)
        return
    loop = sync.loop[0]
    sync.loop[0] = sync.iothread[0] = None
    if loop is not None:
        loop.close()


@contextmanager
def signals_interrupt(mute_when_stopping: bool = False) -> Iterator[None]:
    """Inside the block, a stopping signal sets `stopping` and raises in the main thread: KeyboardInterrupt for
    SIGINT, Terminated for SIGTERM and SIGHUP (see the module docstring).

    With `mute_when_stopping`, log records and threads' uncaught exceptions are dropped from the stop to the end
    of the block. Handlers set inside the block (a training run's, the server's) take over while they are in
    place. Only the main thread may set handlers, so elsewhere the signals keep theirs.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {number: signal.getsignal(number) for number in STOPPING_SIGNALS}
    disabled, excepthook = logging.root.manager.disable, threading.excepthook

    def stop(number: int, _frame: FrameType | None) -> None:
        _stopped(mute_when_stopping)
        raise KeyboardInterrupt if number == signal.SIGINT else Terminated(number)

    def handled_here(number: int) -> bool:
        return signal.getsignal(number) is stop

    def unless_stopping(arguments: threading.ExceptHookArgs) -> None:
        if not stopping.wait(STOP_GRACE_SECONDS):
            excepthook(arguments)

    stopping.clear()
    _block_ended.clear()
    for number, handler in previous.items():
        if handler is not signal.SIG_IGN and (number != signal.SIGINT or handler is signal.default_int_handler):
            signal.signal(number, stop)
    if mute_when_stopping:
        threading.excepthook = unless_stopping
    try:
        # Only muting reads `stopping` early (--verbose shows everything), so only then is the watcher started.
        with _noticed_at_once(handled_here, mute_when_stopping) if mute_when_stopping else contextlib.nullcontext():
            yield
    finally:
        for number, handler in previous.items():
            signal.signal(number, signal.SIG_DFL if handler is None else handler)
        logging.disable(disabled)
        threading.excepthook = excepthook
        stopping.clear()
        _block_ended.set()


def _stopped(mute: bool) -> None:
    if not stopping.is_set():  # a worker that hangs as it winds down does not hold the command for good
        reap_after(_block_ended)
    stopping.set()
    if mute:
        logging.disable(logging.CRITICAL)


@contextmanager
def _noticed_at_once(handled_here: Callable[[int], bool], mute: bool) -> Iterator[None]:
    """In the block, a thread calls `_stopped` the moment a stopping signal arrives (the module docstring says why),
    unless a handler set inside the block handles it (a training run's checkpoint, the server's graceful shutdown).

    It reads the byte Python's C-level handler writes to the wake-up file descriptor as the signal arrives.
    """
    read_end, write_end = os.pipe()
    os.set_blocking(write_end, False)
    previous = signal.set_wakeup_fd(write_end, warn_on_full_buffer=False)
    numbers = {int(number) for number in STOPPING_SIGNALS}

    def watch() -> None:
        while received := os.read(read_end, 64):  # b"" once the block has closed the write end
            if any(handled_here(number) for number in numbers.intersection(received)):
                _stopped(mute)

    watcher = threading.Thread(target=watch, name="dilstore-stop-watcher", daemon=True)
    watcher.start()
    try:
        yield
    finally:
        signal.set_wakeup_fd(previous)
        os.close(write_end)
        watcher.join(timeout=1)
        if not watcher.is_alive():
            os.close(read_end)
