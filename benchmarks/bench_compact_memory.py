"""Peak memory and time of `dilstore compact` on large appended stores, for one or more code trees side by side.

Compaction keeps what it knows of every live row in memory while it writes the new shards, so its memory grows
with the store (scale45 M1: ~0.4 KB a passage, 4 GB at 10M passages, when each row was a Python object). This
builds synthetic fp16 stores of `--passages` passages each (random states, d = 32, 16-48 tokens, two passages a
document, passage tables as precompute writes them), `--appends` appends of `--append-passages` passages, every
other one replacing `--replaced` live passages, then runs `dilstore compact STORE --output DIR` in a fresh
process once per `--tree` (PYTHONPATH, e.g. a checkout of an older commit) and size, reading the process's
RssAnon (its own memory) and RssFile (mapped store files: page cache, which the kernel can take back) from
/proc every 50 ms.

    git worktree add /tmp/old COMMIT      # the commit before the change measured (BENCHMARKS.md names it)
    for l in storage reader pipelines runners; do ln -sfn ../$l /tmp/old/dilstore/$l; done
    .venv/bin/python benchmarks/bench_compact_memory.py --work-dir /tmp/bench-compact-memory \\
        --passages 150000 600000 --tree old=/tmp/old --tree new=.

prints a table and the JSON (also written with --json-out).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from dilstore.pipelines.sharding import shard_of
from dilstore.runners.arg_types import absolute_path, non_negative_int, positive_int
from dilstore.storage.append import commit_append, first_free_shard
from dilstore.storage.atomic_files import atomic_write_bytes
from dilstore.storage.collection import collection_jsonl
from dilstore.storage.finalize import finalize
from dilstore.storage.fingerprint import Fingerprint
from dilstore.storage.format import append_dir
from dilstore.storage.location import StoreLocation
from dilstore.storage.manifest import read_manifest
from dilstore.storage.passage_files import jsonl_path, parquet_path
from dilstore.storage.passage_tables import passage_table_bytes
from dilstore.storage.records import PassageRecord
from dilstore.storage.writer import write_shard

DIM = 32
TOKENS = (16, 48)  # fewest and most tokens of a passage
SHARD_TOKENS = 1 << 18  # as `dilstore compact` sizes its shards
GENERATION = "ba5e000000000000"
FINGERPRINT = Fingerprint("BertModel", "c" * 64, "w" * 64, "t" * 64, "dilbert", 4, "fp16", 128)
COMPACT = "import sys; from dilstore.runners.cli import main; sys.exit(main(sys.argv[1:]))"


@dataclass(frozen=True)
class TableRow:
    """One row of a passage table (storage.passage_files.PassageRow)."""

    id: str
    doc_id: str
    title: str
    text: str


def passage_id(number: int) -> tuple[str, str]:
    """Passage `number`'s id and its document's (two passages a document), as a split names them: compact checks
    that each id derives from its doc_id."""
    document = f"doc{number // 2:08d}"
    return f"{document}#{number % 2}", document


def write_part(folder: Path, shard: int, ids: list[tuple[str, str]], pool: np.ndarray, seed: list[int],
               generation: str) -> None:
    """One shard of `ids` (sorted, as precompute orders a shard) with its passage tables, into `folder`."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(TOKENS[0], TOKENS[1] + 1, len(ids)).tolist()
    starts = rng.integers(0, len(pool) - TOKENS[1], len(ids)).tolist()
    spans = np.full((TOKENS[1], 2), -1, dtype=np.int32)
    records, rows = [], []
    for (identifier, document), length, start in zip(ids, lengths, starts, strict=True):
        text = f"passage {identifier} of {seed} lorem ipsum"
        tokens = rng.integers(1000, 30000, length).astype(np.int32)
        records.append(PassageRecord(identifier, f"Title {document}", text, tokens, spans[:length],
                                     pool[start:start + length]))  # fmt: skip
        rows.append(TableRow(identifier, document, f"Title {document}", text))
    for path in (parquet_path(folder, shard), jsonl_path(folder, shard)):
        path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(parquet_path(folder, shard), passage_table_bytes(rows))
    atomic_write_bytes(jsonl_path(folder, shard), collection_jsonl(rows).encode("utf-8"))
    write_shard(folder, shard, records, kind="dilbert", encoding="fp16", durable=False, generation=generation,
                fingerprint=FINGERPRINT)  # fmt: skip


def build(root: Path, passages: int, args: argparse.Namespace) -> dict[str, Any]:
    """The base store and its appends; what was built, and how long it took."""
    started = time.perf_counter()
    pool = np.random.default_rng(0).standard_normal((1 << 20, DIM), dtype=np.float32)  # (tokens, hidden)
    shards = math.ceil(passages * sum(TOKENS) / 2 / SHARD_TOKENS)
    routed: list[list[tuple[str, str]]] = [[] for _ in range(shards)]
    for number in range(passages):
        routed[shard_of(passage_id(number)[0], shards)].append(passage_id(number))
    for shard, ids in enumerate(routed):
        write_part(root, shard, sorted(ids), pool, [0, shard], GENERATION)
    finalize(root, FINGERPRINT, {"command": "bench_compact_memory"}, generation=GENERATION)
    rng, following, live = np.random.default_rng(1), passages, passages
    for number in range(args.appends):
        generation = f"{number + 1:016x}"
        replaced = args.replaced if number % 2 else 0
        again = [passage_id(int(chosen)) for chosen in rng.choice(passages, replaced, replace=False)]
        fresh = [passage_id(following + offset) for offset in range(args.append_passages - replaced)]
        following, live = following + len(fresh), live + len(fresh)
        folder = root / append_dir(generation)
        shard = first_free_shard(read_manifest(StoreLocation.parse(root)))
        write_part(folder, shard, sorted(again + fresh), pool, [1, number], generation)
        commit_append(root, generation, FINGERPRINT, {"command": "bench_compact_memory"}, replace=bool(replaced))
    manifest = read_manifest(StoreLocation.parse(root))
    assert manifest.passages == live, (manifest.passages, live)
    return {"passages": live, "shards": len(manifest.shards), "appends": len(manifest.appends),
            "superseded": manifest.superseded_passages, "build_seconds": round(time.perf_counter() - started, 1),
            "bytes": sum(path.stat().st_size for path in root.rglob("*") if path.is_file())}  # fmt: skip


def memory_kb(pid: int) -> tuple[int, int]:
    """RssAnon and RssFile of process `pid` in KiB (0, 0 once it is gone)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text(encoding="ascii")
    except OSError:
        return 0, 0
    found = {name: int(size) for name, size in re.findall(r"^(RssAnon|RssFile):\s+(\d+) kB", status, re.M)}
    return found.get("RssAnon", 0), found.get("RssFile", 0)


def compact(tree: Path, store: Path, output: Path) -> dict[str, Any]:
    """`dilstore compact STORE --output OUTPUT` with the code of `tree`, in a process of its own: wall seconds,
    peak RssAnon and RssFile (MB), and the command's JSON."""
    environment = {**os.environ, "PYTHONPATH": str(tree.resolve())}
    command = [sys.executable, "-c", COMPACT, "compact", str(store), "--output", str(output), "--json"]
    started = time.perf_counter()
    process = subprocess.Popen(command, env=environment, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               cwd=tree)  # fmt: skip
    anon = mapped = 0
    while process.poll() is None:
        now_anon, now_mapped = memory_kb(process.pid)
        anon, mapped = max(anon, now_anon), max(mapped, now_mapped)
        time.sleep(0.05)
    seconds = time.perf_counter() - started
    out, err = process.communicate()
    if process.returncode != 0:
        raise SystemExit(f"compact with {tree} failed ({process.returncode}): {err.strip()}")
    return {"seconds": round(seconds, 2), "peak_anon_mb": round(anon / 1024, 1),
            "peak_file_mb": round(mapped / 1024, 1), "result": json.loads(out)}  # fmt: skip


def growth_per_passage(rows: list[dict[str, Any]]) -> dict[str, float]:
    """Per tree, the growth of peak RssAnon per passage from its smallest store to its largest (the slope: the
    interpreter, imports and one shard's buffers cost the same at every size)."""
    growth = {}
    for label in dict.fromkeys(row["tree"] for row in rows):
        mine = sorted((row for row in rows if row["tree"] == label), key=lambda row: row["passages"])
        if len(mine) > 1 and mine[-1]["passages"] > mine[0]["passages"]:
            growth[label] = round((mine[-1]["peak_anon_mb"] - mine[0]["peak_anon_mb"]) * 1024
                                  / (mine[-1]["passages"] - mine[0]["passages"]), 3)  # fmt: skip
    return growth


def parse_arguments(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line; --tree as (label, folder) pairs in `trees`."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work-dir", type=absolute_path, required=True)  # `compact` runs in each tree (bench53 F8)
    parser.add_argument("--passages", type=positive_int, nargs="+", default=[150_000, 600_000],
                        help="base passages of each store")  # fmt: skip
    parser.add_argument("--appends", type=non_negative_int, default=20)
    parser.add_argument("--append-passages", type=positive_int, default=3000)
    parser.add_argument("--replaced", type=non_negative_int, default=1000, help="passages every other append replaces")
    parser.add_argument("--tree", action="append", metavar="LABEL=DIR",
                        help="a code tree to compact with (repeat; default: this one)")  # fmt: skip
    parser.add_argument("--json-out", type=Path)
    args = parser.parse_args(argv)
    if args.replaced > args.append_passages:
        parser.error("--replaced must not exceed --append-passages")
    args.trees = [tuple(entry.split("=", 1)) for entry in args.tree or [f"this={Path(__file__).resolve().parents[1]}"]]
    if any(len(tree) != 2 for tree in args.trees):
        parser.error("--tree takes LABEL=DIR")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_arguments(argv)
    trees = args.trees
    args.work_dir.mkdir(parents=True, exist_ok=True)  # only the folders made below are removed (review45 H2)
    rows = []
    for passages in args.passages:
        store = args.work_dir / f"store-{passages}"
        shutil.rmtree(store, ignore_errors=True)  # a run stopped before it removed its own
        built = build(store, passages, args)
        print(f"built {store}: {built}", file=sys.stderr)
        for label, tree in trees:
            output = args.work_dir / f"compacted-{passages}-{label}"
            shutil.rmtree(output, ignore_errors=True)
            measured = compact(Path(tree), store, output)
            shutil.rmtree(output)
            rows.append({"tree": label, **built, **{key: value for key, value in measured.items() if key != "result"},
                         "anon_kb_per_passage": round(measured["peak_anon_mb"] * 1024 / built["passages"], 3),
                         "shards_after": measured["result"]["shards"]})  # fmt: skip
        shutil.rmtree(store)
    print(f"{'tree':>6} {'passages':>9} {'shards':>6} {'appends':>7} {'MB':>7} {'seconds':>8} {'anon MB':>8} "
          f"{'KB/passage':>10} {'file MB':>8}")
    for row in rows:
        print(f"{row['tree']:>6} {row['passages']:>9,} {row['shards']:>6} {row['appends']:>7} "
              f"{row['bytes'] / 1e6:>7.0f} {row['seconds']:>8.1f} {row['peak_anon_mb']:>8.0f} "
              f"{row['anon_kb_per_passage']:>10.3f} {row['peak_file_mb']:>8.0f}")
    growth = growth_per_passage(rows)
    for label, kilobytes in growth.items():
        print(f"{label}: RssAnon grows {kilobytes:.3f} KB a passage between the smallest and largest store")
    result = {"benchmark": "bench_compact_memory", "machine": platform.node(), "cpus": os.cpu_count(),
              "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "states": "random", "trees": dict(trees),
              "rows": rows, "anon_growth_kb_per_passage": growth}  # fmt: skip
    text = json.dumps(result, indent=1)
    print(text)
    if args.json_out:
        args.json_out.write_text(text + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
