"""benchmarks/gpu_reader_schedule.py: the budget it plans, the run it exports, and the weights it joins back.

The schedule itself needs a GPU and the whole SQuAD file; these tests hold its pure parts: the share of
the 2-epoch budget grows with the time given and never passes 1, steps cover that share, the k=4 run is
chosen by dev F1 with the stated preference, and an exported run joins back byte for byte (a corrupted
piece is refused). With Popen and the bench faked, the sweep's wiring: which runs start, resume or export (a
cut run's newest checkpoint with --export-cut), and which pass size --chunk-windows auto picks and keeps.
"""

from __future__ import annotations

import importlib
import json
import lzma
import os
import subprocess
import tarfile
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors.torch import load_file, save_file

from tests.fixtures.benchmarks import benchmark_module


@pytest.fixture(scope="module")
def schedule():
    """benchmarks/gpu_reader_schedule.py as module `gpu_reader_schedule`."""
    with benchmark_module("gpu_reader_schedule") as module:
        yield module


def _calibration(schedule, **rates: float):
    values = {"plain": 900.0, "distilled": 500.0, "shared_norm": 150.0, "eval_questions": 800.0, "overhead": 30.0}
    return schedule.Calibration(**{**values, **rates})


@settings(max_examples=60, deadline=None)
@given(
    seconds=st.floats(0, 5000),
    more=st.floats(1, 5000),
    students=st.integers(1, 6),
    plain=st.floats(10, 5000),
    distilled=st.floats(10, 5000),
    shared=st.floats(5, 2000),
)
def test_plan_fraction_is_a_share_that_grows_with_time(schedule, seconds, more, students, plain, distilled, shared):
    cal = _calibration(schedule, plain=plain, distilled=distilled, shared_norm=shared)
    fraction = schedule.plan_fraction(cal, seconds, 88641, students)
    later = schedule.plan_fraction(cal, seconds + more, 88641, students)
    assert 0.0 <= fraction <= later <= 1.0


def test_plan_fraction_fits_the_time_it_was_given(schedule):
    cal = _calibration(schedule)
    fraction = schedule.plan_fraction(cal, 400.0, 88641, students=2)
    assert 0 < fraction < 1
    budget = fraction * 2 * 88641
    planned = (
        budget / (2 * cal.plain)
        + budget * (2 / (3 * cal.distilled) + 1 / (3 * cal.shared_norm))
        + 2 * cal.overhead
        + 10570 / (cal.eval_questions * 3 / 4)
    )
    assert planned == pytest.approx(400.0)
    assert schedule.plan_fraction(cal, 1e6, 88641, students=2) == 1.0
    assert schedule.plan_fraction(cal, 10.0, 88641, students=2) == 0.0


def test_steps_cover_the_share_of_two_epochs(schedule):
    assert schedule.steps_for(1.0, 88641, 32) == 5541  # ceil(2 * 88641 / 32)
    assert schedule.steps_for(0.5, 1000, 8) == 125
    assert schedule.steps_for(0.0, 1000, 8) == 1


def test_choose_default_prefers_shared_normalisation_within_the_margin(schedule):
    def run(name: str, f1: float | None) -> dict:
        return {"run": name} if f1 is None else {"run": name, "eval": {"f1": f1}}

    assert schedule.choose_default(run("k4", 60.0), run("k4-sn", 59.6), 0.5) == "k4-sn"
    assert schedule.choose_default(run("k4", 60.0), run("k4-sn", 59.4), 0.5) == "k4"
    assert schedule.choose_default(run("k4", None), run("k4-sn", 30.0), 0.5) == "k4-sn"
    assert schedule.choose_default(run("k4", 50.0), run("k4-sn", None), 0.5) == "k4"
    assert schedule.choose_default(run("k4", None), run("k4-sn", None), 0.5) is None
    unreadable = {"run": "k4-sn", "eval": {"unreadable": "Traceback ..."}}
    assert schedule.choose_default(run("k4", 50.0), unreadable, 0.5) == "k4"


def _run_folder(work: Path, name: str) -> dict[str, torch.Tensor]:
    run = work / name
    run.mkdir(parents=True)
    tensors = {"weight": torch.randn(700, 900), "ids": torch.arange(5)}  # fp32 weights of ~2.5 MB
    save_file(tensors, run / "model.safetensors")
    (run / "config.json").write_text(json.dumps({"hidden_size": 900}), encoding="utf-8")
    (run / "eval-dev.json").write_text(json.dumps({"f1": 61.0}), encoding="utf-8")
    return tensors


def test_export_then_join_gives_the_fp16_weights_back(schedule, tmp_path, monkeypatch):
    monkeypatch.setattr(schedule, "PIECE_BYTES", 2**20)
    tensors = _run_folder(tmp_path / "work", "k4-sn")
    out = tmp_path / "out"
    out.mkdir()
    schedule.export(tmp_path / "work" / "k4-sn", "k4-sn", out)
    pieces = sorted(out.glob("k4-sn.safetensors.part-*"))
    assert len(pieces) == 2 and all(piece.stat().st_size <= 2**20 for piece in pieces)

    into = tmp_path / "joined"
    assert schedule.main(["join", str(out), "k4-sn", "--into", str(into)]) == 0
    joined = load_file(into / "model.safetensors")
    assert joined["weight"].dtype == torch.float16
    assert torch.equal(joined["weight"], tensors["weight"].half())
    assert torch.equal(joined["ids"], tensors["ids"])
    assert json.loads((into / "eval-dev.json").read_text(encoding="utf-8")) == {"f1": 61.0}
    assert not (into / "weights.sha256").exists()
    # A second run joined into the same folder replaced the first's weights without a word.
    assert schedule.main(["join", str(out), "k4-sn", "--into", str(into)]) == 2
    assert schedule.main(["join", str(out), "k5", "--into", str(tmp_path / "other")]) == 2  # no k5.tar
    assert torch.equal(load_file(into / "model.safetensors")["weight"], tensors["weight"].half())


def test_join_and_records_refuse_what_no_export_wrote(schedule, tmp_path, capsys):
    """Each was a traceback: a file that is no tar, a tar without weights.sha256 (which also left its files in
    --into), an --into that is a file, a results.tgz that is no archive or holds no runs."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "junk.tar").write_bytes(b"not a tar at all")
    (out / "results.tgz").write_bytes(b"not a tgz")
    with tarfile.open(out / "bare.tar", "w") as archive:
        note = tmp_path / "eval-dev.json"
        note.write_text("{}", encoding="utf-8")
        archive.add(note, arcname="eval-dev.json")
    afile = tmp_path / "afile"
    afile.write_text("x", encoding="utf-8")
    for argv, message in (
        (["join", str(out), "junk", "--into", str(tmp_path / "a")], "junk.tar: not a readable tar archive"),
        (["join", str(out), "bare", "--into", str(tmp_path / "b")], "bare.tar: holds no weights.sha256"),
        (["join", str(out), "bare", "--into", str(afile)], f"--into {afile}: is a file, not a folder"),
        (["records", str(out), "--into", str(tmp_path / "c")], "results.tgz: not a readable results archive"),
    ):
        assert schedule.main(argv) == 2, argv
        assert message in capsys.readouterr().err, argv
    assert sorted(path.name for path in tmp_path.iterdir()) == ["afile", "eval-dev.json", "out"]
    with tarfile.open(out / "results.tgz", "w:gz") as archive:
        note.write_text('{"runs": 3}', encoding="utf-8")
        archive.add(note, arcname="results.json")
    assert schedule.main(["records", str(out), "--into", str(tmp_path / "c")]) == 2
    assert "results.tgz: no results.json with a list of runs" in capsys.readouterr().err


def test_join_refuses_a_corrupted_piece(schedule, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(schedule, "PIECE_BYTES", 2**20)
    _run_folder(tmp_path / "work", "k4")
    out = tmp_path / "out"
    out.mkdir()
    schedule.export(tmp_path / "work" / "k4", "k4", out)
    piece = out / "k4.safetensors.part-01"
    data = bytearray(piece.read_bytes())
    data[100] ^= 0xFF
    piece.write_bytes(bytes(data))

    into = tmp_path / "joined"
    assert schedule.main(["join", str(out), "k4", "--into", str(into)]) == 1
    assert "do not match weights.sha256" in capsys.readouterr().err
    assert not (into / "model.safetensors").exists()


def test_prepare_writes_an_fp16_teacher_xz_data_and_the_triples(schedule, tmp_path):
    teacher = tmp_path / "k0"
    teacher.mkdir()
    save_file({"weight": torch.randn(8, 4), "ids": torch.arange(3)}, teacher / "model.safetensors")
    for name in ("config.json", "tokenizer.json", "dilstore.json"):
        (teacher / name).write_text("{}", encoding="utf-8")
    (teacher / "eval-dev.json").write_text("{}", encoding="utf-8")  # a run's file the carried reader leaves out
    train, dev = tmp_path / "train-v1.1.json", tmp_path / "dev-v1.1.json"
    train.write_text(json.dumps({"data": ["train"]}), encoding="utf-8")
    dev.write_text(json.dumps({"data": ["dev"]}), encoding="utf-8")
    ranking = tmp_path / "ranking"
    ranking.mkdir()
    for name in ("triples.jsonl.gz", "paragraphs.jsonl.gz"):
        (ranking / name).write_bytes(name.encode())
    carry = tmp_path / "carry"

    argv = ["prepare", "--teacher", str(teacher), "--train", str(train), "--dev", str(dev),
            "--ranking-data", str(ranking), "--carry", str(carry)]  # fmt: skip
    assert schedule.main(argv) == 0
    weights = load_file(carry / "teacher-k0" / "model.safetensors")
    assert weights["weight"].dtype == torch.float16 and weights["ids"].dtype == torch.int64
    assert sorted(path.name for path in (carry / "teacher-k0").iterdir()) == [
        "config.json", "dilstore.json", "model.safetensors", "tokenizer.json"
    ]
    for source in (train, dev):
        assert lzma.decompress((carry / f"{source.name}.xz").read_bytes()) == source.read_bytes()
    assert (carry / "shared-norm" / "triples.jsonl.gz").read_bytes() == b"triples.jsonl.gz"


def test_steady_rate_leaves_out_the_first_progress_line(schedule):
    log = (
        "Loading weights: 100%\n"
        "step 25/300 loss 1.9 lr 1.0e-05 windows/s 300.00 seen 800 elapsed 14s\n"
        "step 50/300 loss 1.8 lr 2.0e-05 windows/s 2600.00 seen 1600 elapsed 15s\n"
        "step 75/300 loss 1.8 lr 3.0e-05 windows/s 2800.00 seen 2400 elapsed 16s\n"
        "step 100/300 loss 1.7 lr 4.0e-05 windows/s 2700.00 seen 3200 elapsed 18s\n"
    )
    assert schedule.steady_rate(log) == pytest.approx(2700.0 / 4)
    assert schedule.steady_rate(log.splitlines()[1]) is None  # one line: no rate after the start-up
    assert schedule.steady_rate("Traceback (most recent call last):\n") is None


@settings(max_examples=60, deadline=None)
@given(rate=st.floats(1, 5000), seconds=st.floats(-100, 5000), more=st.floats(0, 5000),
       groups=st.integers(1, 64), epochs=st.integers(1, 4))  # fmt: skip
def test_extension_steps_fill_the_time_up_to_the_epoch_cap(schedule, rate, seconds, more, groups, epochs):
    steps = schedule.extension_steps(rate, seconds, groups, epochs)
    assert 1 <= steps <= schedule.extension_steps(rate, seconds + more, groups, epochs)
    assert steps <= max(1, -(-epochs * schedule.TRAIN_QUESTIONS // groups))
    assert steps == 1 or steps * groups <= seconds * rate * (1 + 1e-9)  # the schedule ends within the time


def test_extension_steps_of_the_h200_run(schedule):
    assert schedule.extension_steps(678.0, 345.0, 32, 3) == 7309  # floor(345 * 678 / 32)
    assert schedule.extension_steps(678.0, 5000.0, 32, 2) == 5475  # the 2-epoch cap, ceil(2 * 87599 / 32)
    assert schedule.extension_steps(678.0, -5.0, 32, 2) == 1


@pytest.mark.parametrize("command", ["train", "extend", "sweep"])
def test_a_carried_folder_without_the_data_is_refused_by_name(schedule, tmp_path, capsys, command):
    carry = tmp_path / "carry"
    carry.mkdir()
    (carry / "dev-v1.1.json.xz").write_bytes(lzma.compress(b"{}"))
    argv = [command, "--carry", str(carry), "--work", str(tmp_path / "work"), "--out", str(tmp_path / "out")]
    argv += ["--layers", "0"] if command == "sweep" else []
    assert schedule.main(argv) == 2
    assert f"{carry}: no train-v1.1.json.xz; write the carried folder with `prepare`" in capsys.readouterr().err
    assert not (tmp_path / "work").exists() and not (tmp_path / "out").exists()


class _FinishedRun:
    """What `Schedule.launch` gets from a faked Popen: a process that has already ended well."""

    returncode = 0

    def poll(self) -> int:
        return 0


def _fake_runs(launched: list[list[str]]):
    """A Popen stand-in: the probe logs steady progress, the long run leaves two checkpoints and no final model."""

    def popen(command, stdout=None, stderr=None, env=None):
        launched.append([str(part) for part in command])
        assert "--output" not in command or env["PYTHONUNBUFFERED"] == "1"  # a cut-off run keeps its last lines
        if "--output" not in command:  # reader_curve.py
            return _FinishedRun()
        output = Path(command[command.index("--output") + 1])
        output.mkdir(parents=True)
        if output.name == "probe":
            stdout.write(b"step 25/300 loss 2.0 lr 1e-05 windows/s 400.00 seen 800 elapsed 20s\n"
                         b"step 50/300 loss 1.9 lr 2e-05 windows/s 2000.00 seen 1600 elapsed 21s\n"
                         b"step 75/300 loss 1.9 lr 3e-05 windows/s 2400.00 seen 2400 elapsed 22s\n")  # fmt: skip
            stdout.flush()
            record = {"features_seen": 2400, "train_seconds": 22.0}
            (output / "dilstore_training.json").write_text(json.dumps(record), encoding="utf-8")
        else:
            for step in (100, 200):
                checkpoint = output / "checkpoints" / f"step-{step:07d}"
                checkpoint.mkdir(parents=True)
                save_file({"weight": torch.full((4, 4), float(step))}, checkpoint / "model.safetensors")
                (checkpoint / "config.json").write_text(json.dumps({"step": step}), encoding="utf-8")
                (checkpoint / "training_state.json").write_text(json.dumps({"step": step}), encoding="utf-8")
            (output / "checkpoints" / "step-0000300").mkdir()  # cut off while saving: no training state, skipped
        return _FinishedRun()

    return popen


def test_extend_sizes_the_run_from_the_probe_and_exports_the_newest_checkpoint_of_a_cut_run(
    schedule, tmp_path, monkeypatch
):
    carry = _carried_squad(tmp_path)
    launched: list[list[str]] = []
    monkeypatch.setattr(schedule.subprocess, "Popen", _fake_runs(launched))
    monkeypatch.setattr(schedule.time, "sleep", lambda seconds: None)
    out, work = tmp_path / "out", tmp_path / "work"
    argv = ["extend", "--carry", str(carry), "--work", str(work), "--out", str(out), "--deadline", "500",
            "--groups", "32", "--curve-points", "4"]  # fmt: skip
    assert schedule.main(argv) == 0

    events = json.loads((work / "results.json").read_text(encoding="utf-8"))["events"]
    plan = next(event for event in events if event["event"] == "plan")
    assert plan["groups_per_second"] == pytest.approx(2200.0 / 4), "the median after the first line, per group"
    assert plan["steps"] == schedule.extension_steps(2200.0 / 4, plan["seconds"], 32, 2)
    long_run = next(command for command in launched if "extended" in command[command.index("--output") + 1])
    assert long_run[long_run.index("--max-steps") + 1] == str(plan["steps"])
    assert long_run[long_run.index("--save-every") + 1] == str(max(1, plan["steps"] // 4))
    assert any(command[1].endswith("reader_curve.py") for command in launched), "the checkpoints were scored"
    chosen = next(event for event in events if event["event"] == "chosen")
    assert chosen["run"].endswith("step-0000200")

    into = tmp_path / "joined"
    assert schedule.main(["join", str(out), "extended", "--into", str(into)]) == 0
    assert torch.equal(load_file(into / "model.safetensors")["weight"], torch.full((4, 4), 200.0, dtype=torch.float16))
    assert json.loads((into / "config.json").read_text(encoding="utf-8")) == {"step": 200}


def _probe_of_steps(launched: list[list[str]], steps: int):
    """A Popen stand-in: the probe is a run of `steps` steps that prints the lines its --log-every asks for; the other
    runs are _fake_runs's."""
    others = _fake_runs(launched)

    def popen(command, stdout=None, stderr=None, env=None):
        if "--output" not in command or Path(command[command.index("--output") + 1]).name != "probe":
            return others(command, stdout, stderr, env)
        launched.append([str(part) for part in command])
        output = Path(command[command.index("--output") + 1])
        output.mkdir(parents=True)
        every = int(command[len(command) - 1 - command[::-1].index("--log-every") + 1])  # the last one given wins
        for step in range(1, steps + 1):
            if step % every == 0 or step == steps:
                stdout.write(f"step {step}/{steps} loss 1.0 lr 1e-05 windows/s {100.0 * step:.2f} seen 8 "
                             "elapsed 1s\n".encode())  # fmt: skip
        (output / "dilstore_training.json").write_text(json.dumps({"train_seconds": 1.0}), encoding="utf-8")
        return _FinishedRun()

    return popen


@pytest.mark.parametrize("smoke", [None, "8"])
def test_the_probe_of_a_run_of_a_few_steps_measures_a_rate_only_when_it_logs_each_step(
    schedule, tmp_path, monkeypatch, smoke
):
    """`extend --smoke N` trains N questions for a couple of steps: the probe logs every step so that it has two
    progress lines to measure (with the full run's --log-every 25 it had one and stopped the smoke test); a full
    probe that printed too few lines says so, not that the run failed."""
    launched: list[list[str]] = []
    monkeypatch.setattr(schedule.subprocess, "Popen", _probe_of_steps(launched, steps=2))
    monkeypatch.setattr(schedule.time, "sleep", lambda seconds: None)
    work = tmp_path / "work"
    argv = ["extend", "--carry", str(_carried_squad(tmp_path)), "--work", str(work), "--out", str(tmp_path / "out"),
            "--deadline", "500", *(["--smoke", smoke] if smoke else [])]  # fmt: skip
    if smoke:
        assert schedule.main(argv) == 0
        probe = launched[0]
        assert probe[len(probe) - 1 - probe[::-1].index("--log-every") + 1] == "1"
        plan = next(event for event in json.loads((work / "results.json").read_text(encoding="utf-8"))["events"]
                    if event["event"] == "plan")  # fmt: skip
        assert plan["groups_per_second"] == pytest.approx(200.0 / schedule.GROUP)
    else:
        with pytest.raises(SystemExit, match="the probe run printed too few progress lines to measure a rate"):
            schedule.main(argv)


def test_sweep_recipe_checkpoints_the_two_epoch_schedule_for_its_curve(schedule, tmp_path):
    recipe = schedule.sweep_recipe(tmp_path / "triples.jsonl.gz", 32, "1e-4", 87599, 6)
    options = dict(zip(recipe[::2], recipe[1::2], strict=True))
    assert options["--epochs"] == "2" and options["--batch-size"] == "32" and options["--learning-rate"] == "1e-4"
    assert options["--save-every"] == str(5476 // 6)  # 2 * ceil(87599 / 32) = 5476 steps, the shipped reader's
    assert options["--keep-checkpoints"] == "6" and options["--save-every-minutes"] == "1"
    assert options["--shared-norm"] == str(tmp_path / "triples.jsonl.gz")
    assert schedule.sweep_recipe(tmp_path, 32, "1e-4", 10, 6)[-3] == "1"  # never 0 (that would mean no curve)
    longer = schedule.sweep_recipe(tmp_path / "triples.jsonl.gz", 32, "1e-4", 87599, 6, epochs=3)
    options = dict(zip(longer[::2], longer[1::2], strict=True))
    assert options["--epochs"] == "3" and options["--save-every"] == str(8214 // 6)  # 3 * ceil(87599 / 32) steps


def _carried_squad(tmp_path: Path) -> Path:
    """A carried folder holding (empty) SQuAD train and dev files, as the schedule unpacks them."""
    carry = tmp_path / "carry"
    carry.mkdir()
    for name in ("train-v1.1.json", "dev-v1.1.json"):
        (carry / f"{name}.xz").write_bytes(lzma.compress(b'{"data": []}'))
    return carry


def _fake_sweep(launched: list[list[str]], finishing: set[str], curve_rows: list[dict] | None = None):
    """A Popen stand-in: runs named in `finishing` end with a model and a dev evaluation; the others are cut off
    after a checkpoint at step 10 (weights all 10); reader_curve.py prints a table and `curve_rows` (when given)
    and ends at once."""

    def popen(command, stdout=None, stderr=None, env=None):
        launched.append([str(part) for part in command])
        assert "--output" not in command or env["PYTHONUNBUFFERED"] == "1"  # a cut-off run keeps its last lines
        if "--output" not in command and curve_rows is not None:
            stdout.write(f"run k step\n{json.dumps(curve_rows)}\n".encode())
            stdout.flush()
        if "--output" in command:
            output = Path(command[command.index("--output") + 1])
            checkpoint = output / "checkpoints" / "step-0000010"
            checkpoint.mkdir(parents=True, exist_ok=True)
            save_file({"weight": torch.full((3,), 10.0)}, checkpoint / "model.safetensors")
            (checkpoint / "training_state.json").write_text("{}", encoding="utf-8")
            if output.name in finishing:
                save_file({"weight": torch.full((3,), float(len(output.name)))}, output / "model.safetensors")
                (output / "eval-dev.json").write_text(json.dumps({"f1": 70.0}), encoding="utf-8")
        return _FinishedRun()

    return popen


def test_sweep_resumes_cut_runs_leaves_finished_ones_and_scores_their_curves(schedule, tmp_path, monkeypatch):
    carry = _carried_squad(tmp_path)
    monkeypatch.setattr(schedule.time, "sleep", lambda seconds: None)
    work = tmp_path / "work"
    argv = ["sweep", "--carry", str(carry), "--work", str(work), "--out", str(tmp_path / "out"), "--layers", "0", "5"]

    first: list[list[str]] = []
    monkeypatch.setattr(schedule.subprocess, "Popen", _fake_sweep(first, finishing={"sweep-k0"}))
    assert schedule.main(argv) == 0
    trained = {command[command.index("--output") + 1]: command for command in first if "--output" in command}
    assert sorted(trained) == [str(work / "sweep-k0"), str(work / "sweep-k5")]
    for k, command in ((0, trained[str(work / "sweep-k0")]), (5, trained[str(work / "sweep-k5")])):
        assert command[command.index("--layers") + 1] == str(k)
        assert command[command.index("--model") + 1] == str(carry / "start")
        assert not {"--resume", "--chunk-windows", "--compile"} & set(command)  # train qa's own defaults
    curves = [command for command in first if command[1].endswith("reader_curve.py")]
    assert len(curves) == 1 and str(work / "sweep-k0") in curves[0] and str(work / "sweep-k5") not in curves[0]

    second: list[list[str]] = []
    monkeypatch.setattr(schedule.subprocess, "Popen", _fake_sweep(second, finishing={"sweep-k0", "sweep-k5"}))
    assert schedule.main(argv) == 0
    trained_again = [command for command in second if "--output" in command]
    assert len(trained_again) == 1
    assert trained_again[0][trained_again[0].index("--output") + 1] == str(work / "sweep-k5")
    assert "--resume" in trained_again[0]
    assert "--chunk-windows" not in trained_again[0]
    curve = next(command for command in second if command[1].endswith("reader_curve.py"))
    assert str(work / "sweep-k0") in curve and str(work / "sweep-k5") in curve
    events = json.loads((work / "results.json").read_text(encoding="utf-8"))["events"]
    assert [(event["run"], event["state"]) for event in events if event["event"] == "sweep"] == [
        ("sweep-k0", "done"), ("sweep-k5", "resume")
    ]


def test_sweep_with_distil_trains_the_teacher_first_then_students_from_it_and_exports_it(
    schedule, tmp_path, monkeypatch
):
    carry, work, out = _carried_squad(tmp_path), tmp_path / "work", tmp_path / "out"
    monkeypatch.setattr(schedule.time, "sleep", lambda seconds: None)
    launched: list[list[str]] = []
    fake = _fake_sweep(launched, finishing={"sweep-k0", "distil-k4"})
    teacher_ready_at_launch: list[bool] = []
    teacher_exported_at_launch: list[bool] = []

    def popen(command, stdout=None, stderr=None, env=None):
        teacher_ready_at_launch.append((work / "sweep-k0" / "model.safetensors").is_file())
        teacher_exported_at_launch.append((out / "sweep-k0.tar").is_file())
        return fake(command, stdout=stdout, stderr=stderr, env=env)

    monkeypatch.setattr(schedule.subprocess, "Popen", popen)
    argv = ["sweep", "--carry", str(carry), "--work", str(work), "--out", str(out), "--layers", "0", "4", "5",
            "--distil", "--export", "sweep-k0"]  # fmt: skip
    assert schedule.main(argv) == 0
    trained = [command for command in launched if "--output" in command]
    outputs = [command[command.index("--output") + 1] for command in trained]
    assert outputs == [str(work / "sweep-k0"), str(work / "distil-k4"), str(work / "distil-k5")]
    assert teacher_ready_at_launch[:3] == [False, True, True], "the students start once the teacher has ended"
    assert teacher_exported_at_launch[:3] == [False, True, True], "and once its weights are exported"
    teacher, students = trained[0], trained[1:]
    assert teacher[teacher.index("--model") + 1] == str(carry / "start") and "--teacher" not in teacher
    for k, command in zip((4, 5), students, strict=True):
        assert command[command.index("--layers") + 1] == str(k)
        assert command[command.index("--model") + 1] == str(work / "sweep-k0")
        assert command[command.index("--teacher") + 1] == str(work / "sweep-k0")
    curve = next(command for command in launched if command[1].endswith("reader_curve.py"))
    assert str(work / "sweep-k0") in curve and str(work / "distil-k4") in curve and str(work / "distil-k5") not in curve
    joined = tmp_path / "joined"
    assert schedule.main(["join", str(out), "sweep-k0", "--into", str(joined)]) == 0
    assert torch.equal(load_file(joined / "model.safetensors")["weight"], torch.full((3,), 8.0, dtype=torch.float16))
    events = json.loads((work / "results.json").read_text(encoding="utf-8"))["events"]
    assert [event["run"] for event in events if event["event"] == "exported"] == ["sweep-k0"]


def test_sweep_with_students_from_start_distils_from_the_new_teacher_into_the_carried_reader(
    schedule, tmp_path, monkeypatch
):
    """--students-from-start: the teacher trains from start/ as usual, and each student starts from start/ too
    (a trained reader continued) while it learns from the teacher trained in this call; --student-learning-rate
    sets the students' rate alone."""
    carry, work, out = _carried_squad(tmp_path), tmp_path / "work", tmp_path / "out"
    monkeypatch.setattr(schedule.time, "sleep", lambda seconds: None)
    launched: list[list[str]] = []
    monkeypatch.setattr(schedule.subprocess, "Popen", _fake_sweep(launched, finishing={"sweep-k0", "distil-k4"}))
    argv = ["sweep", "--carry", str(carry), "--work", str(work), "--out", str(out), "--layers", "0", "4",
            "--distil", "--students-from-start", "--student-learning-rate", "3e-5",
            "--export", "distil-k4"]  # fmt: skip
    assert schedule.main(argv) == 0
    trained = [command for command in launched if "--output" in command]
    teacher, student = trained
    rates = [[command[i + 1] for i, part in enumerate(command) if part == "--learning-rate"] for command in trained]
    assert rates[0][-1] == schedule.LEARNING_RATE, "the teacher keeps the sweep's rate"
    assert rates[1][-1] == "3e-5", "the student's own rate comes last, so train qa takes it"
    assert teacher[teacher.index("--output") + 1] == str(work / "sweep-k0")
    assert teacher[teacher.index("--model") + 1] == str(carry / "start") and "--teacher" not in teacher
    assert student[student.index("--output") + 1] == str(work / "distil-k4")
    assert student[student.index("--model") + 1] == str(carry / "start")
    assert student[student.index("--teacher") + 1] == str(work / "sweep-k0")
    assert (out / "distil-k4.tar").is_file()


def test_sweep_with_distil_learns_from_the_carried_teacher_or_trains_no_student_without_one(
    schedule, tmp_path, monkeypatch
):
    carry, work, out = _carried_squad(tmp_path), tmp_path / "work", tmp_path / "out"
    monkeypatch.setattr(schedule.time, "sleep", lambda seconds: None)
    argv = ["sweep", "--carry", str(carry), "--work", str(work), "--out", str(out), "--layers", "4",
            "--distil", "--export", "distil-k4"]  # fmt: skip
    launched: list[list[str]] = []
    monkeypatch.setattr(schedule.subprocess, "Popen", _fake_sweep(launched, finishing=set()))
    assert schedule.main(argv) == 0
    assert launched == [], "no teacher here or carried: no student"
    events = json.loads((work / "results.json").read_text(encoding="utf-8"))["events"]
    assert [event.get("path", event.get("reason")) for event in events if event["event"] != "sweep"] == [
        None, "not trained to the end"
    ]
    assert not list(out.glob("distil-k4*"))

    (carry / "teacher-k0").mkdir()
    save_file({"weight": torch.zeros(3)}, carry / "teacher-k0" / "model.safetensors")
    monkeypatch.setattr(schedule.subprocess, "Popen", _fake_sweep(launched, finishing={"distil-k4"}))
    assert schedule.main(argv) == 0
    (student,) = [command for command in launched if "--output" in command]
    assert student[student.index("--model") + 1] == str(carry / "teacher-k0")
    assert student[student.index("--teacher") + 1] == str(carry / "teacher-k0")
    assert len(list(out.glob("distil-k4.safetensors.part-*"))) == 1 and (out / "distil-k4.tar").is_file()


@pytest.mark.parametrize("env", [{"CUDA_MPS_PIPE_DIRECTORY": "/tmp/mps-pipe"}, None])
def test_sweep_with_mps_makes_every_process_a_client_or_goes_on_without_one(schedule, tmp_path, monkeypatch, env):
    carry, work = _carried_squad(tmp_path), tmp_path / "work"
    monkeypatch.setattr(schedule.time, "sleep", lambda seconds: None)
    launched: list[list[str]] = []
    environments: list[dict[str, str]] = []
    fake = _fake_sweep(launched, finishing={"sweep-k0", "sweep-k4"})

    def popen(command, stdout=None, stderr=None, env=None):
        environments.append(env)
        return fake(command, stdout=stdout, stderr=stderr, env=env)

    servers: list[Path] = []

    @contextmanager
    def server(directory: Path):
        servers.append(directory)
        served = None if env is None else {**os.environ, **env}
        yield importlib.import_module("cuda_mps").MpsServer(served, "on" if env else "no MPS here")

    monkeypatch.setattr(schedule.subprocess, "Popen", popen)
    monkeypatch.setattr(schedule, "mps_server", server)
    argv = ["sweep", "--carry", str(carry), "--work", str(work), "--out", str(tmp_path / "out"), "--layers", "0", "4",
            "--mps", "--compile"]  # fmt: skip
    assert schedule.main(argv) == 0
    assert servers == [work / "mps"]
    assert len(launched) == 3, "two runs and the curve"
    assert ["--compile" in command for command in launched] == [True, True, False]
    pipes = [environment.get("CUDA_MPS_PIPE_DIRECTORY") for environment in environments]
    assert pipes == [None if env is None else "/tmp/mps-pipe"] * 3
    events = json.loads((work / "results.json").read_text(encoding="utf-8"))["events"]
    assert [event["state"] for event in events if event["event"] == "mps"] == ["on" if env else "no MPS here"]


def test_sweep_without_mps_starts_no_server(schedule, tmp_path, monkeypatch):
    monkeypatch.setattr(schedule.time, "sleep", lambda seconds: None)
    monkeypatch.setattr(schedule.subprocess, "Popen", _fake_sweep([], finishing={"sweep-k0"}))
    monkeypatch.setattr(schedule, "mps_server", lambda directory: pytest.fail("no MPS was asked for"))
    argv = ["sweep", "--carry", str(_carried_squad(tmp_path)), "--work", str(tmp_path / "work"),
            "--out", str(tmp_path / "out"), "--layers", "0"]  # fmt: skip
    assert schedule.main(argv) == 0


@pytest.mark.parametrize("evaluation", [None, "", '{"f1": null}'])
def test_a_trained_run_without_a_dev_f1_is_only_evaluated(schedule, tmp_path, monkeypatch, evaluation):
    carry, work = _carried_squad(tmp_path), tmp_path / "work"
    run = work / "sweep-k2"
    (run / "checkpoints" / "step-0000010").mkdir(parents=True)
    (run / "checkpoints" / "step-0000010" / "training_state.json").write_text("{}", encoding="utf-8")
    (run / "model.safetensors").write_bytes(b"weights")
    if evaluation is not None:
        (run / "eval-dev.json").write_text(evaluation, encoding="utf-8")
    assert schedule.sweep_state(run) == "evaluate"
    monkeypatch.setattr(schedule.time, "sleep", lambda seconds: None)
    launched: list[list[str]] = []

    def popen(command, stdout=None, stderr=None, env=None):
        launched.append([str(part) for part in command])
        if "evaluate-rc" in command:
            stdout.write(json.dumps({"em": 50.0, "f1": 60.0}).encode())
            stdout.flush()
        return _FinishedRun()

    monkeypatch.setattr(schedule.subprocess, "Popen", popen)
    argv = ["sweep", "--carry", str(carry), "--work", str(work), "--out", str(tmp_path / "out"), "--layers", "2"]
    assert schedule.main(argv) == 0
    assert launched[0][2:4] == ["dilstore", "evaluate-rc"], "no training again"
    assert not any("train" in command for command in launched)
    assert launched[0][launched[0].index("--model") + 1] == str(run)
    assert schedule.sweep_state(run) == "done"
    assert any(command[1].endswith("reader_curve.py") for command in launched[1:]), "then its curve is scored"


def test_records_turns_a_sweeps_results_into_run_folders_and_curve_rows(schedule, tmp_path, monkeypatch, capsys):
    carry = _carried_squad(tmp_path)
    monkeypatch.setattr(schedule.time, "sleep", lambda seconds: None)
    launched: list[list[str]] = []
    rows = [{"run": "sweep-k0", "k": 0, "step": 10, "windows_seen": 40, "train_hours": 0.1, "em": 1.0, "f1": 2.0}]
    monkeypatch.setattr(schedule.subprocess, "Popen", _fake_sweep(launched, finishing={"sweep-k0"}, curve_rows=rows))
    work, out = tmp_path / "work", tmp_path / "out"
    for k in (0, 5):
        (work / f"sweep-k{k}").mkdir(parents=True)
        (work / f"sweep-k{k}" / "run_config.json").write_text("{}", encoding="utf-8")
        (work / f"sweep-k{k}" / "dilstore_training.json").write_text(json.dumps({"k": k}), encoding="utf-8")
    argv = ["sweep", "--carry", str(carry), "--work", str(work), "--out", str(out), "--layers", "0", "5"]
    assert schedule.main(argv) == 0

    into = tmp_path / "records"
    assert schedule.main(["records", str(out), "--into", str(into)]) == 0
    assert sorted(path.name for path in into.iterdir()) == ["curve-rows.json", "sweep-k0"], "k5 has no evaluation"
    assert json.loads((into / "sweep-k0" / "eval-dev.json").read_text(encoding="utf-8")) == {"f1": 70.0}
    assert json.loads((into / "sweep-k0" / "dilstore_training.json").read_text(encoding="utf-8")) == {"k": 0}
    assert json.loads((into / "curve-rows.json").read_text(encoding="utf-8")) == rows
    assert "sweep-k0; 1 curve rows (1 in all)" in capsys.readouterr().out

    # A later draw's records add to the folder: other runs' rows stay, the same runs' rows are replaced.
    earlier = {"run": "sweep-k4", "k": 4, "step": 10, "windows_seen": 40, "train_hours": 0.1, "em": 3.0, "f1": 4.0}
    stale = {**rows[0], "f1": 1.0}
    (into / "curve-rows.json").write_text(json.dumps([earlier, stale]), encoding="utf-8")
    assert schedule.main(["records", str(out), "--into", str(into)]) == 0
    assert json.loads((into / "curve-rows.json").read_text(encoding="utf-8")) == [earlier, *rows]
    assert "1 curve rows (2 in all)" in capsys.readouterr().out


def test_records_refuses_an_archive_without_results(schedule, tmp_path, capsys):
    import tarfile

    out = tmp_path / "out"
    out.mkdir()
    with tarfile.open(out / "results.tgz", "w:gz"):
        pass
    assert schedule.main(["records", str(out), "--into", str(tmp_path / "records")]) == 2
    assert "no results.json" in capsys.readouterr().err


def test_curve_rows_are_the_last_line_only_when_it_is_the_rows(schedule):
    rows = [{"run": "sweep-k0", "step": 1}]
    assert schedule.curve_rows(f"table\n{json.dumps(rows)}\n") == rows
    assert schedule.curve_rows("table\nsweep-k0  0  8  64\n") == []  # cut off before the rows were printed
    assert schedule.curve_rows("Traceback (most recent call last):\n  ...\nValueError: x\n") == []
    assert schedule.curve_rows("") == []
    assert schedule.curve_rows('{"not": "rows"}') == []


def test_records_names_a_missing_archive(schedule, tmp_path, capsys):
    assert schedule.main(["records", str(tmp_path), "--into", str(tmp_path / "records")]) == 2
    assert f"{tmp_path / 'results.tgz'}: no such file" in capsys.readouterr().err


class _RunningRun:
    """A Popen stand-in for a run that never ends by itself."""

    returncode = None

    def __init__(self) -> None:
        self.terminated = False

    def poll(self):
        return None if not self.terminated else -15

    def terminate(self) -> None:
        self.terminated = True

    def wait(self, timeout=None):
        return -15


def test_sweep_gives_its_runs_the_whole_deadline(schedule, tmp_path, monkeypatch):
    carry = _carried_squad(tmp_path)
    clock = [0.0]
    monkeypatch.setattr(schedule.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(schedule.time, "sleep", lambda seconds: clock.__setitem__(0, clock[0] + seconds))
    launched: list[list[str]] = []

    def popen(command, stdout=None, stderr=None, env=None):
        launched.append([str(part) for part in command])
        return _RunningRun()

    monkeypatch.setattr(schedule.subprocess, "Popen", popen)
    work = tmp_path / "work"
    argv = ["sweep", "--carry", str(carry), "--work", str(work), "--out", str(tmp_path / "out"), "--layers", "0", "4",
            "--deadline", "500"]  # fmt: skip
    assert schedule.main(argv) == 0
    events = json.loads((work / "results.json").read_text(encoding="utf-8"))["events"]
    stopped = [event for event in events if event["event"] == "stopped"]
    assert [event["run"] for event in stopped] == ["sweep-k0", "sweep-k4"]
    assert all(500 <= event["t"] < 503 for event in stopped)
    assert not [command for command in launched if command[1].endswith("reader_curve.py")]  # nothing finished


def test_sweep_passes_chunk_windows_to_every_run(schedule, tmp_path, monkeypatch):
    carry = _carried_squad(tmp_path)
    monkeypatch.setattr(schedule.time, "sleep", lambda seconds: None)
    launched: list[list[str]] = []
    monkeypatch.setattr(schedule.subprocess, "Popen", _fake_sweep(launched, finishing=set()))
    argv = ["sweep", "--carry", str(carry), "--work", str(tmp_path / "work"), "--out", str(tmp_path / "out"),
            "--layers", "1", "3", "--chunk-windows", "32"]  # fmt: skip
    assert schedule.main(argv) == 0
    trained = [command for command in launched if "--output" in command]
    assert len(trained) == 2
    assert all(command[command.index("--chunk-windows") + 1] == "32" for command in trained)


def test_sweep_epochs_reach_the_teacher_and_its_students_alike(schedule, tmp_path, monkeypatch):
    carry = _carried_squad(tmp_path)
    monkeypatch.setattr(schedule.time, "sleep", lambda seconds: None)
    launched: list[list[str]] = []
    monkeypatch.setattr(schedule.subprocess, "Popen", _fake_sweep(launched, finishing={"sweep-k0", "distil-k4"}))
    argv = ["sweep", "--carry", str(carry), "--work", str(tmp_path / "work"), "--out", str(tmp_path / "out"),
            "--layers", "0", "4", "--distil", "--epochs", "3", "--smoke", "128"]  # fmt: skip
    assert schedule.main(argv) == 0
    trained = {command[command.index("--output") + 1]: command for command in launched if "--output" in command}
    assert [Path(output).name for output in trained] == ["sweep-k0", "distil-k4"]
    for command in trained.values():
        assert command[command.index("--epochs") + 1] == "3"
        # 3 * ceil(128 / 32) = 12 steps over 6 points: every 2 (2 epochs would give every 1)
        assert command[command.index("--save-every") + 1] == "2"


class _StubbornRun(_RunningRun):
    """A run that does not end within the wait after SIGTERM (a step or checkpoint still going)."""

    def __init__(self) -> None:
        super().__init__()
        self.killed = False

    def wait(self, timeout=None):
        if timeout is not None and not self.killed:
            raise subprocess.TimeoutExpired(cmd="train qa", timeout=timeout)
        return -9

    def kill(self) -> None:
        self.killed = True


def test_a_run_that_outlasts_the_wait_after_sigterm_is_killed(schedule, tmp_path, monkeypatch):
    carry = _carried_squad(tmp_path)
    clock = [0.0]
    monkeypatch.setattr(schedule.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(schedule.time, "sleep", lambda seconds: clock.__setitem__(0, clock[0] + seconds))
    runs: list[_StubbornRun] = []

    def popen(command, stdout=None, stderr=None, env=None):
        runs.append(_StubbornRun())
        return runs[-1]

    monkeypatch.setattr(schedule.subprocess, "Popen", popen)
    argv = ["sweep", "--carry", str(carry), "--work", str(tmp_path / "work"), "--out", str(tmp_path / "out"),
            "--layers", "2", "--deadline", "100"]  # fmt: skip
    assert schedule.main(argv) == 0
    assert len(runs) == 1 and runs[0].terminated and runs[0].killed


def test_sweep_export_cut_brings_back_the_newest_checkpoint_of_a_run_the_deadline_stopped(
    schedule, tmp_path, monkeypatch
):
    carry, work, out = _carried_squad(tmp_path), tmp_path / "work", tmp_path / "out"
    (carry / "teacher-k0").mkdir()
    save_file({"weight": torch.zeros(3)}, carry / "teacher-k0" / "model.safetensors")
    monkeypatch.setattr(schedule.time, "sleep", lambda seconds: None)
    monkeypatch.setattr(schedule.subprocess, "Popen", _fake_sweep([], finishing=set()))
    argv = ["sweep", "--carry", str(carry), "--work", str(work), "--out", str(out), "--layers", "4", "--distil",
            "--export", "distil-k4"]  # fmt: skip
    assert schedule.main(argv) == 0
    assert not list(out.glob("distil-k4*")), "without --export-cut a cut run stays on the machine"

    assert schedule.main([*argv, "--export-cut"]) == 0
    events = json.loads((work / "results.json").read_text(encoding="utf-8"))["events"]
    assert [event for event in events if event["event"] == "exported"][0]["checkpoint"] == "step-0000010"
    joined = tmp_path / "joined"
    assert schedule.main(["join", str(out), "distil-k4", "--into", str(joined)]) == 0
    assert torch.equal(load_file(joined / "model.safetensors")["weight"], torch.full((3,), 10.0, dtype=torch.float16))


def test_sweep_export_cut_exports_a_finished_run_itself(schedule, tmp_path, monkeypatch):
    carry, work, out = _carried_squad(tmp_path), tmp_path / "work", tmp_path / "out"
    monkeypatch.setattr(schedule.time, "sleep", lambda seconds: None)
    monkeypatch.setattr(schedule.subprocess, "Popen", _fake_sweep([], finishing={"sweep-k2"}))
    argv = ["sweep", "--carry", str(carry), "--work", str(work), "--out", str(out), "--layers", "2",
            "--export", "sweep-k2", "--export-cut"]  # fmt: skip
    assert schedule.main(argv) == 0
    events = json.loads((work / "results.json").read_text(encoding="utf-8"))["events"]
    assert [event for event in events if event["event"] == "exported"] == [
        {"event": "exported", "run": "sweep-k2", "t": pytest.approx(0, abs=60)}
    ]
    joined = tmp_path / "joined"
    assert schedule.main(["join", str(out), "sweep-k2", "--into", str(joined)]) == 0
    assert torch.equal(load_file(joined / "model.safetensors")["weight"], torch.full((3,), 8.0, dtype=torch.float16))


@settings(max_examples=80, deadline=None)
@given(rates=st.dictionaries(st.sampled_from([0, 4, 16, 32, 64]), st.floats(0.1, 5000), min_size=1)
       .map(lambda rates: {0: 100.0, **rates}))  # fmt: skip
def test_pick_chunk_windows_takes_the_fastest_only_when_it_beats_one_pass_clearly(schedule, rates):
    chosen = schedule.pick_chunk_windows(rates)
    assert chosen in rates
    if chosen == 0:
        assert max(rates.values()) < schedule.AUTO_MARGIN * rates[0] or rates[0] == max(rates.values())
    else:
        assert rates[chosen] == max(rates.values()) and rates[chosen] >= schedule.AUTO_MARGIN * rates[0]


def _bench_result(rates: dict[int, float], returncode: int = 0, stderr: str = ""):
    rows = [{"chunk_windows": chunk, "windows_per_second": rate} for chunk, rate in rates.items()]
    stdout = "a table\n" + json.dumps({"rows": rows}) + "\n" if returncode == 0 else "a table\n"
    return subprocess.CompletedProcess(args=[], returncode=returncode, stdout=stdout, stderr=stderr)


def test_sweep_chunk_windows_auto_times_the_sizes_once_and_trains_every_run_with_the_fastest(
    schedule, tmp_path, monkeypatch
):
    carry, work = _carried_squad(tmp_path), tmp_path / "work"
    monkeypatch.setattr(schedule.time, "sleep", lambda seconds: None)
    benches: list[list[str]] = []

    def bench(command, **options):
        benches.append([str(part) for part in command])
        assert options["timeout"] == schedule.AUTO_SECONDS
        return _bench_result({0: 2000.0, 64: 2300.0, 32: 2450.0})

    monkeypatch.setattr(schedule.subprocess, "run", bench)
    launched: list[list[str]] = []
    monkeypatch.setattr(schedule.subprocess, "Popen", _fake_sweep(launched, finishing=set()))
    argv = ["sweep", "--carry", str(carry), "--work", str(work), "--out", str(tmp_path / "out"), "--layers", "0", "4",
            "--groups", "16", "--chunk-windows", "auto"]  # fmt: skip
    assert schedule.main(argv) == 0
    (command,) = benches
    assert command[1].endswith("bench_length_chunks.py")
    assert command[command.index("--layers") + 1] == "4" and command[command.index("--batch-size") + 1] == "16"
    assert command[command.index("--chunks") + 1 : command.index("--chunks") + 4] == ["0", "64", "32"]
    trained = [command for command in launched if "--output" in command]
    assert len(trained) == 2 and all(command[command.index("--chunk-windows") + 1] == "32" for command in trained)

    launched.clear()
    assert schedule.main(argv) == 0, "a later call of the draw"
    assert len(benches) == 1, "the choice is kept, not timed again"
    trained = [command for command in launched if "--output" in command]
    assert trained and all(command[command.index("--chunk-windows") + 1] == "32" for command in trained)


@pytest.mark.parametrize(
    "outcome, chosen",
    [
        (_bench_result({0: 2000.0, 64: 2050.0, 32: 1500.0}), "0"),  # 2.5% faster: not clearly, one pass
        (_bench_result({}, returncode=1, stderr="CUDA out of memory"), None),
        (subprocess.TimeoutExpired(cmd="bench", timeout=150), None),
    ],
)
def test_sweep_chunk_windows_auto_keeps_one_pass_unless_a_size_is_clearly_faster(
    schedule, tmp_path, monkeypatch, outcome, chosen
):
    carry, work = _carried_squad(tmp_path), tmp_path / "work"
    monkeypatch.setattr(schedule.time, "sleep", lambda seconds: None)

    def bench(command, **options):
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    monkeypatch.setattr(schedule.subprocess, "run", bench)
    launched: list[list[str]] = []
    monkeypatch.setattr(schedule.subprocess, "Popen", _fake_sweep(launched, finishing=set()))
    argv = ["sweep", "--carry", str(carry), "--work", str(work), "--out", str(tmp_path / "out"), "--layers", "4",
            "--chunk-windows", "auto"]  # fmt: skip
    assert schedule.main(argv) == 0
    (trained,) = [command for command in launched if "--output" in command]
    if chosen is None:
        assert "--chunk-windows" not in trained, "a failed timing leaves train qa's default"
        events = json.loads((work / "results.json").read_text(encoding="utf-8"))["events"]
        failed = next(event for event in events if event["event"] == "chunk windows")["failed"]
        assert "CUDA out of memory" in failed or "no result in 150 s" in failed
        assert not (work / "chunk-windows.json").exists(), "a later call times again"
    else:
        assert trained[trained.index("--chunk-windows") + 1] == chosen


@pytest.mark.parametrize("value", ["-1", "many", "3.5"])
def test_sweep_refuses_a_chunk_windows_that_is_not_a_count_or_auto(schedule, tmp_path, capsys, value):
    argv = ["sweep", "--out", str(tmp_path / "out"), "--layers", "4", "--chunk-windows", value]
    with pytest.raises(SystemExit) as exit_info:
        schedule.main(argv)
    assert exit_info.value.code == 2
    assert f"{value!r} is neither a number of windows (0 or more) nor auto" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("options", "named"),
    [(["--students-from-start"], "--students-from-start"),
     (["--student-learning-rate", "3e-5"], "--student-learning-rate"),
     (["--students-from-start", "--student-learning-rate", "3e-5"],
      "--students-from-start and --student-learning-rate")],
)  # fmt: skip
def test_sweep_refuses_student_options_without_distil(schedule, tmp_path, capsys, options, named):
    with pytest.raises(SystemExit) as exit_info:
        schedule.main(["sweep", "--out", str(tmp_path / "out"), "--layers", "0", "4", *options])
    assert exit_info.value.code == 2
    assert f"{named} only apply with --distil" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
