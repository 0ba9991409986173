"""Training windows/s of `train qa` steps side by side on one GPU: plain, compiled, under CUDA MPS (issue #12).

The k-sweep trains its ks as separate processes on the one lent GPU, and how many finish in one 10-minute call
depends on how many share it well. This script starts workers (as many as the largest phase), each running the
sweep's own training step (the shared-normalisation groups of the first --questions SQuAD questions in the run's
length-grouped order, --batch-size groups a step, AdamW, the autocast of training), and times phases: in phase
"N" the first N workers train side by side for --seconds while the rest wait; "Ns" is the same with the host
waiting for the device after every step, as the training loop's per-step loss read made it do until 2026-11-26
(the step's two other waits of then, a copy from pageable memory and a check of the group targets, are gone from
both).
Workers load their data and model once and warm up before the first phase starts: one pass over their steps
by default, so every padded length has met the device once. (With 3 warm-up steps and 6 s phases a lent H100
gave one plain worker 242 windows/s, while `train qa` on the same GPU with the same recipe logged 741 windows/s
over its first 100 steps, ~1,000 over the next 100 and 2,000-4,000 from step ~400 on: the phases had timed the
start-up regime, not the steady one.) --sets says which
ways of running them to time: "plain" (every phase), then for "compile" (`train qa --compile`), "mps" (an MPS
server, benchmarks/cuda_mps.py, where the machine has one) and "compile+mps", the phases that do not wait, each
set with fresh workers; where MPS cannot start, "compile+mps" runs as "compile" (unless that is asked for too).
Every row's speed-up is against one plain worker alone that does not wait; each set's warm-up seconds (the
slowest worker's: with compile, mostly the compilation) are in its rows.

    # on a lent GPU (the carried start reader and data of gpu_reader_schedule.py prepare):
    python3 benchmarks/bench_side_by_side.py --model .carry/reader/start --train /tmp/train.json \\
        --shared-norm .carry/reader/shared-norm/triples.jsonl.gz --layers 4 --phases 1 2 3 --seconds 6 \\
        --sets plain compile+mps
    # here, a smoke test of the script on the CPU:
    .venv/bin/python benchmarks/bench_side_by_side.py --model .carry/reader/start \\
        --train ../shared/data/squad/train-v1.1.json --shared-norm /work/runs/ranking-data-full/triples.jsonl.gz \\
        --questions 64 --batch-size 2 --phases 1 2 --seconds 5 --device cpu

Windows/s count the windows of the steps a worker finished within its phase (its last step may end a little
after --seconds; the clock covers it). Prints a table, then the rows as JSON.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from dilstore.runners.arg_types import non_negative_int, positive_int

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cuda_mps import mps_server  # noqa: E402

SETS = ("plain", "compile", "mps", "compile+mps")


def parse_phase(text: str) -> tuple[int, bool]:
    """"N" or "Ns" → (N workers, whether the host waits for the device after every step)."""
    waits = text.endswith("s")
    count = text[:-1] if waits else text
    if not count.isdigit() or int(count) < 1:
        raise argparse.ArgumentTypeError(f"a phase is N or Ns with N ≥ 1 workers, got {text!r}")
    return int(count), waits


def worker(args: argparse.Namespace) -> int:
    """One training process: load, warm up, say ready, then train in each phase that includes it."""
    from dilstore.reader.modeling.checkpoints import require_checkpoint_dir

    # A folder that holds no checkpoint fails the worker before torch and the training stack load, not some 6 s
    # after (ci59 F5).
    require_checkpoint_dir(args.model)
    import torch

    from dilstore.reader.modeling.dilbert import DilBertReader
    from dilstore.reader.training.loop import (
        apply_optimizer_step,
        autocast_dtype,
        build_optimizer,
        optimizer_step_batches,
    )
    from dilstore.reader.training.qa import TrainingConfig, accumulate_gradients, load_training_data

    torch.manual_seed(args.index)
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    reader = DilBertReader.from_pretrained(args.model, layers=args.layers).to(device).train()
    config = TrainingConfig(layers=args.layers, batch_size=args.batch_size, train_limit=args.questions, epochs=1,
                            shared_norm=str(args.shared_norm), seed=args.index)  # fmt: skip
    data = load_training_data(reader.tokenizer, args.train, config)
    steps = list(optimizer_step_batches(data.examples, config, data.lengths(config.group_length)))
    optimizer = build_optimizer(reader, config)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)
    dtype = autocast_dtype(config, device)
    scaler = torch.amp.GradScaler("cuda", enabled=dtype == torch.float16)
    position = 0

    def step(wait: bool) -> int:
        nonlocal position
        micro_batches = steps[position % len(steps)]
        position += 1
        loss = accumulate_gradients(reader, data, micro_batches, device, dtype=dtype, scaler=scaler)
        apply_optimizer_step(reader, optimizer, scheduler, scaler, config.max_grad_norm)
        if wait:
            loss.item()
        return sum(len(batch) for batch in micro_batches) * data.group_size

    def settle() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    warming = time.perf_counter()
    if args.compile:
        reader.compile_layers()
    warm_up_steps = len(steps) if args.warm_up_steps is None else args.warm_up_steps
    for _ in range(warm_up_steps):
        step(wait=False)
    settle()
    ready = {"seconds": time.perf_counter() - warming, "steps": warm_up_steps}
    _publish(args.sync_dir / f"ready-{args.index}", json.dumps(ready))
    for number, (count, wait) in enumerate(args.phases):
        go = args.sync_dir / f"go-{number}"
        while not go.exists():
            time.sleep(0.01)
        if args.index >= count:
            continue
        started, windows = time.perf_counter(), 0
        while time.perf_counter() - started < args.seconds:
            windows += step(wait)
        settle()
        seconds = time.perf_counter() - started
        result = json.dumps({"windows": windows, "seconds": seconds})
        _publish(args.sync_dir / f"result-{number}-{args.index}.json", result)
    return 0


def _publish(path: Path, text: str) -> None:
    """Write `path` whole or not at all (a temporary name, then a rename), since the parent reads it once it exists."""
    partial = path.with_name(path.name + ".partial")
    partial.write_text(text, encoding="utf-8")
    partial.rename(path)


def _start_worker(command: list[str], env: dict[str, str] | None, log_path: Path) -> subprocess.Popen[bytes]:
    """Start one worker with its output in `log_path`; the child holds its own descriptor of the log."""
    with log_path.open("wb") as log:
        return subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)


def run_workers(
    args: argparse.Namespace, env: dict[str, str] | None, phases: list[tuple[int, bool]], name: str
) -> list[dict[str, Any]]:
    """Start set `name`'s workers, run `phases` in turn; one row per phase (and a failed row if one fails)."""
    count = max(workers for workers, _ in phases)
    with tempfile.TemporaryDirectory(prefix="side-by-side-") as folder:
        sync_dir = Path(folder)
        processes = [
            _start_worker(worker_command(args.worker_args, index, sync_dir, phases, name), env,
                          sync_dir / f"worker-{index}.log")  # fmt: skip
            for index in range(count)
        ]
        try:
            failure = _wait_for_files(sync_dir, [f"ready-{i}" for i in range(count)], processes, args.startup_timeout)
            if failure:
                return [{"set": name, "failed": failure}]
            readies = [json.loads((sync_dir / f"ready-{index}").read_text(encoding="utf-8")) for index in range(count)]
            warm_up = max(ready["seconds"] for ready in readies)
            rows = []
            for number, (workers, waits) in enumerate(phases):
                (sync_dir / f"go-{number}").touch()
                files = [f"result-{number}-{index}.json" for index in range(workers)]
                failure = _wait_for_files(sync_dir, files, processes, args.seconds + args.startup_timeout)
                if failure:
                    return [*rows, {"set": name, "failed": failure}]
                results = [json.loads((sync_dir / file).read_text(encoding="utf-8")) for file in files]
                rates = [result["windows"] / result["seconds"] for result in results]
                rows.append({
                    "set": name, "processes": workers, "waits_each_step": waits,
                    "windows_per_second_each": [round(rate, 1) for rate in rates],
                    "windows_per_second": round(sum(rates), 1), "warm_up_seconds": round(warm_up, 1),
                    "warm_up_steps": readies[0]["steps"],
                })  # fmt: skip
            return rows
        finally:
            for process in processes:
                try:
                    process.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()


def worker_command(
    common: list[str], index: int, sync_dir: Path, phases: list[tuple[int, bool]], name: str
) -> list[str]:
    """Worker `index` of set `name`: the shared options, its phases, and --compile for a compiled set."""
    compiled = ["--compile"] if "compile" in name else []
    phase_texts = [f"{count}{'s' if waits else ''}" for count, waits in phases]
    return [
        sys.executable, __file__, "worker", "--index", str(index), "--sync-dir", str(sync_dir), *common, *compiled,
        "--phases", *phase_texts,
    ]  # fmt: skip


def _wait_for_files(
    folder: Path, names: list[str], processes: list[subprocess.Popen[bytes]], timeout: float
) -> str | None:
    """None once every file exists; else why not (a worker ended first, with its log's end, or the timeout)."""
    deadline = time.monotonic() + timeout
    while not all((folder / name).exists() for name in names):
        for index, process in enumerate(processes):
            if process.poll() is not None and process.returncode != 0:
                log = (folder / f"worker-{index}.log").read_text(encoding="utf-8", errors="replace")
                return f"worker {index} exited {process.returncode}: {log.strip()[-500:]}"
        if time.monotonic() > deadline:
            return f"no {names} after {timeout:.0f} s"
        time.sleep(0.05)
    return None


def print_rows(rows: list[dict[str, Any]], args: argparse.Namespace) -> None:
    """The table (speed-up against one plain process alone that does not wait: the first such row), then JSON."""
    print(f"k={args.layers}, {args.batch_size} groups a step, first {args.questions} questions, {args.seconds:.0f} s "
          f"a phase, {args.device}")  # fmt: skip
    print(f"{'set':>11} {'processes':>9} {'waits':>6} {'windows/s each':>22} {'windows/s':>10} {'vs 1':>6} "
          f"{'warm-up s':>9}")  # fmt: skip
    one = next((row["windows_per_second"] for row in rows if row.get("processes") == 1
                and not row["waits_each_step"] and row["set"] == "plain"), None)  # fmt: skip
    for row in rows:
        if "failed" in row:
            print(f"{row['set']:>11} failed: {row['failed']}")
            continue
        ratio = f"{row['windows_per_second'] / one:.2f}x" if one else "-"
        each = " ".join(f"{rate:.0f}" for rate in row["windows_per_second_each"])
        waits = "yes" if row["waits_each_step"] else "no"
        print(f"{row['set']:>11} {row['processes']:>9} {waits:>6} {each:>22} {row['windows_per_second']:>10.1f} "
              f"{ratio:>6} {row['warm_up_seconds']:>9.1f}")  # fmt: skip
    print(json.dumps({"layers": args.layers, "batch_size": args.batch_size, "questions": args.questions,
                      "seconds": args.seconds, "device": args.device, "rows": rows}))  # fmt: skip


def argument_parser() -> argparse.ArgumentParser:
    """The options of the benchmark and of its workers (the hidden role, --index, --sync-dir and --compile)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("role", nargs="?", choices=["worker"], help=argparse.SUPPRESS)
    parser.add_argument("--model", type=Path, required=True, help="a reader (or base model) folder")
    parser.add_argument("--train", type=Path, required=True, help="SQuAD v1.1 training JSON")
    parser.add_argument("--shared-norm", type=Path, required=True, help="`train ranking-data` triples")
    parser.add_argument("--layers", type=non_negative_int, default=4, help="k of the reader trained")
    parser.add_argument("--questions", type=positive_int, default=3000, help="first N training questions")
    parser.add_argument("--batch-size", type=positive_int, default=32, help="question groups a step (the sweep's 32)")
    parser.add_argument(
        "--phases", type=parse_phase, nargs="+", default=[(1, False), (1, True), (2, False), (3, False)],
        help="N: N workers side by side; Ns: the same, waiting for the device after every step (default: 1 1s 2 3)",
    )  # fmt: skip
    parser.add_argument("--seconds", type=float, default=10.0, help="seconds each phase trains")
    parser.add_argument(
        "--warm-up-steps", type=non_negative_int, metavar="N",
        help="steps each worker trains before the phases (default: one pass)",
    )  # fmt: skip
    parser.add_argument("--device", default="cuda")
    parser.add_argument(
        "--threads", type=positive_int, default=2, help="torch threads of each worker (train qa's default)"
    )
    parser.add_argument("--sets", nargs="+", choices=SETS, default=["plain"],
                        help="ways of running the workers to time, each with fresh workers (module docstring)")
    parser.add_argument("--compile", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--startup-timeout", type=float, default=180.0, help="seconds a worker may take to start")
    parser.add_argument("--index", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--sync-dir", type=Path, help=argparse.SUPPRESS)
    return parser


def missing_input(args: argparse.Namespace) -> str | None:
    """Which of --model, --train and --shared-norm is not there, as a usage error's text; None when all are.

    Checked before any worker starts: a missing one failed in every worker, and the run printed a "failed" row
    holding the end of a traceback and exited 0 (bench53 F14).
    """
    for flag, path, is_there in (("--model", args.model, Path.is_dir), ("--train", args.train, Path.is_file),
                                 ("--shared-norm", args.shared_norm, Path.is_file)):  # fmt: skip
        if not is_there(path):
            return f"{flag} {path}: no such {'folder' if is_there is Path.is_dir else 'file'}"
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argument_parser()
    args = parser.parse_args(argv)
    if args.role == "worker":
        return worker(args)
    problem = missing_input(args)
    if problem:
        parser.error(problem)
    args.worker_args = [
        "--model", str(args.model), "--train", str(args.train), "--shared-norm", str(args.shared_norm),
        "--layers", str(args.layers), "--questions", str(args.questions), "--batch-size", str(args.batch_size),
        "--seconds", str(args.seconds), "--device", args.device, "--threads", str(args.threads),
        *([] if args.warm_up_steps is None else ["--warm-up-steps", str(args.warm_up_steps)]),
    ]  # fmt: skip
    rows: list[dict[str, Any]] = []
    for name in dict.fromkeys(args.sets):
        phases = args.phases if name == "plain" else [phase for phase in args.phases if not phase[1]]
        if not phases:
            continue
        if "mps" not in name:
            rows += run_workers(args, None, phases, name)
            continue
        with tempfile.TemporaryDirectory(prefix="mps-") as folder, mps_server(Path(folder)) as server:
            if server.env is not None:
                rows += run_workers(args, server.env, phases, name)
                continue
            rows.append({"set": name, "failed": server.note})
            if name == "compile+mps" and "compile" not in args.sets:
                rows += run_workers(args, None, phases, "compile")  # what can be learnt without MPS
    print_rows(rows, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
