"""Start-up of a BM25 search in a fresh process: dilstore's searcher against pyserini's LuceneSearcher wrapper.

Every `dilstore ask`, `evaluate-qa`, `serve` and `train ranking-data` opens a BM25 index once, in a new
process. `Bm25Searcher` calls Anserini's SimpleSearcher in pyserini's jar directly; pyserini's own
`LuceneSearcher` wraps the same Java class, but importing `pyserini.search.lucene` also imports its
neural encoders (torch, scikit-learn, transformers models, an OpenAI client). This times both in fresh
Python processes, alternating, --repeats times each: the JVM start, the open and one search, and checks
that both return the same hits. Time a store's index (after `dilstore index STORE`: --index STORE/bm25),
or --squad FILE's paragraphs, indexed into --work/bm25 as `train ranking-data` indexes them (reused
when it already holds exactly those paragraphs):

    .venv/bin/python benchmarks/bench_search_start.py --squad ../shared/data/squad/train-v1.1.json \
        --work /tmp/squad-train-bm25 --query "When did the Zurich tram network open?"

Prints a table, then the rows as JSON.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

from dilstore.runners.arg_types import positive_int

OURS = """
import json, sys, time
start = time.perf_counter()
from pathlib import Path
from dilstore.reader.retrieval import Bm25Searcher
hits = Bm25Searcher(Path(sys.argv[1])).search(sys.argv[2], 10)
print(json.dumps({"seconds": time.perf_counter() - start, "hits": [[h.passage_id, h.score] for h in hits]}))
"""
PYSERINI = """
import json, os, sys, time
start = time.perf_counter()
os.environ.setdefault("OPENAI_API_KEY", "unused")  # pyserini's encoder module builds an OpenAI client on import
from pathlib import Path
from dilstore.reader.retrieval import start_jvm
start_jvm()
from pyserini.search.lucene import LuceneSearcher
hits = LuceneSearcher(sys.argv[1]).search(sys.argv[2], k=10)
print(json.dumps({"seconds": time.perf_counter() - start, "hits": [[h.docid, h.score] for h in hits]}))
"""
SEARCHERS = {"dilstore Bm25Searcher": OURS, "pyserini LuceneSearcher": PYSERINI}


def time_once(script: str, index: Path, query: str) -> dict:
    """Seconds from the first import to the first search's hits, in a fresh process, and those hits."""
    done = subprocess.run([sys.executable, "-c", script, str(index), query], capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"bench_search_start: the search process failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--index", type=Path, help="a Lucene index folder (STORE/bm25)")
    source.add_argument("--squad", type=Path, help="index this SQuAD file's paragraphs into --work/bm25 and time that")
    parser.add_argument("--work", type=Path, default=Path("/tmp/bench-search-start"), help="where --squad's index goes")
    parser.add_argument("--query", default="when did the network open")
    parser.add_argument("--repeats", type=positive_int, default=5)
    args = parser.parse_args(argv)
    if not args.query.strip():
        parser.error("--query is empty: the searchers would agree on no hits, which compares nothing")
    if args.squad:
        from dilstore.reader.data.ranking_data import ensure_bm25_index, read_squad_ranking

        args.index = ensure_bm25_index(read_squad_ranking(args.squad).paragraphs, args.work, threads=2)
    if not any(args.index.glob("segments_*")):
        parser.error(f"no Lucene index at {args.index}")
    seconds: dict[str, list[float]] = {name: [] for name in SEARCHERS}
    hits: dict[str, list] = {}
    for _ in range(args.repeats):
        for name, script in SEARCHERS.items():
            result = time_once(script, args.index, args.query)
            seconds[name].append(result["seconds"])
            hits[name] = result["hits"]
    reference = statistics.median(seconds["pyserini LuceneSearcher"])
    rows = [{"searcher": name, "median_s": round(statistics.median(times), 3), "min_s": round(min(times), 3),
             "max_s": round(max(times), 3), "speed_up": round(reference / statistics.median(times), 2)}
            for name, times in seconds.items()]
    same = len({json.dumps(found) for found in hits.values()}) == 1
    print(f"{'searcher':<26}{'median s':>10}{'min s':>8}{'max s':>8}{'speed-up':>10}")
    for row in rows:
        print(f"{row['searcher']:<26}{row['median_s']:>10.3f}{row['min_s']:>8.3f}{row['max_s']:>8.3f}"
              f"{row['speed_up']:>9.2f}x")
    print(f"same hits: {same} ({len(next(iter(hits.values())))} hits)")
    print(json.dumps({"repeats": args.repeats, "same_hits": same, "rows": rows}))
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
