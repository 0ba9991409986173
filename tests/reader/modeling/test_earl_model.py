"""EARL's model core: S1, S2 and the unsplit path agree, padding never matters, the paper's initialisation.

Tiny random BERT encoders (tests/fixtures/earl_tiny.py), fp32, tolerance 1e-4. The
reference network is written here with the plain Hugging Face modules of the
encoder the ranker was initialised from (BertModel, BertLayer, and a
BertCrossAttention holding a copy of each judging layer's self-attention).
"""

from __future__ import annotations

import copy
import itertools

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import BertModel, RobertaConfig
from transformers.models.bert.modeling_bert import BertAttention

from dilstore.reader.modeling.earl import ENCODER_PREFIXES, EarlConfig, EarlRanker
from dilstore.reader.modeling.prior import PRIOR_SCALE
from dilstore.reader.modeling.siamese import CosineBiEncoder
from dilstore.reader.training.losses import softmax_cross_entropy_loss
from dilstore.storage.errors import DilstoreError
from tests.fixtures.earl_tiny import CLS, SEP, Pairs, random_pairs, tiny_config, tiny_encoder, tiny_ranker, tokenizer

TOLERANCE = 1e-4
MIXED_LENGTHS = [(3, 9), (6, 4), (1, 14)]  # (query words, document words): every pair padded somewhere
VARIANTS = list(itertools.product(["cls", "mean"], [False, True], [False, True]))  # (pooling, tied, prior)
VARIANT_IDS = [
    f"{pooling}-{'tied' if tied else 'untied'}{'-prior' if prior else ''}" for pooling, tied, prior in VARIANTS
]


@pytest.fixture(scope="module")
def rankers() -> dict[tuple[str, bool, bool], EarlRanker]:
    """Every variant; the prior ones with a random head and scale 7, so judger and prior both count."""
    return {(pooling, tied, prior): tiny_ranker(pooling, tied, prior=prior) for pooling, tied, prior in VARIANTS}


def forward_scores(ranker: EarlRanker, pairs: Pairs) -> torch.Tensor:
    with torch.no_grad():
        return ranker(pairs.query_ids, pairs.query_mask, pairs.doc_ids, pairs.doc_mask)


def split_scores(ranker: EarlRanker, pairs: Pairs, strategy: str) -> torch.Tensor:
    """Scores through the offline/online split: judged from S1 states or from S2 key/values.

    S2 comes with the mean S1 vectors a store keeps, which a prior ranker needs.
    """
    with torch.no_grad():
        doc_states = ranker.encode_documents(pairs.doc_ids, pairs.doc_mask)  # (b, n, d)
        query_states = ranker.encode_queries(pairs.query_ids, pairs.query_mask)  # (b, nq, d)
        if strategy == "S1":
            return ranker.judge(query_states, pairs.query_mask, pairs.doc_mask, doc_states=doc_states)
        key_values = ranker.document_key_values(doc_states)  # (b, n, M, 2, d)
        vectors = ranker.document_vectors(doc_states, pairs.doc_mask) if ranker.prior else None  # (b, d)
        return ranker.judge(
            query_states, pairs.query_mask, pairs.doc_mask, doc_key_values=key_values, doc_vectors=vectors
        )


# ---------------------------------------------------------------------- S1, S2 and forward agree


@pytest.mark.parametrize(("pooling", "tied", "prior"), VARIANTS, ids=VARIANT_IDS)
def test_s1_and_s2_give_the_scores_of_forward_batched_and_one_at_a_time(pooling, tied, prior, rankers) -> None:
    ranker = rankers[pooling, tied, prior]
    pairs = random_pairs(MIXED_LENGTHS)
    expected = forward_scores(ranker, pairs)
    assert expected.shape == (3,)
    for strategy in ("S1", "S2"):
        difference = float((split_scores(ranker, pairs, strategy) - expected).abs().max())
        assert difference < TOLERANCE, f"{strategy}: max |split - forward| = {difference:.2e}"
    for row in range(len(MIXED_LENGTHS)):
        for strategy in ("S1", "S2"):
            alone = split_scores(ranker, pairs.example(row), strategy)
            assert abs(float(alone[0] - expected[row])) < TOLERANCE, f"{strategy} row {row} alone differs"


@pytest.mark.parametrize(("pooling", "tied", "prior"), VARIANTS, ids=VARIANT_IDS)
def test_groups_of_different_queries_score_each_document_against_its_own_query(pooling, tied, prior, rankers) -> None:
    """The training forward over (query, its documents) groups: with two different queries, each pair scores as it
    does alone. A query's prior vector tiled over the groups ([q0, q1, q0, q1]) where it belongs to each of its own
    documents ([q0, q0, q1, q1]) gave the other query's cosine to half the pairs."""
    ranker = rankers[pooling, tied, prior]
    pairs = random_pairs([(3, 9), (6, 4), (3, 14), (6, 7)], seed=3)
    queries = [pairs.query_ids[row, : int(pairs.query_mask[row].sum())].numpy() for row in (0, 1)]
    documents = [pairs.doc_ids[row, : int(pairs.doc_mask[row].sum())].numpy() for row in range(4)]
    groups = [documents[:2], documents[2:]]
    with torch.no_grad():
        grouped = ranker.score_groups(queries, groups)  # (2, 2)
        alone = torch.tensor([[float(ranker.score_groups([query], [[document]])[0, 0]) for document in group]
                              for query, group in zip(queries, groups, strict=True)])  # fmt: skip
    assert grouped.shape == (2, 2)
    difference = float((grouped - alone).abs().max())
    assert difference < TOLERANCE, f"max |grouped - alone| = {difference:.2e}"


def test_s2_has_one_key_and_value_per_judger_block(rankers) -> None:
    ranker = rankers["cls", False, False]
    pairs = random_pairs(MIXED_LENGTHS)
    with torch.no_grad():
        key_values = ranker.document_key_values(ranker.encode_documents(pairs.doc_ids, pairs.doc_mask))
    assert (ranker.query_layers, ranker.judger_blocks) == (1, 2)
    assert key_values.shape == (3, pairs.doc_ids.shape[1], 2, 2, 32)  # (b, n, M, 2, d)


@pytest.mark.parametrize(("pooling", "tied", "prior"), VARIANTS, ids=VARIANT_IDS)
def test_one_query_broadcasts_over_stored_documents_of_any_float_dtype(pooling, tied, prior, rankers) -> None:
    ranker = rankers[pooling, tied, prior]
    pairs = random_pairs([(4, 6), (4, 11), (4, 2)], seed=3)
    query = (pairs.query_ids[:1], pairs.query_mask[:1])
    with torch.no_grad():
        query_states = ranker.encode_queries(*query)  # (1, nq, d)
        doc_states = ranker.encode_documents(pairs.doc_ids, pairs.doc_mask)  # (3, n, d)
        key_values = ranker.document_key_values(doc_states)  # (3, n, M, 2, d)
        vectors = {"doc_vectors": ranker.document_vectors(doc_states, pairs.doc_mask)} if prior else {}  # (3, d)
        broadcast = ranker.judge(query_states, query[1], pairs.doc_mask, doc_key_values=key_values, **vectors)
        half = ranker.judge(query_states, query[1], pairs.doc_mask, doc_key_values=key_values.half(), **vectors)
        half_as_float = ranker.judge(
            query_states, query[1], pairs.doc_mask, doc_key_values=key_values.half().float(), **vectors
        )
        bf16_states = ranker.judge(query_states.bfloat16(), query[1], pairs.doc_mask, doc_states=doc_states.bfloat16())
    expanded = Pairs(query[0].expand(3, -1), query[1].expand(3, -1), pairs.doc_ids, pairs.doc_mask)
    assert torch.allclose(broadcast, forward_scores(ranker, expanded), atol=TOLERANCE, rtol=0)
    assert half.dtype == bf16_states.dtype == torch.float32
    assert torch.equal(half, half_as_float)
    assert torch.allclose(bf16_states, broadcast, atol=0.1, rtol=0)


# ---------------------------------------------------------------------- padding never matters


@settings(max_examples=25, deadline=None)
@given(
    lengths=st.lists(st.tuples(st.integers(1, 8), st.integers(1, 16)), min_size=1, max_size=3),
    query_extra=st.integers(0, 5),
    doc_extra=st.integers(0, 9),
    variant=st.sampled_from(VARIANTS),
    seed=st.integers(0, 2**16),
)
def test_padding_documents_or_queries_never_changes_scores(
    lengths: list[tuple[int, int]],
    query_extra: int,
    doc_extra: int,
    variant: tuple[str, bool, bool],
    seed: int,
    rankers,
) -> None:
    """Extra padding columns (holding a real word id, masked out) leave every score as the pair alone gives it."""
    ranker = rankers[variant]
    pairs = random_pairs(lengths, seed=seed, pad_id=7)
    padded = pairs.padded(query_extra, doc_extra, pad_id=9)
    for strategy in ("S1", "S2"):
        scores = split_scores(ranker, padded, strategy)
        assert torch.allclose(scores, forward_scores(ranker, pairs), atol=TOLERANCE, rtol=0)
        for row in range(len(lengths)):
            alone = forward_scores(ranker, pairs.example(row))
            assert abs(float(scores[row] - alone[0])) < TOLERANCE, f"{variant} {strategy} row {row}"


def test_the_document_and_the_query_change_the_score(rankers) -> None:
    """Guards the tests above: a judge that ignored either side would pass them trivially."""
    ranker = rankers["mean", False, False]
    pairs = random_pairs([(5, 10)], seed=4)
    other_doc = Pairs(pairs.query_ids, pairs.query_mask, pairs.doc_ids.roll(1, dims=1), pairs.doc_mask)
    other_query = Pairs(pairs.query_ids.roll(1, dims=1), pairs.query_mask, pairs.doc_ids, pairs.doc_mask)
    score = forward_scores(ranker, pairs)
    assert abs(float(forward_scores(ranker, other_doc) - score)) > 100 * TOLERANCE
    assert abs(float(forward_scores(ranker, other_query) - score)) > 100 * TOLERANCE


# ---------------------------------------------------------------------- references and initialisation


def additive_mask(key_mask: torch.Tensor, queries: int) -> torch.Tensor:
    """(b, keys) 1/0 → additive (b, 1, queries, keys): 0 for real keys, the fp32 minimum for padding."""
    blocked = ~key_mask.bool()[:, None, None, :].expand(-1, -1, queries, -1)  # (b, 1, queries, keys)
    return torch.zeros(blocked.shape).masked_fill(blocked, torch.finfo(torch.float32).min)


def reference_scores(encoder: BertModel, head: torch.nn.Linear, pairs: Pairs, query_layers: int, pooling: str):
    """The paper's network at initialisation, written with the plain Hugging Face modules (eager attention).

    Documents: the whole encoder. Queries: its hidden states after layer N.
    Each remaining layer judges: a BertCrossAttention holding a copy of the
    layer's self-attention weights (query → document), then the layer's own
    self-attention and feed-forward. Then pooling and the ranker's head.
    """
    config = copy.deepcopy(encoder.config)
    config._attn_implementation = "eager"
    with torch.no_grad():
        documents = encoder(input_ids=pairs.doc_ids, attention_mask=pairs.doc_mask).last_hidden_state  # (b, n, d)
        hidden = encoder(
            input_ids=pairs.query_ids, attention_mask=pairs.query_mask, output_hidden_states=True
        ).hidden_states[query_layers]  # (b, nq, d)
        nq = hidden.shape[1]
        for layer in encoder.encoder.layer[query_layers:]:
            cross = BertAttention(config, is_cross_attention=True).eval()
            cross.load_state_dict(layer.attention.state_dict())
            hidden = cross(
                hidden, encoder_hidden_states=documents, encoder_attention_mask=additive_mask(pairs.doc_mask, nq)
            )[0]  # (b, nq, d)
            hidden = layer.attention(hidden, additive_mask(pairs.query_mask, nq))[0]  # (b, nq, d)
            hidden = layer.output(layer.intermediate(hidden), hidden)  # (b, nq, d)
        if pooling == "cls":
            pooled = hidden[:, 0]  # (b, d)
        else:
            valid = pairs.query_mask.unsqueeze(-1).float()  # (b, nq, 1)
            pooled = (hidden * valid).sum(1) / valid.sum(1)  # (b, d)
        return head(pooled).squeeze(-1)  # (b,)


@pytest.mark.parametrize(
    ("pooling", "tied"), [variant[:2] for variant in VARIANTS if not variant[2]],
    ids=[name for name, variant in zip(VARIANT_IDS, VARIANTS) if not variant[2]],
)  # fmt: skip
@pytest.mark.parametrize("query_layers", [0, 1, 2])
def test_split_scores_equal_the_reference_network_at_init(pooling: str, tied: bool, query_layers: int) -> None:
    encoder = tiny_encoder(seed=6)
    ranker = EarlRanker.from_encoder(encoder, tokenizer(), EarlConfig(query_layers, pooling, tied))
    pairs = random_pairs(MIXED_LENGTHS, seed=6, pad_id=7)
    expected = reference_scores(encoder, ranker.score, pairs, query_layers, pooling)
    for strategy in ("S1", "S2"):
        difference = float((split_scores(ranker, pairs, strategy) - expected).abs().max())
        assert difference < TOLERANCE, f"{strategy}: max |split - reference| = {difference:.2e}"


@pytest.mark.parametrize("tied", [False, True])
def test_document_module_equals_the_plain_hugging_face_bert_model(tied: bool) -> None:
    encoder = tiny_encoder()
    ranker = EarlRanker.from_encoder(encoder, tokenizer(), EarlConfig(tied=tied))
    pairs = random_pairs(MIXED_LENGTHS, seed=1, pad_id=7)
    with torch.no_grad():
        states = ranker.encode_documents(pairs.doc_ids, pairs.doc_mask)  # (b, n, d)
        reference = encoder(input_ids=pairs.doc_ids, attention_mask=pairs.doc_mask).last_hidden_state
    valid = pairs.doc_mask.bool()
    assert float((states - reference).abs()[valid].max()) < TOLERANCE


def test_query_module_equals_the_first_n_layers_of_the_plain_model() -> None:
    """The untied query module at init is copy 2's embeddings and layers 1..N: HF's hidden_states[N]."""
    encoder = tiny_encoder()
    ranker = EarlRanker.from_encoder(encoder, tokenizer(), EarlConfig(query_layers=2))
    pairs = random_pairs(MIXED_LENGTHS, seed=2)
    with torch.no_grad():
        states = ranker.encode_queries(pairs.query_ids, pairs.query_mask)  # (b, nq, d)
        output = encoder(input_ids=pairs.query_ids, attention_mask=pairs.query_mask, output_hidden_states=True)
    valid = pairs.query_mask.bool()
    assert float((states - output.hidden_states[2]).abs()[valid].max()) < TOLERANCE


def attention_weights(attention) -> list[torch.Tensor]:
    """A JudgerAttention's weights in the order of BERT's query, key, value, output dense, LayerNorm."""
    modules = [attention.query, attention.key, attention.value, attention.output, attention.layer_norm]
    return [tensor for module in modules for tensor in (module.weight, module.bias)]


def bert_attention_weights(attention) -> list[torch.Tensor]:
    modules = [attention.self.query, attention.self.key, attention.self.value]
    modules += [attention.output.dense, attention.output.LayerNorm]
    return [tensor for module in modules for tensor in (module.weight, module.bias)]


def test_cross_attention_starts_as_a_separate_copy_of_the_source_self_attention() -> None:
    encoder = tiny_encoder()
    ranker = EarlRanker.from_encoder(encoder, tokenizer())
    for index, block in enumerate(ranker.blocks):
        source = bert_attention_weights(encoder.encoder.layer[ranker.query_layers + index].attention)
        cross, own = attention_weights(block.cross_attention), attention_weights(block.self_attention)
        assert all(torch.equal(c, s) and torch.equal(o, s) for c, o, s in zip(cross, own, source))
        cross_pointers = {tensor.data_ptr() for tensor in cross}
        assert not cross_pointers & ({tensor.data_ptr() for tensor in own} | {tensor.data_ptr() for tensor in source})
    block = ranker.blocks[0]
    before = block.self_attention.query.weight.clone()
    with torch.no_grad():
        block.cross_attention.query.weight.add_(1.0)
    assert torch.equal(block.self_attention.query.weight, before), "self-attention moved with cross-attention"
    assert torch.equal(encoder.encoder.layer[ranker.query_layers].attention.self.query.weight, before)


def test_modules_are_copies_of_the_encoder_in_the_papers_split() -> None:
    encoder = tiny_encoder()
    ranker = EarlRanker.from_encoder(encoder, tokenizer(), EarlConfig(query_layers=2))
    source = encoder.state_dict()
    assert all(torch.equal(tensor, source[name]) for name, tensor in ranker.document_encoder.state_dict().items())
    query_state = ranker.query_encoder.state_dict()
    assert len(ranker.query_encoder.encoder.layer) == 2
    assert all(torch.equal(tensor, source[name]) for name, tensor in query_state.items())
    document_pointers = {p.data_ptr() for p in ranker.document_encoder.parameters()}
    assert not document_pointers & {p.data_ptr() for p in ranker.query_encoder.parameters()}
    assert not document_pointers & {p.data_ptr() for p in encoder.parameters()}


def parameter_count(module: torch.nn.Module) -> int:
    return sum(parameter.numel() for parameter in module.parameters())


def test_tied_query_module_is_the_document_modules_first_layers() -> None:
    untied = tiny_ranker(tied=False, query_layers=2)
    tied = tiny_ranker(tied=True, query_layers=2)
    assert tied.query_encoder is None and tied.query_module is tied.document_encoder
    for index in range(2):
        shared, document = tied.query_module.encoder.layer[index], tied.document_encoder.encoder.layer[index]
        assert all(q is d for q, d in zip(shared.parameters(), document.parameters()))
    assert parameter_count(untied) - parameter_count(tied) == parameter_count(untied.query_encoder) > 0

    pairs = random_pairs(MIXED_LENGTHS, seed=5)
    for ranker, follows in ((tied, True), (untied, False)):
        with torch.no_grad():
            before = ranker.encode_queries(pairs.query_ids, pairs.query_mask)
            ranker.document_encoder.encoder.layer[0].output.dense.bias.add_(0.5)
            after = ranker.encode_queries(pairs.query_ids, pairs.query_mask)
        assert (not torch.equal(before, after)) == follows, f"tied={ranker.tied}"


def test_score_head_is_seeded_and_loading_leaves_the_callers_random_stream_alone() -> None:
    torch.manual_seed(123)
    expected_next = torch.rand(1)
    encoder = tiny_encoder(seed=4)
    torch.manual_seed(123)
    first = EarlRanker.from_encoder(encoder, tokenizer())
    after = torch.rand(1)
    second = EarlRanker.from_encoder(encoder, tokenizer(), EarlConfig(tied=True))
    assert torch.equal(first.score.weight, second.score.weight) and bool(first.score.weight.ne(0).any())
    assert torch.equal(after, expected_next)


# ---------------------------------------------------------------------- the bi-encoder prior


def sentence_embeddings(encoder: BertModel, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """sentence-transformers' mean pooling over the plain model's last states (b, d), [CLS] and [SEP] included."""
    with torch.no_grad():
        hidden = encoder(input_ids=ids, attention_mask=mask).last_hidden_state  # (b, n, d)
    weights = mask.unsqueeze(-1).float()  # (b, n, 1)
    return (hidden * weights).sum(1) / weights.sum(1).clamp(min=1e-9)  # (b, d)


@pytest.mark.parametrize("tied", [False, True])
@pytest.mark.parametrize("query_layers", [0, 1, 2])
def test_untrained_prior_ranker_scores_as_the_cosine_bi_encoder_times_20(tied: bool, query_layers: int) -> None:
    """The head starts at zero and the scale at 20: scores are exactly 20 × CosineBiEncoder's, same ranking."""
    encoder = tiny_encoder(seed=8)
    ranker = EarlRanker.from_encoder(encoder, tokenizer(), EarlConfig(query_layers, "cls", tied, prior=True))
    bi_encoder = CosineBiEncoder.from_encoder(encoder, tokenizer())
    assert ranker.prior_scale.item() == PRIOR_SCALE == 20.0
    assert not ranker.score.weight.any() and not ranker.score.bias.any()
    pairs = random_pairs([(3, 9), (3, 4), (3, 14), (3, 1), (3, 7)], seed=8, pad_id=7)
    query = pairs.query_ids[0].numpy()
    documents = [pairs.doc_ids[row, : int(pairs.doc_mask[row].sum())].numpy() for row in range(5)]
    with torch.no_grad():
        earl = ranker.score_groups([query], [documents])[0]  # (5,)
        cosine = bi_encoder.score_groups([query], [documents])[0]  # (5,)
    torch.testing.assert_close(earl, PRIOR_SCALE * cosine, atol=1e-4, rtol=0)
    assert earl.argsort().tolist() == cosine.argsort().tolist()
    assert float(cosine.max() - cosine.min()) > 0.01, "the documents must be told apart for the ranking to mean much"


@pytest.mark.parametrize("tied", [False, True])
def test_prior_vectors_are_the_base_models_sentence_embeddings(tied: bool) -> None:
    """The query's states after layer N continue through the document module; both sides are mean-pooled."""
    encoder = tiny_encoder(seed=9)
    ranker = EarlRanker.from_encoder(encoder, tokenizer(), EarlConfig(query_layers=1, tied=tied, prior=True))
    pairs = random_pairs(MIXED_LENGTHS, seed=9, pad_id=7)
    with torch.no_grad():
        query_states = ranker.encode_queries(pairs.query_ids, pairs.query_mask)  # (b, nq, d)
        queries = ranker.query_vectors(query_states, pairs.query_mask)  # (b, d)
        documents = ranker.document_vectors(ranker.encode_documents(pairs.doc_ids, pairs.doc_mask), pairs.doc_mask)
    expected_queries = sentence_embeddings(encoder, pairs.query_ids, pairs.query_mask)
    torch.testing.assert_close(queries, expected_queries, atol=TOLERANCE, rtol=0)
    torch.testing.assert_close(documents, sentence_embeddings(encoder, pairs.doc_ids, pairs.doc_mask),
                               atol=TOLERANCE, rtol=0)  # fmt: skip
    assert documents.dtype == torch.float32


def test_the_prior_needs_document_vectors_to_judge_s2_and_only_a_prior_ranker_takes_them(rankers) -> None:
    pairs = random_pairs(MIXED_LENGTHS)
    for prior in (True, False):
        ranker = rankers["cls", True, prior]
        with torch.no_grad():
            query_states = ranker.encode_queries(pairs.query_ids, pairs.query_mask)
            doc_states = ranker.encode_documents(pairs.doc_ids, pairs.doc_mask)
            key_values = ranker.document_key_values(doc_states)
            vectors = ranker.document_vectors(doc_states, pairs.doc_mask)
            arguments = (query_states, pairs.query_mask, pairs.doc_mask)
            if prior:
                with pytest.raises(DilstoreError, match="judging S2 needs doc_vectors"):
                    ranker.judge(*arguments, doc_key_values=key_values)
                with_vectors = ranker.judge(*arguments, doc_key_values=key_values, doc_vectors=vectors)
                without_prior = ranker.judge(*arguments, doc_key_values=key_values, doc_vectors=vectors * 0 + 1)
                assert not torch.allclose(with_vectors, without_prior, atol=100 * TOLERANCE), "vectors must count"
            else:
                with pytest.raises(DilstoreError, match="has no prior"):
                    ranker.judge(*arguments, doc_key_values=key_values, doc_vectors=vectors)


def test_a_frozen_encoder_takes_no_gradient_and_no_dropout(tmp_path) -> None:
    """Training a frozen prior ranker moves the judger, head and scale only; the prior stays the base cosine."""
    ranker = tiny_ranker(tied=False, prior=True)
    before = {name: tensor.clone() for name, tensor in ranker.state_dict().items()}
    reference = ranker.freeze_encoder(tmp_path)
    assert reference.model == str(tmp_path.resolve()) and len(reference.weights_sha256) == 64
    rounded = {name: tensor for name, tensor in ranker.state_dict().items() if name.startswith(ENCODER_PREFIXES)}
    assert all(torch.equal(tensor, before[name].half().float()) for name, tensor in rounded.items())
    ranker.train()
    assert not ranker.document_encoder.training and not ranker.query_encoder.training and ranker.blocks.training
    pairs = random_pairs(MIXED_LENGTHS, seed=2)
    scores = ranker(pairs.query_ids, pairs.query_mask, pairs.doc_ids, pairs.doc_mask)
    softmax_cross_entropy_loss(scores[None]).backward()
    trained = {name for name, parameter in ranker.named_parameters() if parameter.grad is not None}
    assert trained and not [name for name in trained if name.startswith(ENCODER_PREFIXES)]
    assert {"prior_scale", "score.weight"} <= trained
    ranker.eval()


# ---------------------------------------------------------------------- hyperparameters and bad inputs


def test_defaults_follow_the_paper() -> None:
    ranker = EarlRanker(tiny_config(6), tokenizer())
    assert (ranker.query_layers, ranker.judger_blocks, ranker.pooling, ranker.tied) == (4, 2, "cls", False)


@pytest.mark.parametrize("query_layers", [-1, 3, 1.0, True])
def test_query_layers_must_leave_a_judger_block(query_layers) -> None:
    with pytest.raises(DilstoreError, match=r"query_layers \(N\) must be an integer in 0\.\.2"):
        EarlRanker(tiny_config(), tokenizer(), EarlConfig(query_layers=query_layers))


def test_bad_pooling_tying_and_architecture_are_refused() -> None:
    with pytest.raises(DilstoreError, match="pooling must be one of cls, mean, got 'max'"):
        EarlConfig(pooling="max")
    with pytest.raises(DilstoreError, match="tied must be True or False"):
        EarlConfig(tied="yes")
    with pytest.raises(DilstoreError, match="prior must be True or False"):
        EarlConfig(prior=1)
    roberta = RobertaConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64)
    with pytest.raises(DilstoreError, match="'roberta' is not supported by the EARL ranker; supported: bert"):
        EarlRanker(roberta, tokenizer())


def test_judge_needs_exactly_one_well_shaped_document_input(rankers) -> None:
    ranker = rankers["cls", False, False]
    pairs = random_pairs(MIXED_LENGTHS)
    with torch.no_grad():
        query_states = ranker.encode_queries(pairs.query_ids, pairs.query_mask)
        doc_states = ranker.encode_documents(pairs.doc_ids, pairs.doc_mask)
        key_values = ranker.document_key_values(doc_states)
    arguments = (query_states, pairs.query_mask, pairs.doc_mask)
    with pytest.raises(DilstoreError, match="exactly one of doc_states"):
        ranker.judge(*arguments)
    with pytest.raises(DilstoreError, match="exactly one of doc_states"):
        ranker.judge(*arguments, doc_states=doc_states, doc_key_values=key_values)
    with pytest.raises(DilstoreError, match=r"doc_key_values must be \(b, n, 2, 2, 32\)"):
        ranker.judge(*arguments, doc_key_values=key_values[:, :, :1])
    with pytest.raises(DilstoreError, match="2 queries cannot be judged against 3 documents"):
        ranker.judge(query_states[:2], pairs.query_mask[:2], pairs.doc_mask, doc_states=doc_states)
    too_long = torch.full((1, 65), 9)
    with pytest.raises(DilstoreError, match="longer than this model's 64 positions"):
        ranker.encode_documents(too_long, torch.ones_like(too_long))


# ---------------------------------------------------------------------- tokenization and training


def test_tokenize_wraps_queries_and_documents_in_cls_and_sep() -> None:
    ranker = tiny_ranker()
    vocab = ranker.tokenizer
    ids, mask = ranker.tokenize_documents(["a short passage", "a much longer passage " * 20], max_length=12)
    assert ids.shape == mask.shape == (2, 12)
    assert ids[0].tolist()[: int(mask[0].sum())] == vocab("a short passage")["input_ids"]
    assert int(mask[0].sum()) == 5 and ids[0, 5:].eq(vocab.pad_token_id).all()
    assert ids[1, 0] == vocab.cls_token_id and ids[1, -1] == vocab.sep_token_id and bool(mask[1].all())
    query_ids, query_mask = ranker.tokenize_queries(["what is dilstore?"], max_length=32)
    assert query_ids[0].tolist() == vocab("what is dilstore?")["input_ids"] and bool(query_mask.all())
    with pytest.raises(DilstoreError, match="the document is empty"):
        ranker.tokenize_documents(["  "], max_length=12)
    with pytest.raises(DilstoreError, match="list of texts is empty"):
        ranker.tokenize_queries([], max_length=12)


def test_a_few_steps_of_training_separate_the_positive_from_the_negatives() -> None:
    """One query, its positive (sharing the query's words) and three random negatives: the loss falls."""
    ranker = tiny_ranker(pooling="mean").train()
    generator = torch.Generator().manual_seed(0)
    words = torch.randint(5, 100, (6,), generator=generator)
    query = torch.cat([torch.tensor([CLS]), words[:4], torch.tensor([SEP])])[None]  # (1, nq)
    documents = torch.randint(5, 100, (4, 8), generator=generator)  # (1 + n, words): positive first
    documents[0, :6] = words
    doc_ids = torch.cat([torch.full((4, 1), CLS), documents, torch.full((4, 1), SEP)], dim=1)  # (1 + n, n_tokens)
    masks = (torch.ones_like(query), torch.ones_like(doc_ids))
    optimizer = torch.optim.AdamW(ranker.parameters(), lr=1e-3)
    losses = []
    for _ in range(15):
        scores = ranker(query.expand(4, -1), masks[0].expand(4, -1), doc_ids, masks[1])  # (1 + n,)
        loss = softmax_cross_entropy_loss(scores[None])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    ranker.eval()
    with torch.no_grad():
        final = ranker(query.expand(4, -1), masks[0].expand(4, -1), doc_ids, masks[1])
    assert losses[-1] < 0.5 * losses[0], losses
    assert int(final.argmax()) == 0
