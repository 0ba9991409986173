"""`dilstore precompute` end to end on the DirectRunner, with a tiny random reader.

One run over a corpus with every kind of bad record checks the store, the
passage table, the pyserini collection, the dead letters, the summary and the
Beam metrics against each other and against the model run directly; a
multi-processing run and a zstd-compressed run must give the same store; and
the command's refusals exit 2 with a message.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pyarrow.parquet as pq
import pytest
import zarr
from apache_beam.metrics.metric import MetricsFilter
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors.numpy import load_file, save_file

from dilstore.pipelines.corpora import Document, read_corpus
from dilstore.pipelines.job import prepare_store, run_spec, spec_differences
from dilstore.pipelines.options import LocalDefaults, assemble_beam_flags, pipeline_options
from dilstore.pipelines.precompute import NAMESPACE, build_pipeline
from dilstore.pipelines.routing import SHARD, ReadTask, RouteSettings, route
from dilstore.pipelines.spec_file import SUMMARY_FILE, read_spec, spec_generation, spec_json
from dilstore.reader.batching import BatchPolicy
from dilstore.reader.offline.encoding import encode_tokenized, load_reader
from dilstore.runners import cli
from dilstore.runners.cmd_precompute import build_job
from dilstore.runners.quiet import quiet_beam_logging, quiet_dask_logging
from dilstore.storage.codebook import CODEBOOK_DIR, read_codebook, write_codebook
from dilstore.storage.encodings import train_codebook
from dilstore.storage.errors import DilstoreError
from dilstore.storage.format import SPEC_FILE
from dilstore.storage.reader import open_store
from dilstore.storage.replacement import building_dir
from dilstore.storage.verify import verify_store
from dilstore.storage.writer import shard_generation
from tests.fixtures.pipeline_fixtures import (
    ROOT,
    TINY_LAYERS,
    TINY_MAX_POSITIONS,
    save_tiny_reader,
    store_contents,
    wiki_like_documents,
    write_jsonl,
)
from tests.fixtures.store_fixtures import build_store, random_shards

MAX_LENGTH = 48
SHARDS = 3
GOOD_FIXTURE_IDS = {"d1", "d2", "10", "d12"}
# Line of tests/data/bad-records.jsonl (plus the 10 MB document appended as line 13, and lone surrogates in
# a text, an id and a title as lines 14-16) → words in its reason.
BAD_LINES = {3: "bad JSON", 4: "missing id", 5: "duplicate id 'd1'", 6: "empty text", 7: "invalid UTF-8",
             8: "bad record", 11: "bad record", 13: "too large", 14: "text holds a lone surrogate",
             15: "id holds a lone surrogate", 16: "title holds a lone surrogate"}


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_reader(tmp_path_factory.mktemp("tiny-reader"))


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Good wiki-like documents, then tests/data/bad-records.jsonl's lines, a 10 MB document and lone surrogates."""
    folder = tmp_path_factory.mktemp("corpus")
    good = write_jsonl(folder / "good.jsonl", wiki_like_documents(24))
    bad = folder / "bad.jsonl"
    shutil.copy(ROOT / "tests" / "data" / "bad-records.jsonl", bad)
    with bad.open("a", encoding="utf-8") as stream:
        stream.write(json.dumps({"id": "huge", "text": "word " * 2_100_000}) + "\n")
        stream.write('{"id": "s1", "text": "half a pair \\ud800 here"}\n')
        stream.write('{"id": "s\\udc00", "text": "a fine text"}\n')
        stream.write('{"id": "s3", "title": "T\\ud800", "text": "a fine text"}\n')
    return folder / good.name, bad


def precompute_args(corpus: tuple[Path, Path], tiny_dir: Path, store: Path, *extra: str) -> list[str]:
    good, bad = corpus
    return ["precompute", "--input", str(good), "--input", str(bad), "--format", "jsonl", "--output", str(store),
            "--model", str(tiny_dir), "--shards", str(SHARDS), "--max-length", str(MAX_LENGTH), "--threads", "1",
            "--batch-tokens", "512", "--encoding", "fp32", *extra]


@pytest.fixture(scope="module")
def metered_run(tmp_path_factory: pytest.TempPathFactory, corpus, tiny_dir: Path):
    """One in-process in-memory DirectRunner run, with a $TMPDIR of its own; (store, summary, Beam metrics
    counters, what the run left in $TMPDIR)."""
    store = tmp_path_factory.mktemp("runs") / "in-memory"
    temp = tmp_path_factory.mktemp("tmpdir")
    args = cli.build_parser().parse_args(precompute_args(corpus, tiny_dir, store, "--workers", "1"))
    job = build_job(args, time.time(), "DirectRunner", None)
    assert prepare_store(Path(job.store), run_spec(job), overwrite=False) is False
    options = pipeline_options(assemble_beam_flags("DirectRunner", [], LocalDefaults(workers=1)))
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TMPDIR", str(temp))
        patch.setattr(tempfile, "tempdir", None)  # read again from $TMPDIR
        result = build_pipeline(job, options).run()
        result.wait_until_finish()
    counters = {
        counter.key.metric.name: counter.committed
        for counter in result.metrics().query(MetricsFilter().with_namespace(NAMESPACE))["counters"]
    }
    summary = json.loads((store / SUMMARY_FILE).read_text(encoding="utf-8"))
    return store, summary, counters, sorted(path.name for path in temp.iterdir())


def test_a_direct_run_leaves_nothing_in_tmpdir(metered_run) -> None:
    """Beam's DirectRunner first tried Prism, which fetches a binary from GitHub; offline it failed and left a
    beam-temp* and two tmp* folders in $TMPDIR on every run, before falling back to the FnApiRunner (tests39 H1)."""
    assert metered_run[3] == []


def expected_units(corpus, tiny_dir: Path):
    """Every stored unit the corpus should give, tokenized and encoded directly (no Beam)."""
    reader = load_reader(str(tiny_dir), "dilbert", TINY_LAYERS)
    documents = {}
    for path in corpus:
        for record in read_corpus(path, "jsonl"):
            if isinstance(record, Document):
                documents.setdefault(record.id, record)
    settings = RouteSettings(strategy="words", num_shards=SHARDS, max_length=MAX_LENGTH, kind="dilbert")
    units = [value for doc in documents.values() for key, value in route(doc, settings, reader.tokenizer)
             if key[0] == SHARD]
    return documents, {record.id: record for record in encode_tokenized(reader, "dilbert", units, BatchPolicy())}


def test_the_store_holds_every_good_passage_as_the_model_computes_it(metered_run, corpus, tiny_dir: Path) -> None:
    store, summary, _, _ = metered_run
    documents, expected = expected_units(corpus, tiny_dir)
    assert GOOD_FIXTURE_IDS <= set(documents)
    stored = store_contents(store)
    assert sorted(stored) == sorted(expected)
    for passage_id, (title, text, token_ids, spans, states) in stored.items():
        record = expected[passage_id]
        assert (title, text) == (record.title, record.text)
        np.testing.assert_array_equal(token_ids, record.token_ids)
        np.testing.assert_array_equal(spans, record.char_spans)
        np.testing.assert_allclose(states, record.states, rtol=1e-5, atol=1e-5)
    assert verify_store(store).ok


def test_store_parquet_and_collection_hold_the_same_ids(metered_run) -> None:
    store, _, _, _ = metered_run
    table = pq.read_table(sorted((store / "passages").glob("part-*.parquet"))).to_pylist()
    collection = [json.loads(line) for path in sorted((store / "passages" / "jsonl").glob("*.jsonl"))
                  for line in path.read_text(encoding="utf-8").splitlines()]
    stored = store_contents(store)
    assert sorted(row["id"] for row in table) == sorted(row["id"] for row in collection) == sorted(stored)
    for row in table:
        assert (row["title"], row["text"]) == stored[row["id"]][:2]
        assert row["id"].split("#")[0] == row["doc_id"]
    assert all(row["contents"] == "\n".join(stored[row["id"]][:2]) for row in collection)


def test_every_bad_record_is_dead_lettered_with_its_reason(metered_run, corpus) -> None:
    store, summary, _, _ = metered_run
    letters = [json.loads(line) for path in sorted((store / "rejected").glob("part-*.jsonl"))
               for line in path.read_text(encoding="utf-8").splitlines()]
    assert all(set(letter) == {"source", "line_or_id", "reason"} for letter in letters)
    by_line = {letter["line_or_id"]: letter["reason"] for letter in letters if letter["source"] == str(corpus[1])}
    assert set(by_line) == set(BAD_LINES)
    for line, words in BAD_LINES.items():
        assert words in by_line[line], (line, by_line[line])
    assert summary["rejected"] == len(letters) == len(BAD_LINES)
    stored_docs = {passage_id.split("#")[0] for passage_id in store_contents(store)}
    assert GOOD_FIXTURE_IDS <= stored_docs and "huge" not in stored_docs


def test_summary_and_beam_metrics_agree(metered_run) -> None:
    store, summary, counters, _ = metered_run
    assert {"documents", "passages", "tokens", "rejected", "shards", "seconds", "runner"} <= set(summary)
    stored = store_contents(store)
    assert summary["passages"] == len(stored) == counters["passages"]
    assert summary["tokens"] == sum(len(value[2]) for value in stored.values()) == counters["tokens"]
    assert summary["documents"] == 24 + len(GOOD_FIXTURE_IDS) == counters["documents"]
    assert counters["documents_read"] == summary["documents"] + 1  # the duplicate d1 is read, then rejected
    assert summary["rejected"] == counters["rejected"]
    assert summary["shards"] == counters["shards_written"] == SHARDS
    assert summary["bytes"] == counters["bytes_written"] > 0
    assert summary["long_passages"] > 0 and summary["runner"] == "DirectRunner" and summary["seconds"] > 0


def test_multi_processing_gives_the_same_store_and_no_library_noise(
    metered_run, corpus, tiny_dir: Path, tmp_path: Path, capfd
) -> None:
    """Two Beam worker processes, which log on their own stderr (apitools, logging handlers): quiet by default,
    nothing reaches descriptor 2 (tests/runners/test_quiet.py shows --verbose lets those lines through)."""
    reference, summary, _, _ = metered_run
    store = tmp_path / "multi"
    assert cli.main([*precompute_args(corpus, tiny_dir, store, "--workers", "2"), "--json", "--no-progress"]) == 0
    out, err = capfd.readouterr()
    assert err.strip() == "", err
    printed = json.loads(out)
    assert printed["runner"] == "DirectRunner" and printed["passages"] == summary["passages"]
    options = json.loads((store / "manifest.json").read_text())["creation"]["command"]
    assert "--workers 2" in options
    mine, theirs = store_contents(store), store_contents(reference)
    assert sorted(mine) == sorted(theirs)
    for passage_id, values in mine.items():
        for left, right in zip(values, theirs[passage_id], strict=True):
            assert np.array_equal(left, right) if isinstance(left, np.ndarray) else left == right
    # Which dead-letter part a record lands in hashes its source path (a temporary folder here), so compare them all.
    rejected = sorted(f"rejected/{path.name}" for path in (reference / "rejected").glob("*.jsonl"))
    assert rejected and rejected == sorted(f"rejected/{path.name}" for path in (store / "rejected").glob("*.jsonl"))
    same_files = ["passages/part-00000.parquet", "passages/jsonl/part-00001.jsonl", *rejected]
    for name in same_files:
        assert (store / name).read_bytes() == (reference / name).read_bytes(), name


def test_an_in_process_run_gives_the_caller_its_torch_threads_back(corpus, tiny_dir: Path, tmp_path: Path) -> None:
    """The DoFns set --threads in the process they run in; with --workers 1 that is the caller's."""
    import torch

    assert torch.get_num_threads() == 1
    args = precompute_args(corpus, tiny_dir, tmp_path / "store", "--workers", "1", "--no-progress")
    args[args.index("--threads") + 1] = "2"
    assert cli.main(args) == 0
    assert torch.get_num_threads() == 1


def test_a_zstd_store_holds_the_same_passages_verifies_and_says_so(
    metered_run, corpus, tiny_dir: Path, tmp_path: Path, capsys
) -> None:
    reference, _, _, _ = metered_run
    store = tmp_path / "zstd"
    zstd = precompute_args(corpus, tiny_dir, store, "--workers", "1", "--no-progress", "--compression", "zstd")
    assert cli.main(zstd) == 0
    mine, theirs = store_contents(store), store_contents(reference)
    assert sorted(mine) == sorted(theirs)
    for passage_id, values in mine.items():
        for left, right in zip(values, theirs[passage_id], strict=True):
            assert np.array_equal(left, right) if isinstance(left, np.ndarray) else left == right
    with pytest.raises(DilstoreError, match="compressed with zstd"):
        open_store(store, read_path="mmap")
    capsys.readouterr()
    assert cli.main(["verify", str(store)]) == 0
    assert capsys.readouterr().out.endswith("OK\n")
    assert cli.main(["info", "--json", str(store)]) == 0
    assert json.loads(capsys.readouterr().out)["compressor"] == "zstd"
    assert json.loads((reference / "manifest.json").read_text())["compressor"] is None
    uncompressed = precompute_args(corpus, tiny_dir, store, "--workers", "1", "--no-progress")
    assert cli.main(uncompressed) == 2
    assert "differs in: compression: the store's 'zstd', this run's none" in capsys.readouterr().err


def test_a_rerun_of_a_complete_store_changes_nothing(metered_run, corpus, tiny_dir: Path, capsys,
                                                     tmp_path: Path) -> None:
    store, _, _, _ = metered_run
    manifest = (store / "manifest.json").read_bytes()
    assert cli.main(precompute_args(corpus, tiny_dir, store, "--workers", "1", "--no-progress")) == 0
    err = capsys.readouterr().err
    assert "already complete" in err
    assert f"{len(BAD_LINES)} record(s) rejected: {store / 'rejected'}/ says why, one JSON line each" in err
    assert (store / "manifest.json").read_bytes() == manifest
    moved = tmp_path / "moved store"
    shutil.copytree(store, moved)
    assert cli.main(precompute_args(corpus, tiny_dir, moved, "--workers", "1", "--no-progress", "--json")) == 0
    captured = capsys.readouterr()
    assert "already complete" in captured.err and json.loads(captured.out)["store"] == str(moved)
    assert json.loads(captured.out)["already_complete"] is True  # the old summary alone looked like a run (storage43)
    assert "rejected" not in captured.err  # --json's summary says where: rejected_records
    assert cli.main(precompute_args(corpus, tiny_dir, moved, "--workers", "1", "--no-progress")) == 0
    assert f"record(s) rejected: {moved / 'rejected'}/ says why" in capsys.readouterr().err  # where it is now
    (moved / "run-summary.json").write_text('{"documents": 3', encoding="utf-8")  # cut short: a traceback before
    assert cli.main(precompute_args(corpus, tiny_dir, moved, "--workers", "1", "--no-progress")) == 2
    assert f"{moved / 'run-summary.json'}: not valid JSON" in capsys.readouterr().err


def test_the_progress_bar_shows_passages_per_second(corpus, tiny_dir: Path, tmp_path: Path, capsys) -> None:
    good, _ = corpus
    args = ["precompute", "--input", str(good), "--output", str(tmp_path / "s"), "--model", str(tiny_dir),
            "--shards", "2", "--max-length", str(MAX_LENGTH), "--workers", "1"]
    assert cli.main(args) == 0
    captured = capsys.readouterr()
    passages = json.loads((tmp_path / "s" / SUMMARY_FILE).read_text())["passages"]
    assert "passage/s" in captured.err and f"{passages}/{passages}" in captured.err
    assert "precompute summary" in captured.out


REDIRECT_ONLY_DUMP = ('<mediawiki><page><title>A</title><ns>0</ns><id>1</id><redirect title="B" />'
                      "<revision><text>#REDIRECT [[B]]</text></revision></page></mediawiki>")  # fmt: skip


@pytest.mark.parametrize(("name", "lines", "extra", "told"), [
    ("c.jsonl", [], [], "0 document(s) accepted, 0 record(s) rejected; check --input"),
    ("c.jsonl", ['{"id": "a", "text": "fine"}'], ["--format", "squad"],
     "1 record(s) rejected (see {store}/rejected/ for why)"),
    ("c.xml", [REDIRECT_ONLY_DUMP], [],
     "0 document(s) accepted, 1 left out on purpose (Wikipedia redirects and non-article pages), 0 record(s) rejected"),
])  # fmt: skip
def test_a_build_that_stores_no_passage_exits_1_and_says_why(
    tiny_dir: Path, tmp_path: Path, capsys, name: str, lines: list[str], extra: list[str], told: str
) -> None:
    """An empty input, only dead letters or only redirects finalize an empty store; a script must not take it for
    success. `index` and `ask` then say the store is empty (they sent the user to each other)."""
    corpus = tmp_path / name
    corpus.write_text("".join(line + "\n" for line in lines))
    store = tmp_path / "s"
    args = ["precompute", "--input", str(corpus), "--output", str(store), "--model", str(tiny_dir),
            "--max-length", str(MAX_LENGTH), "--workers", "1", "--no-progress", *extra]  # fmt: skip
    assert cli.main(args) == 1
    err = capsys.readouterr().err
    assert "dilstore precompute: error: no passage was stored: " in err and told.format(store=store) in err
    assert cli.main(["index", str(store)]) == 2
    empty = f"{store} holds no passages (its precompute stored none)"
    assert capsys.readouterr().err.endswith(f"{empty}: there is nothing to index\n")
    assert cli.main(["ask", str(store), "Who?", "--model", str(tiny_dir)]) == 2
    assert capsys.readouterr().err.endswith(f"store {empty}: nothing to search\n")
    assert cli.main(["info", str(store)]) == 0
    assert "bytes/token  dilbert n/a (no tokens)\n" in capsys.readouterr().out  # was Python's "None"


def refused_precompute(tiny_dir: Path, tmp_path: Path, capsys, *extra: str) -> str:
    """Run `precompute` of the tiny model into tmp_path/s from tmp_path; check that it exits 2 and return its stderr.

    `extra` options come last; a small corpus is added unless they name --input.
    """
    args = ["precompute", "--model", str(tiny_dir), "--output", str(tmp_path / "s"), "--no-progress", *extra]
    if "--input" not in extra:
        args += ["--input", str(write_jsonl(tmp_path / "c.jsonl", wiki_like_documents(2)))]
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(tmp_path)
        assert cli.main(args) == 2
    return capsys.readouterr().err


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--input", "/no/such/corpus.jsonl"], "input file not found"),
        (["--input", "/dev/null", "--format", "jsonl"], "--input /dev/null is not a regular file"),
        (["--input", "docs.jsonl", "--input", "./docs.jsonl"], "--input ./docs.jsonl is given twice (as docs.jsonl "
         "before it: the same file)"),
        (["--input", "docs.jsonl", "--input", "docs.jsonl"], "--input docs.jsonl is given twice\n"),
        (["--input", ""], "--input is empty; give a corpus file"),  # was "--input . is a directory"
        (["--input", "doc*.jsonl"], "input file not found: doc*.jsonl (dilstore does not expand wildcards"),
        (["--shards", "16385"], "--shards 16385 is more than 16384"),
        (["--encoding", "2bit", "--codebook", "book7"], "--codebook book7 is for states of shape (7,), but this "
         "model's dilbert states have shape (32,): give the codebook of a store of this model and kind (dilbert)"),
        (["--input", "corpus.txt"], "cannot tell the corpus format"),
        (["--kind", "earl-s1"], "holds a 'dilbert' checkpoint, which makes dilbert stores; earl-s1 stores need"),
        (["--bogus_beam_flag", "1"], "unknown Beam option"),
        (["--runner", "sparkle"], "unknown runner"),
        (["--max-length", "4096"], "exceeds the model's"),
    ],
)
def test_user_errors_exit_2_with_a_message(tiny_dir: Path, tmp_path: Path, capsys, extra, message) -> None:
    (tmp_path / "corpus.txt").write_text("x\n")
    (tmp_path / "docs.jsonl").write_text('{"id": "a", "text": "fine"}\n')
    states = np.random.default_rng(0).standard_normal((64, 7)).astype(np.float32)
    write_codebook(tmp_path / "book7", "2bit", train_codebook("2bit", states), (7,))  # found in the pipeline only
    err = refused_precompute(tiny_dir, tmp_path, capsys, "--max-length", str(MAX_LENGTH), *extra)
    assert err.startswith("dilstore precompute: error:") and message in err
    assert not (tmp_path / "s").exists()  # an unknown Beam option left s/precompute.json behind



def test_a_max_length_of_exactly_the_model_s_positions_is_taken_and_one_more_is_refused(
    tiny_dir: Path, tmp_path: Path
) -> None:
    """A BERT of N position embeddings reads segments of N tokens: --max-length N is the longest that fits."""
    corpus = write_jsonl(tmp_path / "c.jsonl", wiki_like_documents(2))
    words = ["precompute", "--input", str(corpus), "--output", str(tmp_path / "s"), "--model", str(tiny_dir)]
    args = cli.build_parser().parse_args([*words, "--max-length", str(TINY_MAX_POSITIONS)])
    assert build_job(args, time.time(), "DirectRunner", None).max_length == TINY_MAX_POSITIONS
    args = cli.build_parser().parse_args([*words, "--max-length", str(TINY_MAX_POSITIONS + 1)])
    with pytest.raises(DilstoreError, match=f"exceeds the model's {TINY_MAX_POSITIONS} positions"):
        build_job(args, time.time(), "DirectRunner", None)

def test_a_store_codebook_changed_after_finalize_is_refused_as_codebook(tiny_dir: Path, tmp_path: Path,
                                                                         capsys) -> None:
    """`--codebook STORE/codebook` was read as it was, however it had changed since STORE's finalize (codes51 F2):
    its files are checked against STORE's manifest, before any model is loaded."""
    shards = random_shards([20], state_shape=(32,), seed=5)
    book = train_codebook("2bit", np.concatenate([record.states for record in shards[0]]))
    base = build_store(tmp_path / "base", shards, encoding="2bit", codebook=book)
    zarr.open_array(str(base / CODEBOOK_DIR / "mean"), mode="r+")[0] = 10.0  # finite, a valid codebook still
    err = refused_precompute(tiny_dir, tmp_path, capsys, "--max-length", str(MAX_LENGTH), "--encoding", "2bit",
                             "--codebook", str(base / CODEBOOK_DIR))
    assert err.startswith(f"dilstore precompute: error: --codebook {base / CODEBOOK_DIR}: the codebook does not match "
                          f"{base}/manifest.json (codebook/mean/c/0 changed after finalize: its SHA-256 differs)"), err
    assert f"`dilstore verify {base}` lists what changed: put codebook/ back from a copy" in err
    assert not (tmp_path / "s").exists()


def test_a_precompute_checks_its_output_and_codebook_once(
    corpus, tiny_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """(left60 F6) `precompute` checked --output and --codebook before Beam (fast59 F3), and `build_job` checked
    them again, reading the codebook a second time, though nothing between the two touches either."""
    from dilstore.runners import cmd_precompute

    class Stop(Exception):
        """Stops the run where its model would load."""

    def resolve_model(*args: object) -> None:
        raise Stop

    checks = []
    check = cmd_precompute.check_output_and_codebook
    monkeypatch.setattr(cmd_precompute, "check_output_and_codebook", lambda args: checks.append(1) or check(args))
    monkeypatch.setattr(cmd_precompute, "resolve_model", resolve_model)
    with pytest.raises(Stop):
        cli.main(precompute_args(corpus, tiny_dir, tmp_path / "store", "--no-progress"))
    assert checks == [1]


def test_the_launcher_starts_torch_s_threads_before_it_loads_the_model(
    corpus, tiny_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """(left60 F7) The launcher loads the model for its fingerprint with torch's own thread count, and libgomp
    started those threads inside the load: under `ulimit -v 2480000` it had no room for their stacks and ended the
    process with exit 1. They are started before the load now, while there is room."""
    from dilstore.reader import threads
    from dilstore.reader.offline import encoding

    class Stop(Exception):
        """Stops the run where its model would load."""

    steps = []

    def load_reader(*args: object) -> None:
        steps.append("load")
        raise Stop

    monkeypatch.setattr(threads, "start_thread_pool", lambda: steps.append("threads"))
    monkeypatch.setattr(encoding, "load_reader", load_reader)
    args = cli.build_parser().parse_args(precompute_args(corpus, tiny_dir, tmp_path / "store"))
    with pytest.raises(Stop):
        build_job(args, time.time(), "DirectRunner", None)
    assert steps == ["threads", "load"]


def test_an_unknown_format_is_a_usage_error(capsys) -> None:
    with pytest.raises(SystemExit) as exited:
        cli.main(["precompute", "--format", "csv"])
    assert exited.value.code == 2 and "invalid choice: 'csv'" in capsys.readouterr().err


def test_help_shows_compression_and_no_machine_specific_worker_count(capsys) -> None:
    with pytest.raises(SystemExit) as exited:
        cli.main(["precompute", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert exited.value.code == 0
    assert "--compression {none,zstd,blosc}" in text and "(default none)" in text
    assert "(default: the number of CPUs this process may use, as its affinity and cgroup CPU quota allow)" in text


def test_dask_logging_stays_at_warning_after_distributed_is_imported() -> None:
    quiet_dask_logging()
    assert logging.getLogger("distributed.scheduler").getEffectiveLevel() == logging.WARNING


def test_a_quiet_remote_run_keeps_beam_s_job_lines_but_not_its_type_hint_chatter() -> None:
    """A remote run raises apache_beam to INFO for the job's URL; 50 'Converting string literal type hint' lines
    came with it."""
    beam = logging.getLogger("apache_beam")
    level = beam.level
    try:
        quiet_beam_logging()
        beam.setLevel(logging.INFO)  # what precompute_store does for a remote runner
        assert logging.getLogger("apache_beam.runners.dataflow").getEffectiveLevel() == logging.INFO
        typehints = logging.getLogger("apache_beam.typehints.native_type_compatibility")
        assert typehints.getEffectiveLevel() == logging.WARNING
    finally:
        beam.setLevel(level)


@pytest.mark.parametrize(("flags", "remote"), [([], False),
                                               (["--runner", "DataflowRunner", "--project", "p", "--region", "r",
                                                 "--temp_location", "gs://b/t", "--sdk_container_image", "i"], True)])
def test_only_a_run_whose_workers_run_elsewhere_raises_beam_to_info(
    tmp_path: Path, flags: list[str], remote: bool
) -> None:
    """(mut61 M9) The checks before torch raise apache_beam to INFO for a remote run's job URL: the test above does
    it by hand, and a local run raised to INFO (its lines on stderr), or a remote one left quiet, went unseen."""
    from dilstore.runners import cmd_precompute
    from dilstore.runners.quiet import logging_restored

    corpus = write_jsonl(tmp_path / "c.jsonl", wiki_like_documents(1))
    command = ["precompute", "--input", str(corpus), "--output", str(tmp_path / "s"), *flags]
    args = cli.parse(cli.build_parser(), command)
    with logging_restored():  # as precompute_store's, around these checks
        assert cmd_precompute._checked_before_torch(args)[3] is not remote
        assert logging.getLogger("apache_beam").level == (logging.INFO if remote else logging.ERROR)  # quiet's
    assert not (tmp_path / "s").exists()


@pytest.mark.parametrize(("flags", "quieted"), [([], ["beam", "dask"]), (["--verbose"], [])])
def test_only_a_quiet_precompute_lowers_the_libraries_logging(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, flags: list[str], quieted: list[str]
) -> None:
    """--verbose promises the libraries' logs, but Beam's and Dask's were lowered on every run."""
    from dilstore.runners import cmd_precompute

    calls: list[str] = []
    monkeypatch.setattr(cmd_precompute, "quiet_beam_logging", lambda: calls.append("beam"))
    monkeypatch.setattr(cmd_precompute, "quiet_dask_logging", lambda: calls.append("dask"))
    corpus = write_jsonl(tmp_path / "c.jsonl", wiki_like_documents(1))
    # A Beam option Beam lacks is refused after the logging is set, before anything runs (a missing --input is now
    # refused before: ci59 F2).
    assert cli.main(["precompute", "--runner", "dask", "--input", str(corpus), "--output", str(tmp_path / "s"),
                     *flags, "--bogus_option", "1"]) == 2  # fmt: skip
    assert calls == quieted


def test_a_precompute_leaves_the_callers_logging_as_it_was(tmp_path: Path) -> None:
    """A quiet run lowered Beam's and Dask's loggers and filtered the root logger for good: a Python caller logging
    through Beam of its own lost its records after one `dilstore.precompute` (api39 M4)."""
    names = ("apache_beam", "apache_beam.typehints", "apache_beam.options.pipeline_options", "distributed")
    before = [logging.getLogger(name).level for name in names], list(logging.getLogger().filters)
    corpus = write_jsonl(tmp_path / "c.jsonl", wiki_like_documents(1))  # refused, as above, after the logging is set
    assert cli.main(["precompute", "--runner", "dask", "--input", str(corpus), "--output", str(tmp_path / "s"),
                     "--bogus_option", "1"]) == 2  # fmt: skip
    assert ([logging.getLogger(name).level for name in names], list(logging.getLogger().filters)) == before


def test_a_store_of_other_settings_is_not_overwritten_unless_asked(
    metered_run, corpus, tiny_dir: Path, tmp_path: Path, capsys
) -> None:
    store, _, _, _ = metered_run
    other = tmp_path / "other"
    shutil.copytree(store, other)
    paragraphs = precompute_args(corpus, tiny_dir, other, "--split", "paragraphs", "--no-progress", "--workers", "1")
    assert cli.main(paragraphs) == 2
    assert "differs in: split: the store's 'words', this run's 'paragraphs'" in capsys.readouterr().err
    assert cli.main([*paragraphs, "--overwrite"]) == 0
    assert json.loads((other / SUMMARY_FILE).read_text())["split"] == "paragraphs"
    assert verify_store(other).ok
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    assert cli.main(precompute_args(corpus, tiny_dir, foreign, "--no-progress")) == 2
    assert "not made by `dilstore precompute`" in capsys.readouterr().err
    assert (foreign / "notes.txt").read_text() == "mine"


def test_no_arguments_means_the_embedded_corpus_default_model_and_a_store_here(tmp_path: Path, capsys) -> None:
    from dilstore.pipelines.default_corpus import default_corpus_path

    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(tmp_path)
        args = cli.build_parser().parse_args(["precompute"])
        job = build_job(args, time.time(), "DirectRunner", None)
    assert [task.path for task in job.inputs] == [str(default_corpus_path())]
    assert job.inputs[0].format == "jsonl" and job.store == str(tmp_path / "dilstore-store")
    assert job.model.startswith("package:") and job.layers >= 1
    assert (job.strategy, job.encoding, job.kind, job.max_length) == ("words", "fp16", "dilbert", 384)
    if job.model == "package:base-model":
        assert "using the base model" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--input", "https://example.org/corpus.jsonl"], "--input https://example.org/corpus.jsonl: URLs are not"),
        (["--input", "."], "is a directory; give the corpus files"),
        (["--max-length", "1"], "--max-length 1 is too short"),
        (["--layers", str(TINY_LAYERS + 1)], f"trained with k = {TINY_LAYERS}, not {TINY_LAYERS + 1}"),
        (["--format", "msmarco"], "--format msmarco does not fit"),
        (["--format", "wikipedia"], "wikipedia files hold XML, but it begins '{"),
        (["--encoding", "2bit", "--codebook", "s3://bucket/codebook"], "--codebook s3://bucket/codebook: URLs are not"),
        (["--codebook", "elsewhere/codebook"], "--codebook is for the 2bit and 1bit encodings, not fp16"),
    ],
)
def test_bad_inputs_are_usage_errors_before_anything_is_written(
    tiny_dir: Path, tmp_path: Path, capsys, extra: list[str], message: str
) -> None:
    """Each stops with exit 2 and one line naming the problem, and the store folder is never created."""
    err = refused_precompute(tiny_dir, tmp_path, capsys, *extra)
    assert message in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert not (tmp_path / "s").exists()


@pytest.mark.parametrize(
    ("output", "message"),
    [
        (["--output", "c.jsonl"], "--output c.jsonl: is a file, not a folder"),  # was "Not a directory: ..."
        (["--output", "outer/inner"],
         "--output outer/inner is inside the store {tmp}/outer; put the new store elsewhere"),
        (["--output", "deep/er/s", "--append"], "no store at {tmp}/deep/er/s"),  # its refusal made deep/er/
    ],
)
def test_an_output_that_cannot_be_a_store_is_refused_before_the_lock(
    tiny_dir: Path, tmp_path: Path, capsys, output: list[str], message: str
) -> None:
    """The write lock beside the store created the folders above it, and a store inside another swelled that one."""
    (tmp_path / "outer").mkdir()
    (tmp_path / "outer" / "manifest.json").write_text('{"format": "dilstore-store"}')
    err = refused_precompute(tiny_dir, tmp_path, capsys, *output)
    assert err == f"dilstore precompute: error: {message.format(tmp=tmp_path)}\n"
    assert sorted(path.name for path in tmp_path.iterdir()) == ["c.jsonl", "outer"]
    assert list((tmp_path / "outer").iterdir()) == [tmp_path / "outer" / "manifest.json"]


@pytest.mark.parametrize("output", ["n" * 240, "/".join(["d" * 200] * 20)], ids=["long name", "deep path"])
def test_a_store_path_too_long_for_the_files_of_a_store_is_refused_before_any_work(
    tiny_dir: Path, tmp_path: Path, capsys, output: str
) -> None:
    """(port58 F3) A path that fitted only the folder ran the whole encoding and failed at its first shard's write
    ("File name too long" and a 4,000-byte path); a 240-byte name failed on ".NAME.dilstore-lock", a file the user
    never named. Both are refused by name before any folder is made."""
    err = refused_precompute(tiny_dir, tmp_path, capsys, "--output", output)
    assert err.startswith(f"dilstore precompute: error: --output {output}: its ") and "give a shorter" in err
    assert len(err.strip().splitlines()) == 1
    assert sorted(path.name for path in tmp_path.iterdir()) == ["c.jsonl"]


def test_only_a_dilstore_store_above_the_output_refuses_it(tmp_path: Path) -> None:
    """Any manifest.json above --output refused it, a web app's too; a store being built (its spec) counts."""
    from dilstore.runners.outputs import refuse_store_inside_store

    (tmp_path / "app").mkdir()
    (tmp_path / "app" / "manifest.json").write_text('{"name": "my web app", "version": "1.0"}')
    refuse_store_inside_store(tmp_path / "app" / "stores" / "wiki", "--output")
    (tmp_path / "building").mkdir()
    (tmp_path / "building" / "precompute.json").write_text('{"inputs": [], "fingerprint": {}}')
    with pytest.raises(DilstoreError, match="is inside the store .*building; put the new store elsewhere"):
        refuse_store_inside_store(tmp_path / "building" / "sub", "--output")


def test_a_manifest_above_the_output_nested_deeper_than_the_stack_is_no_store(tmp_path: Path) -> None:
    """Another tool's manifest.json (or a precompute.json) above --output holding JSON nested 100,000 deep ended
    precompute, compact --output and train in a RecursionError traceback (complex61 F7): it is no store's, as a
    file that is not JSON is not."""
    from dilstore.runners.outputs import refuse_store_inside_store

    deep = "[" * 100_000 + "]" * 100_000
    (tmp_path / "app").mkdir()
    for name in ("manifest.json", "precompute.json"):
        (tmp_path / "app" / name).write_text(f'{{"format": {deep}}}')
    refuse_store_inside_store(tmp_path / "app" / "stores" / "wiki", "--output")


def test_an_input_edited_in_place_is_a_new_spec(tmp_path: Path) -> None:
    """Same size, new content: the spec differs by the modification time, so the store is not called complete."""
    corpus = write_jsonl(tmp_path / "c.jsonl", wiki_like_documents(2))
    job = SimpleNamespace(inputs=[ReadTask(str(corpus), "jsonl")], strategy="words", num_shards=2,
                          fingerprint=SimpleNamespace(to_dict=lambda: {}), compressor=None, codebook=None)  # fmt: skip
    before = run_spec(job)
    text = corpus.read_text(encoding="utf-8")
    os.utime(corpus, ns=(before["inputs"][0]["mtime_ns"] + 10**9,) * 2)
    corpus.write_text(text.replace("a", "b", 1), encoding="utf-8")
    after = run_spec(job)
    assert after["inputs"][0]["bytes"] == before["inputs"][0]["bytes"]
    assert spec_differences(before, after) == ["inputs"]


def test_the_store_records_the_generation_of_its_spec(metered_run) -> None:
    """The manifest and every shard name the build: the hash of the run's spec file."""
    store, _, _, _ = metered_run
    spec = json.loads((store / SPEC_FILE).read_text(encoding="utf-8"))
    manifest = json.loads((store / "manifest.json").read_text(encoding="utf-8"))
    assert manifest["generation"] == spec_generation(spec)
    assert {shard_generation(store, entry["index"]) for entry in manifest["shards"]} == {manifest["generation"]}


@settings(max_examples=30)
@given(items=st.dictionaries(st.text(min_size=1, max_size=6), st.integers() | st.text(max_size=6), min_size=2,
                             max_size=6), seed=st.randoms(use_true_random=False))
def test_a_spec_s_generation_does_not_depend_on_the_order_of_its_keys(items: dict, seed) -> None:
    """The build id is the hash of the spec's content: a spec read back from its file (or put together in another
    order) names the same build, so a resumed run or a compaction of it is not taken for another build."""
    keys = list(items)
    seed.shuffle(keys)
    shuffled = {key: items[key] for key in keys}
    assert spec_generation(shuffled) == spec_generation(items)
    assert spec_json(shuffled) == spec_json(items)
    assert list(json.loads(spec_json(shuffled))) == sorted(items)


def test_a_spec_file_that_is_not_utf8_is_named_as_unreadable(tmp_path: Path) -> None:
    (tmp_path / SPEC_FILE).write_bytes(b'{"k": "\xff\xfe"}\n')
    with pytest.raises(DilstoreError, match=r"precompute\.json: cannot read the earlier run's settings: 'utf-8' codec"):
        read_spec(tmp_path)
    (tmp_path / SPEC_FILE).write_text('{"k": 8}\n', encoding="utf-8")
    assert read_spec(tmp_path) == {"k": 8}


def test_a_spec_file_with_a_number_too_long_for_python_is_named(tmp_path: Path) -> None:
    """(fuzz60 F3) A number of over 4,300 digits in precompute.json raised Python's ValueError, which the reader
    did not take for a damaged file."""
    (tmp_path / SPEC_FILE).write_text('{"k": ' + "8" * 5000 + "}\n", encoding="utf-8")
    with pytest.raises(DilstoreError, match=r"precompute\.json: cannot read the earlier run's settings: Exceeds"):
        read_spec(tmp_path)


def test_a_spec_file_that_holds_no_object_is_named(tmp_path: Path) -> None:
    """(fuzz60 F12) A precompute.json holding a JSON list was returned as it was: `dilstore compact` ended with
    "TypeError: 'list' object is not a mapping", an append with an AttributeError."""
    (tmp_path / SPEC_FILE).write_text("[1]\n", encoding="utf-8")
    with pytest.raises(DilstoreError, match=r"precompute\.json: cannot read the earlier run's settings: a JSON list, "):
        read_spec(tmp_path)


def test_a_codebook_of_another_model_is_measured_and_refused_where_it_fits_far_worse(
    tiny_dir: Path, tmp_path: Path, capsys, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A codebook of another model's store was one warning, and a store of near-noise states that passed verify
    (lowbit39 M1): it is measured on held-out states of the run's sample, where the codebook is copied in."""
    from dilstore.pipelines import codebook as codebook_module

    big = write_jsonl(tmp_path / "big.jsonl", wiki_like_documents(240))

    def run(model: Path, output: str, *extra: str) -> int:
        return cli.main(["precompute", "--input", str(big), "--output", str(tmp_path / output), "--model", str(model),
                         "--max-length", str(MAX_LENGTH), "--threads", "1", "--workers", "1", "--no-progress",
                         "--encoding", "2bit", *extra])  # fmt: skip

    assert run(tiny_dir, "base") == 0
    given = ("--codebook", str(tmp_path / "base" / CODEBOOK_DIR))
    capsys.readouterr()
    other_model = save_tiny_reader(tmp_path / "other-tiny", seed=1)  # the same shape, another model
    assert run(other_model, "other", *given) == 2
    assert "encodes this model's states far worse: relative error" in capsys.readouterr().err
    assert not (tmp_path / "other").exists()
    # Another fingerprint, the same offline states (a reader trained with frozen lower layers): the codebook fits.
    online_only = shutil.copytree(tiny_dir, tmp_path / "online-changed")
    weights = load_file(online_only / "model.safetensors")
    weights["qa_outputs.bias"] = weights["qa_outputs.bias"] + 1.0  # an online weight
    save_file(weights, online_only / "model.safetensors")
    assert run(online_only, "frozen-lower", *given) == 0
    note = capsys.readouterr().err
    assert "note: --codebook" in note and "it fits this model's states" in note
    # Refused as the replacement of a store: the folder it was to be built in was left behind (review40 L3).
    assert run(other_model, "frozen-lower", *given, "--overwrite") == 2
    assert "far worse" in capsys.readouterr().err
    kept = tmp_path / "frozen-lower"
    assert not building_dir(kept).exists() and (kept / "manifest.json").exists()
    # A re-run of the complete store measures nothing again: the check cost a sampling pass every time (review39 M2).
    monkeypatch.setattr(codebook_module, "codebook_fit", lambda *args: pytest.fail("measured again"))
    assert run(online_only, "frozen-lower", *given) == 0 and "already complete" in capsys.readouterr().err


def test_a_2bit_run_trains_one_codebook_every_shard_decodes_with_and_another_run_can_reuse(
    metered_run, corpus, tiny_dir: Path, tmp_path: Path, capsys
) -> None:
    reference, _, _, _ = metered_run
    store, again = tmp_path / "2bit", tmp_path / "2bit-again"
    assert (
        cli.main(precompute_args(corpus, tiny_dir, store, "--workers", "1", "--no-progress", "--encoding", "2bit")) == 0
    )
    codebook, _ = read_codebook(store / CODEBOOK_DIR, "2bit")
    assert "rotation" in codebook and "cutoffs" not in codebook  # DilBert stores get rotated codes
    with open_store(store) as opened:
        for shard in range(SHARDS):
            reader = opened.shard(shard)
            assert reader.attributes.codebook_in_store, shard  # the shard holds no copy of it
            assert all(np.array_equal(reader.per_shard[name], codebook[name]) for name in codebook), shard
    mine, theirs = store_contents(store), store_contents(reference)
    assert sorted(mine) == sorted(theirs)
    original = np.concatenate([theirs[passage_id][-1] for passage_id in sorted(theirs)])  # (T, d)
    decoded = np.concatenate([mine[passage_id][-1] for passage_id in sorted(mine)])  # (T, d)
    assert np.square(decoded - original).sum() / np.square(original - original.mean(0)).sum() < 0.25
    assert verify_store(store).ok
    reuse = precompute_args(corpus, tiny_dir, again, "--workers", "1", "--no-progress", "--encoding", "2bit",
                            "--codebook", str(store / CODEBOOK_DIR))
    capsys.readouterr()
    assert cli.main(reuse) == 0
    # Its codebook was trained on fewer than 2,000 states and this run is too small to measure it (codes51 F1).
    assert "is too small to measure how well it codes this run's passages" in capsys.readouterr().err
    assert all(np.array_equal(mine[key][-1], value[-1]) for key, value in store_contents(again).items())
    other_model = save_tiny_reader(tmp_path / "other-tiny", seed=1)  # same shape, another model
    assert cli.main(precompute_args(corpus, other_model, tmp_path / "other", "--workers", "1", "--no-progress",
                                    "--encoding", "2bit", "--codebook", str(store / CODEBOOK_DIR))) == 0
    assert "this run's sample is too small to measure how well it fits" in capsys.readouterr().err  # (next test)
    assert "codebook" in json.loads((again / "precompute.json").read_text())
    one_bit = precompute_args(corpus, tiny_dir, tmp_path / "1bit", "--workers", "1", "--no-progress",
                              "--encoding", "1bit", "--codebook", str(store / CODEBOOK_DIR))
    capsys.readouterr()
    assert cli.main(one_bit) == 2
    assert "is a codebook for '2bit', not '1bit'" in capsys.readouterr().err
