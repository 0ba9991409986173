"""The collector is held off while a command loads what it keeps, and given everything back when it is done."""

from __future__ import annotations

import gc

import pytest

from dilstore.runners import cli, cmd_ask
from dilstore.runners.collector import loading_for_good, thaw
from dilstore.storage.errors import DilstoreError


class Cycle:
    """An object in a reference cycle: only the cyclic collector frees it."""

    def __init__(self) -> None:
        self.me = self


def test_loading_collects_once_then_freezes_what_is_kept() -> None:
    assert gc.isenabled()
    try:
        with loading_for_good():
            assert not gc.isenabled(), "no collection while loading"
            kept = [Cycle() for _ in range(3)]
            Cycle()  # garbage that loading left in a cycle: collected once, not frozen for good
            with loading_for_good():  # inside another: leaves the collector off
                assert not gc.isenabled()
            assert not gc.isenabled()
        assert gc.isenabled() and gc.get_freeze_count() > 0
        assert all(gc.is_tracked(cycle) for cycle in kept)
        assert not [item for item in gc.get_objects() if type(item) is Cycle and item not in kept]
    finally:
        thaw()
    assert gc.get_freeze_count() == 0


def test_a_command_gives_the_frozen_objects_back_when_it_ends(monkeypatch: pytest.MonkeyPatch) -> None:
    """A program running commands in one process (the tests do) would never collect their objects' cycles."""
    seen = {}

    def loading(args: object) -> object:
        seen["during"] = gc.isenabled()
        raise DilstoreError("stop here")  # after the load: the question is never answered

    monkeypatch.setattr(cmd_ask, "open_odqa_reader", loading)
    assert cli.main(["ask", "store", "a question"]) == 2
    assert seen == {"during": False} and gc.isenabled() and gc.get_freeze_count() == 0
