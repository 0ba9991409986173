"""A store after many small appends, and the same store compacted (`dilstore compact`), side by side.

Every append adds at least one shard, and `--replace` leaves superseded rows on disk, so a store appended to
daily grows in files, bytes and manifest, and in what opening, fetching and verifying it cost (storage43 M2).
This builds one synthetic store (random states, `bench_scale`'s passages) of `--passages` passages, appends
`--appends` times `--append-passages` passages, each append replacing `--replaced` passages of the one before,
compacts it with `storage.compact.compact_store` (precompute's routing, `dilstore compact`'s default shards), and
measures both stores in one process: files and bytes on disk, manifest size, a warm open, the first fetch of
every passage, fetches of 29 random passages (one `ask` at top-p 29) and `verify`.

    .venv/bin/python benchmarks/bench_compact.py --work-dir /tmp/bench-compact

prints a table and the JSON (also written with --json-out).
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import statistics
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from bench_scale import DIM, build_store, fingerprint, passage_id, shard_records, state_pool

from dilstore.pipelines.sharding import shard_of
from dilstore.runners.arg_types import non_negative_int, positive_int
from dilstore.runners.cmd_compact import default_shards
from dilstore.storage.append import commit_append, first_free_shard
from dilstore.storage.codebook import CODEBOOK_DIR, read_codebook
from dilstore.storage.compact import compact_store
from dilstore.storage.format import MANIFEST_FILE, append_dir
from dilstore.storage.location import StoreLocation
from dilstore.storage.manifest import read_manifest
from dilstore.storage.reader import open_store
from dilstore.storage.verify import verify_store
from dilstore.storage.writer import write_shard

COMPACTED_GENERATION = "c0c0c0c0c0c0c0c0"


def appended_store(root: Path, args: argparse.Namespace) -> None:
    """The base store, then each append (its own generation) with `--replace` of the last passages before it."""
    build_store(root, args.passages, args.per_shard, args.encoding)
    pool = state_pool(1 << 18, 0)
    codebook = read_codebook(root / CODEBOOK_DIR, args.encoding)[0] if args.encoding in ("2bit", "1bit") else None
    first = args.passages
    for number in range(args.appends):
        generation = f"{number + 1:016x}"
        start = first - args.replaced
        records = shard_records(start, args.append_passages, pool, np.random.default_rng([1, number]))
        folder = root / append_dir(generation)
        write_shard(folder, first_free_shard(read_manifest(StoreLocation.parse(root))), records, kind="dilbert",
                    encoding=args.encoding, durable=False, codebook=codebook, generation=generation)  # fmt: skip
        commit_append(root, generation, fingerprint(args.encoding), replace=args.replaced > 0)
        first = start + args.append_passages


def footprint(root: Path) -> dict[str, int]:
    sizes = [path.stat().st_size for path in root.rglob("*") if path.is_file()]
    return {"files": len(sizes), "bytes": sum(sizes), "manifest_bytes": (root / MANIFEST_FILE).stat().st_size}


def measure(root: Path, ids: list[str], fetches: list[list[str]]) -> dict[str, Any]:
    """Footprint, warm open (median of 5), first fetch of every id, ms per random fetch, verify seconds."""
    opens = []
    for _ in range(5):
        start = time.perf_counter()
        open_store(root).close()
        opens.append(time.perf_counter() - start)
    with open_store(root) as store:
        start = time.perf_counter()
        store.fetch(ids)
        first_fetch = time.perf_counter() - start
        start = time.perf_counter()
        for chosen in fetches:
            store.fetch(chosen)
        per_fetch = (time.perf_counter() - start) / len(fetches)
        shards = len(store.manifest.shards)
    start = time.perf_counter()
    report = verify_store(root)
    verify_s = time.perf_counter() - start
    assert report.ok, report.problems
    return {**footprint(root), "shards": shards, "open_ms": statistics.median(opens) * 1e3,
            "first_fetch_all_ms": first_fetch * 1e3, "ms_per_fetch": per_fetch * 1e3, "verify_s": verify_s}  # fmt: skip


def parse_arguments(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--passages", type=positive_int, default=2000, help="passages of the first build")
    parser.add_argument("--per-shard", type=positive_int, default=500, help="passages a shard of the first build")
    parser.add_argument("--appends", type=positive_int, default=30)
    parser.add_argument("--append-passages", type=positive_int, default=20, help="passages each append brings")
    parser.add_argument("--replaced", type=non_negative_int, default=5, help="passages each append replaces (0: none)")
    parser.add_argument("--encoding", default="fp16", choices=["fp32", "fp16", "2bit", "1bit"])
    parser.add_argument("--fetches", type=positive_int, default=200)
    parser.add_argument("--fetch", type=positive_int, default=29, help="passages a fetch (default 29: top-p 29)")
    parser.add_argument("--work-dir", type=Path, required=True)
    parser.add_argument("--json-out", type=Path)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_arguments(argv)
    source, compacted = args.work_dir / "appended", args.work_dir / "compacted"
    for folder in (source, compacted):
        shutil.rmtree(folder, ignore_errors=True)
    appended_store(source, args)
    with open_store(source) as store:
        live = store.manifest.passages
        shards = default_shards(store.manifest)
        start = time.perf_counter()
        compact_store(store, compacted, lambda passage: shard_of(passage, shards), generation=COMPACTED_GENERATION)
        compact_s = time.perf_counter() - start
    with open_store(compacted) as store:
        ids = [passage_id(index) for index in range(args.passages + args.appends * args.append_passages)
               if passage_id(index) in store]  # fmt: skip
    assert len(ids) == live
    rng = np.random.default_rng(0)
    fetches = [[ids[index] for index in rng.choice(len(ids), args.fetch, replace=False)] for _ in range(args.fetches)]
    rows = {"appended": measure(source, ids, fetches), "compacted": measure(compacted, ids, fetches)}
    ratios = {key: rows["appended"][key] / rows["compacted"][key]
              for key in ("files", "bytes", "manifest_bytes", "open_ms", "first_fetch_all_ms", "ms_per_fetch",
                          "verify_s")}  # fmt: skip
    result = {"states": "random (synthetic store, bench_scale)", "dim": DIM, "encoding": args.encoding,
              "passages": live, "appends": args.appends, "append_passages": args.append_passages,
              "replaced_per_append": args.replaced, "compact_s": compact_s,
              "machine": f"{platform.node()} ({platform.machine()})", "rows": rows,
              "appended_over_compacted": ratios}  # fmt: skip
    columns = ("shards", "files", "bytes", "manifest_bytes", "open_ms", "first_fetch_all_ms", "ms_per_fetch",
               "verify_s")  # fmt: skip
    print(f"{'store':>10} " + " ".join(f"{name:>18}" for name in columns))
    for name, row in rows.items():
        print(f"{name:>10} " + " ".join(f"{row[column]:>18,.2f}" if isinstance(row[column], float)
                                        else f"{row[column]:>18,}" for column in columns))  # fmt: skip
    print(f"{'ratio':>10} {'':>18} " + " ".join(f"{ratios[column]:>17.1f}x" for column in columns[1:]))
    print(f"compaction: {compact_s:.2f} s for {live:,} passages")
    text = json.dumps(result, indent=1)
    print(text)
    if args.json_out:
        args.json_out.write_text(text)


if __name__ == "__main__":
    main()
