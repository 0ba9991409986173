"""TREC topics/run/qrels I/O and `dilstore evaluate-rank`: hand-computed metrics, round trips, bad files, BM25 DL19."""

from __future__ import annotations

import json
import math
import re
import warnings
from pathlib import Path
from typing import Any

import ir_measures
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dilstore.reader.data.trec import (
    Run,
    qrels_from_mapping,
    rank_documents,
    read_qrels,
    read_ranked_run,
    read_run,
    read_topics,
    run_from_mapping,
    unicode_form_warning,
    write_run,
)
from dilstore.reader.evaluation.rank_metrics import evaluate_run, relevance_level
from dilstore.runners.cli import main
from dilstore.storage.errors import DilstoreError

# Graded 0–3 like TREC DL, so RR and R count grade >= 2 as relevant.
QRELS = """\
q1 0 d1 3
q1 0 d2 0
q1 0 d3 2
q1 0 d4 1
q2 0 e1 1
q2 0 e2 2
q3 0 f1 3
"""
# q1: d2 d4 d3 x d1.  q2: e1, ten unjudged documents, then e2 at rank 12.  q3: absent.  q4: not judged.
RUN = (
    "q1 Q0 d2 1 4.0 t\nq1 Q0 d4 2 3.0 t\nq1 Q0 d3 3 2.0 t\nq1 Q0 x 4 1.0 t\nq1 Q0 d1 5 0.5 t\n"
    + "q2 Q0 e1 1 20.0 t\n"
    + "".join(f"q2 Q0 n{i} {i + 2} {19.0 - i} t\n" for i in range(10))
    + "q2 Q0 e2 12 5.0 t\n"
    + "q4 Q0 d1 1 1.0 t\n"
)


def dcg(gains: list[int]) -> float:
    """Linear gain, log2(rank + 1) discount, as trec_eval computes it."""
    return sum(gain / math.log2(rank + 1) for rank, gain in enumerate(gains, start=1))


def expected_tiny() -> dict[str, float]:
    """The tiny example's means, from the formulas (3 judged queries; q3 scores 0, q4 is ignored)."""
    rr = {"q1": 1 / 3, "q2": 0.0}  # q1: first grade >= 2 is d3 at rank 3; q2: e2 at rank 12 is past the cutoff 10
    ndcg = {
        "q1": dcg([0, 1, 2, 0, 3]) / dcg([3, 2, 1, 0]),
        "q2": dcg([1] + [0] * 9) / dcg([2, 1]),  # e2 falls outside the top 10
    }
    recall = {"q1": 2 / 2, "q2": 1 / 1}  # every grade >= 2 document is within the top 100
    judged = {"q1": 4 / 5, "q2": 1 / 10}  # of the documents in each top 10: x and n0..n8 are unjudged
    return {
        "RR@10": sum(rr.values()) / 3,
        "nDCG@10": sum(ndcg.values()) / 3,
        "R@100": sum(recall.values()) / 3,
        "Judged@10": sum(judged.values()) / 3,
    }


@pytest.fixture
def tiny(tmp_path: Path) -> tuple[Path, Path]:
    qrels, run = tmp_path / "qrels.txt", tmp_path / "run.trec"
    qrels.write_text(QRELS)
    run.write_text(RUN)
    return qrels, run


def test_tiny_example_matches_the_formulas(tiny: tuple[Path, Path]) -> None:
    qrels, run = tiny
    evaluation = evaluate_run(read_qrels(qrels), read_run(run))
    expected = expected_tiny()
    for name, value in expected.items():
        assert evaluation.means[name] == pytest.approx(value, abs=1e-12), name
    assert evaluation.relevance_level == 2
    assert evaluation.queries == 3 and evaluation.unretrieved == ("q3",) and evaluation.unjudged == 1
    assert evaluation.per_query["q3"] == {"RR@10": 0.0, "nDCG@10": 0.0, "R@100": 0.0, "Judged@10": 0.0}
    assert set(evaluation.per_query) == {"q1", "q2", "q3"}


def test_a_relevance_level_given_scores_a_subset_as_its_whole_file(tiny: tuple[Path, Path]) -> None:
    """The level hangs on the qrels' highest grade: q2 alone (grades 1, 2) got grade >= 1, and its RR@10 went
    from 0 (e2 at rank 12) to 1 (e1 at rank 1)."""
    qrels, run = read_qrels(tiny[0]), read_run(tiny[1])
    whole = evaluate_run(qrels, run)
    alone = evaluate_run({"q2": qrels["q2"]}, run)
    assert (alone.relevance_level, alone.per_query["q2"]["RR@10"]) == (1, 1.0)
    given_level = evaluate_run({"q2": qrels["q2"]}, run, level=2)
    assert given_level.per_query["q2"] == whole.per_query["q2"] and given_level.relevance_level == 2
    assert evaluate_run(qrels, run, level=1).means["RR@10"] == pytest.approx((1 / 2 + 1) / 3)  # d4 at 2; e1 at 1
    # 2**40 was a bare TypeError from pytrec_eval (api39 L2); 10**5000 a ValueError writing the message (num58 F1)
    for bad in (0, True, 1.5, 2**40, 10**5000):
        with pytest.raises(DilstoreError, match="relevance level must be a grade of at least 1 and at most 2147483647"):
            evaluate_run(qrels, run, level=bad)
    with pytest.raises(DilstoreError, match="a recall depth must be an integer from 1 to 2147483647, got int value"):
        evaluate_run(qrels, run, recall_depths=[10**5000])
    assert evaluate_run(qrels, run, level=np.int64(2)).means == evaluate_run(qrels, run, level=2).means  # numpy too


def test_a_byte_order_mark_opening_the_files_changes_nothing(tiny: tuple[Path, Path]) -> None:
    """Kept, the mark would join the first qid ("\ufeffq1") and silently score that query as unjudged."""
    qrels, run = tiny
    plain = evaluate_run(read_qrels(qrels), read_run(run))
    for path in (qrels, run):
        path.write_bytes(b"\xef\xbb\xbf" + path.read_bytes())
    marked = evaluate_run(read_qrels(qrels), read_run(run))
    assert marked.means == plain.means and set(read_qrels(qrels)) == {"q1", "q2", "q3"}


@pytest.mark.parametrize("reader", [read_qrels, read_run])
def test_a_byte_order_mark_opening_a_later_line_is_refused_naming_it(
    tiny: tuple[Path, Path], reader: Any, tmp_path: Path
) -> None:
    """Two files joined, the second with a mark: it joined the first qid of that part, a query of its own, and
    `evaluate-rank` scored 44 DL19 queries with exit 0 (rank48 F1)."""
    source = tiny[0] if reader is read_qrels else tiny[1]
    lines = source.read_bytes().splitlines(keepends=True)
    joined = tmp_path / "joined.txt"
    joined.write_bytes(b"".join(lines[:2]) + b"\xef\xbb\xbf" + b"".join(lines[2:]))
    with pytest.raises(DilstoreError, match=re.escape(f"{joined}:3: the line begins with a byte-order mark (U+FEFF)")):
        reader(joined)
    joined.write_bytes(b"\xef\xbb\xbf" + b"\xef\xbb\xbf" + source.read_bytes())  # an empty file with a mark in front
    with pytest.raises(DilstoreError, match=re.escape(f"{joined}:1: the line begins with two byte-order marks")):
        reader(joined)


def test_a_rank_column_that_orders_otherwise_than_the_scores_is_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A run of constant scores keeps its order in the ranks only; rerank took the top --depth by score, so the
    highest docids, without a word (rank48 F4). The ranks are checked, and the queries they disagree on named."""
    run = tmp_path / "const.trec"
    run.write_text("q1 Q0 a 1 0 t\nq1 Q0 b 2 0 t\nq2 Q0 c 1 2.0 t\nq2 Q0 d 2 1.0 t\n"  # q1 by score: b, a
                   "q3 Q0 e 0 1.0 t\nq3 Q0 f 0 3.0 t\n", encoding="utf-8")  # q3: repeated ranks order nothing
    ranked, disagreeing = read_ranked_run(run)
    assert ranked == read_run(run) and disagreeing == ["q1"]
    repeated = tmp_path / "repeated.trec"  # ranks 1..3 and a second 3: the distinct ones still disagree (review48 F4)
    repeated.write_text("".join(f"q1 Q0 d{i} {min(i, 3)} 0.0 t\n" for i in range(1, 5)), encoding="utf-8")
    assert read_ranked_run(repeated)[1] == ["q1"]
    qrels = tmp_path / "qrels.txt"
    qrels.write_text("q1 0 a 1\nq2 0 c 1\n", encoding="utf-8")
    assert main(["evaluate-rank", "--qrels", str(qrels), "--run", str(run), "--json"]) == 0
    assert capsys.readouterr().err == (
        f"dilstore evaluate-rank: warning: in {run}, the rank column orders the documents of 1 of 3 queries "
        "otherwise than their scores ('q1'); documents are taken by score, highest first and ties by docid "
        "descending, as trec_eval ranks them\n")  # fmt: skip
    write_run(tmp_path / "out.trec", ranked)
    assert read_ranked_run(tmp_path / "out.trec")[1] == [], "a run dilstore writes ranks as it scores"


def test_the_python_api_warns_of_what_evaluate_rank_warns_of(tmp_path: Path) -> None:
    """dilstore.evaluate_rank scored a run of constant scores that keeps its order in the ranks by docid, and ids in
    another Unicode form as unjudged, and said nothing where the command warns of both on stderr (num58 F5)."""
    import dilstore

    qrels, run = tmp_path / "qrels.txt", tmp_path / "const.trec"
    qrels.write_text("q1 0 a 1\nZu\u0308rich 0 d1 1\n", encoding="utf-8")
    run.write_text("q1 Q0 a 1 0 t\nq1 Q0 b 2 0 t\nZürich Q0 d1 1 2.0 t\n", encoding="utf-8")
    with pytest.warns(UserWarning) as caught:
        dilstore.evaluate_rank(str(qrels), run)
    assert [str(warning.message).split(",")[0] for warning in caught] == [
        f"in {run}", "1 qid(s) and 0 docid(s) of the run are the qrels' only in another Unicode form (the run's "
        "'Z\\xfcrich'"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        dilstore.evaluate_rank({"q1": {"a": 1}}, {"q1": {"a": 0.0, "b": 0.0}})  # a mapping has no ranks to check


def test_ids_the_qrels_write_in_another_unicode_form_are_named(tmp_path: Path, capsys) -> None:
    """(unicode56 F5) A run's 'Zürich' (one 'ü') and the qrels' 'Zu\u0308rich' print alike, and ids are matched
    code point by code point: the query was scored as unjudged, a document as not relevant, without a word."""
    qrels, run = tmp_path / "qrels.txt", tmp_path / "run.trec"
    qrels.write_text("Zu\u0308rich 0 d1 1\nq2 0 d\u00e9 1\n", encoding="utf-8")
    run.write_text("Zürich Q0 d1 1 2.0 t\nq2 Q0 de\u0301 1 2.0 t\nq2 Q0 x 2 1.0 t\n", encoding="utf-8")
    assert main(["evaluate-rank", "--qrels", str(qrels), "--run", str(run), "--json"]) == 0
    printed = capsys.readouterr()
    assert json.loads(printed.out)["nDCG@10"] == 0.0  # still matched as written, as trec_eval matches them
    assert printed.err.startswith("dilstore evaluate-rank: warning: 1 qid(s) and 1 docid(s) of the run are the qrels' "
                              "only in another Unicode form (the run's 'Z\\xfcrich', the qrels' 'Zu\\u0308rich')")
    assert unicode_form_warning({"q": {"d": 1}}, {"q": {"d": 1.0, "Genève": 0.5}}) is None
    qrels.write_text("Zu\u0308rich 0 d1 1\n", encoding="utf-8")
    run.write_text("Zürich Q0 d1 1 2.0 t\n", encoding="utf-8")
    assert main(["evaluate-rank", "--qrels", str(qrels), "--run", str(run)]) == 2
    assert capsys.readouterr().err.endswith("error: none of the run's 1 queries has judgements in the qrels "
                                            "('Z\\xfcrich' is not in it, but 'Zu\\u0308rich' is: the same text in "
                                            "another Unicode form (NFD); ids are matched code point by code point)\n")


def test_cli_json_and_table(tiny: tuple[Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    qrels, run = tiny
    assert main(["evaluate-rank", "--qrels", str(qrels), "--run", str(run), "--json"]) == 0
    out = capsys.readouterr().out
    assert len(out.splitlines()) == 1
    summary = json.loads(out)
    assert list(summary) == ["RR@10", "nDCG@10", "R@100", "Judged@10", "queries", "relevance_level", "unretrieved",
                             "unjudged"]  # fmt: skip
    expected = {name: round(value, 4) for name, value in expected_tiny().items()}
    assert summary == {**expected, "queries": 3, "relevance_level": 2, "unretrieved": 1, "unjudged": 1}
    assert main(["evaluate-rank", "--qrels", str(qrels), "--run", str(run), "--json", "--relevance-level", "1"]) == 0
    assert json.loads(capsys.readouterr().out)["relevance_level"] == 1
    assert main(["evaluate-rank", "--qrels", str(qrels), "--run", str(run), "--json", "--relevance-level", "9"]) == 0
    assert "no judged document has grade 9 or more, so RR and R are 0 for every query" in capsys.readouterr().err
    assert main(["evaluate-rank", "--qrels", str(qrels), "--run", str(run)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[2] == "queries    3 (relevant for RR and R: grade >= 2)"
    assert lines[4] == f"nDCG@10    {expected_tiny()['nDCG@10']:.4f}"
    assert lines[6] == f"Judged@10  {expected_tiny()['Judged@10']:.4f} (share of each top 10 the qrels judge)"
    assert "1 judged query(ies) missing from the run, scored 0: 'q3'" in lines
    assert "1 run query(ies) without judgements, ignored: 'q4'" in lines


@pytest.mark.parametrize("grades, level", [((0, 1, 2, 3), 2), ((0, 1), 1), ((0, 1, 2), 1), ((0, 4), 1)])
def test_relevance_level_is_two_only_for_0_to_3_grades(grades: tuple[int, ...], level: int) -> None:
    assert relevance_level({"q": {f"d{grade}": grade for grade in grades}}) == level


def test_ties_are_scored_in_the_order_they_are_written(tmp_path: Path) -> None:
    """Binary qrels (level 1); a and b tie: both trec_eval and the written file put b first, so RR is 1/2."""
    run = {"q": {"a": 1.0, "b": 1.0, "c": 0.5}}
    assert [docid for docid, _ in rank_documents(run["q"])] == ["b", "a", "c"]
    write_run(tmp_path / "run.trec", run)
    assert [line.split()[2:4] for line in (tmp_path / "run.trec").read_text().splitlines()] == [
        ["b", "1"], ["a", "2"], ["c", "3"]
    ]  # fmt: skip
    evaluation = evaluate_run({"q": {"a": 1, "c": 0}}, run)
    assert evaluation.relevance_level == 1
    assert evaluation.means["RR@10"] == 0.5
    assert evaluation.means["nDCG@10"] == pytest.approx(1 / math.log2(3))


def test_empty_files_are_named_by_the_command(tiny: tuple[Path, Path], tmp_path: Path, capsys) -> None:
    """"the qrels judge no documents" named no file, and an empty run was "none of the run's 0 queries"."""
    qrels, run = tiny
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    assert main(["evaluate-rank", "--qrels", str(empty), "--run", str(run)]) == 2
    assert capsys.readouterr().err == f"dilstore evaluate-rank: error: {empty}: the qrels judge no documents\n"
    assert main(["evaluate-rank", "--qrels", str(qrels), "--run", str(empty)]) == 2
    assert capsys.readouterr().err == f"dilstore evaluate-rank: error: {empty}: the run holds no lines\n"


def test_a_query_with_an_empty_ranking_scores_zero() -> None:
    """Judged@10 divided by the ranking's length: a ZeroDivisionError, where every metric had scored 0 (the
    ranking evaluation writes an empty ranking for a query BM25 finds nothing for)."""
    evaluation = evaluate_run({"q1": {"d1": 1}, "q2": {"d2": 1}}, {"q1": {}, "q2": {"d2": 1.0}})
    assert evaluation.per_query["q1"] == {"RR@10": 0.0, "nDCG@10": 0.0, "R@100": 0.0, "Judged@10": 0.0}
    assert evaluation.means == {"RR@10": 0.5, "nDCG@10": 0.5, "R@100": 0.5, "Judged@10": 0.5}


@pytest.mark.parametrize("depths", [(), (0,), (5, -1), (2.5,), (True,), "10", (2**31,), 5, (np.bool_(True),)])
def test_recall_depths_must_be_positive_integers(depths: object) -> None:
    import dilstore

    with pytest.raises(DilstoreError, match="recall depth"):
        dilstore.evaluate_rank({"q": {"d": 1}}, {"q": {"d": 1.0}}, recall_at=depths)  # type: ignore[arg-type]


def test_the_api_computes_each_recall_depth_asked(tiny: tuple[Path, Path]) -> None:
    import dilstore

    # A generator left every R@k out, numpy integers were refused (api42 M3, L2).
    assert dilstore.evaluate_rank(*tiny, recall_at=(depth for depth in (5, 3))).metrics[2:] == ("R@3", "R@5")
    assert dilstore.evaluate_rank(*tiny, recall_at=np.array([5, 3])).metrics[2:] == ("R@3", "R@5")
    evaluation = dilstore.evaluate_rank(*tiny, recall_at=(5, 3))
    assert evaluation.metrics == ("RR@10", "nDCG@10", "R@3", "R@5")
    assert list(evaluation.summary())[:5] == ["RR@10", "nDCG@10", "R@3", "R@5", "Judged@10"]
    # q1's grade >= 2 documents are at ranks 3 and 5, q2's at 12; q3 is absent from the run: 0
    assert evaluation.means["R@3"] == pytest.approx((1 / 2) / 3) and evaluation.means["R@5"] == pytest.approx(1 / 3)
    measures = {ir_measures.R(rel=2) @ 3: "R@3", ir_measures.R(rel=2) @ 5: "R@5"}
    for metric in ir_measures.iter_calc(list(measures), read_qrels(tiny[0]), read_run(tiny[1])):
        assert evaluation.per_query[metric.query_id][measures[metric.measure]] == pytest.approx(metric.value)


def test_a_run_with_no_judged_query_or_empty_qrels_is_an_error() -> None:
    with pytest.raises(DilstoreError, match="none of the run's 1 queries has judgements"):
        evaluate_run({"q1": {"d": 1}}, {"q9": {"d": 1.0}})
    with pytest.raises(DilstoreError, match="judge no documents"):
        evaluate_run({}, {"q9": {"d": 1.0}})


def test_mappings_read_like_the_files_they_stand_for(tiny: tuple[Path, Path]) -> None:
    """Numpy scalars are numbers like any other; the checked copies equal the files' readings."""
    import numpy as np

    qrels, run = read_qrels(tiny[0]), read_run(tiny[1])
    as_numpy = {qid: {docid: np.float32(score) for docid, score in docs.items()} for qid, docs in run.items()}
    assert run_from_mapping(as_numpy) == run and qrels_from_mapping(qrels) == qrels


@pytest.mark.parametrize(
    ("qrels", "run", "message"),
    [
        (None, {"q": {"d": 1.0}}, "the qrels must be a file path or a {qid: {docid: value}} mapping, got NoneType"),
        ({"q": [1]}, {"q": {"d": 1.0}}, "the qrels must map string qids to {docid: value} mappings; found 'q': list"),
        ({1: {"d": 1}}, {"1": {"d": 1.0}}, "found 1: dict"),
        ({"q": {"d": 1.5}}, {"q": {"d": 1.0}}, "a 32-bit integer grade of at most 1,048,576; found 'q'/'d': 1.5"),
        ({"q": {"d": 2**20 + 1}}, {"q": {"d": 1.0}}, "grade of at most 1,048,576; found 'q'/'d': 1048577"),
        ({"q": {"d": 2**40}}, {"q": {"d": 1.0}}, "found 'q'/'d': 1099511627776"),
        ({"q": {"d": True}}, {"q": {"d": 1.0}}, "found 'q'/'d': True"),
        ({"q": {"d": 1}}, {"q": {"d": "9"}}, "the run must give each string docid a finite score; found 'q'/'d': '9'"),
        ({"q": {"d": 1}}, {"q": {"d": float("nan")}}, "found 'q'/'d': nan"),
        ({"q": {"d": 1}}, {"q": {2: 1.0}}, "found 'q'/2: 1.0"),
        ({"q": {"d": 1}}, {"q": {"d": 10**400}}, "a finite score; found 'q'/'d': 1000000000"),
        ({"q": {"d": 10**5000}}, {"q": {"d": 1.0}}, "1,048,576; found 'q'/'d': int value too long to write out"),
    ],
)
def test_bad_mappings_name_the_entry(qrels: object, run: object, message: str) -> None:
    """pytrec_eval scored a string or NaN score and an overflowing grade without a word (RR@10 1.0, nDCG 0.0); a
    score past float's range raised OverflowError, and a grade too long to write out ValueError (num58 F1)."""
    import dilstore

    with pytest.raises(DilstoreError) as raised:
        dilstore.evaluate_rank(qrels, run)  # type: ignore[arg-type]
    assert message in str(raised.value)


@pytest.mark.parametrize(("qrels", "run", "refused"), [
    ("1 0 d1 1\n1\0x 0 d2 1\n", "1 Q0 d1 1 2.0 t\n", "qrels.txt:2: '1\\x00x'"),
    ("1 0 d1 1\n1 0 d1\0x 1\n", "1 Q0 d1 1 2.0 t\n", "qrels.txt:2: 'd1\\x00x'"),
    ("1 0 d1 1\n", "1 Q0 d1 1 2.0 t\n1 Q0 d1\0x 2 1.0 t\n", "run.trec:2: 'd1\\x00x'"),
])
def test_an_id_holding_a_nul_is_refused_naming_file_and_line(tmp_path: Path, capsys, qrels: str, run: str,
                                                             refused: str) -> None:  # fmt: skip
    """(fuzz60 F13) pytrec_eval reads ids as C strings, cut at a NUL: qids "1" and "1\\0x" aborted `evaluate-rank` on
    its assertion (SIGABRT, exit 134, no line of dilstore's), and docids "d1" and "d1\\0x" were one document to it, so
    a run ranking a relevant d1 first scored nDCG@10 0.0000 and R@100 0.0000, a wrong result without an error."""
    (tmp_path / "qrels.txt").write_text(qrels, encoding="utf-8")
    (tmp_path / "run.trec").write_text(run, encoding="utf-8")
    status = main(["evaluate-rank", "--qrels", str(tmp_path / "qrels.txt"), "--run", str(tmp_path / "run.trec")])
    assert status == 2
    assert capsys.readouterr().err.endswith(f"{refused} holds a NUL character (U+0000), which trec_eval's ids cannot "
                                            "hold\n")  # fmt: skip


@pytest.mark.parametrize(("qrels", "run"), [({"1": {"d": 1}, "1\0x": {"d": 1}}, {"1": {"d": 1.0}}),
                                            ({"1": {"d": 1}}, {"1": {"d": 1.0, "d\0x": 0.5}})])  # fmt: skip
def test_a_mapping_id_holding_a_nul_is_refused(qrels: dict, run: dict) -> None:
    """(fuzz60 F13) The Python API's mappings reach pytrec_eval too: the same abort and the same wrong nDCG."""
    import dilstore

    with pytest.raises(DilstoreError, match=r"holds a NUL character \(U\+0000\), which trec_eval's ids cannot hold$"):
        dilstore.evaluate_rank(qrels, run)


@pytest.mark.parametrize(("qrels", "run"), [({"1": {"d\ud800": 1}}, {"1": {"d\ud800": 1.0}}),
                                            ({"\udc00": {"d": 1}}, {"\udc00": {"d": 1.0}})])  # fmt: skip
def test_a_mapping_id_holding_a_lone_surrogate_is_refused(qrels: dict, run: dict) -> None:
    """(fuzz60 F14) pytrec_eval asks for each id's UTF-8 and does not check that there is one: a lone surrogate in
    an id given to `dilstore.evaluate_rank` crashed the calling process with a segmentation fault."""
    import dilstore

    with pytest.raises(DilstoreError, match=r"holds a lone surrogate U\+D[8C]00 at character \d, which is not Unicode"):
        dilstore.evaluate_rank(qrels, run)


def test_negative_grades_score_as_not_relevant_and_a_second_evaluation_survives_them() -> None:
    """(fuzz60 F15) A grade of -2 or less (TREC's junk) damaged pytrec_eval's memory: the next evaluation of the
    process (a second `dilstore.evaluate_rank` call) crashed with a segmentation fault. Such a grade scores as 0 (gain
    0, not relevant), as trec_eval scores it, and is still judged."""
    import dilstore

    dilstore.evaluate_rank({"a": {"d": 1}}, {"a": {"d": 1.0}})
    run = {"q": {"e": 2.0, "f": 1.0}, "r": {"g": 1.0}}
    junk = dilstore.evaluate_rank({"q": {"e": -2, "f": 1}, "r": {"g": -100}}, run)
    zero = dilstore.evaluate_rank({"q": {"e": 0, "f": 1}, "r": {"g": 0}}, run)
    assert junk.means == zero.means and junk.means["Judged@10"] == 1.0 and junk.means["nDCG@10"] > 0


IDS = st.text(st.characters(blacklist_categories=("Cc", "Cs", "Zs", "Zl", "Zp")), min_size=1, max_size=6).filter(
    lambda text: not text.startswith("\ufeff"))  # refused: a reader drops it (test_write_run_..._unwritable_runs)
SCORES = st.one_of(st.sampled_from([0.0, 1.0, -2.5]), st.floats(allow_nan=False, allow_infinity=False))
RUNS = st.dictionaries(IDS, st.dictionaries(IDS, SCORES, min_size=1, max_size=8), max_size=5)


@settings(max_examples=200, deadline=None)
@given(run=RUNS)
def test_written_runs_read_back_with_the_same_ranking(run: Run, tmp_path_factory: pytest.TempPathFactory) -> None:
    folder = tmp_path_factory.mktemp("roundtrip")
    path = folder / "run.trec"
    write_run(path, run, tag="bm25")
    assert read_run(path) == run and list(read_run(path)) == list(run)
    assert [entry.name for entry in folder.iterdir()] == ["run.trec"]  # no temporary left behind
    lines = [line.split() for line in path.read_text(encoding="utf-8").splitlines()]
    for qid, scores in run.items():
        rows = [row for row in lines if row[0] == qid]
        assert [int(row[3]) for row in rows] == list(range(1, len(scores) + 1))
        assert [row[2] for row in rows] == [docid for docid, _ in rank_documents(scores)]
        written = [float(row[4]) for row in rows]
        assert written == sorted(written, reverse=True)
        assert all(row[1] == "Q0" and row[5] == "bm25" for row in rows)


def test_write_run_replaces_atomically_and_refuses_unwritable_runs(tmp_path: Path) -> None:
    path = tmp_path / "run.trec"
    write_run(path, {"q": {"d": 1.0}})
    write_run(path, {"q": {"e": 2.0}})
    assert path.read_text() == "q Q0 e 1 2.0 dilstore\n"
    for bad, fragment in [
        ({"q": {"d e": 1.0}}, "docid 'd e' is empty or contains whitespace"),
        ({"": {"d": 1.0}}, "qid '' is empty"),
        ({"q": {"d": math.nan}}, "is not finite"),
        ({"\ufeffq": {"d": 1.0}}, "qid '\\ufeffq' begins with a byte-order mark"),  # read back without it
    ]:
        with pytest.raises(DilstoreError, match=re.escape(fragment)):
            write_run(path, bad)
    with pytest.raises(DilstoreError, match="tag 'my run'"):
        write_run(path, {"q": {"d": 1.0}}, tag="my run")
    assert path.read_text() == "q Q0 e 1 2.0 dilstore\n"
    with pytest.raises(DilstoreError, match="cannot write run to"):
        write_run(tmp_path / "absent" / "run.trec", {"q": {"d": 1.0}})
    assert sorted(entry.name for entry in tmp_path.iterdir()) == ["run.trec"]


def test_topics_keep_file_order(tmp_path: Path) -> None:
    path = tmp_path / "topics.tsv"
    path.write_text("2\tsecond query\n\n1\tfirst query\r\n")
    assert list(read_topics(path).items()) == [("2", "second query"), ("1", "first query")]


GOOD_RUN = "q1 Q0 d1 1 2.0 t\n"
GOOD_QRELS = "q1 0 d1 1\n"
BAD_RUNS = [
    ("q1 Q0 d1 1 2.0\n", 1, "expected 6 whitespace-separated columns (qid Q0 docid rank score tag), found 5"),
    (GOOD_RUN + "q1 Q0 d2 1 high t\n", 2, "score 'high' is not a number"),
    (GOOD_RUN + "q1 Q0 d2 1 nan t\n", 2, "score 'nan' is not a finite number"),
    (GOOD_RUN + "q1 Q0 d2 first 1.0 t\n", 2, "rank 'first' is not an integer"),
    # Python's float() and int() read these; trec_eval does not (trainqa36 L1).
    (GOOD_RUN + "q1 Q0 d2 1 1_000 t\n", 2, "score '1_000' is not a number"),
    (GOOD_RUN + "q1 Q0 d2 1 \u0669\u0669 t\n", 2, "score '\u0669\u0669' is not a number"),
    (GOOD_RUN + "\nq1 Q0 d1 2 1.0 t\n", 3, "docid 'd1' appears twice for qid 'q1'"),
]
BAD_QRELS = [
    ("q1 0 d1\n", 1, "expected 4 whitespace-separated columns (qid 0 docid grade), found 3"),
    (GOOD_QRELS + "q1 0 d2 1.5\n", 2, "grade '1.5' is not an integer"),
    (GOOD_QRELS + "q1 0 d2 1_0\n", 2, "grade '1_0' is not an integer"),  # it was read as 10, changing the metrics
    (GOOD_QRELS + "q1 0 d2 \u0663\n", 2, "grade '\u0663' is not an integer"),
    (GOOD_QRELS + "q1 0 d1 2\n", 2, "docid 'd1' is judged twice for qid 'q1'"),
    (GOOD_QRELS + "q1 0 d2 99999999999999999999999\n", 2,
     "grade 99999999999999999999999 is out of range (-2147483648 to 2147483647)"),
    # (fuzz60 F16) trec_eval keeps a count per grade up to the largest: 2**31 - 1 scored nDCG@10 0 for a relevant
    # first document; 2**30 was a segmentation fault under a memory limit.
    (GOOD_QRELS + "q1 0 d2 2147483647\n", 2, "grade 2147483647 is above 1,048,576, the largest this scores"),
]
BAD_TOPICS = [
    ("1 no tab here\n", 1, "expected 2 tab-separated columns (qid, query), found 1"),
    ("1\tfine\n\tno qid\n", 2, "empty qid"),
    ("1\tfine\n2\t \n", 2, "empty query for qid '2'"),
    ("1\tfine\n2\tother\n1\tagain\n", 3, "qid '1' appears twice (first on line 1)"),
]
READERS = {"run.trec": read_run, "qrels.txt": read_qrels, "topics.tsv": read_topics}
BAD_LINES = (
    [("run.trec", *case) for case in BAD_RUNS]
    + [("qrels.txt", *case) for case in BAD_QRELS]
    + [("topics.tsv", *case) for case in BAD_TOPICS]
)


@pytest.mark.parametrize("name, text, line, message", BAD_LINES)
def test_bad_lines_name_file_line_and_problem(tmp_path: Path, name: str, text: str, line: int, message: str) -> None:
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(DilstoreError, match=re.escape(f"{path}:{line}: {message}")):
        READERS[name](path)


@pytest.mark.parametrize("name", sorted(READERS))
def test_invalid_utf8_missing_file_and_directory(tmp_path: Path, name: str) -> None:
    path = tmp_path / name
    path.write_bytes(b"q1\t\xff\n" if name == "topics.tsv" else b"q1 Q0 d\xff 1 1.0 t\n")
    with pytest.raises(DilstoreError, match=re.escape(f"{path}:1: not UTF-8 text")):
        READERS[name](path)
    with pytest.raises(DilstoreError, match=re.escape(f"{tmp_path / 'absent'}: no such file")):
        READERS[name](tmp_path / "absent")
    with pytest.raises(DilstoreError, match="is a directory"):
        READERS[name](tmp_path)


@pytest.mark.parametrize(
    "bad_file, text, line, message",
    [("run", *case) for case in BAD_RUNS] + [("qrels", *case) for case in BAD_QRELS],
)
def test_cli_reports_bad_files_in_one_line_with_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], bad_file: str, text: str, line: int, message: str
) -> None:
    files = {"run": tmp_path / "run.trec", "qrels": tmp_path / "qrels.txt"}
    files["run"].write_text(GOOD_RUN)
    files["qrels"].write_text(GOOD_QRELS)
    files[bad_file].write_text(text)
    assert main(["evaluate-rank", "--qrels", str(files["qrels"]), "--run", str(files["run"])]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == f"dilstore evaluate-rank: error: {files[bad_file]}:{line}: {message}\n"


@pytest.mark.shared_data
def test_bm25_dl19_passage_reproduces_the_published_ndcg(
    shared_data: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Anserini's BM25 run on TREC DL 2019 passage: nDCG@10 0.5058, its published figure."""
    msmarco = shared_data / "msmarco"
    qrels, run = msmarco / "qrels.dl19-passage.txt", msmarco / "run.dl19-passage.bm25-top100.trec"
    assert main(["evaluate-rank", "--qrels", str(qrels), "--run", str(run), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["nDCG@10"] == 0.5058 and summary["queries"] == 43
    recalls = [ir_measures.R(rel=2) @ depth for depth in (5, 20, 100)]
    library = ir_measures.calc_aggregate([ir_measures.nDCG @ 10, *recalls], read_qrels(qrels), read_run(run))
    assert summary["nDCG@10"] == round(library[ir_measures.nDCG @ 10], 4)
    assert summary["R@100"] == round(library[ir_measures.R(rel=2) @ 100], 4)
    assert main(["evaluate-rank", "--qrels", str(qrels), "--run", str(run), "--json", "--recall-at", "20",
                 "--recall-at", "5", "--recall-at", "20"]) == 0  # fmt: skip
    deeper = json.loads(capsys.readouterr().out)
    assert [name for name in deeper if name.startswith("R@")] == ["R@5", "R@20"]
    assert deeper["R@5"] == round(library[recalls[0]], 4) and deeper["R@20"] == round(library[recalls[1]], 4)
    assert deeper["R@5"] < deeper["R@20"] < summary["R@100"]
    assert set(read_topics(msmarco / "topics.dl19-passage.tsv")) == set(read_run(run))


def test_each_kind_of_id_in_another_unicode_form_is_warned_of_alone_or_together() -> None:
    """(mut56 M32, M33, M28) The warning counts docids of a query the run also writes in another form (their
    judgements are the qrels' query's), speaks when only qids or only docids differ, and is about canonical forms
    only: ids that differ in compatibility (full width) are other ids, which writing both files in NFC, the advice
    it gives, would not make equal."""
    both = unicode_form_warning({"Zu\u0308rich": {"d\u00e9": 1}}, {"Zürich": {"de\u0301": 1.0}})
    assert both is not None and both.startswith("warning: 1 qid(s) and 1 docid(s) of the run")
    docids = unicode_form_warning({"q": {"d\u00e9": 1}}, {"q": {"x": 2.0, "de\u0301": 1.0}})
    assert docids is not None and "0 qid(s) and 1 docid(s)" in docids and "the run's 'de\\u0301'" in docids
    qids = unicode_form_warning({"Zu\u0308rich": {"d": 1}}, {"Zürich": {"d": 1.0}})
    assert qids is not None and "1 qid(s) and 0 docid(s)" in qids
    assert unicode_form_warning({"q": {"d1": 1}}, {"q": {"\uff44\uff11": 1.0}}) is None
