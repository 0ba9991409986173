"""The Listformer's model core: blocked attention equals the dense masked reference, order invariance,
document-wise positions, the delayed split, checkpoints.

Tiny random BERT encoders (tests/fixtures/listformer_tiny.py), fp32, tolerance
1e-4. The reference lays each list out as one sequence under a dense N×N
mask and runs the encoder's own Hugging Face layers.
"""

from __future__ import annotations

import json

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import BertConfig

from dilstore.reader.modeling.earl import EarlRanker
from dilstore.reader.modeling.listformer import ListformerConfig, ListformerRanker, ListLayout, global_local_layer
from dilstore.storage.errors import DilstoreError
from tests.fixtures.earl_tiny import tiny_config, tokenizer
from tests.fixtures.listformer_tiny import (
    dense_mask,
    dense_reference,
    list_positions,
    padded_lists,
    random_list,
    tiny_listformer,
)

TOLERANCE = 1e-4
LISTS = [(3, [4, 1, 7]), (1, [9]), (5, [2, 2, 6, 3, 1])]  # (query words, document words)


def scores_of(ranker: ListformerRanker, query: torch.Tensor, documents: list[torch.Tensor]) -> torch.Tensor:
    with torch.no_grad():
        return ranker(*padded_lists([(query, documents)]))[0]  # (D,)


# ---------------------------------------------------------------------- blocked equals dense


@settings(max_examples=25, deadline=None)
@given(
    heads=st.sampled_from([1, 2, 4]),
    head_size=st.sampled_from([2, 8]),
    query_length=st.integers(1, 5),
    document_lengths=st.lists(st.integers(1, 6), min_size=1, max_size=5),
    seed=st.integers(0, 2**16),
)
def test_one_blocked_layer_equals_the_dense_masked_bert_layer(heads, head_size, query_length, document_lengths, seed):
    """Random widths and lists: global_local_layer on random states = BertLayer under the dense N×N mask."""
    torch.manual_seed(seed)
    width = heads * head_size
    config = BertConfig(hidden_size=width, num_attention_heads=heads, intermediate_size=2 * width,
                        num_hidden_layers=1, initializer_range=0.1, attn_implementation="eager")  # fmt: skip
    layer = ListformerRanker(config, tokenizer()).encoder.encoder.layer[0].eval()
    n, count = max(document_lengths), len(document_lengths)
    query = torch.randn(1, query_length, width)
    documents = torch.randn(1, count, n, width)
    doc_mask = (torch.arange(n) < torch.tensor(document_lengths)[:, None]).long()[None]  # (1, D, n)
    separators = torch.tensor(document_lengths)[None] - 1  # (1, D)
    with torch.no_grad():
        layout = ListLayout(torch.ones(1, query_length, dtype=torch.long), doc_mask, separators)
        got_query, got_documents = global_local_layer(layer, query, documents, layout)
        laid_out = torch.cat([query[0], *(documents[0, j, :length] for j, length in enumerate(document_lengths))])
        allowed = dense_mask(query_length, document_lengths, global_local=True)
        additive = torch.zeros(allowed.shape).masked_fill(~allowed, torch.finfo(torch.float32).min)
        want = layer(laid_out[None], additive[None, None])
        want = (want[0] if isinstance(want, tuple) else want)[0]  # (N, d)
    got = torch.cat([got_query[0], *(got_documents[0, j, :length] for j, length in enumerate(document_lengths))])
    assert float((got - want).abs().max()) < TOLERANCE


@pytest.mark.parametrize("delayed_layers", [0, 1, 2])
@pytest.mark.parametrize(("query_words", "document_words"), LISTS)
def test_scores_equal_the_dense_reference(delayed_layers, query_words, document_words) -> None:
    ranker = tiny_listformer(delayed_layers)
    query, documents = random_list(query_words, document_words, seed=delayed_layers)
    want, _ = dense_reference(ranker, query, documents)
    got = scores_of(ranker, query, documents)
    assert got.shape == (len(document_words),)
    assert float((got - want).abs().max()) < TOLERANCE


def test_a_batch_of_padded_lists_scores_each_list_as_alone() -> None:
    ranker = tiny_listformer(1)
    lists = [random_list(words, lengths, seed=index) for index, (words, lengths) in
             enumerate([(3, [4, 1, 7]), (6, [2, 9, 3]), (1, [1, 1, 1])])]  # fmt: skip
    with torch.no_grad():
        batched = ranker(*padded_lists(lists, pad_id=7))  # (3, 3): padding holds a word id, which must not matter
    for row, (query, documents) in enumerate(lists):
        assert float((batched[row] - scores_of(ranker, query, documents)).abs().max()) < TOLERANCE


def test_no_dense_list_mask_is_built(monkeypatch) -> None:
    """Every attention mask is a key mask broadcast over its queries, per document or for the global tokens."""
    ranker = tiny_listformer()
    query, documents = random_list(3, [8] * 6)
    seen: list[tuple[int, ...]] = []
    original = torch.nn.functional.scaled_dot_product_attention

    def recording(*args, **kwargs):
        seen.append(tuple(kwargs["attn_mask"].shape))
        return original(*args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", recording)
    scores_of(ranker, query, documents)
    assert seen and all(shape[-2] == 1 for shape in seen), "key masks broadcast over the queries: no (N, N) mask"


@settings(max_examples=15, deadline=None)
@given(block_keys=st.integers(1, 120), lists=st.integers(1, 3), seed=st.integers(0, 2**16))
def test_documents_attended_in_blocks_score_as_all_at_once(block_keys, lists, seed) -> None:
    """The local attention copied every document's keys (its own, the query's, every separator's) for the whole
    list at once: 3.6 GB at 1,000 documents (rank48 F2). In blocks of LOCAL_BLOCK_KEYS key rows (at least one
    document) the scores are those of one block, and no local attention sees more rows than a block holds."""
    from dilstore.reader.modeling import listformer

    ranker = tiny_listformer(1)
    generator = torch.Generator().manual_seed(seed)
    shapes = [[int(length) for length in torch.randint(1, 7, (5,), generator=generator)] for _ in range(lists)]
    batch = padded_lists([random_list(3, lengths, seed=seed + index) for index, lengths in enumerate(shapes)])
    with torch.no_grad():
        whole = ranker(*batch)  # (B, D): one block (the default holds far more rows than these lists)
    local_keys = batch[2].shape[2] + batch[0].shape[1] + 5  # n + nq + D: the keys of one document
    blocks: list[int] = []  # the documents of each local attention call
    original = torch.nn.functional.scaled_dot_product_attention

    def recording(query, key, *args, **kwargs):
        if key.shape[-2] == local_keys:  # a local call, (B·b, h, n + nq + D, hs); a global one has nq + D·n keys
            blocks.append(key.shape[0] // lists)
        return original(query, key, *args, **kwargs)

    with pytest.MonkeyPatch.context() as patch, torch.no_grad():
        patch.setattr(listformer, "LOCAL_BLOCK_KEYS", block_keys)
        patch.setattr(torch.nn.functional, "scaled_dot_product_attention", recording)
        blocked = ranker(*batch)
    assert float((blocked - whole).abs().max()) < TOLERANCE
    step = max(1, block_keys // (lists * local_keys))  # documents a block holds: at least one
    list_layers = ranker.encoder.config.num_hidden_layers - 1
    assert blocks == [min(step, 5 - start) for start in range(0, 5, step)] * list_layers


def test_the_feed_forward_runs_over_valid_document_tokens_only() -> None:
    """Every document was padded to the list's longest and the feed-forward ran over the padding too: most of the
    time and memory of a list of passages of mixed lengths. The scores stay those of the dense reference."""
    ranker = tiny_listformer(1)
    query, documents = random_list(2, [1, 9, 3])
    rows: list[int] = []
    layer = ranker.encoder.encoder.layer[1]
    original = layer.intermediate.forward
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(layer.intermediate, "forward", lambda hidden: rows.append(hidden.shape[-2]) or original(hidden))
        got = scores_of(ranker, query, documents)
    want, _ = dense_reference(ranker, query, documents)
    assert float((got - want).abs().max()) < TOLERANCE
    query_tokens = len(query)
    assert sorted(rows) == sorted([query_tokens, (1 + 1) + (9 + 1) + (3 + 1)]), "documents' tokens: words + [SEP]"


# ---------------------------------------------------------------------- order invariance and positions


@settings(max_examples=20, deadline=None)
@given(
    query_words=st.integers(0, 4),
    document_words=st.lists(st.integers(0, 6), min_size=1, max_size=6),
    delayed_layers=st.integers(0, 2),
    data=st.data(),
)
def test_permuting_documents_permutes_scores_and_changes_nothing_else(query_words, document_words, delayed_layers,
                                                                      data) -> None:  # fmt: skip
    ranker = tiny_listformer(delayed_layers)
    order = data.draw(st.permutations(range(len(document_words))))
    query, documents = random_list(query_words, document_words, seed=len(document_words))
    permuted = [documents[j] for j in order]
    with torch.no_grad():
        states = {}
        for name, listed in (("original", documents), ("permuted", permuted)):
            query_ids, query_mask, doc_ids, doc_mask = padded_lists([(query, listed)])
            query_states = ranker.encode_queries(query_ids, query_mask)
            doc_states = ranker.encode_documents(doc_ids[0], doc_mask[0])[None]
            final_query, final_docs = ranker.encode_lists(query_states, query_mask, doc_states, doc_mask)
            scores = ranker.score_lists(query_states, query_mask, doc_states, doc_mask)[0]
            states[name] = (final_query[0], final_docs[0], doc_mask[0], scores)
    query_a, docs_a, mask_a, scores_a = states["original"]
    query_b, docs_b, mask_b, scores_b = states["permuted"]
    assert float((scores_b - scores_a[list(order)]).abs().max()) < TOLERANCE
    assert float((query_b - query_a).abs().max()) < TOLERANCE
    assert torch.equal(mask_b, mask_a[list(order)])  # (tail61b F4) unpacked and never compared before
    for position, j in enumerate(order):
        valid = mask_a[j].bool()
        assert float((docs_b[position][valid] - docs_a[j][valid]).abs().max()) < TOLERANCE


def test_positions_restart_at_zero_in_every_document() -> None:
    """The model matches the reference with document-wise positions, not the one counting through the list."""
    assert list_positions(3, [2, 4]).tolist() == [0, 1, 2, 0, 1, 0, 1, 2, 3]
    ranker = tiny_listformer()
    query, documents = random_list(2, [3, 5, 2])
    got = scores_of(ranker, query, documents)
    document_wise, _ = dense_reference(ranker, query, documents)
    list_wise, _ = dense_reference(ranker, query, documents, document_wise_positions=False)
    assert float((got - document_wise).abs().max()) < TOLERANCE
    assert float((got - list_wise).abs().max()) > 100 * TOLERANCE


def test_a_documents_score_depends_on_the_query_and_the_other_documents() -> None:
    """Global-local attention lets documents see the query and each other through the global tokens."""
    ranker = tiny_listformer()
    query, documents = random_list(3, [4, 5, 6], seed=1)
    other_query, other_documents = random_list(3, [4, 5, 6], seed=2)
    base = scores_of(ranker, query, documents)
    assert abs(float(scores_of(ranker, other_query, documents)[0] - base[0])) > 10 * TOLERANCE
    assert abs(float(scores_of(ranker, query, [documents[0], *other_documents[1:]])[0] - base[0])) > 10 * TOLERANCE


@pytest.mark.parametrize("delayed_layers", [0, 1])
def test_documents_of_one_length_are_told_apart_by_what_they_say(delayed_layers: int) -> None:
    """Separators that attended to every token of the list read one set of keys with one query each: in the plain
    Listformer (k = 0) every document of one length had the separator state, and so the score, of every other."""
    ranker = tiny_listformer(delayed_layers)
    query, documents = random_list(3, [5, 5, 5], seed=3)
    scores = scores_of(ranker, query, documents)  # (3,)
    assert min(abs(float(scores[i] - scores[j])) for i, j in ((0, 1), (0, 2), (1, 2))) > 10 * TOLERANCE


# ---------------------------------------------------------------------- the delayed split


@pytest.mark.parametrize("delayed_layers", [0, 1, 2])
def test_stored_document_states_give_the_scores_of_the_forward_in_one_go(delayed_layers) -> None:
    """Each document encoded alone and unpadded (as precompute stores it), then padded into a list online."""
    ranker = tiny_listformer(delayed_layers)
    query, documents = random_list(4, [3, 8, 1, 5], seed=3)
    want = scores_of(ranker, query, documents)
    with torch.no_grad():
        stored = [ranker.encode_documents(d[None], torch.ones(1, len(d), dtype=torch.long))[0] for d in documents]
        width = max(len(d) for d in documents)
        doc_states = torch.zeros(1, len(documents), width, ranker.hidden_size)
        doc_mask = torch.zeros(1, len(documents), width, dtype=torch.long)
        for j, states in enumerate(stored):
            doc_states[0, j, : len(states)], doc_mask[0, j, : len(states)] = states.half().float(), 1
        query_mask = torch.ones(1, len(query), dtype=torch.long)
        query_states = ranker.encode_queries(query[None], query_mask)
        got = ranker.score_lists(query_states, query_mask, doc_states, doc_mask)[0]
    assert float((got - want).abs().max()) < 1e-2, "fp16-rounded stored states stay close"
    with torch.no_grad():
        for j, states in enumerate(stored):
            doc_states[0, j, : len(states)] = states
        exact = ranker.score_lists(query_states, query_mask, doc_states, doc_mask)[0]
    assert float((exact - want).abs().max()) < TOLERANCE


def test_delayed_document_states_do_not_depend_on_the_query_or_the_list() -> None:
    ranker = tiny_listformer(2)
    _, documents = random_list(2, [5, 3])
    with torch.no_grad():
        alone = ranker.encode_documents(documents[0][None], torch.ones(1, len(documents[0]), dtype=torch.long))[0]
        _, _, doc_ids, doc_mask = padded_lists([(torch.tensor([2, 3]), documents)])
        in_batch = ranker.encode_documents(doc_ids[0], doc_mask[0])[0]
    assert float((alone - in_batch).abs().max()) < TOLERANCE


def test_delayed_layers_must_leave_a_list_layer() -> None:
    with pytest.raises(DilstoreError, match=r"delayed_layers \(k\) must be in 0..2"):
        ListformerRanker(tiny_config(3), tokenizer(), ListformerConfig(3))
    with pytest.raises(DilstoreError, match="non-negative integer"):
        ListformerConfig(-1)


# ---------------------------------------------------------------------- input checks


def test_bad_lists_are_refused_with_clear_errors() -> None:
    ranker = tiny_listformer(1)
    query, documents = random_list(2, [3, 2])
    query_ids, query_mask, doc_ids, doc_mask = padded_lists([(query, documents)])
    with torch.no_grad():
        query_states = ranker.encode_queries(query_ids, query_mask)
        doc_states = ranker.encode_documents(doc_ids[0], doc_mask[0])[None]
        with pytest.raises(DilstoreError, match="tokens first, then padding"):
            ranker.score_lists(query_states, query_mask, doc_states, doc_mask.flip(-1))
        empty = doc_mask.clone()
        empty[0, 1] = 0
        with pytest.raises(DilstoreError, match="at least one token"):
            ranker.score_lists(query_states, query_mask, doc_states, empty)
        with pytest.raises(DilstoreError, match="every query and every document needs at least one token"):
            ranker.score_lists(query_states, torch.zeros_like(query_mask), doc_states, doc_mask)  # a query of none
        with pytest.raises(DilstoreError, match="lists, documents, tokens"):
            ranker(query_ids, query_mask, doc_ids[0], doc_mask[0])
        with pytest.raises(DilstoreError, match="do not fit"):
            ranker.score_lists(query_states.expand(2, -1, -1), query_mask, doc_states, doc_mask)


# ---------------------------------------------------------------------- checkpoints


def test_checkpoint_round_trip_in_fp16_keeps_k_and_scores(tmp_path) -> None:
    ranker = tiny_listformer(1)
    ranker.save_pretrained(tmp_path / "ckpt")
    metadata = json.loads((tmp_path / "ckpt" / "dilstore.json").read_text())
    assert metadata == {
        "architecture": "bert", "format": 1, "kind": "listformer", "layers": 1, "num_layers": 3, "prior": False
    }
    from safetensors.torch import load_file

    assert {tensor.dtype for tensor in load_file(tmp_path / "ckpt" / "model.safetensors").values()} == {torch.float16}
    loaded = ListformerRanker.from_pretrained(tmp_path / "ckpt")
    assert loaded.delayed_layers == 1 and loaded.dtype == torch.float32
    query, documents = random_list(3, [4, 2])
    assert float((scores_of(loaded, query, documents) - scores_of(ranker, query, documents)).abs().max()) < 1e-2
    with pytest.raises(DilstoreError, match="not a 'earl' ranker|not an 'earl' ranker"):
        EarlRanker.from_pretrained(tmp_path / "ckpt")


def test_score_groups_tokenizes_like_the_store_and_scores_every_group(tiny_base) -> None:
    ranker = ListformerRanker.from_base(tiny_base, ListformerConfig(1))
    query = ranker.tokenize_query("who won", 8)
    document = ranker.tokenize_document("the broncos won the game in denver", 5)
    assert document[-1] == tokenizer().sep_token_id and len(document) == 5
    scores = ranker.score_groups([query, query], [[document, document[:3]], [document[:2], document]])
    assert scores.shape == (2, 2)
