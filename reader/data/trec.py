"""TREC ranking files: topics, runs and qrels in, runs out.

Plain functions over plain dicts, so evaluation, reranking and pipelines share
one parser. A run is `{qid: {docid: score}}` and qrels are
`{qid: {docid: grade}}`, the shapes ir_measures and pytrec_eval take.
Every malformed line is a DilstoreError that names the file, the 1-based line
and what is wrong; blank lines are skipped.

Formats:
- topics: `qid<TAB>query`, one query per line (MS MARCO / pyserini TSV);
- run: `qid Q0 docid rank score tag`, 6 whitespace-separated columns;
- qrels: `qid 0 docid grade`, 4 whitespace-separated columns.
The second column of runs and qrels (`Q0`, `0`) is not checked, as trec_eval
does not check it either. The rank column must be an integer but is not
kept: trec_eval orders documents by score, and so does everything here.
"""

from __future__ import annotations

import math
import unicodedata
from collections.abc import Callable, Iterator, Mapping, Sequence
from numbers import Integral
from pathlib import Path
from typing import Any

from dilstore.reader.text.files import numbered_lines
from dilstore.reader.text.surrogates import lone_surrogate
from dilstore.storage.atomic_files import atomic_write_text
from dilstore.storage.checks import finite_float
from dilstore.storage.errors import DilstoreError
from dilstore.storage.messages import listed, shown

Run = dict[str, dict[str, float]]
Qrels = dict[str, dict[str, int]]

RUN_COLUMNS = "qid Q0 docid rank score tag"
QRELS_COLUMNS = "qid 0 docid grade"
_INT32_MIN, _INT32_MAX = -(2**31), 2**31 - 1
# The largest grade read. trec_eval (under pytrec_eval) keeps a count for every grade up to a query's largest: a grade
# of 2**24 took 2.4 s and 157 MB for 100 queries, one of 2**30 was a segmentation fault under `ulimit -v 8000000`, and
# 2**31 - 1 overflowed, scoring a relevant first document nDCG@10 0 (fuzz60 F16). Real qrels grade 0-4.
MAX_GRADE = 2**20


def read_topics(path: str | Path) -> dict[str, str]:
    """`{qid: query}` from a `qid<TAB>query` file, in file order; a qid may appear only once."""
    path = Path(path)
    topics: dict[str, str] = {}
    first_line: dict[str, int] = {}
    for number, line in _numbered_lines(path):
        columns = line.split("\t")
        if len(columns) != 2:
            raise DilstoreError(
                f"{path}:{number}: expected 2 tab-separated columns (qid, query), found {len(columns)}"
            )
        qid, query = columns[0].strip(), columns[1].strip()
        if not qid:
            raise DilstoreError(f"{path}:{number}: empty qid")
        if not query:
            raise DilstoreError(f"{path}:{number}: empty query for qid {qid!r}")
        if qid in topics:
            raise DilstoreError(f"{path}:{number}: qid {qid!r} appears twice (first on line {first_line[qid]})")
        topics[qid], first_line[qid] = query, number
    return topics


def read_run(path: str | Path) -> Run:
    """`{qid: {docid: score}}` from a TREC run; a document may appear only once per query."""
    return read_ranked_run(path)[0]


def read_ranked_run(path: str | Path) -> tuple[Run, list[str]]:
    """`read_run`'s run, and the qids whose rank column orders their documents otherwise than their scores do.

    Documents are ranked by score (descending, ties by docid descending), as
    trec_eval ranks them, and the rank column is checked, not used. A tool that
    writes constant scores and keeps the order in the ranks then has its top
    documents taken from the wrong end: the caller says so (rank48 F4).
    """
    path = Path(path)
    run: Run = {}
    ranks: dict[str, dict[str, int]] = {}
    for number, line in _numbered_lines(path):
        columns = _columns(path, number, line, 6, RUN_COLUMNS)
        qid, docid, rank, score = columns[0], columns[2], columns[3], columns[4]
        ranked = _integer(path, number, "rank", rank)
        value = _score(path, number, score)
        docs = run.setdefault(qid, {})
        if docid in docs:
            raise DilstoreError(f"{path}:{number}: docid {docid!r} appears twice for qid {qid!r}")
        docs[docid] = value
        ranks.setdefault(qid, {})[docid] = ranked
    disagreeing = [qid for qid, scores in run.items() if _ranks_disagree(scores, ranks[qid])]
    return run, disagreeing


def _ranks_disagree(scores: dict[str, float], ranks: dict[str, int]) -> bool:
    """Whether the ranks order some two documents otherwise than `rank_documents` does. Documents of one rank are
    not ordered by it (a run of all ranks 0), so they keep the score order; one repeated rank among distinct ones
    does not hide the others' disagreement (review48 F4)."""
    by_score = [docid for docid, _ in rank_documents(scores)]
    place = {docid: index for index, docid in enumerate(by_score)}
    return sorted(by_score, key=lambda docid: (ranks[docid], place[docid])) != by_score


def rank_order_warning(path: str | Path, disagreeing: Sequence[str], queries: int) -> str | None:
    """The warning for `read_ranked_run`'s disagreeing qids, or None when there are none."""
    if not disagreeing:
        return None
    return (f"warning: in {path}, the rank column orders the documents of {len(disagreeing)} of {queries} "
            f"queries otherwise than their scores ({listed(list(disagreeing))}); documents are taken by score, "
            "highest first and ties by docid descending, as trec_eval ranks them")


def unicode_form_warning(qrels: Qrels, run: Run) -> str | None:
    """A warning naming the run's qids and docids that are the qrels' only in another Unicode form (NFC), or None.

    Ids are matched code point by code point, as trec_eval matches them, and the two forms of `Zürich` (one `ü`,
    or `u` and a combining diaeresis, as macOS writes file names) print alike: such a query was scored as unjudged
    and such a document as not relevant, and the metrics fell without a word (unicode56 F5).
    """
    judged_qids = {_composed(qid): qid for qid in qrels}
    qids = [(qid, judged_qids[_composed(qid)]) for qid in run if qid not in qrels and _composed(qid) in judged_qids]
    docids = []
    for qid, documents in run.items():
        judged = qrels.get(qid) or qrels.get(judged_qids.get(_composed(qid), qid)) or {}
        forms = {_composed(docid): docid for docid in judged}
        docids += [(docid, forms[_composed(docid)]) for docid in documents
                   if docid not in judged and _composed(docid) in forms]  # fmt: skip
    if not qids and not docids:
        return None
    run_id, judged_id = (qids or docids)[0]
    return (f"warning: {len(qids)} qid(s) and {len(docids)} docid(s) of the run are the qrels' only in another "
            f"Unicode form (the run's {ascii(run_id):.80}, the qrels' {ascii(judged_id):.80}); ids are matched code "
            "point by code point, as trec_eval matches them, so those queries count as unjudged and those documents "
            "as not relevant: write both files in one form (NFC)")


def _composed(text: str) -> str:
    """`text` in Unicode's composed form (NFC); an ASCII id as it is, without a look at its characters."""
    return text if text.isascii() else unicodedata.normalize("NFC", text)


def read_qrels(path: str | Path) -> Qrels:
    """`{qid: {docid: grade}}` from TREC qrels; a document may be judged only once per query."""
    path = Path(path)
    qrels: Qrels = {}
    for number, line in _numbered_lines(path):
        columns = _columns(path, number, line, 4, QRELS_COLUMNS)
        qid, docid = columns[0], columns[2]
        grade = _integer(path, number, "grade", columns[3])
        if grade > MAX_GRADE:
            raise DilstoreError(f"{path}:{number}: grade {grade} is above {MAX_GRADE:,}, the largest this scores")
        judged = qrels.setdefault(qid, {})
        if docid in judged:
            raise DilstoreError(f"{path}:{number}: docid {docid!r} is judged twice for qid {qid!r}")
        judged[docid] = grade
    return qrels


def run_from_mapping(run: Mapping[str, Mapping[str, float]]) -> Run:
    """A checked copy of a run given as `{qid: {docid: score}}`: scores must be finite numbers, as in a file."""
    return _from_mapping("run", run, "a finite score", finite_float)


def qrels_from_mapping(qrels: Mapping[str, Mapping[str, int]]) -> Qrels:
    """A checked copy of qrels given as `{qid: {docid: grade}}`: grades must be 32-bit integers of at most MAX_GRADE,
    as in a file."""
    return _from_mapping("qrels", qrels, f"a 32-bit integer grade of at most {MAX_GRADE:,}", _grade)


def _from_mapping(
    what: str, mapping: Mapping[str, Mapping[str, Any]], expected: str, convert: Callable[[Any], Any]
) -> dict[str, dict[str, Any]]:
    """`{qid: {docid: convert(value)}}`, or a DilstoreError naming the first entry that is not of that shape.

    pytrec_eval takes a string score, NaN or a grade beyond 32 bits without a
    word and scores them wrongly, so each value is checked here.
    """
    if not isinstance(mapping, Mapping):
        raise DilstoreError(f"the {what} must be a file path or a {{qid: {{docid: value}}}} mapping, got "
                            f"{type(mapping).__name__}")  # fmt: skip
    checked: dict[str, dict[str, Any]] = {}
    for qid, documents in mapping.items():
        if not isinstance(qid, str) or not isinstance(documents, Mapping):
            raise DilstoreError(f"the {what} must map string qids to {{docid: value}} mappings; "
                                f"found {qid!r:.60}: {type(documents).__name__}")  # fmt: skip
        checked[qid] = {}
        _check_mapped_id(what, "qid", qid, qid)
        for docid, value in documents.items():
            if isinstance(docid, str):
                _check_mapped_id(what, "docid", docid, f"{qid!r:.60}/{docid!r:.60}")
            converted = convert(value) if isinstance(docid, str) else None
            if converted is None:
                raise DilstoreError(f"the {what} must give each string docid {expected}; "
                                    f"found {qid!r:.60}/{docid!r:.60}: {shown(value):.60}")  # fmt: skip
            checked[qid][docid] = converted
    return checked


def _check_mapped_id(what: str, kind: str, text: str, named: str) -> None:
    """A DilstoreError for a mapping's id that pytrec_eval cannot take: one holding a NUL (`_NUL_ID`), or a lone
    surrogate (no UTF-8 to give it), which crashed the calling process with a segmentation fault (fuzz60 F14)."""
    if "\0" in text:
        raise DilstoreError(f"the {what}'s {kind} {named if kind == 'docid' else repr(text)[:60]} {_NUL_ID}")
    if (problem := lone_surrogate(text)) is not None:
        raise DilstoreError(f"the {what}'s {kind} {named if kind == 'docid' else repr(text)[:60]} holds {problem}, "
                            "which is not Unicode text")  # fmt: skip


def int32_grade(value: Any) -> int | None:
    """`value` as an int when it is an integer (a numpy one too) that fits 32 bits signed, trec_eval's grades; else
    None (pytrec_eval fails deep inside on more)."""
    if isinstance(value, bool) or not isinstance(value, Integral) or not _INT32_MIN <= value <= _INT32_MAX:
        return None
    return int(value)


def _grade(value: Any) -> int | None:
    """`value` as a qrels grade: a 32-bit integer (`int32_grade`) of at most MAX_GRADE; else None."""
    grade = int32_grade(value)
    return None if grade is None or grade > MAX_GRADE else grade


def rank_documents(scores: dict[str, float]) -> list[tuple[str, float]]:
    """One query's `(docid, score)` pairs, best first.

    Ties are broken by docid in descending order, the order trec_eval (and so
    pytrec_eval and ir_measures) evaluates tied documents in, so the ranks a
    written run states are the ranks it is scored by.
    """
    return sorted(scores.items(), key=lambda item: (item[1], item[0]), reverse=True)


def write_run(path: str | Path, run: Run, tag: str = "dilstore") -> None:
    """Write `run` as a TREC run: each query's documents by `rank_documents`, ranked from 1.

    Queries keep the run's order. Scores are written with `repr`, so reading
    the file back gives the same floats. The file is written under a temporary
    name beside `path`, flushed to disk and renamed, so no reader ever sees half
    a run and an interrupted write leaves any earlier file in place.
    """
    path = Path(path)
    _check_token("tag", tag)
    lines = []
    for qid, scores in run.items():
        _check_token("qid", qid)
        for rank, (docid, score) in enumerate(rank_documents(scores), start=1):
            _check_token("docid", docid)
            if not math.isfinite(score):
                raise DilstoreError(f"cannot write run to {path}: score {score!r} of {qid!r}/{docid!r} is not finite")
            lines.append(f"{qid} Q0 {docid} {rank} {score!r} {tag}\n")
    try:
        atomic_write_text(path, "".join(lines), named_by_user=True)
    except OSError as error:
        raise DilstoreError(f"cannot write run to {path}: {error.strerror or error}") from None


def _numbered_lines(path: Path) -> Iterator[tuple[int, str]]:
    """(1-based line number, text without the line break) of each non-blank line of a UTF-8 file."""
    for number, text in numbered_lines(path, "a file"):
        line = text.rstrip("\r\n")
        if line.strip():
            yield number, line


def _columns(path: Path, number: int, line: str, expected: int, names: str) -> list[str]:
    """The whitespace-separated columns of a line, which must number `expected`, none holding a NUL (`_nul_id`)."""
    columns = line.split()
    if len(columns) != expected:
        raise DilstoreError(
            f"{path}:{number}: expected {expected} whitespace-separated columns ({names}), found {len(columns)}"
        )
    if (column := next((column for column in columns if "\0" in column), None)) is not None:
        raise DilstoreError(f"{path}:{number}: {column!r:.60} {_NUL_ID}")
    return columns


# pytrec_eval (trec_eval's C code) reads ids as C strings, which end at a NUL: "d1" and "d1\0x" were one document to
# it ("duplicate docs d1"), and a run ranking a relevant d1 first scored nDCG@10 0; qids "1" and "1\0x" failed its
# assertion and aborted `evaluate-rank` (SIGABRT, exit 134) (fuzz60 F13).
_NUL_ID = "holds a NUL character (U+0000), which trec_eval's ids cannot hold"


def _integer(path: Path, number: int, name: str, text: str) -> int:
    """`text` as an integer that fits 32 bits signed (trec_eval's, and pytrec_eval fails deep inside on more).

    Only ASCII digits: Python's int() also reads "1_0" as 10 and Arabic-Indic digits, which trec_eval does not,
    and a grade read so changed the metrics without a word.
    """
    value = _parsed(int, text)
    if value is None:
        raise DilstoreError(f"{path}:{number}: {name} {text!r} is not an integer")
    if not _INT32_MIN <= value <= _INT32_MAX:
        raise DilstoreError(f"{path}:{number}: {name} {text} is out of range ({_INT32_MIN} to {_INT32_MAX})")
    return value


def _score(path: Path, number: int, text: str) -> float:
    """`text` as a finite number written in ASCII (float() also reads "1_000" and other scripts' digits)."""
    value = _parsed(float, text)
    if value is None:
        raise DilstoreError(f"{path}:{number}: score {text!r} is not a number")
    if not math.isfinite(value):
        raise DilstoreError(f"{path}:{number}: score {text!r} is not a finite number")
    return value


def _parsed(kind: type[int] | type[float], text: str) -> int | float | None:
    """`text` read by int() or float(), or None; but for the two extras those read and trec_eval does not: digit
    group underscores ("1_000") and other scripts' digits. (The columns are split on whitespace, so none is in it.)
    """
    if not text.isascii() or "_" in text:
        return None
    try:
        return kind(text)
    except ValueError:
        return None


def _check_token(name: str, value: str) -> None:
    """A run column must be one non-empty token, or the written line would not read back."""
    if not value or len(value.split()) != 1 or value.strip() != value:
        raise DilstoreError(f"cannot write a TREC run: {name} {value!r} is empty or contains whitespace")
    if value.startswith("\ufeff"):  # a reader drops it from the file's first line (utf-8-sig): 5 columns were left
        raise DilstoreError(f"cannot write a TREC run: {name} {value!r} begins with a byte-order mark (U+FEFF)")
