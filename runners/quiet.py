"""Quiet by default: what a user needs on the terminal, and `--verbose` for the rest.

Without `--verbose`, a command turns off before any library loads:
- Hugging Face's load reports and weight-loading bars (TRANSFORMERS_VERBOSITY,
  HF_HUB_DISABLE_PROGRESS_BARS: environment variables, so Beam's worker
  processes inherit them; a transformers this process already imported, as
  in a Python caller of dilstore's API, read them at import and is told directly);
- the JVM's notices (Java 22+ native access, sun.misc.Unsafe), Lucene's
  MMapDirectory warning and Anserini's INFO lines (DILSTORE_QUIET, read by
  dilstore.reader.retrieval when it starts the JVM);
- the lines Beam's local worker processes print on their own stderr
  ("apitools not found", "Logging handler created"), which `filtered_stderr`
  drops while a pipeline runs, with the failure reports of Beam's and Dask's
  worker processes (`WorkerReports`). dilstore's own stderr (the progress bar,
  the errors) keeps the terminal directly;
- Beam's and dask.distributed's log records below ERROR and WARNING, and the
  same noise in this process's log (`quiet_beam_logging`, `quiet_dask_logging`,
  which `precompute` calls unless --verbose), for the run only
  (`logging_restored`): a Python caller's own logging is as it was after it.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import queue
import re
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from multiprocessing import resource_tracker
from types import TracebackType
from typing import Any

from dilstore.reader.quiet_mode import QUIET_ENV, is_quiet
from dilstore.runners.stop_signals import STOP_GRACE_SECONDS, stopping

# Lines that Beam's worker processes print and a user has no use for.
_WORKER_NOISE = ("apitools not found", "Logging handler created", "bigquery client libraries are not available")
_PIPE_CHUNK = 65536
# The chunks the pipe gave and the copier has not taken yet, at most: 4 MiB of full reads, 20 MiB/s a grace. The
# reader then waits, and the full pipe makes the child wait, as it did before the reader was a thread of its own.
# Unbounded, a child's flood piled up in this process while the terminal took it slowly or not at all (paused with
# Ctrl-S, a pager): a 128 MB flood held 147 MB (read59 F1). Smaller reads come only while the reader keeps up.
_BACKLOG_CHUNKS = 64


def add_verbose_argument(parser: argparse.ArgumentParser) -> None:
    """--verbose: keep the libraries' own logs, bars and warnings."""
    parser.add_argument(
        "--verbose", action="store_true", help="also show the libraries' logs, loading bars and JVM warnings"
    )


def configure(verbose: bool) -> None:
    """Set the quiet switches for this process and the processes it starts (module docstring)."""
    if verbose:
        os.environ.pop(QUIET_ENV, None)
        return
    os.environ[QUIET_ENV] = "1"
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    hf_logging = sys.modules.get("transformers.utils.logging")
    if hf_logging is not None:  # imported before this call: it has read the environment already
        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()


class _DropNoise(logging.Filter):
    """Drops log records whose message starts with one of the worker-noise lines."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(_WORKER_NOISE)


# The loggers whose levels a run sets (`quiet_beam_logging`, `quiet_dask_logging`, a remote run's job URL).
_RUN_LOGGERS = ("apache_beam", "apache_beam.typehints", "apache_beam.options.pipeline_options", "distributed")


class _FirstToLast:
    """Process-wide state that run blocks change: saved (or set) by the first of the blocks going on at once, put
    back by the last of them.

    Each run saving and restoring on its own left Beam's logger at ERROR and the noise filter on the root logger
    for good whenever two runs in two threads did not end in the reverse order they began: the second saved the
    first's quietened state, and put it back at its end.
    """

    def __init__(self, lock: threading.Lock | threading.Condition) -> None:
        self._lock = lock
        self._runs = 0

    @contextmanager
    def during(self) -> Iterator[None]:
        with self._lock:
            if self._runs == 0:
                self._first()
            self._runs += 1
        try:
            yield
        finally:
            with self._lock:
                self._runs -= 1
                if self._runs == 0:
                    self._last()

    def _first(self) -> None:
        """As the first block begins (under the lock)."""
        raise NotImplementedError

    def _last(self) -> None:
        """As the last block ends (under the lock)."""
        raise NotImplementedError


class _RunsLogging(_FirstToLast):
    """The logging state from before the first of the runs now going on, put back when the last of them ends."""

    def __init__(self) -> None:
        super().__init__(threading.Lock())
        self._filters: list[Any] = []
        self._levels: dict[str, int] = {}

    def _first(self) -> None:
        self._filters = list(logging.getLogger().filters)
        self._levels = {name: logging.getLogger(name).level for name in _RUN_LOGGERS}

    def _last(self) -> None:
        logging.getLogger().filters[:] = self._filters
        for name, level in self._levels.items():
            logging.getLogger(name).setLevel(level)


_RUNS_LOGGING = _RunsLogging()


def logging_restored() -> AbstractContextManager[None]:
    """After the block, the root logger's filters and the levels of the loggers a run sets are as before it (before
    the first of several blocks going on at once, after the last of them).

    `precompute` quietened Beam and Dask for good: a Python caller that logs through Beam of its own lost its
    INFO and WARNING records, and the root filter dropped its records that began like worker noise.
    """
    return _RUNS_LOGGING.during()


def quiet_beam_logging() -> None:
    """Keep Beam's INFO/WARNING chatter, and its import-time GCP notice on the root logger, off a run's terminal."""
    root = logging.getLogger()
    if not any(isinstance(existing, _DropNoise) for existing in root.filters):
        root.addFilter(_DropNoise())
    logging.getLogger("apache_beam").setLevel(logging.ERROR)
    # A remote run raises apache_beam to INFO for the job's URL; its type-hint conversions (50 lines a run) stay out.
    logging.getLogger("apache_beam.typehints").setLevel(logging.WARNING)
    # Its warnings repeat, a line each, the validation errors the command reports in its one line.
    logging.getLogger("apache_beam.options.pipeline_options").setLevel(logging.ERROR)


def quiet_dask_logging() -> None:
    """Keep dask.distributed's INFO chatter (scheduler, nanny and connection events) off the terminal.

    Importing `distributed` sets its logger to INFO, so this imports it first
    and then lowers the level to WARNING; warnings and errors still show.
    """
    import distributed  # noqa: F401  (its import configures the logger set below)

    logging.getLogger("distributed").setLevel(logging.WARNING)


@contextmanager
def filtered_stderr() -> Iterator[None]:
    """The run block's quiet terminal: what child processes write to descriptor 2 is filtered (`_stderr_piped`), and
    the uncaught exceptions of Beam's launcher threads (its `run_worker` thread's "Worker subprocess exited with
    return code 137" when a worker process is killed) stay off it (`_LauncherThreads`; --verbose shows them), and so
    do the Dask scheduler's records of the tasks each lost worker took with it (`dask_worker_loss`).

    A worker process killed mid-run (as the OOM killer does) printed 67 lines of those threads' tracebacks above
    the command's one line (dask50 F3); their exit codes are kept for that line (`worker_exit_codes`).
    """
    with _LAUNCHER_THREADS.during():
        if not is_quiet():
            yield
            return
        with records_unlogged("distributed.scheduler", dask_worker_loss), _stderr_piped():
            yield


# The Dask scheduler's records of a worker's death (it runs in this process for a LocalCluster): the task keys the
# worker took with it (a 4.7 KB line each), and each task that failed as its workers died, which the command's one
# line says (dask50 F4). The nanny's one-line "Restarting worker" stays.
_DASK_WORKER_LOSS = re.compile(r"Removing worker \S+ caused the cluster to lose already computed task"
                               r"|Task .* marked as failed because \d+ workers died")  # fmt: skip


def dask_worker_loss(record: logging.LogRecord) -> bool:
    """Picks the Dask scheduler's records of what a dead worker lost (`_DASK_WORKER_LOSS`)."""
    return _DASK_WORKER_LOSS.match(record.getMessage()) is not None


@contextmanager
def _stderr_piped() -> Iterator[None]:
    """While the block runs, drop the worker-noise lines that child processes write to file descriptor 2.

    Descriptor 2 becomes a pipe that a thread copies line by line to the
    real stderr, leaving out lines that name Beam's known noise and, once a
    stopping signal has arrived (`stop_signals`), everything. Where
    Python's own `sys.stderr` writes to descriptor 2, it is pointed at the
    real stderr, so this process's writes (a progress bar's carriage returns
    included) pass unbuffered; a `sys.stderr` that writes elsewhere (a
    caller's capture, a redirect) is left as it is.
    """
    # A process started in the block inherits the pipe; multiprocessing's resource tracker (started with the first
    # process pool, as Dask's LocalCluster makes) lives as long as this process and held it open, so the copier
    # waited its 5 s at every exit. Started first, the tracker keeps the real stderr.
    resource_tracker.ensure_running()
    sys.stderr.flush()
    real = os.dup(2)
    read_end, write_end = os.pipe()
    os.dup2(write_end, 2)
    os.close(write_end)
    saved = sys.stderr
    if _writes_descriptor_2(saved):
        sys.stderr = DiagnosticStream(os.fdopen(os.dup(real), "w", buffering=1, encoding=saved.encoding,
                                                errors=saved.errors))  # fmt: skip

    target = os.dup(real)  # the copier's own descriptor: `real` may close before the thread first runs
    arrived: queue.Queue[tuple[float, bytes] | None] = queue.Queue(maxsize=_BACKLOG_CHUNKS)

    def copy() -> None:
        pending = b""  # a line's start whose end has not arrived yet
        reports = WorkerReports()
        with os.fdopen(target, "wb", buffering=0) as out:
            while (item := arrived.get()) is not None:
                when, chunk = item
                # A stop reaches the workers as it reaches this process: a chunk is shown once its grace has passed.
                if stopping.wait(max(0.0, when + STOP_GRACE_SECONDS - time.monotonic())):
                    pending = b""  # what the stop made the workers print
                    continue
                *lines, pending = (pending + chunk).split(b"\n")
                with contextlib.suppress(OSError):  # a full disk under stderr: the pipe stays open and drained, where
                    # the copier died and the next worker to write to stderr died of the broken pipe (disk56 F10)
                    out.write(b"".join(line + b"\n" for line in lines if not reports.dropped(line)))
            if pending and not stopping.is_set() and not reports.dropped(pending):
                with contextlib.suppress(OSError):
                    out.write(pending)

    reader = threading.Thread(target=_read_into, args=(read_end, arrived), name="dilstore-stderr-pipe", daemon=True)
    copier = threading.Thread(target=copy, name="dilstore-stderr-filter", daemon=True)
    reader.start()
    copier.start()
    try:
        yield
    finally:
        sys.stderr.flush()
        os.dup2(real, 2)  # closes the pipe's last write end in this process: the copier sees EOF
        os.close(real)
        copier.join(timeout=5)
        if sys.stderr is not saved:
            sys.stderr.close()
            sys.stderr = saved


def _read_into(read_end: int, arrived: queue.Queue[tuple[float, bytes] | None]) -> None:
    """Put each chunk the pipe gives, with when it came, into `arrived`, then None at its end.

    Reading is a thread of its own so that the pipe is drained as fast as it is written: the copier waited out each
    chunk's grace before it read the next, so the child processes' stderr went at 64 KiB per 0.2 s, and a worker
    that wrote more blocked on the full pipe (a 1 MB write took 3.2 s, ci59 F7). `arrived` holds
    at most _BACKLOG_CHUNKS."""
    with os.fdopen(read_end, "rb", buffering=0) as pipe:
        while chunk := pipe.read(_PIPE_CHUNK):
            arrived.put((time.monotonic(), chunk))
    arrived.put(None)


class WorkerReports:
    """Picks, line by line, what child processes print that a quiet run leaves out: Beam's known noise, and a
    worker's report of a failure (Beam's ERROR record and the traceback under it, a bare traceback, or a Dask
    worker's "Compute Failed" record with the task's key, exception and traceback under it, and its warnings for
    the tasks the failure cancelled).

    The launcher says why the run failed in one line; a full disk with two worker processes printed 525 lines of
    their tracebacks above it. A Dask worker process logs through the `distributed` logger of its own interpreter,
    which `quiet_dask_logging` in this one does not reach (pipe48 F6).
    """

    def __init__(self) -> None:
        self.in_report = False

    def dropped(self, line: bytes) -> bool:
        """Whether `line` (without its newline) is left out; a report runs from its first line to the first line
        that belongs to no traceback."""
        if line.startswith(_REPORT_STARTS) or _DASK_FAILURE.search(line):
            self.in_report = True
        elif self.in_report and not (not line.strip() or line.startswith(_REPORT_LINES) or _RAISED.match(line)):
            self.in_report = False
        return self.in_report or _is_noise(line) or _DASK_CANCELLED.search(line) is not None


# How a worker's failure report begins, how the lines of a traceback begin, and its closing "SomeError: ..." line.
# A chained traceback's joining line starts a report too: a report may end early, at an exception line `_RAISED`
# does not know.
_CHAINED = (b"During handling of the above exception", b"The above exception was the direct")
_REPORT_STARTS = (b"ERROR:apache_beam", b"Traceback (most recent call last):", *_CHAINED)
_TRACEBACK_LINES = (b" ", b"\t", *_CHAINED)
# "SomeError: ..." or an exception's dotted name alone ("_queue.Empty", which a killed worker's partner printed).
_RAISED = re.compile(rb"[\w.]+(Error|Exception|Interrupt|Exit)\b|\w+(\.\w+)+$")
# A Dask worker's record of a failed task ("2026-11-30 15:48:12,384 - distributed.worker - ERROR - Compute Failed")
# and the fields it prints under it, the traceback in one line.
_DASK_FAILURE = re.compile(rb"\bdistributed\.worker - ERROR - Compute Failed$")
_REPORT_LINES = _TRACEBACK_LINES + (b"Key:", b"State:", b"Task:", b"Exception:", b"Traceback:")
# The warning a Dask worker logs for each of its tasks the failure cancelled, and the ERROR a worker logs when a peer
# it was fetching from died (a run that then goes on and succeeds, review50 L4: the nanny's "Restarting worker" says
# it).
_DASK_CANCELLED = re.compile(rb"\bdistributed\.worker\.state_machine - WARNING - Async instruction for <Task "
                             rb"cancelled .* ended with CancelledError$"
                             rb"|\bdistributed\.worker - ERROR - Worker stream died during communication: "
                             rb"\S+$")  # fmt: skip


# What the shell that starts each Beam worker process, and the C++ runtime, print when a worker is killed or aborts
# (dask50 F3): the command's one line says that a worker died.
_DEATH_NOTICE = re.compile(rb"(Killed|Aborted|Segmentation fault)( \(core dumped\))?|terminate called .*")


def _is_noise(line: bytes) -> bool:
    return any(noise.encode() in line for noise in _WORKER_NOISE) or _DEATH_NOTICE.fullmatch(line.strip()) is not None


# The packages whose threads in this process are Beam's launcher (its worker handlers, job service and gRPC servers).
_LAUNCHER_PACKAGES = ("apache_beam", "grpc")
# How Beam's launcher says a worker process ended (its `run_worker` thread's error; also in the run's own error).
WORKER_EXIT = re.compile(r"Worker subprocess exited with return code (-?\d+)")


class _LauncherThreads(_FirstToLast):
    """While a run block is active, `threading.excepthook` notes the exit code of each Beam worker process that
    ended with one, and, in quiet mode, keeps the uncaught exceptions of Beam's launcher threads off the terminal.

    Installed by the first of the blocks going on at once and put back by the last, since the hook is the
    process's. Other threads' exceptions go to the hook that was in place (dilstore's own bugs show).
    """

    def __init__(self) -> None:
        super().__init__(threading.Condition())  # notified as an exit code is noted
        self._previous: Callable[[threading.ExceptHookArgs], Any] = threading.excepthook
        self._exits: list[int] = []

    def _first(self) -> None:
        self._previous, self._exits = threading.excepthook, []
        threading.excepthook = self._hook

    def _last(self) -> None:
        threading.excepthook = self._previous

    def exit_codes(self, wait_seconds: float = 0.0) -> list[int]:
        """The exit codes of the Beam worker processes that ended with one, in the order their threads said so;
        with none yet, waits up to `wait_seconds` for one."""
        with self._lock:
            self._lock.wait_for(lambda: bool(self._exits), wait_seconds)
            return list(self._exits)

    def _hook(self, arguments: threading.ExceptHookArgs) -> None:
        if not _runs_launcher_code(arguments.exc_traceback):
            self._previous(arguments)
            return
        exited = WORKER_EXIT.search(str(arguments.exc_value))
        if exited:
            with self._lock:
                self._exits.append(int(exited.group(1)))
                self._lock.notify_all()
        if not is_quiet():
            self._previous(arguments)


_LAUNCHER_THREADS = _LauncherThreads()


def worker_exit_codes(wait_seconds: float = 0.0) -> list[int]:
    """The exit codes of the Beam worker processes that died during the run block now active (`filtered_stderr`),
    first first: the launcher's error line names the death that began a failure (dask50 F3). With none yet, waits
    up to `wait_seconds`: the launcher's main thread may see the lost channel before the worker's thread reports."""
    return _LAUNCHER_THREADS.exit_codes(wait_seconds)


def _runs_launcher_code(trace: TracebackType | None) -> bool:
    """Whether a traceback passes through Beam's or gRPC's code (a launcher thread's, not one of dilstore's)."""
    return any(str(frame.f_globals.get("__name__", "")).split(".")[0] in _LAUNCHER_PACKAGES
               for frame, _ in traceback.walk_tb(trace))  # fmt: skip


class DiagnosticStream:
    """A command's stderr whose writes that fail (a log file on a full disk) are dropped, not raised: what goes to
    stderr (progress bars, notes, the error line) is for the user to read, and one that cannot be written is no reason
    to end the work. `dilstore verify STORE 2> LOG` with LOG's disk full ended at the progress bar's first write (exit
    1, nothing on stdout), and `precompute` failed after the store was finalized, with no summary (disk56 F10).
    `lost` says whether anything was dropped. Every other attribute is the stream's."""

    def __init__(self, stream: Any) -> None:
        self.stream, self.lost = stream, False

    def write(self, text: str) -> int:
        try:
            return self.stream.write(text)
        except OSError:
            self.lost = True
            return len(text)

    def flush(self) -> None:
        try:
            self.stream.flush()
        except OSError:
            self.lost = True

    def close(self) -> None:
        try:
            self.stream.close()  # closed whether or not its last flush could be written
        except OSError:
            self.lost = True

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream, name)


@contextmanager
def diagnostics_kept_going() -> Iterator[DiagnosticStream | None]:
    """While the block runs, `sys.stderr` drops what it cannot write (`DiagnosticStream`). After a loss its descriptor
    is pointed at the null device, where the rest of its buffer goes: the interpreter's last flush of it failed, and
    the process exited 120 however the command ended.

    A closed stderr (`2>&-`), which Python makes `sys.stderr = None`, is left as it is (None): wrapped, every write
    to it was an AttributeError, and `dilstore info MISSING 2>&-` exited 1 with no word, where print() writes to
    stdout when its file is None and the error line was shown there, exit 2 (read56 F1)."""
    saved = sys.stderr
    if saved is None:
        yield None
        return
    stream = DiagnosticStream(saved)
    sys.stderr = stream  # type: ignore[assignment]
    try:
        yield stream
    finally:
        sys.stderr = saved
        if stream.lost and to_null_device(saved):
            with contextlib.suppress(OSError, ValueError):
                saved.flush()


def to_null_device(stream: Any) -> bool:
    """Point the descriptor `stream` writes to at the null device, so that what its buffer holds of writes that failed
    goes nowhere at its last flush; whether it had a descriptor (a test's capture object has none).

    The null device was opened before the stream's descriptor was asked for, and a stream without one left that
    descriptor open: one leaked per in-process `main()` whose output or stderr could not be written (read56 F2)."""
    try:
        descriptor = stream.fileno()
    except (OSError, ValueError, AttributeError):
        return False
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
    except OSError:
        return False
    try:
        os.dup2(devnull, descriptor)
    except OSError:
        return False
    finally:
        os.close(devnull)
    return True


def _writes_descriptor_2(stream: object) -> bool:
    """Whether a text stream writes to file descriptor 2 (not a capture object or another file)."""
    try:
        return stream.fileno() == 2  # type: ignore[attr-defined]
    except (AttributeError, OSError, ValueError):
        return False


@contextmanager
def records_unlogged(logger: str, drop: Callable[[logging.LogRecord], bool]) -> Iterator[None]:
    """Inside the block, the logger named `logger` drops the records `drop` picks."""
    log = logging.getLogger(logger)

    def keep(record: logging.LogRecord) -> bool:
        return not drop(record)

    log.addFilter(keep)
    try:
        yield
    finally:
        log.removeFilter(keep)


@contextmanager
def failures_unlogged() -> Iterator[None]:
    """Inside the block, Beam's own report of a failed run in this process stays off the terminal: a Ctrl-C's
    traceback always, and without --verbose any failure's (a traceback a failed bundle, and the worker logs the job
    service relays), which the launcher says in one line. Worker processes (`--workers 2` and more) print theirs
    on the stderr they inherit, where `filtered_stderr` leaves them out (`WorkerReports`)."""
    quiet = is_quiet()

    def relayed(record: logging.LogRecord) -> bool:  # a worker process's log, relayed by the job service
        return quiet and record.levelno >= logging.ERROR

    with records_unlogged("apache_beam.runners.common", raising(BaseException if quiet else KeyboardInterrupt)), \
            records_unlogged("apache_beam.runners.portability.local_job_service", relayed):  # fmt: skip
        yield


def raising(kind: type[BaseException]) -> Callable[[logging.LogRecord], bool]:
    """Picks the records of a `kind` exception (logged with its traceback): a stop the command reports in its own
    line."""

    def picked(record: logging.LogRecord) -> bool:
        return record.exc_info is not None and record.exc_info[0] is not None and issubclass(record.exc_info[0], kind)

    return picked
