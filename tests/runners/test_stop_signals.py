"""SIGTERM and SIGHUP stop a command as Ctrl-C does: one line, exit 128 + the signal, temporary folders removed.

`index` of an appended store copies the store's passage text into $TMPDIR; SIGTERM ended it at once with status
-15, no line, and the copy left behind (crash36 8).
"""

from __future__ import annotations

import logging
import signal
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from dilstore.runners import cli, cmd_index
from dilstore.runners.stop_signals import (
    Terminated,
    _noticed_at_once,
    drop_interrupted_work,
    signals_interrupt,
    stopping,
)
from tests.fixtures.pipeline_fixtures import save_tiny_reader, wiki_like_documents, write_jsonl

STOPPING = (signal.SIGTERM, signal.SIGHUP)


@pytest.fixture(autouse=True)
def _handlers_back() -> Iterator[None]:
    before = {number: signal.getsignal(number) for number in STOPPING}
    yield
    for number, handler in before.items():
        signal.signal(number, handler)


@pytest.fixture(scope="module")
def appended_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("appended")
    model = save_tiny_reader(folder / "tiny")
    documents = wiki_like_documents(8, words=20)
    store = folder / "store"
    common = ["--model", str(model), "--output", str(store), "--workers", "1", "--threads", "1", "--shards", "1",
              "--max-length", "32", "--no-progress"]  # fmt: skip
    assert cli.main(["precompute", "--input", str(write_jsonl(folder / "a.jsonl", documents[:5])), *common]) == 0
    assert cli.main(["precompute", "--input", str(write_jsonl(folder / "b.jsonl", documents[5:])), "--append",
                     *common]) == 0  # fmt: skip
    return store


@pytest.mark.parametrize("number", STOPPING, ids=lambda number: signal.Signals(number).name)
def test_a_signal_raises_terminated_and_the_handlers_before_are_back(number: int) -> None:
    signal.signal(number, signal.SIG_DFL)
    with pytest.raises(Terminated) as stop, signals_interrupt():
        signal.raise_signal(number)
    assert isinstance(stop.value, KeyboardInterrupt) and stop.value.signal_number == number
    assert str(stop.value) == f"stopped by {signal.Signals(number).name}"
    assert signal.getsignal(number) is signal.SIG_DFL


def test_ctrl_c_raises_a_plain_keyboard_interrupt_and_a_handler_of_its_own_keeps_sigint() -> None:
    """Ctrl-C is KeyboardInterrupt itself, which a command words "interrupted"; a SIGINT handler other than Python's
    own, in place before the block, keeps the signal (mut58: both were untested)."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt) as stop, signals_interrupt():
            signal.raise_signal(signal.SIGINT)
        assert type(stop.value) is KeyboardInterrupt
        received: list[int] = []
        signal.signal(signal.SIGINT, lambda number, _frame: received.append(number))
        try:
            with signals_interrupt():
                signal.raise_signal(signal.SIGINT)
        except KeyboardInterrupt:
            pytest.fail("the block took SIGINT from the handler in place before it")
        assert received == [signal.SIGINT]
    finally:
        signal.signal(signal.SIGINT, previous)


def test_after_a_stop_threads_exceptions_and_log_records_are_dropped(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """With worker processes, Beam's threads reported each worker the signal ended, with tracebacks."""
    shown: list[str] = []
    monkeypatch.setattr(threading, "excepthook", lambda arguments: shown.append(str(arguments.exc_value)))

    def fail(message: str) -> None:
        thread = threading.Thread(target=lambda: (_ for _ in ()).throw(RuntimeError(message)))
        thread.start()
        thread.join()

    with signals_interrupt(mute_when_stopping=True):
        fail("before the stop")
        logging.getLogger("apache_beam").error("before the stop")
        with pytest.raises(Terminated):
            signal.raise_signal(signal.SIGTERM)
        assert stopping.is_set()
        fail("after the stop")
        logging.getLogger("apache_beam").error("after the stop")
    assert not stopping.is_set() and not logging.root.manager.disable, "both are back after the block"
    assert shown == ["before the stop"]
    assert [record.getMessage() for record in caplog.records] == ["before the stop"]


def test_a_handler_set_inside_the_block_keeps_the_signal_to_itself() -> None:
    """A training run checkpoints its step on SIGTERM and the server drains its requests: nothing is muted then."""
    asked = []
    with signals_interrupt(mute_when_stopping=True):
        signal.signal(signal.SIGTERM, lambda number, frame: asked.append(number))
        signal.raise_signal(signal.SIGTERM)
        time.sleep(0.2)  # the wake-up thread's turn
        assert asked == [signal.SIGTERM] and not stopping.is_set() and not logging.root.manager.disable


@pytest.mark.parametrize("ours", [True, False], ids=["the-commands-handler", "a-handler-set-in-the-block"])
def test_the_watcher_sets_stopping_as_the_signal_arrives_unless_a_handler_in_the_block_takes_it(ours: bool) -> None:
    """The main thread may run its Python handler a second late while Beam's threads already print what the
    stop did to the workers; the watcher reads the signal's wake-up byte and sets `stopping` at once.

    The Python handler here does nothing, so only the watcher can set `stopping`.
    """
    signal.signal(signal.SIGTERM, lambda number, frame: None)
    try:
        with _noticed_at_once(lambda number: ours, mute=False):
            signal.raise_signal(signal.SIGTERM)
            if ours:
                assert stopping.wait(5), "the watcher did not set stopping"
        # The block's end closes the pipe and joins the watcher, which has read the byte by then.
        assert not [thread for thread in threading.enumerate() if thread.name == "dilstore-stop-watcher"]
        assert stopping.is_set() == ours
    finally:
        stopping.clear()


def test_an_ignored_hangup_stays_ignored() -> None:
    """Under `nohup` the command must outlive its terminal."""
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    with signals_interrupt():
        assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
        signal.raise_signal(signal.SIGHUP)
    assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN


@pytest.mark.parametrize("number", STOPPING, ids=lambda number: signal.Signals(number).name)
def test_index_stopped_by_a_signal_says_so_in_one_line_and_removes_its_copy_of_the_passages(
    appended_store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
    number: int,
) -> None:
    copies: list[Path] = []

    def signalled(collection: Path, *args: object) -> None:
        copies.append(collection)
        assert any(collection.glob("*.jsonl")), "the live passages are copied before the build"
        signal.raise_signal(number)  # as `kill` sends it while Anserini builds
        raise AssertionError("the signal did not stop the command")

    def unhandled(number: int, frame: object) -> None:
        raise AssertionError("the signal reached the test's own handler: the command set none")

    monkeypatch.setattr(cmd_index, "build_index", signalled)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    signal.signal(number, unhandled)  # the default would end pytest
    status = cli.main(["index", str(appended_store)])
    assert signal.getsignal(number) is unhandled, "the command gives the handler back"
    assert status == 128 + number
    assert capsys.readouterr().err == f"dilstore index: stopped by {signal.Signals(number).name}\n"
    assert copies and copies[0].parent == tmp_path
    assert not list(tmp_path.iterdir()), "the copy of the passages is removed"
    assert not (appended_store / "bm25").exists()


def test_a_second_signal_while_the_command_stops_does_not_cut_its_cleanup_short(
    appended_store: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A second Ctrl-C while `evaluate-rc` or `rerank` freed what it left (about a second) printed a traceback over
    the one line (longrun45 F2): the handlers given back by then were the defaults. Here the one given back raises."""
    freed: list[BaseException] = []

    def stopped(*_: object) -> None:
        signal.raise_signal(signal.SIGTERM)
        raise AssertionError("the signal did not stop the command")

    def again(interrupt: BaseException) -> None:
        signal.raise_signal(signal.SIGTERM)  # the second signal, as the command cleans up
        freed.append(interrupt)

    def unhandled(number: int, frame: object) -> None:
        raise AssertionError("the second signal reached the handler given back")

    monkeypatch.setattr(cmd_index, "build_index", stopped)
    monkeypatch.setattr(cli, "drop_interrupted_work", again)
    signal.signal(signal.SIGTERM, unhandled)
    assert cli.main(["index", str(appended_store)]) == 128 + signal.SIGTERM
    assert capsys.readouterr().err == "dilstore index: stopped by SIGTERM\n" and len(freed) == 1
    assert signal.getsignal(signal.SIGTERM) is unhandled


@pytest.mark.parametrize("ignored", [True, False], ids=["under-nohup", "from-a-terminal"])
def test_serve_leaves_an_ignored_hangup_ignored(ignored: bool) -> None:
    """`nohup dilstore serve` stopped when its terminal closed: the server set its SIGHUP handler over the ignore."""
    import uvicorn

    from dilstore.runners.cmd_serve import hangup_stops

    before = signal.SIG_IGN if ignored else signal.SIG_DFL
    signal.signal(signal.SIGHUP, before)
    with hangup_stops(uvicorn.Server(uvicorn.Config(app=None))):
        assert (signal.getsignal(signal.SIGHUP) is signal.SIG_IGN) == ignored
    assert signal.getsignal(signal.SIGHUP) is before


def test_an_interrupt_cancels_the_reads_left_on_zarr_s_event_loop(caplog: pytest.LogCaptureFixture) -> None:
    """Ctrl-C during `verify` left zarr's reads pending on its loop's thread; at exit the loop's close reported up to
    90 "Task was destroyed but it is pending!" and "Event loop is closed" tracebacks after the one line (cli43 M1)."""
    import asyncio

    from zarr.core.sync import _get_loop

    loop = _get_loop()
    pending = asyncio.run_coroutine_threadsafe(asyncio.sleep(60), loop)
    time.sleep(0.05)  # the read has begun on the loop's thread
    assert not pending.done()
    with caplog.at_level(logging.ERROR, logger="asyncio"):
        drop_interrupted_work(KeyboardInterrupt())
        assert pending.cancelled()
        time.sleep(0.05)
    assert not caplog.records
    assert asyncio.run_coroutine_threadsafe(asyncio.sleep(0, "still serves"), loop).result(5) == "still serves"


def test_an_interrupt_between_zarr_making_its_io_thread_and_starting_it_leaves_no_exit_traceback() -> None:
    """A Ctrl-C inside zarr's `_get_loop`, after it made its IO thread and before it started it: zarr's exit handler
    joined the thread that never ran and printed "RuntimeError: cannot join thread before it is started" under
    precompute's one line (seen once in the suite, s56). The half-built loop is closed and forgotten; zarr makes
    another at its next use."""
    import asyncio

    from zarr.core import sync

    half_built = asyncio.new_event_loop()
    never_started = threading.Thread(target=half_built.run_forever, name="zarr_io", daemon=True)
    running = sync.loop[0], sync.iothread[0]  # this process's own loop, if a test made one: put back after
    sync.loop[0], sync.iothread[0] = half_built, never_started
    try:
        drop_interrupted_work(KeyboardInterrupt())
        # zarr's exit handler (`cleanup_resources`) joins iothread[0] when loop[0] is set: nothing left to join
        assert (sync.loop[0], sync.iothread[0]) == (None, None)
        assert half_built.is_closed()
    finally:
        sync.loop[0], sync.iothread[0] = running
