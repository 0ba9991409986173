"""benchmarks/reader_curve.py: every checkpoint of a run scored on one seeded dev subset, cached across calls."""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import pytest

from dilstore.reader.training.qa import TrainingConfig, train_qa
from tests.fixtures.paths import ROOT
from tests.fixtures.qa_training_fixtures import SMALL_WINDOWS


def curve_script():
    spec = importlib.util.spec_from_file_location("reader_curve", ROOT / "benchmarks" / "reader_curve.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _train_three_steps(tiny_base: Path, squad_file: Path, run: Path) -> None:
    """A tiny run with a checkpoint at steps 1 and 2 and its final model at step 3."""
    config = TrainingConfig(layers=1, max_steps=3, batch_size=2, learning_rate=1e-3, save_every=1,
                            keep_checkpoints=5, log_every=1000, **SMALL_WINDOWS)  # fmt: skip
    train_qa(tiny_base, squad_file, run, config, command="test curve", progress=False)


def test_every_checkpoint_is_a_point_and_scores_are_cached(
    tiny_base: Path, squad_file: Path, tmp_path: Path, capsys, monkeypatch: pytest.MonkeyPatch
) -> None:
    _train_three_steps(tiny_base, squad_file, tmp_path / "run")
    script = curve_script()
    arguments = [str(tmp_path / "run"), "--dev", str(squad_file), "--limit", "4", "--cache",
                 str(tmp_path / "cache.json"), "--png", str(tmp_path / "curve.png"), "--threads", "1"]  # fmt: skip
    capsys.readouterr()
    assert script.main(arguments) == 0
    rows = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert [row["step"] for row in rows] == [1, 2, 3], "two periodic checkpoints, then the final model"
    assert [row["windows_seen"] for row in rows] == [2, 4, 6]
    assert rows[-1]["checkpoint"] == str(tmp_path / "run") and rows[-1]["run"] == "run" == rows[0]["run"]
    assert all(row["questions"] == 4 and 0 <= row["f1"] <= 100 and row["k"] == 1 for row in rows)
    assert (tmp_path / "curve.png").stat().st_size > 0

    def no_evaluation(*args, **kwargs):
        raise AssertionError("a cached point was evaluated again")

    monkeypatch.setattr(script, "evaluate_file", no_evaluation)
    assert script.main(arguments) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1]) == rows

    scored = tmp_path / "rows.json"
    scored.write_text(json.dumps(rows), encoding="utf-8")
    (tmp_path / "curve.png").unlink()
    assert script.main(["--scored", str(scored), "--png", str(tmp_path / "curve.png")]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1]) == rows, "rows scored elsewhere, unchanged"
    assert (tmp_path / "curve.png").stat().st_size > 0


def test_a_checkpoint_pruned_while_the_curve_is_scored_is_skipped_with_a_line(
    tiny_base: Path, squad_file: Path, tmp_path: Path, capsys, monkeypatch: pytest.MonkeyPatch
) -> None:
    _train_three_steps(tiny_base, squad_file, tmp_path / "run")
    script = curve_script()
    evaluate, pruned = script.evaluate_file, tmp_path / "run" / "checkpoints" / "step-0000002"

    def evaluate_then_prune(*args, **kwargs):
        result = evaluate(*args, **kwargs)
        shutil.rmtree(pruned, ignore_errors=True)  # what a run still training does to an off-grid checkpoint
        return result

    monkeypatch.setattr(script, "evaluate_file", evaluate_then_prune)
    capsys.readouterr()
    assert script.main([str(tmp_path / "run"), "--dev", str(squad_file), "--limit", "4", "--cache",
                        str(tmp_path / "cache.json"), "--threads", "1"]) == 0  # fmt: skip
    out, err = capsys.readouterr()
    assert [row["step"] for row in json.loads(out.strip().splitlines()[-1])] == [1, 3]
    assert f"{pruned} is gone" in err


@pytest.mark.parametrize(
    "content",
    ["not json", json.dumps({"run": "a"}), json.dumps([{"run": "a", "step": 1}])],
    ids=["text", "object", "keys"],
)
def test_scored_rows_that_are_not_curve_rows_are_refused_by_name(tmp_path: Path, capsys, content: str) -> None:
    scored = tmp_path / "rows.json"
    scored.write_text(content, encoding="utf-8")
    assert curve_script().main(["--scored", str(scored)]) == 2
    assert f"reader_curve: error: {scored}" in capsys.readouterr().err


@pytest.mark.parametrize("png", ["missing/curve.png", "rows.json", "curve.json"])
def test_a_plot_that_could_not_be_written_is_refused_before_any_row_is_read(
    tmp_path: Path, capsys, png: str
) -> None:
    """A --png in a missing folder, onto an input or in a format matplotlib refuses was a traceback after every
    checkpoint had been scored."""
    scored = tmp_path / "rows.json"
    scored.write_text("[]", encoding="utf-8")
    assert curve_script().main(["--scored", str(scored), "--png", str(tmp_path / png)]) == 2
    assert f"reader_curve: error: --png {tmp_path / png}" in capsys.readouterr().err
    assert scored.read_text(encoding="utf-8") == "[]"


def test_runs_and_scored_rows_do_not_mix(tmp_path: Path) -> None:
    with pytest.raises(SystemExit) as stopped:
        curve_script().main([str(tmp_path), "--scored", str(tmp_path / "rows.json")])
    assert stopped.value.code == 2


@pytest.mark.parametrize(
    ("content", "message"),
    [('{"steps": 10, "layers": 1}', " is not a cache of scores"), ("[]", " is not a cache of scores"),
     ("not json", ": not valid JSON (line 1"), (None, " is a folder")],
    ids=["a run's training record", "list", "text", "folder"],
)  # fmt: skip
def test_a_cache_that_is_no_cache_of_scores_is_refused_before_any_evaluation(
    tmp_path: Path, capsys, content: str | None, message: str
) -> None:
    """Scores were written into whatever JSON object --cache named (a run's own dilstore_training.json), and other
    files failed with a traceback after the first checkpoint was scored."""
    cache = tmp_path / "cache.json"
    if content is None:
        cache.mkdir()
    else:
        cache.write_text(content, encoding="utf-8")
    run = tmp_path / "run"
    run.mkdir()
    assert curve_script().main([str(run), "--dev", str(tmp_path / "dev.json"), "--cache", str(cache)]) == 2
    assert f"reader_curve: error: --cache {cache}{message}" in capsys.readouterr().err
    assert content is None or cache.read_text(encoding="utf-8") == content
