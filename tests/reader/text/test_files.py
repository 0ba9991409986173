"""Text files read by line or as JSON: errors name the file, the line and the byte, counted from 1 like lines."""

from __future__ import annotations

import bz2
import gzip
import re
from pathlib import Path

import pytest

from dilstore.reader.text.files import numbered_lines, read_json
from dilstore.storage.errors import DilstoreError


def test_a_byte_that_is_not_utf8_is_counted_from_one_like_the_line(tmp_path: Path) -> None:
    """The first byte of a line was "byte 0", beside line numbers that start at 1."""
    path = tmp_path / "run.trec"
    path.write_bytes(b"q1 Q0 d1 1 1.0 t\n\xffq2 Q0 d1 1 1.0 t\n")
    with pytest.raises(DilstoreError, match=re.escape(f"{path}:2: not UTF-8 text (byte 1 of the line)")):
        list(numbered_lines(path))
    json_file = tmp_path / "data.json"
    json_file.write_bytes(b'{"a": "\xff"}')
    with pytest.raises(DilstoreError, match=re.escape(f"{json_file}: not UTF-8 text (byte 8)")):
        read_json(json_file)


@pytest.mark.parametrize(("compress", "name"), [(gzip.compress, "gzip"), (bz2.compress, "bzip2")])
def test_a_compressed_file_given_as_text_is_named_as_compressed(tmp_path: Path, compress, name: str) -> None:
    """A gzipped question file was "not UTF-8 text (byte 1)"."""
    path = tmp_path / "questions.jsonl.gz"
    path.write_bytes(compress(b'{"question": "q?", "answer": ["a"]}\n' * 50))
    message = re.escape(f"{path}: a {name}-compressed file, read here as plain text; decompress it first")
    with pytest.raises(DilstoreError, match=message):
        list(numbered_lines(path))
    with pytest.raises(DilstoreError, match=message):
        read_json(path)


def test_text_that_begins_like_bzip2_is_read_as_text(tmp_path: Path) -> None:
    """bzip2's magic "BZh" is text: a topics file whose first query id was BZh1 was refused as compressed."""
    path = tmp_path / "topics.tsv"
    path.write_text("BZh1\twhat is bzip2?\n", encoding="utf-8")
    assert list(numbered_lines(path)) == [(1, "BZh1\twhat is bzip2?\n")]


@pytest.mark.parametrize(("encoding", "named"), [("utf-16", "UTF-16"), ("utf-16-le", "UTF-16LE"),
                                               ("utf-16-be", "UTF-16BE"), ("utf-32", "UTF-32"),
                                               ("utf-32-le", "UTF-32LE"), ("utf-32-be", "UTF-32BE")])  # fmt: skip
def test_a_utf16_file_is_named_as_utf16_whatever_reads_it(tmp_path: Path, encoding: str, named: str) -> None:
    """(left57 F3) Question, qrels, run and topics files saved as UTF-16 (Windows "Unicode", PowerShell's `>`) got
    precompute's "looks like UTF-16, convert it" only as a corpus: evaluate-rank and the others said "not UTF-8 text
    (byte 1 of the line)", and one without a byte-order mark was read on ("grade '\\x001\\x00' is not an integer").
    Every file read by line or as JSON now gets the corpus's words; UTF-8 text holding NULs is still read.

    (left58 F1) A UTF-32 file was called UTF-16, and the hint's `iconv -f UTF-16` gave a file refused as UTF-16
    again; the hint now names what `iconv -f` reads it as, with the byte order where no byte-order mark says it."""
    message = re.escape(f"it looks like {named[:6]} text; dilstore reads its input files as UTF-8: convert it (e.g. "
                        f"`iconv -f {named} -t UTF-8`)")
    qrels = tmp_path / "test.qrels"
    qrels.write_bytes("1 0 d1 1\n2 0 d2 1\n".encode(encoding))
    with pytest.raises(DilstoreError, match=f"^{re.escape(str(qrels))}: {message}$"):
        list(numbered_lines(qrels))
    squad = tmp_path / "dev.json"
    squad.write_bytes('{"version": "1.1", "data": []}'.encode(encoding))
    with pytest.raises(DilstoreError, match=f"^{re.escape(str(squad))}: {message}$"):
        read_json(squad)
    qrels.write_bytes(b"1\x00 0 d1 1\n")  # a NUL byte in UTF-8 text is no sign of UTF-16
    assert list(numbered_lines(qrels)) == [(1, "1\x00 0 d1 1\n")]
    # (mut57c) A blank first line is too short to tell UTF-16 by, and only the first line is looked at: a later one
    # of NUL-spaced letters is UTF-8 text as it stands.
    qrels.write_bytes(b"\n1 0 d1 1\na\x00b\x00c\x00d\x00\n")
    assert list(numbered_lines(qrels)) == [(1, "\n"), (2, "1 0 d1 1\n"), (3, "a\x00b\x00c\x00d\x00\n")]
