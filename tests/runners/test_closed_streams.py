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
