"""Quiet by default (runners/quiet.py): the switches, the worker-noise filter, and what a command prints."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
import time
from multiprocessing import resource_tracker
from pathlib import Path

import pytest

from dilstore.runners import quiet
from dilstore.runners.stop_signals import STOP_GRACE_SECONDS, stopping
from tests.fixtures.pipeline_fixtures import save_tiny_reader, wiki_like_documents, write_jsonl

NOISE = "WARNING: apitools not found; Logging handler created."
KEPT = "a line a user wants to see"


def child_writes_to_stderr(*lines: str) -> None:
    """A child process (as a Beam worker is) that writes `lines` to its inherited descriptor 2."""
    code = "import sys\nfor line in sys.argv[1:]:\n    print(line, file=sys.stderr)"
    subprocess.run([sys.executable, "-c", code, *lines], check=True)


@pytest.fixture
def quiet_on(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(quiet.QUIET_ENV, "1")


def test_configure_sets_the_switches_for_child_processes_and_verbose_clears_them(monkeypatch) -> None:
    for name in (quiet.QUIET_ENV, "TRANSFORMERS_VERBOSITY", "HF_HUB_DISABLE_PROGRESS_BARS"):
        monkeypatch.delenv(name, raising=False)
    quiet.configure(verbose=False)
    assert quiet.is_quiet()
    assert os.environ["TRANSFORMERS_VERBOSITY"] == "error" and os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] == "1"
    quiet.configure(verbose=True)
    assert not quiet.is_quiet()


def test_configure_also_quiets_a_transformers_imported_before_it() -> None:
    """A Python caller may import transformers before a command runs; quiet mode reaches it all the same."""
    from transformers.utils import logging as hf_logging

    before = (hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled())
    hf_logging.set_verbosity_warning()
    hf_logging.enable_progress_bar()
    try:
        quiet.configure(verbose=False)
        assert (hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()) == (hf_logging.ERROR, False)
    finally:
        hf_logging.set_verbosity(before[0])
        (hf_logging.enable_progress_bar if before[1] else hf_logging.disable_progress_bar)()


def test_a_child_process_noise_line_is_dropped_and_its_other_lines_kept(quiet_on, capfd) -> None:
    with quiet.filtered_stderr():
        child_writes_to_stderr(NOISE, KEPT, "bigquery client libraries are not available")
    err = capfd.readouterr().err
    assert KEPT in err
    assert "apitools" not in err and "bigquery" not in err


def test_a_last_line_without_its_newline_is_kept(quiet_on, capfd) -> None:
    with quiet.filtered_stderr():
        subprocess.run([sys.executable, "-c", f"import sys; sys.stderr.write({KEPT!r})"], check=True)
    assert capfd.readouterr().err == KEPT



def test_a_noise_line_that_ends_the_output_without_its_newline_is_dropped_too(quiet_on, capfd) -> None:
    """The last line is filtered as every other: a worker's noise, or its death notice, that ends without a newline
    stays off the terminal."""
    for last in (NOISE, "Killed"):
        with quiet.filtered_stderr():
            subprocess.run([sys.executable, "-c", f"import sys; sys.stderr.write({KEPT + chr(10) + last!r})"],
                           check=True)  # fmt: skip
        assert capfd.readouterr().err == KEPT + "\n"

def test_what_child_processes_print_once_a_stop_has_come_is_dropped(quiet_on, capfd) -> None:
    """Ctrl-C reached Beam's workers too, and their tracebacks printed above the command's one line."""
    try:
        with quiet.filtered_stderr():
            child_writes_to_stderr(KEPT)
            shown = wait_for_stderr(capfd, KEPT)  # shown once its grace has passed without a stop
            stopping.set()
            child_writes_to_stderr("Traceback (most recent call last):", "KeyboardInterrupt")
    finally:
        stopping.clear()
    assert shown + capfd.readouterr().err == KEPT + "\n"


def test_what_arrives_just_before_a_stop_is_dropped_too(quiet_on, capfd) -> None:
    """(mut59b M10) A stop reaches the workers as it reaches this process, so their tracebacks may come first: a
    chunk is held for its grace, and only the test of a stop set before the workers wrote was there; the copier
    could show each chunk at once, and no test noticed."""
    try:
        with quiet.filtered_stderr():
            os.write(2, KEPT.encode() + b"\n")  # as a worker's (its last words), on the same pipe
            time.sleep(STOP_GRACE_SECONDS / 10)
            stopping.set()
    finally:
        stopping.clear()
    assert capfd.readouterr().err == ""


def test_what_child_processes_write_is_drained_as_fast_as_they_write_it(quiet_on, capfd) -> None:
    """(ci59 F7) The copier waited out each chunk's grace before it read the next: child processes' stderr went
    through at 64 KiB per 0.2 s, and a child that wrote 4 MB waited some 13 s on the full pipe."""
    code = "import os\nfor _ in range(4096):\n    os.write(2, b'x' * 1023 + b'\\n')\n"
    with quiet.filtered_stderr():
        started = time.monotonic()
        subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
        took = time.monotonic() - started
    assert capfd.readouterr().err == ("x" * 1023 + "\n") * 4096
    assert took < 5, f"4 MB took {took:.1f} s to go through the filter"


def test_a_child_that_floods_stderr_waits_on_a_stalled_terminal_not_the_commands_memory(quiet_on) -> None:
    """(read59 F1) The pipe's reader queued what it read without bound: under a terminal that took nothing (Ctrl-S,
    a paused pager) or a copier slower than the child, a child's stderr piled up in the command's memory, 147 MB
    for a 128 MB flood, where the full pipe had made the child wait. A child that writes 64 MB from a thread now
    gets only the backlog's 4 MiB (and the pipes') through in 0.3 s."""
    code = ("import os, sys, threading, time\nwritten = 0\ndef flood():\n    global written\n"
            "    for _ in range(1024):\n        written += os.write(2, b'x' * 65535 + b'\\n')\n"
            "threading.Thread(target=flood, daemon=True).start()\ntime.sleep(0.3)\n"
            "print(written, flush=True)\nos._exit(0)\n")  # fmt: skip
    resource_tracker.ensure_running()  # as the filter starts it: first, so that it does not hold the stalled pipe
    stalled_read, stalled_write = os.pipe()  # the terminal: nothing reads it until the child has said how far it got
    saved = os.dup(2)
    os.dup2(stalled_write, 2)
    os.close(stalled_write)
    drained = threading.Thread(target=lambda: all(iter(lambda: os.read(stalled_read, 1 << 20), b"")))
    try:
        with quiet.filtered_stderr():
            try:
                written = int(subprocess.run([sys.executable, "-c", code], check=True, stdout=subprocess.PIPE,
                                             timeout=60).stdout)  # fmt: skip
            finally:
                drained.start()  # the terminal takes its output again, so the block can end
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        drained.join(timeout=30)
        os.close(stalled_read)
    assert 0 < written <= 16 << 20, f"{written:,} bytes of a child's stderr were taken while the terminal took none"


def wait_for_stderr(capfd: pytest.CaptureFixture[str], text: str, seconds: float = 30.0) -> str:
    """What reached stderr up to `text` (read as it comes, so that a busy machine cannot make a timing fail)."""
    shown, deadline = "", time.monotonic() + seconds
    while text not in shown and time.monotonic() < deadline:
        time.sleep(STOP_GRACE_SECONDS / 10)
        shown += capfd.readouterr().err
    return shown


def test_verbose_lets_the_noise_through(monkeypatch, capfd) -> None:
    monkeypatch.delenv(quiet.QUIET_ENV, raising=False)
    with quiet.filtered_stderr():
        child_writes_to_stderr(NOISE)
    assert NOISE in capfd.readouterr().err


def test_this_process_writes_reach_a_captured_sys_stderr(quiet_on, capsys) -> None:
    """A sys.stderr that is not descriptor 2 (pytest's capture here) keeps what the block writes to it."""
    captured_stream = sys.stderr
    with quiet.filtered_stderr():
        print("\rprogress 3/3", file=sys.stderr)
    assert sys.stderr is captured_stream
    assert "progress 3/3" in capsys.readouterr().err


def test_this_process_writes_on_descriptor_2_pass_unfiltered(tmp_path: Path) -> None:
    """In a real process, sys.stderr writes (even a noise-like one) go straight to the terminal's descriptor."""
    code = (
        "import os, sys\n"
        f"os.environ[{quiet.QUIET_ENV!r}] = '1'\n"
        "from dilstore.runners.quiet import filtered_stderr\n"
        "with filtered_stderr():\n"
        f"    print({NOISE!r}, file=sys.stderr)\n"
        f"    os.write(2, b{(NOISE + chr(10))!r}.replace(b'WARNING', b'CHILD'))\n"
        "print('after', file=sys.stderr)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stderr.splitlines() == [NOISE, "after"]


def test_a_long_lived_process_started_in_the_block_does_not_hold_its_end_open() -> None:
    """multiprocessing's resource tracker, first started by Dask's LocalCluster inside the block, kept the pipe open
    for this process's life: every quiet Dask run waited the copier's 5 s timeout at the end."""
    code = (
        "import os, time\n"
        f"os.environ[{quiet.QUIET_ENV!r}] = '1'\n"
        "from multiprocessing import resource_tracker\n"
        "from dilstore.runners.quiet import filtered_stderr\n"
        "with filtered_stderr():\n"
        "    resource_tracker.ensure_running()\n"
        "    started = time.monotonic()\n"
        "print(f'{time.monotonic() - started:.2f}')\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert float(result.stdout) < 4.0, result.stdout  # the copier's timeout is 5 s; a loaded CI box needs margin


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full (Linux), whose writes fail with ENOSPC")
def test_a_stderr_on_a_full_disk_ends_no_filtered_block_and_its_pipe_is_still_drained() -> None:
    """With stderr on a full disk, this process's first write to it in the block raised, and the copier thread died
    at its first write and closed the pipe: a child process writing to stderr next died of the broken pipe (exit
    120), and `precompute 2> LOG` failed after its store was finalized, with no summary (disk56 F10). A child writes
    1 MB to descriptor 2 here, far past what a pipe holds."""
    code = (
        "import os, subprocess, sys\n"
        f"os.environ[{quiet.QUIET_ENV!r}] = '1'\n"
        "CHILD = sys.argv[1]\n"
        "from dilstore.runners.quiet import filtered_stderr\n"
        "with filtered_stderr():\n"
        "    print('a note', file=sys.stderr)\n"
        "    subprocess.run([sys.executable, '-c', CHILD], check=True, timeout=60)\n"
        "print('done')\n"
    )
    child = "import os\nfor _ in range(1024):\n    os.write(2, b'x' * 1023 + b'\\n')\n"
    environment = {key: value for key, value in os.environ.items() if key != "PYTHONUNBUFFERED"}
    with open("/dev/full", "w") as full:
        result = subprocess.run([sys.executable, "-c", code, child], stdout=subprocess.PIPE, stderr=full, text=True,
                                timeout=120, env=environment)  # fmt: skip
    assert (result.returncode, result.stdout) == (0, "done\n")


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full (Linux), whose writes fail with ENOSPC")
def test_a_command_whose_stderr_is_on_a_full_disk_does_its_work(tmp_path: Path) -> None:
    """`dilstore verify STORE 2> LOG` with LOG's disk full ended at its progress bar's first write: exit 1 and nothing
    on stdout (disk56 F10). What stderr cannot take is dropped; the work, its output and its exit status stand."""
    import numpy as np

    from tests.fixtures.store_fixtures import build_store, passage

    store = build_store(tmp_path / "store", [[passage("p0", 3, (5,), np.random.default_rng(0))]], encoding="fp16")
    environment = {key: value for key, value in os.environ.items() if key != "PYTHONUNBUFFERED"}
    with open("/dev/full", "w") as full:
        result = subprocess.run([sys.executable, "-m", "dilstore.runners.cli", "verify", str(store)],
                                stdout=subprocess.PIPE, stderr=full, text=True, timeout=120, env=environment)
    assert result.returncode == 0 and result.stdout.endswith("OK\n"), result.stdout


class _FullDisk:
    """A stream on a full disk: every write, flush and close fails, as /dev/full's do."""

    encoding = "utf-8"

    def write(self, text: str) -> int:
        raise OSError(28, "No space left on device")

    def flush(self) -> None:
        raise OSError(28, "No space left on device")

    def close(self) -> None:
        raise OSError(28, "No space left on device")


@pytest.mark.parametrize("call", ["write", "flush", "close"])
def test_a_diagnostic_stream_drops_what_fails_and_notes_the_loss(call: str) -> None:
    """Each of `DiagnosticStream`'s write, flush and close drops its stream's OSError and notes it in `lost`. A flush
    that fails where no write did (a progress bar's line without its newline, held in the buffer) must be noted too:
    unnoted, stderr is not pointed at the null device, and the exit-time flush of that buffer makes the status 120
    (mut56b M13)."""
    stream = quiet.DiagnosticStream(_FullDisk())
    assert not stream.lost and stream.encoding == "utf-8"  # what it does not drop is the stream's
    result = stream.write("\r 10%") if call == "write" else getattr(stream, call)()
    assert stream.lost and result == (5 if call == "write" else None)


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full (Linux), whose writes fail with ENOSPC")
def test_a_command_whose_error_line_is_lost_on_a_full_disk_keeps_its_exit_status(tmp_path: Path) -> None:
    """A command that writes only its error line to a stderr on a full disk exits with its own status (2), not the
    interpreter's 120 for a failed last flush: the write that failed is noted, and stderr is pointed at the null
    device (mut56b M11)."""
    environment = {key: value for key, value in os.environ.items() if key != "PYTHONUNBUFFERED"}
    with open("/dev/full", "w") as full:
        result = subprocess.run([sys.executable, "-m", "dilstore.runners.cli", "info", str(tmp_path / "absent")],
                                stdout=subprocess.PIPE, stderr=full, text=True, timeout=120, env=environment)
    assert (result.returncode, result.stdout) == (2, "")


def test_the_stderr_a_command_ran_with_is_put_back_after_it(capsys: pytest.CaptureFixture[str]) -> None:
    """`diagnostics_kept_going` puts its `DiagnosticStream` in place for the block only: a caller of `cli.main` in
    the same process (a test, a script) was left with a wrapped stderr, one more layer for every call (mut56b M17)."""
    saved = sys.stderr
    with quiet.diagnostics_kept_going() as stream:
        assert sys.stderr is stream and stream.stream is saved
    assert sys.stderr is saved
    with pytest.raises(RuntimeError), quiet.diagnostics_kept_going():
        raise RuntimeError("the command failed")
    assert sys.stderr is saved


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full (Linux), whose writes fail with ENOSPC")
def test_the_stderr_filter_outlives_a_last_line_it_cannot_write() -> None:
    """The copier's write of a last line without its newline drops a full disk's error too, as its other writes do:
    it raised in the copier thread (mut56b M21)."""
    code = (
        "import os, subprocess, sys, threading\n"
        f"os.environ[{quiet.QUIET_ENV!r}] = '1'\n"
        "threading.excepthook = lambda failure: print('the copier died:', failure.exc_type.__name__)\n"
        "from dilstore.runners.quiet import filtered_stderr\n"
        "with filtered_stderr():\n"
        "    subprocess.run([sys.executable, '-c', 'import os; os.write(2, b\"no newline\")'], check=True)\n"
        "print('done')\n"
    )
    environment = {key: value for key, value in os.environ.items() if key != "PYTHONUNBUFFERED"}
    with open("/dev/full", "w") as full:
        result = subprocess.run([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=full, text=True,
                                timeout=120, env=environment)  # fmt: skip
    assert (result.returncode, result.stdout) == (0, "done\n")


def test_precompute_with_verbose_shows_the_workers_library_noise(tmp_path: Path, capfd, monkeypatch) -> None:
    """The CLI end to end with two Beam worker processes, which log on their own stderr: --verbose shows their
    logging lines, so the quiet run's empty stderr (tests/pipelines/test_pipeline_run.py, the same two workers
    in-process) is the filter's doing. In-process as that test is: only the workers need a fresh interpreter.
    """
    from dilstore.runners import cli

    model = save_tiny_reader(tmp_path / "tiny")
    corpus = write_jsonl(tmp_path / "docs.jsonl", wiki_like_documents(6))
    for name in (quiet.QUIET_ENV, "TRANSFORMERS_VERBOSITY", "HF_HUB_DISABLE_PROGRESS_BARS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)
    capfd.readouterr()
    assert cli.main(["precompute", "--input", str(corpus), "--output", str(tmp_path / "verbose"), "--model",
                     str(model), "--max-length", "48", "--workers", "2", "--no-progress", "--verbose"]) == 0
    verbose_err = capfd.readouterr().err
    assert "apitools not found" in verbose_err and "Logging handler created" in verbose_err


def test_runs_that_overlap_put_the_logging_back_as_it_was_before_the_first() -> None:
    """Two `dilstore.precompute` calls in two threads that did not end in the reverse order they began left Beam's
    logger at ERROR and the noise filter on the root logger for good (review40 M1)."""
    beam, root = logging.getLogger("apache_beam"), logging.getLogger()
    level, filters = beam.level, list(root.filters)
    first, second = quiet.logging_restored(), quiet.logging_restored()
    first.__enter__()
    quiet.quiet_beam_logging()
    second.__enter__()
    quiet.quiet_beam_logging()
    first.__exit__(None, None, None)
    assert beam.level == logging.ERROR, "the second run is still going on: it stays quiet"
    second.__exit__(None, None, None)
    assert (beam.level, root.filters) == (level, filters)


def test_a_worker_s_failure_report_is_left_out_and_the_lines_after_it_are_kept() -> None:
    """A full disk with two worker processes printed 525 lines of their tracebacks above the run's one line
    (crash40 M3)."""
    printed = [
        b"ERROR:apache_beam.runners.worker.sdk_worker:Error processing instruction bundle_14. Original traceback is",
        b"Traceback (most recent call last):",
        b'  File "apache_beam/runners/common.py", line 1512, in process',
        b"    ^^^^^^^^^^^^",
        b"OSError: [Errno 28] No space left on device",
        b"",
        b"During handling of the above exception, another exception occurred:",
        b"",
        b"Traceback (most recent call last):",
        b'  File "sdk_worker.py", line 310, in _execute',
        b"RuntimeError: OSError: [Errno 28] No space left on device [while running 'Precompute/WriteGroups']",
        b"a worker's own line",
        b"WARNING: apitools not found; Logging handler created.",
        b"  an indented line of its own",
    ]
    reports = quiet.WorkerReports()
    assert [line for line in printed if not reports.dropped(line)] == [b"a worker's own line",
                                                                        b"  an indented line of its own"]  # fmt: skip


def test_a_dask_worker_s_compute_failed_report_is_left_out_and_the_lines_after_it_are_kept() -> None:
    """On Dask a failed run printed the worker's "Compute Failed" record and its traceback above the run's one line
    (pipe48 F6)."""
    printed = [
        b"2026-11-30 15:48:12,384 - distributed.worker - ERROR - Compute Failed",
        b"Key:       ('from_sequence-apply_dofn_to_bundle-117201e8e6ade2da', 1)",
        b"State:     executing",
        b"Task:  <Task ('from_sequence-apply_dofn_to_bundle-117201e8e6ade2da', 1) _execute_subgraph(...)>",
        b"Exception: \"RecursionError('maximum recursion depth exceeded while decoding a JSON array')\"",
        b"Traceback: '  File \"transform_evaluator.py\", line 196, in apply_dofn_to_bundle\\n    do_fn_invoker...'",
        b"",
        b"2026-11-30 15:48:12,703 - distributed.worker.state_machine - WARNING - Async instruction for <Task "
        b"cancelled name=\"execute(('apply_dofn_to_bundle-concat', 0, (7,)))\" coro=<Worker.execute() done, defined "
        b"at worker_state_machine.py:3606>> ended with CancelledError",
        b"2026-11-30 21:52:34,659 - distributed.worker - ERROR - Worker stream died during communication: "
        b"tcp://127.0.0.1:44233",  # a peer's death, on a run that goes on (review50 L4)
        b"2026-11-30 15:48:12,703 - distributed.scheduler - WARNING - a line of its own",
        b"Key: a line that is no report's",
    ]
    reports = quiet.WorkerReports()
    assert [line for line in printed if not reports.dropped(line)] == printed[-2:]


def test_what_a_killed_beam_worker_s_wrapper_and_partner_print_is_left_out() -> None:
    """A worker SIGKILLed mid-run: its shell printed "Killed", its partner's C++ runtime "terminate called ..." and
    "Aborted", and the partner's traceback ended at "_queue.Empty", so the chained traceback after it printed
    (dask50 F3)."""
    printed = [
        b"Traceback (most recent call last):",
        b'  File "queue.py", line 179, in get',
        b"_queue.Empty",
        b"",
        b"During handling of the above exception, another exception occurred:",
        b"",
        b"Traceback (most recent call last):",
        b'  File "sdk_worker.py", line 310, in _execute',
        b"terminate called without an active exception",
        b"Aborted",
        b"Killed",
        b"Aborted (core dumped)",
        b"a worker's own line",
        b"Killed 3 tasks",
    ]
    reports = quiet.WorkerReports()
    assert [line for line in printed if not reports.dropped(line)] == printed[-2:]


def launcher_thread(message: str, module: str = "apache_beam.runners.portability.local_job_service") -> None:
    """Runs a thread that raises RuntimeError(`message`) from a function of `module` (as Beam's `run_worker` thread
    does when its worker process dies), and waits for it."""
    namespace: dict[str, object] = {"__name__": module}
    exec(f"def run():\n    raise RuntimeError({message!r})\n", namespace)  # a frame whose module is `module`
    thread = threading.Thread(target=namespace["run"], name="run_worker")
    thread.start()
    thread.join()


@pytest.fixture
def excepthook(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The exception messages that reach the hook in place before a run block (the terminal's, here a list)."""
    shown: list[str] = []
    monkeypatch.setattr(threading, "excepthook", lambda arguments: shown.append(str(arguments.exc_value)))
    return shown


def test_a_beam_launcher_thread_s_exception_is_kept_off_the_terminal_and_its_exit_code_noted(
    quiet_on, excepthook
) -> None:
    """Beam's `run_worker`, `beam_control_read` threads printed their tracebacks through threading.excepthook, past
    the stderr filter (dask50 F3); other threads' exceptions still show."""
    with quiet.filtered_stderr():
        launcher_thread("Worker subprocess exited with return code 137")
        launcher_thread("", module="grpc._server")
        launcher_thread("Worker subprocess exited with return code 134")
        launcher_thread("a bug of dilstore's", module="dilstore.runners.progress")
        noted = quiet.worker_exit_codes()
    assert excepthook == ["a bug of dilstore's"]
    assert noted == [137, 134]
    launcher_thread("after the block")
    assert excepthook[-1] == "after the block", "the hook is put back"


def test_verbose_shows_a_launcher_thread_s_exception_and_still_notes_its_exit_code(monkeypatch, excepthook) -> None:
    monkeypatch.delenv(quiet.QUIET_ENV, raising=False)
    with quiet.filtered_stderr():
        launcher_thread("Worker subprocess exited with return code 137")
        noted = quiet.worker_exit_codes()
    assert (excepthook, noted) == (["Worker subprocess exited with return code 137"], [137])


def dask_scheduler_records() -> list[logging.LogRecord]:
    """What the Dask scheduler logs as its workers die, and a record of its own."""
    keys = {("shuffle-split-7c379385df8f19ee4df6b8880090b4ca", 1, n, (n,)) for n in range(55)}
    return [
        logging.LogRecord("distributed.scheduler", logging.WARNING, __file__, 0,
                          f"Removing worker 'tcp://127.0.0.1:38349' caused the cluster to lose already computed "
                          f"task(s), which will be recomputed elsewhere: {keys} (stimulus_id='handle-worker-cleanup')",
                          None, None),
        logging.LogRecord("distributed.scheduler", logging.ERROR, __file__, 0,
                          "Task %s marked as failed because %d workers died while trying to run it",
                          (("from_sequence-apply_dofn_to_bundle-87e4", 0), 4), None),
        logging.LogRecord("distributed.scheduler", logging.WARNING, __file__, 0, "a record of its own", None, None),
    ]  # fmt: skip


def dask_scheduler_shows(verbose: bool, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The messages of `dask_scheduler_records` that the scheduler's logger passes to its handlers in a run block."""
    if verbose:
        monkeypatch.delenv(quiet.QUIET_ENV, raising=False)
    else:
        monkeypatch.setenv(quiet.QUIET_ENV, "1")
    scheduler = logging.getLogger("distributed.scheduler")
    shown: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: shown.append(record.getMessage())  # type: ignore[method-assign]
    monkeypatch.setattr(scheduler, "handlers", [handler])
    monkeypatch.setattr(scheduler, "propagate", False)
    with quiet.filtered_stderr():
        for record in dask_scheduler_records():
            scheduler.handle(record)
    return shown


def test_the_dask_scheduler_s_records_of_a_lost_worker_s_tasks_are_left_out(monkeypatch) -> None:
    """Dask's LocalCluster scheduler, in the launcher, logged a 4.7 KB line of task keys for each worker that died
    and an ERROR for each task its workers died running, above the run's one line (dask50 F4)."""
    assert dask_scheduler_shows(verbose=False, monkeypatch=monkeypatch) == ["a record of its own"]


def test_verbose_shows_the_dask_scheduler_s_records(monkeypatch) -> None:
    assert len(dask_scheduler_shows(verbose=True, monkeypatch=monkeypatch)) == 3
