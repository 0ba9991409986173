"""Where training runs live and how often they checkpoint: a killed run loses minutes, not hours.

The tiny random reader keeps each run to a second or two.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from safetensors.torch import load_file, save_file

from dilstore.reader.training.checkpoint_files import STATE_JSON, latest_checkpoint, step_directory
from dilstore.reader.training.qa import TrainingConfig, train_qa
from dilstore.reader.training.state import prune_checkpoints, remove_partial_checkpoints
from dilstore.runners.cli import main
from dilstore.storage.errors import DilstoreError
from tests.fixtures.locks import held_lock
from tests.fixtures.paths import ROOT
from tests.fixtures.qa_training_fixtures import SMALL_WINDOWS
from tests.fixtures.training_runs import cut_after_last_checkpoint


def test_checkpoints_are_saved_by_time_without_a_step_interval(
    tiny_base: Path, squad_file: Path, tmp_path: Path
) -> None:
    """With save_every=0 and a tiny time interval, every step but the last leaves a resumable checkpoint."""
    config = TrainingConfig(
        layers=1, max_steps=3, batch_size=2, save_every=0, save_every_minutes=1e-9, keep_checkpoints=10, **SMALL_WINDOWS
    )
    train_qa(tiny_base, squad_file, tmp_path, config, command="t", progress=False)
    steps = sorted(path.name for path in (tmp_path / "checkpoints").iterdir())
    assert steps == ["step-0000001", "step-0000002"]


def test_time_checkpoints_do_not_push_out_the_step_checkpoints(
    tiny_base: Path, squad_file: Path, tmp_path: Path
) -> None:
    """A checkpoint every step by time and every 2 steps by count, keeping 1: the newest even step stays, and
    of the odd (time) ones only the newest, for resuming."""
    config = TrainingConfig(
        layers=1, max_steps=6, batch_size=2, save_every=2, save_every_minutes=1e-9, keep_checkpoints=1, **SMALL_WINDOWS
    )
    train_qa(tiny_base, squad_file, tmp_path, config, command="t", progress=False)
    steps = sorted(path.name for path in (tmp_path / "checkpoints").iterdir())
    assert steps == ["step-0000004", "step-0000005"]


def _complete_checkpoints(folder: Path, steps: set[int]) -> None:
    for step in steps:
        step_directory(folder, step).mkdir(parents=True)
        (step_directory(folder, step) / STATE_JSON).write_text("{}", encoding="utf-8")


@settings(max_examples=60, deadline=None)
@given(steps=st.sets(st.integers(1, 60), min_size=1, max_size=25), keep=st.integers(1, 6), every=st.integers(0, 7))
@example(steps={10, 20, 30}, keep=5, every=0)  # fewer checkpoints than --keep-checkpoints: none is deleted
@example(steps={4, 7, 8}, keep=3, every=4)  # fewer on the grid than kept, one off it: only the older off-grid one goes
def test_pruning_keeps_the_newest_on_the_grid_and_the_newest_of_all(
    steps: set[int], keep: int, every: int, tmp_path_factory: pytest.TempPathFactory
) -> None:
    folder = tmp_path_factory.mktemp("checkpoints")
    _complete_checkpoints(folder, steps)
    step_directory(folder, 99).with_name("step-0000099.partial").mkdir()  # an unfinished write is never counted
    prune_checkpoints(folder, keep, every)
    kept = {int(path.name.removeprefix("step-")) for path in folder.iterdir() if (path / STATE_JSON).is_file()}
    if every == 0:
        assert kept == set(sorted(steps)[-keep:])
    else:
        on_grid = sorted(step for step in steps if step % every == 0)
        assert kept == set(on_grid[-keep:]) | {max(steps)}
    assert latest_checkpoint(folder) == step_directory(folder, max(steps))


@pytest.mark.parametrize("left", ["an old checkpoint", "an unfinished checkpoint"])
def test_a_checkpoint_that_cannot_be_deleted_is_named(
    left: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """(left58 F3) A checkpoint this user could not delete (another account's run resumed, `chmod`) stopped `train`
    with "Operation not permitted: model.safetensors", shutil.rmtree's bare entry name, no folder named."""
    import os

    _complete_checkpoints(tmp_path, {2, 4})
    doomed = step_directory(tmp_path, 2)
    if left == "an unfinished checkpoint":
        doomed = doomed.rename(doomed.with_name(doomed.name + ".partial"))
    (doomed / "model.safetensors").write_bytes(b"")
    real = os.unlink

    def refused(path: object, *args: object, **given: object) -> None:
        if os.fsdecode(path) == "model.safetensors":  # type: ignore[arg-type]  # rmtree names the entry alone
            raise PermissionError(1, "Operation not permitted", "model.safetensors")
        real(path, *args, **given)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "unlink", refused)
    what, then = (("an old checkpoint", "go on with `--resume`") if left == "an old checkpoint" else
                  ("the unfinished checkpoint a stopped run left", "run the command again"))  # fmt: skip
    entry = re.escape(str(doomed / "model.safetensors"))
    message = f"^cannot delete {what} at {re.escape(str(doomed))}: Operation not permitted \\(at {entry}\\); .*, then "
    with pytest.raises(DilstoreError, match=message + f"{re.escape(then)}$"):
        if left == "an old checkpoint":
            prune_checkpoints(tmp_path, keep=1)
        else:
            remove_partial_checkpoints(tmp_path)


@pytest.mark.parametrize(
    ("state", "marked"),
    [
        (b'{"curve_point": true}', True),
        (b"{}", False),
        (b'{"curve_point": false}', False),
        (b'{"curve_point": 1}', False),
        (b'{"curve_point": "true"}', False),
        (b'["curve_point"]', False),
        (b'{"curve_point": tr', False),
        (b"\xff\xfe not text", False),
        (b"", False),
    ],
)
def test_only_a_readable_true_mark_makes_a_checkpoint_off_the_grid_a_curve_point(
    state: bytes, marked: bool, tmp_path: Path
) -> None:
    """A checkpoint off the --save-every grid stays only when its training_state.json marks it (`true`); one whose
    file is damaged, or holds another value, is a time checkpoint, deleted once a newer one exists."""
    _complete_checkpoints(tmp_path, {3, 4, 8})
    (step_directory(tmp_path, 3) / STATE_JSON).write_bytes(state)
    prune_checkpoints(tmp_path, keep=5, every=4)
    kept = sorted(int(path.name.removeprefix("step-")) for path in tmp_path.iterdir())
    assert kept == ([3, 4, 8] if marked else [4, 8])


def test_no_time_checkpoint_when_disabled(tiny_base: Path, squad_file: Path, tmp_path: Path) -> None:
    config = TrainingConfig(layers=1, max_steps=3, batch_size=2, save_every=0, save_every_minutes=0, **SMALL_WINDOWS)
    train_qa(tiny_base, squad_file, tmp_path, config, command="t", progress=False)
    assert latest_checkpoint(tmp_path / "checkpoints") is None


@pytest.mark.parametrize("changed", [{"save_every_minutes": 1.0}, {"log_every": 7, "keep_checkpoints": 4}])
def test_resume_may_change_how_often_it_saves_and_logs(
    changed: dict, tiny_base: Path, squad_file: Path, tmp_path: Path
) -> None:
    """None of these changes the weights; a changed --log-every or --keep-checkpoints was refused (trainqa36 L6)."""
    config = TrainingConfig(layers=1, max_steps=2, batch_size=2, save_every=1, **SMALL_WINDOWS)
    train_qa(tiny_base, squad_file, tmp_path, config, command="t", progress=False)
    cut_after_last_checkpoint(tmp_path)
    resumed = train_qa(tiny_base, squad_file, tmp_path, replace(config, **changed), command="t", resume=True,
                       progress=False)  # fmt: skip
    assert resumed.steps == 2


def test_a_resume_with_another_save_every_keeps_the_checkpoints_of_the_grid_before(
    tiny_base: Path, squad_file: Path, tmp_path: Path
) -> None:
    """Checkpoints at the multiples of the interrupted run's --save-every are a learning curve's points too: a resume
    with another --save-every pruned them as time checkpoints, though --keep-checkpoints 10 asked to keep them
    (train52 F1)."""
    config = TrainingConfig(layers=1, max_steps=8, batch_size=2, save_every=2, save_every_minutes=0,
                            keep_checkpoints=10, **SMALL_WINDOWS)  # fmt: skip
    train_qa(tiny_base, squad_file, tmp_path, config, command="t", progress=False)
    cut_after_last_checkpoint(tmp_path)  # killed after step-6: checkpoints 2, 4 and 6
    train_qa(tiny_base, squad_file, tmp_path, replace(config, save_every=7), command="t", resume=True, progress=False)
    steps = sorted(path.name for path in (tmp_path / "checkpoints").iterdir())
    assert steps == ["step-0000002", "step-0000004", "step-0000006", "step-0000007"]


def test_the_recorded_command_of_a_resumed_run_is_the_one_that_trains_it_from_the_start(
    tiny_base: Path, squad_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The record and the model card gave a resumed run's command with --resume, which, run as the card gives it,
    is refused for want of a checkpoint (train52 F4)."""
    run = tmp_path / "run"
    arguments = [
        "train", "qa", "--model", str(tiny_base), "--layers", "1", "--train", str(squad_file), "--output", str(run),
        "--max-steps", "2", "--batch-size", "2", "--save-every", "1", "--max-seq-length", "48", "--doc-stride", "16",
        "--max-question-length", "24", "--no-progress", "--json",
    ]  # fmt: skip
    assert main(arguments) == 0
    first = json.loads((run / "dilstore_training.json").read_text())["command"]
    cut_after_last_checkpoint(run)
    assert main([*arguments, "--resume"]) == 0
    capsys.readouterr()
    for record in ("dilstore_training.json", "run_config.json"):
        assert json.loads((run / record).read_text())["command"] == first, record
    assert "--resume" not in first


def test_a_resume_with_another_save_every_keeps_the_grid_of_checkpoints_saved_before_they_were_marked(
    tiny_base: Path, squad_file: Path, tmp_path: Path
) -> None:
    """A checkpoint saved before training_state.json marked the curve points (no "curve_point" key) is one of them
    where its own dilstore_training.json's --save-every divides its step: a resume with another --save-every deleted
    all three of an interrupted run's checkpoints, though --keep-checkpoints 10 asked to keep them (review52 F2)."""
    config = TrainingConfig(layers=1, max_steps=8, batch_size=2, save_every=2, save_every_minutes=0,
                            keep_checkpoints=10, **SMALL_WINDOWS)  # fmt: skip
    train_qa(tiny_base, squad_file, tmp_path, config, command="t", progress=False)
    cut_after_last_checkpoint(tmp_path)  # killed after step-6: checkpoints 2, 4 and 6
    for state in (tmp_path / "checkpoints").glob(f"*/{STATE_JSON}"):  # as the version before the mark wrote them
        document = json.loads(state.read_text(encoding="utf-8"))
        del document["curve_point"]
        state.write_text(json.dumps(document), encoding="utf-8")
    train_qa(tiny_base, squad_file, tmp_path, replace(config, save_every=7), command="t", resume=True, progress=False)
    steps = sorted(path.name for path in (tmp_path / "checkpoints").iterdir())
    assert steps == ["step-0000002", "step-0000004", "step-0000006", "step-0000007"]


def test_negative_minutes_are_refused() -> None:
    with pytest.raises(DilstoreError, match="save-every-minutes must be 0"):
        TrainingConfig(layers=1, save_every_minutes=-1)


def test_cli_runs_go_outside_the_work_tree_by_default(
    tiny_base: Path, squad_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    """Without --output, `train qa` writes to $DILSTORE_RUNS/qa-kK, and --resume finds the run there again."""
    run = tmp_path / "runs" / "qa-k1"
    monkeypatch.setenv("DILSTORE_RUNS", str(tmp_path / "runs"))
    arguments = [
        "train", "qa", "--model", str(tiny_base), "--layers", "1", "--train", str(squad_file), "--max-steps", "2",
        "--batch-size", "2", "--save-every", "1", "--max-seq-length", "48", "--doc-stride", "16",
        "--max-question-length", "24", "--no-progress", "--json",
    ]  # fmt: skip
    assert main(arguments) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["output"] == str(run)
    assert (run / "model.safetensors").is_file()
    assert main([*arguments, "--resume"]) == 2
    assert f"--resume: the run in {run} finished (step 2 of 2, dilstore_training.json): nothing to resume" in (
        capsys.readouterr().err
    )
    cut_after_last_checkpoint(run)
    assert main([*arguments, "--resume"]) == 0
    assert json.loads(capsys.readouterr().out)["train_steps"] == 2


def test_a_new_run_into_a_folder_holding_a_run_is_refused_and_the_run_is_kept(
    tiny_base: Path, squad_file: Path, tmp_path: Path
) -> None:
    """A new run there would record its settings over the old run's, and --resume would then continue the old
    run's checkpoint under the new settings (a 5-step run reporting 90 steps and publishing the old weights)."""
    config = TrainingConfig(layers=1, max_steps=2, batch_size=2, save_every=1, **SMALL_WINDOWS)
    train_qa(tiny_base, squad_file, tmp_path, config, command="t", progress=False)
    recorded = (tmp_path / "run_config.json").read_bytes()
    other = replace(config, learning_rate=1e-4, max_steps=1)
    with pytest.raises(DilstoreError, match=r"holds a training run already \(checkpoint step-0000001, a final model, "
                                            r"dilstore_training.json\): give another --output"):  # fmt: skip
        train_qa(tiny_base, squad_file, tmp_path, other, command="t", progress=False)  # not "--resume": it finished
    assert (tmp_path / "run_config.json").read_bytes() == recorded
    with pytest.raises(DilstoreError, match=r"finished \(step 2 of 2, dilstore_training.json\): nothing to resume"):
        train_qa(tiny_base, squad_file, tmp_path, other, command="t", resume=True, progress=False)
    cut_after_last_checkpoint(tmp_path)
    with pytest.raises(DilstoreError, match=r"\(checkpoint step-0000001\): continue it with --resume, or give"):
        train_qa(tiny_base, squad_file, tmp_path, other, command="t", progress=False)
    with pytest.raises(DilstoreError, match=r"settings differ from the interrupted run .*: --learning-rate 0\.0001 "
                                            r"\(the run had 3e-05\); --max-steps 1 \(the run had 2\)$"):  # fmt: skip
        train_qa(tiny_base, squad_file, tmp_path, other, command="t", resume=True, progress=False)


@pytest.mark.parametrize("trainers", [("qa", "earl"), ("earl", "qa"), ("listformer", "earl")])
def test_a_resume_into_another_trainer_s_run_says_whose_run_it_is(trainers: tuple[str, str], tmp_path: Path) -> None:
    """`train qa --resume` into a cross-encoder's run folder listed every setting the two configs differ in (--epochs,
    --layers, --max-steps ...), as if the run were the same kind with other flags (train52)."""
    from dataclasses import asdict

    from dilstore.reader.training.loop import resume_point
    from dilstore.reader.training.ranking import RankingTrainingConfig

    def config(trainer: str) -> TrainingConfig | RankingTrainingConfig:
        return TrainingConfig(layers=1) if trainer == "qa" else RankingTrainingConfig(kind=trainer)

    recorded, resumed = trainers
    _complete_checkpoints(tmp_path / "checkpoints", {4})
    (tmp_path / "run_config.json").write_text(json.dumps({"config": asdict(config(recorded))}), encoding="utf-8")
    with pytest.raises(DilstoreError, match=rf"^--resume: {re.escape(str(tmp_path))} holds a `dilstore train "
                                            rf"{recorded}` run \(.*run_config\.json\), not a `train {resumed}` one: "
                                            "resume it with its own command, or give this run another --output$"):
        resume_point(tmp_path, config(resumed))
    assert resume_point(tmp_path, config(recorded)) == step_directory(tmp_path / "checkpoints", 4)


@pytest.mark.parametrize("content", ['{"config": {"layers"', '{"command": "c"}', "[]"])
def test_resume_with_a_damaged_run_config_names_the_file(
    tiny_base: Path, squad_file: Path, tmp_path: Path, content: str
) -> None:
    """A run_config.json cut short or edited was a JSONDecodeError or KeyError traceback on --resume."""
    config = TrainingConfig(layers=1, max_steps=2, batch_size=2, save_every=1, **SMALL_WINDOWS)
    train_qa(tiny_base, squad_file, tmp_path, config, command="t", progress=False)
    cut_after_last_checkpoint(tmp_path)
    (tmp_path / "run_config.json").write_text(content, encoding="utf-8")
    with pytest.raises(DilstoreError, match=re.escape(str(tmp_path / "run_config.json"))):
        train_qa(tiny_base, squad_file, tmp_path, config, command="t", resume=True, progress=False)


def test_resume_of_a_finished_run_without_checkpoints_says_it_finished(
    tiny_base: Path, squad_file: Path, tmp_path: Path
) -> None:
    """With no periodic checkpoint (--save-every 0, no minutes), --resume said "no complete checkpoint"."""
    config = TrainingConfig(layers=1, max_steps=1, batch_size=2, save_every=0, save_every_minutes=0, **SMALL_WINDOWS)
    train_qa(tiny_base, squad_file, tmp_path, config, command="t", progress=False)
    with pytest.raises(DilstoreError, match=r"finished \(step 1 of 1, dilstore_training.json\): nothing to resume"):
        train_qa(tiny_base, squad_file, tmp_path, config, command="t", resume=True, progress=False)


def test_a_run_stopped_before_its_first_checkpoint_may_start_again_without_resume(
    tiny_base: Path, squad_file: Path, tmp_path: Path
) -> None:
    """It left only run_config.json: nothing to continue, so a scheduler relaunches it as a new run."""
    config = TrainingConfig(layers=1, max_steps=1, batch_size=2, save_every=0, save_every_minutes=0, **SMALL_WINDOWS)
    (tmp_path / "run_config.json").write_text("{}", encoding="utf-8")
    (tmp_path / "checkpoints" / "step-0000003.partial").mkdir(parents=True)  # cut off while being written
    assert train_qa(tiny_base, squad_file, tmp_path, config, command="t", progress=False).steps == 1


def test_a_second_training_into_a_folder_being_trained_into_stops_at_once(
    tiny_base: Path, squad_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    output = tmp_path / "run"
    with held_lock(output) as holder:
        status = main(["train", "qa", "--model", str(tiny_base), "--layers", "1", "--train", str(squad_file),
                       "--output", str(output), "--max-steps", "1", "--no-progress"])  # fmt: skip
    assert status == 2
    assert f"{output} is being written by pid {holder}" in capsys.readouterr().err
    assert not output.exists()


def test_ranking_data_into_a_folder_another_run_writes_is_refused(
    squad_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two ranking-data runs into one --output both exited 0, one's triples beside the other's record (trainqa36 3)."""
    output = tmp_path / "data"
    with held_lock(output) as holder:
        status = main(["train", "ranking-data", "--squad", str(squad_file), "--output", str(output)])
    assert status == 2
    assert f"{output} is being written by pid {holder}" in capsys.readouterr().err
    assert not output.exists()


@pytest.mark.parametrize("where", ["the-store", "inside"])
def test_a_run_folder_that_is_or_lies_in_a_store_is_refused(
    squad_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], where: str
) -> None:
    """`train --output STORE/x` wrote the run into the store, whose `verify` then listed it as untracked (rank38 L6)."""
    store = tmp_path / "store"
    store.mkdir()
    (store / "precompute.json").write_text(json.dumps({"inputs": [], "fingerprint": {}}))  # a store being built
    output = store if where == "the-store" else store / "x"
    status = main(["train", "ranking-data", "--squad", str(squad_file), "--output", str(output)])
    assert status == 2
    said = capsys.readouterr().err
    expected = f"{store} is a store" if where == "the-store" else f"{output} is inside the store {store}"
    assert said == f"dilstore train: error: --output {expected}; put the run folder elsewhere\n"
    assert sorted(path.name for path in store.iterdir()) == ["precompute.json"]


@pytest.mark.parametrize(("number", "words"), [(15, "stopped by SIGTERM"), (2, "interrupted")])
def test_a_stop_outside_the_training_steps_is_one_line_with_where_to_go_on(
    squad_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
    number: int, words: str,
) -> None:
    """While the data loaded or the --dev evaluation ran, SIGTERM ended `train` with 143 and nothing on stderr.
    Then `ranking-data`, which has no --resume, was told "--resume goes on", and Ctrl-C got no hint (style38 M1)."""
    import signal

    import dilstore.reader.data.ranking_data as ranking_data

    def stopped(*args, **kwargs):
        signal.raise_signal(number)  # as `kill` or Ctrl-C sends it while the work runs
        raise AssertionError("the signal did not stop the command")

    def unhandled(number: int, frame: object) -> None:
        raise AssertionError("the signal reached the test's own handler: the command set none")

    monkeypatch.setattr(ranking_data, "build_ranking_data", stopped)
    # Without the command's handler, SIGTERM's default would end pytest; a SIGINT handler is taken over only when it
    # is Python's own (a program's own handler for Ctrl-C is kept).
    ours = signal.default_int_handler if number == signal.SIGINT else unhandled
    previous = signal.signal(number, ours)
    try:
        status = main(["train", "ranking-data", "--squad", str(squad_file), "--output", str(tmp_path / "data")])
        assert signal.getsignal(number) is ours, "the command gives the handler back"
    finally:
        signal.signal(number, previous)
    assert status == 128 + number
    assert capsys.readouterr().err == (f"dilstore train: {words}; run the same command again (it reuses a BM25 index "
                                       "it finished in --work, and removes a half-built one, WORK/.bm25.building)\n")


def test_a_run_whose_output_is_its_base_model_is_refused_before_the_weights_change(
    tiny_base: Path, squad_file: Path, tmp_path: Path
) -> None:
    """`--output` equal to `--model`: the final save wrote the new reader over the base model's files."""
    base = tmp_path / "base"
    base.mkdir()
    for path in tiny_base.iterdir():
        (base / path.name).write_bytes(path.read_bytes())
    before = {path.name: path.read_bytes() for path in base.iterdir()}
    config = TrainingConfig(layers=1, max_steps=1, batch_size=2, **SMALL_WINDOWS)
    with pytest.raises(DilstoreError, match=r"holds a model \(config.json, model.safetensors\) that the run's final "
                                            r"save would overwrite \(is it the base model\?\)"):  # fmt: skip
        train_qa(base, squad_file, base, config, command="t", progress=False)
    assert {path.name: path.read_bytes() for path in base.iterdir()} == before


def test_a_run_whose_final_save_was_cut_can_be_run_again(tiny_base: Path, squad_file: Path, tmp_path: Path) -> None:
    """A second Ctrl-C (or a kill) during the final save left the model files without the run's record: the
    advised re-run was refused as "is it the base model?", and --resume found no checkpoint."""
    from dilstore.reader.modeling.checkpoints import TRAINING_METADATA_FILE
    from dilstore.runners.training_options import resume_hint

    config = TrainingConfig(layers=1, max_steps=1, batch_size=2, **SMALL_WINDOWS)
    output = tmp_path / "run"
    train_qa(tiny_base, squad_file, output, config, command="t", progress=False)
    (output / TRAINING_METADATA_FILE).unlink()  # the save was cut before its record
    expected = "no checkpoint was saved yet: run the command again, without --resume"
    assert resume_hint(argparse.Namespace(), output) == expected
    assert train_qa(tiny_base, squad_file, output, config, command="t", progress=False).steps == 1
    assert (output / TRAINING_METADATA_FILE).is_file()


def _train_qa_arguments(tiny_base: Path, squad_file: Path, output: Path, steps: int) -> list[str]:
    """`train qa` for `steps` steps of the tiny reader, with a checkpoint after every step."""
    return ["train", "qa", "--model", str(tiny_base), "--layers", "1", "--train", str(squad_file), "--output",
            str(output), "--max-steps", str(steps), "--batch-size", "2", "--save-every", "1", "--max-seq-length", "48",
            "--doc-stride", "16", "--max-question-length", "24", "--no-progress"]  # fmt: skip


def test_a_save_past_the_file_size_limit_says_to_raise_it(tmp_path: Path) -> None:
    """(left56b F4) A checkpoint or model save past `ulimit -f` (EFBIG, from Python or from safetensors) said "check
    the disk", where precompute says to raise the limit; a full disk still says to free space."""
    import errno
    import os

    from safetensors import SafetensorError

    from dilstore.reader.training.loop import save_failed

    limit = ("a file grew past the size this process may write (`ulimit -f`) or its filesystem holds: raise the "
             "limit, then run the same command again")  # fmt: skip
    too_large = OSError(errno.EFBIG, os.strerror(errno.EFBIG), str(tmp_path / "model.safetensors"))
    assert str(save_failed("the model", too_large, tmp_path)) == (
        f"cannot write the model: File too large ({tmp_path / 'model.safetensors'}): {limit}")
    serialized = SafetensorError("Error while serializing: I/O error: File too large (os error 27)")
    assert str(save_failed("the model", serialized, tmp_path)) == (
        f"cannot write the model: File too large (os error 27): {limit}")
    full = SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")
    assert str(save_failed("the model", full, tmp_path)).endswith(": free space, then run the same command again")


@pytest.mark.parametrize(("failing_step", "then"), [(1, "again"), (2, "with --resume")])
def test_a_checkpoint_the_disk_has_no_room_for_is_one_line_and_leaves_no_partial_folder(
    tiny_base: Path, squad_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str], failing_step: int, then: str,
) -> None:  # fmt: skip
    """safetensors' error is no OSError: a full disk gave a 28-line traceback, exit 1, and an 89 MB
    step-N.partial left on the disk that had just filled up (full49 F1). --resume goes on only from a checkpoint."""
    from safetensors import SafetensorError

    import dilstore.reader.training.loop as loop

    saved = loop.save_training_state

    def full_disk(
        directory: Path, optimizer: object, scheduler: object, position: loop.LoopPosition, **marks: bool
    ) -> None:
        if position.step == failing_step:
            raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")
        saved(directory, optimizer, scheduler, position, **marks)  # type: ignore[arg-type]

    monkeypatch.setattr(loop, "save_training_state", full_disk)
    output = tmp_path / "run"
    assert main(_train_qa_arguments(tiny_base, squad_file, output, steps=3)) == 2
    checkpoint = step_directory(output / "checkpoints", failing_step)
    assert capsys.readouterr().err == (
        f"dilstore train: error: cannot write checkpoint {checkpoint}: No space left on device (os error 28): free "
        f"space, then run the same command {then}\n"
    )
    kept = ["step-0000001"] if failing_step == 2 else []
    assert sorted(path.name for path in (output / "checkpoints").iterdir()) == kept


def test_a_checkpoint_whose_write_back_fails_is_not_published_and_the_older_one_is_kept(
    tiny_base: Path, squad_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    """A checkpoint's files were renamed into place unflushed: an error only the write-back meets (EIO, a quota a
    network filesystem reports at close or fsync) went unseen, the checkpoint was published as complete and the
    older ones pruned after it (disk56 F4). Now it is flushed before the rename, and a failed flush is the save's
    one-line error naming the file; the checkpoint before it stays for --resume."""
    import errno
    import os

    from dilstore.storage import durability

    def failing_write_back(descriptor: int) -> None:
        if os.readlink(f"/proc/self/fd/{descriptor}").endswith("step-0000002.partial/model.safetensors"):
            raise OSError(errno.EIO, os.strerror(errno.EIO))

    monkeypatch.setattr(durability.os, "fsync", failing_write_back)
    output = tmp_path / "run"
    assert main([*_train_qa_arguments(tiny_base, squad_file, output, steps=3), "--keep-checkpoints", "1"]) == 2
    said = capsys.readouterr().err.splitlines()[-1]
    checkpoint = step_directory(output / "checkpoints", 2)
    assert said == (f"dilstore train: error: cannot write checkpoint {checkpoint}: Input/output error "
                    f"({checkpoint}.partial/model.safetensors): check the disk, then run the same command with "
                    "--resume")
    assert sorted(path.name for path in (output / "checkpoints").iterdir()) == ["step-0000001"]


@pytest.mark.parametrize("failing", ["checkpoints", "model.safetensors"])
def test_a_failed_flush_of_the_checkpoints_folder_or_of_the_final_model_fails_the_run_naming_it(
    tiny_base: Path, squad_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str], failing: str,
) -> None:  # fmt: skip
    """The checkpoints folder is flushed after a checkpoint is renamed into it (mut56b M48), and the final model after
    its save (mut56b M49): a write-back error of either is the run's one-line error naming what failed (the folder
    named by `fsync_dir`: mut56b M51), not a run that says it is done."""
    import errno
    import os

    from dilstore.storage import durability

    output = tmp_path / "run"
    real_fsync = os.fsync

    def failing_write_back(descriptor: int) -> None:
        if os.readlink(f"/proc/self/fd/{descriptor}") == str(output / failing):
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        real_fsync(descriptor)

    monkeypatch.setattr(durability.os, "fsync", failing_write_back)
    assert main(_train_qa_arguments(tiny_base, squad_file, output, steps=2)) == 2
    said = capsys.readouterr().err.splitlines()[-1]
    what = "checkpoint " if failing == "checkpoints" else f"the model to {output}:"  # the first flush of it fails
    assert said.startswith(f"dilstore train: error: cannot write {what}"), said
    assert f"Input/output error ({output / failing})" in said


def test_a_final_model_the_disk_has_no_room_for_is_one_line_saying_to_resume(
    tiny_base: Path, squad_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    """The final save's OSError carries no file name; the checkpoint before it is where --resume goes on (full49 F1)."""
    import errno

    import dilstore.reader.training.runs as runs

    output = tmp_path / "run"
    recorded = runs.write_training_record

    def full_disk(directory: Path, *args: object) -> None:
        if Path(directory) == output:
            raise OSError(errno.ENOSPC, "No space left on device")
        recorded(directory, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(runs, "write_training_record", full_disk)
    assert main(_train_qa_arguments(tiny_base, squad_file, output, steps=2)) == 2
    said = capsys.readouterr().err  # the step's log line, then the error
    assert said.splitlines()[-1] == (
        f"dilstore train: error: cannot write the model to {output}: No space left on device: free space, then run "
        "the same command with --resume"
    )
    assert "Traceback" not in said
    monkeypatch.undo()
    assert main([*_train_qa_arguments(tiny_base, squad_file, output, steps=2), "--resume"]) == 0


def test_resume_refuses_training_data_other_than_the_interrupted_runs(
    tiny_base: Path, squad_file: Path, tmp_path: Path
) -> None:
    """The settings were compared and the data not: a resumed run mixed two datasets under one record."""
    config = TrainingConfig(layers=1, max_steps=2, batch_size=2, save_every=1, **SMALL_WINDOWS)
    output = tmp_path / "run"
    train_qa(tiny_base, squad_file, output, config, command="t", progress=False)
    cut_after_last_checkpoint(output)
    recorded = json.loads((output / "run_config.json").read_text())["input_sha256"]
    assert set(recorded) == {"train_file", "base_model"}  # the base model by its weights
    other = tmp_path / "other.json"
    data = json.loads(squad_file.read_text())
    data["data"][0]["title"] += " (edited)"
    other.write_text(json.dumps(data), encoding="utf-8")
    refused = r"--resume: not the data the interrupted run read: train_file \(its SHA-256"
    with pytest.raises(DilstoreError, match=refused):
        train_qa(tiny_base, other, output, config, command="t", resume=True, progress=False)
    other_base = shutil.copytree(tiny_base, tmp_path / "other-base")
    weights = load_file(other_base / "model.safetensors")
    save_file({name: tensor + 1 for name, tensor in weights.items()}, other_base / "model.safetensors")
    with pytest.raises(DilstoreError, match=r"--resume: not the data the interrupted run read: base_model \(its SHA"):
        train_qa(other_base, squad_file, output, config, command="t", resume=True, progress=False)
    copy = tmp_path / "copy.json"
    copy.write_bytes(squad_file.read_bytes())
    assert train_qa(tiny_base, copy, output, config, command="t", resume=True, progress=False).steps == 2


def test_a_recorded_input_that_has_no_digest_now_is_not_compared(tmp_path: Path) -> None:
    """Only inputs with a digest on both sides are compared: a base model given now as a folder without
    model.safetensors (input_digests leaves such folders out) is not a changed input; a changed file still is."""
    from dilstore.reader.training.runs import INPUT_DIGESTS, input_digests, refuse_other_inputs
    from dilstore.storage.digests import sha256_file

    data, weights = tmp_path / "train.json", tmp_path / "base" / "model.safetensors"
    data.write_text("{}", encoding="utf-8")
    weights.parent.mkdir()
    weights.write_bytes(b"weights")
    record = tmp_path / "run_config.json"
    recorded = {"train_file": sha256_file(data), "base_model": sha256_file(weights)}
    record.write_text(json.dumps({INPUT_DIGESTS: recorded}), encoding="utf-8")
    weights.unlink()  # the base model now: a folder input_digests has no digest for
    now = input_digests({"train_file": str(data), "base_model": str(weights.parent)})
    assert now == {"train_file": sha256_file(data)}
    refuse_other_inputs(record, now)
    data.write_text('{"data": []}', encoding="utf-8")
    with pytest.raises(DilstoreError, match=r"^--resume: not the data the interrupted run read: train_file \(its "):
        refuse_other_inputs(record, input_digests({"train_file": str(data), "base_model": str(weights.parent)}))


def test_a_resume_without_run_config_checks_the_checkpoint_s_own_record(
    tiny_base: Path, squad_file: Path, tmp_path: Path
) -> None:
    """A run folder rebuilt from a copied checkpoints/ (no run_config.json) resumed with any settings, data and base,
    and wrote a false record; the checkpoint's dilstore_training.json holds the settings and digests too."""
    config = TrainingConfig(layers=1, max_steps=2, batch_size=2, save_every=1, **SMALL_WINDOWS)
    output = tmp_path / "run"
    train_qa(tiny_base, squad_file, output, config, command="t", progress=False)
    cut_after_last_checkpoint(output)
    (output / "run_config.json").unlink()
    with pytest.raises(DilstoreError, match=r"settings differ from the interrupted run \(.*step-0000001/"
                                            r"dilstore_training.json\): --learning-rate 0\.5 \(the run had 3e-05\)$"):
        train_qa(tiny_base, squad_file, output, replace(config, learning_rate=0.5), command="t", resume=True)
    other = tmp_path / "other.json"
    data = json.loads(squad_file.read_text())
    data["data"][0]["title"] += " (edited)"
    other.write_text(json.dumps(data), encoding="utf-8")
    with pytest.raises(DilstoreError, match=r"not the data the interrupted run read: train_file \(.*step-0000001/"):
        train_qa(tiny_base, other, output, config, command="t", resume=True, progress=False)
    assert train_qa(tiny_base, squad_file, output, config, command="t", resume=True, progress=False).steps == 2


def test_a_resume_checks_the_teacher_s_weights_not_its_path(tiny_base: Path, squad_file: Path, tmp_path: Path) -> None:
    """The teacher (and the shared-norm triples) were compared by path: changed in place they resumed into another
    model without a word, and moved they were refused."""
    from dilstore.reader.modeling.dilbert import DilBertReader

    teacher = DilBertReader.from_pretrained(tiny_base, layers=0).save_pretrained(tmp_path / "teacher")
    config = TrainingConfig(layers=1, max_steps=2, batch_size=2, save_every=1, teacher=str(teacher), **SMALL_WINDOWS)
    output = tmp_path / "run"
    train_qa(tiny_base, squad_file, output, config, command="t", progress=False)
    cut_after_last_checkpoint(output)
    assert set(json.loads((output / "run_config.json").read_text())["input_sha256"]) == {
        "train_file", "base_model", "teacher"
    }
    moved = shutil.move(teacher, tmp_path / "teacher-moved")
    weights = load_file(Path(moved) / "model.safetensors")
    save_file({name: tensor + 1 for name, tensor in weights.items()}, teacher.parent / "changed.safetensors")
    changed = shutil.copytree(moved, tmp_path / "teacher-changed")
    shutil.move(teacher.parent / "changed.safetensors", Path(changed) / "model.safetensors")
    with pytest.raises(DilstoreError, match=r"not the data the interrupted run read: teacher \(its SHA-256"):
        train_qa(tiny_base, squad_file, output, replace(config, teacher=str(changed)), command="t", resume=True)
    resumed = train_qa(tiny_base, squad_file, output, replace(config, teacher=str(moved)), command="t", resume=True,
                       progress=False)  # fmt: skip
    assert resumed.steps == 2


def test_a_stopped_run_is_told_to_resume_only_when_it_saved_a_checkpoint(tmp_path: Path) -> None:
    """Stopped before its first checkpoint, a run was told "--resume goes on from its newest checkpoint", and
    --resume then said "no complete checkpoint" (rank38 L1)."""
    from dilstore.reader.modeling.checkpoints import TRAINING_METADATA_FILE
    from dilstore.reader.training.checkpoint_files import CHECKPOINTS_DIR, STATE_JSON, step_directory
    from dilstore.runners.cli import build_parser, parse
    from dilstore.runners.training_options import resume_hint

    windows = ["--max-seq-length", "64", "--doc-stride", "24", "--max-question-length", "16",
               "--max-answer-length", "5"]  # fmt: skip
    args = parse(build_parser(), ["train", "qa", "--layers", "1", "--train", "t.json", *windows])
    expected = "no checkpoint was saved yet: run the command again, without --resume"
    assert resume_hint(args, tmp_path / "never-made") == expected
    half = step_directory(tmp_path / CHECKPOINTS_DIR, 10)
    half.mkdir(parents=True)  # a checkpoint cut short has no state file yet
    assert resume_hint(args, tmp_path).startswith("no checkpoint was saved yet")
    (half / STATE_JSON).write_text("{}")
    assert resume_hint(args, tmp_path).endswith("(--resume goes on from its newest checkpoint)")
    (tmp_path / TRAINING_METADATA_FILE).write_text("{}")  # the final save came before the --dev evaluation
    saved = f"the trained model is saved in {tmp_path}; only what comes after it was cut"
    assert resume_hint(args, tmp_path) == saved
    (tmp_path / "dilstore.json").write_text(json.dumps({"format": 1, "kind": "dilbert", "architecture": "bert",
                                                        "layers": 1, "num_layers": 2}))  # fmt: skip
    assert resume_hint(args, tmp_path) == saved, "without --dev, no evaluation was cut"
    # The command scores as --dev did: its file, windows (evaluate-rc's 384 fails a 64-position model), answer length
    # (train46 F1: left out, the score differed) and subset.
    args.dev, args.eval_limit, args.eval_seed = Path("my dev.json"), 40, 3
    assert resume_hint(args, tmp_path) == (f"{saved} (`dilstore evaluate-rc --model {tmp_path} --data 'my dev.json' "
                                           "--max-seq-length 64 --doc-stride 24 --max-question-length 16 "
                                           "--max-answer-length 5 --limit 40 --seed 3` scores it)")



@pytest.mark.parametrize(
    ("subset", "limit", "seed"),
    [([], None, 0), (["--eval-seed", "7"], None, 0), (["--eval-limit", "5"], 5, 0),
     (["--eval-limit", "5", "--eval-seed", "7"], 5, 7)],
)  # fmt: skip
def test_the_hinted_evaluation_is_a_command_evaluate_rc_runs_on_the_dev_subset(
    subset: list[str], limit: int | None, seed: int, tmp_path: Path
) -> None:
    """--eval-seed (default 0) picks only the --eval-limit subset: without --eval-limit the hint must leave --seed
    out, which evaluate-rc refuses without --limit ("--seed picks the --limit subset")."""
    import shlex

    from dilstore.runners.cli import build_parser, parse
    from dilstore.runners.reading_options import subset_seed
    from dilstore.runners.training_options import dev_evaluation

    args = parse(build_parser(), ["train", "qa", "--layers", "1", "--train", "t.json", "--dev", "d.json", *subset])
    words = shlex.split(dev_evaluation(args, tmp_path))
    assert words[:2] == ["dilstore", "evaluate-rc"]
    evaluated = parse(build_parser(), words[1:])
    assert (evaluated.model, evaluated.data, evaluated.limit) == (tmp_path, Path("d.json"), limit)
    assert subset_seed(evaluated) == seed


@pytest.mark.parametrize(("flag", "grouped"), [([], True), (["--no-group-by-length"], False)])
def test_no_group_by_length_reaches_the_training_config(flag: list[str], grouped: bool) -> None:
    """`train qa --no-group-by-length` trains on windows in plain shuffled order: the config the run gets says so."""
    from dilstore.runners.cli import build_parser, parse
    from dilstore.runners.cmd_train import _qa_config

    args = parse(build_parser(), ["train", "qa", "--layers", "1", "--train", "t.json", *flag])
    assert _qa_config(args).group_by_length is grouped

def test_a_summary_gives_a_short_run_its_seconds() -> None:
    """A run of 2.8 s printed "train 0.0 min" (train46 F7)."""
    from dilstore.runners.training_options import duration

    shown = [duration(seconds) for seconds in (2.84, 59.9, 60.0, 738.0)]
    assert shown == ["2.8 s", "59.9 s", "1.0 min", "12.3 min"]


def test_the_stop_line_of_a_training_command_imports_no_torch(tmp_path: Path) -> None:
    """A Ctrl-C while torch was still being imported (the first seconds of every `train`) made the stop line import
    it again, half-made: two tracebacks and exit 1, or a segfault."""
    code = (
        "import argparse, sys\n"
        "from pathlib import Path\n"
        "from dilstore.runners.training_options import resume_hint\n"
        f"print(resume_hint(argparse.Namespace(), Path({str(tmp_path)!r})))\n"
        "print([name for name in ('torch', 'transformers') if name in sys.modules])\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["no checkpoint was saved yet: run the command again, without --resume", "[]"]
