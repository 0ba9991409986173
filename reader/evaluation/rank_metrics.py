"""Ranking metrics of a run against qrels: RR@10, nDCG@10 and R@k (R@100 unless asked), computed by ir_measures,
and Judged@10.

Three ir_measures providers that work offline compute them: nDCG@10 and R@k
come from pytrec_eval (trec_eval's own C code), RR@10 from ir_measures' port of
the official MS MARCO script, because pytrec_eval's reciprocal rank ignores a
cutoff, and Judged@10 from its own. Judged@10, the share of each top 10 the
qrels judge, is no quality measure but says how far to trust the others: an
unjudged document counts as not relevant, so a reranker that lifts unjudged
documents into the top 10 loses nDCG@10 whatever they hold (TREC DL 2019
judged about half of BM25's top 100). This module fixes the rules the tools
leave open, and states them:

- **Which queries count.** Every query in the qrels. A judged query that the
  run does not contain scores 0 on every metric (trec_eval's `-c`; ir_measures
  does the same, and `evaluate_run` fills the zeros itself so the rule does not
  hang on a provider); a run query without qrels is ignored. Means are over the
  judged queries, and a judged query with no relevant document scores 0.
- **What "relevant" means for RR and R.** The lowest relevant grade given
  (`relevance_level`), or by default: when the highest grade in the qrels is 3
  (TREC Deep Learning's 0–3 passage scale), grade ≥ 2 is relevant, as the DL
  track overviews count it for binary measures; otherwise grade ≥ 1. The
  default hangs on the file, so a subset of DL qrels whose best grade is 2 gets
  ≥ 1: give the level to score a subset as its whole file is scored. nDCG
  always uses the grades themselves as gains (trec_eval's linear gain, log2
  discount).
- **Ties.** Documents with equal scores are ranked by `reader.data.trec.rank_documents`
  (docid descending, trec_eval's order) for every metric, which is also the
  order `write_run` writes; the two providers would otherwise break ties in
  opposite directions.
"""

from __future__ import annotations

import numbers
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from dilstore.reader.data.trec import Qrels, Run, int32_grade, rank_documents
from dilstore.storage.errors import DilstoreError
from dilstore.storage.messages import other_form_hint, shown

METRICS: tuple[str, ...] = ("RR@10", "nDCG@10", "R@100")  # what evaluate_run computes by default
JUDGED = "Judged@10"
DEFAULT_RECALL_DEPTHS = (100,)


@dataclass(frozen=True)
class RankEvaluation:
    """Per-query and mean metrics of one run, and which queries they cover."""

    per_query: dict[str, dict[str, float]]  # judged qid → {metric name or JUDGED: value}
    means: dict[str, float]  # metric name or JUDGED → mean over every judged query
    relevance_level: int  # lowest grade RR and R count as relevant
    unretrieved: tuple[str, ...]  # judged queries absent from the run, scored 0
    unjudged: int  # run queries without qrels, ignored
    metrics: tuple[str, ...] = METRICS  # the metric names computed, in order: RR@10, nDCG@10, then R@k by k

    @property
    def queries(self) -> int:
        """How many queries the means are over: every judged query."""
        return len(self.per_query)

    def summary(self) -> dict[str, float | int]:
        """`{"RR@10", "nDCG@10", "R@100" (each R@k computed), "Judged@10", "queries", "relevance_level",
        "unretrieved", "unjudged"}`, the means rounded to 4 places; "unretrieved" counts the judged queries the run
        lacks (scored 0, so a run of a few queries is not mistaken for a poor run of all), "unjudged" the run's
        queries the qrels lack."""
        means = {name: round(self.means[name], 4) for name in (*self.metrics, JUDGED)}
        return {**means, "queries": self.queries, "relevance_level": self.relevance_level,
                "unretrieved": len(self.unretrieved), "unjudged": self.unjudged}  # fmt: skip


def relevance_level(qrels: Qrels) -> int:
    """The lowest grade RR and R count as relevant: 2 when the highest grade in the qrels is 3, else 1.

    TREC Deep Learning judges on 0–3 and its overviews count grade ≥ 2 as
    relevant for binary measures; any other scale counts grade ≥ 1. The
    highest grade of the whole file decides, so every query is judged alike.
    """
    highest = max(grade for judged in qrels.values() for grade in judged.values())
    return 2 if highest == 3 else 1


def evaluate_run(
    qrels: Qrels, run: Run, level: int | None = None, recall_depths: Iterable[int] = DEFAULT_RECALL_DEPTHS
) -> RankEvaluation:
    """RR@10, nDCG@10, R@k and Judged@10 of `run` per judged query and on average (see the module docstring).

    level: the lowest grade RR and R count as relevant (default: `relevance_level` of the qrels).
    recall_depths: the k of each R@k (default 100), in any order; the metrics name them in increasing order.
    """
    import ir_measures
    from ir_measures import RR, Judged, R, nDCG

    if not any(qrels.values()):
        raise DilstoreError("the qrels judge no documents")
    judged_in_run = [qid for qid in run if qid in qrels]
    if not judged_in_run:
        raise DilstoreError(f"none of the run's {len(run)} queries has judgements in the qrels"
                            f"{other_form_hint(qrels, list(run))}")  # fmt: skip
    if level is None:
        level = relevance_level(qrels)
    elif (grade := int32_grade(level)) is None or grade < 1:  # pytrec_eval takes int32 grades only
        raise DilstoreError(f"the relevance level must be a grade of at least 1 and at most {2**31 - 1}, got "
                            f"{shown(level)}")  # fmt: skip
    else:
        level = grade
    depths = _recall_depths(recall_depths)
    metrics = ("RR@10", "nDCG@10", *(f"R@{depth}" for depth in depths))
    # pytrec_eval's recip_rank has no cutoff (it would score a first hit at rank 19 as 1/19), so RR@k comes
    # from ir_measures' port of the official MS MARCO script; nDCG@k and R@k come from pytrec_eval.
    # trec_eval scores a negative grade (TREC's -2 for junk) as not relevant, gain 0; but one of -2 or less damages
    # pytrec_eval's memory, and its next evaluator in the process crashed with a segmentation fault (a second
    # `dilstore.evaluate_rank` call, fuzz60 F15). It gets such grades as the 0 they score; Judged@10 keeps them.
    clamped = {qid: {docid: max(grade, 0) for docid, grade in grades.items()} for qid, grades in qrels.items()}
    measures_by_provider = (
        (ir_measures.msmarco, {RR(rel=level) @ 10: "RR@10"}, qrels),
        (ir_measures.pytrec_eval, {nDCG @ 10: "nDCG@10", **{R(rel=level) @ depth: f"R@{depth}" for depth in depths}},
         clamped),
        (ir_measures.judged, {Judged @ 10: JUDGED}, qrels),
    )
    # An empty ranking scores 0 on everything (the zeros below), and ir_measures' Judged divides by its length.
    ranked = {qid: _strict_scores(run[qid]) for qid in judged_in_run if run[qid]}
    per_query = {qid: dict.fromkeys((*metrics, JUDGED), 0.0) for qid in qrels}
    for provider, measures, judgements in measures_by_provider:
        for metric in provider.iter_calc(list(measures), judgements, ranked):
            per_query[metric.query_id][measures[metric.measure]] = float(metric.value)
    means = {name: sum(values[name] for values in per_query.values()) / len(per_query) for name in (*metrics, JUDGED)}
    return RankEvaluation(
        per_query=per_query,
        means=means,
        relevance_level=level,
        unretrieved=tuple(qid for qid in qrels if qid not in run),
        unjudged=len(run.keys() - qrels.keys()),
        metrics=metrics,
    )


def _recall_depths(depths: Iterable[int]) -> list[int]:
    """The distinct recall depths in increasing order; a DilstoreError unless they are a non-empty iterable (a
    generator too, not a string) of integers (numpy's too) from 1 to 2**31 - 1 (pytrec_eval takes int32 cutoffs)."""
    if isinstance(depths, str | bytes) or not isinstance(depths, Iterable):
        raise DilstoreError(f"the recall depths must be a non-empty list of integers, got {shown(depths)}")
    given = list(depths)
    if not given:
        raise DilstoreError("the recall depths must be a non-empty list of integers, got none")
    for depth in given:
        if isinstance(depth, bool | np.bool_) or not isinstance(depth, numbers.Integral) or not 1 <= depth < 2**31:
            raise DilstoreError(f"a recall depth must be an integer from 1 to {2**31 - 1}, got {shown(depth)}")
    return sorted({int(depth) for depth in given})


def _strict_scores(scores: dict[str, float]) -> dict[str, float]:
    """Scores n, n-1, …, 1 in `rank_documents` order, so no provider breaks a tie its own way."""
    ranking = rank_documents(scores)
    return {docid: float(len(ranking) - position) for position, (docid, _) in enumerate(ranking)}
