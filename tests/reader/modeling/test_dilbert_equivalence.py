"""DilBert's offline + question + online halves equal the reference network, for every k and architecture.

The reference is the unmodified Hugging Face QA model run on the
concatenation `[CLS] q [SEP] p [SEP]` with the contract's position and
segment ids, whose first k layers get a block-diagonal mask (forward
pre-hooks swap it in) while layers k+1..l keep the model's own padding mask
(tests/fixtures/dilbert_tiny.py). Tiny random configs; fp32; tolerance 1e-4.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dilstore.reader.modeling.checkpoints import base_model_dir
from dilstore.reader.modeling.dilbert import DilBertReader
from dilstore.storage.errors import DilstoreError
from tests.fixtures.dilbert_tiny import TINY_CONFIGS, Batch, contract_inputs, random_batch, reference_logits, tiny_model

TOLERANCE = 1e-4
MIXED_LENGTHS = [(3, 9), (7, 4), (1, 12)]  # (question words, passage words): every example padded somewhere


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(base_model_dir())


def split_logits(reader: DilBertReader, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
    with torch.no_grad():
        return reader(batch.question_ids, batch.question_mask, batch.passage_ids, batch.passage_mask)


def max_valid_difference(left: torch.Tensor, right: torch.Tensor, batch: Batch) -> float:
    """Largest |left - right| over valid (non-padded) positions of the concatenation."""
    valid = torch.cat([batch.question_mask, batch.passage_mask], dim=1).bool()  # (b, nq + np)
    return float((left - right).abs()[valid].max())


CASES = [
    (name, k) for name, make in TINY_CONFIGS.items() for k in range(make().num_hidden_layers + 1)
]  # every architecture × every k in 0..l


@pytest.mark.parametrize(("name", "k"), CASES, ids=[f"{name}-k{k}" for name, k in CASES])
def test_composition_equals_block_diagonal_reference(name: str, k: int, tokenizer) -> None:
    model = tiny_model(name)
    reader = DilBertReader(model, tokenizer, layers=k)
    batch = random_batch(MIXED_LENGTHS)
    start, end = split_logits(reader, batch)
    ref_start, ref_end = reference_logits(model, batch, k)
    assert start.shape == ref_start.shape == (3, batch.question_ids.shape[1] + batch.passage_ids.shape[1])
    difference = max(max_valid_difference(start, ref_start, batch), max_valid_difference(end, ref_end, batch))
    assert difference < TOLERANCE, f"{name} k={k}: max |split - reference| = {difference:.2e}"


@pytest.mark.parametrize("name", list(TINY_CONFIGS))
def test_k0_equals_the_plain_hugging_face_qa_model(name: str, tokenizer) -> None:
    model = tiny_model(name)
    batch = random_batch(MIXED_LENGTHS, seed=1)
    start, end = split_logits(DilBertReader(model, tokenizer, layers=0), batch)
    with torch.no_grad():
        plain = model(**contract_inputs(model, batch))
    difference = max(
        max_valid_difference(start, plain.start_logits, batch), max_valid_difference(end, plain.end_logits, batch)
    )
    assert difference < TOLERANCE, f"{name}: max |k=0 split - plain HF| = {difference:.2e}"


@pytest.mark.parametrize("name", list(TINY_CONFIGS))
def test_sdpa_and_eager_attention_agree(name: str, tokenizer) -> None:
    """The additive masks mean the same to both attention implementations of transformers 5."""
    batch = random_batch(MIXED_LENGTHS, seed=2)
    k = TINY_CONFIGS[name]().num_hidden_layers - 1
    sdpa = split_logits(DilBertReader(tiny_model(name, "sdpa"), tokenizer, layers=k), batch)
    eager = split_logits(DilBertReader(tiny_model(name, "eager"), tokenizer, layers=k), batch)
    difference = max(max_valid_difference(s, e, batch) for s, e in zip(sdpa, eager))
    assert difference < TOLERANCE, f"{name}: max |sdpa - eager| = {difference:.2e}"


def test_an_attention_implementation_without_additive_masks_is_refused(tokenizer) -> None:
    """Only sdpa and eager take the (b, 1, n, n) additive masks the split layers pass; another one was accepted."""
    with pytest.raises(DilstoreError, match="attention implementation 'flex_attention' does not take"):
        DilBertReader(tiny_model("bert", "flex_attention"), tokenizer, layers=1)


@pytest.mark.parametrize("name", ["bert", "albert-grouped", "distilbert", "roberta"])
@settings(max_examples=8, deadline=None)
@given(
    lengths=st.lists(st.tuples(st.integers(1, 10), st.integers(1, 20)), min_size=2, max_size=4),
    k_fraction=st.floats(0, 1),
    seed=st.integers(0, 2**16),
)
def test_padded_batch_equals_one_example_at_a_time(
    name: str, lengths: list[tuple[int, int]], k_fraction: float, seed: int, tokenizer
) -> None:
    """Mixed lengths padded together give each example's own results; padding content never matters."""
    model = tiny_model(name)
    k = round(k_fraction * model.config.num_hidden_layers)
    reader = DilBertReader(model, tokenizer, layers=k)
    batch = random_batch(lengths, seed=seed, pad_id=7)  # padded slots hold a real word id, masked out
    start, end = split_logits(reader, batch)
    nq = batch.question_ids.shape[1]
    for row in range(len(lengths)):
        one = batch.example(row)
        one_start, one_end = split_logits(reader, one)
        q_len, p_len = one.question_ids.shape[1], one.passage_ids.shape[1]
        kept = torch.cat([torch.arange(q_len), nq + torch.arange(p_len)])  # valid columns of the batched row
        difference = max(
            float((start[row, kept] - one_start[0]).abs().max()), float((end[row, kept] - one_end[0]).abs().max())
        )
        assert difference < TOLERANCE, f"{name} k={k} row {row}: max |batched - alone| = {difference:.2e}"


def test_padded_positions_get_the_lowest_logit(tokenizer) -> None:
    batch = random_batch(MIXED_LENGTHS)
    start, end = split_logits(DilBertReader(tiny_model("bert"), tokenizer, layers=1), batch)
    padding = ~torch.cat([batch.question_mask, batch.passage_mask], dim=1).bool()
    lowest = torch.finfo(start.dtype).min
    assert padding.any()
    assert bool((start[padding] == lowest).all()) and bool((end[padding] == lowest).all())
    assert bool((start[~padding] > lowest).all())


def test_offline_and_online_halves_compose_like_forward(tokenizer) -> None:
    """Stored passage states (encode_passages) and a broadcast single question reproduce forward()."""
    reader = DilBertReader(tiny_model("roberta"), tokenizer, layers=2)
    batch = random_batch([(4, 6), (4, 11), (4, 3)], seed=5)
    with torch.no_grad():
        question_states = reader.encode_questions(batch.question_ids[:1], batch.question_mask[:1])  # (1, nq, d)
        passage_states = reader.encode_passages(batch.passage_ids, batch.passage_mask)  # (3, np, d)
        start, end = reader.interact(question_states, batch.question_mask[:1], passage_states, batch.passage_mask)
        full_start, full_end = reader(
            batch.question_ids[:1].expand(3, -1), batch.question_mask[:1].expand(3, -1),
            batch.passage_ids, batch.passage_mask,
        )  # fmt: skip
    assert passage_states.shape == (3, batch.passage_ids.shape[1], reader.hidden_size)
    assert torch.allclose(start, full_start, atol=TOLERANCE, rtol=0)
    assert torch.allclose(end, full_end, atol=TOLERANCE, rtol=0)


@pytest.mark.parametrize("passages", [1, 2, 3])
def test_one_question_is_broadcast_over_any_number_of_passages(tokenizer, passages: int) -> None:
    """A question batch of 1 is read against each of the b passages, as the same question given b times is."""
    reader = DilBertReader(tiny_model("bert"), tokenizer, layers=1)
    batch = random_batch([(4, 6), (4, 11), (4, 3)][:passages], seed=8)
    with torch.no_grad():
        question_states = reader.encode_questions(batch.question_ids[:1], batch.question_mask[:1])  # (1, nq, d)
        passage_states = reader.encode_passages(batch.passage_ids, batch.passage_mask)  # (b, np, d)
        start, end = reader.interact(question_states, batch.question_mask[:1], passage_states, batch.passage_mask)
        repeated = reader.interact(question_states.expand(passages, -1, -1),
                                   batch.question_mask[:1].expand(passages, -1), passage_states, batch.passage_mask)
    assert start.shape == (passages, batch.question_ids.shape[1] + batch.passage_ids.shape[1])
    assert torch.equal(start, repeated[0]) and torch.equal(end, repeated[1])


@pytest.mark.parametrize("k", [-1, 4, 2.0])
def test_k_outside_0_to_l_is_refused(k, tokenizer) -> None:
    with pytest.raises(DilstoreError, match=r"must be an integer in 0\.\.3"):
        DilBertReader(tiny_model("bert"), tokenizer, layers=k)


def test_segment_longer_than_the_position_table_is_refused(tokenizer) -> None:
    reader = DilBertReader(tiny_model("bert"), tokenizer, layers=1)
    too_long = torch.full((1, 65), 9)
    with pytest.raises(DilstoreError, match="longer than this model's 64 positions"):
        reader.encode_passages(too_long, torch.ones_like(too_long))


@pytest.mark.parametrize("name", list(TINY_CONFIGS))
def test_the_reference_block_diagonal_mask_changes_the_result(name: str, tokenizer) -> None:
    """Guards the reference itself: its hooks engage, so a split that ignored k could not pass."""
    model = tiny_model(name)
    batch = random_batch(MIXED_LENGTHS)
    plain_start, _ = split_logits(DilBertReader(model, tokenizer, layers=0), batch)
    delayed_start, _ = reference_logits(model, batch, k=2)
    assert max_valid_difference(plain_start, delayed_start, batch) > 100 * TOLERANCE
