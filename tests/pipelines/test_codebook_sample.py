"""What a 2bit/1bit codebook's sample means for the runs that reuse it (codes51 F1, F4).

A codebook trained on a few passages fits them and few others: appended passages got a relative error of 0.955
and F1 9.7 instead of 73.6, with exit 0 and `verify` OK. The build now says so, the codebook records its sample,
and an --append or a --codebook run measures such a codebook on its own states and refuses it where a codebook
trained on them would code them far better. NaN states in the sampling pass were a scipy traceback naming no
passage; they are refused as the shard writers refuse them.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from dilstore.pipelines import codebook as codebook_module
from dilstore.runners import cli
from dilstore.storage import codebook as codebooks
from dilstore.storage import residual_codes
from dilstore.storage.codebook import CODEBOOK_DIR, read_codebook, write_codebook
from dilstore.storage.encodings import train_codebook
from dilstore.storage.verify import verify_store
from tests.fixtures.pipeline_fixtures import save_tiny_reader, wiki_like_documents, write_jsonl

MAX_LENGTH = 48


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_reader(tmp_path_factory.mktemp("tiny-reader"))


def documents(count: int, prefix: str, seed: int) -> list[dict[str, str]]:
    return [{**document, "id": f"{prefix}-{number}"} for number, document in enumerate(wiki_like_documents(count,
                                                                                                          seed=seed))]


def precompute(inputs: Path, model: Path, output: Path, *extra: str) -> int:
    return cli.main(["precompute", "--input", str(inputs), "--output", str(output), "--model", str(model),
                     "--max-length", str(MAX_LENGTH), "--threads", "1", "--workers", "1", "--no-progress",
                     "--encoding", "2bit", *extra])  # fmt: skip


def test_a_codebook_of_a_few_passages_is_told_at_build_and_refused_for_appends_and_reuse_without_measuring(
    tiny_dir: Path, tmp_path: Path, capsys, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A codebook trained on fewer than MIN_REUSE_TOKENS states is refused by appends and --codebook runs of any size:
    one too small to measure it took it (a 72-token store's 12-paragraph append: relative error 0.964, exit 0,
    nothing said; review51 R1)."""
    small = write_jsonl(tmp_path / "small.jsonl", documents(1, "small", seed=0))
    few = write_jsonl(tmp_path / "few.jsonl", documents(3, "few", seed=2))
    more = write_jsonl(tmp_path / "more.jsonl", documents(100, "more", seed=1))
    store = tmp_path / "store"
    assert precompute(small, tiny_dir, store) == 0
    said = capsys.readouterr().err
    assert said.count("the codebook was trained on only") == 1, said
    count = codebooks.codebook_sample_tokens(store / CODEBOOK_DIR)
    assert count is not None and 0 < count < codebook_module.MIN_REUSE_TOKENS
    assert f"the codebook was trained on only {count:,} token states (fewer than 512)" in said
    assert "a run given this codebook with --codebook, will be refused" in said and "measures" not in said
    manifest = (store / "manifest.json").read_bytes()
    monkeypatch.setattr(codebook_module, "codebook_fit", lambda *args: pytest.fail("measured"))
    for inputs in (few, more):  # too small to measure, and large enough
        assert precompute(inputs, tiny_dir, store, "--append") == 2
        refused = capsys.readouterr().err
        assert f"cannot append to {store}: {store / CODEBOOK_DIR} was trained on only {count:,} token states, " \
               "fewer than the 512 a codebook needs to code passages it did not see" in refused, refused
        assert "build the store again from its inputs and these together" in refused
        assert (store / "manifest.json").read_bytes() == manifest and not (store / "appends").exists()
        assert precompute(inputs, tiny_dir, tmp_path / "reuse", "--codebook", str(store / CODEBOOK_DIR)) == 2
        refused = capsys.readouterr().err
        assert "does not fit this run" in refused and f"only {count:,} token states" in refused
        assert "leave --codebook out" in refused and not (tmp_path / "reuse").exists()
    assert verify_store(store).ok


def test_a_store_built_before_the_count_with_few_distinct_centroids_is_refused_a_small_append(
    tiny_dir: Path, tmp_path: Path, capsys, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Codebooks written before `sample_tokens` trained one centroid per sample token up to 256, so fewer distinct
    centroids are their sample: such a store's small append was coded at 0.964 with nothing said (review51 R1)."""
    small = write_jsonl(tmp_path / "small.jsonl", documents(1, "small", seed=0))
    few = write_jsonl(tmp_path / "few.jsonl", documents(3, "few", seed=2))
    store = tmp_path / "old"
    with monkeypatch.context() as patch:  # build it as before: one centroid per token, no count recorded
        patch.setattr(residual_codes, "TOKENS_PER_CENTROID", 1)
        patch.setattr(codebook_module, "write_codebook",
                      lambda *args, sample_tokens=None, **named: write_codebook(*args, **named))  # fmt: skip
        assert precompute(small, tiny_dir, store) == 0
    assert codebooks.codebook_sample_tokens(store / CODEBOOK_DIR) is None
    distinct = codebooks.distinct_centroids(store / CODEBOOK_DIR, "2bit")
    assert distinct is not None and 1 < distinct < 256
    capsys.readouterr()
    assert precompute(few, tiny_dir, store, "--append") == 2
    refused = capsys.readouterr().err
    assert f"cannot append to {store}: {store / CODEBOOK_DIR} does not record how many token states it was trained " \
           f"on, and has only {distinct:,} distinct centroids of 256" in refused, refused
    assert not (store / "appends").exists() and verify_store(store).ok


def test_a_codebook_of_512_states_or_more_is_not_refused_for_its_size(
    tiny_dir: Path, tmp_path: Path, capsys, monkeypatch: pytest.MonkeyPatch
) -> None:
    """From MIN_REUSE_TOKENS to SMALL_SAMPLE_TOKENS a codebook is measured where the run is large enough, and a run
    too small to measure it is warned, as the build says."""
    some = write_jsonl(tmp_path / "some.jsonl", documents(10, "some", seed=0))
    small = write_jsonl(tmp_path / "small.jsonl", documents(1, "small", seed=3))
    store = tmp_path / "store"
    assert precompute(some, tiny_dir, store) == 0
    said = capsys.readouterr().err
    count = codebooks.codebook_sample_tokens(store / CODEBOOK_DIR)
    assert count is not None and codebook_module.MIN_REUSE_TOKENS <= count < codebook_module.SMALL_SAMPLE_TOKENS
    assert codebook_module.too_few_to_reuse(store / CODEBOOK_DIR, "2bit") is None
    assert f"trained on only {count:,} token states (fewer than 2,000)" in said and "will be refused" not in said
    assert "is refused where it codes them more than 1.5x worse" in said and "is only warned" in said, said
    measured = []
    monkeypatch.setattr(codebook_module, "codebook_fit", lambda *args: measured.append(args) or None)
    assert precompute(small, tiny_dir, store, "--append") == 0
    assert "is too small to measure how well it codes this run's passages" in capsys.readouterr().err
    assert len(measured) == 1 and verify_store(store).ok


def test_too_few_to_reuse_reads_the_count_or_an_old_codebooks_distinct_centroids(tmp_path: Path) -> None:
    states = np.random.default_rng(0).standard_normal((600, 8)).astype(np.float32)
    book = train_codebook("2bit", states)  # 600 // 32 = 18 distinct centroids, the rest repeating them
    for count, refused in ((511, True), (512, False)):
        write_codebook(tmp_path / str(count), "2bit", book, (8,), sample_tokens=count)
        assert (codebook_module.too_few_to_reuse(tmp_path / str(count), "2bit") is not None) == refused, count
    assert "only 511 token states" in codebook_module.too_few_to_reuse(tmp_path / "511", "2bit")
    for tokens in (100, 255, 256):  # as trained before the count was recorded: one centroid per sample token
        write_codebook(tmp_path / f"old{tokens}", "2bit", {**book, "centroids": states[np.arange(256) % tokens]}, (8,))
        assert codebooks.distinct_centroids(tmp_path / f"old{tokens}", "2bit") == tokens
        why = codebook_module.too_few_to_reuse(tmp_path / f"old{tokens}", "2bit")
        assert (why is None) == (tokens == 256), tokens
    assert "has only 100 distinct centroids of 256" in codebook_module.too_few_to_reuse(tmp_path / "old100", "2bit")
    without = {name: values for name, values in book.items() if name != "centroids"}
    write_codebook(tmp_path / "without", "2bit", without, (8,))
    assert codebooks.distinct_centroids(tmp_path / "without", "2bit") is None
    assert codebook_module.too_few_to_reuse(tmp_path / "without", "2bit") is None


def test_an_old_codebook_s_sample_is_its_fewest_distinct_centroids_at_any_position(tmp_path: Path) -> None:
    """An earl-s2 codebook holds one centroid table per (block, key/value) position; written before the count was
    recorded, the position trained on the fewest states tells the sample, however many the others hold."""
    states = np.random.default_rng(3).standard_normal((600, 2, 2, 8)).astype(np.float32)  # (n, blocks, 2, d)
    book = train_codebook("2bit", states)
    rows = np.arange(residual_codes.CENTROIDS)
    for counts in ((256, 40, 256, 200), (256, 256, 256, 256), (7, 256, 100, 256)):
        centroids = book["centroids"].copy()  # (C, blocks, 2, d)
        for position, count in enumerate(counts):
            block, half = divmod(position, 2)
            centroids[:, block, half] = states[rows % count, block, half]
        folder = tmp_path / "-".join(map(str, counts))
        write_codebook(folder, "2bit", {**book, "centroids": centroids}, (2, 2, 8))
        assert codebooks.distinct_centroids(folder, "2bit") == min(counts), counts
        assert (codebook_module.too_few_to_reuse(folder, "2bit") is None) == (min(counts) == 256), counts


def test_a_codebook_of_a_full_sample_is_not_measured_again_and_a_copy_keeps_its_count(
    tiny_dir: Path, tmp_path: Path, capsys, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Measuring costs a sampling pass and a training (about as long again as a 60-passage append): a codebook that
    records SMALL_SAMPLE_TOKENS states or more is not measured; one that records none (stores built before) is."""
    more = write_jsonl(tmp_path / "more.jsonl", documents(100, "more", seed=1))
    small = write_jsonl(tmp_path / "small.jsonl", documents(1, "small", seed=0))
    store = tmp_path / "store"
    assert precompute(more, tiny_dir, store) == 0
    assert "trained on only" not in capsys.readouterr().err
    count = codebooks.codebook_sample_tokens(store / CODEBOOK_DIR)
    assert count is not None and count >= codebook_module.SMALL_SAMPLE_TOKENS
    with monkeypatch.context() as patch:
        patch.setattr(codebook_module, "codebook_fit", lambda *args: pytest.fail("measured"))
        assert precompute(small, tiny_dir, store, "--append") == 0
        assert precompute(small, tiny_dir, tmp_path / "reuse", "--codebook", str(store / CODEBOOK_DIR)) == 0
    assert codebooks.codebook_sample_tokens(tmp_path / "reuse" / CODEBOOK_DIR) == count
    unrecorded = tmp_path / "unrecorded"  # as written before the count was recorded
    arrays, shape = read_codebook(store / CODEBOOK_DIR, "2bit")
    # All 256 centroids distinct, as a codebook written before the count was holds for a sample of 256 or more (one
    # with fewer is refused unmeasured: the test above); a new one repeats its trained rows.
    spread = np.arange(len(arrays["centroids"]), dtype=np.float32).reshape(-1, *[1] * len(shape)) * 1e-3
    write_codebook(unrecorded, "2bit", {**arrays, "centroids": arrays["centroids"] + spread}, shape)
    measured = []
    monkeypatch.setattr(codebook_module, "codebook_fit", lambda *args: measured.append(args) or None)
    assert precompute(small, tiny_dir, tmp_path / "reuse-unrecorded", "--codebook", str(unrecorded)) == 0
    assert len(measured) == 1


def test_nan_states_in_the_sampling_pass_are_refused_naming_the_passage(tiny_dir: Path, tmp_path: Path, capsys) -> None:
    """fp16 and int8 refuse them with the passage id; 2bit's sampling pass was a scipy ValueError traceback. The
    weights are finite (a model with NaN weights is refused as it loads, num58 F4): one word's embedding so large
    that the layer norm over it overflows, so only the passages holding that word get NaN states."""
    model = shutil.copytree(tiny_dir, tmp_path / "nan-model")
    weights = load_file(model / "model.safetensors")
    embeddings = weights["bert.embeddings.word_embeddings.weight"].copy()
    embeddings[29145] = 3e38  # "zebra": finite, its layer norm's mean is not
    save_file({**weights, "bert.embeddings.word_embeddings.weight": embeddings}, model / "model.safetensors")
    inputs = tmp_path / "nan.jsonl"
    inputs.write_text("".join(json.dumps(row) + "\n" for row in [
        {"id": "good", "title": "", "text": "the river valley city"},
        {"id": "bad", "title": "", "text": "the zebra crossed the river"},
    ]), encoding="utf-8")  # fmt: skip
    assert precompute(inputs, model, tmp_path / "store", "--split", "none") == 2
    error = capsys.readouterr().err
    assert re.search(r"error: passage 'bad': token \d+ has NaN or infinite states", error), error
    assert "Traceback" not in error


@pytest.mark.parametrize("offset", [-1, 0, 1])
def test_a_build_s_small_sample_warning_says_refused_only_below_the_reuse_minimum(
    offset: int, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """The warning a build gives a codebook trained on few states says what an --append will do: refused for fewer
    than MIN_REUSE_TOKENS (as `too_few_to_reuse` refuses), measured from MIN_REUSE_TOKENS on."""
    from dilstore.runners.cmd_precompute import warn_small_sample

    count = codebook_module.MIN_REUSE_TOKENS + offset
    monkeypatch.setattr(codebooks, "codebook_sample_tokens", lambda path: count)
    warn_small_sample(tmp_path)
    err = capsys.readouterr().err
    assert f"trained on only {count:,} token states" in err
    assert ("will be refused" in err) == (count < codebook_module.MIN_REUSE_TOKENS)
    assert ("first measures it" in err) == (count >= codebook_module.MIN_REUSE_TOKENS)


def _fit_with_states(monkeypatch: pytest.MonkeyPatch, path: Path, states: dict[str, np.ndarray]):
    """`codebook_fit` of the 2bit codebook at `path` on a sample whose documents (in sample order) have `states`."""
    from types import SimpleNamespace

    def all_states(documents, settings, reader, policy):
        return np.concatenate([states[name] for name in documents]) if documents else None  # (N, d)

    monkeypatch.setattr(codebook_module, "sample_documents", lambda inputs, limit, strategy: list(states))
    monkeypatch.setattr(codebook_module, "_all_states", all_states)
    job = SimpleNamespace(inputs=[], strategy="none", policy=None, encoding="2bit", kind="dilbert",
                          route_settings=lambda: None)  # fmt: skip
    return codebook_module.codebook_fit(path, job, reader=None)


@pytest.mark.parametrize("case", ["distinct", "repeated", "held-out-few"])
def test_codebook_fit_trains_on_every_other_document_and_scores_only_unseen_states(
    case: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """codebook_fit trains on the sample's even documents and scores on the odd ones, states seen in training left
    out, and needs FIT_MIN_TOKENS in each half (mut59 M1-M3: scoring on the training half itself, keeping repeated
    states, or asking the larger half alone for enough states went unseen: the function was only ever replaced)."""
    rng = np.random.default_rng(0)
    enough = codebook_module.FIT_MIN_TOKENS + 50
    train = rng.normal(size=(enough, 8)).astype(np.float32)  # (N, d)
    given = write_codebook(tmp_path / "given", "2bit", train_codebook("2bit", rng.normal(3, 1, (enough, 8))), (8,))
    held_out = {"distinct": rng.normal(size=(enough, 8)), "repeated": train,
                "held-out-few": rng.normal(size=(40, 8))}[case].astype(np.float32)  # fmt: skip
    fit = _fit_with_states(monkeypatch, given, {"a": train, "b": held_out})
    if case == "distinct":
        assert fit is not None and fit[0] > 2 * fit[1] > 0, fit  # a codebook of other states fits these far worse
    else:
        assert fit is None
