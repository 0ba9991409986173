"""2bit/1bit decode of many tokens: all at once against BLOCK_ROWS tokens at a time, side by side.

A fetch decodes every passage it reads from one shard in one call, so a large shard (a compacted store) hands
`decode_residual` hundreds of thousands of tokens. Decoding them in one go makes temporaries of every token;
`decode_residual` now works BLOCK_ROWS tokens at a time into one output. This times both on the same codes in
one process: `_decode_block` over every token (the old path) and `decode_residual`, the first of --repeats calls
(fresh memory, as a fetch after start) and the fastest, either one timed first (--blocked-first), on
**random states** (standard normal, seeded) with a rotated codebook trained on a sample of them.

    .venv/bin/python benchmarks/bench_decode_blocks.py --tokens 200000

prints a table and the JSON (also written with --json-out).
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from dilstore.runners.arg_types import positive_int
from dilstore.storage.encodings import get_encoding, train_codebook
from dilstore.storage.residual_codes import BLOCK_ROWS, _decode_block, decode_residual


def timings(work: Callable[[], Any], repeats: int) -> tuple[float, float]:
    """Seconds of the first of `repeats` runs of `work` (its memory fresh, as in a fetch) and of the fastest."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        work()
        times.append(time.perf_counter() - start)
    return times[0], min(times)


def measure(encoding: str, tokens: int, dim: int, repeats: int, blocked_first: bool) -> dict[str, Any]:
    """Seconds to decode `tokens` random tokens of `encoding` at once and in blocks (in blocks first with
    `blocked_first`, so that neither gets the process's first-use costs alone); checks both agree."""
    spec = get_encoding(encoding)
    bits = int(encoding.removesuffix("bit"))
    states = np.random.default_rng(0).standard_normal((tokens, dim)).astype(np.float32)  # (T, d)
    codebook = train_codebook(encoding, states[: min(tokens, 20_000)])
    arrays = spec.encode(states, codebook)
    per_token = {name: values for name, values in arrays.items() if spec.array(name).per_token}
    prepared = {**per_token, **spec.prepare({name: values for name, values in arrays.items()
                                             if not spec.array(name).per_token})}  # fmt: skip
    if blocked_first:
        blocked_first_s, blocked = timings(lambda: decode_residual(prepared, bits), repeats)
    at_once_first, at_once = timings(lambda: _decode_block(prepared, bits), repeats)
    if not blocked_first:
        blocked_first_s, blocked = timings(lambda: decode_residual(prepared, bits), repeats)
    # After the timings: not a warm-up. Equal but for BLAS rounding a row's last bit with the rows it is given.
    assert np.allclose(_decode_block(prepared, bits), decode_residual(prepared, bits), rtol=1e-6, atol=1e-6)
    return {"encoding": encoding, "tokens": tokens, "dim": dim, "block_rows": BLOCK_ROWS,
            "order": "blocked first" if blocked_first else "at once first",
            "at_once_first_s": at_once_first, "blocked_first_s": blocked_first_s, "at_once_best_s": at_once,
            "blocked_best_s": blocked, "first_speedup": at_once_first / blocked_first_s,
            "best_speedup": at_once / blocked}  # fmt: skip


def parse_arguments(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=positive_int, default=200_000)
    parser.add_argument("--dim", type=positive_int, default=384)
    parser.add_argument("--repeats", type=positive_int, default=3)
    parser.add_argument("--blocked-first", action="store_true", help="time the blocked decode first")
    parser.add_argument("--json-out", type=Path)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_arguments(argv)
    rows = [measure(encoding, args.tokens, args.dim, args.repeats, args.blocked_first) for encoding in ("2bit", "1bit")]
    result = {"states": "random (standard normal, seeded)", "machine": f"{platform.node()} ({platform.machine()})",
              "rows": rows}  # fmt: skip
    print(f"{'encoding':>8} {'tokens':>9} {'first: at once s':>17} {'blocked s':>10} {'speedup':>8} "
          f"{'best: at once s':>16} {'blocked s':>10} {'speedup':>8}")  # fmt: skip
    for row in rows:
        print(f"{row['encoding']:>8} {row['tokens']:>9,} {row['at_once_first_s']:>17.3f} "
              f"{row['blocked_first_s']:>10.3f} {row['first_speedup']:>7.2f}x {row['at_once_best_s']:>16.3f} "
              f"{row['blocked_best_s']:>10.3f} {row['best_speedup']:>7.2f}x")  # fmt: skip
    text = json.dumps(result, indent=1)
    print(text)
    if args.json_out:
        args.json_out.write_text(text)


if __name__ == "__main__":
    main()
