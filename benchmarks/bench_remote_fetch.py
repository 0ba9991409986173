"""Remote stores: requests and time of a fetch of 100 random passages over HTTP, against the local path.

Builds (once, under --work) an fp16 store of --passages passages of 100..160 tokens (d = --dim,
random states: the bytes, not their values, are what is measured) in --shards shards, serves
its folder over HTTP on 127.0.0.1 (tests/fixtures/http_store.py: Python's http.server plus byte
ranges, counting every request), and fetches --fetch random ids through:

- `local mmap`: the local path (memory maps; no requests);
- `http ranged`: the store's URL, coalesced byte ranges (storage/ranged.py, the default for URLs),
  each answer's ETag, Last-Modified and size checked against the file the shard opened (stale54 F1);
- `http ranged unchecked`: the same reads through fsspec's own `cat_ranges`, no answer checked (the
  byte-range path before stale54 F1), measured in the same run, in turns with `http ranged`
  (which goes first alternates per repetition), for the cost of the check;
- `http zarr`: the same URL through zarr-python (`read_path="zarr"`, what URLs used before, and the path of
  every compressed store), each array file's answer checked as `http ranged`'s (left55b F3);
- `http zarr unchecked`: the same reads through zarr-python's FsspecStore alone (the zarr path before
  left55b F3), in turns with `http zarr` as `http ranged unchecked` with `http ranged`.

Per repetition (--repeats, each with new seeded ids), "cold" is `open_store` plus the first
fetch (manifest, id index and every touched shard opened), "warm" a second fetch of other ids
on the same opened store; the table gives the medians. Requests and bytes are counted by the
server. Each --latency-ms value delays every HTTP answer by that much, standing in for the round
trip to an object store (0: loopback only). The page cache is not dropped: local reads are warm.

    .venv/bin/python benchmarks/bench_remote_fetch.py --work /tmp/bench-remote --latency-ms 0 20 \\
        --output /tmp/bench-remote.json
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # tests/fixtures/http_store.py: the counting, range-serving test server

from dilstore.runners.arg_types import numpy_seed, positive_int  # noqa: E402
from dilstore.storage.finalize import finalize  # noqa: E402
from dilstore.storage.fingerprint import Fingerprint  # noqa: E402
from dilstore.storage.reader import Store, open_store  # noqa: E402
from dilstore.storage.records import PassageRecord  # noqa: E402
from dilstore.storage.writer import write_shard  # noqa: E402
from tests.fixtures.http_store import HttpServer, serve_directory  # noqa: E402


def parse_arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", type=Path, required=True, help="folder for the store (reused when present)")
    parser.add_argument("--passages", type=positive_int, default=4000)
    parser.add_argument("--shards", type=positive_int, default=4)
    parser.add_argument("--dim", type=positive_int, default=384)
    parser.add_argument("--fetch", type=positive_int, default=100, help="passages per fetch")
    parser.add_argument("--repeats", type=positive_int, default=5)
    parser.add_argument("--latency-ms", type=float, nargs="+", default=[0.0], help="added to every HTTP answer")
    parser.add_argument("--seed", type=numpy_seed, default=0)
    parser.add_argument("--output", type=Path, help="also write the results as JSON here")
    return parser.parse_args()


def build_store(root: Path, passages: int, shards: int, dim: int, seed: int) -> Path:
    """An fp16 store of `passages` random passages (100..160 tokens) in `shards` shards; kept if already built."""
    if (root / "manifest.json").exists():
        return root
    rng = np.random.default_rng(seed)
    for shard in range(shards):
        records = []
        for row in range(shard, passages, shards):
            n = int(rng.integers(100, 161))
            text = " ".join(f"w{index:04d}" for index in range(n - 1))  # fixed-width words: token i spans 6i..6i+5
            spans = np.array([[6 * i, 6 * i + 5] for i in range(n - 1)] + [[-1, -1]], dtype=np.int32)
            states = rng.standard_normal((n, dim), dtype=np.float32)
            records.append(PassageRecord(f"p{row:06d}", f"title {row}", text,
                                         rng.integers(1000, 30000, n).astype(np.int32), spans, states))  # fmt: skip
        write_shard(root, shard, records, kind="dilbert", encoding="fp16", durable=False)
    fingerprint = Fingerprint(architecture="BertModel", config_sha256="c" * 64, weights_sha256="w" * 64,
                              tokenizer_sha256="t" * 64, kind="dilbert", layers=4, encoding="fp16",
                              max_length=512)  # fmt: skip
    finalize(root, fingerprint, {"command": "benchmarks/bench_remote_fetch.py"})
    return root


def store_name(args: argparse.Namespace) -> str:
    """The store's folder in --work, named by every setting it is built from.

    A store already there is kept, and under the one name "store" a run with other --passages, --shards, --dim or
    --seed measured the store of an earlier run while its header named the settings asked (bench53 F10).
    """
    return f"store-{args.passages}p-{args.shards}s-d{args.dim}-seed{args.seed}"


@contextmanager
def answers_unchecked() -> Iterator[None]:
    """The byte-range path as it read before stale54 F1: fsspec's `cat_ranges`, no answer's file version kept."""
    from dilstore.storage import ranged

    checked = ranged._http_cat_ranges
    ranged._http_cat_ranges = lambda fs, paths, starts, stops: (fs.cat_ranges(paths, starts, stops, on_error="raise"),
                                                                [])  # fmt: skip
    try:
        yield
    finally:
        ranged._http_cat_ranges = checked


@contextmanager
def zarr_answers_unchecked() -> Iterator[None]:
    """The zarr-python path as it read before left55b F3: FsspecStore's own `get`, no answer's file version kept."""
    from dilstore.storage.zarr_reads import RequiredChunksStore

    checked = RequiredChunksStore._read

    async def unchecked(self: RequiredChunksStore, key: str, prototype: Any, byte_range: Any) -> Any:
        return await self._store.get(key, prototype, byte_range)

    RequiredChunksStore._read = unchecked  # type: ignore[method-assign]
    try:
        yield
    finally:
        RequiredChunksStore._read = checked  # type: ignore[method-assign]


def measure(open_one: Callable[[], Store], id_sets: list[tuple[list[str], list[str]]],
            server: HttpServer | None) -> dict[str, Any]:  # fmt: skip
    """Medians over the repetitions of cold (open + first fetch) and warm (another fetch) seconds, requests, bytes."""
    samples: dict[str, list[float]] = {}
    for cold_ids, warm_ids in id_sets:
        for key, value in measure_once(open_one, cold_ids, warm_ids, server).items():
            samples.setdefault(key, []).append(value)
    return {key: statistics.median(values) for key, values in samples.items()}


def measure_once(open_one: Callable[[], Store], cold_ids: list[str], warm_ids: list[str],
                 server: HttpServer | None) -> dict[str, float]:  # fmt: skip
    """One repetition of `measure`: its cold and warm seconds, requests and bytes."""
    sample: dict[str, float] = {}
    for phase, ids in (("cold", cold_ids), ("warm", warm_ids)):
        if server is not None:
            server.counter.reset()
        started = time.perf_counter()
        if phase == "cold":
            store = open_one()
        passages = store.fetch(ids)
        np.concatenate([passage.states for passage in passages])  # copy: every state byte is really read
        sample[f"{phase}_s"] = time.perf_counter() - started
        sample[f"{phase}_requests"] = server.requests if server is not None else 0
        sample[f"{phase}_bytes"] = server.counter.bytes_sent if server is not None else 0
    return sample


def measure_checked_and_unchecked(url: str, id_sets: list[tuple[list[str], list[str]]], server: HttpServer,
                                  read_path: str = "ranged") -> tuple[dict[str, Any], dict[str, Any]]:  # fmt: skip
    """`measure` of `read_path` (ranged or zarr) with its answers unchecked and checked, the two taking turns within
    each repetition (which goes first alternates), so that the machine's load weighs on both alike."""
    unchecked_reads = answers_unchecked if read_path == "ranged" else zarr_answers_unchecked
    samples: tuple[dict[str, list[float]], dict[str, list[float]]] = ({}, {})
    for repetition, (cold_ids, warm_ids) in enumerate(id_sets):
        for checked in (False, True) if repetition % 2 == 0 else (True, False):
            with nullcontext() if checked else unchecked_reads():
                sample = measure_once(lambda: open_store(url, read_path=read_path), cold_ids, warm_ids, server)
            for key, value in sample.items():
                samples[checked].setdefault(key, []).append(value)
    unchecked, checked_ = ({key: statistics.median(values) for key, values in side.items()} for side in samples)
    return unchecked, checked_


def main() -> None:
    args = parse_arguments()
    name = store_name(args)
    root = build_store(args.work / name, args.passages, args.shards, args.dim, args.seed)
    rng = np.random.default_rng(args.seed + 1)
    ids = [f"p{row:06d}" for row in range(args.passages)]
    id_sets = [(list(rng.choice(ids, args.fetch, replace=False)), list(rng.choice(ids, args.fetch, replace=False)))
               for _ in range(args.repeats)]  # fmt: skip
    store_bytes = sum(path.stat().st_size for path in root.rglob("*") if path.is_file())
    rows = [{"path": "local mmap", "latency_ms": None, **measure(lambda: open_store(root), id_sets, None)}]
    for latency in args.latency_ms:
        with serve_directory(args.work, latency=latency / 1000) as server:
            url = f"{server.url}/{name}"
            unchecked, checked = measure_checked_and_unchecked(url, id_sets, server)
            zarr_unchecked, zarr_path = measure_checked_and_unchecked(url, id_sets, server, read_path="zarr")
            for label, opened in (("ranged unchecked", unchecked), ("ranged", checked),
                                  ("zarr unchecked", zarr_unchecked), ("zarr", zarr_path)):  # fmt: skip
                rows.append({"path": f"http {label}", "latency_ms": latency, **opened})
                print(rows[-1], file=sys.stderr, flush=True)
    print(f"\nstore: {args.passages} passages, {args.shards} shards, d={args.dim} fp16, {store_bytes / 1e6:.1f} MB; "
          f"fetch {args.fetch} random ids; medians of {args.repeats}\n")  # fmt: skip
    print("| path | added latency ms | cold ms | cold requests | cold MB | warm ms | warm requests | warm MB |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for row in rows:
        latency = "" if row["latency_ms"] is None else f"{row['latency_ms']:g}"
        print(f"| {row['path']} | {latency} | {1000 * row['cold_s']:.1f} | {row['cold_requests']:.0f} | "
              f"{row['cold_bytes'] / 1e6:.2f} | {1000 * row['warm_s']:.1f} | {row['warm_requests']:.0f} | "
              f"{row['warm_bytes'] / 1e6:.2f} |")  # fmt: skip
    result = {
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": {
            "platform": platform.platform(), "processor": platform.processor(), "python": platform.python_version()
        },
        "store": {"passages": args.passages, "shards": args.shards, "dim": args.dim, "encoding": "fp16",
                  "bytes": store_bytes},  # fmt: skip
        "fetch": args.fetch,
        "repeats": args.repeats,
        "rows": rows,
    }
    print(json.dumps(result, indent=1))
    if args.output is not None:
        args.output.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
