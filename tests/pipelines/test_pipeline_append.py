"""`dilstore precompute --append`: a store of A followed by an append of B serves what the store of A ∪ B serves.

The tiny random reader and a tiny EARL ranker make the stores in-process
(DirectRunner, one worker, one thread). Stored passages are compared with the
one-run store (states to fp tolerance: the encoder batches passages by length,
so a passage may be padded differently in the two runs), EARL rerank scores too;
the BM25 + reader path (`ask`, `evaluate-qa`) is in test_pipeline_append_bm25.py.
"""

from __future__ import annotations

import dataclasses
import io
import json
import os
import shutil
import signal
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zarr
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dilstore.pipelines import codebook as codebook_module
from dilstore.pipelines.append import check_store_settings
from dilstore.pipelines.finish import _stored_count
from dilstore.pipelines.job import PrecomputeJob
from dilstore.pipelines.passages import Passage
from dilstore.pipelines.spec_file import SUMMARY_FILE
from dilstore.reader.batching import BatchPolicy
from dilstore.reader.modeling.earl import EarlConfig, EarlRanker
from dilstore.reader.serving.rerank import open_reranker
from dilstore.runners import cli
from dilstore.runners.precompute_run import stopped
from dilstore.runners.stop_signals import Terminated
from dilstore.storage import append as storage_append
from dilstore.storage.codebook import CODEBOOK_DIR, read_codebook, write_codebook
from dilstore.storage.encodings import train_codebook
from dilstore.storage.format import APPENDS_DIR, MANIFEST_FILE, StoreFormatError
from dilstore.storage.info import store_info
from dilstore.storage.location import StoreLocation
from dilstore.storage.manifest import read_manifest, write_manifest
from dilstore.storage.passage_tables import PASSAGE_SCHEMA, passage_column, passage_table_bytes
from dilstore.storage.reader import open_store
from dilstore.storage.verify import verify_store
from tests.fixtures.earl_tiny import text_encoder, tokenizer
from tests.fixtures.pipeline_fixtures import (
    killable_command,
    killed_while_writing,
    save_tiny_reader,
    store_contents,
    wiki_like_documents,
    write_jsonl,
)
from tests.fixtures.store_fixtures import build_store, random_shards

pytestmark = pytest.mark.slow

DOCUMENTS = wiki_like_documents(12, words=30)
STATE_TOLERANCE = 1e-5


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("append-models")
    ranker = EarlRanker.from_encoder(text_encoder(), tokenizer(), EarlConfig())
    return {"dilbert": save_tiny_reader(folder / "reader"), "earl": ranker.save_pretrained(folder / "earl")}


def precompute(model: Path, corpus: Path, store: Path, *extra: str) -> int:
    return cli.main(["precompute", "--input", str(corpus), "--output", str(store), "--model", str(model),
                     "--workers", "1", "--threads", "1", "--max-length", "48", "--shards", "3",
                     "--encoding", "fp32", "--no-progress", *extra])


@pytest.fixture(scope="module")
def union(models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The store of every document, made in one run."""
    folder = tmp_path_factory.mktemp("append-union")
    corpus = write_jsonl(folder / "all.jsonl", DOCUMENTS)
    assert precompute(models["dilbert"], corpus, folder / "store") == 0
    return folder / "store"


def assert_same_passages(store: Path, reference: Path) -> None:
    """The two stores serve the same ids, texts and tokens, and states within STATE_TOLERANCE."""
    found, expected = store_contents(store), store_contents(reference)
    assert sorted(found) == sorted(expected)
    for passage_id, (title, text, token_ids, spans, states) in expected.items():
        got = found[passage_id]
        assert (got[0], got[1]) == (title, text)
        assert np.array_equal(got[2], token_ids) and np.array_equal(got[3], spans)
        np.testing.assert_allclose(got[4], states, atol=STATE_TOLERANCE, rtol=0)


def split_corpus(folder: Path, in_b: list[bool]) -> tuple[Path, Path]:
    a = [document for document, b in zip(DOCUMENTS, in_b, strict=True) if not b]
    b = [document for document, b in zip(DOCUMENTS, in_b, strict=True) if b]
    return write_jsonl(folder / "a.jsonl", a), write_jsonl(folder / "b.jsonl", b)


@settings(max_examples=3, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(in_b=st.lists(st.booleans(), min_size=len(DOCUMENTS), max_size=len(DOCUMENTS)))
def test_a_then_an_append_of_b_serves_what_one_run_over_a_and_b_serves(
    models: dict[str, Path], union: Path, tmp_path_factory: pytest.TempPathFactory, in_b: list[bool]
) -> None:
    folder = tmp_path_factory.mktemp("append-split")
    corpus_a, corpus_b = split_corpus(folder, in_b)
    store = folder / "store"
    # A part with no document stores no passage: its build or append exits 1 (and an empty append is not committed)
    assert precompute(models["dilbert"], corpus_a, store) == (1 if all(in_b) else 0)
    assert precompute(models["dilbert"], corpus_b, store, "--append") == (0 if any(in_b) else 1)
    assert_same_passages(store, union)
    report = verify_store(store)
    assert report.ok, report.problems
    assert store_info(store)["passages"] == store_info(union)["passages"]
    assert store_info(store)["tokens"] == store_info(union)["tokens"]


def test_earl_rerank_scores_of_an_appended_store_equal_the_one_run_store(
    models: dict[str, Path], tmp_path: Path
) -> None:
    corpus_a, corpus_b = split_corpus(tmp_path, [i % 3 == 0 for i in range(len(DOCUMENTS))])
    union_corpus = write_jsonl(tmp_path / "all.jsonl", DOCUMENTS)
    earl = ["--kind", "earl-s1", "--split", "none"]
    assert precompute(models["earl"], union_corpus, tmp_path / "union", *earl) == 0
    assert precompute(models["earl"], corpus_a, tmp_path / "store", *earl) == 0
    assert precompute(models["earl"], corpus_b, tmp_path / "store", *earl, "--append") == 0
    ids = [document["id"] for document in DOCUMENTS]
    for query in ("bridge across the river", "museum library garden"):
        appended = open_reranker(tmp_path / "store", models["earl"]).rerank(query, ids)
        whole = open_reranker(tmp_path / "union", models["earl"]).rerank(query, ids)
        assert appended.keys() == whole.keys()
        np.testing.assert_allclose([appended[i] for i in ids], [whole[i] for i in ids], rtol=1e-5, atol=1e-6)
    assert verify_store(tmp_path / "store").ok


def test_other_settings_are_refused_in_one_line(models: dict[str, Path], union: Path, tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    corpus = write_jsonl(tmp_path / "new.jsonl", [{"id": "new", "text": "a bridge"}])
    store = tmp_path / "store"
    shutil.copytree(union, store)
    before = (store / MANIFEST_FILE).read_bytes()
    cases = [
        (["--encoding", "fp16"], "encoding: store 'fp32', this run 'fp16'"),
        (["--max-length", "40"], "max_length: store 48, this run 40"),
        (["--split", "none"], "split: store 'words', this run 'none'"),
        (["--compression", "zstd"], "compression: store none, this run zstd"),
        # Every difference at once: the split was named only after the fingerprint's had been mended.
        (["--max-length", "40", "--split", "none"], "max_length: store 48, this run 40; split: store 'words'"),
    ]
    for extra, named in cases:
        arguments = ["precompute", "--input", str(corpus), "--output", str(store), "--model", str(models["dilbert"]),
                     "--workers", "1", "--threads", "1", "--max-length", "48", "--shards", "3", "--encoding", "fp32",
                     "--no-progress", "--append", *extra]
        assert cli.main(arguments) == 2
        error = capsys.readouterr().err.strip()
        assert named in error and len(error.splitlines()) == 1, error
    assert precompute(models["earl"], corpus, store, "--kind", "earl-s1", "--append") == 2
    error = capsys.readouterr().err.strip()
    assert "kind: store 'dilbert', this run 'earl-s1'" in error and "weights_sha256" in error, error
    assert (store / MANIFEST_FILE).read_bytes() == before
    assert not (store / APPENDS_DIR).exists()


def test_duplicate_ids_are_refused_naming_them(models: dict[str, Path], union: Path, tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    store = tmp_path / "store"
    shutil.copytree(union, store)
    again = write_jsonl(tmp_path / "again.jsonl", [DOCUMENTS[3], {"id": "fresh", "text": "a new bridge"}])
    assert precompute(models["dilbert"], again, store, "--append") == 2
    assert "1 passage id is in" in (error := capsys.readouterr().err) and "'doc-003#0'" in error
    twice = write_jsonl(tmp_path / "twice.jsonl", [{"id": "x", "text": "one"}, {"id": "x", "text": "two"}])
    assert precompute(models["dilbert"], twice, store, "--append") == 2
    assert "document ids occur more than once in the input: 'x'" in capsys.readouterr().err
    both = write_jsonl(tmp_path / "both.jsonl", [*[{"id": "x", "text": "one"}] * 2, DOCUMENTS[3]])
    assert precompute(models["dilbert"], both, store, "--append") == 2
    error = capsys.readouterr().err
    assert "more than once in the input: 'x'" in error and "1 passage id is in" in error and "'doc-003#0'" in error
    assert "fresh#0" not in open_store(store) and verify_store(store).ok
    assert not (store / APPENDS_DIR).exists(), "a refused append left its folder behind"
    assert verify_store(store).untracked == []


@pytest.mark.parametrize(("lines", "extra", "told"), [
    ([], [], "0 document(s) accepted, 0 record(s) rejected; check --input"),
    (['{"id": "a", "text": "fine"}'], ["--format", "squad"], "1 record(s) rejected (see {folder}/rejected/ for why)"),
])  # fmt: skip
def test_an_append_that_stores_no_passage_exits_1_says_why_and_leaves_the_store_unchanged(
    models: dict[str, Path], union: Path, tmp_path: Path, capsys, lines: list[str], extra: list[str], told: str
) -> None:
    """It exited 0 without a word and committed an empty append (the manifest's format_version went up)."""
    store = tmp_path / "store"
    shutil.copytree(union, store)
    manifest = (store / MANIFEST_FILE).read_bytes()
    corpus = tmp_path / "c.jsonl"
    corpus.write_text("".join(line + "\n" for line in lines))
    assert precompute(models["dilbert"], corpus, store, "--append", *extra) == 1
    err = capsys.readouterr().err
    folder = next((store / APPENDS_DIR).iterdir())
    assert "dilstore precompute: error: no passage was stored: " in err and told.format(folder=folder) in err
    assert f"nothing was appended, {store} is unchanged" in err
    assert (store / MANIFEST_FILE).read_bytes() == manifest and verify_store(store).ok


def test_replace_serves_the_new_row_and_no_count_or_check_sees_the_old(
    models: dict[str, Path], union: Path, tmp_path: Path, capsys
) -> None:
    store = tmp_path / "store"
    shutil.copytree(union, store)
    changed = {**DOCUMENTS[3], "text": "the tower was rebuilt by settlers"}
    corpus = write_jsonl(tmp_path / "changed.jsonl", [changed, {"id": "fresh", "text": "a new bridge"}])
    with corpus.open("a", encoding="utf-8") as lines:
        lines.write("not JSON\n")  # its dead letter is in the append's own folder, which nothing named
    before = store_contents(store)
    assert precompute(models["dilbert"], corpus, store, "--append", "--replace") == 0
    folder = next((store / APPENDS_DIR).iterdir())
    assert f"1 record(s) rejected: {folder / 'rejected'}/ says why" in capsys.readouterr().err
    after = store_contents(store)
    assert after["doc-003#0"][1] == "the tower was rebuilt by settlers"
    assert sorted(after) == sorted([*before, "fresh#0"])
    with open_store(store) as opened:
        assert len(opened) == len(before) + 1 and opened.manifest.superseded_passages == 1
    assert store_info(store)["passages"] == len(before) + 1
    report = verify_store(store)
    assert report.ok and report.passages == len(before) + 1, report.problems


def test_an_append_that_dies_before_its_commit_leaves_the_store_and_a_rerun_completes_it(
    models: dict[str, Path], union: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The store it ends with serves what the one-run store of A and B serves (`union`: an uninterrupted A then B
    serves the same, test_a_then_an_append_of_b_serves_what_one_run_over_a_and_b_serves)."""
    corpus_a, corpus_b = split_corpus(tmp_path, [i >= 8 for i in range(len(DOCUMENTS))])
    store, reference = tmp_path / "store", union
    assert precompute(models["dilbert"], corpus_a, store) == 0
    before = store_contents(store)
    manifest = (store / MANIFEST_FILE).read_bytes()

    def crash(*_: object) -> None:
        raise OSError("simulated crash before the manifest")

    monkeypatch.setattr(storage_append, "write_manifest", crash)
    assert precompute(models["dilbert"], corpus_b, store, "--append") == 2
    monkeypatch.undo()
    assert (store / MANIFEST_FILE).read_bytes() == manifest
    assert store_contents(store).keys() == before.keys() and verify_store(store).ok
    assert precompute(models["dilbert"], corpus_b, store, "--append") == 0
    summary = json.loads(next((store / APPENDS_DIR).glob(f"*/{SUMMARY_FILE}")).read_text())
    assert summary["shards_resumed"] == summary["shard_count"]  # the shards written before the crash were kept
    assert_same_passages(store, reference)
    assert verify_store(store).ok
    assert precompute(models["dilbert"], corpus_b, store, "--append") == 0  # already complete: nothing changes
    assert_same_passages(store, reference)
    moved = tmp_path / "moved"
    store.rename(moved)
    capsys.readouterr()
    assert precompute(models["dilbert"], corpus_b, moved, "--append", "--json") == 0
    captured = capsys.readouterr()
    assert "already holds this append" in captured.err and json.loads(captured.out)["store"] == str(moved)
    assert json.loads(captured.out)["already_complete"] is True and "later append" not in captured.err


def test_a_held_append_with_appends_after_it_says_they_may_have_replaced_its_rows(
    models: dict[str, Path], union: Path, tmp_path: Path, capsys
) -> None:
    """Rolling back to v1 by running its append again did nothing and said only "already holds this append", while
    v2 stayed served (storage43 M3)."""
    store = tmp_path / "store"
    shutil.copytree(union, store)
    versions = [write_jsonl(tmp_path / f"v{n}.jsonl", [{**DOCUMENTS[0], "text": f"version {n} of the river"}])
                for n in (1, 2)]  # fmt: skip
    assert cli.main(["precompute", "--input", str(versions[0]), "--output", str(store), "--model",
                     str(models["dilbert"]), "--workers", "1", "--max-length", "48", "--encoding", "fp32",
                     "--no-progress", "--append", "--replace", "--json"]) == 0  # fmt: skip
    assert json.loads(capsys.readouterr().out)["shard_count"] == 1  # not 4 of ~100 KB each (storage43 L1)
    assert precompute(models["dilbert"], versions[1], store, "--append", "--replace") == 0
    capsys.readouterr()
    assert cli.main(["precompute", "--input", str(versions[0]), "--output", str(store), "--model",
                     str(models["dilbert"]), "--workers", "1", "--max-length", "48", "--encoding", "fp32",
                     "--no-progress", "--append", "--replace"]) == 0  # fmt: skip
    assert capsys.readouterr().err.endswith(
        "; 1 later append(s) may have replaced some of its rows, and its inputs are known by path, size and "
        "modification time: to apply them again, give them under another name\n")
    assert open_store(store).fetch([f"{DOCUMENTS[0]['id']}#0"])[0].text == "version 2 of the river"


def test_a_2bit_append_encodes_with_the_store_codebook_and_refuses_another(
    models: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # This is about the codes an append takes from the store's codebook, not its sample: a codebook of this corpus's
    # ~200 token states is refused for appends and --codebook runs (test_codebook_sample.py, review51 R1).
    monkeypatch.setattr(codebook_module, "MIN_REUSE_TOKENS", 0)
    corpus_a, corpus_b = split_corpus(tmp_path, [i % 2 == 1 for i in range(len(DOCUMENTS))])
    union_corpus = write_jsonl(tmp_path / "all.jsonl", DOCUMENTS)
    store, union = tmp_path / "store", tmp_path / "union"
    assert precompute(models["dilbert"], corpus_a, store, "--encoding", "2bit") == 0
    chunks = ("mean/c/0", "centroids/c/0/0")
    codebook = {chunk: (store / "codebook" / chunk).read_bytes() for chunk in chunks}
    assert precompute(models["dilbert"], corpus_b, store, "--encoding", "2bit", "--append") == 0
    for chunk, stored in codebook.items():
        assert (store / "codebook" / chunk).read_bytes() == stored  # reused, not retrained
    assert list((store / APPENDS_DIR).glob("*/shards/*/states/centroid_ids/zarr.json"))  # appended ids name them
    assert precompute(models["dilbert"], union_corpus, union, "--encoding", "2bit",
                      "--codebook", str(store / "codebook")) == 0
    assert_same_passages(store, union)
    assert verify_store(store).ok
    own = tmp_path / "own-codebook"
    assert precompute(models["dilbert"], corpus_b, own, "--encoding", "2bit") == 0
    assert precompute(models["dilbert"], corpus_b, store, "--encoding", "2bit", "--append", "--replace",
                      "--codebook", str(own / "codebook")) == 2
    assert "is not the store's codebook/" in capsys.readouterr().err
    assert precompute(models["dilbert"], corpus_b, store, "--encoding", "2bit", "--append", "--replace",
                      "--codebook", str(own / "codebook"), "--max-length", "40") == 2  # both named at once
    error = capsys.readouterr().err
    assert "max_length: store 48, this run 40" in error and "is not the store's codebook/" in error, error


def test_an_append_refuses_a_store_codebook_that_changed_after_finalize(tmp_path: Path) -> None:
    """The new shards were encoded with a codebook/ whose mean had been edited (exit 0; verify named the file only
    afterwards, and restoring the codebook then broke the new rows): refused before anything is written, naming the
    file (codes51 F3)."""
    shards = random_shards([30, 30], state_shape=(8,), seed=4)
    book = train_codebook("2bit", np.concatenate([record.states for shard in shards for record in shard]))
    store = build_store(tmp_path / "store", shards, encoding="2bit", codebook=book)
    manifest = read_manifest(StoreLocation.parse(store))
    job = SimpleNamespace(fingerprint=manifest.fingerprint, compressor=None, strategy="words", encoding="2bit",
                          codebook=None)  # what check_store_settings reads of the run
    assert check_store_settings(store, job) == manifest  # type: ignore[arg-type]
    mean = zarr.open_array(str(store / CODEBOOK_DIR / "mean"), mode="r+")
    mean[0] = 10.0  # still a valid codebook: only the manifest can tell
    listed = set(os.listdir(store))
    with pytest.raises(StoreFormatError, match=rf"^cannot append to {store}: the codebook does not match "
                                               rf"{store}/manifest.json \(codebook/mean/c/0 changed after finalize: "
                                               rf"its SHA-256 differs\), .*; `dilstore verify {store}` lists "
                                               r"what changed: put codebook/ back from a copy of the store, or build "
                                               r"the store again with --overwrite$"):  # fmt: skip
        check_store_settings(store, job)  # type: ignore[arg-type]
    assert set(os.listdir(store)) == listed  # nothing written


def test_an_append_after_an_upgrade_of_the_shipped_model_says_what_to_do(tmp_path: Path) -> None:
    """(upgrade58 F3) A store built with the model an older dilstore shipped, appended to without --model after an
    upgrade that shipped retrained weights, was refused with "made with other settings (weights_sha256: store d8a4…,
    this run 5c24…)" alone. It now says to build the store again (its command with --overwrite) or to give --model
    the checkpoint that made it; a run that names its --model keeps the plain refusal."""
    store = build_store(tmp_path / "store", random_shards([3], state_shape=(8,), seed=6))
    manifest = read_manifest(StoreLocation.parse(store))
    command = "dilstore precompute --input a.jsonl --output store --kind dilbert"
    write_manifest(store, dataclasses.replace(manifest, creation={**manifest.creation, "command": command}))
    retrained = dataclasses.replace(manifest.fingerprint, weights_sha256="f" * 64)
    for run, advised in [("dilstore precompute --input b.jsonl --output store --append", True),
                         ("dilstore precompute --input b.jsonl --output store --append --model mine", False)]:
        job = SimpleNamespace(fingerprint=retrained, compressor=None, strategy="words", encoding="fp32", codebook=None,
                              creation={"command": run})  # fmt: skip
        with pytest.raises(storage_append.AppendMismatchError, match=r"weights_sha256: store ") as refused:
            check_store_settings(store, job)  # type: ignore[arg-type]
        assert str(refused.value).endswith(f"ships another: build the store again with this one (`{command} "
                                           "--overwrite`), or give --model the checkpoint that made it") is advised


def test_an_append_of_other_settings_with_the_same_shipped_model_is_not_told_the_model_changed(tmp_path: Path) -> None:
    """(read58b F2) An append without --model onto a store built without --model, whose fingerprint differs only in
    its encoding or max length, was told "this dilstore ships another" model and to build the store again: the
    advice followed any difference of the model fingerprint, not only of the shipped weights."""
    store = build_store(tmp_path / "store", random_shards([3], state_shape=(8,), seed=6))
    manifest = read_manifest(StoreLocation.parse(store))
    command = "dilstore precompute --input a.jsonl --output store --kind dilbert"
    write_manifest(store, dataclasses.replace(manifest, creation={**manifest.creation, "command": command}))
    for change in [{"encoding": "int8"}, {"max_length": 128}]:
        job = SimpleNamespace(fingerprint=dataclasses.replace(manifest.fingerprint, **change), compressor=None,
                              strategy="words", encoding="fp32", codebook=None,
                              creation={"command": "dilstore precompute --input b.jsonl --output store --append"})
        with pytest.raises(storage_append.AppendMismatchError, match=f"{next(iter(change))}: store ") as refused:
            check_store_settings(store, job)  # type: ignore[arg-type]
        assert "ships another" not in str(refused.value)


@pytest.mark.parametrize("compressor", [None, "zstd"])
def test_the_compression_of_a_store_is_held_against_an_append_only_when_the_store_has_shards(
    tmp_path: Path, compressor
) -> None:
    """A store of no passages has no shards, so no compression: an append of either compression is taken; a store
    with shards refuses an append of the other compression, naming both."""
    other = None if compressor else "zstd"
    empty = build_store(tmp_path / "empty", [], compressor=compressor)
    manifest = read_manifest(StoreLocation.parse(empty))
    for job_compressor in (compressor, other):
        job = SimpleNamespace(fingerprint=manifest.fingerprint, compressor=job_compressor, strategy="words",
                              encoding="fp32", codebook=None)  # fmt: skip
        assert check_store_settings(empty, job) == manifest  # type: ignore[arg-type]
    store = build_store(tmp_path / "store", random_shards([3], state_shape=(8,), seed=5), compressor=compressor)
    job = SimpleNamespace(fingerprint=read_manifest(StoreLocation.parse(store)).fingerprint, compressor=other,
                          strategy="words", encoding="fp32", codebook=None)  # fmt: skip
    with pytest.raises(storage_append.AppendMismatchError,
                       match=f"compression: store {compressor or 'none'}, this run {other or 'none'}"):  # fmt: skip
        check_store_settings(store, job)  # type: ignore[arg-type]


def test_a_rerun_of_a_committed_append_is_planned_at_the_shards_it_committed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The manifest's record of a committed append says where its shards start; the first free shard is past them
    by then, and a plan from there would look for the append's shards where none are."""
    from dilstore.pipelines import append as pipeline_append
    from dilstore.storage.format import append_dir
    from dilstore.storage.writer import write_shard
    from tests.fixtures.store_fixtures import fingerprint_for

    generation = "fedcba9876543210"
    shards = random_shards([3, 2, 2], state_shape=(8,), seed=6)
    store = build_store(tmp_path / "store", shards[:2])
    write_shard(store / append_dir(generation), 2, shards[2], kind="dilbert", encoding="fp32", durable=False,
                generation=generation)  # fmt: skip
    manifest = storage_append.commit_append(store, generation, fingerprint_for())
    assert storage_append.first_free_shard(manifest) == 3
    monkeypatch.setattr(pipeline_append, "append_spec", lambda job: {"append": {"replace": False}})
    monkeypatch.setattr(pipeline_append, "spec_generation", lambda spec: generation)  # this run is that append
    plan = pipeline_append.prepare_append(store, None, manifest)  # type: ignore[arg-type]
    assert (plan.generation, plan.first_shard) == (generation, 2) and plan.committed is not None


def test_a_2bit_append_to_a_store_without_centroids_keeps_its_scheme(models: dict[str, Path], tmp_path: Path) -> None:
    """A store whose codebook has no centroids (as stores written before them have) appends without them too."""
    corpus_a, corpus_b = split_corpus(tmp_path, [i % 2 == 1 for i in range(len(DOCUMENTS))])
    trained = tmp_path / "trained"
    assert precompute(models["dilbert"], corpus_a, trained, "--encoding", "2bit") == 0
    arrays, state_shape = read_codebook(trained / "codebook", "2bit")
    old_book = write_codebook(tmp_path / "old-book", "2bit",
                              {name: values for name, values in arrays.items() if name != "centroids"}, state_shape)
    store, union = tmp_path / "store", tmp_path / "union"
    assert precompute(models["dilbert"], corpus_a, store, "--encoding", "2bit", "--codebook", str(old_book)) == 0
    assert precompute(models["dilbert"], corpus_b, store, "--encoding", "2bit", "--append") == 0
    assert not (store / "codebook" / "centroids").exists() and not list(store.rglob("centroid_ids"))
    assert precompute(models["dilbert"], write_jsonl(tmp_path / "all.jsonl", DOCUMENTS), union, "--encoding", "2bit",
                      "--codebook", str(old_book)) == 0
    assert_same_passages(store, union)
    assert verify_store(store).ok


def append_markers(store: Path) -> int:
    return len(list((store / APPENDS_DIR).glob("*/passages/meta/part-*.json")))


def test_sigkill_during_an_append_then_rerun(models: dict[str, Path], tmp_path: Path) -> None:
    corpus_a = write_jsonl(tmp_path / "a.jsonl", DOCUMENTS)
    more = [{**document, "id": f"more-{document['id']}"} for document in wiki_like_documents(120, seed=3)]
    corpus_b = write_jsonl(tmp_path / "b.jsonl", more)
    store, reference = tmp_path / "store", tmp_path / "reference"
    assert precompute(models["dilbert"], corpus_a, store) == 0
    shutil.copytree(store, reference)
    assert precompute(models["dilbert"], corpus_b, reference, "--append", "--shards", "8") == 0
    manifest = (store / MANIFEST_FILE).read_bytes()
    arguments = ["precompute", "--input", str(corpus_b), "--output", str(store), "--model", str(models["dilbert"]),
                 "--workers", "1", "--threads", "1", "--max-length", "48", "--shards", "8", "--encoding", "fp32",
                 "--no-progress", "--append"]
    started = time.monotonic()
    process = killable_command(arguments, tmp_path / "killed.log", tmp_path / "killed.tmp")  # no 6-10 s of imports
    while append_markers(store) == 0 and process.poll() is None and time.monotonic() - started < 240:
        time.sleep(0.005)
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGKILL)
    process.wait(timeout=60)
    assert (store / MANIFEST_FILE).read_bytes() == manifest, "the append committed before the kill"
    assert append_markers(store) >= 1 and verify_store(store).ok
    assert cli.main(arguments) == 0
    assert_same_passages(store, reference)
    assert verify_store(store).ok
    assert [path.name for path in (store / APPENDS_DIR).iterdir()] == [
        path.name for path in (reference / APPENDS_DIR).iterdir()
    ]
    assert not (store / "index").exists()


def test_an_append_killed_while_it_wrote_the_manifest_leaves_no_file_once_run_again(
    models: dict[str, Path], tmp_path: Path
) -> None:
    """(state56 F2) An append killed while it wrote the new manifest (its commit point) left the manifest's temporary
    at the store's root; the same command run again committed the append but kept that file, which `verify` then
    listed as untracked for good (finalize removes it; an append's commit did not look at the root)."""
    store = tmp_path / "store"
    assert precompute(models["dilbert"], write_jsonl(tmp_path / "a.jsonl", DOCUMENTS[:6]), store) == 0
    killed_while_writing(store / MANIFEST_FILE)
    assert len(list(store.glob(".tmp-manifest.json.*"))) == 1 and verify_store(store).untracked
    assert precompute(models["dilbert"], write_jsonl(tmp_path / "b.jsonl", DOCUMENTS[6:]), store, "--append") == 0
    report = verify_store(store)
    assert report.ok and report.untracked == [], (report.problems, report.untracked)
    assert store_info(store)["passages"] == len(DOCUMENTS)


@pytest.mark.parametrize("first_stored_by", ["the build", "an earlier append"])
def test_replace_retires_the_passages_a_shorter_new_version_no_longer_has(
    models: dict[str, Path], tmp_path: Path, first_stored_by: str
) -> None:
    """The old version's passages may lie in the store's own tables or in an earlier append's (mut51c P34): a
    shorter new version retires them wherever they are, so no text of the old one stays reachable."""
    long = {"id": "long", "title": "Long", "text": " ".join(["harbour"] * 40 + ["ropes"] * 40 + ["gulls"] * 170)}
    store = tmp_path / "store"
    if first_stored_by == "the build":
        assert precompute(models["dilbert"], write_jsonl(tmp_path / "a.jsonl", [*DOCUMENTS[:3], long]), store) == 0
    else:
        assert precompute(models["dilbert"], write_jsonl(tmp_path / "a.jsonl", DOCUMENTS[:3]), store) == 0
        assert precompute(models["dilbert"], write_jsonl(tmp_path / "b.jsonl", [long]), store, "--append") == 0
    stored = [passage_id for passage_id in store_contents(store) if passage_id.startswith("long#")]
    assert len(stored) > 1
    short = {**long, "text": "the harbour was closed"}
    assert precompute(models["dilbert"], write_jsonl(tmp_path / "c.jsonl", [short]), store,
                      "--append", "--replace") == 0
    contents = store_contents(store)
    assert [passage_id for passage_id in contents if passage_id.startswith("long#")] == ["long#0"]
    assert contents["long#0"][1] == "the harbour was closed"
    with open_store(store) as opened:
        assert len(opened) == 4 and opened.manifest.superseded_passages == len(stored)
    assert verify_store(store).ok


@pytest.mark.parametrize(("damage", "told"), [
    ("forged", "rows name a document their passage id does not come from"),
    ("no_doc_id", "has the columns (id: string not null, title: string not null, text: string not null)"),
])  # fmt: skip
def test_replace_refuses_a_store_whose_passage_table_does_not_describe_its_shard_before_writing(
    models: dict[str, Path], union: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], damage: str, told: str
) -> None:
    """With a table's doc_ids forged to the replaced document's, the replace superseded the unrelated passages too
    and exited 0; a table without doc_id failed only at the run's end (hostile47 F8). Now: one line, exit 2, the
    store untouched and no append folder."""
    store = Path(shutil.copytree(union, tmp_path / "store"))
    table = store / "passages" / "part-00000.parquet"
    columns = {name: passage_column(table, name) for name in PASSAGE_SCHEMA.names}
    assert set(columns["doc_id"]) != {DOCUMENTS[3]["id"]}  # some row of another document
    if damage == "forged":
        table.write_bytes(passage_table_bytes([dataclasses.replace(row, doc_id=DOCUMENTS[3]["id"]) for row in (
            Passage(*values) for values in zip(*columns.values(), strict=True))]))  # fmt: skip
    else:
        table.write_bytes(pa_table_bytes({name: values for name, values in columns.items() if name != "doc_id"}))
    manifest = (store / MANIFEST_FILE).read_bytes()
    changed = write_jsonl(tmp_path / "changed.jsonl", [{**DOCUMENTS[3], "text": "the tower was rebuilt"}])
    assert precompute(models["dilbert"], changed, store, "--append", "--replace") == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and f"cannot replace documents in {store}: {table}: " in error and told in error
    assert (store / MANIFEST_FILE).read_bytes() == manifest and not (store / APPENDS_DIR).exists()


def pa_table_bytes(columns: dict[str, list[str]]) -> bytes:
    """Parquet of `columns`, each with its type in the passage table's schema."""
    sink = io.BytesIO()
    pq.write_table(pa.table(columns, schema=pa.schema([PASSAGE_SCHEMA.field(name) for name in columns])), sink)
    return sink.getvalue()


def test_replace_from_a_newer_dump_retires_the_pages_it_now_skips(models: dict[str, Path], tmp_path: Path) -> None:
    """A refresh kept the passages of pages the newer dump made a redirect or a disambiguation page, and exited 0
    (wiki45 M2): it stored nothing of them, so nothing replaced them. A plain --append leaves them."""
    from tests.pipelines.test_corpora import page, write_dump

    prose = "is a word of the old dump with enough text to be a passage of its own"
    old = write_dump(tmp_path / "old.xml", "".join(page(number, title, f"'''{title}''' {prose}.")
                                                   for number, title in ((1, "Alpha"), (2, "Beta"), (3, "Gamma"))))
    new = write_dump(tmp_path / "new.xml", page(2, "Beta", "#REDIRECT [[Alpha]]", redirect=True)
                     + page(3, "Gamma", "'''Gamma''' may mean:\n* [[Gamma ray]]\n{{disambiguation}}")
                     + page(4, "Delta", f"'''Delta''' {prose}."))
    kept = tmp_path / "kept"
    assert precompute(models["dilbert"], old, kept) == 0
    plain = tmp_path / "plain"
    shutil.copytree(kept, plain)
    assert precompute(models["dilbert"], new, plain, "--append") == 0
    assert {passage_id.split("#")[0] for passage_id in store_contents(plain)} == {"1", "2", "3", "4"}
    assert precompute(models["dilbert"], new, kept, "--append", "--replace") == 0
    assert {passage_id.split("#")[0] for passage_id in store_contents(kept)} == {"1", "4"}
    assert read_manifest(StoreLocation.parse(kept)).appends[-1]["summary"]["superseded"] == 2  # said (review45b L3)
    assert "superseded" not in read_manifest(StoreLocation.parse(plain)).appends[-1]["summary"]
    with open_store(kept) as opened:
        assert opened.manifest.superseded_passages == 2
    assert verify_store(kept).ok


def test_a_stop_after_finish_put_the_store_or_append_in_place_says_so(
    models: dict[str, Path], tmp_path: Path
) -> None:
    """Finish runs on in a Dask worker while an interrupted launcher unwinds: a stop that came after it had
    finalized the store, or committed the append, said "run the same command again to go on", and the re-run only
    said "already complete" (dask37 L3)."""
    corpus_a = write_jsonl(tmp_path / "a.jsonl", DOCUMENTS[:6])
    corpus_b = write_jsonl(tmp_path / "b.jsonl", DOCUMENTS[6:])
    store = tmp_path / "store"
    assert precompute(models["dilbert"], corpus_a, store) == 0
    assert precompute(models["dilbert"], corpus_b, store, "--append") == 0
    committed = json.loads((store / MANIFEST_FILE).read_text())["appends"][0]["generation"]
    built = PrecomputeJob(inputs=(), store=str(store), strategy="words", num_shards=3, max_length=48, model="unused",
                          fingerprint=open_store(store).fingerprint, policy=BatchPolicy(), threads=1,
                          runner="DirectRunner", started_at=0.0)
    appended = dataclasses.replace(built, store=str(store / APPENDS_DIR / "other"), append_to=str(store))
    cases = {
        "finalized": (built, f"stopped by SIGTERM after the run had finished: {store} is complete"),
        "unfinalized": (dataclasses.replace(built, store=str(tmp_path / "half")), "stopped by SIGTERM; run the same"),
        "a replacement": (dataclasses.replace(built, destination=str(tmp_path / "old")), "stopped by SIGTERM; run"),
        "committed": (dataclasses.replace(appended, generation=committed),
                      f"stopped by SIGTERM after the run had finished: {store} holds this append"),
        "uncommitted": (dataclasses.replace(appended, generation="0" * 16), "stopped by SIGTERM; run the same"),
    }
    for case, (job, words) in cases.items():
        stop = stopped(job, Terminated(signal.SIGTERM))
        assert str(stop).startswith(words), (case, str(stop))
        assert stop.signal_number == signal.SIGTERM


def test_the_superseded_count_of_a_replace_counts_each_stored_passage_once(tmp_path: Path) -> None:
    """A document replaced by a second --append --replace has its passage ids in the store's table and in the first
    append's (`retired_passages` lists both): the summary said 2 passages superseded where the replace took out 1."""
    shards = random_shards([3, 2], state_shape=(4,), seed=11)
    store = build_store(tmp_path / "store", shards)
    stored = {record.id for records in shards for record in records}
    for retired in (["s0/p0", "s0/p0"], ["s0/p0", "s1/p1", "s0/p0", "s1/p1", "s1/p1"], ["gone#0", "gone#0", "s0/p2"],
                    [], ["gone#0"]):
        assert _stored_count(store, retired) == len(set(retired) & stored), retired
