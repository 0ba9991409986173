"""SQuAD paragraph-ranking training data: each question, its gold paragraph and BM25-hard negatives.

From a SQuAD v1.1 file (seed 004 trains on query, positive, negatives groups):

1. paragraphs: every paragraph is one document, id `{article_title}#p{index}`
   (the id pipelines/corpus_squad.py gives it), text = the context alone, so
   BM25 and the rankers read the same text;
2. index: a pyserini Lucene BM25 index over those paragraphs, cached in a
   work folder and rebuilt only when the paragraphs change (a digest of the
   collection decides);
3. retrieval: the top-`depth` paragraphs per question, in one process with
   Java threads (the JVM is never forked);
4. sampling: `negatives` non-gold paragraphs per question, drawn without
   replacement from its BM25 list by a generator seeded with (seed, qid), so
   the draw of a question does not depend on which others are in the file; a
   list with too few non-gold paragraphs is filled with random non-gold
   paragraphs of the corpus, and the fills are counted. A paragraph whose text
   equals the gold one's under another id (SQuAD-train holds a few such twins)
   is gold too: it is never a negative, which would teach the ranker to score
   the same text both up and down; the questions this spares are counted;
5. files: triples and the paragraphs they use (reader/data/ranking_files.py), so a
   training run (on a machine without the SQuAD file or the index) reads
   only those two. Each file is written atomically, but the two are not one
   write: the summary, written last, holds both files' SHA-256, and training
   refuses a pair the summary beside them does not describe (a re-run into
   the same folder stopped between its writes left new triples beside old
   paragraphs, under the old summary).

Retrieval is a parameter (`Retriever`), so the sampling is tested without a JVM.
"""

from __future__ import annotations

import hashlib
import json
import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from dilstore.reader.data.ranking_files import PARAGRAPHS_FILE, TRIPLES_FILE, Triple, write_paragraphs, write_triples
from dilstore.reader.data.squad import parse_squad
from dilstore.reader.text.files import read_json
from dilstore.storage.atomic_files import atomic_write_text
from dilstore.storage.digests import sha256_file
from dilstore.storage.errors import DilstoreError
from dilstore.storage.file_errors import naming

# (qid, query) pairs and a depth → qid → (paragraph id, score) pairs, best first.
Retriever = Callable[[Sequence[tuple[str, str]], int], dict[str, list[tuple[str, float]]]]
SUMMARY_FILE = "ranking_data.json"
COLLECTION_FILE = "paragraphs.jsonl"
INDEX_DIGEST_FILE = "collection.sha256"
RETRIEVAL_CHUNK = 10_000


@dataclass(frozen=True)
class RankingQuestion:
    """One SQuAD question as a ranking query: its id, text and gold paragraph id."""

    qid: str
    query: str
    positive: str


@dataclass(frozen=True)
class SquadRanking:
    """A SQuAD file as a ranking collection: paragraphs `{id: text}` in file order, and its questions."""

    paragraphs: dict[str, str]
    questions: list[RankingQuestion]


@dataclass(frozen=True)
class SamplingStats:
    """How the negatives were found: questions whose BM25 list ran short, and the random fills they got."""

    questions: int
    filled_questions: int
    filled_negatives: int
    twin_questions: int


@dataclass(frozen=True)
class RankingDataSummary:
    """What `build_ranking_data` wrote and how (also saved as OUTPUT/ranking_data.json)."""

    squad: str
    triples: str
    paragraphs: str
    questions: int
    corpus_paragraphs: int
    paragraphs_written: int
    negatives: int
    depth: int
    seed: int
    limit: int | None
    filled_questions: int
    filled_negatives: int
    twin_questions: int
    index: str | None
    seconds: float
    triples_sha256: str
    paragraphs_sha256: str


def squad_paragraph_id(article_title: str, paragraph_index: int) -> str:
    """`{article_title}#p{paragraph_index}`: the id pipelines/corpus_squad.paragraph_id gives the same paragraph."""
    return f"{article_title}#p{paragraph_index}"


def read_squad_ranking(path: Path) -> SquadRanking:
    """A SQuAD v1.1 file as paragraphs and ranking questions (see `parse_squad_ranking`)."""
    return parse_squad_ranking(read_json(path), str(path))


def parse_squad_ranking(document: Any, source: str) -> SquadRanking:
    """Paragraphs and questions of a parsed SQuAD document, checked by reader/data/squad.parse_squad first.

    Every article needs a non-empty title, which its paragraph ids carry, and
    two articles may not share a title (their ids would collide).
    """
    parse_squad(document, source)
    paragraphs: dict[str, str] = {}
    questions: list[RankingQuestion] = []
    for a, article in enumerate(document["data"]):
        title = article.get("title", "")
        if not title.strip():
            raise DilstoreError(f"{source}: data[{a}] has no title, which its paragraph ids need")
        for index, paragraph in enumerate(article["paragraphs"]):
            pid = squad_paragraph_id(title, index)
            if pid in paragraphs:
                raise DilstoreError(f"{source}: data[{a}]: paragraph id {pid!r} is used twice (a repeated title?)")
            paragraphs[pid] = paragraph["context"]
            questions.extend(RankingQuestion(qa["id"], qa["question"], pid) for qa in paragraph["qas"])
    if not questions:
        raise DilstoreError(f"{source}: no questions")
    return SquadRanking(paragraphs, questions)


def check_negatives(paragraphs: int, negatives: int) -> None:
    """A DilstoreError unless a corpus of `paragraphs` paragraphs holds `negatives` (>= 1) besides a gold one."""
    if negatives < 1:
        raise DilstoreError(f"negatives must be at least 1, got {negatives}")
    if paragraphs - 1 < negatives:
        raise DilstoreError(
            f"the corpus has {paragraphs} paragraph(s): too few for {negatives} negatives besides the gold one"
        )


def sample_negatives(
    questions: Sequence[RankingQuestion],
    retrieved: Mapping[str, Sequence[tuple[str, float]]],
    paragraphs: Mapping[str, str],
    negatives: int,
    seed: int,
) -> tuple[list[Triple], SamplingStats]:
    """`negatives` distinct non-gold paragraph ids per question, in sampled (random) order.

    Drawn from the question's retrieved (id, score) list; when that holds fewer
    non-gold ids, all of them are kept and the rest drawn from `paragraphs`
    (every paragraph, in corpus order), never a repeat. Gold is the question's
    paragraph and every paragraph with the same text (`same_text_ids`).
    """
    check_negatives(len(paragraphs), negatives)
    twins = same_text_ids(paragraphs)
    triples = []
    filled_questions = filled_negatives = twin_questions = 0
    for question in questions:
        rng = random.Random(f"{seed}:{question.qid}")
        gold = twins.get(question.positive, {question.positive})
        twin_questions += len(gold) > 1
        candidates = list(dict.fromkeys(pid for pid, _ in retrieved.get(question.qid, ()) if pid not in gold))
        chosen = rng.sample(candidates, min(negatives, len(candidates)))
        if len(chosen) < negatives:
            taken = {*gold, *chosen}
            pool = [pid for pid in paragraphs if pid not in taken]
            if len(pool) < negatives - len(chosen):
                raise DilstoreError(
                    f"question {question.qid!r}: the corpus has too few paragraphs whose text differs from its gold "
                    f"paragraph's for {negatives} negatives"
                )
            fill = rng.sample(pool, negatives - len(chosen))
            chosen += fill
            filled_questions += 1
            filled_negatives += len(fill)
        triples.append(Triple(question.qid, question.query, question.positive, tuple(chosen)))
    return triples, SamplingStats(len(questions), filled_questions, filled_negatives, twin_questions)


def same_text_ids(paragraphs: Mapping[str, str]) -> dict[str, set[str]]:
    """For each paragraph whose text (whitespace collapsed) recurs under other ids, the ids of all its copies."""
    by_text: dict[str, set[str]] = {}
    for pid, text in paragraphs.items():
        by_text.setdefault(" ".join(text.split()), set()).add(pid)
    return {pid: ids for ids in by_text.values() if len(ids) > 1 for pid in ids}


def used_paragraphs(triples: Sequence[Triple], paragraphs: Mapping[str, str]) -> dict[str, str]:
    """The paragraphs the triples point at, in corpus order."""
    used = {pid for triple in triples for pid in (triple.positive, *triple.negatives)}
    return {pid: text for pid, text in paragraphs.items() if pid in used}


def write_collection(paragraphs: Mapping[str, str], directory: Path) -> Path:
    """The paragraphs as a pyserini JsonCollection file (`{"id", "contents"}` JSONL) in `directory`. A write that
    fails (a full disk) names the file: `train ranking-data` said "error: No space left on device" alone (disk56
    F6). A file cut short is written again by the next run, whose index digest it does not match."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / COLLECTION_FILE
    with naming(path), path.open("w", encoding="utf-8") as handle:
        for pid, text in paragraphs.items():
            handle.write(json.dumps({"id": pid, "contents": text}, ensure_ascii=False) + "\n")
    return path


def collection_digest(paragraphs: Mapping[str, str]) -> str:
    """sha256 over ids and texts in order: a cached index is reused only for exactly these paragraphs."""
    digest = hashlib.sha256()
    for pid, text in paragraphs.items():
        digest.update(json.dumps([pid, text], ensure_ascii=False).encode("utf-8") + b"\n")
    return digest.hexdigest()


def ensure_bm25_index(paragraphs: Mapping[str, str], work: Path, threads: int = 1) -> Path:
    """WORK/bm25, a Lucene BM25 index over `paragraphs`: reused when its digest matches, else (re)built.

    Built beside WORK/bm25 and renamed when complete (retrieval.build_bm25_index_in_place),
    so a run cut off while indexing never leaves an index that looks whole.
    """
    from dilstore.reader.retrieval import build_bm25_index_in_place

    index = work / "bm25"
    digest = collection_digest(paragraphs)
    marker = work / INDEX_DIGEST_FILE
    if index.is_dir() and marker.is_file() and marker.read_text(encoding="utf-8").strip() == digest:
        return index
    marker.unlink(missing_ok=True)
    collection = write_collection(paragraphs, work / "collection")
    build_bm25_index_in_place(collection.parent, index, threads=threads)
    atomic_write_text(marker, digest + "\n")
    return index


def bm25_retriever(index: Path, threads: int = 1, log: Callable[[str], None] | None = None) -> Retriever:
    """A Retriever over a Lucene index: batched searches of RETRIEVAL_CHUNK queries on `threads` Java threads."""
    from dilstore.reader.retrieval import Bm25Searcher

    searcher = Bm25Searcher(index)

    def retrieve(queries: Sequence[tuple[str, str]], depth: int) -> dict[str, list[tuple[str, float]]]:
        found: dict[str, list[tuple[str, float]]] = {}
        started = time.perf_counter()
        for first in range(0, len(queries), RETRIEVAL_CHUNK):
            chunk = queries[first : first + RETRIEVAL_CHUNK]
            hits = searcher.batch_search([query for _, query in chunk], [qid for qid, _ in chunk], depth, threads)
            found.update({qid: [(hit.passage_id, hit.score) for hit in hits[qid]] for qid, _ in chunk})
            if log is not None:
                rate = len(found) / max(time.perf_counter() - started, 1e-9)
                log(f"BM25 top-{depth}: {len(found)}/{len(queries)} questions ({rate:.0f}/s)")
        return found

    return retrieve


def build_ranking_data(
    squad: Path,
    output: Path,
    *,
    negatives: int = 8,
    depth: int = 30,
    seed: int = 13,
    limit: int | None = None,
    work: Path | None = None,
    threads: int = 1,
    retriever: Retriever | None = None,
    log: Callable[[str], None] | None = None,
) -> RankingDataSummary:
    """SQuAD file → OUTPUT/triples.jsonl.gz, OUTPUT/paragraphs.jsonl.gz and OUTPUT/ranking_data.json.

    The index covers every paragraph of the file; `limit` keeps only the
    first N questions. Without `retriever`, BM25 runs over the index cached
    in `work` (default OUTPUT/work).
    """
    if depth < 1:
        raise DilstoreError(f"depth must be at least 1, got {depth}")
    if limit is not None and limit < 1:
        raise DilstoreError(f"limit must be at least 1, got {limit}")
    started = time.perf_counter()
    collection = read_squad_ranking(squad)
    check_negatives(len(collection.paragraphs), negatives)  # before the BM25 index and search, which take minutes
    questions = collection.questions[:limit] if limit is not None else collection.questions
    output.mkdir(parents=True, exist_ok=True)
    index = None
    if retriever is None:
        index = ensure_bm25_index(collection.paragraphs, work or output / "work", threads)
        retriever = bm25_retriever(index, threads, log)
    retrieved = retriever([(question.qid, question.query) for question in questions], depth)
    triples, stats = sample_negatives(questions, retrieved, collection.paragraphs, negatives, seed)
    paragraphs = used_paragraphs(triples, collection.paragraphs)
    write_triples(output / TRIPLES_FILE, triples)
    write_paragraphs(output / PARAGRAPHS_FILE, paragraphs)
    summary = RankingDataSummary(
        squad=str(squad),
        triples=str(output / TRIPLES_FILE),
        paragraphs=str(output / PARAGRAPHS_FILE),
        questions=len(triples),
        corpus_paragraphs=len(collection.paragraphs),
        paragraphs_written=len(paragraphs),
        negatives=negatives,
        depth=depth,
        seed=seed,
        limit=limit,
        filled_questions=stats.filled_questions,
        filled_negatives=stats.filled_negatives,
        twin_questions=stats.twin_questions,
        index=None if index is None else str(index),
        seconds=round(time.perf_counter() - started, 1),
        triples_sha256=sha256_file(output / TRIPLES_FILE),
        paragraphs_sha256=sha256_file(output / PARAGRAPHS_FILE),
    )
    try:
        atomic_write_text(output / SUMMARY_FILE, json.dumps(asdict(summary), indent=1) + "\n", named_by_user=True)
    except OSError as error:
        raise DilstoreError(f"cannot write {output / SUMMARY_FILE}: {error.strerror or error}") from None
    return summary


def require_written_together(triples_file: Path, paragraphs_file: Path) -> None:
    """A DilstoreError when the summary beside `triples_file` describes other files than the ones given.

    Each of the builder's files the summary lists by digest, and that is given here, must have that digest:
    otherwise a run into that folder stopped between its writes (or a file was changed since) and the triples
    may point at paragraphs of another draw. Without a summary, or one written before digests were kept, the
    files are taken as they are (triples made by other tools).
    """
    summary_path = Path(triples_file).parent / SUMMARY_FILE
    if not summary_path.is_file():
        return
    summary = read_json(summary_path)
    for given, name, key in ((triples_file, TRIPLES_FILE, "triples_sha256"),
                             (paragraphs_file, PARAGRAPHS_FILE, "paragraphs_sha256")):  # fmt: skip
        recorded = summary.get(key) if isinstance(summary, dict) else None
        described = summary_path.parent / name
        if not isinstance(recorded, str) or Path(given).resolve() != described.resolve():
            continue
        if sha256_file(described) != recorded:
            raise DilstoreError(
                f"{described} is not the file {summary_path} describes (its SHA-256 differs): a run of "
                f"`dilstore train ranking-data` into {summary_path.parent} was stopped while it wrote its files, "
                f"or the file was changed since; run that command again (or remove {summary_path} to train on "
                "the files as they are)"
            )
