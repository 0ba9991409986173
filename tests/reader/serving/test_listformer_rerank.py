"""The delayed Listformer through a store: `precompute --kind listformer`, then `rerank` picks the Listformer.

A tiny random 3-layer Listformer with k = 2 delayed layers, over the real
MiniLM vocabulary, is saved as a checkpoint (fp16 weights). A DirectRunner
run of the command stores each document's states after layer k; reranking a
query's whole list from the store must give the scores of the unsplit
forward on the same texts, in one pass.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch

from dilstore.reader.data.trec import read_run, write_run
from dilstore.reader.modeling.listformer import ListformerConfig, ListformerRanker
from dilstore.reader.packaged.shipped import DEFAULT_LISTFORMER_NAME
from dilstore.reader.serving.rerank import ListformerReranker, open_reranker
from dilstore.reader.text.tokenization import TokenizedText
from dilstore.runners import cli
from dilstore.storage.errors import DilstoreError
from dilstore.storage.fingerprint import FingerprintMismatchError
from dilstore.storage.records import StoredPassage
from tests.fixtures.earl_tiny import save_base_encoder, text_encoder, tokenizer
from tests.fixtures.listformer_tiny import random_list, tiny_listformer
from tests.fixtures.pipeline_fixtures import wiki_like_documents, write_jsonl

MAX_LENGTH = 40  # the tiny config embeds 64 positions
DELAYED = 2
QUERY = "when was the railway station of the river city built"
TOLERANCE = {"fp32": 1e-4, "fp16": 2e-3}


def save_listformer(directory: Path, seed: int, delayed_layers: int = DELAYED) -> Path:
    ranker = ListformerRanker.from_encoder(text_encoder(seed), tokenizer(), ListformerConfig(delayed_layers))
    return ranker.save_pretrained(directory)


@pytest.fixture(scope="module")
def listformer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_listformer(tmp_path_factory.mktemp("listformer"), seed=0)


@pytest.fixture(scope="module")
def documents() -> dict[str, str]:
    """Six short documents and one longer than MAX_LENGTH, which is stored as windows and read by its first."""
    rows = wiki_like_documents(6, words=12) + [{**wiki_like_documents(1, words=60, seed=3)[0], "id": "long"}]
    return {row["id"]: row["text"] for row in rows}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory, documents: dict[str, str]) -> Path:
    rows = [{"id": docid, "title": "", "text": text} for docid, text in documents.items()]
    return write_jsonl(tmp_path_factory.mktemp("corpus") / "documents.jsonl", rows)


def precompute(corpus: Path, model: Path, store: Path, encoding: str, *extra: str) -> list[str]:
    return ["precompute", "--input", str(corpus), "--format", "jsonl", "--split", "none", "--output", str(store),
            "--model", str(model), "--kind", "listformer", "--encoding", encoding, "--shards", "2",
            "--max-length", str(MAX_LENGTH), "--workers", "1", "--threads", "1", "--no-progress", "--json",
            *extra]  # fmt: skip


@pytest.fixture(scope="module")
def stores(tmp_path_factory: pytest.TempPathFactory, corpus: Path, listformer_dir: Path) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("stores")
    made = {}
    for encoding in ("fp32", "fp16"):
        made[encoding] = folder / encoding
        assert cli.main(precompute(corpus, listformer_dir, made[encoding], encoding)) == 0
    return made


def unsplit_scores(model_dir: Path, documents: dict[str, str], docids: list[str]) -> dict[str, float]:
    """The whole list through `ListformerRanker.forward` from the texts: what the store must give back."""
    ranker = ListformerRanker.from_pretrained(model_dir)
    query = ranker.tokenize_query(QUERY, ranker.max_query_length)
    group = [ranker.tokenize_document(documents[docid], MAX_LENGTH) for docid in docids]
    with torch.inference_mode():
        scores = ranker.score_groups([query], [group])[0]  # (D,)
    return dict(zip(docids, scores.tolist(), strict=True))


@pytest.mark.parametrize("encoding", ["fp32", "fp16"])
def test_the_list_scored_from_the_store_equals_the_unsplit_forward(
    stores, listformer_dir: Path, documents: dict[str, str], encoding: str
) -> None:
    summary = json.loads((stores[encoding] / "run-summary.json").read_text(encoding="utf-8"))
    assert (summary["kind"], summary["layers"], summary["documents"], summary["long_passages"]) == (
        "listformer", DELAYED, 7, 1,
    )  # fmt: skip
    reranker = open_reranker(stores[encoding], listformer_dir)
    assert isinstance(reranker, ListformerReranker) and reranker.run_tag == "dilstore-listformer"
    docids = list(documents)
    got = reranker.rerank(QUERY, docids)
    want = unsplit_scores(listformer_dir, documents, docids)
    assert np.ptp(list(want.values())) > 0.01, "scores that differ"
    assert max(abs(got[docid] - want[docid]) for docid in docids) < TOLERANCE[encoding]
    reordered = reranker.rerank(QUERY, docids[::-1])
    assert max(abs(reordered[docid] - got[docid]) for docid in docids) < 1e-5, "the list order does not matter"


def test_a_prior_listformer_store_keeps_each_documents_prior_vector(
    corpus: Path, documents: dict[str, str], tmp_path: Path
) -> None:
    """The prior's document vectors are stored per passage; reranking from them equals the unsplit forward."""
    ranker = ListformerRanker.from_encoder(text_encoder(1), tokenizer(), ListformerConfig(DELAYED, prior=True))
    with torch.no_grad():
        ranker.score.weight.normal_(std=0.5)  # as if trained: both the Listformer and the prior move the scores
    model = ranker.save_pretrained(tmp_path / "prior-listformer")
    assert cli.main(precompute(corpus, model, tmp_path / "store", "fp16")) == 0
    reranker = open_reranker(tmp_path / "store", model)
    assert reranker.store.vector_size == ranker.hidden_size
    docids = list(documents)
    got = reranker.rerank(QUERY, docids)
    want = unsplit_scores(model, documents, docids)
    assert np.ptp(list(want.values())) > 0.01, "scores that differ"
    assert max(abs(got[docid] - want[docid]) for docid in docids) < TOLERANCE["fp16"]


def test_a_shorter_list_is_another_list(stores, listformer_dir: Path, documents: dict[str, str]) -> None:
    """Documents see each other through the separators: a sublist is scored as that list, not as a slice."""
    docids = list(documents)[:3]
    got = open_reranker(stores["fp32"], listformer_dir).rerank(QUERY, docids)
    want = unsplit_scores(listformer_dir, documents, docids)
    assert max(abs(got[docid] - want[docid]) for docid in docids) < TOLERANCE["fp32"]


class StandInStore:
    """A listformer store's passages `d0`, `d1`, ... (token ids, states and vectors as given), and nothing else."""

    kind, url = "listformer", "stand-in"

    def __init__(self, documents: list[torch.Tensor], states: list[np.ndarray], vectors: np.ndarray | None) -> None:
        self.documents, self.states, self.vectors = documents, states, vectors
        self.vector_size = None if vectors is None else vectors.shape[1]

    def fetch(self, ids: list[str]) -> list[StoredPassage]:
        return [StoredPassage(docid, "", "", self.documents[i].numpy().astype(np.int32),
                              np.full((len(self.documents[i]), 2), -1, np.int32), self.states[i],
                              None if self.vectors is None else self.vectors[i])
                for docid, i in ((docid, int(docid[1:])) for docid in ids)]  # fmt: skip


def scored_with_a_stand_in(prior: bool, damage: Callable[[list[np.ndarray], np.ndarray], None]) -> None:
    """Rerank d0, d1, d2 of a tiny random Listformer's stand-in store after `damage(states, vectors)`."""
    ranker = tiny_listformer(1, prior=prior)
    query, documents = random_list(3, [4, 5, 6])
    with torch.no_grad():
        states = [ranker.encode_documents(ids[None], torch.ones_like(ids)[None])[0].numpy() for ids in documents]
    vectors = np.ones((len(documents), ranker.hidden_size), dtype=np.float32)  # (D, d)
    damage(states, vectors)
    reranker = ListformerReranker(ranker, StandInStore(documents, states, vectors if prior else None))  # type: ignore
    tokens = TokenizedText(query.numpy().astype(np.int32), np.full((len(query), 2), -1, np.int32))
    reranker.rerank_tokenized(tokens, ["d0", "d1", "d2"])


def test_a_list_holding_one_document_of_nan_states_names_that_document_and_the_store() -> None:
    """One document's NaN reaches every score of its list through the global tokens: the list's first document was
    named, with finite states, and the model's weights blamed for the store's damage (num58 F2). Random weights."""

    def damage(states: list[np.ndarray], vectors: np.ndarray) -> None:
        states[2][1] = np.nan  # (n, d): one token of the last document

    with pytest.raises(DilstoreError, match=r"^document 'd2': its score is not finite, as its stored states hold NaN"):
        scored_with_a_stand_in(False, damage)


def test_a_nan_passage_vector_a_prior_ranker_reads_is_named_not_the_model_s_weights() -> None:
    """The states were finite, so the model's weights were blamed for a damaged stored vector (num58 F3)."""

    def damage(states: list[np.ndarray], vectors: np.ndarray) -> None:
        vectors[1, 0] = np.nan

    with pytest.raises(DilstoreError, match=r"^document 'd1': .* as its stored passage vector holds NaN"):
        scored_with_a_stand_in(True, damage)


@pytest.fixture
def packaged(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty stand-in for the package's shipped-models folder."""
    folder = tmp_path / "models"
    folder.mkdir()
    monkeypatch.setattr("dilstore.reader.packaged.shipped.packaged_models_dir", lambda: folder)
    return folder


def test_without_a_model_the_packaged_listformer_reranks(
    stores, listformer_dir: Path, documents: dict[str, str], packaged: Path
) -> None:
    with pytest.raises(DilstoreError, match="the default Listformer checkpoint is missing"):
        open_reranker(stores["fp16"])
    shutil.copytree(listformer_dir, packaged / DEFAULT_LISTFORMER_NAME)
    docids = list(documents)
    assert open_reranker(stores["fp16"]).rerank(QUERY, docids) == open_reranker(stores["fp16"], listformer_dir).rerank(
        QUERY, docids
    )


def test_a_listformer_store_needs_its_own_listformer(stores, tmp_path: Path) -> None:
    with pytest.raises(FingerprintMismatchError):
        open_reranker(stores["fp16"], save_listformer(tmp_path / "other", seed=5))
    earl_like = save_base_encoder(tmp_path / "base", text_encoder())
    with pytest.raises(DilstoreError, match="base encoder without dilstore metadata"):
        open_reranker(stores["fp16"], earl_like)


def test_cli_reranks_a_run_with_the_listformer_the_store_names(
    stores, listformer_dir: Path, documents: dict[str, str], tmp_path: Path, capsys, packaged: Path
) -> None:
    docids = list(documents)
    first_stage = {"q1": {docid: float(len(docids) - rank) for rank, docid in enumerate(docids)}}
    (tmp_path / "topics.tsv").write_text(f"q1\t{QUERY}\n", encoding="utf-8")
    write_run(tmp_path / "first.trec", first_stage, tag="bm25")
    arguments = ["rerank", str(stores["fp32"]), "--topics", str(tmp_path / "topics.tsv"), "--run",
                 str(tmp_path / "first.trec"), "--output", str(tmp_path / "out.trec"), "--depth", "5", "--json",
                 "--threads", "1"]  # fmt: skip
    assert cli.main([*arguments, "--model", str(listformer_dir)]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["queries"] == 1 and summary["pairs"] == 5
    reranked = read_run(tmp_path / "out.trec")["q1"]
    want = unsplit_scores(listformer_dir, documents, docids[:5])
    assert sorted(reranked, key=reranked.get, reverse=True)[:5] == sorted(want, key=want.get, reverse=True)
    assert (tmp_path / "out.trec").read_text().split("\n")[0].endswith("dilstore-listformer")
    assert cli.main(arguments) == 2
    assert "the default Listformer checkpoint is missing" in capsys.readouterr().err


def test_precompute_defaults_to_the_packaged_listformer_and_a_plain_encoder_needs_k(
    corpus: Path, listformer_dir: Path, tmp_path: Path, capsys, packaged: Path
) -> None:
    base = save_base_encoder(tmp_path / "base", text_encoder(seed=1))
    args = precompute(corpus, base, tmp_path / "store", "fp16")
    at = args.index("--model")
    without_model = [*args[:at], *args[at + 2 :]]
    assert cli.main(without_model) == 2
    assert "the default Listformer checkpoint is missing" in capsys.readouterr().err
    shutil.copytree(listformer_dir, packaged / DEFAULT_LISTFORMER_NAME)
    assert cli.main(without_model) == 0
    assert json.loads(capsys.readouterr().out)["layers"] == DELAYED
    open_reranker(tmp_path / "store", listformer_dir)  # the packaged Listformer made it: the fingerprint matches
    shutil.rmtree(tmp_path / "store")
    assert cli.main(args) == 2
    assert "needs its delayed layers k (--layers)" in capsys.readouterr().err
    assert not (tmp_path / "store").exists()
    assert cli.main([*args, "--layers", "1"]) == 0
    captured = capsys.readouterr()
    assert "an untrained Listformer (k=1)" in captured.err
    assert json.loads(captured.out)["layers"] == 1
