"""Rotated 2bit/1bit codes against per-dimension buckets: squared error and codec speed on a store's states.

Reads the token states of every --every-th passage of STORE (an fp16 or fp32
store, so the states are exact), shuffles them with --seed, trains each
codebook on the first --sample tokens and codes the next --held-out tokens:
relative squared error (over the held-out states' variance) of both schemes
at both bit widths, with encode and decode times per token (min of
--repeats, 1 numpy/BLAS thread when OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
are set, as the example does). The same bytes per token either way.

    OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 .venv/bin/python benchmarks/bench_rotation.py \\
        /work/runs/mini-opensquad-s8/store --every 13 --sample 65536 --held-out 30000

Prints a table, then the rows as JSON.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from typing import TypeVar

import numpy as np

from dilstore.runners.arg_types import numpy_seed, positive_int
from dilstore.storage.encodings import get_encoding, train_codebook
from dilstore.storage.reader import open_store

Result = TypeVar("Result")


def passage_states(store_path: str, every: int) -> np.ndarray:
    """The float32 token states `(T, *S)` of every `every`-th passage of the store, shard by shard."""
    store = open_store(store_path)
    parts = []
    for entry in store.manifest.shards:
        shard = store.shard(entry.index)
        rows = range(0, len(shard), every)
        parts.extend(np.asarray(passage.states, dtype=np.float32) for passage in shard.read(rows))
    return np.concatenate(parts)


def best_seconds(work: Callable[[], Result], repeats: int) -> tuple[float, Result]:
    """The fastest of `repeats` calls of `work` and its last result."""
    best, result = float("inf"), None
    for _ in range(repeats):
        started = time.perf_counter()
        result = work()
        best = min(best, time.perf_counter() - started)
    return best, result


def measure(train: np.ndarray, held_out: np.ndarray, encoding: str, rotate: bool, repeats: int) -> dict[str, float]:
    """Error and codec speed of `encoding` with or without rotation, trained on `train`, coding `held_out`."""
    spec = get_encoding(encoding)
    started = time.perf_counter()
    codebook = train_codebook(encoding, train, rotate=rotate)
    train_s = time.perf_counter() - started
    encode_s, encoded = best_seconds(lambda: spec.encode(held_out, codebook), repeats)
    prepared = spec.prepare(codebook)
    arrays = {**encoded, **prepared}
    decode_s, decoded = best_seconds(lambda: spec.decode(arrays), repeats)
    variance = np.square(held_out - held_out.mean(axis=0)).sum()
    return {"relative_error": round(float(np.square(decoded - held_out).sum() / variance), 4),
            "train_s": round(train_s, 2),
            "encode_us_per_token": round(encode_s / len(held_out) * 1e6, 2),
            "decode_us_per_token": round(decode_s / len(held_out) * 1e6, 2)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("store", help="an fp16 or fp32 store whose states to code")
    parser.add_argument("--every", type=positive_int, default=13, help="take every N-th passage of each shard")
    parser.add_argument("--sample", type=positive_int, default=65_536, help="codebook training tokens")
    parser.add_argument("--held-out", type=positive_int, default=30_000, help="tokens coded and scored")
    parser.add_argument("--repeats", type=positive_int, default=3)
    parser.add_argument("--seed", type=numpy_seed, default=0)
    args = parser.parse_args(argv)
    states = passage_states(args.store, args.every)
    if len(states) < args.sample + args.held_out:
        raise SystemExit(f"{args.store}: {len(states)} tokens taken, fewer than --sample + --held-out")
    order = np.random.default_rng(args.seed).permutation(len(states))
    train, held_out = states[order[: args.sample]], states[order[args.sample : args.sample + args.held_out]]
    rows = {f"{encoding} {'rotated' if rotate else 'buckets'}": measure(train, held_out, encoding, rotate, args.repeats)
            for encoding in ("2bit", "1bit") for rotate in (False, True)}
    print(f"{len(states)} token states {states.shape[1:]} from {args.store}; trained on {len(train)}, "
          f"scored on {len(held_out)} others; min of {args.repeats}")
    print("| codes | relative squared error | encode µs/token | decode µs/token | codebook training s |")
    print("|---|---:|---:|---:|---:|")
    for name, row in rows.items():
        print(f"| {name} | {row['relative_error']} | {row['encode_us_per_token']} | {row['decode_us_per_token']} "
              f"| {row['train_s']} |")
    print(json.dumps({"store": args.store, "tokens": len(states), "sample": len(train), "held_out": len(held_out),
                      "rows": rows}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
