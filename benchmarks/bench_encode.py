"""Encoder cost per token: each store encoding's `encode` alone on real states, and its codebook training.

The cost model (benchmarks/cost_inputs.json, `encode_us_per_token`) needs what encoding adds to a
precompute beyond the model's layers. Reads the first --tokens token states of a store (e.g. a DL19
EARL S1 fp16 store), trains each encoding's codebook on a seeded --sample of them, then times
`encode` over all of them, min of --repeats, with 1 numpy/BLAS thread (set OMP_NUM_THREADS=1 and
OPENBLAS_NUM_THREADS=1 before starting, as the example does). 2bit/1bit codebooks are rotated
(what DilBert and Listformer stores get); --buckets trains them without rotation (EARL's).

    OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 .venv/bin/python benchmarks/bench_encode.py \\
        /work/runs/dl19-earl-s1-fp16 --tokens 100000 --sample 65536

Prints a table, then the rows as JSON.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np

from dilstore.runners.arg_types import numpy_seed, positive_int
from dilstore.storage.encodings import get_encoding, train_codebook
from dilstore.storage.errors import DilstoreError
from dilstore.storage.reader import open_store

ENCODINGS = ("fp16", "int8", "2bit", "1bit")


def first_states(store_path: str, tokens: int) -> np.ndarray:
    """The first `tokens` token states of the store, shard by shard and row by row, as float32 `(tokens, *S)`."""
    store = open_store(store_path)
    parts, count = [], 0
    for entry in store.manifest.shards:
        shard = store.shard(entry.index)
        for start in range(0, len(shard), 256):
            for passage in shard.read(range(start, min(start + 256, len(shard)))):
                parts.append(np.asarray(passage.states, dtype=np.float32))
                count += len(parts[-1])
            if count >= tokens:
                return np.concatenate(parts)[:tokens]
    raise SystemExit(f"{store_path} holds only {count} tokens, fewer than --tokens {tokens}")


def measure(states: np.ndarray, encoding: str, sample: int, repeats: int, seed: int, rotate: bool = True
            ) -> dict[str, float]:
    """Codebook training seconds (on a seeded sample) and the best encode time per token in µs."""
    spec = get_encoding(encoding)
    rows = np.random.default_rng(seed).choice(len(states), size=min(sample, len(states)), replace=False)
    started = time.perf_counter()
    codebook = train_codebook(encoding, states[np.sort(rows)], rotate=rotate) or None
    train_s = time.perf_counter() - started
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        spec.encode(states, codebook)
        best = min(best, time.perf_counter() - started)
    return {"train_s": round(train_s, 3), "encode_us_per_token": round(best / len(states) * 1e6, 3)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("store", help="a store whose states to encode (any encoding; fp16 keeps them exact)")
    parser.add_argument("--tokens", type=positive_int, default=100_000)
    parser.add_argument("--sample", type=positive_int, default=65_536, help="codebook training sample (tokens)")
    parser.add_argument("--repeats", type=positive_int, default=3)
    parser.add_argument("--seed", type=numpy_seed, default=0)
    parser.add_argument("--encodings", nargs="+", choices=ENCODINGS, default=list(ENCODINGS))
    parser.add_argument("--buckets", action="store_true", help="2bit/1bit codebooks without rotation (EARL stores')")
    args = parser.parse_args(argv)
    try:
        states = first_states(args.store, args.tokens)
    except DilstoreError as error:
        parser.error(str(error))
    rows = {name: measure(states, name, args.sample, args.repeats, args.seed, not args.buckets)
            for name in args.encodings}
    codes = "per-dimension buckets" if args.buckets else "rotated codes"
    print(f"{len(states)} token states {states.shape[1:]} from {args.store}, min of {args.repeats}, 2bit/1bit: {codes}")
    print("| encoding | encode µs/token | codebook training s |")
    print("|---|---:|---:|")
    for name, row in rows.items():
        print(f"| {name} | {row['encode_us_per_token']} | {row['train_s']} |")
    print(json.dumps({"store": args.store, "tokens": len(states), "sample": args.sample, "rotated": not args.buckets,
                      "rows": rows}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
