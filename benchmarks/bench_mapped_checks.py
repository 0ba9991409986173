"""What checking the mapped files before each fetch costs: fetch latency with the check and without, side by side.

A memory-mapped store opened with `check_files` (as `serve` opens its stores) stats the id index's files
and those of every open shard a fetch points to before it reads them (storage/mapped.py: a file cut short
under a map kills the process with SIGBUS, and bytes written in place read as data). This builds a local
fp16 store of random passages, opens it once, and times warm fetches of `--ids` random ids, alternating
rounds with the check (the store's manifest still there, then the mapped files) and with `check_files` off,
`--rounds` rounds of `--fetches` fetches each. Prints a table, then the rows as JSON.

    .venv/bin/python benchmarks/bench_mapped_checks.py --shards 40 --passages 500 --ids 1 100
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # tests/fixtures/store_fixtures.py: random passages and a finalized store of them

from dilstore.runners.arg_types import positive_int  # noqa: E402
from dilstore.storage.reader import Store, open_store  # noqa: E402
from tests.fixtures.store_fixtures import build_store, random_shards  # noqa: E402


def fetch_microseconds(store: Store, ids: list[list[str]], fetches: int) -> float:
    """Median microseconds of one fetch over `fetches` fetches, cycling through the id lists."""
    times = []
    for number in range(fetches):
        started = time.perf_counter()
        store.fetch(ids[number % len(ids)])
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1e6


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shards", type=positive_int, default=40)
    parser.add_argument("--passages", type=positive_int, default=500, help="passages per shard")
    parser.add_argument("--ids", type=positive_int, nargs="+", default=[1, 100], help="ids per fetch")
    parser.add_argument("--fetches", type=positive_int, default=200, help="fetches per round")
    parser.add_argument("--rounds", type=positive_int, default=5, help="rounds per setting, alternating")
    args = parser.parse_args(argv)
    rng = np.random.default_rng(0)
    rows = []
    with tempfile.TemporaryDirectory() as work:
        shards = random_shards([args.passages] * args.shards, state_shape=(384,), seed=1, max_words=150)
        root = build_store(Path(work) / "store", shards, encoding="fp16")
        every = [record.id for shard in shards for record in shard]
        with open_store(root, read_path="mmap", max_open_shards=args.shards, check_files=True) as store:
            store.fetch(every)  # every shard open and every page warm
            for size in args.ids:
                ids = [list(rng.choice(every, size=size, replace=False)) for _ in range(50)]
                times: dict[str, list[float]] = {"checked": [], "unchecked": []}
                for _ in range(args.rounds):
                    for setting in times:
                        store.check_files = setting == "checked"
                        times[setting].append(fetch_microseconds(store, ids, args.fetches))
                store.check_files = True
                on, off = statistics.median(times["checked"]), statistics.median(times["unchecked"])
                rows.append({"ids_per_fetch": size, "checked_us": round(on, 1), "unchecked_us": round(off, 1),
                             "ratio": round(on / off, 3)})  # fmt: skip
    print(f"{'ids per fetch':>14}{'checked µs':>13}{'unchecked µs':>15}{'ratio':>8}")
    for row in rows:
        print(f"{row['ids_per_fetch']:>14}{row['checked_us']:>13.1f}{row['unchecked_us']:>15.1f}{row['ratio']:>8.3f}")
    print(json.dumps({"shards": args.shards, "passages_per_shard": args.passages, "fetches": args.fetches,
                      "rounds": args.rounds, "rows": rows}))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
