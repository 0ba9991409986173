"""The command line's standard streams when they are closed or cannot be written (read56)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


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
