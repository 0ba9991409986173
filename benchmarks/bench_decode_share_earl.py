"""Decode share for EARL: store.fetch (read + decode) of one DL19 query's 100 BM25 passages against its rerank.

For each STORE given (earl-s1 or earl-s2, or a listformer store, which
`open_reranker` reads the same way; any encoding; made from passages that
include the first DL19 query's BM25 top 100), times `store.fetch(ids)` and
`open_reranker(STORE).rerank(query, ids)` (which fetches too), min of 5 each,
after a warm-up, with 1 torch thread; decode_share = fetch / (rerank - fetch).

    .venv/bin/python benchmarks/bench_decode_share_earl.py /tmp/dl19-earl-s1-fp16 /tmp/dl19-earl-s1-2bit
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

DATA = Path(__file__).resolve().parents[1] / "../shared/data/msmarco"


def main() -> None:
    import torch

    import dilstore

    torch.set_num_threads(1)
    topics = dict(line.rstrip("\n").split("\t", 1) for line in open(DATA / "topics.dl19-passage.tsv", encoding="utf-8"))
    run: dict[str, list[str]] = {}
    for line in open(DATA / "run.dl19-passage.bm25-top100.trec", encoding="utf-8"):
        qid, _, doc_id, *_ = line.split()
        run.setdefault(qid, []).append(doc_id)
    qid = sorted(run)[0]
    ids = run[qid][:100]
    results = {}
    for path in sys.argv[1:]:
        ranker, store = dilstore.open_reranker(path), dilstore.open_store(path)
        ranker.rerank(topics[qid], ids)  # warm-up: opens the shards, builds decode tables
        fetch = rerank = float("inf")
        for _ in range(5):
            started = time.perf_counter()
            store.fetch(ids)
            fetch = min(fetch, time.perf_counter() - started)
            started = time.perf_counter()
            ranker.rerank(topics[qid], ids)
            rerank = min(rerank, time.perf_counter() - started)
        results[path] = {"fetch_100_ms": round(1000 * fetch, 2), "rerank_100_ms": round(1000 * rerank, 1),
                         "decode_share": round(fetch / (rerank - fetch), 4)}
        print(path, results[path], flush=True)
    print(json.dumps({"query": qid, "passages": len(ids), "stores": results}, indent=1))


if __name__ == "__main__":
    main()
