"""A serve worker's memory over batches of varying shapes: RSS with the freed memory handed back after each batch
(`serve_batching.return_freed_memory`, as the store worker does) and without, side by side.

Each setting runs in its own process (RSS is a process's), which opens `--store` (a dilbert store, read with its
own model or `--model`) and, on a worker thread as `serve` does, answers `--batches` batches of 1 to 8 seeded
random questions at a top_p of 5, 17 or 29, printing RSS every `--every` batches. glibc's malloc kept the memory
those batches freed: a soak of `serve` grew from 1.0 to 3.6 GB in 21 minutes. Prints a table, then the
rows as JSON.

    .venv/bin/dilstore precompute --input PASSAGES.jsonl --output /tmp/qa-store --split none --workers 1
    .venv/bin/python benchmarks/bench_worker_memory.py --store /tmp/qa-store --batches 80
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import threading
import time
from pathlib import Path

from dilstore.runners.arg_types import absolute_path, positive_int

ROOT = Path(__file__).resolve().parents[1]
WORDS = "river city war company disease law name size history cause effect date price people team season".split()


def rss_mib() -> int:
    """This process's resident set size, MiB."""
    with open("/proc/self/status", encoding="ascii") as status:
        kib = next(int(line.split()[1]) for line in status if line.startswith("VmRSS"))
    return kib // 1024


def run_setting(store: str, model: str | None, batches: int, every: int, trim: bool) -> list[dict[str, float]]:
    """RSS and elapsed seconds every `every` batches, answering on a worker thread (in this process)."""
    import dilstore
    from dilstore.runners.serve_batching import return_freed_memory

    reader = dilstore.open_reader(store, model=model)
    rng = random.Random(0)
    rows: list[dict[str, float]] = []

    def work() -> None:
        started = time.perf_counter()
        for number in range(1, batches + 1):
            questions = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 20))) + "?"
                         for _ in range(rng.randint(1, 8))]  # fmt: skip
            reader.answer_many(questions, top_p=rng.choice([5, 17, 29]))
            if trim:
                return_freed_memory()
            if number % every == 0:
                seconds = round(time.perf_counter() - started, 1)
                rows.append({"batches": number, "rss_mib": rss_mib(), "seconds": seconds})

    worker = threading.Thread(target=work, name="dilstore-serve-bench")
    worker.start()
    worker.join()
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    # Absolute: each setting's child runs in the repository's folder (bench53 F8).
    parser.add_argument("--store", type=absolute_path, required=True, help="a dilbert store (with STORE/bm25)")
    parser.add_argument("--model", type=absolute_path,
                        help="the reader's model folder (default: the store's shipped default)")  # fmt: skip
    parser.add_argument("--batches", type=positive_int, default=80)
    parser.add_argument("--every", type=positive_int, default=10)
    parser.add_argument("--setting", choices=("trim", "keep"), help=argparse.SUPPRESS)  # one child's run
    args = parser.parse_args(argv)
    if args.setting is not None:
        model = None if args.model is None else str(args.model)
        print(json.dumps(run_setting(str(args.store), model, args.batches, args.every, args.setting == "trim")))
        return 0
    results = {}
    for setting in ("keep", "trim"):
        command = [sys.executable, __file__, "--store", str(args.store), "--batches", str(args.batches),
                   "--every", str(args.every), "--setting", setting,
                   *(["--model", str(args.model)] if args.model else [])]  # fmt: skip
        done = subprocess.run(command, capture_output=True, text=True, check=True, cwd=ROOT)
        results[setting] = json.loads(done.stdout.strip().splitlines()[-1])
    print(f"{'batches':>8} {'RSS kept MiB':>13} {'RSS trimmed MiB':>16} {'s kept':>7} {'s trimmed':>10}")
    for kept, trimmed in zip(results["keep"], results["trim"], strict=True):
        print(f"{kept['batches']:>8} {kept['rss_mib']:>13} {trimmed['rss_mib']:>16} {kept['seconds']:>7} "
              f"{trimmed['seconds']:>10}")
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
