"""Fetches of new passages from a store of many shards: the old fixed cap of 128 open shards against the default.

A server reads other passages for each question. With a cap below the store's shard count, most fetches open and
map again shards the reader had just closed (storage43 M1); the default now keeps every shard open whose mapped
files fit the process's open-file limit (`storage.mapped.shards_kept_open`). Both runs are in one process, on one
synthetic store (random states, `bench_scale.build_store`), one after the other, with the same fetches: 29 random
passages each, as one `ask` at top-p 29 reads, after one fetch of every passage (every file in the page cache).

    .venv/bin/python benchmarks/bench_open_shards.py --shards 300 --work-dir /tmp/open-shards

prints a table and the JSON (also written with --json-out).
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import shutil
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from bench_scale import build_store, passage_id

from dilstore.runners.arg_types import positive_int
from dilstore.storage import reader as reader_module
from dilstore.storage.format import MANIFEST_FILE
from dilstore.storage.reader import open_store

OLD_DEFAULT = 128


def measure(root: Path, passages: int, cap: int | None, fetches: list[list[str]]) -> dict[str, Any]:
    """ms per fetch and the shards opened over `fetches`, with `max_open_shards=cap` (None: the default)."""
    opened = []
    real = reader_module.ShardReader

    class Counted(real):  # type: ignore[misc, valid-type]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            opened.append(1)
            super().__init__(*args, **kwargs)

    reader_module.ShardReader = Counted
    try:
        with open_store(root, max_open_shards=cap) as store:
            store.fetch([passage_id(index) for index in range(passages)])  # every shard opened, every file cached
            kept, opened[:] = len(store._shards), []  # noqa: SLF001 - a benchmark may look
            start = time.perf_counter()
            for ids in fetches:
                store.fetch(ids)
            seconds = time.perf_counter() - start
    finally:
        reader_module.ShardReader = real
    return {"max_open_shards": "default" if cap is None else cap, "shards_kept": kept,
            "ms_per_fetch": seconds / len(fetches) * 1e3, "shards_opened": len(opened)}  # fmt: skip


def parse_arguments(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shards", type=positive_int, default=300)
    parser.add_argument("--passages-per-shard", type=positive_int, default=20)
    parser.add_argument("--encoding", default="fp16")
    parser.add_argument("--fetches", type=positive_int, default=200)
    parser.add_argument("--fetch", type=positive_int, default=29, help="passages a fetch (default 29: top-p 29)")
    parser.add_argument("--old-cap", type=positive_int, default=OLD_DEFAULT, help="the cap compared (default 128)")
    parser.add_argument("--work-dir", type=Path, required=True)
    parser.add_argument("--json-out", type=Path)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_arguments(argv)
    passages = args.shards * args.passages_per_shard
    root = args.work_dir / f"store-{args.shards}x{args.passages_per_shard}-{args.encoding}"
    if not (root / MANIFEST_FILE).is_file():  # none yet, or a build cut short
        shutil.rmtree(root, ignore_errors=True)
        build_store(root, passages, args.passages_per_shard, args.encoding)
    rng = np.random.default_rng(0)
    fetches = [[passage_id(index) for index in rng.choice(passages, args.fetch, replace=False)]
               for _ in range(args.fetches)]  # fmt: skip
    rows = [measure(root, passages, cap, fetches) for cap in (args.old_cap, None)]
    result = {"shards": args.shards, "passages": passages, "encoding": args.encoding, "fetch": args.fetch,
              "fetches": args.fetches, "open_file_limit": resource.getrlimit(resource.RLIMIT_NOFILE)[0],
              "machine": f"{platform.node()} ({platform.machine()})", "rows": rows,
              "speedup": rows[0]["ms_per_fetch"] / rows[1]["ms_per_fetch"]}  # fmt: skip
    print(f"{'max_open_shards':>16} {'kept':>6} {'ms/fetch':>9} {'shards opened':>14}")
    for row in rows:
        print(f"{row['max_open_shards']!s:>16} {row['shards_kept']:>6} {row['ms_per_fetch']:>9.2f} "
              f"{row['shards_opened']:>14}")  # fmt: skip
    print(f"default / old cap: {result['speedup']:.1f}x faster per fetch")
    text = json.dumps(result, indent=1)
    print(text)
    if args.json_out:
        args.json_out.write_text(text)


if __name__ == "__main__":
    main()
