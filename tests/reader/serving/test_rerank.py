"""Reranking with stored EARL representations: scores through the store equal the unsplit ranker.

Stores are written with the storage writer directly (no Beam): documents are
tokenized as `[CLS] d [SEP]`, encoded by `EarlRanker.encode_documents` (S1)
and `document_key_values` (S2), split over two shards and finalized with the
ranker's fingerprint, as `dilstore precompute --kind earl-s1|earl-s2` does.
The ranker is a tiny random 3-layer BERT (N = 1, M = 2) over the real MiniLM
vocabulary, so real text goes through it.
"""

from __future__ import annotations

import argparse
import errno
import importlib.util
import json
import shutil
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import zarr
from transformers import BertConfig, BertModel

from dilstore.reader.data.trec import rank_documents, read_run, write_run
from dilstore.reader.modeling.checkpoints import TRAINING_METADATA_FILE
from dilstore.reader.modeling.earl import EarlConfig, EarlRanker
from dilstore.reader.modeling.fingerprint import model_fingerprint
from dilstore.reader.modeling.ranking_inputs import DEFAULT_MAX_QUERY_LENGTH
from dilstore.reader.packaged.shipped import DEFAULT_RANKER_NAME
from dilstore.reader.serving.rerank import (
    EarlReranker,
    RerankSettings,
    RerankStats,
    open_reranker,
    require_topics,
    split_hint,
)
from dilstore.reader.text.tokenization import encode_document
from dilstore.runners.cli import main
from dilstore.storage.errors import DilstoreError
from dilstore.storage.finalize import finalize
from dilstore.storage.fingerprint import FingerprintMismatchError
from dilstore.storage.messages import other_form_hint
from dilstore.storage.reader import MissingPassagesError, open_store
from dilstore.storage.records import PassageRecord
from dilstore.storage.writer import write_shard
from tests.fixtures.earl_tiny import INIT, tokenizer
from tests.fixtures.paths import ROOT
from tests.fixtures.store_fixtures import build_store, random_shards
from tests.fixtures.text_forms import full_width

MAX_LENGTH = 32  # document tokens stored; the harbour log below is truncated to it
KINDS = ("earl-s1", "earl-s2")
# Largest |stored − unsplit| score difference accepted per encoding. Scores of the tiny ranker lie in
# about 0.2..0.45 with neighbours at least 0.0075 apart; measured errors: fp32 2e-7, fp16 2e-5, int8 7e-4.
TOLERANCE = {"fp32": 1e-4, "fp16": 1e-4, "int8": 2e-3}
# Small batches, so documents are judged in several buckets of different padding.
SMALL_BATCHES = RerankSettings(pair_batch_tokens=60, max_pairs_per_batch=3)

DOCUMENTS = {
    "tram": "The Zürich tram network opened in 1882 and is run by VBZ.",
    "curie": "Marie Curie won the Nobel Prize in Chemistry in 1911.",
    "cafe": "The café on the corner sells crème brûlée for €4.50 every Sunday.",
    "kili": "Mount Kilimanjaro rises 5,895 metres above sea level in Tanzania.",
    "short": "Trams.",
    "log": " ".join(f"Line {i} of the harbour log mentions ropes, tides and gulls." for i in range(1, 7)),
}
QUERIES = {
    "q1": "When did the Zürich tram network open?",
    "q2": "Who won the Nobel Prize in Chemistry?",
    "q3": "How high is Kilimanjaro?",
}


def save_ranker(directory: Path, seed: int, prior: bool = False) -> Path:
    """A random 3-layer ranker over the MiniLM vocabulary, initialised the paper's way and saved."""
    config = BertConfig(
        vocab_size=tokenizer().vocab_size, hidden_size=32, num_hidden_layers=3, num_attention_heads=4,
        intermediate_size=64, max_position_embeddings=64, initializer_range=INIT,
    )  # fmt: skip
    torch.manual_seed(seed)
    encoder = BertModel(config, add_pooling_layer=False).eval()
    return EarlRanker.from_encoder(encoder, tokenizer(), EarlConfig(prior=prior)).save_pretrained(directory)


def earl_records(ranker: EarlRanker, kind: str, documents: dict[str, str]) -> list[PassageRecord]:
    """`documents` (id: text) encoded by `ranker` as S1 or S2 records, as precompute stores them."""
    ids, texts = list(documents), list(documents.values())
    tokens = [encode_document(ranker.tokenizer, text, MAX_LENGTH) for text in texts]
    with torch.inference_mode():
        input_ids, mask = ranker.tokenize_documents(texts, MAX_LENGTH)  # (b, n), (b, n)
        states = ranker.encode_documents(input_ids, mask)  # (b, n, d)
        if kind == "earl-s2":
            states = ranker.document_key_values(states)  # (b, n, M, 2, d)
    return [
        PassageRecord(docid, "", text, piece.token_ids, piece.char_spans, states[row, : len(piece)].numpy())
        for row, (docid, text, piece) in enumerate(zip(ids, texts, tokens, strict=True))
    ]


def write_earl_store(directory: Path, ranker: EarlRanker, kind: str, encoding: str) -> Path:
    """DOCUMENTS encoded by `ranker` as S1 or S2, in two shards, finalized with the ranker's fingerprint."""
    records = earl_records(ranker, kind, DOCUMENTS)
    write_shard(directory, 0, records[:3], kind=kind, encoding=encoding, durable=False)
    write_shard(directory, 1, records[3:], kind=kind, encoding=encoding, durable=False)
    finalize(directory, model_fingerprint(ranker, kind, encoding, MAX_LENGTH))
    return directory


def unsplit_scores(ranker: EarlRanker, query: str, docids: list[str]) -> dict[str, float]:
    """`EarlRanker.forward` on the query and document texts: the reference the stored path must equal."""
    texts = [DOCUMENTS[docid] for docid in docids]
    with torch.inference_mode():
        query_ids, query_mask = ranker.tokenize_queries([query] * len(texts), 64)  # (b, nq)
        doc_ids, doc_mask = ranker.tokenize_documents(texts, MAX_LENGTH)  # (b, n)
        scores = ranker(query_ids, query_mask, doc_ids, doc_mask)  # (b,)
    return dict(zip(docids, scores.tolist(), strict=True))


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_ranker(tmp_path_factory.mktemp("earl") / "model", seed=0)


@pytest.fixture(scope="module")
def ranker(model_dir: Path) -> EarlRanker:
    return EarlRanker.from_pretrained(model_dir)


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory, ranker: EarlRanker) -> Callable[[str, str], Path]:
    """`store(kind, encoding)`: the store of DOCUMENTS, written once per module."""
    root = tmp_path_factory.mktemp("stores")
    made: dict[tuple[str, str], Path] = {}

    def get(kind: str, encoding: str = "fp32") -> Path:
        if (kind, encoding) not in made:
            made[kind, encoding] = write_earl_store(root / f"{kind}-{encoding}", ranker, kind, encoding)
        return made[kind, encoding]

    return get


def cli(capsys: pytest.CaptureFixture[str], *args: object) -> tuple[int, str, str]:
    """Run `dilstore rerank ARGS` in this process: exit status, stdout and stderr."""
    status = main(["rerank", *map(str, args)])
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def write_inputs(directory: Path, run: dict[str, dict[str, float]], topics: dict[str, str] = QUERIES) -> list[Path]:
    """topics.tsv and first.trec in `directory`; returns the CLI's --topics/--run/--output arguments."""
    directory.mkdir(parents=True, exist_ok=True)
    topics_file = directory / "topics.tsv"
    topics_file.write_text("".join(f"{qid}\t{query}\n" for qid, query in topics.items()), encoding="utf-8")
    write_run(directory / "first.trec", run, tag="bm25")
    return ["--topics", topics_file, "--run", directory / "first.trec", "--output", directory / "out.trec"]


# A first-stage run where queries share documents and each lists 4 or 6 of them.
FIRST_STAGE = {
    "q1": {"tram": 9.0, "short": 8.0, "log": 7.0, "curie": 6.0, "cafe": 5.0, "kili": 4.0},
    "q2": {"curie": 3.0, "tram": 2.5, "cafe": 2.0, "log": 1.0},
    "q3": {"kili": 12.0, "tram": 11.0, "short": 10.0, "curie": 9.5, "log": 9.0, "cafe": 8.0},
}


# ---------------------------------------------------------------------- scores through the store


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("settings", [RerankSettings(), SMALL_BATCHES], ids=["one-batch", "small-batches"])
def test_fp32_store_scores_equal_the_unsplit_ranker(
    kind: str, settings: RerankSettings, store: Callable[..., Path], model_dir: Path, ranker: EarlRanker
) -> None:
    reranker = open_reranker(store(kind), model_dir, settings=settings)
    for query in QUERIES.values():
        got = reranker.rerank(query, list(DOCUMENTS))
        expected = unsplit_scores(ranker, query, list(DOCUMENTS))
        assert got.keys() == expected.keys()
        np.testing.assert_allclose([got[d] for d in expected], list(expected.values()), rtol=0, atol=1e-4)



def test_judging_batches_stay_within_the_pair_token_budget(
    store: Callable[..., Path], model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A judging batch's padded size is its pairs times (query + longest document) tokens, as RerankSettings says;
    batches counted by their documents alone went past pair_batch_tokens with scores unchanged (mut57a)."""
    reranker = open_reranker(store("earl-s1"), model_dir, settings=SMALL_BATCHES)
    judge, shapes = reranker.model.judge, []

    def recording(query_states: torch.Tensor, query_mask: torch.Tensor, doc_mask: torch.Tensor,
                  **states: torch.Tensor) -> torch.Tensor:  # fmt: skip
        shapes.append((doc_mask.shape[0], query_mask.shape[1] + doc_mask.shape[1]))  # (pairs, query + document)
        return judge(query_states, query_mask, doc_mask, **states)

    monkeypatch.setattr(reranker.model, "judge", recording)
    reranker.rerank(QUERIES["q1"], list(DOCUMENTS))
    assert any(pairs > 1 for pairs, _ in shapes), "some batch holds several pairs"
    assert all(pairs * width <= SMALL_BATCHES.pair_batch_tokens for pairs, width in shapes if pairs > 1), shapes

@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("encoding", ["fp16", "int8"])
def test_reduced_precision_scores_are_close_and_keep_the_order(
    kind: str, encoding: str, store: Callable[..., Path], model_dir: Path, ranker: EarlRanker
) -> None:
    reranker = open_reranker(store(kind, encoding), model_dir, settings=SMALL_BATCHES)
    for query in QUERIES.values():
        got = reranker.rerank(query, list(DOCUMENTS))
        expected = unsplit_scores(ranker, query, list(DOCUMENTS))
        difference = max(abs(got[d] - expected[d]) for d in expected)
        assert difference <= TOLERANCE[encoding], f"{encoding} {kind}: {difference}"
        assert [d for d, _ in rank_documents(got)] == [d for d, _ in rank_documents(expected)]


def test_a_query_typed_in_full_width_scores_as_the_plain_one(store: Callable[..., Path], model_dir: Path) -> None:
    """Full-width letters (a CJK input method's) were [UNK] pieces: the scores of another query. Folded (NFKC)."""
    reranker = open_reranker(store("earl-s2"), model_dir)
    wide = full_width(QUERIES["q1"])
    assert "[UNK]" in reranker.model.tokenizer.tokenize(wide)
    assert reranker.rerank(wide, list(DOCUMENTS)) == reranker.rerank(QUERIES["q1"], list(DOCUMENTS))


def test_rerank_scores_repeated_ids_once_and_counts(store: Callable[..., Path], model_dir: Path) -> None:
    reranker = open_reranker(store("earl-s2"), model_dir)
    stats = RerankStats()
    got = reranker.rerank(QUERIES["q1"], ["kili", "tram", "kili", "tram"], stats=stats)
    assert list(got) == ["kili", "tram"]
    assert got == reranker.rerank(QUERIES["q1"], ["tram", "kili"])
    assert (stats.queries, stats.pairs, stats.skipped) == (1, 2, 0)
    assert stats.seconds >= stats.query_layers + stats.store_read + stats.judge > 0
    assert reranker.rerank(QUERIES["q1"], []) == {}


def test_a_run_s_seconds_count_its_queries_tokenizing(
    store: Callable[..., Path], model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """(mut55) `rerank_run` tokenizes every query before the first is scored, and adds each query's tokenizing to
    the stats with that query: its time under query_layers and under seconds alike, so that the wall clock still
    covers the stages (tokenizing made slow here, 50 ms a query, so that leaving it out of seconds shows)."""
    reranker = open_reranker(store("earl-s2"), model_dir)
    tokenize = reranker.tokenize_query

    def slow(query: str) -> object:
        time.sleep(0.05)
        return tokenize(query)

    monkeypatch.setattr(reranker, "tokenize_query", slow)
    _, stats = reranker.rerank_run(QUERIES, FIRST_STAGE, depth=2)
    assert stats.queries == len(QUERIES) and stats.query_layers >= 0.05 * len(QUERIES)
    assert stats.seconds >= stats.query_layers + stats.store_read + stats.judge


def test_states_that_are_not_finite_are_named_not_scored_nan(
    store: Callable[..., Path], model_dir: Path, tmp_path: Path
) -> None:
    """open_reranker(...).rerank returned NaN scores for documents with NaN states (hostile46 F7)."""
    damaged = Path(shutil.copytree(store("earl-s1"), tmp_path / "nan"))
    for values in damaged.glob("shards/*/states/values"):
        array = zarr.open_array(values, mode="r+")
        array[...] = np.full(array.shape, np.nan, dtype=array.dtype)
    with pytest.raises(DilstoreError, match=r"^document '.*': its score is not finite, as its stored states hold NaN"):
        open_reranker(damaged, model_dir).rerank(QUERIES["q1"], ["kili", "tram"])


def test_rerank_run_with_shared_documents(store: Callable[..., Path], model_dir: Path, ranker: EarlRanker) -> None:
    reranker = open_reranker(store("earl-s1"), model_dir, settings=SMALL_BATCHES)
    reranked, stats = reranker.rerank_run(QUERIES, FIRST_STAGE, depth=100)
    assert list(reranked) == list(FIRST_STAGE)
    for qid, first_stage in FIRST_STAGE.items():
        expected = unsplit_scores(ranker, QUERIES[qid], list(first_stage))
        assert reranked[qid].keys() == expected.keys()
        np.testing.assert_allclose([reranked[qid][d] for d in expected], list(expected.values()), atol=1e-4)
    assert (stats.queries, stats.pairs, stats.skipped) == (3, 16, 0)


def test_documents_below_depth_follow_in_first_stage_order(store: Callable[..., Path], model_dir: Path) -> None:
    reranker = open_reranker(store("earl-s1"), model_dir)
    reranked, stats = reranker.rerank_run(QUERIES, FIRST_STAGE, depth=2)
    assert stats.pairs == 6
    for qid, first_stage in FIRST_STAGE.items():
        first_order = [d for d, _ in rank_documents(first_stage)]
        order = [d for d, _ in rank_documents(reranked[qid])]
        head = reranker.rerank(QUERIES[qid], first_order[:2])
        assert order[:2] == [d for d, _ in rank_documents(head)]
        assert order[2:] == first_order[2:]
        assert {d: reranked[qid][d] for d in order[:2]} == head
        assert max(reranked[qid][d] for d in order[2:]) < min(head.values())
    assert reranker.rerank_run(QUERIES, FIRST_STAGE, depth=np.int64(2))[0] == reranked  # a numpy count (api39 L1)
    # The tiny ranker's two scores of a query lie within 1 of each other, so a tail counted down from the highest
    # score, not the lowest, still ended below both (mut57a): scores 4 apart put it between them.
    reranker._score = lambda tokens, documents, stats: [4.0 * index for index in range(len(documents))]
    spread, _ = reranker.rerank_run(QUERIES, FIRST_STAGE, depth=2)
    for qid, first_stage in FIRST_STAGE.items():
        first_order = [d for d, _ in rank_documents(first_stage)]
        assert [d for d, _ in rank_documents(spread[qid])] == first_order[1::-1] + first_order[2:]
        assert [spread[qid][d] for d in first_order[2:4]] == [-1.0, -2.0]


def test_done_is_a_collection_of_qids_never_a_string(store: Callable[..., Path], model_dir: Path) -> None:
    """`done="q1q2"` was searched for qids as substrings: q1 and q2 were left out as reranked before, and the run came
    back with q3 alone, not a word said; `done=[1]` matched no qid, so each was scored again (api54 F2)."""
    with open_reranker(store("earl-s1"), model_dir) as reranker:
        for refused, named in (("q1q2", "str 'q1q2'"), (b"q1", "bytes b'q1'"), (5, "int 5")):
            with pytest.raises(DilstoreError, match=f"^done must be the qids an earlier run reranked .*, got {named}$"):
                reranker.rerank_run(QUERIES, FIRST_STAGE, done=refused)
        with pytest.raises(DilstoreError, match="^done must hold qids, strings, got int 1$"):
            reranker.rerank_run(QUERIES, FIRST_STAGE, done=[1])
        reranked, _ = reranker.rerank_run(QUERIES, FIRST_STAGE, done=(qid for qid in ["q1", "q2"]))
        assert list(reranked) == ["q3"]


# ---------------------------------------------------------------------- refusals in the library


@pytest.mark.parametrize(
    ("call", "message"),
    [
        # Each was a bare AttributeError or TypeError, or a path read as one qid per character (readme37 M4).
        (lambda r: r.rerank_run(QUERIES, {"q1": ["tram"]}), "the run must map string qids to {docid: value}"),
        (lambda r: r.rerank_run(QUERIES, "run.trec"), "the run must be a {qid: {docid: score}} mapping .*got str"),
        (lambda r: r.rerank_run(QUERIES, {"q1": {"tram": "1"}}), "must give each string docid a finite score"),
        (lambda r: r.rerank_run("q1 text", {"q1": {"tram": 1.0}}), "the topics must be a {qid: query text} mapping"),
        (lambda r: r.rerank_run({"q1": 7}, {"q1": {"tram": 1.0}}), "the topic of query 'q1' must be its text"),
        (lambda r: r.rerank(QUERIES["q1"], ["tram"], stats={}), "stats must be a RerankStats or None, got dict"),
        (lambda r: r.rerank(QUERIES["q1"], ["tram"], skip_missing="yes"), "skip_missing must be True or False"),
        # A bare TypeError from dict.fromkeys; on_query's only after the first query was scored (rank38 M5).
        (lambda r: r.rerank(QUERIES["q1"], [["tram"]]), "doc_ids must be strings, got list"),
        (lambda r: r.rerank(QUERIES["q1"], [{"a": 1}]), "doc_ids must be strings, got dict"),
        (lambda r: r.rerank_run(QUERIES, {"q1": {"tram": 1.0}}, on_query=5), "on_query must be a function or None"),
        (lambda r: r.rerank_run(QUERIES, {"q1": {"tram": 1.0}}, on_reranked=5), "on_reranked must be a function or"),
        (lambda r: r.rerank_run(QUERIES, {"q1": {"tram": 1.0}}, skip_missing=1), "skip_missing must be True or"),
        # An empty run came back without a word, where `rerank` refuses a run file of no query (left55 F9).
        (lambda r: r.rerank_run(QUERIES, {}), "^the run holds no queries: there is nothing to rerank$"),
    ],
)  # fmt: skip
def test_arguments_of_the_wrong_type_are_refused_by_name(
    store: Callable[..., Path], model_dir: Path, call, message: str
) -> None:
    with open_reranker(store("earl-s1"), model_dir) as reranker, pytest.raises(DilstoreError, match=message):
        call(reranker)


class CountingStore:
    """What `rerank` needs of a store, at no cost: every id but "ghost" is stored."""

    url = "counting"

    def fetch(self, ids: list[str]) -> list[SimpleNamespace]:
        if "ghost" in ids:
            raise MissingPassagesError("ghost is not stored", ["ghost"])
        return [SimpleNamespace(id=docid) for docid in ids]


def test_a_stats_object_shared_by_threads_counts_every_call(monkeypatch: pytest.MonkeyPatch) -> None:
    """(left55 F12) `rerank` calls on a thread pool that shared one RerankStats added with `+=`: another thread's
    addition fell between a read and its write, and `queries` came out about a tenth short (8 threads of 5,000 calls,
    the interpreter switching threads as often as it can)."""
    reranker = object.__new__(EarlReranker)  # the counting, without a model: the stages are stubbed
    reranker.store = CountingStore()
    monkeypatch.setattr(reranker, "_score", lambda tokens, documents, stats: [1.0] * len(documents), raising=False)
    stats, threads, calls = RerankStats(), 8, 5000
    switching = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)

    def work() -> None:
        for _ in range(calls):
            reranker.rerank_tokenized(None, ["a", "ghost", "b"], skip_missing=True, stats=stats)

    try:
        pool = [threading.Thread(target=work) for _ in range(threads)]
        for thread in pool:
            thread.start()
        for thread in pool:
            thread.join()
    finally:
        sys.setswitchinterval(switching)
    assert (stats.queries, stats.pairs, stats.skipped) == (threads * calls, 2 * threads * calls, threads * calls)


def test_missing_ids_are_named_or_skipped_and_counted(store: Callable[..., Path], model_dir: Path) -> None:
    reranker = open_reranker(store("earl-s1"), model_dir)
    with pytest.raises(MissingPassagesError, match="'ghost'") as caught:
        reranker.rerank(QUERIES["q1"], ["tram", "ghost"])
    assert caught.value.missing == ["ghost"] and "skip_missing" in str(caught.value)
    stats = RerankStats()
    got = reranker.rerank(QUERIES["q1"], ["tram", "ghost", "phantom"], skip_missing=True, stats=stats)
    assert list(got) == ["tram"] and (stats.skipped, stats.pairs) == (2, 1)
    assert reranker.rerank(QUERIES["q1"], ["ghost"], skip_missing=True) == {}
    with pytest.raises(MissingPassagesError, match="query 'q2': .*'ghost'"):
        reranker.rerank_run(QUERIES, {"q1": {"tram": 1.0}, "q2": {"ghost": 2.0, "tram": 1.0}})
    one_top_missing = {"q1": {"tram": 1.0}, "q2": {"ghost": 3.0, "phantom": 2.0, "tram": 1.0}}
    reranked, stats = reranker.rerank_run(QUERIES, one_top_missing, depth=2, skip_missing=True)
    assert reranked["q2"] == {"tram": -1.0} and stats.skipped == 2  # m = 0: no top document of q2 was scored
    one_query_emptied = {"q1": {"tram": 1.0}, "q2": {"ghost": 3.0, "phantom": 2.0}}  # q2 left the run unsaid
    reranked, stats = reranker.rerank_run(QUERIES, one_query_emptied, depth=2, skip_missing=True)
    assert list(reranked) == ["q1"] and stats.emptied_queries == ["q2"] and stats.to_dict()["emptied_queries"] == ["q2"]
    assert stats.queries == 1, "q2 was counted as reranked"
    reranked, stats = reranker.rerank_run(QUERIES, {"q1": {"tram": 1.0}, "q2": {}})  # a first stage found nothing
    assert list(reranked) == ["q1"] and stats.emptied_queries == ["q2"], "refused the whole run (rank48 F3)"
    with pytest.raises(DilstoreError, match=r"none of the run's 1 queries has documents to rerank: 'q2'"):
        reranker.rerank_run(QUERIES, {"q2": {}})  # was an empty run, returned without a word
    every_top_missing = {"q2": one_top_missing["q2"]}  # was an empty-topped run, "written" with exit 0
    with pytest.raises(MissingPassagesError, match="none of the run's top-2 documents is in store .*: nothing was"):
        reranker.rerank_run(QUERIES, every_top_missing, depth=2, skip_missing=True)


def test_a_bad_topic_or_a_missing_document_is_found_before_any_query_is_scored(
    store: Callable[..., Path], model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each was found when its query came up, after the queries before it were scored (a long run lost its work),
    and a topic of no word pieces was not named by its qid (rank38 M2)."""
    reranker = open_reranker(store("earl-s1"), model_dir)
    scored = []
    monkeypatch.setattr(reranker, "_score", lambda tokens, documents, stats: scored.append(documents) or [0.0])
    run = {"q1": {"tram": 1.0}, "q2": {"ghost": 2.0, "curie": 1.0}, "q3": {"kili": 1.0, "phantom": 0.5}}
    with pytest.raises(DilstoreError, match="^the topic of query 'q3': the query .* has no word pieces"):
        reranker.rerank_run({**QUERIES, "q3": "\u200b"}, run)
    with pytest.raises(MissingPassagesError, match=r"^query 'q2': 1 of 2 documents to rerank are not in store .*"
                       r"'ghost'.*; 1 more in 1 other query\(ies\); leave them out") as caught:
        reranker.rerank_run(QUERIES, run)
    assert caught.value.missing == ["ghost", "phantom"]
    assert scored == [], "nothing was scored"


def test_a_query_limit_past_the_model_s_positions_is_refused_when_the_reranker_opens(
    store: Callable[..., Path], model_dir: Path
) -> None:
    with pytest.raises(DilstoreError, match=r"query limit 100000 \(--max-query-length\) is more than this model"):
        open_reranker(store("earl-s1"), model_dir, settings=RerankSettings(max_query_length=100_000))


def test_ids_a_split_store_holds_as_passages_are_named_with_the_split() -> None:
    """A store built with the default --split words holds 'tram#0', so every docid of a run was "not in the store"
    with no word of why."""
    passages = {"tram#0", "tram#1", "kili"}
    assert "holds 'tram#0': it was built with a --split that cuts" in split_hint(passages, ["ghost", "tram"])
    assert split_hint(passages, ["ghost", "kili"]) == ""


def test_docids_a_store_holds_in_another_unicode_form_are_named_with_its_form() -> None:
    """(unicode56 F4) A run's docid 'Zürich' (one 'ü') and a store's 'Zu\u0308rich' print alike; rerank's error
    named the docid as not in the store with no word of why. Full-width digits (NFKC) too."""
    held = {"Zu\u0308rich", "12"}
    assert "'Zu\\u0308rich' is: the same text in another Unicode form (NFD)" in other_form_hint(held, ["x", "Zürich"])
    assert "'12' is: the same text in another Unicode form (NFKC)" in other_form_hint(held, ["\uff11\uff12"])
    assert other_form_hint(held, ["ghost", "Genève"]) == ""
    with pytest.raises(DilstoreError, match=r"1 query\(ies\) of the run have no topic in the topics: 'Zürich' "
                       r"\('Z\\xfcrich' is not in it, but 'Zu\\u0308rich' is"):
        require_topics({"Zu\u0308rich": "tram"}, {"Zürich": {"d": 1.0}})



def test_each_missing_document_error_of_a_reranker_names_an_id_held_in_another_form(
    store: Callable[..., Path], model_dir: Path
) -> None:
    """(mut56 M78, M79, M80) The three errors of a reranker that name documents missing from the store (one
    query's, one query of a run, every top document of a run) each name the store's id in another Unicode form:
    `ｔｒａｍ` (full width) is the store's `tram` once folded (NFKC). Only `require_topics`' error was held."""
    reranker = open_reranker(store("earl-s1"), model_dir)
    wide = "\uff54\uff52\uff41\uff4d"
    hint = r"but 'tram' is: the same text in another Unicode form \(NFKC\)"
    with pytest.raises(MissingPassagesError, match=rf"1 of 2 documents to rerank .*{hint}.*; leave them out"):
        reranker.rerank(QUERIES["q1"], ["kili", wide])
    with pytest.raises(MissingPassagesError, match=rf"^query 'q2': 1 of 1 documents .*{hint}.*; leave them out"):
        reranker.rerank_run(QUERIES, {"q1": {"tram": 1.0}, "q2": {wide: 2.0}})
    with pytest.raises(MissingPassagesError, match=rf"none of the run's top-2 documents .*{hint}.*\): nothing was"):
        reranker.rerank_run(QUERIES, {"q2": {wide: 2.0, "ghost": 1.0}}, depth=2, skip_missing=True)

def test_strings_where_lists_belong_and_non_string_queries_are_named(
    store: Callable[..., Path], model_dir: Path
) -> None:
    """A bare string of doc_ids was read as one id per character (an error listing letters)."""
    reranker = open_reranker(store("earl-s1"), model_dir)
    with pytest.raises(DilstoreError, match="doc_ids must be a list of document ids, got str"):
        reranker.rerank(QUERIES["q1"], "tram")
    with pytest.raises(DilstoreError, match="doc_ids must be a list of document ids, got NoneType None"):
        reranker.rerank(QUERIES["q1"], None)  # type: ignore[arg-type]  # a TypeError from deep inside
    with pytest.raises(DilstoreError, match="a query must be a string, got NoneType"):
        reranker.rerank(None, ["tram"])  # type: ignore[arg-type]
    with pytest.raises(DilstoreError, match="the query holds a lone surrogate"):
        reranker.rerank("a\ud800", ["tram"])
    assert list(reranker.rerank(QUERIES["q1"], ["tram"])) == ["tram"]


def test_a_closed_reranker_refuses_to_score(store: Callable[..., Path], model_dir: Path) -> None:
    with open_reranker(store("earl-s1"), model_dir) as reranker:
        scores = reranker.rerank(QUERIES["q1"], ["tram"])
    with pytest.raises(DilstoreError, match="is closed; open it again"):
        reranker.rerank(QUERIES["q1"], ["tram"])
    assert open_reranker(store("earl-s1"), model_dir).rerank(QUERIES["q1"], ["tram"]) == scores


def test_a_store_of_another_model_is_refused_showing_both_fingerprints(
    store: Callable[..., Path], tmp_path: Path
) -> None:
    other = save_ranker(tmp_path / "other", seed=1)
    with pytest.raises(FingerprintMismatchError, match="differs in: weights_sha256") as caught:
        open_reranker(store("earl-s2"), other)
    assert "store: " in str(caught.value) and "expected: " in str(caught.value)


def test_a_dilbert_store_is_refused(tmp_path: Path, ranker: EarlRanker) -> None:
    dilbert = build_store(tmp_path / "dilbert", random_shards([3]))
    with pytest.raises(DilstoreError, match="holds 'dilbert' states; the EARL reranker needs an 'earl-s1' or"):
        EarlReranker(ranker, open_store(dilbert))


@pytest.mark.parametrize("kind", ["earl-s1", "listformer"])
def test_rerank_s_early_checks_take_each_ranked_kind_and_name_a_missing_model(tmp_path: Path, kind: str) -> None:
    """(mut60 M6) What `rerank` checks before torch loads (`check_rerank_inputs`) takes a store of each kind a
    ranker reads, and names a --model folder that is not there. Without the folder's check, a mistyped --model was
    named after torch and the rankers' imports (left60 F1), and no test noticed; a kind dropped from RERANK_KINDS
    was seen only by the tests that load a ranker."""
    from dilstore.reader.serving.store_checks import check_rerank_inputs

    stored = build_store(tmp_path / kind, random_shards([2]), kind=kind)
    check_rerank_inputs(str(stored), None)
    with pytest.raises(DilstoreError, match=f"^model directory not found: {tmp_path / 'missing'}"):
        check_rerank_inputs(str(stored), tmp_path / "missing")


def test_bad_requests_are_refused(store: Callable[..., Path], model_dir: Path) -> None:
    reranker = open_reranker(store("earl-s1"), model_dir)
    with pytest.raises(DilstoreError, match="the query is empty"):
        reranker.rerank("   ", ["tram"])
    with pytest.raises(DilstoreError, match="depth must be a positive integer"):
        reranker.rerank_run(QUERIES, FIRST_STAGE, depth=0)
    with pytest.raises(DilstoreError, match="no topic in the topics: 'q9'"):
        reranker.rerank_run(QUERIES, {"q9": {"tram": 1.0}})
    with pytest.raises(DilstoreError, match="max_pairs_per_batch must be at least 1"):
        RerankSettings(max_pairs_per_batch=0)


# ---------------------------------------------------------------------- the command line


@pytest.mark.parametrize("kind", KINDS)
def test_cli_writes_a_trec_run_ordered_by_the_model(
    kind: str, store: Callable[..., Path], model_dir: Path, ranker: EarlRanker, tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    arguments = write_inputs(tmp_path, FIRST_STAGE)
    status, out, err = cli(capsys, store(kind), *arguments, "--model", model_dir, "--depth", 4, "--json",
                           "--threads", 1)  # fmt: skip
    assert status == 0, err
    assert err == ""  # --json turns the progress bar off
    summary = json.loads(out)
    assert {key: summary[key] for key in ("queries", "pairs", "skipped", "depth")} == {
        "queries": 3, "pairs": 12, "skipped": 0, "depth": 4,
    }  # fmt: skip
    assert summary["output"] == str(tmp_path / "out.trec") and summary["seconds"] > 0
    lines = [line.split() for line in (tmp_path / "out.trec").read_text().splitlines()]
    assert all(len(line) == 6 and line[1] == "Q0" and line[5] == "dilstore-earl" for line in lines)
    run = read_run(tmp_path / "out.trec")
    assert list(run) == list(FIRST_STAGE)
    for qid, first_stage in FIRST_STAGE.items():
        rows = [line for line in lines if line[0] == qid]
        assert [int(line[3]) for line in rows] == list(range(1, len(first_stage) + 1))
        first_order = [d for d, _ in rank_documents(first_stage)]
        expected = unsplit_scores(ranker, QUERIES[qid], first_order[:4])
        written = [line[2] for line in rows]
        assert written[:4] == [d for d, _ in rank_documents(expected)]  # by the model's score
        assert written[4:] == first_order[4:]  # below depth: first-stage order
        np.testing.assert_allclose([run[qid][d] for d in expected], list(expected.values()), atol=1e-4)


def test_a_stopped_rerank_keeps_the_queries_done_and_the_same_command_goes_on_from_them(
    store: Callable[..., Path], model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """A stop at 90% of a long run kept nothing (longrun45 F1). Parts of one query here: the run stopped at its
    third query goes on from the two kept, and ends with the run and counts an unstopped run gives."""
    from dilstore.runners import cmd_rerank

    monkeypatch.setattr(cmd_rerank, "PART_QUERIES", 1)
    real, calls = EarlReranker.rerank_tokenized, []

    def counted(self: EarlReranker, *args: object, **kwargs: object) -> dict[str, float]:
        calls.append(1)
        if len(calls) == stop_at:
            raise KeyboardInterrupt
        return real(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(EarlReranker, "rerank_tokenized", counted)
    long_topics = {**QUERIES, "q3": " ".join(["tram"] * 80)}  # truncated: counted once, however often it is run
    common = ["--model", model_dir, "--depth", 4, "--json", "--threads", 1]
    stop_at = 0
    status, whole, err = cli(capsys, store("earl-s1"), *write_inputs(tmp_path / "whole", FIRST_STAGE, long_topics),
                             *common)  # fmt: skip
    assert status == 0, err
    arguments = write_inputs(tmp_path / "stopped", FIRST_STAGE, long_topics)
    stop_at, calls[:] = 3, []
    status, _, err = cli(capsys, store("earl-s1"), *arguments, *common)
    journal = tmp_path / "stopped" / ".out.trec.dilstore-partial"
    assert status == 130 and not (tmp_path / "stopped" / "out.trec").exists()
    assert err == (f"dilstore rerank: interrupted; 2 of 3 queries reranked are kept in {journal}: run the same "
                   "command again to go on from them\n")  # fmt: skip
    stop_at, calls[:] = 0, []
    status, resumed, err = cli(capsys, store("earl-s1"), *arguments, *common)
    assert status == 0 and calls == [1] and not journal.exists(), err
    assert (json.loads(resumed)["resumed_queries"], json.loads(whole)["resumed_queries"]) == (2, 0)
    assert (tmp_path / "stopped" / "out.trec").read_text() == (tmp_path / "whole" / "out.trec").read_text()
    counts = ("queries", "pairs", "skipped", "truncated_queries", "emptied_queries")
    assert {key: json.loads(resumed)[key] for key in counts} == {key: json.loads(whole)[key] for key in counts}
    assert json.loads(whole)["truncated_queries"] == 1
    missing = write_inputs(tmp_path / "missing", {"q1": {"tram": 2.0, "not-stored": 1.0}})
    assert cli(capsys, store("earl-s1"), *missing, *common)[0] == 2  # refused before any query: nothing kept
    assert not list((tmp_path / "missing").glob(".*"))



def test_a_rerank_of_another_depth_takes_nothing_from_a_stopped_run_s_journal(
    store: Callable[..., Path], model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """The queries a --depth 2 run kept before its stop were reranked over 2 documents: run again with --depth 4,
    every query is reranked over 4, and the run equals one never stopped."""
    from dilstore.runners import cmd_rerank

    monkeypatch.setattr(cmd_rerank, "PART_QUERIES", 1)
    real, calls = EarlReranker.rerank_tokenized, []

    def stopped_at_the_third(self: EarlReranker, *args: object, **kwargs: object) -> dict[str, float]:
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real(self, *args, **kwargs)  # type: ignore[arg-type]

    common = ["--model", model_dir, "--json", "--threads", 1]
    status, whole, err = cli(capsys, store("earl-s1"), *write_inputs(tmp_path / "whole", FIRST_STAGE), "--depth", 4,
                             *common)  # fmt: skip
    assert status == 0, err
    arguments = write_inputs(tmp_path / "stopped", FIRST_STAGE)
    monkeypatch.setattr(EarlReranker, "rerank_tokenized", stopped_at_the_third)
    assert cli(capsys, store("earl-s1"), *arguments, "--depth", 2, *common)[0] == 130
    monkeypatch.setattr(EarlReranker, "rerank_tokenized", real)
    status, deeper, err = cli(capsys, store("earl-s1"), *arguments, "--depth", 4, *common)
    assert status == 0, err
    assert (tmp_path / "stopped" / "out.trec").read_text() == (tmp_path / "whole" / "out.trec").read_text()
    assert json.loads(deeper)["resumed_queries"] == 0


def test_a_stopped_rerank_that_kept_a_query_with_no_stored_document_goes_on_to_the_run_an_unstopped_one_writes(
    store: Callable[..., Path], model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """q1's documents are none of them stored (--skip-missing leaves it out of the run): its part records it done with
    no scores, and the run that goes on leaves it out too, as the unstopped run does."""
    from dilstore.runners import cmd_rerank

    monkeypatch.setattr(cmd_rerank, "PART_QUERIES", 1)
    real, calls = EarlReranker.rerank_tokenized, []

    def stopped_at_q3(self: EarlReranker, *args: object, **kwargs: object) -> dict[str, float]:
        calls.append(1)  # each query is scored, q1 too (with none of its documents found)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real(self, *args, **kwargs)  # type: ignore[arg-type]

    first_stage = {"q1": {"not-stored": 2.0, "gone": 1.0}, "q2": FIRST_STAGE["q2"], "q3": FIRST_STAGE["q3"]}
    common = ["--model", model_dir, "--depth", 4, "--skip-missing", "--json", "--threads", 1]
    status, whole, err = cli(capsys, store("earl-s1"), *write_inputs(tmp_path / "whole", first_stage), *common)
    assert status == 0 and json.loads(whole)["emptied_queries"] == ["q1"], err
    arguments = write_inputs(tmp_path / "stopped", first_stage)
    monkeypatch.setattr(EarlReranker, "rerank_tokenized", stopped_at_q3)
    assert cli(capsys, store("earl-s1"), *arguments, *common)[0] == 130
    monkeypatch.setattr(EarlReranker, "rerank_tokenized", real)
    status, resumed, err = cli(capsys, store("earl-s1"), *arguments, *common)
    assert status == 0 and json.loads(resumed)["resumed_queries"] == 2, err
    assert (tmp_path / "stopped" / "out.trec").read_text() == (tmp_path / "whole" / "out.trec").read_text()

def test_cli_tags_the_run_with_tag_and_refuses_a_tag_of_two_words_before_reranking(
    store: Callable[..., Path], model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    """Every run was tagged dilstore-earl, whatever the store or model, so pooled runs could not be told apart
    (rank44 L1)."""
    arguments = write_inputs(tmp_path, FIRST_STAGE)
    status, _, err = cli(capsys, store("earl-s1"), *arguments, "--model", model_dir, "--tag", "earl-s1-d4",
                         "--depth", 4, "--no-progress", "--threads", 1)  # fmt: skip
    assert status == 0, err
    assert {line.split()[5] for line in (tmp_path / "out.trec").read_text().splitlines()} == {"earl-s1-d4"}
    (tmp_path / "out.trec").unlink()
    with pytest.raises(SystemExit) as stopped:  # a usage error, before the store or model is opened
        cli(capsys, store("earl-s1"), *arguments, "--model", model_dir, "--tag", "two words")
    assert stopped.value.code == 2
    assert "argument --tag: expected one word with no spaces, got 'two words'" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # bytes a terminal passed that are not UTF-8 (review44b L3)
        cli(capsys, store("earl-s1"), *arguments, "--model", model_dir, "--tag", "run\udcff")
    assert "argument --tag: expected UTF-8 text" in capsys.readouterr().err
    assert not (tmp_path / "out.trec").exists()


def test_cli_stops_naming_a_store_rebuilt_under_the_run(
    store: Callable[..., Path], model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """After its first query the store is replaced, as `precompute --overwrite` or `compact` does: the run went on
    reading the deleted build from its maps, and wrote its scores, exit 0."""
    import shutil

    import tqdm

    local = tmp_path / "store"
    shutil.copytree(store("earl-s1"), local)
    real, replaced = tqdm.tqdm, []

    class ReplacingBar(real):  # type: ignore[misc, valid-type]
        def update(self, n: float | None = 1) -> bool | None:
            if not replaced:  # after the first query
                shutil.move(local, tmp_path / "old")
                shutil.copytree(store("earl-s1"), local)
                replaced.append(True)
            return super().update(n)

    monkeypatch.setattr(tqdm, "tqdm", ReplacingBar)
    arguments = write_inputs(tmp_path / "inputs", FIRST_STAGE)
    status, _, err = cli(capsys, local, *arguments, "--model", model_dir, "--depth", 4, "--no-progress",
                         "--threads", 1)  # fmt: skip
    assert status == 2 and "after the store was opened" in err and "open it again" in err, err
    assert not (tmp_path / "inputs" / "out.trec").exists()


def test_a_rerank_ended_by_a_compaction_goes_on_from_its_journal_over_the_compacted_store(
    store: Callable[..., Path], model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """(conc54 F4) `dilstore compact` under a running rerank ended it with "open it again", not a word of the queries
    kept, and the same command then reranked every query anew: the journal named the old build, though the compacted
    store serves the same states. It now says what is kept, and goes on from it to the run an unstopped one writes."""
    import shutil

    import dilstore
    from dilstore.runners import cmd_rerank

    monkeypatch.setattr(cmd_rerank, "PART_QUERIES", 1)
    local = shutil.copytree(store("earl-s1"), tmp_path / "store")
    dilstore.compact(local, shards=1, no_progress=True)  # a build of its own (written by hand, the store has none)
    common = ["--model", model_dir, "--depth", 4, "--json", "--threads", 1]
    status, whole, err = cli(capsys, local, *write_inputs(tmp_path / "whole", FIRST_STAGE), *common)
    assert status == 0, err
    real, calls = EarlReranker.rerank_tokenized, []

    def compacted_at_the_third(self: EarlReranker, *args: object, **kwargs: object) -> dict[str, float]:
        calls.append(1)
        if len(calls) == 3:
            assert not dilstore.compact(local, shards=2, no_progress=True)["already_compact"]
        return real(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(EarlReranker, "rerank_tokenized", compacted_at_the_third)
    arguments = write_inputs(tmp_path / "stopped", FIRST_STAGE)
    status, _, err = cli(capsys, local, *arguments, *common)
    journal = tmp_path / "stopped" / ".out.trec.dilstore-partial"
    assert status == 2 and journal.exists(), err
    assert err.endswith(f"; the store was compacted, which serves the same passages: 2 of 3 queries reranked are kept "
                        f"in {journal}: run the same command again to go on from them\n")  # fmt: skip
    calls[:] = []
    status, resumed, err = cli(capsys, local, *arguments, *common)
    assert status == 0 and calls == [1] and not journal.exists(), err
    assert json.loads(resumed)["resumed_queries"] == 2
    assert (tmp_path / "stopped" / "out.trec").read_text() == (tmp_path / "whole" / "out.trec").read_text()


def test_a_run_file_that_cannot_be_written_says_the_queries_are_kept_and_the_same_command_writes_it(
    store: Callable[..., Path], model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """(left56b F3) A full disk at the run file, after every query was reranked, said `cannot write run to FILE: No
    space left on device`: not that the reranked queries were kept in the journal, nor that the same command writes
    the file from them at once, as it does."""
    from dilstore.reader.data import trec

    common = ["--model", model_dir, "--depth", 4, "--json"]
    assert cli(capsys, store("earl-s1"), *write_inputs(tmp_path / "whole", FIRST_STAGE), *common)[0] == 0
    arguments = write_inputs(tmp_path / "run", FIRST_STAGE)
    output, journal = tmp_path / "run" / "out.trec", tmp_path / "run" / ".out.trec.dilstore-partial"

    def full(path: Path, text: str, **_: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    with monkeypatch.context() as patch:
        patch.setattr(trec, "atomic_write_text", full)
        status, _, err = cli(capsys, store("earl-s1"), *arguments, *common)
    assert status == 2 and journal.exists(), err
    assert err == (f"dilstore rerank: error: cannot write run to {output}: No space left on device; all 3 queries "
                   f"reranked are kept in {journal}: run the same command again once {output} can be written, and it "
                   "writes the file from them at once\n")  # fmt: skip
    real, calls = EarlReranker.rerank_tokenized, []

    def counted(*args: object, **kwargs: object) -> dict[str, float]:
        calls.append(1)
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(EarlReranker, "rerank_tokenized", counted)
    status, out, err = cli(capsys, store("earl-s1"), *arguments, *common)
    assert status == 0 and json.loads(out)["resumed_queries"] == 3 and calls == [] and not journal.exists(), err
    assert output.read_text() == (tmp_path / "whole" / "out.trec").read_text()


@pytest.mark.parametrize("kind", KINDS)
def test_cli_reranks_a_store_at_an_http_url_like_the_local_path(
    kind: str, store: Callable[..., Path], model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    """STORE as an http:// URL of a real server on 127.0.0.1 writes the run the local path writes."""
    from tests.fixtures.http_store import serve_directory

    local = store(kind, "fp16")
    runs = []
    for name, where in (("local", str(local)), ("http", None)):
        arguments = write_inputs(tmp_path / name, FIRST_STAGE)
        with serve_directory(local.parent) as server:
            status, _, err = cli(capsys, where or f"{server.url}/{local.name}", *arguments, "--model", model_dir,
                                 "--depth", 4, "--json", "--threads", 1)  # fmt: skip
        assert status == 0, err
        runs.append((tmp_path / name / "out.trec").read_text())
    assert runs[0] == runs[1]


def test_cli_text_summary_and_progress_bar(
    store: Callable[..., Path], model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    arguments = write_inputs(tmp_path, FIRST_STAGE)
    status, out, err = cli(capsys, store("earl-s1"), *arguments, "--model", model_dir, "--depth", 2)
    assert status == 0, err
    assert "rerank" in err and "3/3" in err  # tqdm's bar over queries
    assert out.startswith("reranked 3 queries, 6 pairs (depth 2, fp32 store)") and "timings: query layers" in out
    status, out, err = cli(capsys, store("earl-s1", "int8"), *arguments, "--model", model_dir, "--no-progress")
    assert status == 0 and err == "" and "(depth 100, int8 store)" in out  # lowbit39 L1: nothing named the encoding
    status, out, err = cli(capsys, store("earl-s1", "int8"), *arguments, "--model", model_dir, "--json")
    assert status == 0 and json.loads(out)["encoding"] == "int8"


def test_cli_skip_missing_counts_and_leaves_out(
    store: Callable[..., Path], model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    first_stage = {"q1": {"tram": 3.0, "ghost": 2.0, "kili": 1.0, "phantom": 0.5}, "q2": {"curie": 1.0}}
    arguments = write_inputs(tmp_path, first_stage)
    status, out, err = cli(capsys, store("earl-s2"), *arguments, "--model", model_dir, "--depth", 3, "--json")
    assert status == 2 and "Traceback" not in err
    assert err.splitlines() == [err.rstrip("\n")]
    assert err.startswith("dilstore rerank: error: query 'q1': 1 of 3 ") and "'ghost'" in err
    assert "--skip-missing" in err
    status, out, err = cli(capsys, store("earl-s2"), *arguments, "--model", model_dir, "--depth", 3, "--json",
                           "--skip-missing")  # fmt: skip
    assert status == 0, err
    assert json.loads(out)["skipped"] == 1 and json.loads(out)["pairs"] == 3
    run = read_run(tmp_path / "out.trec")
    assert [d for d, _ in rank_documents(run["q1"])][2:] == ["phantom"]  # below depth: kept, never looked up
    assert set(run["q1"]) == {"tram", "kili", "phantom"}
    arguments = write_inputs(tmp_path, {**first_stage, "q3": {"ghost": 1.0}}, {**QUERIES, "q3": "nothing stored"})
    status, out, err = cli(capsys, store("earl-s2"), *arguments, "--model", model_dir, "--skip-missing",
                           "--no-progress")  # fmt: skip
    assert status == 0, err
    assert "1 query(ies) had none of their documents in the store and are not in the output run: 'q3'" in out
    assert set(read_run(tmp_path / "out.trec")) == {"q1", "q2"}


def one_line_error(status: int, err: str) -> str:
    """The single stderr line of a refused command (exit 2, no traceback)."""
    assert status == 2 and "Traceback" not in err
    assert err.endswith("\n") and err.count("\n") == 1, err
    assert err.startswith("dilstore rerank: error: ")
    return err


def test_cli_refusals_are_one_line_errors(
    store: Callable[..., Path], model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    arguments = write_inputs(tmp_path, FIRST_STAGE, topics={"q1": QUERIES["q1"], "q3": QUERIES["q3"]})
    err = one_line_error(*cli(capsys, store("earl-s1"), *arguments, "--model", model_dir)[::2])
    assert "1 query(ies) of the run have no topic in" in err and "topics.tsv: 'q2'" in err
    arguments = write_inputs(tmp_path / "ok", FIRST_STAGE)
    dilbert = build_store(tmp_path / "dilbert", random_shards([3]))
    err = one_line_error(*cli(capsys, dilbert, *arguments, "--model", model_dir)[::2])
    assert "holds 'dilbert' states" in err
    with pytest.raises(SystemExit):
        cli(capsys, store("earl-s1"), *arguments, "--model", model_dir, "--depth", 0)
    assert "argument --depth: expected a positive integer, got 0" in capsys.readouterr().err
    assert not (tmp_path / "ok" / "out.trec").exists()


def test_cli_refuses_a_prior_ranker_on_a_store_without_passage_vectors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A store made by the prior ranker but without passages/vectors (as before they existed) is a one-line error."""
    model_dir = save_ranker(tmp_path / "prior", seed=1, prior=True)
    prior = EarlRanker.from_pretrained(model_dir)
    store = write_earl_store(tmp_path / "store", prior, "earl-s2", "fp32")
    arguments = write_inputs(tmp_path / "inputs", FIRST_STAGE)
    err = one_line_error(*cli(capsys, store, *arguments, "--model", model_dir)[::2])
    assert "has no passage vectors, which this ranker's bi-encoder prior needs" in err


def test_cli_without_model_uses_the_packaged_ranker(
    store: Callable[..., Path], model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """No --model: the packaged EARL ranker scores the run, exactly as naming that checkpoint does."""
    packaged = tmp_path / "models"
    shutil.copytree(model_dir, packaged / DEFAULT_RANKER_NAME)
    monkeypatch.setattr("dilstore.reader.packaged.shipped.packaged_models_dir", lambda: packaged)
    named = write_inputs(tmp_path / "named", FIRST_STAGE)
    assert cli(capsys, store("earl-s2"), *named, "--model", model_dir, "--no-progress")[0] == 0
    default = write_inputs(tmp_path / "default", FIRST_STAGE)
    assert cli(capsys, store("earl-s2"), *default, "--no-progress")[0] == 0
    assert read_run(tmp_path / "default" / "out.trec") == read_run(tmp_path / "named" / "out.trec")
    shutil.rmtree(packaged / DEFAULT_RANKER_NAME)
    err = one_line_error(*cli(capsys, store("earl-s2"), *default)[::2])
    assert "the default EARL ranker checkpoint is missing" in err and "--model DIR" in err


def test_cli_fingerprint_mismatch_is_one_error_line_and_the_table(
    store: Callable[..., Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The one multi-line error: the table of both fingerprints, after a single `error:` line; exit 2. (In-process:
    a child's exit status is test_cli_errors' and test_packaging's to show, and its imports took 9 s.)"""
    other = save_ranker(tmp_path / "other", seed=1)
    arguments = write_inputs(tmp_path, FIRST_STAGE)
    status = main(["rerank", str(store("earl-s2")), *map(str, arguments), "--model", str(other), "--threads", "1"])
    done = capsys.readouterr()
    assert status == 2 and "Traceback" not in done.err
    lines = done.err.splitlines()
    assert lines[0].startswith("dilstore rerank: error: store ") and "differs in: weights_sha256" in lines[0]
    assert all(line.startswith("  ") for line in lines[1:]) and len(lines) == 9
    weights = next(line for line in lines[1:] if "weights_sha256" in line)
    store_hash = weights.split("store: ")[1].split()[0]
    expected_hash = weights.split("expected: ")[1].strip()
    assert store_hash != expected_hash and len(store_hash) == len(expected_hash) == 64
    assert done.out == "" and not (tmp_path / "out.trec").exists()


def test_run_passages_script_cuts_the_run_documents_from_a_corpus(tmp_path: Path, capsys) -> None:
    spec = importlib.util.spec_from_file_location("run_passages", ROOT / "benchmarks" / "run_passages.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"id": docid, "contents": text}) + "\n" for docid, text in DOCUMENTS.items()))
    write_run(tmp_path / "first.trec", {"q1": {"kili": 2.0, "tram": 1.0}, "q2": {"tram": 3.0, "cafe": 1.0}}, tag="bm25")
    output = tmp_path / "out.jsonl"
    assert script.main(["--run", str(tmp_path / "first.trec"), "--corpus", str(corpus), "--output", str(output)]) == 0
    written = [json.loads(line) for line in output.read_text().splitlines()]
    assert [row["id"] for row in written] == ["kili", "tram", "cafe"], "each docid once, in run order"
    assert written[0]["contents"] == DOCUMENTS["kili"]
    twice = tmp_path / "twice.jsonl"  # precompute keeps an id's first record; this kept the last
    twice.write_text(corpus.read_text() + json.dumps({"id": "kili", "contents": "a later text"}) + "\n")
    assert script.main(["--run", str(tmp_path / "first.trec"), "--corpus", str(twice), "--output", str(output)]) == 0
    assert json.loads(output.read_text().splitlines()[0])["contents"] == DOCUMENTS["kili"]
    write_run(tmp_path / "ghost.trec", {"q1": {"ghost": 1.0, "tram": 0.5}}, tag="bm25")
    assert script.main(["--run", str(tmp_path / "ghost.trec"), "--corpus", str(corpus), "--output", str(output)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("run_passages: error: ") and "lacks 1 passage(s)" in err and "['ghost']" in err
    corpus.write_text(corpus.read_text() + "{not json\n")
    assert script.main(["--run", str(tmp_path / "first.trec"), "--corpus", str(corpus), "--output", str(output)]) == 2
    assert f"{corpus}:{len(DOCUMENTS) + 1}: bad JSON" in capsys.readouterr().err


def test_queries_are_cut_at_the_length_the_ranker_was_trained_with(
    store: Callable[..., Path], model_dir: Path, tmp_path: Path
) -> None:
    """One query length for training and serving: the training record's, unless the settings name one."""
    query = "which mountain has a glacier that is shrinking fast in the warm african sun"
    assert open_reranker(store("earl-s1"), model_dir).max_query_length == DEFAULT_MAX_QUERY_LENGTH == 32
    trained = shutil.copytree(model_dir, tmp_path / "trained")
    record = trained / TRAINING_METADATA_FILE
    record.write_text(json.dumps({"config": {"max_query_length": 6}}), encoding="utf-8")
    reranker = open_reranker(store("earl-s1"), trained)
    stats = RerankStats()
    reranker.rerank(query, ["kili"], stats=stats)
    assert (reranker.max_query_length, stats.truncated_queries) == (6, 1)
    wide = open_reranker(store("earl-s1"), trained, settings=RerankSettings(max_query_length=64))
    stats = RerankStats()
    wide.rerank(query, ["kili"], stats=stats)
    assert (wide.max_query_length, stats.truncated_queries) == (64, 0)
    record.write_text(json.dumps({"config": {"max_query_length": "long"}}), encoding="utf-8")
    with pytest.raises(DilstoreError, match=r"dilstore_training.json: config.max_query_length must be an integer"):
        EarlRanker.from_pretrained(trained)


@pytest.mark.parametrize("length", [1, 2])
def test_a_query_limit_with_no_room_for_a_word_piece_is_refused(length: int) -> None:
    """[CLS] q [SEP] needs three tokens: a limit under that would score every query as no query at all."""
    with pytest.raises(DilstoreError, match=f"max_query_length must be at least 3, got {length}"):
        RerankSettings(max_query_length=length)
    assert RerankSettings(max_query_length=3).max_query_length == 3


def test_a_rerank_ended_by_a_failed_read_says_which_queries_it_kept(
    store: Callable[..., Path], model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """A store at a URL whose server went away mid-run ended it with "...; try again", not a word of the queries
    kept for the same command to go on from, as a stop by a signal says (multi53 F6)."""
    from dilstore.runners import cmd_rerank
    from dilstore.storage.format import StoreReadError

    monkeypatch.setattr(cmd_rerank, "PART_QUERIES", 1)
    real, calls = EarlReranker.rerank_tokenized, []

    def failing(self: EarlReranker, *args: object, **kwargs: object) -> dict[str, float]:
        calls.append(1)
        if len(calls) == 3:
            raise StoreReadError("reading http://h/s/shards/x failed: reset; try again")
        return real(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(EarlReranker, "rerank_tokenized", failing)
    arguments = write_inputs(tmp_path / "run", FIRST_STAGE, {**QUERIES, "q3": "tram"})
    status, _, err = cli(capsys, store("earl-s1"), *arguments, "--model", model_dir, "--depth", 4, "--json")
    journal = tmp_path / "run" / ".out.trec.dilstore-partial"
    assert status == 2 and journal.exists()
    assert err == (f"dilstore rerank: error: reading http://h/s/shards/x failed: reset; try again; 2 of 3 queries "
                   f"reranked are kept in {journal}: run the same command again to go on from them\n")  # fmt: skip


def test_the_part_keeper_keeps_a_part_of_every_part_queries_and_no_scores_for_an_emptied_query(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A part holds exactly PART_QUERIES queries, the last one shorter at keep_rest, and a query with none of its
    documents in the store is kept done without scores (mut59 M10: the tests set PART_QUERIES to 1, where a part of
    one query more passed as well)."""
    from dilstore.reader.serving.rerank import RerankStats
    from dilstore.runners import cmd_rerank

    monkeypatch.setattr(cmd_rerank, "PART_QUERIES", 3)
    parts: dict[int, dict] = {}
    keeper = cmd_rerank._PartKeeper(SimpleNamespace(parts=parts, add=parts.__setitem__), RerankStats())
    for number in range(4):
        keeper.add(f"q{number}", None if number == 1 else {"d": float(number)})
    assert [part["queries"] for part in parts.values()] == [["q0", "q1", "q2"]]
    assert parts[0]["run"] == {"q0": {"d": 0.0}, "q2": {"d": 2.0}}
    keeper.keep_rest()
    keeper.keep_rest()  # nothing new: no empty part
    assert [part["queries"] for part in parts.values()] == [["q0", "q1", "q2"], ["q3"]]


@pytest.mark.parametrize("tag", [" tag", "tag\n", "\ufefftag"])
def test_a_tag_with_a_space_or_a_byte_order_mark_around_its_one_word_is_refused(tag: str) -> None:
    """A TREC run's last column is one word: space around it made a line of two separators (mut59 M11: only the
    one-word check was tested)."""
    from dilstore.runners import cmd_rerank

    with pytest.raises(argparse.ArgumentTypeError, match="one word with no spaces"):
        cmd_rerank.run_tag(tag)


def test_a_run_that_holds_no_queries_is_refused_before_the_store_opens(tmp_path: Path, capsys) -> None:
    """An empty first-stage run would open the store and load the ranker to write an empty run, exit 0 (mut59 M12:
    no test gave one)."""
    topics, run = tmp_path / "topics.tsv", tmp_path / "empty.trec"
    topics.write_text("q1\tsome query\n", encoding="utf-8")
    run.write_text("", encoding="utf-8")
    status, _, err = cli(capsys, tmp_path / "no-store", "--topics", topics, "--run", run, "--output", tmp_path / "o")
    assert (status, err) == (2, f"dilstore rerank: error: {run}: the run holds no queries\n")


def test_a_journal_of_a_run_with_skip_missing_is_not_taken_for_one_without(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--skip-missing decides what the run holds: a stopped run's parts that left documents out were taken by a
    run that should have stopped at them (mut59 M13: the setting could leave the journal's record unseen)."""
    from dilstore.reader.serving.rerank import RerankSettings
    from dilstore.runners import cmd_rerank

    monkeypatch.setattr(cmd_rerank, "store_build", lambda manifest: {"build": "b"})
    (tmp_path / "t").write_text("q\tx\n", encoding="utf-8")
    reranker = SimpleNamespace(store=SimpleNamespace(manifest=None), settings=RerankSettings())
    recorded = [cmd_rerank._settings(SimpleNamespace(topics=tmp_path / "t", run_file=tmp_path / "t", model=None,
                                                     skip_missing=skip), reranker, 10)
                for skip in (False, True)]  # fmt: skip
    assert (recorded[0]["skip_missing"], recorded[1]["skip_missing"]) == (False, True)


@pytest.mark.parametrize(("queries", "run"), [(["q"], {"q": 5}), ([7], {}), (["q"], {"q": ["d", 1.0]})])
def test_a_journal_part_with_scores_not_a_mapping_or_a_query_id_not_a_string_is_refused(queries, run) -> None:
    """A part edited into another shape ends the journal's reading there, as a line a kill cut short does: it is not
    taken for reranked queries that break the run's writing (mut59 M14: the check of its scores could go unseen)."""
    from dilstore.reader.serving.rerank import RerankStats
    from dilstore.runners import cmd_rerank

    cmd_rerank._checked_part({"queries": ["q"], "run": {"q": {"d": 1.0}}, "stats": RerankStats().to_dict()})
    with pytest.raises(TypeError):
        cmd_rerank._checked_part({"queries": queries, "run": run, "stats": RerankStats().to_dict()})


def test_the_summary_counts_the_documents_left_out_and_the_queries_cut(capsys: pytest.CaptureFixture[str]) -> None:
    """Without --json the summary names the documents --skip-missing left out and the truncated queries (mut59 M17:
    its lines could go and no test noticed)."""
    from dilstore.reader.serving.rerank import RerankStats
    from dilstore.runners import cmd_rerank

    reranker = SimpleNamespace(store=SimpleNamespace(fingerprint=SimpleNamespace(encoding="fp16")), max_query_length=9)
    stats = RerankStats(queries=3, pairs=7, skipped=2, emptied_queries=["q3"], truncated_queries=1)
    cmd_rerank._report(SimpleNamespace(json=False, output=Path("out.trec")), reranker, stats, 4, 0)
    out = capsys.readouterr().out
    assert out.startswith("reranked 3 queries, 7 pairs (depth 4, fp16 store)"), out
    assert "2 document(s) not in the store left out\n" in out
    assert "1 query(ies) had none of their documents in the store and are not in the output run: 'q3'" in out
    assert "1 query(ies) truncated to 9 tokens\n" in out and "reranked by a stopped run" not in out
