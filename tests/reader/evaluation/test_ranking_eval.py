"""Reranking evaluation: DL19 and SQuAD dev paragraph-ranking tasks, runs for evaluate_run, and the benchmark script.

Tiny random rankers; the SQuAD dev task is built with an injected retriever
(no JVM in this process). The real DL19 file is parsed when ../shared/data is there.
"""

from __future__ import annotations

import gzip
import importlib.util
import json
from collections.abc import Sequence
from pathlib import Path

import pytest
import torch

from dilstore.reader.data.trec import read_qrels, read_run
from dilstore.reader.evaluation.rank_metrics import evaluate_run
from dilstore.reader.evaluation.ranking import (
    load_dl19_task,
    load_task,
    rerank,
    save_task,
    squad_dev_task,
    write_task_files,
)
from dilstore.reader.modeling.checkpoints import TRAINING_METADATA_FILE
from dilstore.reader.modeling.earl import EarlConfig
from dilstore.reader.modeling.listformer import ListformerConfig
from dilstore.reader.modeling.rankers import new_ranker
from dilstore.storage.errors import DilstoreError
from tests.fixtures.damaged_files import damaged_deflate
from tests.fixtures.paths import ROOT
from tests.fixtures.ranking_fixtures import write_squad_articles

DL19_LIKE = [
    {"query": "who runs the zurich trams", "hits": [
        {"qid": 11, "docid": "d1", "rank": 2, "score": 7.5, "content": "Marie Curie won the Nobel Prize."},
        {"qid": 11, "docid": "d2", "rank": 1, "score": 9.0, "content": "The Zürich trams are run by VBZ."},
        {"qid": 11, "docid": "d3", "rank": 3, "score": 2.0, "content": "Kilimanjaro is in Tanzania."},
    ]},
    {"query": "how high is kilimanjaro", "hits": [
        {"qid": 12, "docid": "d3", "rank": 1, "score": 8.0, "content": "Kilimanjaro is in Tanzania."},
        {"qid": 12, "docid": "d4", "rank": 2, "score": 6.0, "content": "Kilimanjaro rises 5,895 metres."},
    ]},
]  # fmt: skip
QRELS = {"11": {"d2": 3, "d1": 0}, "12": {"d4": 2, "d3": 1}}


@pytest.fixture(scope="module")
def dl19_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("dl19") / "bm25-top100-with-text.dl19-passage.json"
    path.write_text(json.dumps(DL19_LIKE), encoding="utf-8")
    return path


def test_dl19_task_keeps_bm25_order_texts_and_the_judged_queries(dl19_file: Path) -> None:
    task = load_dl19_task(dl19_file, {**QRELS, "99": {"x": 1}}, depth=2)
    assert task.queries == {"11": "who runs the zurich trams", "12": "how high is kilimanjaro"}
    assert list(task.bm25["11"]) == ["d2", "d1"] and task.bm25["11"]["d2"] == 9.0
    assert task.texts["d4"] == "Kilimanjaro rises 5,895 metres." and "99" not in task.qrels
    assert evaluate_run(task.qrels, task.bm25).means["RR@10"] == pytest.approx(0.75)


@pytest.mark.parametrize("kind", ["earl", "cross-encoder", "siamese"])
def test_rerank_scores_every_candidate_as_the_ranker_scores_pairs(kind: str, tiny_base: Path, dl19_file: Path) -> None:
    ranker = new_ranker(kind, tiny_base, EarlConfig(query_layers=1))
    task = load_dl19_task(dl19_file, QRELS)
    run = rerank(ranker, task, max_query_length=16, max_doc_length=32, batch_size=2)
    assert {qid: set(scores) for qid, scores in run.items()} == {qid: set(c) for qid, c in task.bm25.items()}
    with torch.no_grad():
        expected = ranker.score_texts([task.queries["11"]] * 3, [task.texts[d] for d in run["11"]], 16, 32)
    assert list(run["11"].values()) == pytest.approx(expected.tolist(), abs=1e-5)
    evaluation = evaluate_run(task.qrels, run)
    assert evaluation.queries == 2 and evaluation.means["R@100"] == 1.0


def test_a_listformer_scores_each_query_s_whole_list_whatever_the_batch_size(tiny_base: Path, dl19_file: Path) -> None:
    """Lists cut into `batch_size` chunks were scored as separate lists, so the metrics of
    `rank_quality.py --depth 100 --batch-size 64` depended on the batch size."""
    ranker = new_ranker("listformer", tiny_base, listformer=ListformerConfig(1))
    task = load_dl19_task(dl19_file, QRELS)
    by_batch = [rerank(ranker, task, max_query_length=16, max_doc_length=32, batch_size=size) for size in (1, 3)]
    tokens = [ranker.tokenize_document(task.texts[docid], 32) for docid in task.bm25["11"]]
    with torch.no_grad():
        whole = ranker.score_groups([ranker.tokenize_query(task.queries["11"], 16)], [tokens])[0]  # (3,)
    assert list(by_batch[0]["11"].values()) == pytest.approx(whole.tolist(), abs=1e-6)
    for qid, scores in by_batch[1].items():
        assert by_batch[0][qid] == pytest.approx(scores, abs=1e-6)


def passage_order_retriever(corpus: Sequence[str]):
    def retrieve(queries: Sequence[tuple[str, str]], depth: int) -> dict[str, list[tuple[str, float]]]:
        return {qid: [(pid, 1.0 / (rank + 1)) for rank, pid in enumerate(corpus[:depth])] for qid, _ in queries}

    return retrieve


def test_squad_dev_task_judges_each_question_by_its_own_paragraph(tmp_path: Path) -> None:
    squad = write_squad_articles(tmp_path / "dev.json")
    corpus = ["Zürich_Tram#p0", "Zürich_Tram#p1", "Zürich_Tram#p2", "Marie_Curie#p0", "Marie_Curie#p1"]
    task = squad_dev_task(squad, tmp_path / "work", depth=3, retriever=passage_order_retriever(corpus))
    assert len(task.queries) == 9 and task.qrels["q-curie-born"] == {"Marie_Curie#p1": 1}
    assert list(task.bm25["q-tram-open"]) == corpus[:3]
    means = evaluate_run(task.qrels, task.bm25).means
    assert means["RR@10"] == pytest.approx((1 + 1 / 2 + 1 / 3) / 9)
    qrels_path, run_path = write_task_files(task, tmp_path / "files")
    assert read_qrels(qrels_path) == task.qrels and read_run(run_path) == task.bm25
    retriever = passage_order_retriever(corpus)
    subset = squad_dev_task(squad, tmp_path / "work", depth=3, limit=4, seed=1, retriever=retriever)
    assert len(subset.queries) == 4 and set(subset.queries) <= set(task.queries)


def test_a_saved_task_loads_back_with_only_its_candidates_texts(dl19_file: Path, tmp_path: Path) -> None:
    task = load_dl19_task(dl19_file, QRELS, depth=1)
    loaded = load_task(save_task(task, tmp_path / "task.json.gz"))
    assert loaded.texts == {"d2": task.texts["d2"], "d3": task.texts["d3"]}
    assert (loaded.name, loaded.queries, loaded.bm25, loaded.qrels) == (task.name, task.queries, task.bm25, task.qrels)
    (tmp_path / "bad.json.gz").write_bytes(b"not gzip")
    with pytest.raises(DilstoreError, match="bad.json.gz: not a ranking task file"):
        load_task(tmp_path / "bad.json.gz")


def test_a_task_file_with_a_damaged_deflate_stream_is_named(dl19_file: Path, tmp_path: Path) -> None:
    """(fuzz60 F2) A saved task whose deflate stream was damaged raised zlib.error, which is no OSError, past the
    "not a ranking task file" line every other damage gets."""
    packed = save_task(load_dl19_task(dl19_file, QRELS, depth=1), tmp_path / "task.json.gz").read_bytes()
    (tmp_path / "bad.json.gz").write_bytes(damaged_deflate(gzip.decompress(packed)))
    with pytest.raises(DilstoreError, match=r"bad\.json\.gz: not a ranking task file written by save_task \(Error -3"):
        load_task(tmp_path / "bad.json.gz")


def test_a_malformed_dl19_file_is_named(tmp_path: Path) -> None:
    path = tmp_path / "bad.json"
    path.write_text(json.dumps([{"query": "q", "hits": [{"qid": 1, "docid": "d"}]}]))
    with pytest.raises(DilstoreError, match=r"bad.json: item 0: every hit needs qid, docid, content, rank and score"):
        load_dl19_task(path, QRELS)


@pytest.mark.parametrize(("field", "value", "kind"), [
    ("score", "abc", "a finite number"), ("score", "nan", "a finite number"), ("score", None, "a finite number"),
    ("rank", "x", "an integer"), ("rank", True, "an integer"), ("content", 5, "a string"),
])
def test_a_dl19_hit_field_of_another_type_is_named(tmp_path: Path, field: str, value, kind: str) -> None:
    """(fuzz60 F8) A hit's score "abc" or rank "x" was a ValueError traceback from the ranking benchmarks, and a
    score "nan" went into the BM25 run as NaN."""
    hit = {"qid": 1, "docid": "d", "content": "text", "rank": 1, "score": 2.5, field: value}
    path = tmp_path / "bad.json"
    path.write_text(json.dumps([{"query": "q", "hits": [hit]}]))
    with pytest.raises(DilstoreError, match=rf"bad\.json: item 0: a hit's {field} is .*, not {kind}$"):
        load_dl19_task(path, QRELS)


@pytest.mark.shared_data
def test_the_real_dl19_candidates_parse(shared_data: Path) -> None:
    msmarco = shared_data / "msmarco"
    qrels = read_qrels(msmarco / "qrels.dl19-passage.txt")
    task = load_dl19_task(msmarco / "bm25-top100-with-text.dl19-passage.json", qrels)
    assert len(task.queries) == 43 and all(len(candidates) == 100 for candidates in task.bm25.values())
    assert evaluate_run(task.qrels, task.bm25).summary()["nDCG@10"] == pytest.approx(0.5058, abs=1e-4)


def test_benchmark_labels_untrained_rankers(tiny_base: Path, dl19_file: Path, tmp_path: Path, capsys) -> None:
    spec = importlib.util.spec_from_file_location("rank_quality", ROOT / "benchmarks" / "rank_quality.py")
    rank_quality = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(rank_quality)
    data = tmp_path / "data"
    (data / "msmarco").mkdir(parents=True)
    (data / "msmarco" / dl19_file.name).write_bytes(dl19_file.read_bytes())
    (data / "msmarco" / "qrels.dl19-passage.txt").write_text(
        "".join(f"{qid} 0 {docid} {grade}\n" for qid, grades in QRELS.items() for docid, grade in grades.items())
    )
    trained = new_ranker("cross-encoder", tiny_base).save_pretrained(tmp_path / "cross-encoder")  # named for its kind
    (trained / TRAINING_METADATA_FILE).write_text(json.dumps({"kind": "cross-encoder", "steps": 7}))
    saved_only = new_ranker("siamese", tiny_base).save_pretrained(tmp_path / "saved-only")
    output = tmp_path / "report.json"
    status = rank_quality.main(["--work", str(tmp_path / "work"), "--data", str(data), "--tasks", "dl19",
                                "--model", str(trained), "--model", str(saved_only), "--untrained", "earl",
                                "--reference-bi-encoder", "--base-model", str(tiny_base), "--max-doc-length", "32",
                                "--threads", "1", "--no-progress", "--output", str(output)])  # fmt: skip
    assert status == 0
    report = json.loads(output.read_text())
    labels = {row["model"]: row["trained"] for row in report["results"]}
    assert labels == {
        "BM25": None,
        "cross-encoder (7 steps)": True,  # not "cross-encoder cross-encoder (7 steps)"
        "siamese saved-only (UNTRAINED: no training recorded)": False,
        f"earl (UNTRAINED: base-initialised from {tiny_base.name})": False,
        f"bi-encoder cosine (UNTRAINED {tiny_base.name}, as sentence-transformers scores it)": False,
    }
    table = capsys.readouterr().out
    assert "UNTRAINED: base-initialised" in table and "DL19" in table
    assert "(DL19: 2 queries, BM25 top-3 (so R@100 is R@3); device cpu)" in table  # 3 candidates at most
    assert (tmp_path / "work" / "qrels.dl19.txt").is_file() and len(list((tmp_path / "work").glob("run.*.trec"))) == 5
    again = tmp_path / "again.json"
    saved_task = tmp_path / "work" / "task.dl19.json.gz"
    status = rank_quality.main(["--work", str(tmp_path / "elsewhere"), "--data", str(tmp_path / "absent"),
                                "--task-file", str(saved_task), "--model", str(trained), "--max-doc-length", "32",
                                "--threads", "1", "--no-progress", "--output", str(again),
                                "--depth", "7"])  # fmt: skip
    assert status == 0
    assert json.loads(again.read_text())["tasks"] == report["tasks"]  # the saved task's depth, not --depth's

    def timeless(rows: list[dict]) -> list[dict]:
        return [{key: value for key, value in row.items() if key != "seconds"} for row in rows]

    assert timeless(json.loads(again.read_text())["results"]) == timeless(report["results"][:2])
