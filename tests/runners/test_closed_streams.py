"""The command line's standard streams when they are closed or cannot be written (read56)."""

from __future__ import annotations

import errno
import io
import os
import subprocess
import sys
from pathlib import Path

import pytest


def test_a_command_run_with_stderr_closed_still_says_what_went_wrong(tmp_path: Path) -> None:
    """`dilstore info MISSING 2>&-`: Python makes a closed stderr `sys.stderr = None`, and print() to None writes to
    stdout. `diagnostics_kept_going` wrapped the None, every write was an AttributeError, and the command exited 1
    with no word at all (read56 F1); the error line is shown on stdout again, exit 2."""
    code = ("import os, sys\nos.close(2)\nsys.stderr = None\nfrom dilstore.runners.cli import main\n"
            "sys.exit(main(sys.argv[1:]))")  # fmt: skip
    result = subprocess.run([sys.executable, "-c", code, "info", str(tmp_path / "missing")], stdout=subprocess.PIPE,
                            timeout=120, text=True)  # fmt: skip
    assert result.returncode == 2, result.stdout
    assert "dilstore info: error:" in result.stdout and "missing" in result.stdout


def test_an_error_line_with_stderr_closed_is_shown_after_an_import_replaced_stderr(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """(left58 F6) transformers' first import replaces a None stderr with the null device, so `dilstore ask STORE Q
    2>&-` (and precompute, train, the evaluations, rerank, serve: every command that loads a model) exited 2 with
    no word where `info` showed its error line on stdout (read56 F1). The line goes where stderr was as the command
    started."""
    import argparse

    from dilstore.runners import cli
    from dilstore.storage.errors import DilstoreError

    def command(args: argparse.Namespace) -> int:
        sys.stderr = io.StringIO()  # as transformers.utils.logging does with a None stderr: open(os.devnull, "w")
        raise DilstoreError("no Lucene index at s/bm25")

    monkeypatch.setattr(sys, "stderr", None)
    assert cli._run(argparse.Namespace(command="ask", run=command), exits=False) == 2
    assert capsys.readouterr().out == "dilstore ask: error: no Lucene index at s/bm25\n"


class _FullStream(io.StringIO):
    """A stream on a full disk that is no file: a test's capture object whose writes fail."""

    def write(self, text: str) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    def flush(self) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")


def _open_descriptors() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="counts descriptors in /proc (Linux)")
def test_a_lost_output_or_stderr_without_a_descriptor_leaks_no_descriptor(monkeypatch) -> None:
    """`output_lost` and `diagnostics_kept_going` opened the null device before asking the stream for its
    descriptor; a stream without one (an in-process `main()` under a capture) left the null device open, one
    descriptor per call (read56 F2)."""
    from dilstore.runners.cli import output_lost
    from dilstore.runners.quiet import diagnostics_kept_going

    before = _open_descriptors()
    monkeypatch.setattr(sys, "stdout", _FullStream())
    assert output_lost()
    monkeypatch.setattr(sys, "stderr", _FullStream())
    with diagnostics_kept_going():
        print("a note", file=sys.stderr)
    monkeypatch.undo()
    assert _open_descriptors() == before


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full (Linux), whose writes fail with ENOSPC")
def test_an_unbuffered_output_on_a_full_disk_is_named_as_the_standard_output(tmp_path: Path) -> None:
    """With PYTHONUNBUFFERED=1 (as container images set it) the output keeps nothing that a second flush could fail
    on, and `dilstore info STORE > FILE` on a full disk said "error: No space left on device", naming nothing
    (read56 F5); buffered, it said which output it was (disk56 F2)."""
    import numpy as np

    from tests.fixtures.store_fixtures import build_store, passage

    store = build_store(tmp_path / "store", [[passage("p0", 3, (5,), np.random.default_rng(0))]], encoding="fp16")
    with open("/dev/full", "w") as full:
        finished = subprocess.run([sys.executable, "-m", "dilstore.runners.cli", "info", str(store)], stdout=full,
                                  stderr=subprocess.PIPE, text=True, timeout=120,
                                  env={**os.environ, "PYTHONUNBUFFERED": "1"})  # fmt: skip
    assert (finished.returncode, finished.stderr) == (2, "dilstore info: error: cannot write the output (standard "
                                                         "output): No space left on device\n")


def test_a_command_run_with_stdout_closed_ends_without_a_traceback(tmp_path: Path) -> None:
    """`dilstore info STORE >&-`: Python makes a closed stdout `sys.stdout = None`, print() to it writes nothing, and
    the command's last flush of its output (`sys.stdout.flush()`) ended in an AttributeError traceback, exit 1
    (read56 L, seen at 9236285 too). The output goes nowhere, as the user asked, and the command's status stands."""
    import numpy as np

    from tests.fixtures.store_fixtures import build_store, passage

    store = build_store(tmp_path / "store", [[passage("p0", 3, (5,), np.random.default_rng(0))]], encoding="fp16")
    code = ("import os, sys\nos.close(1)\nsys.stdout = None\nfrom dilstore.runners.cli import main\n"
            "sys.exit(main(sys.argv[1:]))")  # fmt: skip
    for command in (["info", str(store)], ["info", str(tmp_path / "missing")]):
        result = subprocess.run([sys.executable, "-c", code, *command], stderr=subprocess.PIPE, timeout=120,
                                text=True)  # fmt: skip
        assert "Traceback" not in result.stderr, result.stderr
        assert result.returncode == (0 if command[1] == str(store) else 2), result.stderr
