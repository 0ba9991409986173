"""Progress bars in a log (obs57 F1): plain lines now and then, not a carriage-return frame every tenth of a second."""

from __future__ import annotations

import io
import re
from pathlib import Path

from tqdm import tqdm

from dilstore.reader.progress_lines import LOG_INTERVAL_SECONDS, bar_options, is_terminal

ROOT = Path(__file__).resolve().parents[2]


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_bar_in_a_log_writes_a_few_plain_lines_and_its_end() -> None:
    """(obs57 F1) With stderr redirected to a file, each bar wrote a carriage-return frame up to ten times a second:
    thousands of frames on one line of the log. Now its first and last state are lines, without a carriage return."""
    log = io.StringIO()
    with tqdm(total=5000, unit="passage", desc="precompute", **bar_options(log)) as bar:
        for _ in range(5000):
            bar.update()
    text = log.getvalue()
    assert "\r" not in text
    lines = text.splitlines()
    assert 1 <= len(lines) <= 3, lines
    assert "5000/5000" in lines[-1] and lines[-1] == lines[-1].rstrip()
    assert all(line.count("precompute:") == 1 for line in lines), lines  # one frame a line (mut57c)
    options = bar_options(log)
    assert options["mininterval"] == options["maxinterval"] == LOG_INTERVAL_SECONDS
    assert options["dynamic_ncols"] is False  # a log has no width to follow (mut57c)


def test_a_bar_on_a_terminal_is_redrawn_live() -> None:
    terminal = Terminal()
    assert bar_options(terminal, mininterval=0.5) == {"file": terminal, "mininterval": 0.5, "dynamic_ncols": True}
    closed = io.StringIO()
    closed.close()
    assert not is_terminal(closed)  # a closed stream's isatty raises ValueError: no terminal (mut57c)


class _KernelStream(io.StringIO):
    """As ipykernel.iostream.OutStream, a Jupyter kernel's stderr: no terminal, drawn by the notebook."""


_KernelStream.__module__ = "ipykernel.iostream"


class _Wrapper:
    """As runners.quiet.DiagnosticStream: the stream it keeps writing to is its `stream`."""

    def __init__(self, stream: io.StringIO) -> None:
        self.stream = stream

    def isatty(self) -> bool:
        return self.stream.isatty()


def test_a_bar_in_a_notebook_is_redrawn_live() -> None:
    """(read57 F2) A Jupyter kernel's stderr says it is no terminal: a notebook's `dilstore.verify` or evaluation
    wrote one line per 30 s, a bar that looked stuck, where it had been redrawn live; as a command's stderr is
    wrapped, so it may be."""
    kernel = _KernelStream()
    assert bar_options(kernel, mininterval=0.5) == {"file": kernel, "mininterval": 0.5, "dynamic_ncols": True}
    wrapped = _Wrapper(kernel)
    assert bar_options(wrapped)["file"] is wrapped  # type: ignore[arg-type]
    assert bar_options(_Wrapper(io.StringIO()))["mininterval"] == LOG_INTERVAL_SECONDS  # type: ignore[arg-type]


def test_every_progress_bar_takes_its_options_from_bar_options() -> None:
    """(obs57 F1) A bar made without them floods a log again. (time58 F5) Every bar is of a `steady_bar` class: a
    plain tqdm(...) stood still for an hour after the wall clock stepped back an hour."""
    sources = [*ROOT.glob("runners/*.py"), *ROOT.glob("reader/**/*.py"), *ROOT.glob("pipelines/**/*.py")]
    texts = {path: path.read_text() for path in sources}
    assert not [path for path, text in texts.items() if re.search(r"\btqdm\(", text)], "a bar not on steady_bar"
    calls = [(path, match) for path, text in texts.items()
             for match in re.finditer(r"\bsteady_bar\(tqdm\)\((.*?)\)[ :]", text, re.S)]  # fmt: skip
    assert len(calls) >= 9
    missing = [f"{path.relative_to(ROOT)}: tqdm({call.group(1)[:40]}" for path, call in calls
               if "bar_options(" not in call.group(1)]  # fmt: skip
    assert not missing, missing


def test_a_bar_on_a_closed_stderr_writes_nothing_and_ends_nothing(monkeypatch) -> None:
    """(read57 F3) With stderr closed (`2>&-`: `sys.stderr = None`) tqdm wrote to None, and `dilstore verify STORE
    2>&-` (every command whose bar is drawn by its main thread) ended at the bar's first frame, exit 1 without a
    word."""
    import sys

    monkeypatch.setattr(sys, "stderr", None)
    with tqdm(total=3, unit="passage", desc="verify", **bar_options()) as bar:
        bar.update(3)
    assert bar.n == 3
