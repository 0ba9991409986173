"""`dilstore rerank`: rerank a first-stage TREC run with the ranker of a store (EARL or Listformer) over its states."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dilstore.runners.arg_types import integer_at_least, positive_int
from dilstore.runners.collector import loading_for_good
from dilstore.runners.inputs import require_file
from dilstore.runners.journal import (
    Journal,
    compacted_settings,
    failed_keeping,
    stopped_keeping,
    store_build,
)
from dilstore.runners.outputs import check_output_file, refuse_output_inside_models, refuse_output_inside_store
from dilstore.runners.quiet import add_verbose_argument
from dilstore.runners.reading_options import add_runtime_arguments, apply_threads
from dilstore.storage.digests import sha256_file
from dilstore.storage.errors import DilstoreError, StoppedBySignal
from dilstore.storage.format import StoreChangedError, StoreReadError
from dilstore.storage.messages import listed
from dilstore.storage.write_lock import refuse_if_locked

if TYPE_CHECKING:
    from dilstore.reader.data.trec import Run
    from dilstore.reader.serving.rerank import RerankStats, StoreReranker

# Queries a part of the journal holds: a stop loses at most one part's work (runners/journal.py).
PART_QUERIES = 50

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
             '"output","encoding","resumed_queries"}',
    )  # fmt: skip
    add_verbose_argument(parser)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Read topics and run, open the store and its checked ranker, rerank, write the run, print a summary."""
    from dilstore.reader.serving.store_checks import check_rerank_inputs

    topics, first_stage, depth = _checked_inputs(args)
    check_rerank_inputs(args.store, args.model)
    apply_threads(args.threads)  # imports torch (2 s): after the inputs and the store are checked (fast59 F2)
    from dilstore.reader.serving.rerank import RerankSettings, open_reranker

    settings = RerankSettings(**{name: getattr(args, name) for name in _SETTINGS if getattr(args, name) is not None})
    with loading_for_good():
        reranker = open_reranker(args.store, args.model, settings=settings, device=args.device)
    reranker.store.check_files = True  # a store rebuilt under a long run is named, not read from its deleted build
    stats, resumed = _rerank_resumably(args, reranker, topics, first_stage, depth)
    _report(args, reranker, stats, depth, resumed)
    return 0


def _checked_inputs(args: argparse.Namespace) -> tuple[dict[str, str], Run, int]:
    """The topics, the first-stage run and the depth, once the output, the input files and the depth are checked:
    before the ranker loads, so a mistake costs no model load."""
    from dilstore.reader.data.trec import rank_order_warning, read_ranked_run, read_topics
    from dilstore.reader.serving.rerank_inputs import DEFAULT_DEPTH, checked_depth, require_topics

    refuse_output_inside_store(args.output, args.store, "--output")
    refuse_output_inside_models(args.output, args.model, "--output")
    check_output_file(args.output, "--output", [args.topics, args.run_file])
    refuse_if_locked(args.output)
    for path, flag in ((args.topics, "--topics"), (args.run_file, "--run")):
        require_file(path, flag)  # read, then checksummed for the journal: a pipe read empty (review48b B1)
    depth = checked_depth(DEFAULT_DEPTH if args.depth is None else args.depth)
    topics = read_topics(args.topics)
    first_stage, disagreeing = read_ranked_run(args.run_file)
    if not first_stage:
        raise DilstoreError(f"{args.run_file}: the run holds no queries")
    if (warning := rank_order_warning(args.run_file, disagreeing, len(first_stage))) is not None:
        print(f"dilstore rerank: {warning}", file=sys.stderr)
    require_topics(topics, first_stage, str(args.topics))
    return topics, first_stage, depth


def _rerank_resumably(
    args: argparse.Namespace, reranker: StoreReranker[Any], topics: dict[str, str], first_stage: Run, depth: int
) -> tuple[RerankStats, int]:
    """Rerank the queries a stopped run of the same command did not, keeping parts in the journal as they are done;
    write the whole run to --output. Returns the stats and how many queries the journal already held."""
    from tqdm import tqdm

    from dilstore.reader.data.trec import write_run
    from dilstore.reader.progress_lines import bar_options, steady_bar
    from dilstore.reader.serving.rerank import RerankStats

    settings = _settings(args, reranker, depth)
    compacted = compacted_settings(settings, args.store, reranker.store.manifest)
    with Journal(args.output, settings, check=_checked_part, also=compacted) as journal:
        kept: Run = {qid: scores for part in journal.parts.values() for qid, scores in part["run"].items()}
        done = [qid for part in journal.parts.values() for qid in part["queries"]]
        earlier = RerankStats.from_dict(journal.parts[len(journal.parts) - 1]["stats"]) if journal.parts else None
        keeper = _PartKeeper(journal, earlier or RerankStats())
        bar = steady_bar(tqdm)(total=len(first_stage), initial=len(done), unit="query", desc="rerank",
                   disable=args.no_progress or args.json, **bar_options())  # fmt: skip
        try:
            with bar:
                reranked, stats = reranker.rerank_run(
                    topics, first_stage, depth, skip_missing=args.skip_missing, done=set(done), stats=keeper.stats,
                    on_reranked=lambda qid, scores: (keeper.add(qid, scores), bar.update()),
                )  # fmt: skip
        except KeyboardInterrupt as interrupt:
            raise _stopped(interrupt, journal, len(first_stage)) from None
        except (StoreReadError, StoreChangedError) as error:  # a compacted store serves what the parts read (conc54 F4)
            kept_words = _kept_words(journal, len(first_stage))
            raise failed_keeping(error, journal, kept_words, args.store, reranker.store.manifest) from None
        whole = {qid: kept.get(qid) or reranked[qid] for qid in first_stage if qid in kept or qid in reranked}
        keeper.keep_rest()
        try:
            write_run(args.output, whole, tag=args.tag or reranker.run_tag)
        except DilstoreError as error:  # the reranked queries stay in the journal, and the same command writes the run
            raise journal.output_not_written(error, f"all {len(whole):,} queries reranked") from None
        journal.remove()
    return stats, len(done)


def _report(args: argparse.Namespace, reranker: StoreReranker[Any], stats: RerankStats, depth: int,
            resumed: int) -> None:  # fmt: skip
    """The summary on stdout: one JSON object with --json, else a few lines."""
    encoding = reranker.store.fingerprint.encoding  # what the states were read from
    summary = {**stats.to_dict(), "depth": depth, "output": str(args.output), "encoding": encoding,
               "resumed_queries": resumed}  # fmt: skip
    if args.json:
        print(json.dumps(summary))
        return
    print(
        f"reranked {stats.queries} queries, {stats.pairs} pairs (depth {depth}, {encoding} store) "
        f"in {stats.seconds:.1f} s -> {args.output}"
    )
    if resumed:
        print(f"{resumed} of them reranked by a stopped run of the same command, kept in its journal")
    if stats.skipped:
        print(f"{stats.skipped} document(s) not in the store left out")
    if stats.emptied_queries:
        print(f"{len(stats.emptied_queries)} query(ies) had none of their documents in the store and are not in the "
              f"output run: {listed(stats.emptied_queries)}")  # fmt: skip
    if stats.truncated_queries:
        print(f"{stats.truncated_queries} query(ies) truncated to {reranker.max_query_length} tokens")
    timings = summary["timings"]
    print("timings: " + " | ".join(f"{label} {timings[stage]:.2f} s" for stage, label in _STAGE_LABELS.items()))


class _PartKeeper:
    """The queries reranked since the journal's last part, kept as its next part every PART_QUERIES queries, with
    the run's stats so far (a stop at 90% of a long run kept nothing, longrun45 F1)."""

    def __init__(self, journal: Journal, stats: RerankStats) -> None:
        self.journal, self.stats = journal, stats
        self.queries: list[str] = []
        self.run: dict[str, dict[str, float]] = {}

    def add(self, qid: str, scores: dict[str, float] | None) -> None:
        """One query reranked (scores None: none of its documents is in the store)."""
        self.queries.append(qid)
        if scores is not None:
            self.run[qid] = scores
        if len(self.queries) == PART_QUERIES:
            self.keep_rest()

    def keep_rest(self) -> None:
        """Keep the queries reranked since the journal's last part as its next part (a shorter one at the run's end:
        a run file that could not be written then lost them, left56b F3)."""
        if self.queries:
            self.journal.add(len(self.journal.parts), {"queries": self.queries, "run": self.run,
                                                       "stats": self.stats.to_dict()})  # fmt: skip
            self.queries, self.run = [], {}


def _checked_part(record: dict[str, Any]) -> None:
    """A KeyError, TypeError or ValueError unless `record` is a part `_PartKeeper` kept: {"queries", "run",
    "stats"}."""
    from dilstore.reader.serving.rerank import RerankStats

    if not all(isinstance(qid, str) for qid in record["queries"]):
        raise TypeError("a query id that is not a string")
    if not all(isinstance(scores, dict) for scores in record["run"].values()):
        raise TypeError("a query's scores that are not a mapping")
    RerankStats.from_dict(record["stats"])


def _settings(args: argparse.Namespace, reranker: StoreReranker[Any], depth: int) -> dict[str, Any]:
    """What decides the reranked run, recorded in the journal: a journal of other settings (other topics or first
    stage, store build, ranker, depth or option) is not taken for this run's."""
    manifest = reranker.store.manifest
    return {"command": "rerank", "topics_sha256": sha256_file(args.topics), "run_sha256": sha256_file(args.run_file),
            "depth": depth,
            "skip_missing": args.skip_missing, **store_build(manifest),
            "model": str(Path(args.model).resolve()) if args.model else None,
            "settings": dataclasses.asdict(reranker.settings), "part_queries": PART_QUERIES}  # fmt: skip


def _stopped(interrupt: KeyboardInterrupt, journal: Journal, total: int) -> StoppedBySignal:
    """The stop, saying how many queries' scores are kept for the same command to go on from."""
    return stopped_keeping(interrupt, journal, _kept_words(journal, total))


def _kept_words(journal: Journal, total: int) -> str | None:
    """How many of `total` queries the journal's parts hold, in words; None when it holds none."""
    kept = sum(len(part["queries"]) for part in journal.parts.values())
    return f"{kept:,} of {total:,} queries reranked" if kept else None
