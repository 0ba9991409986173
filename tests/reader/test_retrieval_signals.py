"""The JVM that BM25 search starts in-process leaves SIGINT and SIGTERM to Python, and Ctrl-C acts at once.

Without `-Xrs` the JVM installs its own handlers for both: Ctrl-C then ends the process at once from Java
(exit 130), past every Python handler, `finally` block and the CLI's "interrupted" line. A Python program that
uses dilstore's search (a server, a notebook kernel) would lose its own handling of these signals. With them
Python's, a long call into Java waits in Python (retrieval._wait_in_python) so that the signal does not wait
for Java to return.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from dilstore.reader import quiet_mode, retrieval
from dilstore.runners import cli, fatal_signals
from dilstore.storage.errors import DilstoreError
from tests.fixtures.paths import ROOT

# Handlers first, then the JVM: the order in which a server or a notebook meets them.
CHILD = textwrap.dedent(
    """
    import signal, sys, time
    caught = []
    for number in (signal.SIGINT, signal.SIGTERM):
        signal.signal(number, lambda got, frame: caught.append(got))
    from dilstore.reader.retrieval import start_jvm
    start_jvm()
    print("ready", flush=True)
    for number in (signal.SIGINT, signal.SIGTERM):
        deadline = time.monotonic() + 20
        while number not in caught and time.monotonic() < deadline:
            time.sleep(0.02)
    print("caught", sorted(caught), flush=True)
    """
)


def _start(script: str, *args: str, **env: str) -> subprocess.Popen[str]:
    """A Python child that runs `script` from this checkout with SIGINT at its default (a background job of a
    shell starts with it ignored)."""
    return subprocess.Popen(
        [sys.executable, "-c", script, *args], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT), **env},
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )  # fmt: skip


def test_python_keeps_its_sigint_and_sigterm_handlers_once_the_jvm_runs() -> None:
    child = _start(CHILD)
    try:
        assert child.stdout is not None and child.stderr is not None
        ready = child.stdout.readline().strip()
        assert ready == "ready", child.stderr.read()[-2000:]
        child.send_signal(signal.SIGINT)
        child.send_signal(signal.SIGTERM)
        out, err = child.communicate(timeout=60)
    finally:
        child.kill()
    assert child.returncode == 0, f"the JVM took the signal (exit {child.returncode}): {err[-2000:]}"
    assert out.strip() == f"caught [{int(signal.SIGINT)}, {int(signal.SIGTERM)}]"


def test_a_fatal_signal_once_the_jvm_runs_ends_the_process_as_without_it(tmp_path: Path) -> None:
    """(leak60 F4) Once the JVM ran, a SIGBUS (a read of a store file cut short under its memory map) was the JVM's
    crash: "A fatal error has been detected by the Java Runtime Environment" on stdout, a 130 KB hs_err_pidPID.log
    left in the current folder, exit by SIGABRT. faulthandler now takes the signals the JVM does not own, so the
    process dies of the SIGBUS with the Python stack on stderr, and leaves nothing behind. The signal is sent to the
    thread, which the JVM's handler takes as it takes a fault. The `dilstore` command's `dump_fatal_signals` is
    what turns faulthandler on."""
    script = ("import signal, threading; from dilstore.runners.fatal_signals import dump_fatal_signals; "
              "dump_fatal_signals(); from dilstore.reader.retrieval import start_jvm; start_jvm(); "
              "signal.pthread_kill(threading.get_ident(), signal.SIGBUS)")  # fmt: skip
    child = subprocess.Popen([sys.executable, "-c", script], cwd=tmp_path, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True,
                             env={**os.environ, "PYTHONPATH": str(ROOT), "PYTHONFAULTHANDLER": ""})  # fmt: skip
    out, err = child.communicate(timeout=60)
    assert child.returncode == -signal.SIGBUS, err[-2000:]
    assert list(tmp_path.iterdir()) == []
    assert out == ""
    assert err.startswith("Fatal Python error: Bus error")


def test_the_command_turns_faulthandler_on_before_it_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    """(leak60 F4) The `dilstore` process has faulthandler on (on its stderr) before anything runs, so before any
    JVM starts: put in place once the JVM runs, it would take the SIGSEGVs the JVM raises and handles itself."""
    calls: list[str] = []
    monkeypatch.setattr(fatal_signals, "faulthandler", SimpleNamespace(
        is_enabled=lambda: False, enable=lambda file: calls.append(f"enable on stderr: {file is sys.__stderr__}")))
    monkeypatch.setattr(cli, "main", lambda exits: calls.append(f"main, exits: {exits}") or 0)
    assert cli.command() == 0
    assert calls == ["enable on stderr: True", "main, exits: True"]


@pytest.mark.parametrize("stderr", ["none", "closed"])
def test_a_process_without_a_usable_stderr_starts_without_faulthandler(
    stderr: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """(mut60 M1) `dump_fatal_signals` in a process started without a stderr (sys.__stderr__ None, as under pythonw
    or a service manager) or with its stderr closed leaves faulthandler off, as the JVM's way was, and the command
    runs: faulthandler.enable(file=None) falls back to sys.stderr and raises RuntimeError where that is None too, and
    a closed file raises ValueError; either, let through, was a traceback before any `dilstore` command ran. No test
    made the process start so: the checks for None and the suppressed ValueError could go unseen."""
    import faulthandler

    monkeypatch.setattr(faulthandler, "is_enabled", lambda: False)  # pytest's own faulthandler is on
    if stderr == "none":
        monkeypatch.setattr(sys, "__stderr__", None)
        monkeypatch.setattr(sys, "stderr", None)
    else:
        closed = (tmp_path / "stderr").open("w")
        closed.close()
        monkeypatch.setattr(sys, "__stderr__", closed)
    fatal_signals.dump_fatal_signals()  # returns: neither RuntimeError nor ValueError escapes


def test_the_command_leaves_faulthandler_off_under_a_jvm_that_runs_already(monkeypatch: pytest.MonkeyPatch) -> None:
    """Turned on once the JVM ran (a program that searched, then ran `dilstore verify` through the command's entry
    point), faulthandler took the JVM's own SIGSEGVs: the next index build in that process died with its dump."""
    calls: list[str] = []
    monkeypatch.setattr(fatal_signals, "faulthandler", SimpleNamespace(
        is_enabled=lambda: False, enable=lambda file: calls.append("enable")))  # fmt: skip
    monkeypatch.setitem(sys.modules, "jnius", SimpleNamespace())  # importing jnius starts the JVM
    fatal_signals.dump_fatal_signals()
    assert calls == []


def test_start_jvm_leaves_faulthandler_to_its_caller(monkeypatch: pytest.MonkeyPatch) -> None:
    """(read60) start_jvm turned faulthandler on in any program that started the JVM through dilstore; a program's
    own `faulthandler.disable()` then put the default handlers back over the JVM's, and the JVM's routine SIGSEGVs
    ended it (exit 139). Only the `dilstore` command turns it on. Stand-ins record what start_jvm does."""
    import faulthandler
    import types

    calls: list[str] = []
    monkeypatch.setattr(faulthandler, "is_enabled", lambda: False)  # as in a program that has not turned it on
    monkeypatch.setattr(faulthandler, "enable", lambda *args, **kwargs: calls.append("enable"))
    config = types.SimpleNamespace(vm_running=False, add_classpath=lambda *paths: None,
                                   add_options=lambda *given: None)  # fmt: skip
    monkeypatch.setitem(sys.modules, "jnius_config", config)
    monkeypatch.setitem(sys.modules, "jnius", types.SimpleNamespace())
    monkeypatch.setattr(retrieval, "_JVM_STARTED", False)
    monkeypatch.setattr(retrieval, "jvm_memory_options", lambda max_heap: [])
    monkeypatch.setenv("JAVA_HOME", "unset")
    monkeypatch.delenv(quiet_mode.QUIET_ENV, raising=False)
    retrieval.start_jvm("4g")
    assert calls == []


def test_the_jvm_leaves_the_process_locale_as_it_was() -> None:
    """Starting the JVM set the C locale from the environment: under de_DE, C's strtod("0.5") read 0.0 in the
    caller's libraries (api42 M2). C.UTF-8 stands in for a locale of the environment, which Python leaves unset
    but for LC_CTYPE."""
    script = ("import locale; from dilstore.reader.retrieval import start_jvm; "
              "before = locale.setlocale(locale.LC_ALL); start_jvm(); "
              "print(before == locale.setlocale(locale.LC_ALL), locale.setlocale(locale.LC_NUMERIC))")  # fmt: skip
    child = _start(script, LC_ALL="C.UTF-8")
    out, err = child.communicate(timeout=120)
    assert child.returncode == 0, err[-2000:]
    assert out.split() == ["True", "C"]


# Start the JVM, then build an index large enough to take seconds; Ctrl-C arrives while Java builds it.
BUILDING = textwrap.dedent(
    """
    import json, random, sys
    from pathlib import Path
    from dilstore.reader.retrieval import build_bm25_index_in_place, start_jvm
    root = Path(sys.argv[1])
    (root / "collection").mkdir()
    words = [f"w{i}" for i in range(20000)]
    random.seed(0)
    with open(root / "collection" / "docs.jsonl", "w") as out:
        for i in range(80000):
            out.write(json.dumps({"id": f"d{i}", "contents": " ".join(random.choices(words, k=60))}) + "\\n")
    start_jvm()
    print("building", flush=True)
    try:
        build_bm25_index_in_place(root / "collection", root / "bm25")
    except KeyboardInterrupt:
        print("interrupted", flush=True)
        sys.exit(130)
    print("built", flush=True)
    """
)


def test_ctrl_c_during_an_index_build_acts_before_java_returns(tmp_path: Path) -> None:
    child = _start(BUILDING, str(tmp_path), DILSTORE_QUIET="1")
    try:
        assert child.stdout is not None and child.stderr is not None
        started = child.stdout.readline().strip()
        assert started == "building", child.stderr.read()[-2000:]
        lock, deadline = tmp_path / ".bm25.building" / "write.lock", time.monotonic() + 60
        while not lock.exists() and child.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert lock.exists(), "Lucene never opened the index for writing"
        child.send_signal(signal.SIGINT)
        out, err = child.communicate(timeout=60)
    finally:
        child.kill()
    assert (child.returncode, out.strip()) == (130, "interrupted"), err[-2000:]
    assert not (tmp_path / "bm25").exists(), "a build cut off is never renamed into place"
    assert not any((tmp_path / ".bm25.building").glob("segments_*")), "Ctrl-C waited for Java to finish the build"


def test_a_build_of_a_folder_still_being_built_in_this_process_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    collection, index = tmp_path / "collection", tmp_path / "bm25"
    collection.mkdir()
    (collection / "docs.jsonl").write_text('{"id": "d0", "contents": "tram"}\n', encoding="utf-8")
    building = tmp_path / ".bm25.building"
    building.mkdir()
    release = threading.Event()
    cut_off = threading.Thread(target=release.wait, daemon=True)
    cut_off.start()
    monkeypatch.setitem(retrieval._BUILDS, building.resolve(), cut_off)
    try:
        with pytest.raises(DilstoreError, match=r"interrupted BM25 build of .*\.bm25\.building still runs"):
            retrieval.build_bm25_index_in_place(collection, index)
        assert building.is_dir(), "the folder the cut-off build writes to is left to it"
    finally:
        release.set()


def test_an_index_short_of_passages_names_the_first_line_it_could_not_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Anserini's trace names no file ("REDACTED"), and the error said "see the log above" (longrun45 F6)."""
    collection, index = tmp_path / "collection", tmp_path / "bm25"
    collection.mkdir()
    (collection / "part-00000.jsonl").write_text('{"id": "d0", "contents": "tram"}\n' * 2, encoding="utf-8")
    (collection / "part-00001.jsonl").write_text('{"id": "d2", "contents": "x"}\nX{"id": "d3"}\n', encoding="utf-8")

    def short_build(source: Path, target: Path, **_: object) -> int:
        target.mkdir(parents=True)
        (target / "segments_1").write_bytes(b"lucene")
        return 3

    monkeypatch.setattr(retrieval, "build_bm25_index", short_build)
    store = SimpleNamespace(passages=4)
    with pytest.raises(DilstoreError, match=rf"read 3 of the store's 4 passages .*\(the first line it could not read "
                                            rf"is {collection}/part-00001\.jsonl:2: Expecting value"):  # fmt: skip
        retrieval.build_bm25_index_in_place(collection, index, store=store)  # type: ignore[arg-type]
    assert not index.exists()
    (collection / "part-00001.jsonl").write_text('{"id": "d2", "contents": "x"}\n["d3"]\n', encoding="utf-8")
    with pytest.raises(DilstoreError, match=r"part-00001\.jsonl:2: not an id and contents"):
        retrieval.build_bm25_index_in_place(collection, index, store=store)  # type: ignore[arg-type]


def test_an_index_of_more_documents_than_the_store_holds_does_not_replace_the_old_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A build that read more documents than the manifest's passages indexed a store that grew meanwhile: its record
    would name the older state, so the index is not put in place, and the index there stays as it was."""
    collection, index = tmp_path / "collection", tmp_path / "bm25"
    collection.mkdir()
    (collection / "part-00000.jsonl").write_text('{"id": "d0", "contents": "tram"}\n' * 5, encoding="utf-8")
    index.mkdir()
    (index / "segments_1").write_bytes(b"the old index")

    def longer_build(source: Path, target: Path, **_: object) -> int:
        target.mkdir(parents=True)
        (target / "segments_1").write_bytes(b"the new index")
        return 5

    monkeypatch.setattr(retrieval, "build_bm25_index", longer_build)
    store = SimpleNamespace(passages=4, generation="g1", superseded_passages=0, appends=[])
    with pytest.raises(DilstoreError, match=r"read 5 of the store's 4 passages .*\(the store grew while it was "
                                            r"indexed: run `dilstore index` again\); the index was not replaced"):
        retrieval.build_bm25_index_in_place(collection, index, store=store)  # type: ignore[arg-type]
    assert (index / "segments_1").read_bytes() == b"the old index"
    assert sorted(path.name for path in tmp_path.iterdir()) == ["bm25", "collection"]


def test_a_java_call_waited_on_gives_back_its_result_or_its_error() -> None:
    assert retrieval._wait_in_python(lambda: 6 * 7, "answer") == 42
    with pytest.raises(ZeroDivisionError):
        retrieval._wait_in_python(lambda: 1 / 0, "error")


def test_the_waiting_thread_reports_progress_while_the_call_runs() -> None:
    """The index bar is fed from here: called only once at the end, it would jump from 0 to done."""
    polls: list[float] = []
    polled_thrice = threading.Event()

    def poll() -> None:
        polls.append(time.monotonic())
        if len(polls) == 3:
            polled_thrice.set()

    # The call ends only once it has been polled three times (a timed call needed three polls in 0.7 s of a busy CPU).
    assert retrieval._wait_in_python(lambda: polled_thrice.wait(60) and 1, "slow", while_waiting=poll) == 1
    assert len(polls) >= 3


@pytest.mark.parametrize("quiet", [True, False])
def test_a_build_cut_off_by_ctrl_c_silences_java_unless_verbose(
    quiet: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The abandoned build logged a Java stack trace per file of the temporary collection its command deleted,
    some 250 lines after `dilstore index: interrupted` (crash36 6); --verbose keeps the libraries' logs."""
    silenced: list[bool] = []
    monkeypatch.setattr(retrieval, "_silence_java", lambda: silenced.append(True))
    if quiet:
        monkeypatch.setenv(quiet_mode.QUIET_ENV, "1")
    else:
        monkeypatch.delenv(quiet_mode.QUIET_ENV, raising=False)
    release = threading.Event()

    def ctrl_c() -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        retrieval._wait_in_python(lambda: release.wait(30), "build", building=tmp_path / "b", while_waiting=ctrl_c)
    release.set()
    assert silenced == ([True] if quiet else [])


def test_an_index_record_the_disk_cannot_read_says_to_check_the_disk_not_to_rebuild(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An EIO reading bm25/dilstore-index.json said "rebuild the index", which does not help a failing disk;
    a record that is not JSON still says to rebuild (full49 F8)."""
    import errno
    record = tmp_path / retrieval.INDEX_RECORD
    record.write_text("{", encoding="utf-8")
    store = SimpleNamespace()  # not reached: the record is read first
    with pytest.raises(DilstoreError, match=r"index\.json cannot be read \(Expecting .*\); rebuild the index$"):
        retrieval.check_index_covers(tmp_path, store, tmp_path)  # type: ignore[arg-type]

    def failing_disk(self: Path, *args: object, **kwargs: object) -> str:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(Path, "read_text", failing_disk)
    with pytest.raises(DilstoreError) as raised:
        retrieval.check_index_covers(tmp_path, store, tmp_path)  # type: ignore[arg-type]
    assert str(raised.value) == (
        f"{record} cannot be read ([Errno 5] Input/output error); check the disk, then try again"
    )
    monkeypatch.undo()
    record.unlink()
    record.mkdir()  # no read will reach it: trying again would not help (review49 F4)
    with pytest.raises(DilstoreError, match=r"\[Errno 21\] Is a directory: .*\); rebuild the index$"):
        retrieval.check_index_covers(tmp_path, store, tmp_path)  # type: ignore[arg-type]


def test_an_index_of_a_copy_that_took_another_append_is_stale_for_this_store(tmp_path: Path) -> None:
    """Two copies of one build each took one append: one added a passage, the other added two and retired one. They
    hold as many passages after as many appends, and their indexes differ (the retired passage and the added ones):
    the record's superseded count tells them apart."""
    import json
    one_added = SimpleNamespace(generation="g1", passages=11, superseded_passages=0, appends=({"generation": "a1"},))
    one_replaced = SimpleNamespace(generation="g1", passages=11, superseded_passages=1, appends=({"generation": "a2"},))
    (tmp_path / retrieval.INDEX_RECORD).write_text(json.dumps(retrieval.indexed_state(one_added)), encoding="utf-8")
    retrieval.check_index_covers(tmp_path, one_added, tmp_path / "store")  # type: ignore[arg-type]
    with pytest.raises(DilstoreError, match=r"covers 11 passages of build 'g1' after 1 append\(s\), but the store .* "
                                            r"now holds 11 after 1: its answers would miss what changed"):
        retrieval.check_index_covers(tmp_path, one_replaced, tmp_path / "store")  # type: ignore[arg-type]


@pytest.mark.parametrize(("free", "why"), [
    (4096, r": its disk is full \(4 KB free\); free space on the disk of .*, then run the same command again$"),
    (10 << 30, r"; see its log above$"),
], ids=["full", "room"])  # fmt: skip
def test_a_build_that_wrote_no_index_removes_its_folder_and_says_when_the_disk_is_full(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, free: int, why: str
) -> None:
    """Anserini logs a full disk and returns: the error said only "wrote no index", and the half-written
    .bm25.building was left, keeping the disk full (full49 F3)."""
    import re
    import shutil
    from collections import namedtuple

    collection, index = tmp_path / "collection", tmp_path / "bm25"
    collection.mkdir()

    def failed_build(source: Path, target: Path, **_: object) -> int:
        target.mkdir(parents=True)
        (target / "write.lock").write_bytes(b"")
        (target / "_0.fdt").write_bytes(b"half a segment")
        return 2

    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(retrieval, "build_bm25_index", failed_build)
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(free * 2, free, free))
    building = re.escape(str(tmp_path / ".bm25.building"))
    with pytest.raises(DilstoreError, match=rf"^pyserini wrote no index to {building}{why}"):
        retrieval.build_bm25_index_in_place(collection, index)
    assert sorted(path.name for path in tmp_path.iterdir()) == ["collection"]


def test_a_build_stopped_by_a_java_error_removes_its_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    collection, index = tmp_path / "collection", tmp_path / "bm25"
    collection.mkdir()

    def failed_build(source: Path, target: Path, **_: object) -> int:
        target.mkdir(parents=True)
        (target / "_0.fdt").write_bytes(b"half a segment")
        raise DilstoreError(f"the BM25 index of {source} could not be built in {target} (java.io.IOException: ...)")

    monkeypatch.setattr(retrieval, "build_bm25_index", failed_build)
    with pytest.raises(DilstoreError, match="could not be built"):
        retrieval.build_bm25_index_in_place(collection, index)
    assert sorted(path.name for path in tmp_path.iterdir()) == ["collection"]


_INDEXED_STORE = SimpleNamespace(generation="0123456789abcdef", passages=3, superseded_passages=0, appends=())


def _old_index_and_a_new_build(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    """(collection, index): an old index in `index`, and a build that Lucene finishes at once (a new segment)."""
    collection, index = tmp_path / "collection", tmp_path / "bm25"
    collection.mkdir()
    index.mkdir()
    (index / "segments_1").write_bytes(b"the old index")

    def built(source: Path, target: Path, **_: object) -> int:
        target.mkdir(parents=True)
        (target / "segments_2").write_bytes(b"a whole new index")
        return 3

    monkeypatch.setattr(retrieval, "build_bm25_index", built)
    return collection, index


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EDQUOT, errno.EIO])
def test_an_index_whose_record_cannot_be_written_is_removed_and_the_old_one_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, code: int
) -> None:
    """Lucene's files fitted and the index's record did not: `dilstore index` said "error: No space left on device"
    alone (a write's error names no file) and left the whole .bm25.building on the disk that had just filled up
    (disk56 F9). Now the folder goes, the old index stays, and the error names the file and what to do: free space
    for a full disk or quota (mut56b M57), check the disk for an I/O error."""
    collection, index = _old_index_and_a_new_build(tmp_path, monkeypatch)
    real_write = Path.write_text

    def refused(path: Path, *args: object, **kwargs: object) -> int:
        if path.name == retrieval.INDEX_RECORD:
            raise OSError(code, os.strerror(code))
        return real_write(path, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(Path, "write_text", refused)
    with pytest.raises(DilstoreError) as raised:
        retrieval.build_bm25_index_in_place(collection, index, store=_INDEXED_STORE)  # type: ignore[arg-type]
    advice = (f"free space on the disk of {tmp_path}, then run the same command again" if code != errno.EIO
              else "check the disk, then run the same command again")  # fmt: skip
    assert str(raised.value) == (
        f"cannot write the BM25 index at {index}: {os.strerror(code)} ({tmp_path / '.bm25.building'}/"
        f"{retrieval.INDEX_RECORD}); {index} is as it was: {advice}")  # fmt: skip
    assert sorted(path.name for path in tmp_path.iterdir()) == ["bm25", "collection"]
    assert [path.name for path in index.iterdir()] == ["segments_1"]


def test_an_index_whose_folder_flush_fails_after_its_move_does_not_say_the_old_one_is_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An error after the new index was moved into place (the flush of its parent folder) leaves the new index there:
    the line names the error but does not say "STORE/bm25 is as it was", which it no longer is (mut56b M61)."""
    collection, index = _old_index_and_a_new_build(tmp_path, monkeypatch)

    def moved_then_failed(finished: Path, target: Path) -> None:
        shutil.rmtree(target)
        finished.rename(target)
        raise OSError(errno.EIO, os.strerror(errno.EIO), str(target.parent))

    monkeypatch.setattr(retrieval, "replace_dir", moved_then_failed)
    with pytest.raises(DilstoreError) as raised:
        retrieval.build_bm25_index_in_place(collection, index, store=_INDEXED_STORE)  # type: ignore[arg-type]
    assert str(raised.value) == (f"cannot write the BM25 index at {index}: Input/output error ({tmp_path}): check "
                                 "the disk, then run the same command again")  # fmt: skip
    assert sorted(path.name for path in index.iterdir()) == [retrieval.INDEX_RECORD, "segments_2"]


def test_a_java_error_is_reported_by_its_deepest_cause() -> None:
    """A full disk during a build ended in Lucene's AlreadyClosedException, "this IndexWriter is closed", and the
    error named that and not the IOException that caused it (full49 F5)."""
    trace = [
        "org.apache.lucene.store.AlreadyClosedException: this IndexWriter is closed",
        "org.apache.lucene.index.IndexWriter.ensureOpen(IndexWriter.java:914)",
        "Caused by:",
        "java.io.IOException: No space left on device",
        "java.base/sun.nio.ch.UnixFileDispatcherImpl.write0(Native Method)",
    ]
    closed = ("org.apache.lucene.store.AlreadyClosedException", "this IndexWriter is closed")
    assert retrieval._java_cause(*closed, trace) == "java.io.IOException: No space left on device"
    assert retrieval._java_cause(*closed, trace[:2]) == (
        "org.apache.lucene.store.AlreadyClosedException: this IndexWriter is closed"
    )


def test_a_chain_of_java_causes_is_reported_by_its_last_one() -> None:
    """Lucene wraps a failed write more than once (an IllegalStateException around AlreadyClosedException around the
    IOException): the deepest cause, the one printed last, is what went wrong; the ones between name consequences."""
    trace = [
        "java.lang.IllegalStateException: the indexing thread failed",
        "io.anserini.index.IndexCollection.run(IndexCollection.java:512)",
        "Caused by:",
        "org.apache.lucene.store.AlreadyClosedException: this IndexWriter is closed",
        "org.apache.lucene.index.IndexWriter.ensureOpen(IndexWriter.java:914)",
        "Caused by:",
        "java.io.IOException: No space left on device",
        "java.base/sun.nio.ch.UnixFileDispatcherImpl.write0(Native Method)",
    ]
    found = retrieval._java_cause("java.lang.IllegalStateException", "the indexing thread failed", trace)
    assert found == "java.io.IOException: No space left on device"
    assert retrieval._NO_SPACE in found  # what build_bm25_index looks for to give the full-disk advice


class _FakeSystem:
    """java.lang.System as _java_stderr_dropped uses it, without a JVM: `err` and `setErr`."""

    err = "stderr"

    @classmethod
    def setErr(cls, stream: object) -> None:  # noqa: N802 (Java's name)
        cls.err = stream


@pytest.mark.parametrize(("quiet", "raised", "err_after", "log_after"), [
    (True, None, "stderr", "on"),
    (True, DilstoreError, "stderr", "on"),
    (True, KeyboardInterrupt, "dropped", "off"),  # the abandoned build goes on: Java stays silent
    (False, None, "stderr", "on"),
], ids=["quiet", "quiet-error", "quiet-ctrl-c", "verbose"])  # fmt: skip
def test_a_build_drops_java_s_stderr_and_log_while_it_runs_unless_verbose(
    monkeypatch: pytest.MonkeyPatch, quiet: bool, raised: type[BaseException] | None, err_after: str, log_after: str
) -> None:
    """A write that failed in Anserini's indexing thread printed a 40-line stack trace on Java's System.err above the
    command's one error line (full49 F5), and its log's ERROR line stayed (docs50 L4); --verbose keeps both."""
    import types

    log = ["on"]
    monkeypatch.setattr(retrieval, "_log4j_off", lambda: (log.append("off"), lambda: log.append("on"))[1])

    classes = {"java.lang.System": _FakeSystem, "java.io.OutputStream": types.SimpleNamespace(
        nullOutputStream=lambda: "null"), "java.io.PrintStream": lambda stream: "dropped"}  # fmt: skip
    monkeypatch.setitem(sys.modules, "jnius", types.SimpleNamespace(autoclass=classes.__getitem__))
    monkeypatch.setattr(_FakeSystem, "err", "stderr")
    if quiet:
        monkeypatch.setenv(quiet_mode.QUIET_ENV, "1")
    else:
        monkeypatch.delenv(quiet_mode.QUIET_ENV, raising=False)
    seen: list[object] = []
    with contextlib.suppress(DilstoreError, KeyboardInterrupt), retrieval._java_stderr_dropped():
        seen.append((_FakeSystem.err, log[-1]))
        if raised is not None:
            raise raised("stop")
    assert seen == ([("dropped", "off")] if quiet else [("stderr", "on")])
    assert (_FakeSystem.err, log[-1]) == (err_after, log_after)


@pytest.mark.parametrize(
    ("limit_mib", "mapped_mib", "expected"),
    [
        (None, 1500, ["-Xmx4g"]),  # no address-space limit: the usual heap
        (10_000, 1500, ["-Xmx4g"]),  # room for the default heap and reservations
        # a quarter of the 1,600 MiB left, and smaller fixed reservations
        (3000, 1400, ["-Xmx400m", "-XX:CompressedClassSpaceSize=128m", "-XX:ReservedCodeCacheSize=64m"]),
        (2441, 1533, None),  # 908 MiB left: refused in one line
        (2734, 1364, None),  # 1,370 MiB left: `ask`'s JVM aborted the process (journey59 F4)
        # (mut59b M4) the bounds themselves: 7 GiB left is room for the default heap, 1,500 MiB the least started
        (8192, 1024, ["-Xmx4g"]),
        (3000, 1500, ["-Xmx375m", "-XX:CompressedClassSpaceSize=128m", "-XX:ReservedCodeCacheSize=64m"]),
        (1000, 1200, None),  # more mapped than the limit (lowered below what is in use): 0 MiB left, not -200
    ],
)
def test_the_jvm_fits_its_heap_to_the_address_space_limit_or_is_refused_naming_it(
    monkeypatch: pytest.MonkeyPatch, limit_mib: int | None, mapped_mib: int, expected: list[str] | None
) -> None:
    """Under `ulimit -v` below about 7 GiB the JVM could not reserve its 4 GiB heap and 1 GiB class space: it printed
    "Could not reserve enough space for 4194304 KB object heap" and ended the process with exit 1, no dilstore line
    (limits59 F2). With 1,370 MiB left, over the 1,200 it then asked for, `ask`'s JVM started and then aborted the
    process, exit 1, leaving an hs_err_pid*.log in the current folder (journey59 F4)."""
    import resource

    mib = 1 << 20
    limits = {resource.RLIMIT_AS: (resource.RLIM_INFINITY if limit_mib is None else limit_mib * mib,) * 2}
    real = resource.getrlimit
    monkeypatch.setattr(resource, "getrlimit", lambda which: limits.get(which) or real(which))
    monkeypatch.setattr(retrieval, "mapped_bytes", lambda: mapped_mib * mib)
    if expected is not None:
        assert retrieval.jvm_memory_options("4g") == expected
        return
    assert limit_mib is not None
    left = max(limit_mib - mapped_mib, 0)
    words = f"address-space limit \\(ulimit -v\\) is {limit_mib:,} MiB, of which {left:,} MiB are left"
    with pytest.raises(DilstoreError, match=f"{words}, and the JVM needs about 1,500 MiB; raise the limit"):
        retrieval.jvm_memory_options("4g")


def test_the_mapped_bytes_are_this_process_s_address_space() -> None:
    """(mut59b M4) Bytes, not /proc's kB: the size in pages of /proc/self/statm, read just after, is close to it."""
    mapped = retrieval.mapped_bytes()
    statm = Path("/proc/self/statm")
    if not statm.is_file():
        assert mapped == 0
        return
    pages = int(statm.read_text().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    assert 0.5 * pages < mapped < 2 * pages


@pytest.fixture
def jvm_options(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The options `start_jvm("4g")` starts the JVM with, the memory options standing as `-Xmx4g-fitted`. No JVM
    starts here: jnius_config and jnius are stand-ins that record the options."""
    import types

    options: list[str] = []
    config = types.SimpleNamespace(vm_running=False, add_classpath=lambda *paths: None,
                                   add_options=lambda *given: options.extend(given))  # fmt: skip
    monkeypatch.setitem(sys.modules, "jnius_config", config)
    monkeypatch.setitem(sys.modules, "jnius", types.SimpleNamespace())
    monkeypatch.setattr(retrieval, "_JVM_STARTED", False)
    monkeypatch.setattr(retrieval, "jvm_memory_options", lambda max_heap: [f"-Xmx{max_heap}-fitted"])
    monkeypatch.setenv("JAVA_HOME", "unset")
    monkeypatch.delenv(quiet_mode.QUIET_ENV, raising=False)
    retrieval.start_jvm("4g")
    return options


def test_the_jvm_starts_with_the_memory_options_the_address_space_limit_leaves_room_for(
    jvm_options: list[str],
) -> None:
    """(mut59b M5) jvm_memory_options was tested alone: start_jvm could start the JVM with `-Xmx4g` still, which
    under `ulimit -v` ends the process (limits59 F2), and no test noticed."""
    assert jvm_options[:2] == ["-Xmx4g-fitted", "-Xrs"]


def test_the_jvm_opens_no_attach_socket_a_kill_would_leave_in_tmp(jvm_options: list[str]) -> None:
    """(leak60 F2) Under -Xrs the JVM opens its attach socket, /tmp/.java_pidPID, as it starts and removes it only at
    a normal exit: every `index`, `ask`, `evaluate-qa`, `verify` or `serve` killed (SIGKILL, the out-of-memory
    killer) left one in /tmp, whatever TMPDIR said, and nothing removed it (checked with a real JVM: the socket is
    there under -Xrs alone, not with the attach mechanism off)."""
    assert "-XX:+DisableAttachMechanism" in jvm_options
