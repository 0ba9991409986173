"""benchmarks/bench_mapped_checks.py: fetch latency with serve's file check and without, side by side."""

from __future__ import annotations

import json

from tests.fixtures.benchmarks import benchmark_module


def test_both_settings_are_timed_and_the_store_is_left_checking(capsys, monkeypatch) -> None:
    with benchmark_module("bench_mapped_checks") as script:
        settings: list[bool] = []
        fetch = script.fetch_microseconds

        def recorded(store, ids, fetches):  # which setting each round ran with
            settings.append(store.check_files)
            return fetch(store, ids, fetches)

        monkeypatch.setattr(script, "fetch_microseconds", recorded)
        assert script.main(["--shards", "2", "--passages", "5", "--ids", "1", "3", "--fetches", "3",
                            "--rounds", "2"]) == 0  # fmt: skip
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert [row["ids_per_fetch"] for row in result["rows"]] == [1, 3]
    assert all(row["checked_us"] > 0 and row["unchecked_us"] > 0 for row in result["rows"])
    assert settings == [True, False] * 4  # alternating rounds, the check on, then off
