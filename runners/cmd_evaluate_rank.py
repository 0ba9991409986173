"""`dilstore evaluate-rank`: RR@10, nDCG@10, R@k (R@100 by default) and Judged@10 of a TREC run against TREC
qrels."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from dilstore.runners.arg_types import positive_int
from dilstore.storage.errors import DilstoreError
from dilstore.storage.messages import listed


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `evaluate-rank` subcommand."""
    parser = subparsers.add_parser(
        "evaluate-rank",
        help="RR@10, nDCG@10 and R@k of a TREC run against qrels (ir_measures)",
        description=(
            "Score a TREC run against TREC qrels with ir_measures. Means are over every judged query; "
            "a judged query missing from the run scores 0, and run queries without judgements are ignored. "
            "RR and R count grade >= 2 as relevant when the qrels are graded 0-3 (TREC Deep Learning), "
            "otherwise grade >= 1, unless --relevance-level says; nDCG uses the grades as gains. Judged@10 is "
            "the share of each top 10 the qrels judge: unjudged documents count as not relevant. Tied scores are "
            "ranked by docid, descending, as trec_eval ranks them."
        ),
    )
    parser.add_argument("--qrels", type=Path, required=True, help="TREC qrels: qid 0 docid grade")
    parser.add_argument(
        "--run", type=Path, required=True, dest="run_file", metavar="RUN", help="TREC run: qid Q0 docid rank score tag"
    )
    parser.add_argument(
        "--relevance-level", type=positive_int, metavar="GRADE",
        help="lowest grade RR and R count as relevant (default: 2 when the qrels' highest grade is 3, else 1); "
             "give it to score a subset of a file's queries as the whole file scores them",
    )  # fmt: skip
    parser.add_argument(
        "--recall-at", type=positive_int, action="append", metavar="K", dest="recall_depths",
        help="the k of R@k; repeat it for several (default: 100)",
    )  # fmt: skip
    parser.add_argument(
        "--json", action="store_true",
        help='print {"RR@10","nDCG@10","R@100" (each R@K asked),"Judged@10","queries","relevance_level",'
             '"unretrieved","unjudged"}',
    )  # fmt: skip
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Read both files, evaluate, print the means."""
    from dilstore.reader.data.trec import rank_order_warning, read_qrels, read_ranked_run, unicode_form_warning
    from dilstore.reader.evaluation.rank_metrics import DEFAULT_RECALL_DEPTHS, JUDGED, evaluate_run

    qrels, (ranked, disagreeing) = read_qrels(args.qrels), read_ranked_run(args.run_file)
    if not any(qrels.values()):
        raise DilstoreError(f"{args.qrels}: the qrels judge no documents")
    if not ranked:
        raise DilstoreError(f"{args.run_file}: the run holds no lines")
    if (warning := rank_order_warning(args.run_file, disagreeing, len(ranked))) is not None:
        print(f"dilstore evaluate-rank: {warning}", file=sys.stderr)
    if (warning := unicode_form_warning(qrels, ranked)) is not None:
        print(f"dilstore evaluate-rank: {warning}", file=sys.stderr)
    evaluation = evaluate_run(qrels, ranked, args.relevance_level, args.recall_depths or DEFAULT_RECALL_DEPTHS)
    if not any(grade >= evaluation.relevance_level for judged in qrels.values() for grade in judged.values()):
        print(f"dilstore evaluate-rank: no judged document has grade {evaluation.relevance_level} or more, so RR and "
              "R are 0 for every query", file=sys.stderr)  # fmt: skip
    summary = evaluation.summary()
    if args.json:
        print(json.dumps(summary))
        return 0
    rows = [
        ("qrels", str(args.qrels)),
        ("run", str(args.run_file)),
        ("queries", f"{evaluation.queries} (relevant for RR and R: grade >= {evaluation.relevance_level})"),
        *((name, f"{summary[name]:.4f}") for name in evaluation.metrics),
        (JUDGED, f"{summary[JUDGED]:.4f} (share of each top 10 the qrels judge)"),
    ]
    width = max(len(label) for label, _ in rows)
    print("\n".join(f"{label:<{width}}  {value}" for label, value in rows))
    if evaluation.unretrieved:
        print(f"{len(evaluation.unretrieved)} judged query(ies) missing from the run, scored 0: "
              f"{listed(sorted(evaluation.unretrieved))}")  # fmt: skip
    if evaluation.unjudged:
        unjudged = sorted(ranked.keys() - qrels.keys())
        print(f"{evaluation.unjudged} run query(ies) without judgements, ignored: {listed(unjudged)}")
    return 0
