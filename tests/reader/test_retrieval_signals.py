"""The JVM that BM25 search starts in-process leaves SIGINT and SIGTERM to Python.

Without `-Xrs` the JVM installs its own handlers for both: Ctrl-C then ends the process at once from Java
(exit 130), past every Python handler, `finally` block and the CLI's "interrupted" line. A Python program that
uses dilstore's search (a server, a notebook kernel) would lose its own handling of these signals.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

from tests.fixtures.paths import ROOT

# Handlers first, then the JVM: the order in which a server or a notebook meets them.
CHILD = textwrap.dedent(
    """
    import signal, sys, time
    caught = []
    for number in (signal.SIGINT, signal.SIGTERM):
        signal.signal(number, lambda got, frame: caught.append(got))
    from dilstore.reader.retrieval import start_jvm
    start_jvm()
    print("ready", flush=True)
    for number in (signal.SIGINT, signal.SIGTERM):
        deadline = time.monotonic() + 20
        while number not in caught and time.monotonic() < deadline:
            time.sleep(0.02)
    print("caught", sorted(caught), flush=True)
    """
)


def test_python_keeps_its_sigint_and_sigterm_handlers_once_the_jvm_runs() -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),  # a background job starts with it ignored
    )  # fmt: skip
    try:
        assert child.stdout is not None and child.stderr is not None
        ready = child.stdout.readline().strip()
        assert ready == "ready", child.stderr.read()[-2000:]
        child.send_signal(signal.SIGINT)
        child.send_signal(signal.SIGTERM)
        out, err = child.communicate(timeout=60)
    finally:
        child.kill()
    assert child.returncode == 0, f"the JVM took the signal (exit {child.returncode}): {err[-2000:]}"
    assert out.strip() == f"caught [{int(signal.SIGINT)}, {int(signal.SIGTERM)}]"
