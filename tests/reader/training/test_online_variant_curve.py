"""benchmarks/online_variant_curve.py: each checkpoint of a `--store-encoding` run packaged and scored once.

mini_opensquad.py itself is tested on a tiny corpus elsewhere
(tests/reader/serving/test_odqa_retrieval.py); here it is replaced by a fake
that records its arguments, so the test checks the curve's own logic: step 0
is the base with its own online layers, every checkpoint becomes a packaged
variant that loads, results are reused on a second call, and the rows follow
the run's position.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dilstore.reader.modeling.dilbert import DilBertReader
from dilstore.reader.training.qa import TrainingConfig, train_qa
from tests.fixtures.benchmarks import benchmark_module
from tests.fixtures.qa_training_fixtures import SMALL_WINDOWS, assert_holds_the_online_layers_of


def test_every_checkpoint_is_packaged_scored_once_and_becomes_a_row(
    tiny_base: Path, squad_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = DilBertReader.from_pretrained(tiny_base, layers=1).save_pretrained(tmp_path / "base")
    config = TrainingConfig(layers=1, max_steps=2, batch_size=2, learning_rate=1e-3, save_every=1, keep_checkpoints=5,
                            log_every=1000, freeze_lower=True, store_encoding="2bit", **SMALL_WINDOWS)  # fmt: skip
    train_qa(base, squad_file, tmp_path / "run", config, command="test", progress=False)
    calls = []

    def fake_mini_opensquad(arguments: list[str]) -> int:
        calls.append(arguments)
        model = Path(arguments[arguments.index("--model") + 1])
        variant = None if "--no-online-variant" in arguments else "online-2bit.safetensors"
        f1 = 50.0 + len(calls)
        result = {"encoding": "2bit", "model": {"online_variant": variant},
                  "rows": [{"top_p": 29, "f1_with_bm25": f1, "f1_without_bm25": f1 - 3, "recall": 95.0}]}
        Path(arguments[arguments.index("--output") + 1]).write_text(json.dumps(result))
        assert (model / "config.json").is_file()
        return 0

    arguments = [str(tmp_path / "run"), "--store", "STORE", "--work", str(tmp_path / "work"), "--base", str(base)]
    with benchmark_module("online_variant_curve") as script:
        script.mini_opensquad.main = fake_mini_opensquad
        assert script.main(arguments) == 0
        rows = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
        assert [row["step"] for row in rows] == [0, 1, 2]  # the base, the periodic checkpoint, the final model
        assert [row["questions_seen"] for row in rows] == [0, 2, 4]
        assert rows[0]["online_variant"] is None and rows[1]["online_variant"] == "online-2bit.safetensors"
        assert [row["f1_fused"] for row in rows] == [51.0, 52.0, 53.0]
        assert "--no-online-variant" in calls[0] and all("--no-online-variant" not in call for call in calls[1:])
        step_1 = next((tmp_path / "run" / "checkpoints").glob("step-*1"))
        assert_holds_the_online_layers_of(tmp_path / "work" / "step-1", "2bit", step_1, base)
        assert_holds_the_online_layers_of(tmp_path / "work" / "step-2", "2bit", tmp_path / "run", base)
        assert script.main(arguments) == 0
        assert len(calls) == 3, "a second call scores nothing again"


def test_a_call_with_other_settings_or_another_run_is_refused_not_answered_from_the_earlier_scores(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """bench53 F12: DIR/step-N.json and DIR/step-N were reused by step number alone, so `--limit 5` after a
    `--limit 300` call printed the 300-question scores, and another run's curve scored the first run's models."""
    calls: list[list[str]] = []

    def fake_mini_opensquad(arguments: list[str]) -> int:
        calls.append(arguments)
        result = {"encoding": "2bit", "model": {"online_variant": None},
                  "rows": [{"top_p": 29, "f1_with_bm25": 50.0, "f1_without_bm25": 47.0, "recall": 95.0}]}
        Path(arguments[arguments.index("--output") + 1]).write_text(json.dumps(result))
        return 0

    for run in ("run", "other-run"):
        (tmp_path / run).mkdir()
    arguments = [str(tmp_path / "run"), "--store", "STORE", "--work", str(tmp_path / "work"), "--base", "BASE"]
    with benchmark_module("online_variant_curve") as script:
        script.mini_opensquad.main = fake_mini_opensquad
        assert script.main(arguments) == 0
        capsys.readouterr()
        assert script.main([*arguments, "--limit", "5"]) == 2
        assert "holds a curve of limit 300 (asked: 5): give another --work" in capsys.readouterr().err
        assert script.main([str(tmp_path / "other-run"), *arguments[1:]]) == 2
        assert f"run {tmp_path / 'run'} (asked: {tmp_path / 'other-run'})" in capsys.readouterr().err
        assert script.main(arguments) == 0, "the same settings again: the kept scores"
    assert len(calls) == 1
