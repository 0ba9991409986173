"""Standard output whose encoding cannot write every character: a Latin-1, GBK or EUC-JP locale, or ASCII (`LC_ALL=C`
with `PYTHONUTF8=0`, `PYTHONIOENCODING=ascii`).

Python writes stdout in the locale's encoding and fails on a character it lacks. A passage title, an answer, a
store's folder or a qid in another script then ended the command halfway through its output with "error: text that
is not valid UTF-8" (the text was valid; the terminal's encoding could not show it), and ended an `ask` session at
the first such answer (unicode56 F1). The command line writes such characters as Python escapes instead (`\\u6771`),
and JSON with its own escapes, so what it prints is whole and still reads back as the same JSON.
"""

from __future__ import annotations

import codecs
import json
import sys
from typing import Any, TextIO

# Codecs that write every code point a Python string made of Unicode text holds.
_WHOLE_UNICODE = frozenset({"utf-8", "utf-8-sig", "utf-16", "utf-16-le", "utf-16-be", "utf-32", "utf-32-le",
                            "utf-32-be", "gb18030"})  # fmt: skip


def writes_any_text(stream: TextIO) -> bool:
    """Whether `stream`'s encoding writes every character (a stream that names none, an `io.StringIO`, does)."""
    encoding = getattr(stream, "encoding", None)
    if not encoding:
        return True
    try:
        return codecs.lookup(encoding).name in _WHOLE_UNICODE
    except LookupError:
        return True


def escape_what_stdout_cannot_write() -> None:
    """Have stdout write a character its encoding lacks as a Python escape (`\\xe9`, `\\u6771`), not fail on it;
    and a UTF-8 stdout that fails on the lone surrogates a path's bytes that are not UTF-8 decode to (Python's
    default in a UTF-8 locale other than C.UTF-8) write those bytes as they were, as `ls` does. A file name in
    Latin-1 bytes in `evaluate-rank`'s or `info`'s table ended the command with "text that is not valid UTF-8"
    halfway through its output (unicode56 F10)."""
    stream = sys.stdout
    if stream is None or not hasattr(stream, "reconfigure"):
        return
    if not writes_any_text(stream):
        stream.reconfigure(errors="backslashreplace")
    elif stream.errors == "strict":
        utf8 = codecs.lookup(stream.encoding).name == "utf-8"
        stream.reconfigure(errors="surrogateescape" if utf8 else "backslashreplace")


def json_text(value: Any, stream: TextIO, **options: Any) -> str:
    """`json.dumps(value, **options)` for `stream`: characters as they are where it writes any text, JSON's escapes
    (`\\u00e9`, a surrogate pair for an emoji) where its encoding lacks some: a Python escape is no JSON. A lone
    surrogate (a path's byte that is not UTF-8) is always JSON's escape (`\\udcff`), never a raw byte in the JSON."""
    text = json.dumps(value, ensure_ascii=not writes_any_text(stream), **options)
    return text.encode("utf-8", "backslashreplace").decode("utf-8")
