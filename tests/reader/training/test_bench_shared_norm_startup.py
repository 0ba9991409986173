"""benchmarks/bench_shared_norm_startup.py: both paths give the same groups, and the table it prints."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from tests.fixtures.benchmarks import benchmark_module
from tests.reader.training.test_shared_norm import write_handful_triples


@pytest.fixture(scope="module")
def bench():
    with benchmark_module("bench_shared_norm_startup") as module:
        yield module


def test_the_script_times_both_paths_on_the_same_groups(
    bench, squad_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    triples = write_handful_triples(tmp_path / "ranking", negatives=3)
    assert bench.main(["--train", str(squad_file), "--triples", str(triples), "--questions", "6"]) == 0
    rows = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert [row["path"] for row in rows] == ["one call per text (before)", "batched (now)"]
    assert all(row["questions"] == row["groups"] == 6 and row["seconds"] >= 0 for row in rows)
    assert rows[0]["speed_up"] == 1.0


def test_a_changed_window_is_told_apart(bench, squad_file: Path, tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    from dilstore.reader.data.squad import load_squad
    from dilstore.reader.modeling.checkpoints import base_model_dir
    from dilstore.reader.training.qa import TrainingConfig

    triples = write_handful_triples(tmp_path / "ranking", negatives=3)
    tokenizer = AutoTokenizer.from_pretrained(base_model_dir())
    groups = bench.groups_one_call_per_text(tokenizer, load_squad(squad_file), triples, 3, TrainingConfig(layers=0))
    assert bench.same_windows(groups, groups)
    moved = [list(group) for group in groups]
    moved[2][0] = dataclasses.replace(moved[2][0], start_position=moved[2][0].start_position + 1)
    assert not bench.same_windows(groups, moved)
