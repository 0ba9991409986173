"""`dilstore rerank`: rerank a first-stage TREC run with the ranker of a store (EARL or Listformer) over its states."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from dilstore.runners.arg_types import integer_at_least, positive_int
from dilstore.runners.outputs import check_output_file, refuse_output_inside_models, refuse_output_inside_store
from dilstore.runners.reading_options import add_runtime_arguments, apply_threads
from dilstore.runners.quiet import add_verbose_argument
from dilstore.storage.errors import DilstoreError, listed

# Options that are RerankSettings fields of the same name.
_SETTINGS = ("max_query_length", "pair_batch_tokens", "max_pairs_per_batch")
_STAGE_LABELS = {"query_layers": "query layers", "store_read": "store read", "judge": "judge"}


def run_tag(text: str) -> str:
    """--tag: one word, as a TREC run's last column must be (refused before any query is reranked)."""
    if not text or len(text.split()) != 1 or text.strip() != text or text.startswith("\ufeff"):
        raise argparse.ArgumentTypeError(f"expected one word with no spaces, got {text!r}")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # bytes the terminal passed that are not UTF-8 (surrogate escapes)
        raise argparse.ArgumentTypeError(f"expected UTF-8 text, got {text!r}") from None
    return text


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `rerank` subcommand."""
    parser = subparsers.add_parser(
        "rerank",
        help="rerank a TREC run with stored EARL or Listformer representations -> TREC run",
        description=(
            "Rescore each query's top --depth documents of a first-stage TREC run with the ranker that made "
            "STORE, picked by the store's kind. EARL (earl-s1, earl-s2): the query module runs once per query, "
            "the judger blocks per (query, document) pair over the stored S1 states or S2 keys and values. "
            "Listformer (listformer): the query's layers 1..k run once, then layers k+1..l over the query and "
            "all its top --depth documents' stored states in one pass. Documents below --depth follow the "
            "reranked ones in their first-stage order. The run is written atomically with the tag --tag "
            "(default 'dilstore-earl' or 'dilstore-listformer')."
        ),
    )
    parser.add_argument(
        "store", type=str, help="store made by `dilstore precompute --kind earl-s1|earl-s2|listformer`"
    )
    parser.add_argument("--topics", type=Path, required=True, help="queries: qid<TAB>query per line")
    parser.add_argument(
        "--run", type=Path, required=True, dest="run_file", metavar="RUN",
        help="first-stage TREC run: qid Q0 docid rank score tag",
    )  # fmt: skip
    parser.add_argument("--output", type=Path, required=True, help="where to write the reranked TREC run")
    parser.add_argument("--tag", type=run_tag, help="the run's tag, its last column, one word (default: "
                        "dilstore-earl or dilstore-listformer, by the store's kind)")  # fmt: skip
    parser.add_argument(
        "--model", type=Path,
        help="the ranker checkpoint that made STORE: an EARL ranker or a Listformer (default: the packaged EARL "
             "ranker for earl-s1/earl-s2 stores and the packaged Listformer for listformer stores, which made the "
             "stores `dilstore precompute --kind ...` builds without --model)",
    )  # fmt: skip
    parser.add_argument("--depth", type=positive_int, help="documents reranked per query (default 100)")
    parser.add_argument(
        "--skip-missing", action="store_true",
        help="leave out top-depth documents the store lacks (counted) instead of stopping with an error",
    )  # fmt: skip
    parser.add_argument(
        "--max-query-length", type=integer_at_least(3),
        help="query tokens kept; longer queries are truncated (default: the length the ranker was trained with, "
             "from its dilstore_training.json; 32 without one)",
    )  # fmt: skip
    parser.add_argument(
        "--pair-batch-tokens", type=positive_int,
        help="EARL: padded query+document tokens per judging batch (default 8192)",
    )  # fmt: skip
    parser.add_argument(
        "--max-pairs-per-batch", type=positive_int, help="EARL: query-document pairs per judging batch (default 64)"
    )
    add_runtime_arguments(parser)
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument(
        "--json", action="store_true",
        help='print {"queries","pairs","skipped","emptied_queries","truncated_queries","seconds","timings","depth",'
             '"output","encoding"}',
    )  # fmt: skip
    add_verbose_argument(parser)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Read topics and run, open the store and its checked ranker, rerank, write the run, print a summary."""
    apply_threads(args.threads)
    from tqdm import tqdm

    from dilstore.reader.serving.rerank import (
        DEFAULT_DEPTH,
        RerankSettings,
        checked_depth,
        open_reranker,
        require_topics,
    )
    from dilstore.reader.data.trec import read_run, read_topics, write_run

    refuse_output_inside_store(args.output, args.store, "--output")
    refuse_output_inside_models(args.output, args.model, "--output")
    check_output_file(args.output, "--output", [args.topics, args.run_file])
    depth = checked_depth(DEFAULT_DEPTH if args.depth is None else args.depth)
    topics = read_topics(args.topics)
    first_stage = read_run(args.run_file)
    if not first_stage:
        raise DilstoreError(f"{args.run_file}: the run holds no queries")
    require_topics(topics, first_stage, str(args.topics))
    settings = RerankSettings(**{name: getattr(args, name) for name in _SETTINGS if getattr(args, name) is not None})
    reranker = open_reranker(args.store, args.model, settings=settings, device=args.device)
    reranker.store.check_files = True  # a store rebuilt under a long run is named, not read from its deleted build
    bar = tqdm(total=len(first_stage), unit="query", desc="rerank", file=sys.stderr, dynamic_ncols=True,
               disable=args.no_progress or args.json)  # fmt: skip
    with bar:
        reranked, stats = reranker.rerank_run(
            topics, first_stage, depth, skip_missing=args.skip_missing, on_query=lambda _: bar.update()
        )
    write_run(args.output, reranked, tag=args.tag or reranker.run_tag)
    encoding = reranker.store.fingerprint.encoding  # what the states were read from
    summary = {**stats.to_dict(), "depth": depth, "output": str(args.output), "encoding": encoding}
    if args.json:
        print(json.dumps(summary))
        return 0
    print(
        f"reranked {stats.queries} queries, {stats.pairs} pairs (depth {depth}, {encoding} store) "
        f"in {stats.seconds:.1f} s -> {args.output}"
    )
    if stats.skipped:
        print(f"{stats.skipped} document(s) not in the store left out")
    if stats.emptied_queries:
        print(f"{len(stats.emptied_queries)} query(ies) had none of their documents in the store and are not in the "
              f"output run: {listed(stats.emptied_queries)}")  # fmt: skip
    if stats.truncated_queries:
        print(f"{stats.truncated_queries} query(ies) truncated to {reranker.max_query_length} tokens")
    timings = summary["timings"]
    print("timings: " + " | ".join(f"{label} {timings[stage]:.2f} s" for stage, label in _STAGE_LABELS.items()))
    return 0
