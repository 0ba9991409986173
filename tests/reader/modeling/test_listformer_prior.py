"""The Listformer's bi-encoder prior: the base's own sentence cosine, frozen, stored per document, named not saved.

Tiny random BERT encoders (tests/fixtures/listformer_tiny.py), fp32. The
reference sentence embedding is plain Hugging Face: BertModel's last hidden
states of `[CLS] text [SEP]`, mean-pooled over the text's tokens.
"""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors.torch import load_file
from transformers import BertModel

from dilstore.reader.modeling.listformer import PRIOR_PREFIX, ListformerConfig, ListformerRanker
from dilstore.reader.modeling.prior import PRIOR_SCALE
from dilstore.storage.errors import DilstoreError
from tests.fixtures.earl_tiny import tiny_encoder, tokenizer
from tests.fixtures.listformer_tiny import padded_lists, random_list, tiny_listformer
from tests.fixtures.qa_training_fixtures import write_tiny_checkpoint
from tests.fixtures.random_tokens import CLS

TOLERANCE = 1e-4


def sentence_embedding(encoder: BertModel, ids: torch.Tensor) -> torch.Tensor:
    """Plain Hugging Face: `[CLS] text [SEP]` ids (n,) → mean of the last hidden states (d,)."""
    with torch.no_grad():
        return encoder(input_ids=ids[None]).last_hidden_state[0].mean(dim=0)


def scores_of(ranker: ListformerRanker, query: torch.Tensor, documents: list[torch.Tensor]) -> torch.Tensor:
    with torch.no_grad():
        return ranker(*padded_lists([(query, documents)]))[0]  # (D,)


@pytest.mark.parametrize("delayed_layers", [0, 2])
def test_an_untrained_prior_listformer_scores_20_times_the_base_cosine(delayed_layers: int) -> None:
    """Head at zero, scale at 20: each score is 20 × cos of the base's sentence embeddings of query and document."""
    encoder = tiny_encoder(seed=4)
    ranker = ListformerRanker.from_encoder(encoder, tokenizer(), ListformerConfig(delayed_layers, prior=True))
    ranker.cls_token_id = CLS  # the tiny vocabulary's
    encoder.half().float()  # the prior encoder is held at the base rounded to fp16
    assert ranker.prior_scale.item() == PRIOR_SCALE and not ranker.score.weight.any()
    query, documents = random_list(3, [6, 2, 9, 4], seed=4)
    query_vector = sentence_embedding(encoder, query)
    cosines = torch.stack(
        [F.cosine_similarity(query_vector, sentence_embedding(encoder, torch.cat([torch.tensor([CLS]), d])), dim=0)
         for d in documents]
    )  # fmt: skip
    scores = scores_of(ranker, query, documents)
    torch.testing.assert_close(scores, PRIOR_SCALE * cosines, atol=TOLERANCE, rtol=0)
    assert float(cosines.max() - cosines.min()) > 0.01, "the documents must be told apart for this to mean much"


def test_stored_document_vectors_and_states_give_the_scores_of_the_forward() -> None:
    """Each document alone and unpadded, as precompute stores its states and vector, scored as one list online."""
    ranker = tiny_listformer(1, seed=5, prior=True)
    with torch.no_grad():
        ranker.score.weight.normal_(std=0.5)  # a trained head, so both halves of the score count
    query, documents = random_list(4, [3, 8, 1, 5], seed=5)
    want = scores_of(ranker, query, documents)
    with torch.no_grad():
        alone = [(d[None], torch.ones(1, len(d), dtype=torch.long)) for d in documents]
        stored = [ranker.encode_documents(ids, mask)[0] for ids, mask in alone]
        vectors = torch.cat([ranker.document_vectors(ids, mask) for ids, mask in alone])  # (D, d)
        _, _, _, doc_mask = padded_lists([(query, documents)])
        doc_states = torch.zeros(*doc_mask.shape, ranker.hidden_size)
        for j, states in enumerate(stored):
            doc_states[0, j, : len(states)] = states
        query_mask = torch.ones(1, len(query), dtype=torch.long)
        got = ranker.score_lists(
            ranker.encode_queries(query[None], query_mask), query_mask, doc_states, doc_mask,
            query_vectors=ranker.query_vectors(query[None], query_mask), doc_vectors=vectors[None],
        )[0]  # fmt: skip
    torch.testing.assert_close(got, want, atol=TOLERANCE, rtol=0)


@settings(max_examples=15, deadline=None)
@given(order=st.permutations(range(5)), delayed_layers=st.integers(0, 2))
def test_permuting_documents_permutes_prior_scores(order: list[int], delayed_layers: int) -> None:
    ranker = tiny_listformer(delayed_layers, seed=6, prior=True)
    with torch.no_grad():
        ranker.score.weight.normal_(std=0.5)
    query, documents = random_list(3, [2, 7, 4, 4, 1], seed=6)
    scores = scores_of(ranker, query, documents)
    permuted = scores_of(ranker, query, [documents[j] for j in order])
    torch.testing.assert_close(permuted, scores[order], atol=TOLERANCE, rtol=0)


def test_the_prior_encoder_never_trains_and_stays_in_eval_mode() -> None:
    ranker = tiny_listformer(1, seed=7, prior=True)
    before = {name: p.clone() for name, p in ranker.prior_encoder.named_parameters()}
    ranker.train()
    assert ranker.encoder.training and not ranker.prior_encoder.training
    optimizer = torch.optim.SGD([p for p in ranker.parameters() if p.requires_grad], lr=1.0)
    query, documents = random_list(2, [3, 5], seed=7)
    ranker(*padded_lists([(query, documents)])).sum().backward()
    optimizer.step()
    assert ranker.prior_scale.grad is not None and ranker.score.weight.grad is not None
    assert all(p.grad is None for p in ranker.prior_encoder.parameters())
    assert all(torch.equal(p, before[name]) for name, p in ranker.prior_encoder.named_parameters())


def test_vectors_are_refused_without_a_prior_and_required_with_one() -> None:
    plain, prior = tiny_listformer(1, prior=False), tiny_listformer(1, prior=True)
    query, documents = random_list(2, [3, 2])
    query_ids, query_mask, doc_ids, doc_mask = padded_lists([(query, documents)])
    with torch.no_grad():
        query_states = prior.encode_queries(query_ids, query_mask)
        doc_states = prior.encode_documents(doc_ids[0], doc_mask[0])[None]
        vectors = torch.zeros(1, 2, prior.hidden_size)
        with pytest.raises(DilstoreError, match="needs query_vectors and doc_vectors"):
            prior.score_lists(query_states, query_mask, doc_states, doc_mask)
        with pytest.raises(DilstoreError, match=r"prior vectors must be \(lists, d\)"):
            prior.score_lists(query_states, query_mask, doc_states, doc_mask, vectors[:, 0], vectors[0])
        with pytest.raises(DilstoreError, match="has no prior"):
            plain.score_lists(query_states, query_mask, doc_states, doc_mask, vectors[:, 0], vectors)
        with pytest.raises(DilstoreError, match="has no prior"):
            plain.document_vectors(doc_ids[0], doc_mask[0])
    with pytest.raises(DilstoreError, match="prior must be True or False"):
        ListformerConfig(1, prior="yes")


def test_a_checkpoint_names_the_base_of_its_prior_instead_of_storing_it(tmp_path) -> None:
    base = write_tiny_checkpoint(tmp_path / "base")
    ranker = ListformerRanker.from_base(base, ListformerConfig(1, prior=True))
    with torch.no_grad():
        ranker.score.weight.normal_(std=0.5)
    ranker.save_pretrained(tmp_path / "ckpt")
    metadata = json.loads((tmp_path / "ckpt" / "dilstore.json").read_text())
    assert metadata["prior"] is True and metadata["base_encoder"]["model"] == str(base.resolve())
    saved = load_file(tmp_path / "ckpt" / "model.safetensors")
    assert "prior_scale" in saved and not any(name.startswith(PRIOR_PREFIX) for name in saved)
    loaded = ListformerRanker.from_pretrained(tmp_path / "ckpt")
    assert not any(p.requires_grad for p in loaded.prior_encoder.parameters())
    query, documents = random_list(3, [4, 2, 6], seed=8)
    assert float((scores_of(loaded, query, documents) - scores_of(ranker, query, documents)).abs().max()) < 1e-2

    write_tiny_checkpoint(base, seed=99)  # another base at the same path
    with pytest.raises(DilstoreError, match="install the base it was trained from"):
        ListformerRanker.from_pretrained(tmp_path / "ckpt")
