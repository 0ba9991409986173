"""The reader with real BM25 retrieval (pyserini/Lucene) over a tiny store, and the commands in-process.

The JVM starts once in this process, so everything that needs it lives in
this module and nothing here forks.
"""

from __future__ import annotations

import gc
import importlib.util
import json
import shutil
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from dilstore.reader.retrieval import Bm25Searcher, TooManyTermsError, bm25_index_dir, build_bm25_index, start_jvm
from dilstore.reader.serving.odqa import OdqaSettings, open_reader
from dilstore.runners.cli import main
from dilstore.storage.errors import DilstoreError
from dilstore.storage.reader import MissingPassagesError
from dilstore.storage.verify import verify_store
from dilstore.storage.write_lock import INDEX_ROLE
from tests.fixtures.benchmarks import benchmark_module
from tests.fixtures.locks import held_lock
from tests.fixtures.odqa_fixtures import (
    collection_documents,
    write_collection,
    write_reader_and_store,
    write_reader_checkpoint,
)
from tests.fixtures.paths import ROOT

QUESTION = "When did the Zürich tram network open?"
# Only in the index, not in the store: retrieving it must be a clear error.
GHOST = ("ghost#0", "Xylophone museum curators polish mallets.")


@pytest.fixture(scope="module")
def indexed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A store with its BM25 index at STORE/bm25 (plus one passage the store lacks)."""
    root = tmp_path_factory.mktemp("odqa-bm25")
    model_dir, store_dir, ids = write_reader_and_store(root)
    write_collection(root / "collection" / "passages.jsonl", [*collection_documents(store_dir, ids), GHOST])
    counts: list[int] = []
    build_bm25_index(root / "collection", bm25_index_dir(store_dir), progress=counts.append)
    return {"store": store_dir, "model": model_dir, "root": root, "progress": counts, "documents": len(ids) + 1,
            "ids": ids}


def test_the_build_reports_documents_indexed_until_all_are(indexed: dict[str, Any]) -> None:
    assert indexed["progress"] == sorted(indexed["progress"]) and indexed["progress"][-1] == indexed["documents"]


def test_answers_come_from_the_bm25_top_p_with_their_scores(indexed: dict[str, Any]) -> None:
    odqa = open_reader(indexed["store"], indexed["model"], settings=OdqaSettings(top_p=3))
    hits = Bm25Searcher(bm25_index_dir(indexed["store"])).search(QUESTION, 3)
    assert hits[0].passage_id == "tram#0"
    answer = odqa.answer(QUESTION)
    scores = {hit.passage_id: hit.score for hit in hits}
    assert answer.nbest and {span.passage_id for span in answer.nbest} <= set(scores)
    for span in answer.nbest:
        assert span.bm25_score == pytest.approx(scores[span.passage_id])
    assert answer.timings.retrieval > 0
    assert {span.passage_id for span in odqa.answer(QUESTION, top_p=1).nbest} == {"tram#0"}


def test_each_question_of_one_read_may_have_its_own_top_p(indexed: dict[str, Any]) -> None:
    """serve's batches mix requests of different top_p; it re-implemented retrieval around read() for them."""
    odqa = open_reader(indexed["store"], indexed["model"])
    broad = "Which tram, prize or mountain?"  # matches several passages
    alone = odqa.retrieve_and_read([broad], 5)[0].hits
    readings = odqa.retrieve_and_read([broad, broad], [1, 5])
    assert len(alone) > 1 and [reading.hits for reading in readings] == [alone[:1], alone]
    assert readings[0].timings.retrieval > 0
    with pytest.raises(DilstoreError, match="got 2 questions but 1 top_p values"):
        odqa.retrieve_and_read([QUESTION, QUESTION], [1])
    with pytest.raises(DilstoreError, match="top_p must be a positive integer, got 0"):
        odqa.retrieve_and_read([QUESTION], [0])
    numpy = odqa.retrieve_and_read([broad, broad], [np.int64(1), np.int32(5)])  # a count read from an array (api39 L1)
    assert [reading.hits for reading in numpy] == [alone[:1], alone]
    assert odqa.answer(broad, top_p=np.int64(5)).text == odqa.answer(broad, top_p=5).text
    for wrong in (2.0, "5"):  # not taken for lists: a TypeError, or a count of the string's characters
        with pytest.raises(DilstoreError, match=f"top_p must be a positive integer, got {wrong!r}"):
            odqa.retrieve_and_read([QUESTION, QUESTION], wrong)


def test_a_closed_reader_releases_its_index_and_refuses_to_answer(indexed: dict[str, Any], tmp_path: Path) -> None:
    """The Lucene index stayed mapped (deleted files included, after a rebuild) until Java's GC ran."""
    index = shutil.copytree(bm25_index_dir(indexed["store"]), tmp_path / "bm25")  # mapped by this test alone

    def mapped() -> int:
        return sum(f"{index}/" in line for line in Path("/proc/self/maps").read_text().splitlines())

    settings = OdqaSettings(top_p=3)
    with open_reader(indexed["store"], indexed["model"], index_dir=index, settings=settings) as odqa:
        expected = odqa.answer(QUESTION).text
        assert mapped() > 0
    assert mapped() == 0
    for closed_call in (lambda: odqa.answer(QUESTION), lambda: odqa.searcher.search(QUESTION, 3)):
        with pytest.raises(DilstoreError, match="is closed; open it again"):
            closed_call()
    again = open_reader(indexed["store"], indexed["model"], index_dir=index, settings=settings)
    assert again.answer(QUESTION).text == expected
    again.close()
    again.close()  # closing twice is harmless


@pytest.mark.skipif(not Path("/proc/self/maps").is_file(), reason="reads the process's maps from /proc")
def test_a_searcher_dropped_unclosed_unmaps_its_index(indexed: dict[str, Any], tmp_path: Path) -> None:
    """(leak60 F3) A Bm25Searcher (an `open_reader`'s) dropped without close() left its index's files mapped until
    Java's garbage collector ran, which a process that allocates little in Java never does: each reader opened again
    after `dilstore index` rebuilt the index kept the old index's deleted files, and their disk space, for as long as
    the process ran (10 maps of 1.2 MB a reader of a 2,000-passage store, for good)."""
    index = tmp_path / "bm25"
    shutil.copytree(bm25_index_dir(indexed["store"]), index)
    searcher = Bm25Searcher(index)
    assert searcher.search(QUESTION, 1)

    def mapped() -> list[str]:
        return [line for line in Path("/proc/self/maps").read_text().splitlines() if str(index) in line]

    assert mapped(), "the open searcher maps its index (else this test proves nothing)"
    del searcher
    gc.collect()
    assert mapped() == []


def test_a_batch_search_on_java_threads_finds_what_one_search_at_a_time_finds(indexed: dict[str, Any]) -> None:
    searcher = Bm25Searcher(bm25_index_dir(indexed["store"]))
    questions = {"q1": QUESTION, "q2": "Who polishes mallets?"}
    batch = searcher.batch_search(list(questions.values()), list(questions), 3, threads=2)
    assert batch["q1"] and batch["q1"][0].passage_id == "tram#0"
    assert batch == {qid: searcher.search(question, 3) for qid, question in questions.items()}
    # Questions from a numpy array, or of any str subclass: pyjnius took only an exact str (api39 M2).
    asked = np.array(list(questions.values()))
    assert searcher.batch_search(list(asked), list(np.array(list(questions))), 3, threads=2) == batch
    assert [searcher.search(question, 3) for question in asked] == [batch["q1"], batch["q2"]]


def test_a_batch_search_with_a_qid_given_twice_is_refused(indexed: dict[str, Any]) -> None:
    """The hits come back keyed by qid: two queries under one qid would give one query's hits for both."""
    searcher = Bm25Searcher(bm25_index_dir(indexed["store"]))
    for queries, qids in (([QUESTION, "Who polishes mallets?"], ["q", "q"]), ([QUESTION], ["q1", "q2"])):
        with pytest.raises(DilstoreError, match="^batch_search needs one distinct qid per query$"):
            searcher.batch_search(queries, qids, 3)


def test_lucene_errors_say_whose_they_are(indexed: dict[str, Any]) -> None:
    """Every Java exception of a search said the index "cannot be read; rebuild it": a query of more terms than
    Lucene searches at once, a batch holding one (Anserini's "queryCount = 1 is not equal to completedTaskCount =
    0"), and a searcher closed by another thread while it searched."""
    searcher = Bm25Searcher(bm25_index_dir(indexed["store"]))
    broad = " ".join(f"w{i}x" for i in range(1100))
    too_many = r"the query has more terms than one BM25 search takes \(.*TooManyClauses: maxClauseCount is set to 1024"
    with pytest.raises(TooManyTermsError, match=f"^{too_many}"):
        searcher.search(broad, 3)
    with pytest.raises(TooManyTermsError, match=f"^query 'q2': {too_many}"):
        searcher.batch_search([QUESTION, broad], ["q1", "q2"], 3)
    searcher._open().close()  # what a close() on another thread does to a search under way
    with pytest.raises(DilstoreError, match="^the BM25 searcher of .* was closed while it searched$"):
        searcher.search(QUESTION, 3)
    # Not a query's fault, so no query is named (it said "query 'q1': ...", style38 L12).
    with pytest.raises(DilstoreError, match="^the BM25 searcher of .* was closed while it searched$"):
        searcher.batch_search([QUESTION, "who"], ["q1", "q2"], 3)


def test_a_top_p_beyond_javas_int_returns_every_hit(indexed: dict[str, Any]) -> None:
    """Anserini's search takes a Java int: top_p 2**31 was a JavaException traceback from ask, evaluate-qa and serve."""
    searcher = Bm25Searcher(bm25_index_dir(indexed["store"]))
    everything = searcher.search(QUESTION, 1000)
    assert searcher.search(QUESTION, 2**31) == everything == searcher.search(QUESTION, 10**20)
    assert searcher.batch_search([QUESTION], ["q"], 2**31)["q"] == everything
    odqa = open_reader(indexed["store"], indexed["model"], settings=OdqaSettings(top_p=2**31))
    assert odqa.answer(QUESTION).nbest


def test_a_question_limit_past_the_model_s_positions_is_refused_before_the_model_and_the_jvm_load(
        indexed: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """(left55 F11) `open_reader(max_question_length=100000)` (and `ask --max-question-length 100000`) was refused
    only once the model had loaded and the JVM had started, about 15 s."""
    import dilstore
    from dilstore.reader.serving import odqa

    def loaded(*_: object, **__: object) -> None:
        raise AssertionError("loaded before the limit was checked")

    monkeypatch.setattr(odqa, "load_store_model", loaded)
    monkeypatch.setattr(odqa, "Bm25Searcher", loaded)
    for limit in (100_000, 10**9):
        with pytest.raises(DilstoreError, match=rf"^the question limit {limit} \(--max-question-length\) is more "
                                                r"than this model's \d+ positions$"):  # fmt: skip
            dilstore.open_reader(indexed["store"], indexed["model"], max_question_length=limit)
    monkeypatch.undo()
    with dilstore.open_reader(indexed["store"], indexed["model"], max_question_length=20) as reader:
        assert reader.answer(QUESTION).nbest


@pytest.mark.parametrize("change", [{"model_type": "nonsense"}, {"hidden_size": "x"}], ids=["architecture", "type"])
def test_a_model_whose_config_transformers_cannot_read_is_named_by_the_loading_not_the_limit_check(
        indexed: dict[str, Any], tmp_path: Path, change: dict[str, str]) -> None:
    """(mut55) The question limit is checked from the model's config before it loads; a config transformers cannot
    read (an unknown model_type, a ValueError there; a value of the wrong type, huggingface_hub's
    StrictDataclassFieldValidationError) is left to the loading, which names the folder, not a bare error from the
    early check."""
    import dilstore

    model = shutil.copytree(indexed["model"], tmp_path / "model")
    config = json.loads((model / "config.json").read_text(encoding="utf-8"))
    (model / "config.json").write_text(json.dumps({**config, **change}), encoding="utf-8")
    with pytest.raises(DilstoreError, match=f"^cannot load a model from {model}: "):
        dilstore.open_reader(indexed["store"], model)


def test_a_store_whose_first_index_is_being_built_says_so(indexed: dict[str, Any], tmp_path: Path) -> None:
    """While a first `dilstore index` ran, `ask` and `serve` said "build it with `dilstore index`" (conc39 M2). (mut60
    M5) So do the checks `ask` and `evaluate-qa` run before torch loads: handed no store folder, they said so again,
    and no test noticed."""
    from dilstore.reader.serving.store_checks import check_reader_inputs

    store = shutil.copytree(indexed["store"], tmp_path / "store", ignore=shutil.ignore_patterns("bm25"))
    building = rf"^the index of {store} is being built by pid "
    with held_lock(store, INDEX_ROLE) as holder, pytest.raises(DilstoreError, match=f"{building}{holder} "):
        open_reader(store, indexed["model"])
    with held_lock(store, INDEX_ROLE) as holder, pytest.raises(DilstoreError, match=f"{building}{holder} "):
        check_reader_inputs(str(store), indexed["model"], None)
    with pytest.raises(DilstoreError, match="no Lucene index at .*: build it with `dilstore index"):
        open_reader(store, indexed["model"])
    elsewhere = tmp_path / "elsewhere"  # `dilstore index` never writes it: no wait or build fills it (review40 L1)
    with held_lock(store, INDEX_ROLE), pytest.raises(DilstoreError, match=f"^no Lucene index at {elsewhere}: give the "
                                                                          "folder of one `dilstore index` built"):
        open_reader(store, indexed["model"], index_dir=elsewhere)


def test_a_store_without_an_index_under_a_compaction_says_to_build_one(indexed: dict[str, Any], tmp_path: Path) -> None:
    """(conc54 F1) A compaction holds the store's index lock beside its write lock, and brings no index along where
    none covers the store: `serve`, `ask` and `evaluate-qa` said "being built by pid N (`dilstore index`): wait for
    it" of it, and a server that met the compacted store before the compaction let go of its locks kept saying so
    after it had ended, while no index would ever come."""
    from dilstore.storage.write_lock import WRITE_ROLE

    store = shutil.copytree(indexed["store"], tmp_path / "store", ignore=shutil.ignore_patterns("bm25"))
    with held_lock(store, WRITE_ROLE, INDEX_ROLE) as compaction, pytest.raises(DilstoreError) as refused:
        open_reader(store, indexed["model"])
    assert str(refused.value) == (f"no Lucene index at {store / 'bm25'}: the store is being compacted by pid "
                                  f"{compaction} (`dilstore compact`), which brings no index along where none covers "
                                  f"the store; build it with `dilstore index {store}` once that is done")


def test_an_index_of_fewer_documents_than_the_store_is_refused(indexed: dict[str, Any], tmp_path: Path) -> None:
    """An index of some of the store's passages with the record of a whole one copied in passed every check: the
    others were never retrieved, and answers were silently worse (hostile47 F2). One built by hand, with no
    record, may cover a chosen subset."""
    from dilstore.reader.retrieval import INDEX_RECORD, indexed_state
    from dilstore.storage.location import StoreLocation
    from dilstore.storage.manifest import read_manifest

    documents = collection_documents(indexed["store"], indexed["ids"])
    write_collection(tmp_path / "collection" / "passages.jsonl", documents[1:])
    partial = tmp_path / "partial"
    build_bm25_index(tmp_path / "collection", partial)
    open_reader(indexed["store"], indexed["model"], index_dir=partial).close()  # no record: a subset by choice
    whole = indexed_state(read_manifest(StoreLocation.parse(indexed["store"])))
    (partial / INDEX_RECORD).write_text(json.dumps(whole))  # as `dilstore index` records a whole index
    with pytest.raises(DilstoreError, match=rf"^the BM25 index {partial} holds {len(documents) - 1} documents, but "
                                            rf"the store {indexed['store']} serves {len(documents)} passages"):
        open_reader(indexed["store"], indexed["model"], index_dir=partial)


def test_verify_checks_the_index_with_lucene_s_checksums(indexed: dict[str, Any], tmp_path: Path, capsys) -> None:
    """A garbled segment file of STORE/bm25 gave some queries other BM25 scores with no error, and `verify` said OK
    (hostile47 F3): the index is outside the manifest. verify now runs Lucene's checksums over it."""
    store = shutil.copytree(indexed["store"], tmp_path / "store")
    assert main(["verify", str(store), "--json"]) == 0
    assert not [path for path in json.loads(capsys.readouterr().out)["untracked"] if path.startswith("bm25/")]
    postings = sorted((store / "bm25").glob("*.doc"))[0]
    garbled = bytearray(postings.read_bytes())
    garbled[len(garbled) // 2] ^= 0x5A
    postings.write_bytes(bytes(garbled))
    assert main(["verify", str(store), "--json"]) == 1
    problems = json.loads(capsys.readouterr().out)["problems"]
    assert len(problems) == 1 and problems[0].startswith(f"the BM25 index {store / 'bm25'} is damaged: "
                                                         f"{postings.name}: checksum failed"), problems  # fmt: skip
    assert "resource=" not in problems[0], "without Lucene's object dump"


def test_an_index_of_another_store_is_named_as_such(indexed: dict[str, Any], tmp_path: Path) -> None:
    """It was refused with the message for an index an append made stale, which advised rebuilding the wrong one."""
    from dilstore.reader.retrieval import INDEX_RECORD

    other = tmp_path / "other-bm25"
    shutil.copytree(bm25_index_dir(indexed["store"]), other)
    record = json.loads((other / INDEX_RECORD).read_text()) if (other / INDEX_RECORD).exists() else {}
    (other / INDEX_RECORD).write_text(json.dumps({**record, "generation": "0123456789abcdef"}))
    with pytest.raises(DilstoreError) as raised:
        open_reader(indexed["store"], indexed["model"], index_dir=other)
    message = str(raised.value)
    assert f"the BM25 index at {other} was built for another store (build '0123456789abcdef')" in message
    assert f"give its own index, which `dilstore index {indexed['store']}` builds" in message
    # Given elsewhere, the index is not the one `dilstore index` rebuilds (review47 F6).
    assert message.endswith(f"(it writes {indexed['store'] / 'bm25'}: give that, or a copy of it, in place of {other})")
    # `dilstore index URL` refuses URLs: a store at one is indexed as a local copy (remote40 L4).
    from dilstore.reader.retrieval import check_index_covers
    from dilstore.storage.location import StoreLocation
    from dilstore.storage.manifest import read_manifest

    manifest = read_manifest(StoreLocation.parse(indexed["store"]))
    with pytest.raises(DilstoreError, match=r"which `dilstore index` of a local copy of http://h/s builds$"):
        check_index_covers(other, manifest, "http://h/s")
    (other / INDEX_RECORD).write_text("[1, 2]")
    with pytest.raises(DilstoreError, match=r"dilstore-index.json is not a JSON object; rebuild the index"):
        open_reader(indexed["store"], indexed["model"], index_dir=other)


def test_hits_equal_pyserinis_lucene_searcher(indexed: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """Bm25Searcher calls Anserini's SimpleSearcher directly: the same ids, scores and order as pyserini's wrapper."""
    monkeypatch.setenv("OPENAI_API_KEY", "unused")  # pyserini's encoder module builds an OpenAI client on import
    start_jvm()  # before pyserini's import, which would otherwise start it without dilstore's options
    from pyserini.search.lucene import LuceneSearcher

    index = bm25_index_dir(indexed["store"])
    ours, reference = Bm25Searcher(index), LuceneSearcher(str(index))
    queries = {"q1": QUESTION, "q2": "Who polishes mallets?", "q3": "the", "q4": "network open museum 1882 tram"}
    for k in (1, 3, 10):
        expected = {qid: [(hit.docid, hit.score) for hit in reference.search(query, k=k)]
                    for qid, query in queries.items()}
        assert {qid: [(hit.passage_id, hit.score) for hit in ours.search(query, k)]
                for qid, query in queries.items()} == expected
        batch = ours.batch_search(list(queries.values()), list(queries), k, threads=2)
        assert {qid: [(hit.passage_id, hit.score) for hit in hits] for qid, hits in batch.items()} == expected
    assert any(len(hits) > 1 for hits in expected.values())


def test_an_index_id_missing_from_the_store_is_a_clear_error(indexed: dict[str, Any]) -> None:
    odqa = open_reader(indexed["store"], indexed["model"])
    with pytest.raises(MissingPassagesError, match="ghost#0"):
        odqa.answer("xylophone museum")
    assert odqa.answer(QUESTION).text


def test_ask_json_and_text(indexed: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> None:
    base = ["ask", str(indexed["store"]), QUESTION, "--model", str(indexed["model"]), "--top-p", "2"]
    assert main([*base, "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    expected = {"question", "answer", "score", "passage_id", "reader_score", "bm25_score", "nbest", "timings"}
    assert expected <= set(document) and document["question"] == QUESTION
    assert main([*base, "--mu", "1"]) == 0
    text = capsys.readouterr().out
    assert f"answer: {document['answer']}" in text
    assert f"[[{document['answer']}]]" in text
    assert "retrieval" in text and "interaction layers" in text


def test_evaluate_qa_command(indexed: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> None:
    questions = indexed["root"] / "questions.jsonl"
    questions.write_text(
        "\n".join(json.dumps(q) for q in [
            {"question": QUESTION, "answer": ["1882"]},
            {"question": "How high is Mount Kilimanjaro?", "answer": ["5,895 metres"]},
            {"question": "Who was the lighthouse keeper?", "answer": ["Ingrid Solberg"]},
        ]) + "\n"
    )  # fmt: skip
    base = ["evaluate-qa", str(indexed["store"]), "--questions", str(questions), "--model", str(indexed["model"])]
    assert main([*base, "--top-p", "3", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert (summary["questions"], summary["top_p"], summary["mu"]) == (3, 3, 0.5)
    assert summary["recall"] == 100.0  # every answer is in its question's top-3 passages
    assert all(0 <= row["em"] <= row["f1"] + 1e-9 <= 100 + 1e-9 for row in summary["by_mu"])
    assert main([*base, "--limit", "2"]) == 0
    captured = capsys.readouterr()
    assert "questions 2" in captured.out and "mu 1 (reader only)" in captured.out
    assert "mu 0.5 (reader + BM25)" in captured.out
    assert "evaluate-qa" in captured.err and "2/2" in captured.err  # the bar, on stderr
    assert main([*base, "--limit", "2", "--no-progress"]) == 0
    assert "2/2" not in capsys.readouterr().err
    questions.write_text(json.dumps({"question": "\u200b\u200b", "answer": ["1882"]}) + "\n")
    assert main([*base, "--no-progress"]) == 0  # a question of zero-width spaces was counted as "too long" (odqa43)
    assert ("1 question(s) the reader refused (over its 64-token question limit, or no word pieces at all) scored as "
            "unanswered") in capsys.readouterr().out  # fmt: skip


def test_commands_report_bad_setups_without_a_traceback(
    indexed: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    other = write_reader_checkpoint(tmp_path / "other", seed=1)
    assert main(["ask", str(indexed["store"]), QUESTION, "--model", str(other)]) == 2
    assert "different model" in capsys.readouterr().err
    assert main(["ask", str(indexed["store"]), QUESTION, "--index", str(tmp_path / "none")]) == 2
    assert "dilstore index" in capsys.readouterr().err
    assert main(["ask", str(indexed["store"]), "   ", "--model", str(indexed["model"])]) == 2
    assert "question is empty" in capsys.readouterr().err


@pytest.mark.shared_data
@pytest.mark.parametrize("encoding", ["fp16", "2bit"])
def test_mini_opensquad_benchmark_runs_end_to_end_on_a_tiny_corpus(
    indexed: dict[str, Any], shared_data: Path, tmp_path: Path, encoding: str
) -> None:
    script = ROOT / "benchmarks" / "mini_opensquad.py"
    spec = importlib.util.spec_from_file_location("mini_opensquad", script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    output = tmp_path / "result.json"
    argv = ["--work", str(tmp_path / "work"), "--model", str(indexed["model"]), "--data", str(shared_data),
            "--squad-paragraphs", "12", "--msmarco-passages", "30", "--limit", "6", "--top-p", "3", "10",
            "--max-length", "64", "--threads", "1", "--encoding", encoding, "--output", str(output)]  # fmt: skip
    assert module.main(argv) == 0
    result = json.loads(output.read_text())
    assert result["encoding"] == encoding
    assert verify_store(tmp_path / "work" / "store").ok  # a 2bit store keeps its codebook in STORE/codebook
    assert result["questions"] == 6 and result["passages"] >= 42
    assert [row["top_p"] for row in result["rows"]] == [3, 10]
    for row in result["rows"]:
        assert 0 <= row["em_without_bm25"] <= 100 and 0 <= row["recall"] <= 100
    assert result["rows"][0]["recall"] <= result["rows"][1]["recall"]
    # The store --work holds was read whatever was asked: --encoding int8 reported the fp16 store's scores.
    other = {"fp16": "int8", "2bit": "fp16"}[encoding]
    assert module.main([*argv[:-4], "--encoding", other, "--output", str(tmp_path / "other.json")]) == 2
    assert not (tmp_path / "other.json").exists()


def test_mini_opensquad_reads_a_given_store_and_refuses_one_without_its_bm25_index(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """bench53 F1: --store STORE ("skips steps 1 and 2") built a BM25 index into STORE, a store it only reads, and
    refused a store of another model only after that."""
    spec = importlib.util.spec_from_file_location("mini_opensquad", ROOT / "benchmarks" / "mini_opensquad.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    model_dir, store_dir, _ = write_reader_and_store(tmp_path)
    before = sorted(store_dir.rglob("*"))
    output = tmp_path / "result.json"
    argv = ["--work", str(tmp_path / "work"), "--store", str(store_dir), "--model", str(model_dir), "--limit", "2",
            "--threads", "1", "--output", str(output)]  # fmt: skip
    assert module.main(argv) == 2
    assert f"has no BM25 index at {store_dir / 'bm25'}: build it with `dilstore index {store_dir}`" in (
        capsys.readouterr().err
    )
    assert sorted(store_dir.rglob("*")) == before, "nothing written into the store given"
    assert not output.exists()


def test_mini_opensquad_indexes_the_folded_text_dilstore_index_indexes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """mini_opensquad builds its store's index itself, as "exactly what `dilstore index` indexes"; once `dilstore
    index` folded the collection (NFKC, unicode56 F2), the benchmark still indexed the text as stored, so its R was
    of another retrieval than a store the commands built."""
    passages = [SimpleNamespace(id="p1", title="Zu\u0308rich", text="ﬁnance in １９９８"),
                SimpleNamespace(id="p2", title="", text="plain text")]  # fmt: skip
    built: list[Path] = []
    with benchmark_module("mini_opensquad") as module:
        monkeypatch.setattr(module, "open_store", lambda store: SimpleNamespace(fetch=lambda ids: passages))
        monkeypatch.setattr(module, "build_bm25_index", lambda collection, index, threads: built.append(collection))
        module.build_index(tmp_path / "store", ["p1", "p2"], tmp_path / "work")
    assert built == [tmp_path / "work" / "collection"]
    lines = (built[0] / "passages.jsonl").read_text(encoding="utf-8").splitlines()
    assert [json.loads(line) for line in lines] == [{"id": "p1", "contents": "Zürich\nfinance in 1998"},
                                                    {"id": "p2", "contents": "plain text"}]  # fmt: skip


@pytest.mark.shared_data
def test_online_variant_curve_scores_step_0_through_the_real_mini_opensquad(
    shared_data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """bench53 F11: the curve gave mini_opensquad.py --work DIR and --output DIR/step-N.json, an output inside its
    --work, which it refuses: every call failed at step 0. (The curve's own test replaces mini_opensquad.)"""
    model_dir, store_dir, ids = write_reader_and_store(tmp_path)
    write_collection(tmp_path / "collection" / "passages.jsonl", collection_documents(store_dir, ids))
    build_bm25_index(tmp_path / "collection", bm25_index_dir(store_dir))
    (tmp_path / "run").mkdir()  # a run with no checkpoint yet: the curve is step 0 alone
    argv = [str(tmp_path / "run"), "--store", str(store_dir), "--work", str(tmp_path / "work"), "--base",
            str(model_dir), "--limit", "2", "--top-p", "3", "--threads", "1"]  # fmt: skip
    with benchmark_module("online_variant_curve") as module:
        assert module.main(argv) == 0, capsys.readouterr().err
    rows = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert [(row["step"], row["top_p"]) for row in rows] == [(0, 3)]
    assert json.loads((tmp_path / "work" / "step-0.json").read_text())["questions"] == 2


def test_answer_recall_benchmark_counts_r_by_both_definitions(
    indexed: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """"4" is in "€4.50" only as DPR's tokens see it; "5895 metres" is in "5,895 metres" only once SQuAD's
    normalisation deletes the comma; "1882" is found both ways and the curators' answer by neither."""
    script = ROOT / "benchmarks" / "answer_recall.py"
    spec = importlib.util.spec_from_file_location("answer_recall", script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    questions = tmp_path / "questions.jsonl"
    questions.write_text("".join(json.dumps({"question": question, "answer": answers}) + "\n" for question, answers in [
        ("When did the Zürich tram network open?", ["1882"]),
        ("What does the café sell crème brûlée for?", ["4"]),
        ("How high does Mount Kilimanjaro rise?", ["5895 metres"]),
        ("Who won the Nobel Prize?", ["Ingrid Solberg"]),
    ]))  # fmt: skip
    output = tmp_path / "recall.json"
    args = ["--store", str(indexed["store"]), "--questions", str(questions), "--top-p", "4", "--output", str(output)]
    assert module.main(args) == 0
    result = json.loads(output.read_text())
    assert json.loads(capsys.readouterr().out.splitlines()[-1]) == result
    assert result["questions"] == 4 and len(result["rows"]) == 1
    assert result["rows"][0] == {"top_p": 4, "recall_dpr": 50.0, "recall_squad_normalised": 50.0, "only_dpr": 1,
                                 "only_squad_normalised": 1}  # fmt: skip


def test_a_build_java_cannot_write_is_one_error_naming_the_folder(indexed: dict[str, Any], tmp_path: Path) -> None:
    """A Java exception that stopped a build (a folder it could not create, another build's write.lock) was a Python
    and Java traceback."""
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder", encoding="utf-8")
    with pytest.raises(DilstoreError, match=rf"could not be built in {blocker / 'bm25'} \(java\.") as raised:
        build_bm25_index(indexed["root"] / "collection", blocker / "bm25")
    assert str(raised.value).startswith(f"the BM25 index of {indexed['root'] / 'collection'} ")


def test_a_folder_whose_name_is_not_utf8_is_named_not_a_unicode_traceback(
    indexed: dict[str, Any], tmp_path: Path
) -> None:
    """A store in a folder whose name is not UTF-8 (Python reads such a name with surrogate escapes) opened and read,
    but `dilstore.build_index` and `open_reader` (its BM25 searcher) raised a bare UnicodeEncodeError from the Java
    bridge, "'utf-16' codec can't encode character '\\udcff'", and `dilstore index` said only "text that is not
    valid UTF-8" (api54 F6). Each names the folder, before the JVM is asked."""
    import os

    odd = tmp_path / os.fsdecode(b"store-\xff")
    shutil.copytree(indexed["root"] / "collection", odd / "collection")
    shutil.copytree(bm25_index_dir(indexed["store"]), odd / "bm25")
    odd_path = "has a path that is not UTF-8 text, which Lucene"
    with pytest.raises(DilstoreError, match=rf"^the BM25 index folder .*store-\\udcff/bm25' {odd_path}"):
        Bm25Searcher(odd / "bm25")
    with pytest.raises(DilstoreError, match=rf"^the passages to index .*store-\\udcff/collection' {odd_path}"):
        build_bm25_index(odd / "collection", tmp_path / "new-bm25")
    with pytest.raises(DilstoreError, match=rf"^the BM25 index folder .*store-\\udcff/new-bm25' {odd_path}"):
        build_bm25_index(indexed["root"] / "collection", odd / "new-bm25")
