"""Standard output whose encoding lacks characters (a Latin-1 or ASCII locale): commands print all they have to say,
other scripts as escapes, and their JSON reads back as the same JSON (unicode56 F1)."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from dilstore.reader.serving.answers import Answer, Span, Timings
from dilstore.runners.cmd_ask import print_answer
from dilstore.runners.terminal import escape_what_stdout_cannot_write, json_text, writes_any_text
from dilstore.storage.records import StoredPassage
from tests.fixtures.paths import ROOT
from tests.fixtures.store_fixtures import build_store, random_shards


def dilstore(arguments: list[str], encoding: str) -> subprocess.CompletedProcess[bytes]:
    """`python -m dilstore ARGUMENTS` with stdout and stderr in `encoding` (as in a locale of that encoding)."""
    env = {**os.environ, "PYTHONIOENCODING": encoding}
    return subprocess.run([sys.executable, "-m", "dilstore", *arguments], capture_output=True, cwd=ROOT, env=env,
                          timeout=120)  # fmt: skip


def test_evaluate_rank_prints_its_whole_table_in_an_ascii_locale(tmp_path: Path) -> None:
    """Before, the table stopped after Judged@10 and the command ended with exit 2 and "error: text that is not
    valid UTF-8: 'ascii' codec can't encode character '\\xe8'": the unjudged qid 'Genève' could not be shown."""
    (tmp_path / "qrels.txt").write_text("Zürich 0 d1 1\n", encoding="utf-8")
    (tmp_path / "run.trec").write_text("Zürich Q0 d1 1 2.0 t\nGenève Q0 d1 1 2.0 t\n", encoding="utf-8")
    done = dilstore(["evaluate-rank", "--qrels", str(tmp_path / "qrels.txt"), "--run", str(tmp_path / "run.trec")],
                    "ascii")  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert b"ignored: 'Gen\\xe8ve'" in done.stdout
    assert done.stderr == b""


@pytest.mark.parametrize("encoding", ["latin-1", "ascii"])
def test_info_json_of_a_store_in_a_folder_of_other_scripts_reads_back_in_any_locale(
    tmp_path: Path, encoding: str
) -> None:
    """Before, `info --json` printed nothing but "error: text that is not valid UTF-8": the folder's name was in
    its JSON as it is, which the locale's encoding could not write."""
    store = build_store(tmp_path / "Zürich 東京 😀", random_shards([2]))
    done = dilstore(["info", "--json", str(store)], encoding)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.decode("ascii"))["store"] == str(store)


def answer_in_other_scripts() -> Answer:
    """An answer whose passage, title and span hold a combining mark, CJK, right-to-left text and an emoji."""
    text = "Zu\u0308rich 東京都 שלום 😀 end"
    passage = StoredPassage(id="p 東京", title="Émoji 😀", text=text, token_ids=np.zeros(1, np.int32),
                            char_spans=np.zeros((1, 2), np.int32), states=np.zeros((0, 4), np.float32))  # fmt: skip
    start, end = text.index("東"), text.index(" end")
    span = Span(passage_id=passage.id, text=text[start:end], start_token=0, end_token=0, char_start=start,
                char_end=end, reader_score=1.0, bm25_score=2.0)  # fmt: skip
    return Answer(question="Wo? 😀", mu=0.5, nbest=(span,), timings=Timings(), passages={passage.id: passage})


def test_ask_json_on_a_stream_of_another_encoding_is_json_of_the_same_answer() -> None:
    """`ask --json` wrote the characters as they are, whatever the stream: the command line then wrote an emoji
    as the Python escape \\U0001f600, which is no JSON (before, the stream failed on it outright)."""
    answer = answer_in_other_scripts()
    read_with = {"encoding": "fp16", "online_variant": None}
    raw = io.BytesIO()
    out = io.TextIOWrapper(raw, encoding="latin-1", errors="backslashreplace", write_through=True)
    print_answer(answer, True, out, read_with, line=3)
    printed = json.loads(raw.getvalue().decode("latin-1"))
    assert printed == {"line": 3, **json.loads(json.dumps(answer.to_dict())), **read_with}
    span = printed["nbest"][0]
    assert printed["passages"][span["passage_id"]]["text"][span["char_start"] : span["char_end"]] == "東京都 שלום 😀"


def test_json_keeps_other_scripts_as_they_are_where_the_stream_writes_them() -> None:
    """On a UTF-8 stream (or one of no encoding) `ask --json`, `info --json` and `verify --json` stay readable."""
    utf8 = io.TextIOWrapper(io.BytesIO(), encoding="utf-8")
    assert writes_any_text(utf8) and writes_any_text(io.StringIO())
    assert not writes_any_text(io.TextIOWrapper(io.BytesIO(), encoding="latin-1"))
    assert json_text({"t": "東京 😀"}, utf8) == '{"t": "東京 😀"}'


def test_a_path_whose_name_is_not_utf8_is_printed_as_its_bytes_in_a_utf8_locale(tmp_path: Path) -> None:
    """(unicode56 F10) In a UTF-8 locale Python's stdout fails on the lone surrogates a name in Latin-1 bytes
    decodes to: `evaluate-rank` printed nothing but "error: text that is not valid UTF-8" for a qrels file so named,
    and `info --json` of a store in such a folder likewise. The table now holds the name's own bytes, as `ls`
    prints them, and the JSON the name as JSON's escapes, which decode to the same path."""
    qrels = tmp_path / os.fsdecode(b"qrels-\xe9.txt")
    qrels.write_text("q1 0 d1 1\n", encoding="utf-8")
    (tmp_path / "run.trec").write_text("q1 Q0 d1 1 2.0 t\n", encoding="utf-8")
    done = dilstore(["evaluate-rank", "--qrels", str(qrels), "--run", str(tmp_path / "run.trec")], "utf-8")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(b"qrels      " + os.fsencode(qrels) + b"\n")
    store = build_store(tmp_path / os.fsdecode(b"caf\xe9"), random_shards([2]))
    done = dilstore(["info", "--json", str(store)], "utf-8")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["store"] == str(store) and b"caf\\udce9" in done.stdout


@pytest.mark.parametrize("encoding", ["utf-8", "UTF8", "utf-8-sig", "utf-16", "utf-16-le", "utf-16-be", "utf-32",
                                      "utf-32-le", "utf-32-be", "gb18030"])  # fmt: skip
def test_every_encoding_that_writes_all_of_unicode_is_taken_as_one(encoding: str) -> None:
    """(mut56 M2, M4) Each codec of `_WHOLE_UNICODE` writes every character: a GB18030 (mainland Chinese) or UTF-16
    stream keeps JSON's characters as they are. Taken out of the set, such a terminal was shown escapes of text it
    could show, and no test said so. Latin-1 (codec name iso8859-1) is not one (mut56 M3b)."""
    stream = io.TextIOWrapper(io.BytesIO(), encoding=encoding)
    assert writes_any_text(stream)
    assert json_text({"t": "東京 😀"}, stream) == '{"t": "東京 😀"}'
    for narrow in ("latin-1", "iso8859-1", "cp1252", "ascii", "euc-jp"):
        assert not writes_any_text(io.TextIOWrapper(io.BytesIO(), encoding=narrow)), narrow


def test_a_stream_naming_an_encoding_python_does_not_know_is_written_as_it_is() -> None:
    """(mut56 M6) A stream object (a wrapper, a test double) may name an encoding that `codecs` cannot look up: its
    characters are kept, not escaped for a codec nobody knows to lack them."""

    class Named(io.StringIO):
        encoding = "no-such-codec"  # type: ignore[assignment]

    assert writes_any_text(Named())


@pytest.mark.parametrize(
    ("encoding", "errors", "after"),
    [
        ("utf-8", "strict", "surrogateescape"),  # a path's bytes written as they are, as `ls` writes them
        ("gb18030", "strict", "backslashreplace"),  # whole Unicode, but a lone surrogate's byte is no GB18030
        ("utf-16", "strict", "backslashreplace"),  # a lone byte would shift every character after it
        ("latin-1", "strict", "backslashreplace"),
        ("ascii", "replace", "backslashreplace"),
        ("utf-8", "replace", "replace"),  # chosen by the user (PYTHONIOENCODING=utf-8:replace): kept
        ("utf-8", "surrogateescape", "surrogateescape"),
    ],
)
def test_stdout_is_given_the_error_handler_its_encoding_needs(
    encoding: str, errors: str, after: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """(mut56 M11) Only a strict UTF-8 stdout writes a lone surrogate as its byte: a strict GB18030 or UTF-16 one,
    which writes all of Unicode, gets escapes, as a byte out of its encoding would make the rest unreadable."""
    stream = io.TextIOWrapper(io.BytesIO(), encoding=encoding, errors=errors)
    monkeypatch.setattr(sys, "stdout", stream)
    escape_what_stdout_cannot_write()
    assert stream.errors == after


@pytest.mark.parametrize("stdout", [None, io.StringIO()], ids=["none", "StringIO"])
def test_a_stdout_that_is_none_or_cannot_be_reconfigured_is_left_as_it_is(
    stdout: io.StringIO | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """(mut56 M12) `pythonw` and some embedders run with no stdout (None), and a program may have put an
    `io.StringIO` there: the command line leaves them be rather than fail before the command runs."""
    monkeypatch.setattr(sys, "stdout", stdout)
    escape_what_stdout_cannot_write()
    assert sys.stdout is stdout


@pytest.mark.parametrize(("folder", "encoding"), [("Zürich 東京 😀", "latin-1"), (os.fsdecode(b"caf\xe9"), "utf-8")])
def test_verify_json_of_a_store_in_a_folder_of_other_scripts_reads_back(
    tmp_path: Path, folder: str, encoding: str
) -> None:
    """(mut56 M18) `verify --json` names the store as `info --json` does, and goes through the same `json_text`: a
    JSON dump of its own printed nothing but "error: text that is not valid UTF-8" for a store in such a folder, in a
    Latin-1 locale or (a name in Latin-1 bytes) a UTF-8 one, and no test noticed."""
    store = build_store(tmp_path / folder, random_shards([2]))
    done = dilstore(["verify", "--json", str(store)], encoding)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.decode("ascii"))["store"] == str(store)
