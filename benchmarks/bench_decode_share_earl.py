"""Decode share for EARL: store.fetch (read + decode) of one DL19 query's 100 BM25 passages against its rerank.

For each STORE given (earl-s1 or earl-s2, or a listformer store, which
`open_reranker` reads the same way; any encoding; made from passages that
include the first DL19 query's BM25 top 100), times `store.fetch(ids)` and
`open_reranker(STORE).rerank(query, ids)` (which fetches too), min of --repeats
each, after a warm-up, with 1 torch thread; decode_share = fetch / (rerank - fetch).

    .venv/bin/python benchmarks/bench_decode_share_earl.py /tmp/dl19-earl-s1-fp16 /tmp/dl19-earl-s1-2bit

prints a table and the JSON (also written with --json-out).
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dilstore.runners.arg_types import positive_int

DATA = Path(__file__).resolve().parents[1] / "../shared/data/msmarco"


def parse_arguments(argv: Sequence[str] | None) -> argparse.Namespace:
    """The stores to time, the repeats per timing and where to write the JSON; parsed before any data is read."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("stores", nargs="+", metavar="STORE",
                        help="an EARL (earl-s1/earl-s2) or listformer store holding the query's BM25 top 100")
    parser.add_argument("--repeats", type=positive_int, default=5, help="timed runs of each, the fastest counts")
    parser.add_argument("--json-out", type=Path, help="also write the JSON to this file")
    return parser.parse_args(argv)


def measure(path: str, query: str, ids: list[str], repeats: int) -> dict[str, Any]:
    """Fastest of `repeats` fetches of `ids` from the store at `path` and reranks of them for `query`, after a
    warm-up rerank (which opens the shards and builds the decode tables), and the fetch's share of the rest."""
    import dilstore

    ranker, store = dilstore.open_reranker(path), dilstore.open_store(path)
    ranker.rerank(query, ids)
    fetch = rerank = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        store.fetch(ids)
        fetch = min(fetch, time.perf_counter() - started)
        started = time.perf_counter()
        ranker.rerank(query, ids)
        rerank = min(rerank, time.perf_counter() - started)
    return {"fetch_100_ms": round(1000 * fetch, 2), "rerank_100_ms": round(1000 * rerank, 1),
            "decode_share": round(fetch / (rerank - fetch), 4)}  # fmt: skip


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_arguments(argv)
    import torch

    torch.set_num_threads(1)
    topics = dict(line.rstrip("\n").split("\t", 1) for line in open(DATA / "topics.dl19-passage.tsv", encoding="utf-8"))
    run: dict[str, list[str]] = {}
    for line in open(DATA / "run.dl19-passage.bm25-top100.trec", encoding="utf-8"):
        qid, _, doc_id, *_ = line.split()
        run.setdefault(qid, []).append(doc_id)
    qid = sorted(run)[0]
    ids = run[qid][:100]
    results = {path: measure(path, topics[qid], ids, args.repeats) for path in args.stores}
    print(f"query {qid}, {len(ids)} passages, fastest of {args.repeats}, 1 torch thread")
    width = max(len("store"), *(len(path) for path in results))
    print(f"{'store':<{width}} {'fetch ms':>9} {'rerank ms':>10} {'decode share':>13}")
    for path, row in results.items():
        print(f"{path:<{width}} {row['fetch_100_ms']:>9.2f} {row['rerank_100_ms']:>10.1f} {row['decode_share']:>13.4f}")
    text = json.dumps({"query": qid, "passages": len(ids), "repeats": args.repeats, "stores": results}, indent=1)
    print(text)
    if args.json_out:
        args.json_out.write_text(text)


if __name__ == "__main__":
    main()
