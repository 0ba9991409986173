"""The pipeline's pure steps without Beam: shard keys, routing, the per-shard sink, counts, progress, run specs."""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
from collections import Counter
from dataclasses import replace
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from dilstore.pipelines.corpora import Document, Rejected, Skipped
from dilstore.pipelines.job import PrecomputeJob, spec_differences
from dilstore.pipelines.precompute import write_group
from dilstore.pipelines.progress import passages_done, passages_planned, report_planned, report_progress
from dilstore.pipelines.routing import COUNTS, REJECTED, SHARD, RouteSettings, pieces_of, route, shard_seeds
from dilstore.pipelines.run_stats import RunStats, merge_stats
from dilstore.pipelines.shard_sink import (
    ShardSettings,
    committed_passages,
    committed_shards,
    write_rejected_part,
    write_shard_outputs,
)
from dilstore.pipelines.sharding import MIN_DEFAULT_SHARDS, default_shard_count, shard_of, stable_hash
from dilstore.reader.batching import BatchPolicy
from dilstore.reader.modeling.fingerprint import model_fingerprint
from dilstore.reader.offline.encoding import encode_tokenized, load_reader
from dilstore.runners.precompute_run import ProgressBar, with_resumed_shards
from dilstore.storage.errors import DilstoreError
from dilstore.storage.finalize import finalize
from dilstore.storage.format import SHARDS_DIR, shard_name
from dilstore.storage.passage_files import WINDOW_ID_SEPARATOR, jsonl_path, meta_path, parquet_path, rejected_path
from dilstore.storage.reader import open_store
from tests.fixtures.paths import ROOT
from tests.fixtures.pipeline_fixtures import TINY_LAYERS, save_tiny_reader

WORDS = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho sigma".split()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory):
    return load_reader(str(save_tiny_reader(tmp_path_factory.mktemp("tiny-reader"))), "dilbert", TINY_LAYERS)


class NoModel:
    """Stands in for the model where nothing may be encoded: any use of it fails the test with `why`."""

    def __init__(self, why: str) -> None:
        self.why = why

    def __getattr__(self, name: str) -> None:
        raise AssertionError(self.why)


def document(doc_id: str, words: int, line: int | None = 1) -> Document:
    return Document(id=doc_id, title=f"T {doc_id}", text=" ".join(WORDS[i % len(WORDS)] for i in range(words)),
                    source="corpus.jsonl", line=line)


def test_the_shard_key_is_the_same_in_another_process() -> None:
    ids = ["doc#0", "doc#1", "Ünïcode#7", ""]
    here = [stable_hash(passage_id) for passage_id in ids]
    code = f"from dilstore.pipelines.sharding import stable_hash; print([stable_hash(i) for i in {ids!r}])"
    there = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT,
                           env={"PYTHONHASHSEED": "12345"}).stdout
    assert json.loads(there) == here


@given(passage_id=st.text(max_size=40), shards=st.integers(min_value=1, max_value=5000))
def test_every_id_lands_in_one_shard_in_range(passage_id: str, shards: int) -> None:
    """The shard is README's keyed BLAKE2b, computed here independently: a change to the hash would send every
    existing store's ids to other shards on --append."""
    digest = hashlib.blake2b(passage_id.encode("utf-8"), digest_size=8, person=b"dilstore-shard").digest()
    assert shard_of(passage_id, shards) == int.from_bytes(digest, "big") % shards
    assert 0 <= shard_of(passage_id, shards) < shards


def test_default_shard_count_depends_on_input_size_only(tmp_path: Path) -> None:
    small = tmp_path / "small.jsonl"
    small.write_bytes(b"x" * 1000)
    big = tmp_path / "big.jsonl"
    big.write_bytes(b"x" * (40 << 20))
    assert default_shard_count([small]) == MIN_DEFAULT_SHARDS
    assert default_shard_count([small], minimum=1) == 1  # an append of a few documents: 4 shards of ~100 KB each
    assert default_shard_count([big]) == 40
    assert default_shard_count([big, big]) == 80
    packed = tmp_path / "big.jsonl.gz"
    packed.write_bytes(b"x" * (10 << 20))
    assert default_shard_count([packed]) == 40
    shouted = tmp_path / "BIG.JSONL.GZ"  # read decompressed, so counted so (it was taken as 10 MiB of text)
    shouted.write_bytes(b"x" * (10 << 20))
    assert default_shard_count([shouted]) == 40


@given(size=st.integers(0, 40 << 20))
@example(size=(4 << 20) + 1).via("4 MiB and a byte: 5 shards, not 4")
@example(size=9 << 19).via("4.5 MiB")
@settings(suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_default_shard_count_rounds_a_part_mib_up_to_a_shard_of_its_own(tmp_path: Path, size: int) -> None:
    """One shard per MiB begun, so that no shard holds more than a MiB of text (4.5 MiB make 5 shards, not 4)."""
    corpus = tmp_path / "corpus.jsonl"
    with corpus.open("wb") as file:
        file.truncate(size)  # sparse: only its size counts
    mib_begun = -(-size // (1 << 20))
    assert default_shard_count([corpus], minimum=1) == max(1, mib_begun)
    assert default_shard_count([corpus]) == max(MIN_DEFAULT_SHARDS, mib_begun)


def test_routing_sends_each_record_to_its_group(tiny) -> None:
    settings = RouteSettings(strategy="words", num_shards=5, max_length=64, kind="dilbert")
    dead = Rejected("corpus.jsonl", 3, "bad JSON")
    assert list(route(dead, settings, tiny.tokenizer)) == [((REJECTED, stable_hash("corpus.jsonl\x003") % 5), dead)]
    [(key, stats)] = route(Skipped("wiki.xml", "Redirect", "redirect"), settings, tiny.tokenizer)
    assert key[0] == COUNTS and stats == RunStats(skipped=1)

    routed = list(route(document("d1", 230), settings, tiny.tokenizer))
    units = [(key, value) for key, value in routed if key[0] == SHARD]
    assert [value.id for _, value in units] == ["d1#0", "d1#0~1", "d1#1", "d1#1~1", "d1#2", "d1#2~1", "d1#3", "d1#3~1"]
    assert all(key == (SHARD, shard_of(value.id, 5)) for key, value in units)
    [(key, stats)] = [(key, value) for key, value in routed if key[0] == COUNTS]
    assert key == (COUNTS, shard_of("d1", 5)) and stats == RunStats(documents=1, long_passages=4)


@pytest.mark.parametrize("paragraph_words", [(12,), (12, 150), (150, 12, 150), (40, 40)])
def test_only_passages_cut_into_several_windows_count_as_long(tiny, paragraph_words: tuple[int, ...]) -> None:
    """long_passages counts the passages that became more than one window, not every passage stored."""
    text = "\n\n".join(" ".join(WORDS[i % len(WORDS)] for i in range(n)) for n in paragraph_words)
    doc = Document(id="d", title="T d", text=text, source="corpus.jsonl", line=1)
    routed = list(route(doc, RouteSettings("paragraphs", 3, 64, "dilbert"), tiny.tokenizer))
    windows = Counter(value.id.partition(WINDOW_ID_SEPARATOR)[0] for key, value in routed if key[0] == SHARD)
    assert len(windows) == len(paragraph_words)
    [stats] = [value for key, value in routed if key[0] == COUNTS]
    assert stats == RunStats(documents=1, long_passages=sum(count > 1 for count in windows.values()))
    assert stats.long_passages == sum(n == 150 for n in paragraph_words)


def test_a_document_that_yields_nothing_to_store_is_a_dead_letter(tiny) -> None:
    empty = Document(id="short", title="", text="tiny", source="c.jsonl", line=9)
    settings = RouteSettings(strategy="paragraphs", num_shards=3, max_length=64, kind="dilbert")
    [(key, dead)] = route(empty, settings, tiny.tokenizer)
    assert key[0] == REJECTED and dead.line_or_id == 9 and "no passage" in dead.reason
    for line, where in ((None, "odd"), (12, 12)):  # named the passage "odd#0", not the line (input38 M5)
        odd = Document(id="odd", title="", text="\u200b " * 40, source="c.jsonl", line=line)
        routed = list(route(odd, RouteSettings("words", 3, 64, "dilbert"), tiny.tokenizer))
        [dead] = [value for key, value in routed if key[0] == REJECTED]
        assert dead.line_or_id == where and "passage 'odd#0'" in dead.reason and "no word pieces" in dead.reason
        assert dead.passage == "odd#0" and json.loads(dead.to_json())["passage"] == "odd#0"
        assert not [key for key, _ in routed if key[0] == SHARD]
        assert [value for key, value in routed if key[0] == COUNTS] == [RunStats(rejected=1)]


def test_documents_rejected_and_skipped_add_up_to_the_records_read(tiny, tmp_path: Path) -> None:
    """Each dead letter of a passage counted as a rejected record: 5 records read were 2 documents and 5 rejected,
    a document stored was also "rejected", and one rejected twice (pipe48 F2). Now a record is a document, or
    rejected, or skipped, once; its passages left out are counted apart."""
    good = "A paragraph long enough to be stored as a passage of its own."
    blank = "\u200b " * 40  # no word piece
    records = [
        Document(id="p1", title="", text=f"{good}\n\n{blank}\n\n{good}", source="c.jsonl", line=1),  # stored, 1 out
        Document(id="p2", title="", text=f"{blank}\n\n{blank}", source="c.jsonl", line=2),  # both passages out
        Document(id="p3", title="", text="short", source="c.jsonl", line=3),  # no passage at all
        Rejected("c.jsonl", 4, "bad JSON"),
        Skipped("c.jsonl", 5, "header"),
    ]
    settings = RouteSettings("paragraphs", 2, 64, "dilbert")
    routed = [item for record in records for item in route(record, settings, tiny.tokenizer)]
    letters = [value for key, value in routed if key[0] == REJECTED]
    counts = merge_stats([value for key, value in routed if key[0] == COUNTS]
                         + [write_rejected_part(str(tmp_path), 0, letters)])  # fmt: skip
    assert (counts.documents, counts.rejected, counts.skipped, counts.rejected_passages) == (1, 3, 1, 3)
    assert counts.documents + counts.rejected + counts.skipped == len(records)
    written = [json.loads(line) for line in rejected_path(tmp_path, 0).read_text().splitlines()]
    assert sorted(letter.get("passage", "") for letter in written) == ["", "", "p1#1", "p2#0", "p2#1"]


def test_a_run_that_left_passages_out_says_how_many_on_stderr(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Passages left out were counted as rejected records (pipe48 F2); the run's stderr line names both counts."""
    from dilstore.runners import cmd_precompute

    summary = {"documents": 1, "rejected": 1, "rejected_passages": 3, "rejected_records": "rejected", "store": "/s"}
    monkeypatch.setattr(cmd_precompute, "precompute_store", lambda args: (summary, None, None))
    assert cmd_precompute.run_command(argparse.Namespace(json=False, append=False)) == 0
    assert capsys.readouterr().err == ("dilstore precompute: 1 record(s) rejected and 3 passage(s) of documents left "
                                       "out: /s/rejected/ says why, one JSON line each\n")  # fmt: skip


@pytest.mark.parametrize(("doc_id", "refused"), [("a~1", True), ("a~12", True), ("a~0", False), ("a~", False),
                                                 ("~1", False), ("a~1b", False), ("a#0~1", True)])
def test_window_like_ids_are_dead_letters_under_split_none(tiny, doc_id: str, refused: bool) -> None:
    """`a~1` could be the id of window 1 of a long document `a`, so --split none refuses it (and only it)."""
    doc = Document(id=doc_id, title="", text="a few words", source="c.jsonl", line=4)
    routed = list(route(doc, RouteSettings("none", 3, 64, "dilbert"), tiny.tokenizer))
    dead = [value for key, value in routed if key[0] == REJECTED]
    if refused:
        assert len(routed) == 1 and dead[0].line_or_id == 4 and "has the form of a window id" in dead[0].reason
    else:
        assert not dead and [value.id for key, value in routed if key[0] == SHARD] == [doc_id]
    words = list(route(doc, RouteSettings("words", 3, 64, "dilbert"), tiny.tokenizer))
    assert not [key for key, _ in words if key[0] == REJECTED]


def test_shard_groups_sort_by_id_and_drop_the_seed(tiny) -> None:
    settings = RouteSettings(strategy="words", num_shards=1, max_length=64, kind="dilbert")
    units = [value for doc in ("b", "a") for key, value in route(document(doc, 30), settings, tiny.tokenizer)
             if key[0] == SHARD]
    assert [piece.id for piece in pieces_of([None, *units])] == ["a#0", "b#0"]
    assert shard_seeds(2) == [((SHARD, 0), None), ((SHARD, 1), None)]


def test_a_shard_group_holding_one_id_twice_is_refused_naming_it(tiny) -> None:
    """Two units of one id in a shard would be two rows under one id: refused before the shard is written."""
    settings = RouteSettings(strategy="words", num_shards=1, max_length=64, kind="dilbert")
    units = [value for doc in ("b", "a") for key, value in route(document(doc, 30), settings, tiny.tokenizer)
             if key[0] == SHARD]  # fmt: skip
    with pytest.raises(DilstoreError, match=r"^passage id 'b#0' occurs twice in one shard$"):
        pieces_of([None, *units, None, units[0]])


def shard_units(tiny, count: int = 6):
    settings = RouteSettings(strategy="words", num_shards=1, max_length=64, kind="dilbert")
    units = [value for number in range(count)
             for key, value in route(document(f"doc{number}", 20 + 9 * number), settings, tiny.tokenizer)
             if key[0] == SHARD]
    return pieces_of(units)


def test_the_shard_sink_writes_table_collection_shard_and_marker_then_resumes(tmp_path: Path, tiny) -> None:
    settings = ShardSettings(store=str(tmp_path), kind="dilbert", encoding="fp16", policy=BatchPolicy(batch_tokens=64))
    pieces = shard_units(tiny)
    progress = []
    stats = write_shard_outputs(settings, 2, pieces, tiny, progress.append)
    assert (stats.passages, stats.tokens, stats.shards) == (len(pieces), sum(p.length for p in pieces), 1)
    assert progress[-1] == len(pieces)
    table = pq.read_table(parquet_path(tmp_path, 2)).to_pylist()
    assert table == [{"id": p.id, "doc_id": p.doc_id, "title": p.title, "text": p.text} for p in pieces]
    lines = [json.loads(line) for line in jsonl_path(tmp_path, 2).read_text(encoding="utf-8").splitlines()]
    assert lines == [{"id": p.id, "contents": f"{p.title}\n{p.text}"} for p in pieces]
    assert (tmp_path / SHARDS_DIR / shard_name(2)).is_dir()
    assert RunStats.from_dict(json.loads(meta_path(tmp_path, 2).read_text())) == stats
    assert stats.bytes == sum(f.stat().st_size for f in (tmp_path / SHARDS_DIR).rglob("*") if f.is_file()) + sum(
        path.stat().st_size for path in (parquet_path(tmp_path, 2), jsonl_path(tmp_path, 2)))

    resumed = write_shard_outputs(settings, 2, pieces, NoModel("a committed shard must not be encoded again"))
    assert resumed == RunStats(**{**stats.to_dict(), "shards_resumed": 1})


def test_a_resumed_run_counts_committed_shards_before_it_starts_and_workers_do_not_report_them(
    tmp_path: Path, tiny
) -> None:
    """A resumed run's bar took the passages of shards committed before as encoded now, so its rate ran high and
    its time left was 2-3x short (wiki45 L1): the launcher counts them up front and workers report only encoding."""
    store, first, second = tmp_path / "store", tmp_path / "first", tmp_path / "second"
    first.mkdir(), second.mkdir()  # the launcher's progress folders: reports go only into one that exists
    job = PrecomputeJob(inputs=(), store=str(store), strategy="words", num_shards=4, max_length=64, model="unused",
                        fingerprint=model_fingerprint(tiny, "dilbert", "fp16", 64), policy=BatchPolicy(), threads=1,
                        runner="DirectRunner", started_at=0.0, progress_dir=str(first))  # fmt: skip
    pieces = shard_units(tiny)
    assert committed_passages(job.shard_settings(), range(4)) == 0
    assert write_group(job, (SHARD, 2), pieces, tiny).passages == len(pieces)
    assert passages_done(first) == len(pieces)
    assert committed_passages(job.shard_settings(), range(4)) == len(pieces)
    assert committed_passages(job.shard_settings(), range(2)) == 0
    resumed = replace(job, progress_dir=str(second))
    assert write_group(resumed, (SHARD, 2), pieces, NoModel("committed")).shards_resumed == 1
    assert passages_done(second) == 0


def test_only_shards_committed_before_the_run_count_as_resumed(tmp_path: Path, tiny) -> None:
    """A Dask task retried after its worker died found the marker its first attempt wrote, and a single
    uninterrupted run said `shards_resumed 1` (dask50 F7)."""
    job = PrecomputeJob(inputs=(), store=str(tmp_path / "store"), strategy="words", num_shards=4, max_length=64,
                        model="unused", fingerprint=model_fingerprint(tiny, "dilbert", "fp16", 64),
                        policy=BatchPolicy(), threads=1, runner="DirectRunner", started_at=0.0)  # fmt: skip
    pieces = shard_units(tiny)
    this_run = with_resumed_shards(job)
    assert this_run.resumed_shards == frozenset()
    first = write_group(this_run, (SHARD, 2), pieces, tiny)
    retried = write_group(this_run, (SHARD, 2), pieces, NoModel("a committed shard must not be encoded again"))
    assert retried == first and retried.shards_resumed == 0
    next_run = with_resumed_shards(job)
    assert next_run.resumed_shards == frozenset({2})
    assert write_group(next_run, (SHARD, 2), pieces, NoModel("committed")).shards_resumed == 1


def test_a_rewritten_shard_is_byte_identical(tmp_path: Path, tiny) -> None:
    settings = ShardSettings(store=str(tmp_path), kind="dilbert", encoding="int8", policy=BatchPolicy())
    pieces = shard_units(tiny, 4)
    write_shard_outputs(settings, 0, pieces, tiny)
    before = {p.relative_to(tmp_path): p.read_bytes() for p in sorted(tmp_path.rglob("*")) if p.is_file()}
    meta_path(tmp_path, 0).unlink()  # as if killed just before the commit marker
    write_shard_outputs(settings, 0, pieces, tiny)
    after = {p.relative_to(tmp_path): p.read_bytes() for p in sorted(tmp_path.rglob("*")) if p.is_file()}
    assert after == before


def test_an_empty_shard_leaves_only_its_marker(tmp_path: Path) -> None:
    settings = ShardSettings(store=str(tmp_path), kind="dilbert", encoding="fp16", policy=BatchPolicy())
    stats = write_shard_outputs(settings, 7, [], NoModel("nothing to encode"))
    assert stats == RunStats()
    assert [p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*") if p.is_file()] == [
        "passages/meta/part-00007.json"]


def test_dead_letters_are_sorted_jsonl_with_source_line_and_reason(tmp_path: Path) -> None:
    records = [Rejected("b.jsonl", 2, "empty text"), Rejected("a.jsonl", "x#1", "no passage"),
               Rejected("a.jsonl", 10, "missing id"), Rejected("a.jsonl", 9, "bad JSON: ...")]
    assert write_rejected_part(str(tmp_path), 3, records) == RunStats(rejected=4)
    lines = [json.loads(line) for line in rejected_path(tmp_path, 3).read_text(encoding="utf-8").splitlines()]
    assert lines == [
        {"source": "a.jsonl", "line_or_id": 9, "reason": "bad JSON: ..."},
        {"source": "a.jsonl", "line_or_id": 10, "reason": "missing id"},
        {"source": "a.jsonl", "line_or_id": "x#1", "reason": "no passage"},
        {"source": "b.jsonl", "line_or_id": 2, "reason": "empty text"},
    ]


counts = st.builds(RunStats, **{name: st.integers(0, 1000) for name in RunStats().to_dict()})


@settings(max_examples=50)
@given(parts=st.lists(counts, max_size=8), cut=st.integers(0, 8))
def test_counts_merge_in_any_grouping(parts: list[RunStats], cut: int) -> None:
    whole = merge_stats(parts)
    assert merge_stats([merge_stats(parts[:cut]), merge_stats(parts[cut:])]) == whole
    assert merge_stats(reversed(parts)) == whole
    assert whole.passages == sum(part.passages for part in parts)


def test_a_commit_marker_s_counts_of_another_version_are_read_by_name_and_the_rest_left_out() -> None:
    """A shard's commit marker written by a dilstore that counted more (or fewer) things still resumes: the counts
    this version knows are read, missing ones are 0, and an unknown one is left out rather than failing the run."""
    known = {"passages": 3, "tokens": 41, "shards": 1}
    marker = json.loads(json.dumps({**known, "a_later_count": 7, "another": "5"}))
    assert RunStats.from_dict(marker) == RunStats(**known)
    assert RunStats.from_dict({"passages": "3"}) == RunStats(passages=3)


@pytest.mark.parametrize("marker", ["\x00" * 16, '{"passages": 3', "[3]", '{"passages": null}', '{"passages": "x"}'])
def test_a_commit_marker_that_does_not_read_is_not_trusted(tmp_path: Path, marker: str) -> None:
    """(fuzz60 F11) A shard's commit marker damaged on disk (NUL bytes, a cut line, another JSON shape) ended a
    resumed `precompute` with a JSONDecodeError, AttributeError or TypeError traceback; like a marker of another
    build, it is not trusted, and the shard is written again."""
    settings = ShardSettings(store=str(tmp_path), kind="dilbert", encoding="fp16", policy=BatchPolicy())
    write_shard_outputs(settings, 0, [], NoModel("nothing to encode"))
    meta_path(tmp_path, 0).write_text(marker, encoding="utf-8")
    assert committed_passages(settings, [0]) == 0 and committed_shards(settings, [0]) == frozenset()


def test_progress_files_add_up(tmp_path: Path) -> None:
    report_progress(str(tmp_path), 0, 5)
    report_progress(str(tmp_path), 1, 7)
    report_progress(str(tmp_path), 0, 9)
    report_planned(str(tmp_path), "bundle-a", 30)
    report_planned(str(tmp_path), "bundle-b", 12)
    assert (passages_done(tmp_path), passages_planned(tmp_path)) == (16, 42)
    report_progress(None, 0, 5)  # remote runners: no folder, nothing written


def test_progress_reports_do_not_bring_back_a_removed_folder(tmp_path: Path) -> None:
    """An external Dask cluster's tasks run on after the launcher's Ctrl-C removed the progress folder: their
    reports re-created it without its owner lock, and nothing ever removed it (dask50 F6)."""
    gone = tmp_path / "dilstore-progress-gone"
    report_progress(str(gone), 6, 40)
    report_planned(str(gone), "bundle-a", 30)
    assert list(tmp_path.iterdir()) == []


def test_a_progress_report_does_not_list_its_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A report listed the whole folder for dead writers' temporaries: with thousands of reports there, each took
    4x longer (review50 L6)."""

    def listed(path: Path) -> list[Path]:
        raise AssertionError(f"{path.parent} listed")

    monkeypatch.setattr("dilstore.storage.atomic_files.remove_dead_writers_temporaries", listed)
    report_progress(str(tmp_path), 6, 40)
    report_planned(str(tmp_path), "bundle-a", 30)
    assert (passages_done(tmp_path), passages_planned(tmp_path)) == (40, 30)


def test_the_bar_of_a_resumed_run_starts_at_its_committed_passages_and_names_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    report_planned(str(tmp_path), "bundle", 300)
    report_progress(str(tmp_path), 0, 50)
    with ProgressBar(tmp_path, resumed=100):
        pass
    last = capsys.readouterr().err.split("\r")[-1]
    assert " 150/300 " in last and "100 resumed" in last, last


def test_spec_differences_name_what_changed() -> None:
    spec = {"split": "words", "shards": 4, "fingerprint": {"layers": 3}}
    assert spec_differences(spec, dict(spec)) == []
    changed = {**spec, "shards": 5, "fingerprint": {"layers": 2, "encoding": "1bit"}, "compression": "zstd"}
    assert spec_differences(spec, changed) == [
        "compression: the store's none, this run's 'zstd'", "fingerprint.encoding: the store's none, this run's '1bit'",
        "fingerprint.layers: the store's 3, this run's 2", "shards: the store's 4, this run's 5"]  # fmt: skip
    digests = {"inputs": [{"path": "a"}], "codebook": "ab12", "fingerprint": {"weights_sha256": "cd34"}}
    assert spec_differences(digests, {"inputs": [{"path": "b"}], "codebook": "ef56",
                                      "fingerprint": {"weights_sha256": "0a0b"}}) == [
        "codebook", "fingerprint.weights_sha256", "inputs"]  # fmt: skip


def test_states_survive_the_sink_for_every_encoding(tmp_path: Path, tiny) -> None:
    pieces = shard_units(tiny, 3)
    for encoding, tolerance in (("fp32", 0.0), ("fp16", 2e-3), ("int8", 0.05)):
        store = tmp_path / encoding
        settings = ShardSettings(store=str(store), kind="dilbert", encoding=encoding, policy=BatchPolicy())
        write_shard_outputs(settings, 0, pieces, tiny)
        finalize(store, model_fingerprint(tiny, "dilbert", encoding, 64))
        expected = {record.id: record.states for record in encode_tokenized(tiny, "dilbert", pieces)}
        with open_store(store) as opened:
            for stored in opened.fetch(list(expected)):
                scale = np.abs(expected[stored.id]).max()
                assert np.abs(np.asarray(stored.states, np.float32) - expected[stored.id]).max() <= tolerance * scale
