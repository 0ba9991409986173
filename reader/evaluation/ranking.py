"""Rerank BM25 candidates with a trained ranker and score the run: DL19 passages and SQuAD dev paragraphs.

A ranking task is queries, each query's BM25 candidates (the top `depth`,
best first, with BM25 scores), the candidates' texts and qrels:

- **DL19** (TREC 2019 Deep Learning passages): the 43 judged queries and their
  BM25 top-100 with text, from a JSON list of
  `{"query", "hits": [{"qid", "docid", "content", "rank", "score"}, ...]}`,
  judged by the NIST qrels (grades 0–3).
- **SQuAD dev paragraph ranking**: each dev question's candidates are the BM25
  top-`depth` over the dev file's paragraphs (2,067 for SQuAD v1.1 dev, ids
  `{title}#p{index}`, cached index as in reader/data/ranking_data.py); the only
  relevant paragraph (grade 1) is the question's own.

`save_task` and `load_task` carry a task as one small file to a machine
without the data, the index or a JVM. `rerank` returns `{qid: {docid: score}}`
for reader/evaluation/rank_metrics.evaluate_run (RR@10, nDCG@10, R@100). Reranking the
top-`depth` list keeps its members, so R@depth is BM25's for every ranker.
"""

from __future__ import annotations

import gzip
import json
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm

from dilstore.reader.data.ranking_data import Retriever, bm25_retriever, ensure_bm25_index, read_squad_ranking
from dilstore.reader.data.trec import Qrels, Run, write_run
from dilstore.reader.evaluation.subsets import seeded_subset
from dilstore.reader.modeling.listformer import KIND as LISTFORMER
from dilstore.reader.modeling.ranker_base import RankerBase
from dilstore.reader.modeling.ranking_inputs import DEFAULT_MAX_DOC_LENGTH, DEFAULT_MAX_QUERY_LENGTH
from dilstore.reader.progress_lines import bar_options, steady_bar
from dilstore.reader.text.files import read_json
from dilstore.storage.checks import finite_float
from dilstore.storage.errors import DilstoreError
from dilstore.storage.messages import shown

DEFAULT_DEPTH = 100


@dataclass(frozen=True)
class RankingTask:
    """Queries with their BM25 candidates, the candidates' texts and the qrels that judge them."""

    name: str
    queries: dict[str, str]  # qid → query text
    bm25: Run  # qid → {docid: BM25 score}, the top `depth` candidates
    texts: dict[str, str]  # docid → passage text
    qrels: Qrels  # qid → {docid: grade}


def load_dl19_task(candidates_file: Path, qrels: Qrels, depth: int = DEFAULT_DEPTH) -> RankingTask:
    """The DL19 task from the BM25-top-100-with-text JSON list; `qrels` from reader.data.trec.read_qrels."""
    document = read_json(candidates_file)
    if not isinstance(document, list):
        raise DilstoreError(f"{candidates_file}: expected a JSON list of {{query, hits}} objects")
    queries: dict[str, str] = {}
    bm25: Run = {}
    texts: dict[str, str] = {}
    for index, entry in enumerate(document):
        where = f"{candidates_file}: item {index}"
        valid = isinstance(entry, dict) and isinstance(entry.get("query"), str) and isinstance(entry.get("hits"), list)
        if not valid:
            raise DilstoreError(f"{where} must be an object with a 'query' string and a 'hits' list")
        hits = sorted(entry["hits"], key=_hit_rank(where))[:depth]
        if not hits:
            continue
        qid = str(hits[0]["qid"])
        queries[qid] = entry["query"]
        bm25[qid] = {}
        for hit in hits:
            if str(hit["qid"]) != qid:
                raise DilstoreError(f"{where}: hits of qids {qid!r} and {hit['qid']!r} are mixed in one entry")
            docid = str(hit["docid"])
            bm25[qid][docid] = float(hit["score"])
            texts[docid] = hit["content"]
    if not queries:
        raise DilstoreError(f"{candidates_file}: no query has any hit")
    return RankingTask("DL19", queries, bm25, texts, {qid: grades for qid, grades in qrels.items() if qid in queries})


def squad_dev_task(
    squad_dev: Path,
    work: Path,
    depth: int = DEFAULT_DEPTH,
    *,
    limit: int | None = None,
    seed: int = 0,
    threads: int = 1,
    retriever: Retriever | None = None,
    log: Callable[[str], None] | None = None,
) -> RankingTask:
    """SQuAD dev paragraph ranking: BM25 top-`depth` over the file's paragraphs, gold paragraph relevant.

    With `limit`, a seeded random subset of the questions (their order kept).
    The index covers every paragraph and is cached in `work`.
    """
    collection = read_squad_ranking(squad_dev)
    questions = seeded_subset(collection.questions, limit, seed)
    if retriever is None:
        retriever = bm25_retriever(ensure_bm25_index(collection.paragraphs, work, threads), threads, log)
    retrieved = retriever([(question.qid, question.query) for question in questions], depth)
    return RankingTask(
        name="SQuAD dev",
        queries={question.qid: question.query for question in questions},
        bm25={question.qid: dict(retrieved.get(question.qid, [])[:depth]) for question in questions},
        texts=collection.paragraphs,
        qrels={question.qid: {question.positive: 1} for question in questions},
    )


@torch.no_grad()
def rerank(
    ranker: RankerBase,
    task: RankingTask,
    *,
    max_query_length: int = DEFAULT_MAX_QUERY_LENGTH,
    max_doc_length: int = DEFAULT_MAX_DOC_LENGTH,
    batch_size: int = 64,
    progress: bool = False,
) -> Run:
    """Every query's candidates scored by `ranker` (in eval mode, `batch_size` documents per forward) → a run.

    Each distinct document is tokenized once; a query's candidates are
    scored as groups of that query, so EARL encodes each query once per batch.
    A Listformer scores each query's whole list in one forward, whatever
    `batch_size`, as `dilstore rerank` does: its score of a document depends
    on the rest of the list, so lists cut into batches scored differently.
    """
    if batch_size < 1:
        raise DilstoreError(f"batch size must be at least 1, got {batch_size}")
    ranker.eval()
    doc_tokens: dict[str, np.ndarray] = {}
    run: Run = {}
    queries = steady_bar(tqdm)(task.bm25.items(), disable=not progress, unit="query", desc=task.name, **bar_options())
    for qid, candidates in queries:
        docids = list(candidates)
        if not docids:
            run[qid] = {}
            continue
        query = ranker.tokenize_query(task.queries[qid], max_query_length)
        scores: list[float] = []
        step = len(docids) if ranker.kind == LISTFORMER else batch_size
        for first in range(0, len(docids), step):
            chunk = docids[first : first + step]
            for docid in chunk:
                if docid not in doc_tokens:
                    doc_tokens[docid] = ranker.tokenize_document(task.texts[docid], max_doc_length)
            group = [doc_tokens[docid] for docid in chunk]
            scores.extend(ranker.score_groups([query], [group])[0].float().tolist())  # (c,)
        run[qid] = dict(zip(docids, scores, strict=True))
    return run


def write_task_files(task: RankingTask, directory: Path) -> tuple[Path, Path]:
    """The task's qrels and BM25 run as TREC files in `directory`; returns (qrels path, run path)."""
    directory.mkdir(parents=True, exist_ok=True)
    slug = task.name.lower().replace(" ", "-")
    qrels_path, run_path = directory / f"qrels.{slug}.txt", directory / f"run.{slug}.bm25.trec"
    lines = [f"{qid} 0 {docid} {grade}\n" for qid, grades in task.qrels.items() for docid, grade in grades.items()]
    qrels_path.write_text("".join(lines), encoding="utf-8")
    write_run(run_path, task.bm25, tag="bm25")
    return qrels_path, run_path


def save_task(task: RankingTask, path: Path) -> Path:
    """The task as one gzipped JSON file, holding only the texts of its candidates.

    A machine without the source data, the index or a JVM (a GPU machine)
    evaluates from this file alone, through `load_task`.
    """
    candidates = {docid for scores in task.bm25.values() for docid in scores}
    document = {
        "name": task.name,
        "queries": task.queries,
        "bm25": task.bm25,
        "qrels": task.qrels,
        "texts": {docid: text for docid, text in task.texts.items() if docid in candidates},
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.GzipFile(path, "wb", mtime=0) as handle:
        handle.write(json.dumps(document, ensure_ascii=False).encode("utf-8"))
    return path


def load_task(path: Path) -> RankingTask:
    """A task written by `save_task`; a DilstoreError naming the file when it is not one."""
    try:
        with gzip.open(path, "rb") as handle:
            document = json.loads(handle.read().decode("utf-8"))
    except FileNotFoundError:
        raise DilstoreError(f"{path}: no such file") from None
    except (OSError, EOFError, zlib.error, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise DilstoreError(f"{path}: not a ranking task file written by save_task ({error})") from None
    fields = ("name", "queries", "bm25", "qrels", "texts")
    if not isinstance(document, dict) or any(name not in document for name in fields):
        raise DilstoreError(f"{path}: a ranking task file needs the fields {', '.join(fields)}")
    missing = {docid for scores in document["bm25"].values() for docid in scores} - document["texts"].keys()
    if missing:
        raise DilstoreError(f"{path}: no text for {len(missing)} candidate(s), e.g. {sorted(missing)[0]!r}")
    return RankingTask(*(document[name] for name in ("name", "queries", "bm25", "texts", "qrels")))


def _hit_rank(where: str) -> Callable[[object], int]:
    """The sort key of a DL19 hit (its rank), checking the hit's fields on the way: an integer rank, a finite
    score, a string content. A score "abc" or a rank "x" was a ValueError traceback, and a score "nan" was taken,
    a NaN in the BM25 run whose metrics it fed (fuzz60 F8)."""

    def rank(hit: object) -> int:
        if not isinstance(hit, dict) or not all(key in hit for key in ("qid", "docid", "content", "rank", "score")):
            raise DilstoreError(f"{where}: every hit needs qid, docid, content, rank and score")
        wrong = [name for name, right in (("rank", isinstance(hit["rank"], int) and not isinstance(hit["rank"], bool)),
                                          ("score", finite_float(hit["score"]) is not None),
                                          ("content", isinstance(hit["content"], str))) if not right]  # fmt: skip
        if wrong:
            raise DilstoreError(f"{where}: a hit's {wrong[0]} is {shown(hit[wrong[0]]):.60}, not "
                                f"{_HIT_FIELD_KINDS[wrong[0]]}")  # fmt: skip
        return hit["rank"]

    return rank


_HIT_FIELD_KINDS = {"rank": "an integer", "score": "a finite number", "content": "a string"}
