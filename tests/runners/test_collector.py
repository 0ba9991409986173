"""The collector is held off while a command loads what it keeps, and given everything back when it is done."""

from __future__ import annotations

import gc
import sys
from types import SimpleNamespace

import pytest

from dilstore.runners import cli, cmd_ask
from dilstore.runners.collector import loading_for_good, thaw


class Cycle:
    """An object in a reference cycle: only the cyclic collector frees it."""

    def __init__(self) -> None:
        self.me = self


def test_loading_freezes_what_it_made_and_the_collector_scans_only_what_comes_after() -> None:
    assert gc.isenabled()
    try:
        with loading_for_good():
            assert not gc.isenabled(), "no collection while loading"
            kept = Cycle()
            with loading_for_good():  # inside another: leaves the collector off
                assert not gc.isenabled()
            assert not gc.isenabled()
        assert gc.isenabled() and gc.get_freeze_count() > 0
        later = Cycle()
        assert not any(item is kept for item in gc.get_objects()), "frozen: no collection scans it"
        assert any(item is later for item in gc.get_objects())
    finally:
        thaw()
    assert gc.get_freeze_count() == 0 and any(item is kept for item in gc.get_objects())


def test_a_command_gives_the_frozen_objects_back_when_it_ends(monkeypatch: pytest.MonkeyPatch) -> None:
    """A program running commands in one process (the tests do) would never collect their objects' cycles."""
    seen = {}

    def loading(args: object) -> object:
        seen["during"] = gc.isenabled()
        return SimpleNamespace(answer=str, read_with=None)

    monkeypatch.setattr(cmd_ask, "open_odqa_reader", loading)
    monkeypatch.setattr(cmd_ask, "print_answer", lambda *args: seen.update(frozen=gc.get_freeze_count() > 0))
    assert cli.main(["ask", "store", "a question"]) == 0
    assert seen == {"during": False, "frozen": True} and gc.isenabled() and gc.get_freeze_count() == 0


def test_a_load_that_fails_freezes_nothing() -> None:
    """What a stopped load left behind was frozen, out of reach of the silenced collection that drops a stop's work
    (stop_signals.drop_interrupted_work), and a later collection freed it out loud (review49 F5)."""
    with pytest.raises(KeyboardInterrupt), loading_for_good():
        Cycle()
        raise KeyboardInterrupt
    assert gc.isenabled() and gc.get_freeze_count() == 0


def test_a_process_that_ends_with_its_command_keeps_the_frozen_objects_frozen(monkeypatch: pytest.MonkeyPatch) -> None:
    """The interpreter's collection at exit scanned everything given back: a one-question `ask` ended 1.4 s later."""
    monkeypatch.setattr(cmd_ask, "open_odqa_reader", lambda args: SimpleNamespace(answer=str, read_with=None))
    monkeypatch.setattr(cmd_ask, "print_answer", lambda *args: None)
    monkeypatch.setattr(sys, "argv", ["dilstore", "ask", "store", "a question"])
    try:
        assert cli.command() == 0 and gc.isenabled() and gc.get_freeze_count() > 0
    finally:
        thaw()
