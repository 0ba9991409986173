"""The rankers' shared scoring interface, the baselines' checkpoints, and loading rankers by kind.

Tiny random 2-layer BERTs with the MiniLM tokenizer (tests/fixtures/qa_training_fixtures.py).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from dilstore.reader.batching import pad_token_ids
from dilstore.reader.modeling.checkpoints import METADATA_FILE
from dilstore.reader.modeling.cross_encoder import CrossEncoderRanker
from dilstore.reader.modeling.earl import EarlConfig, EarlRanker
from dilstore.reader.modeling.rankers import checkpoint_kind, load_ranker, new_ranker
from dilstore.reader.modeling.siamese import CosineBiEncoder, SiameseRanker
from dilstore.storage.errors import DilstoreError
from tests.fixtures.qa_training_fixtures import write_tiny_checkpoint

QUERIES = ["who runs the zürich trams", "when did curie win", "how high is kilimanjaro"]
DOCUMENTS = [
    "The Zürich tram network opened in 1882 and is run by VBZ, carrying 200 million people a year.",
    "Marie Curie won the Nobel Prize in Chemistry in 1911.",
    "Mount Kilimanjaro rises 5,895 metres.",
]
KINDS = ("earl", "cross-encoder", "siamese")


@pytest.fixture(scope="module")
def tiny_base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_checkpoint(tmp_path_factory.mktemp("tiny-base"), seed=5)


def ranker(kind: str, base: Path):
    return new_ranker(kind, base, EarlConfig(query_layers=1))


@pytest.mark.parametrize("kind", KINDS)
def test_save_then_load_gives_identical_scores(kind: str, tiny_base: Path, tmp_path: Path) -> None:
    original = ranker(kind, tiny_base)
    original.save_pretrained(tmp_path)
    loaded = load_ranker(tmp_path)
    assert type(loaded) is type(original) and not loaded.training
    with torch.no_grad():
        assert torch.equal(loaded.score_texts(QUERIES, DOCUMENTS), original.score_texts(QUERIES, DOCUMENTS))
    names = {path.name for path in tmp_path.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", METADATA_FILE} <= names
    assert not [name for name in names if name.endswith((".bin", ".pt", ".pth", ".pkl"))], "no pickle files"
    assert checkpoint_kind(tmp_path) == kind


def test_baseline_metadata_says_which_layers_see_the_texts_apart(tiny_base: Path, tmp_path: Path) -> None:
    CrossEncoderRanker.from_base(tiny_base).save_pretrained(tmp_path / "cross")
    SiameseRanker.from_base(tiny_base).save_pretrained(tmp_path / "siamese")
    cross = json.loads((tmp_path / "cross" / METADATA_FILE).read_text())
    siamese = json.loads((tmp_path / "siamese" / METADATA_FILE).read_text())
    assert cross == {"format": 1, "kind": "cross-encoder", "architecture": "bert", "layers": 0, "num_layers": 2}
    assert siamese == {"format": 1, "kind": "siamese", "architecture": "bert", "layers": 2, "num_layers": 2,
                       "pooling": "mean"}  # fmt: skip


@pytest.mark.parametrize("kind", KINDS)
def test_group_scores_equal_pair_scores_whatever_the_padding(kind: str, tiny_base: Path) -> None:
    """A query's group of 3 documents (padded together) scores each exactly as its pair alone does."""
    model = ranker(kind, tiny_base)
    with torch.no_grad():
        query = model.tokenize_query(QUERIES[0], 32)
        groups = model.score_groups([query, query], [[model.tokenize_document(d, 64) for d in DOCUMENTS]] * 2)
        pairs = model.score_texts([QUERIES[0]] * 3, DOCUMENTS, 32, 64)
    assert groups.shape == (2, 3)
    assert torch.allclose(groups[0], pairs, atol=1e-5) and torch.allclose(groups[0], groups[1], atol=1e-6)
    assert len(set(pairs.tolist())) == 3


@pytest.mark.parametrize("kind", KINDS)
def test_a_tokenizer_without_a_pad_token_scores_the_same(kind: str, tiny_base: Path) -> None:
    """Padding is masked, so its id cannot matter: EARL refused such a tokenizer, the cross-encoder and the siamese
    ranker failed inside torch.full with a TypeError; every stage now pads with pad_id's one rule."""
    model = ranker(kind, tiny_base)
    with torch.no_grad():
        query = model.tokenize_query(QUERIES[0], 32)
        groups = [[model.tokenize_document(d, 64) for d in DOCUMENTS]]
        padded = model.score_groups([query], groups)
        model.tokenizer.pad_token = None
        assert model.tokenizer.pad_token_id is None
        assert torch.allclose(model.score_groups([query], groups), padded, atol=1e-6)


def test_earl_group_scores_are_its_unsplit_forward(tiny_base: Path) -> None:
    model = ranker("earl", tiny_base)
    query_ids, query_mask = model.tokenize_queries(QUERIES[:1] * 3, 32)
    doc_ids, doc_mask = model.tokenize_documents(DOCUMENTS, 64)
    with torch.no_grad():
        expected = model(query_ids, query_mask, doc_ids, doc_mask)  # (3,)
        group = [model.tokenize_document(document, 64) for document in DOCUMENTS]
        got = model.score_groups([model.tokenize_query(QUERIES[0], 32)], [group])
    assert torch.allclose(got[0], expected, atol=1e-5)


@pytest.mark.parametrize("kind", KINDS)
def test_an_empty_query_is_named_a_query(kind: str, tiny_base: Path) -> None:
    with pytest.raises(DilstoreError, match="the query is empty"):
        ranker(kind, tiny_base).tokenize_query(" ", 16)


def test_cross_encoder_reads_q_then_d_with_segments_0_and_1(tiny_base: Path) -> None:
    model = CrossEncoderRanker.from_base(tiny_base)
    tokenizer = model.tokenizer
    query, document = model.tokenize_query("who runs trams", 32), model.tokenize_document(DOCUMENTS[0], 10)
    assert query[0] == tokenizer.cls_token_id and query[-1] == tokenizer.sep_token_id
    assert len(document) == 9 and document[-1] == tokenizer.sep_token_id and tokenizer.cls_token_id not in document
    earl = EarlRanker.from_encoder(model.encoder, tokenizer, EarlConfig(query_layers=1))
    earl_document = earl.tokenize_document(DOCUMENTS[0], 10)
    assert document.tolist() == earl_document[1:].tolist(), "the same word pieces as EARL's [CLS] d [SEP]"
    pair = torch.tensor([list(query) + list(document)])
    segments = torch.tensor([[0] * len(query) + [1] * len(document)])
    with torch.no_grad():
        expected = model(pair, segments, torch.ones_like(pair))
        assert torch.equal(model.score_groups([query], [[document]])[0], expected)
        model.encoder.embeddings.token_type_embeddings.weight[1].add_(0.5)
        assert not torch.equal(model.score_groups([query], [[document]])[0], expected), "documents use segment 1"


def test_siamese_score_is_the_dot_product_of_mean_embeddings(tiny_base: Path) -> None:
    model = SiameseRanker.from_base(tiny_base)
    query, document = model.tokenize_query(QUERIES[1], 32), model.tokenize_document(DOCUMENTS[1], 64)
    with torch.no_grad():
        q = model.encoder(input_ids=torch.from_numpy(query).long()[None]).last_hidden_state.mean(dim=1)  # (1, d)
        d = model.encoder(input_ids=torch.from_numpy(document).long()[None]).last_hidden_state.mean(dim=1)  # (1, d)
        assert torch.allclose(model.score_groups([query], [[document]])[0, 0], (q * d).sum(), atol=1e-4)


def test_cosine_bi_encoder_scores_the_cosine_of_the_same_embeddings(tiny_base: Path, tmp_path: Path) -> None:
    dot, cosine = SiameseRanker.from_base(tiny_base), CosineBiEncoder.from_base(tiny_base)
    query = dot.tokenize_query(QUERIES[1], 32)
    documents = [dot.tokenize_document(text, 64) for text in DOCUMENTS[:3]]
    ids, mask = pad_token_ids(documents, dot.tokenizer.pad_token_id)  # (3, n) each
    with torch.no_grad():
        q = dot.embed(torch.from_numpy(query).long()[None], torch.ones(1, len(query), dtype=torch.long))  # (1, d)
        d = dot.embed(ids, mask)  # (3, d)
        expected = torch.nn.functional.cosine_similarity(q, d, dim=-1)  # (3,)
        torch.testing.assert_close(cosine.score_groups([query], [documents])[0], expected, atol=1e-5, rtol=0)
    assert not torch.allclose(expected, (q * d).sum(dim=-1), atol=1e-3), "the dot product would differ"
    with pytest.raises(DilstoreError, match="evaluation reference and is never saved"):
        cosine.save_pretrained(tmp_path / "never")
    assert not (tmp_path / "never").exists()


def test_loading_refuses_what_is_not_a_ranker(tiny_base: Path, tmp_path: Path) -> None:
    with pytest.raises(DilstoreError, match="base encoder without dilstore metadata"):
        load_ranker(tiny_base)
    SiameseRanker.from_base(tiny_base).save_pretrained(tmp_path)
    with pytest.raises(DilstoreError, match="holds a 'siamese' checkpoint, not a 'cross-encoder' ranker"):
        CrossEncoderRanker.from_pretrained(tmp_path)
    with pytest.raises(DilstoreError, match="model directory not found"):
        load_ranker(tmp_path / "missing")
    with pytest.raises(DilstoreError, match="unknown ranker kind"):
        new_ranker("colbert", tiny_base)


def test_a_siamese_checkpoint_of_another_pooling_is_refused(tiny_base: Path, tmp_path: Path) -> None:
    """The Siamese ranker mean-pools; a checkpoint that says it pools by [CLS] would load and score otherwise."""
    SiameseRanker.from_base(tiny_base).save_pretrained(tmp_path)
    metadata = json.loads((tmp_path / METADATA_FILE).read_text())
    assert metadata["pooling"] == "mean"
    (tmp_path / METADATA_FILE).write_text(json.dumps({**metadata, "pooling": "cls"}), encoding="utf-8")
    with pytest.raises(DilstoreError, match=r"a siamese checkpoint must say pooling 'mean', got 'cls'$"):
        SiameseRanker.from_pretrained(tmp_path)
    with pytest.raises(DilstoreError, match=r"a siamese checkpoint must say pooling 'mean', got 'cls'$"):
        load_ranker(tmp_path)


@pytest.mark.parametrize(
    ("length", "expected"), [(3, 3), (4, 4), (2, None), (0, None), (True, None), (None, "default")]
)
def test_the_trained_query_length_is_read_back_and_holds_cls_a_word_and_sep(
    length: object, expected: object, tmp_path: Path
) -> None:
    """`[CLS] q [SEP]` needs 3 tokens; a record of fewer would cut every query to nothing but its markers."""
    from dilstore.reader.modeling.checkpoints import TRAINING_METADATA_FILE
    from dilstore.reader.modeling.ranker_base import trained_query_length
    from dilstore.reader.modeling.ranking_inputs import DEFAULT_MAX_QUERY_LENGTH

    config = {} if length is None else {"max_query_length": length}
    (tmp_path / TRAINING_METADATA_FILE).write_text(json.dumps({"config": config}), encoding="utf-8")
    if expected is None:
        with pytest.raises(DilstoreError, match=r"config\.max_query_length must be an integer of at least 3, got "):
            trained_query_length(tmp_path)
    else:
        assert trained_query_length(tmp_path) == (DEFAULT_MAX_QUERY_LENGTH if expected == "default" else expected)


def test_a_query_with_no_documents_to_score_is_refused(tiny_base: Path) -> None:
    from dilstore.reader.modeling.ranking_inputs import group_size

    model = SiameseRanker.from_base(tiny_base)
    query = model.tokenize_query("q words", 8)
    with pytest.raises(DilstoreError, match=r"same number \(at least 1\) of documents, got \[0\]"):
        group_size([query, query], [[], []])
    with pytest.raises(DilstoreError, match=r"same number \(at least 1\) of documents, got \[0\]"):
        model.score_groups([query], [[]])


def test_groups_must_be_even(tiny_base: Path) -> None:
    model = SiameseRanker.from_base(tiny_base)
    query, document = model.tokenize_query("q words", 8), model.tokenize_document("d words", 8)
    with pytest.raises(DilstoreError, match="same number"):
        model.score_groups([query, query], [[document], [document, document]])
    with pytest.raises(DilstoreError, match="2 queries but 1 document groups"):
        model.score_groups([query, query], [[document]])
