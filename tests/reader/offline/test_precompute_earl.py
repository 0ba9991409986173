"""`dilstore precompute --kind earl-s1|earl-s2`: EARL document states through the store, scored as the ranker does.

A tiny random EARL ranker (tests/fixtures/earl_tiny.py's config, widened to the real
MiniLM vocabulary so that real text tokenizes) is saved as a checkpoint. The
pure functions must store exactly `encode_documents` (S1) and
`document_key_values` (S2), whatever the batching; a whole DirectRunner run
must give stores from which `EarlRanker.judge` scores every stored document
as `EarlRanker.forward` does on the same text; 2bit and 1bit stores of both
kinds must rerank close to the fp16 store; the kind/model checks must
fail before any work with one line; and long documents must become
`[CLS] … [SEP]` windows that lose no word piece.
"""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from dilstore.pipelines.passages import Passage
from dilstore.reader.batching import BatchPolicy
from dilstore.reader.modeling.dilbert import DilBertReader
from dilstore.reader.modeling.earl import EarlConfig, EarlRanker
from dilstore.reader.modeling.fingerprint import model_fingerprint
from dilstore.reader.offline.encoding import (
    encode_tokenized,
    load_checked_reader,
    load_reader,
    resolve_model_dir,
    tokenize_passage,
    window_id,
)
from dilstore.reader.offline.kinds import load_offline_model, max_positions
from dilstore.reader.offline.model_refs import DEFAULT_RANKER_REF
from dilstore.reader.packaged.shipped import DEFAULT_RANKER_NAME
from dilstore.reader.serving.rerank import open_reranker
from dilstore.reader.text.tokenization import encode_document, passage_pieces, window_starts
from dilstore.runners import cli
from dilstore.runners.cmd_precompute import build_job
from dilstore.storage.codebook import CODEBOOK_DIR, read_codebook
from dilstore.storage.errors import DilstoreError
from dilstore.storage.fingerprint import FingerprintMismatchError
from dilstore.storage.reader import open_store
from dilstore.storage.verify import verify_store
from tests.fixtures.earl_tiny import save_base_encoder, text_encoder, tokenizer
from tests.fixtures.pipeline_fixtures import save_tiny_reader, store_contents, wiki_like_documents, write_jsonl

MAX_LENGTH = 48  # the tiny config embeds 64 positions
QUERY_LENGTH = 16
SHARDS = 2
FP32_TOLERANCE = 1e-4
# fp16 keeps 11 significant bits (relative error up to 4.9e-4 per stored value); on this ranker it
# moves the scores by at most 1.6e-5 (S2; S1 1.3e-5), so 5e-4 leaves a 30x margin while staying far
# below the 0.045 spread of the scores.
FP16_TOLERANCE = 5e-4
# 2bit / 1bit stores against the fp16 store, as (state bound, score bound). States: squared error over
# the states' centred energy, near the optimal 4-/2-level Gaussian quantizers' 0.118 / 0.363 (measured
# S1 0.125 / 0.350; S2 keys and values each 0.12 / 0.34). Scores: max |rerank score − fp16 store's|;
# this random ranker's wide weights (earl_tiny.INIT) make its scores sensitive to the states, and the
# codebook is trained on this corpus's 229 tokens: measured 0.027 / 0.026 (S1), 0.019 / 0.024 (S2),
# where the scores spread over 0.045.
LOWBIT_BOUNDS = {"2bit": (0.16, 0.04), "1bit": (0.40, 0.04)}
TEXT = (
    "The Normans were the people who in the 10th and 11th centuries gave their name to Normandy, "
    "a region in France. They were descended from Norse raiders and pirates from Denmark, Iceland "
    "and Norway who, under their leader Rollo, agreed to swear fealty to King Charles III."
)
QUERY = "when was the railway station of the river city built"


@pytest.fixture(scope="module")
def earl_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A saved EARL checkpoint: N = 1 query layer, M = 2 judger blocks, CLS pooling, untied."""
    ranker = EarlRanker.from_encoder(text_encoder(), tokenizer())
    return ranker.save_pretrained(tmp_path_factory.mktemp("earl"))


@pytest.fixture(scope="module")
def base_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A plain encoder directory (config, weights, tokenizer; no dilstore.json)."""
    return save_base_encoder(tmp_path_factory.mktemp("base"), text_encoder(seed=1))


@pytest.fixture(scope="module")
def dilbert_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_reader(tmp_path_factory.mktemp("dilbert"))


@pytest.fixture(scope="module")
def ranker(earl_dir: Path) -> EarlRanker:
    return load_reader(str(earl_dir), "earl-s1", None)


def passage(text: str = TEXT, number: int = 0) -> Passage:
    return Passage(id=f"normans#{number}", doc_id="normans", title="Normans", text=text)


def offline_states(ranker: EarlRanker, kind: str, token_ids: np.ndarray) -> np.ndarray:
    """One document alone, unpadded: S1 (n, d) or S2 (n, M, 2, d) straight from the ranker."""
    ids = torch.from_numpy(token_ids.astype(np.int64))[None]  # (1, n)
    with torch.inference_mode():
        states = ranker.encode_documents(ids, torch.ones_like(ids))  # (1, n, d)
        if kind == "earl-s2":
            states = ranker.document_key_values(states)  # (1, n, M, 2, d)
    return states[0].numpy()


# ---------------------------------------------------------------------- tokenization: `[CLS] d [SEP]` windows


def test_a_short_document_is_one_unit_with_the_rankers_own_tokens(ranker: EarlRanker) -> None:
    [piece] = tokenize_passage(ranker.tokenizer, passage(), max_length=MAX_LENGTH * 2, kind="earl-s1")
    assert (piece.id, piece.text) == ("normans#0", TEXT)
    ids, mask = ranker.tokenize_documents([TEXT], MAX_LENGTH * 2)  # (1, n)
    assert piece.tokens.token_ids.tolist() == ids[0].tolist() and bool(mask.all())
    assert piece.tokens.token_ids[0] == ranker.tokenizer.cls_token_id
    assert piece.tokens.token_ids[-1] == ranker.tokenizer.sep_token_id
    assert [tuple(span) for span in piece.tokens.char_spans[[0, -1]]] == [(-1, -1), (-1, -1)]


@pytest.mark.parametrize("max_length", [3, 8, 17, 40])
def test_a_long_document_becomes_cls_sep_windows_that_lose_nothing(ranker: EarlRanker, max_length: int) -> None:
    vocab = ranker.tokenizer
    pieces = tokenize_passage(vocab, passage(), max_length=max_length, kind="earl-s2")
    everything = passage_pieces(vocab, TEXT)  # every word piece of the document, spans into TEXT
    starts = window_starts(len(everything), max_length - 2)
    assert len(pieces) == len(starts) > 1
    assert [piece.id for piece in pieces] == [window_id("normans#0", number) for number in range(len(pieces))]
    covered = np.zeros(len(everything), dtype=bool)
    for piece, start in zip(pieces, starts, strict=True):
        ids, spans = piece.tokens.token_ids, piece.tokens.char_spans
        assert piece.length <= max_length
        assert ids[0] == vocab.cls_token_id and ids[-1] == vocab.sep_token_id
        assert not np.isin(ids[1:-1], vocab.all_special_ids).any(), "one [CLS] and one [SEP] per window"
        stop = start + len(ids) - 2
        np.testing.assert_array_equal(ids[1:-1], everything.token_ids[start:stop])
        covered[start:stop] = True
        offset = int(everything.char_spans[start, 0])
        assert piece.text == TEXT[offset : int(everything.char_spans[stop - 1, 1])]
        np.testing.assert_array_equal(spans[1:-1] + offset, everything.char_spans[start:stop])
        assert spans[1:-1].min() == 0 and spans[1:-1].max() == len(piece.text)
    assert covered.all(), "every word piece is in some window"
    first = encode_document(vocab, TEXT, max_length)
    assert first.truncated and pieces[0].tokens.token_ids.tolist() == first.token_ids.tolist(), (
        "window 0 is exactly the ranker's truncated (FirstP) document"
    )


def test_a_document_window_needs_room_for_cls_a_piece_and_sep(ranker: EarlRanker) -> None:
    with pytest.raises(DilstoreError, match="at least 3"):
        tokenize_passage(ranker.tokenizer, passage(), max_length=2, kind="earl-s1")
    with pytest.raises(DilstoreError, match="no word pieces"):
        tokenize_passage(ranker.tokenizer, passage(text="\u200b\u200b"), max_length=MAX_LENGTH, kind="earl-s1")


# ---------------------------------------------------------------------- the offline half: S1 and S2 records


@pytest.mark.parametrize("kind", ["earl-s1", "earl-s2"])
def test_stored_states_are_the_rankers_offline_half_whatever_the_batching(ranker: EarlRanker, kind: str) -> None:
    texts = [TEXT[: 20 + 37 * number] for number in range(7)]
    pieces = [
        piece
        for number, text in enumerate(texts)
        for piece in tokenize_passage(ranker.tokenizer, passage(text, number), MAX_LENGTH, kind)
    ]
    calls: list[int] = []
    records = encode_tokenized(ranker, kind, pieces, BatchPolicy(batch_tokens=100, max_batch_size=3), calls.append)
    assert len(calls) > 1 and calls[-1] == len(pieces), "several padded, mixed-length batches"
    per_token = (ranker.hidden_size,) if kind == "earl-s1" else (ranker.judger_blocks, 2, ranker.hidden_size)
    for piece, record in zip(pieces, records, strict=True):
        assert record.id == piece.id and record.states.dtype == np.float32
        assert record.states.shape == (piece.length, *per_token)
        alone = offline_states(ranker, kind, piece.tokens.token_ids)
        assert np.abs(record.states - alone).max() < 1e-5
        np.testing.assert_array_equal(record.token_ids, piece.tokens.token_ids)


# ---------------------------------------------------------------------- loading: which model makes which kind


def test_an_earl_checkpoint_loads_and_is_checked_against_the_run_fingerprint(earl_dir: Path) -> None:
    first = load_reader(str(earl_dir), "earl-s2", None)
    assert isinstance(first, EarlRanker) and first.query_layers == 1 and first.judger_blocks == 2
    fingerprint = model_fingerprint(first, "earl-s2", "fp16", MAX_LENGTH)
    assert (fingerprint.kind, fingerprint.layers) == ("earl-s2", 1)
    checked = load_checked_reader(str(earl_dir), 1, fingerprint)
    assert model_fingerprint(checked, "earl-s2", "fp16", MAX_LENGTH) == fingerprint
    saved = EarlRanker.from_pretrained(earl_dir)
    assert model_fingerprint(saved, "earl-s2", "fp16", MAX_LENGTH) == fingerprint
    other = replace(fingerprint, weights_sha256="0" * 64)
    with pytest.raises(DilstoreError, match="does not match the fingerprint"):
        load_checked_reader(str(earl_dir), 1, other)


def test_a_plain_encoder_starts_an_untrained_ranker_with_n_from_layers(base_dir: Path) -> None:
    default = load_offline_model(base_dir, "earl-s1", None)
    assert isinstance(default, EarlRanker)
    assert (default.query_layers, default.pooling, default.tied) == (1, "cls", False), "N = l - 2, cls, untied"
    assert load_offline_model(base_dir, "earl-s2", 0).query_layers == 0
    assert max_positions(default) == 64


def test_a_roberta_segment_has_two_positions_fewer() -> None:
    """RoBERTa's segments start at position pad_token_id + 1: a 66-position model holds 64 tokens, and a limit of 65
    or 66 passed the check that the first such question then failed."""
    from tests.fixtures.dilbert_tiny import tiny_model
    from tests.fixtures.tokenizer_fixtures import minilm_tokenizer

    assert max_positions(DilBertReader(tiny_model("roberta"), minilm_tokenizer(), layers=1)) == 64  # 66 embedded
    assert max_positions(DilBertReader(tiny_model("bert"), minilm_tokenizer(), layers=1)) == 64


def test_a_listformer_with_the_prior_stores_one_token_fewer_than_its_positions() -> None:
    """A prior Listformer's encoder reads each stored `d [SEP]` behind a [CLS] (document_vectors), so a passage holds
    one token fewer than the positions (spec61 F7: `precompute --kind listformer --max-length 64` with a 64-position
    model passed the up-front check, then stopped mid-run at the first long passage: "a text of 65 tokens is
    longer than this model's 64 positions")."""
    from tests.fixtures.listformer_tiny import tiny_listformer

    positions = max_positions(tiny_listformer(delayed_layers=1))  # the tiny encoder's segment positions
    assert max_positions(tiny_listformer(delayed_layers=1, prior=True)) == positions - 1
    from dilstore.reader.offline.kinds import positions_note
    assert "the [CLS]" in positions_note(tiny_listformer(delayed_layers=1, prior=True))
    assert positions_note(tiny_listformer(delayed_layers=1)) == ""


def test_an_append_to_a_prior_listformer_store_of_all_the_segment_s_positions_is_taken() -> None:
    """(read61 F2) A prior Listformer's store built with --max-length of all its segment's positions, before spec61 F7
    (one of short passages: MS MARCO's under the packaged Listformer's 512), took no append at all, "--max-length 64
    exceeds the model's 63 positions": an append must give the store's own --max-length. An append is held to the
    segment, as its store was; a new store still to one fewer."""
    from dilstore.runners.cmd_precompute import check_max_length
    from tests.fixtures.listformer_tiny import tiny_listformer

    prior = tiny_listformer(delayed_layers=1, prior=True)
    segment = max_positions(prior) + 1
    check_max_length(segment, prior, append=True)
    with pytest.raises(DilstoreError, match=f"^--max-length {segment} exceeds the model's {segment - 1} positions"):
        check_max_length(segment, prior, append=False)
    with pytest.raises(DilstoreError, match=f"^--max-length {segment + 1} exceeds the model's {segment - 1} "):
        check_max_length(segment + 1, prior, append=True)


def test_a_model_of_the_wrong_kind_is_refused_before_loading(earl_dir: Path, dilbert_dir: Path) -> None:
    with pytest.raises(DilstoreError, match=r"holds a 'dilbert' checkpoint, which makes dilbert stores; earl-s1"):
        load_offline_model(dilbert_dir, "earl-s1", None)
    with pytest.raises(DilstoreError, match=r"holds an 'earl' checkpoint, which makes earl-s1 or earl-s2 stores"):
        load_offline_model(earl_dir, "dilbert", None)
    with pytest.raises(DilstoreError, match=r"N = 1 query layers, not 2"):
        load_offline_model(earl_dir, "earl-s2", 2)
    assert load_offline_model(earl_dir, "earl-s2", 1).query_layers == 1, "its own N may be given"


# ---------------------------------------------------------------------- end to end: precompute, store, judge


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Five short documents (one window each) and two long ones (several windows)."""
    documents = wiki_like_documents(5, words=12) + [
        {**document, "id": f"long-{number}"} for number, document in enumerate(wiki_like_documents(2, words=70))
    ]
    return write_jsonl(tmp_path_factory.mktemp("corpus") / "documents.jsonl", documents)


def precompute(corpus: Path, model: Path, store: Path, kind: str, encoding: str, *extra: str) -> list[str]:
    return ["precompute", "--input", str(corpus), "--format", "jsonl", "--output", str(store), "--model", str(model),
            "--kind", kind, "--encoding", encoding, "--shards", str(SHARDS), "--max-length", str(MAX_LENGTH),
            "--workers", "1", "--threads", "1", "--no-progress", "--json", *extra]  # fmt: skip


@pytest.fixture(scope="module")
def stores(tmp_path_factory: pytest.TempPathFactory, corpus: Path, earl_dir: Path) -> dict[tuple[str, str], Path]:
    """One in-memory DirectRunner run per (kind, encoding), through the command itself."""
    folder = tmp_path_factory.mktemp("stores")
    made = {}
    for kind in ("earl-s1", "earl-s2"):
        for encoding in ("fp32", "fp16"):
            store = folder / f"{kind}-{encoding}"
            assert cli.main(precompute(corpus, earl_dir, store, kind, encoding)) == 0
            made[kind, encoding] = store
    return made


def judged_and_forward_scores(ranker: EarlRanker, store: Path, kind: str, encoding: str) -> tuple[np.ndarray, ...]:
    """Every stored document scored against QUERY from the store (judge) and from its text (forward)."""
    ids = sorted(store_contents(store))
    with open_store(store, expected=model_fingerprint(ranker, kind, encoding, MAX_LENGTH)) as opened:
        stored = opened.fetch(ids)
    texts = [document.text for document in stored]
    doc_ids, doc_mask = ranker.tokenize_documents(texts, MAX_LENGTH)  # (b, n)
    for row, document in enumerate(stored):
        assert doc_ids[row, : len(document.token_ids)].tolist() == document.token_ids.tolist()
    states = np.zeros((len(stored), doc_ids.shape[1], *stored[0].states.shape[1:]), dtype=stored[0].states.dtype)
    for row, document in enumerate(stored):
        states[row, : len(document.token_ids)] = document.states  # (b, n, *S), zero padded
    query_ids, query_mask = ranker.tokenize_queries([QUERY], QUERY_LENGTH)  # (1, nq)
    argument = "doc_states" if kind == "earl-s1" else "doc_key_values"
    with torch.inference_mode():
        query_states = ranker.encode_queries(query_ids, query_mask)  # (1, nq, d)
        judged = ranker.judge(query_states, query_mask, doc_mask, **{argument: torch.from_numpy(states)})  # (b,)
        forward = ranker(
            query_ids.expand(len(stored), -1), query_mask.expand(len(stored), -1), doc_ids, doc_mask
        )  # (b,)
    return judged.numpy(), forward.numpy()


@pytest.mark.parametrize(("encoding", "tolerance"), [("fp32", FP32_TOLERANCE), ("fp16", FP16_TOLERANCE)])
@pytest.mark.parametrize("kind", ["earl-s1", "earl-s2"])
def test_scores_from_the_store_equal_the_unsplit_ranker(
    stores, ranker: EarlRanker, kind: str, encoding: str, tolerance: float
) -> None:
    store = stores[kind, encoding]
    summary = json.loads((store / "run-summary.json").read_text(encoding="utf-8"))
    assert (summary["kind"], summary["layers"], summary["documents"]) == (kind, 1, 7)
    assert summary["long_passages"] == 2 and summary["passages"] > 7 and summary["shards"] == SHARDS
    judged, forward = judged_and_forward_scores(ranker, store, kind, encoding)
    assert len(judged) == summary["passages"] and np.ptp(forward) > 10 * FP16_TOLERANCE, "scores that differ"
    assert np.abs(judged - forward).max() < tolerance


@pytest.mark.parametrize("kind", ["earl-s1", "earl-s2"])
def test_2bit_and_1bit_stores_rerank_close_to_the_fp16_store(
    stores, corpus: Path, earl_dir: Path, tmp_path: Path, kind: str
) -> None:
    """precompute --encoding 2bit|1bit, verify, rerank: states and scores within LOWBIT_BOUNDS of the fp16 store.

    S2 keeps keys and values side by side, `(T, M, 2, d)`: the codebook has a mean, cutoffs and weights per
    (block, k/v, dim) and every (token, block, k/v) its own scale, so keys and values are coded separately,
    and each is held to the state bound on its own.
    """
    ids = sorted(store_contents(stores[kind, "fp16"]))
    reference = open_reranker(stores[kind, "fp16"], earl_dir).rerank(QUERY, ids)
    with open_store(stores[kind, "fp16"]) as opened:
        expected = np.concatenate([document.states for document in opened.fetch(ids)]).astype(np.float32)  # (T, *S)
    for encoding, (state_bound, score_bound) in LOWBIT_BOUNDS.items():
        store = tmp_path / encoding
        assert cli.main(precompute(corpus, earl_dir, store, kind, encoding)) == 0
        assert verify_store(store).ok
        codebook, state_shape = read_codebook(store / CODEBOOK_DIR, encoding)
        assert state_shape == expected.shape[1:]
        assert "rotation" not in codebook and "cutoffs" in codebook  # EARL's judger: per-dimension buckets
        with open_store(store) as opened:
            decoded = np.concatenate([document.states for document in opened.fetch(ids)])  # (T, *S) float32
        sides = [(expected, decoded)] if kind == "earl-s1" else [(expected[:, :, side], decoded[:, :, side])
                                                                 for side in (0, 1)]  # keys, values: (T, M, d)
        for original, got in sides:
            centred = np.square(original - original.mean(axis=0)).sum()
            assert np.square(got - original).sum() / centred < state_bound, encoding
        scores = open_reranker(store, earl_dir).rerank(QUERY, ids)
        assert max(abs(scores[docid] - reference[docid]) for docid in ids) < score_bound, encoding


def test_an_earl_store_verifies_and_info_reports_its_bytes_per_token(stores, ranker: EarlRanker, capsys) -> None:
    per_token = {}
    for kind in ("earl-s1", "earl-s2"):
        store = stores[kind, "fp32"]
        capsys.readouterr()
        assert cli.main(["verify", str(store)]) == 0
        assert capsys.readouterr().out.endswith("OK\n")
        assert cli.main(["info", "--json", str(store)]) == 0
        info = json.loads(capsys.readouterr().out)
        assert info["kind"] == kind and info["fingerprint"]["kind"] == kind and set(info["bytes_per_token"]) == {kind}
        per_token[kind] = info["bytes_per_token"][kind]
        blocks, width = ranker.judger_blocks, ranker.hidden_size
        assert info["state_shape"] == ([width] if kind == "earl-s1" else [blocks, 2, width])
        assert per_token[kind] >= 4 * np.prod(info["state_shape"]), "fp32: at least 4 bytes per value"
    assert per_token["earl-s2"] / per_token["earl-s1"] == pytest.approx(2 * ranker.judger_blocks, rel=0.01)


def test_an_earl_store_is_refused_by_another_model_or_kind(stores, ranker: EarlRanker, base_dir: Path) -> None:
    untrained = load_offline_model(base_dir, "earl-s1", None)
    with pytest.raises(FingerprintMismatchError, match=r"differs in: weights_sha256\)"):
        open_store(stores["earl-s1", "fp32"], expected=model_fingerprint(untrained, "earl-s1", "fp32", MAX_LENGTH))
    with pytest.raises(FingerprintMismatchError, match=r"differs in: kind\)"):
        open_store(stores["earl-s1", "fp32"], expected=model_fingerprint(ranker, "earl-s2", "fp32", MAX_LENGTH))


# ---------------------------------------------------------------------- the command: kinds, layers and errors


def test_a_plain_encoder_makes_an_earl_job_and_says_it_is_untrained(
    corpus: Path, base_dir: Path, tmp_path: Path, capsys
) -> None:
    parse = cli.build_parser().parse_args
    args = parse(precompute(corpus, base_dir, tmp_path / "s", "earl-s2", "fp16"))
    job = build_job(args, time.time(), "DirectRunner", None)
    assert (job.kind, job.layers) == ("earl-s2", 1), "N defaults to l - 2"
    assert job.route_settings().kind == job.shard_settings().kind == "earl-s2"
    assert "untrained EARL ranker (N=1, M=2, cls pooling)" in capsys.readouterr().err
    two = parse(precompute(corpus, base_dir, tmp_path / "s", "earl-s1", "fp16", "--layers", "2"))
    assert build_job(two, time.time(), "DirectRunner", None).layers == 2, "--layers is N for a plain encoder"


def test_earl_kinds_default_to_the_packaged_ranker(
    corpus: Path, earl_dir: Path, tmp_path: Path, capsys, monkeypatch: pytest.MonkeyPatch
) -> None:
    packaged = tmp_path / "models"
    monkeypatch.setattr("dilstore.reader.packaged.shipped.packaged_models_dir", lambda: packaged)
    args = precompute(corpus, earl_dir, tmp_path / "store", "earl-s2", "fp16")
    at = args.index("--model")
    del args[at : at + 2]
    assert cli.main(args) == 2
    err = capsys.readouterr().err
    assert "the default EARL ranker checkpoint is missing" in err and err.count("\n") == 1, err
    assert not (tmp_path / "store").exists(), "nothing was written"
    shutil.copytree(earl_dir, packaged / DEFAULT_RANKER_NAME)
    job = build_job(cli.build_parser().parse_args(args), time.time(), "DirectRunner", None)
    assert (job.model, job.kind) == (DEFAULT_RANKER_REF, "earl-s2")
    assert job.layers == json.loads((earl_dir / "dilstore.json").read_text())["layers"], "the ranker's own N"
    assert resolve_model_dir(job.model) == packaged / DEFAULT_RANKER_NAME


@pytest.mark.parametrize(
    ("model", "kind", "extra", "message"),
    [
        ("dilbert", "earl-s1", [], "holds a 'dilbert' checkpoint, which makes dilbert stores; earl-s1 stores need"),
        ("earl", "dilbert", [], "holds an 'earl' checkpoint, which makes earl-s1 or earl-s2 stores; dilbert stores"),
        ("earl", "earl-s2", ["--layers", "2"], "N = 1 query layers, not 2; omit the layers (--layers)"),
        ("earl", "earl-s1", ["--max-length", "65"], "exceeds the model's 64 positions"),
    ],
)
def test_kind_and_model_errors_exit_2_with_one_line_before_any_work(
    corpus: Path, earl_dir: Path, dilbert_dir: Path, tmp_path: Path, capsys, model, kind, extra, message
) -> None:
    store = tmp_path / "store"
    args = precompute(corpus, {"earl": earl_dir, "dilbert": dilbert_dir}.get(model, earl_dir), store, kind, "fp16")
    if model is None:
        at = args.index("--model")
        del args[at : at + 2]
    assert cli.main([*args, *extra]) == 2
    err = capsys.readouterr().err
    assert err.startswith("dilstore precompute: error:") and message in err and err.count("\n") == 1, err
    assert not store.exists(), "nothing was written"


# ---------------------------------------------------------------------- the bi-encoder prior through the store


@pytest.fixture(scope="module")
def prior_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tied prior ranker whose head and scale were moved off their start, so judger and prior both count."""
    ranker = EarlRanker.from_encoder(text_encoder(seed=2), tokenizer(), EarlConfig(tied=True, prior=True))
    with torch.no_grad():
        ranker.score.weight.normal_(std=0.1, generator=torch.Generator().manual_seed(2))
        ranker.prior_scale.fill_(5.0)
    return ranker.save_pretrained(tmp_path_factory.mktemp("prior"))


def test_a_prior_rankers_s1_and_s2_stores_keep_passage_vectors_and_rerank_alike(
    corpus: Path, prior_dir: Path, tmp_path: Path, capsys
) -> None:
    """precompute writes each passage's mean S1 vector on both kinds; rerank from either equals the unsplit ranker."""
    ranker = EarlRanker.from_pretrained(prior_dir)
    scores = {}
    for kind in ("earl-s1", "earl-s2"):
        store = tmp_path / kind
        assert cli.main(precompute(corpus, prior_dir, store, kind, "fp16")) == 0
        assert cli.main(["verify", str(store)]) == 0
        capsys.readouterr()
        with open_store(store) as opened:
            assert opened.vector_size == ranker.hidden_size
            ids = sorted(store_contents(store))
            stored = opened.fetch(ids)
        tokens = [torch.from_numpy(document.token_ids.astype(np.int64))[None] for document in stored]
        with torch.inference_mode():
            expected = [ranker.document_vectors(ranker.encode_documents(t, torch.ones_like(t)), torch.ones_like(t))[0]
                        for t in tokens]  # fmt: skip
        for document, vector in zip(stored, expected, strict=True):
            assert document.vector.dtype == np.float32
            np.testing.assert_allclose(document.vector, vector.numpy(), atol=1e-5, rtol=0)
        scores[kind] = open_reranker(store, prior_dir).rerank(QUERY, ids)
    texts = {document.id: document.text for document in stored}
    with torch.inference_mode():
        query_ids, query_mask = ranker.tokenize_queries([QUERY] * len(ids), 64)
        doc_ids, doc_mask = ranker.tokenize_documents([texts[docid] for docid in ids], MAX_LENGTH)
        forward = dict(zip(ids, ranker(query_ids, query_mask, doc_ids, doc_mask).tolist(), strict=True))
    for kind, got in scores.items():
        assert max(abs(got[docid] - forward[docid]) for docid in ids) < FP16_TOLERANCE, kind
    assert np.ptp(list(forward.values())) > 10 * FP16_TOLERANCE
