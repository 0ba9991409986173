"""A precompute run killed with SIGKILL can be re-run to completion: nothing lost, nothing duplicated.

`dilstore precompute` runs in its own process group and is SIGKILLed (the
whole group, as a crash would) once right after its first shard commits and
once while its first shard is being written, before any commits. Those runs
are children forked from this process (`killable_command`, unless it has
started the JVM): a SIGKILL runs no handler, so they leave what a killed
`python -m dilstore` leaves, without its 6-10 s of imports. The signal tests,
about what the process itself does, start `python -m dilstore.runners.cli`. Re-running the same command must give
a store with exactly the passages, token ids and states of a clean run, that
`verify` accepts, and the first re-run must reuse the shards that were
already committed.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from dilstore.pipelines.spec_file import SUMMARY_FILE
from dilstore.runners import cli
from dilstore.storage.format import MANIFEST_FILE, TMP_PREFIX
from dilstore.storage.verify import verify_store
from tests.fixtures.pipeline_fixtures import (
    ROOT,
    ForkedCommand,
    killable_command,
    killed_while_writing,
    save_tiny_reader,
    store_contents,
    wiki_like_documents,
    write_jsonl,
)

SHARDS = 12


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    """(tiny model, corpus with one bad line, a clean reference store)."""
    folder = tmp_path_factory.mktemp("resume")
    model = save_tiny_reader(folder / "tiny")
    corpus = write_jsonl(folder / "corpus.jsonl", wiki_like_documents(160))
    with corpus.open("a", encoding="utf-8") as stream:
        stream.write('{"id": "broken", "text": \n')
    reference = folder / "reference"
    assert cli.main(arguments(model, corpus, reference)) == 0
    return model, corpus, reference


def arguments(model: Path, corpus: Path, store: Path, workers: int = 1) -> list[str]:
    return ["precompute", "--input", str(corpus), "--output", str(store), "--model", str(model), "--workers",
            str(workers), "--threads", "1", "--shards", str(SHARDS), "--max-length", "48", "--encoding", "int8",
            "--no-progress"]


def start(args: list[str], log: Path, temp: Path | None = None) -> subprocess.Popen:
    """`dilstore ARGS` in a new process group (so that SIGKILL reaches every process it started), with $TMPDIR
    `temp` (default: a folder beside `log`), so that what a killed run cannot remove (Beam's `beam-pipeline-temp*`
    folder, which only a finished `run()` deletes) stays in the test's folder, not in the machine's /tmp.

    SIGINT and SIGHUP are reset to their defaults first: a suite started as a background job of a
    non-interactive shell ignores SIGINT (under `nohup`, SIGHUP), an ignored signal stays ignored across exec,
    and the child then takes no handler for it (it stays ignored), so it would finish its run.
    """
    temp = temp or log.with_suffix(".tmp")
    temp.mkdir(exist_ok=True)
    with log.open("wb") as output:
        return subprocess.Popen([sys.executable, "-m", "dilstore.runners.cli", *args], cwd=ROOT, stdout=output,
                                stderr=subprocess.STDOUT, start_new_session=True,
                                env={**os.environ, "TMPDIR": str(temp)}, preexec_fn=_default_stop_signals)  # fmt: skip


def _default_stop_signals() -> None:
    for number in (signal.SIGINT, signal.SIGHUP):
        signal.signal(number, signal.SIG_DFL)


def kill_group(process: subprocess.Popen | ForkedCommand) -> None:
    with_group = process.poll() is None
    if with_group:
        os.killpg(process.pid, signal.SIGKILL)
    process.wait(timeout=60)


def writing(store: Path) -> bool:
    """Whether the pipeline has begun writing a shard (its passages part comes first)."""
    return any((store / "passages").glob("part-*.parquet")) if (store / "passages").is_dir() else False


def committed(store: Path) -> int:
    return len(list((store / "passages" / "meta").glob("part-*.json")))


def assert_same_store(store: Path, reference: Path) -> None:
    assert verify_store(store).ok, verify_store(store).problems
    mine, theirs = store_contents(store), store_contents(reference)
    assert sorted(mine) == sorted(theirs)
    for passage_id, values in mine.items():
        for left, right in zip(values, theirs[passage_id], strict=True):
            assert np.array_equal(left, right) if isinstance(left, np.ndarray) else left == right
    for folder in ("passages", "rejected"):
        files = sorted(path.relative_to(reference) for path in (reference / folder).rglob("*") if path.is_file())
        assert files == sorted(path.relative_to(store) for path in (store / folder).rglob("*") if path.is_file())
        assert all((store / name).read_bytes() == (reference / name).read_bytes() for name in files)
    assert not [path for path in store.rglob(f"{TMP_PREFIX}*")], "no temporary shard may survive finalize"


@pytest.mark.parametrize(
    ("number", "group", "workers", "words"),
    [(signal.SIGINT, True, 1, "interrupted"), (signal.SIGINT, True, 2, "interrupted"),
     (signal.SIGTERM, False, 1, "stopped by SIGTERM"), (signal.SIGHUP, True, 2, "stopped by SIGHUP")],
    ids=["ctrl-c", "ctrl-c-two-workers", "sigterm-to-the-leader", "sighup-two-workers"],
)
def test_a_signal_mid_run_exits_with_one_line_and_leaves_no_temporary_folder(
    setup, tmp_path: Path, number: int, group: bool, workers: int, words: str
) -> None:
    """SIGINT to the process group, as Ctrl-C sends it: it exited 2 with a 70-line Beam traceback ending
    "the pipeline failed: KeyboardInterrupt"; with worker processes (the default --workers is the number of CPUs),
    their tracebacks and Beam's reports of the workers it lost came first, some 150 lines. SIGTERM (`kill`, to the
    group or the leader alone) and SIGHUP ended it with no line, and its progress folder left in $TMPDIR
    (crash36 8)."""
    model, corpus, _ = setup
    store, temp = tmp_path / "interrupted", tmp_path / "tmp"
    temp.mkdir()
    log = tmp_path / "interrupted.log"
    started = time.monotonic()
    process = start(arguments(model, corpus, store, workers), log, temp)
    # As soon as the pipeline writes the first shard's first file. Waiting for that shard's commit marker let a
    # busy machine finish the whole run before the signal.
    while not writing(store) and process.poll() is None and time.monotonic() - started < 240:
        time.sleep(0.005)
    os.killpg(process.pid, number) if group else process.send_signal(number)
    status = process.wait(timeout=120)
    output = log.read_text()
    assert not (store / MANIFEST_FILE).exists(), "the run finished before the signal; the corpus is too small"
    assert status == 128 + number, output[-3000:]
    assert output.startswith(f"dilstore precompute: {words}; run the same command again to go on"), output[-3000:]
    assert len(output.splitlines()) == 1, output[-3000:]
    assert not list(temp.iterdir()), "the progress folder and Beam's temporary folders are removed"


@pytest.mark.slow
def test_sigkill_after_the_first_shard_and_while_one_is_written_then_rerun(setup, tmp_path: Path) -> None:
    model, corpus, reference = setup
    store = tmp_path / "killed-after-first-shard"
    started = time.monotonic()
    process = killable_command(arguments(model, corpus, store), tmp_path / "first.log", tmp_path / "first.tmp")
    while committed(store) == 0 and process.poll() is None and time.monotonic() - started < 240:
        time.sleep(0.005)
    kill_group(process)
    assert not (store / MANIFEST_FILE).exists(), "the run finished before the kill; the corpus is too small"
    kept = committed(store)
    assert 1 <= kept < SHARDS
    resumed = sum(json.loads(meta.read_text())["passages"] for meta in (store / "passages" / "meta").glob("*.json"))
    assert cli.main(arguments(model, corpus, store)) == 0
    summary = json.loads((store / SUMMARY_FILE).read_text())
    assert summary["shards_resumed"] >= kept
    # The rate of this invocation's own passages, as its bar shows it (docs50 L1).
    assert summary["passages_per_second"] == pytest.approx((summary["passages"] - resumed) / summary["seconds"],
                                                           rel=0.01, abs=0.02)  # fmt: skip
    assert_same_store(store, reference)

    # A kill at a seeded "random" moment always landed while Python was importing, before the store had a file,
    # so its re-run was a clean first run: kill instead as soon as a shard's first file is there (as a rule
    # before that shard commits; a fast machine may commit one in between, which the re-run must handle too).
    store = tmp_path / "killed-while-writing"
    started = time.monotonic()
    process = killable_command(arguments(model, corpus, store), tmp_path / "writing.log", tmp_path / "writing.tmp")
    while not writing(store) and process.poll() is None and time.monotonic() - started < 240:
        time.sleep(0.005)
    kill_group(process)
    assert writing(store) and not (store / MANIFEST_FILE).exists(), "the run ended before it wrote a shard"
    assert committed(store) < SHARDS
    assert cli.main(arguments(model, corpus, store)) == 0
    assert_same_store(store, reference)


def test_a_rerun_rewrites_a_committed_shard_whose_folder_is_gone(setup, tmp_path: Path) -> None:
    """A commit marker counting passages whose shard folder vanished (deleted by hand, a partial copy) is not
    trusted: trusting it finalized a store that silently lacked the shard, and that verify accepted."""
    model, corpus, reference = setup
    store = tmp_path / "store"
    shutil.copytree(reference, store)
    (store / MANIFEST_FILE).unlink()  # as a run killed before finalize leaves it
    markers = sorted((store / "passages" / "meta").glob("part-*.json"))
    shard = next(int(path.stem.split("-")[1]) for path in markers if json.loads(path.read_text())["passages"])
    shutil.rmtree(store / "shards" / f"shard-{shard:05d}")
    assert cli.main([*arguments(model, corpus, store), "--json"]) == 0
    assert_same_store(store, reference)


def test_a_run_killed_while_it_wrote_its_spec_is_resumed_by_the_same_command(setup, tmp_path: Path) -> None:
    """(state56 F1) A kill while `precompute` wrote its spec (`precompute.json`) into a new store's folder left the
    spec's temporary there, and every re-run of the same command refused the folder: "is not empty and was not made
    by `dilstore precompute`; choose another folder"."""
    model, corpus, reference = setup
    store = tmp_path / "store"
    killed_while_writing(store / "precompute.json")
    assert [path.name.startswith(f"{TMP_PREFIX}precompute.json.") for path in store.iterdir()] == [True]
    assert cli.main(arguments(model, corpus, store)) == 0
    assert_same_store(store, reference)


def test_a_full_disk_is_one_line_saying_what_to_do_and_the_rerun_finishes(
    setup, tmp_path: Path, capsys, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A full disk printed Beam's tracebacks (43 lines, 644 with two workers), then a line that named neither the
    store nor that a re-run resumes (crash40 M3)."""
    from dilstore.pipelines import shard_sink

    model, corpus, reference = setup
    store = tmp_path / "store"
    written = shard_sink.write_shard

    def full_after_two(*args, **kwargs):
        if len(list((store / "shards").glob("shard-*"))) >= 2:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return written(*args, **kwargs)

    monkeypatch.setenv("DILSTORE_QUIET", "1")
    monkeypatch.setattr(shard_sink, "write_shard", full_after_two)
    capsys.readouterr()
    assert cli.main(arguments(model, corpus, store)) == 2
    said = capsys.readouterr().err
    assert "Traceback" not in said and said.count("\n") == 1, said
    beam_reports = [record for record in caplog.records if record.name.startswith("apache_beam")]
    assert not any(record.levelno >= logging.ERROR for record in beam_reports), "Beam's traceback reached the log"
    assert said.startswith("dilstore precompute: error: the pipeline failed: OSError: [Errno 28] No space left on "
                           "device")  # fmt: skip
    assert said.rstrip().endswith(f"free space on the disk of {store} (or of $TMPDIR), then run the same command "
                                  "again to go on (the shards it finished are kept)")  # fmt: skip
    monkeypatch.setattr(shard_sink, "write_shard", written)
    assert cli.main(arguments(model, corpus, store)) == 0
    assert_same_store(store, reference)
