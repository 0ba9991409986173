"""Mini OpenSQuAD (seed 002, Table 2 layout): EM/F1 with and without BM25 fusion, and R, at p = 29 and 100.

Corpus: the 2,067 SQuAD v1.1 dev paragraphs (one passage each, windowed at
--max-length tokens like `dilstore precompute`) plus the 30,005 MS MARCO
pool passages as distractors. Questions: the 10,570 OpenSQuAD dev questions
(or a seeded --limit subset). The reader never sees which paragraph a
question came from.

Steps, each skipped when its output already exists in --work:

1. store: passages tokenized and encoded with reader/offline/encoding.py's plain
   functions (the same ones `dilstore precompute` runs per shard), written
   with the storage writer, one shard per --shard-passages passages, finalized
   with the model's fingerprint. Or pass --store for a store already built
   with `dilstore precompute` + `dilstore index`.
2. index: STORE/bm25, pyserini Lucene BM25 over `title\\ntext` of every stored
   passage, folded (NFKC) as `dilstore index` folds it.
3. evaluation: one BM25 top-max(p) retrieval and reading per question; each p
   scored from its prefix (reader/evaluation/open_domain.py), under μ = 1 and μ = --mu.

    .venv/bin/python benchmarks/mini_opensquad.py --work /tmp/mini-opensquad --limit 500 --threads 2
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm import tqdm

from dilstore.pipelines.corpus_squad import paragraph_id
from dilstore.pipelines.passages import Passage
from dilstore.reader.evaluation.open_domain import evaluate_top_ps
from dilstore.reader.evaluation.questions import load_questions
from dilstore.reader.evaluation.subsets import seeded_subset
from dilstore.reader.modeling.dilbert import DilBertReader
from dilstore.reader.modeling.fingerprint import model_fingerprint
from dilstore.reader.offline.encoding import encode_tokenized, tokenize_passage
from dilstore.reader.offline.kinds import offline_kind
from dilstore.reader.packaged.shipped import default_checkpoint_dir
from dilstore.reader.retrieval import bm25_index_dir, build_bm25_index
from dilstore.reader.serving.odqa import OdqaSettings, open_reader
from dilstore.reader.text.files import read_json
from dilstore.runners.arg_types import positive_int, sample_seed
from dilstore.runners.outputs import check_output_file, refuse_output_inside_store
from dilstore.storage.codebook import CODEBOOK_DIR, write_codebook
from dilstore.storage.collection import searched_form
from dilstore.storage.encodings import get_encoding, train_codebook
from dilstore.storage.errors import DilstoreError
from dilstore.storage.finalize import finalize
from dilstore.storage.format import MANIFEST_FILE
from dilstore.storage.location import StoreLocation
from dilstore.storage.manifest import read_manifest
from dilstore.storage.reader import open_store
from dilstore.storage.records import PassageRecord
from dilstore.storage.residual_codes import CODEBOOK_SAMPLE_TOKENS, sample_rows
from dilstore.storage.writer import write_shard

sys.path.insert(0, str(Path(__file__).resolve().parent))  # its neighbours, when loaded by path
from script_errors import one_line_errors  # noqa: E402

SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
SEED_TOP_PS = (29, 100)


def squad_passages(path: Path, limit: int | None) -> list[Passage]:
    """One passage per SQuAD paragraph, id `{article_title}#p{i}#0` as the pipeline names it."""
    passages = []
    for article in read_json(path)["data"]:
        for index, paragraph in enumerate(article["paragraphs"]):
            doc_id = paragraph_id(article["title"], index)
            passages.append(Passage(f"{doc_id}#0", doc_id, article["title"].replace("_", " "), paragraph["context"]))
    return passages[:limit]


def msmarco_passages(path: Path, limit: int | None) -> list[Passage]:
    """The MS MARCO pool passages (`{"id","contents"}` JSONL), id `msmarco-{id}#0`, no title."""
    passages = []
    with path.open(encoding="utf-8") as lines:
        for line in lines:
            if line.strip():
                record = json.loads(line)
                doc_id = f"msmarco-{record['id']}"
                passages.append(Passage(f"{doc_id}#0", doc_id, "", record["contents"]))
            if limit is not None and len(passages) >= limit:
                break
    return passages


def store_codebook(store: Path, records: list[PassageRecord], encoding: str) -> dict[str, np.ndarray]:
    """For 2bit/1bit: the codebook trained on a seeded sample of the first shard's token states, written to
    STORE/codebook as `dilstore precompute` keeps it (the pipeline samples 512 documents across the corpus;
    here the first shard holds every SQuAD paragraph and the first MS MARCO passages)."""
    states = np.concatenate([record.states for record in records])  # (T, d)
    sample = states[sample_rows(len(states), CODEBOOK_SAMPLE_TOKENS)]
    codebook = train_codebook(encoding, sample, rotate=offline_kind("dilbert").rotated_codes)
    write_codebook(store / CODEBOOK_DIR, encoding, codebook, states.shape[1:])
    return codebook


def build_store(store: Path, reader: DilBertReader, passages: list[Passage], args: argparse.Namespace) -> None:
    """Encode and write the passages shard by shard, then finalize with the model's fingerprint."""
    started = time.perf_counter()
    shards = 0
    codebook = None
    for first in range(0, len(passages), args.shard_passages):
        chunk = passages[first : first + args.shard_passages]
        pieces = [piece for passage in chunk
                  for piece in tokenize_passage(reader.tokenizer, passage, args.max_length, "dilbert")]
        records = encode_tokenized(reader, "dilbert", pieces)
        if codebook is None and get_encoding(args.encoding).codebook:
            codebook = store_codebook(store, records, args.encoding)
        write_shard(store, shards, records, kind="dilbert", encoding=args.encoding, codebook=codebook)
        shards += 1
        done = first + len(chunk)
        rate = done / (time.perf_counter() - started)
        print(f"store: {done}/{len(passages)} passages ({rate:.1f}/s)", file=sys.stderr, flush=True)
    finalize(
        store,
        model_fingerprint(reader, "dilbert", args.encoding, args.max_length),
        {"command": " ".join(sys.argv), "corpus": "SQuAD dev paragraphs + MS MARCO DL19/20 pool",
         "squad_paragraphs": args.squad_paragraphs, "msmarco_passages": args.msmarco_passages},
        expected_shards=shards,
    )


def build_index(store: Path, passage_ids: list[str], work: Path) -> None:
    """STORE/bm25 over `title\\ntext` of every stored passage, folded as `dilstore index` folds it (`searched_form`:
    the NFKC form questions are searched in; unicode56 F2)."""
    collection = work / "collection"
    collection.mkdir(parents=True, exist_ok=True)
    opened = open_store(store)
    with (collection / "passages.jsonl").open("w", encoding="utf-8") as out:
        for first in range(0, len(passage_ids), 4096):
            for passage in opened.fetch(passage_ids[first : first + 4096]):
                contents = f"{passage.title}\n{passage.text}" if passage.title else passage.text
                record = {"id": passage.id, "contents": searched_form(contents)}
                out.write(json.dumps(record, ensure_ascii=False) + "\n")
    build_bm25_index(collection, bm25_index_dir(store), threads=1)


def stored_ids(store: Path) -> list[str]:
    """Every passage id of a store, shard by shard."""
    opened = open_store(store)
    return [opened.shard(entry.index).id_at(row) for entry in opened.manifest.shards for row in range(entry.passages)]


def model_description(model_dir: Path) -> dict[str, Any]:
    """The checkpoint's path, k, and (when present) its training metadata and model card title."""
    description: dict[str, Any] = {"path": str(model_dir)}
    metadata = model_dir / "dilstore.json"
    if metadata.is_file():
        description.update(json.loads(metadata.read_text()))
    card = model_dir / "MODEL_CARD.md"
    if card.is_file():
        description["model_card_title"] = card.read_text(encoding="utf-8").splitlines()[0].lstrip("# ")
    return description


def render(result: dict[str, Any]) -> str:
    """The seed's Table 2 layout: EM and F1 without/with BM25, R, per p."""
    lines = [
        f"Mini OpenSQuAD: {result['questions']} questions, {result['passages']} stored passages, "
        f"model {result['model'].get('model_card_title', result['model']['path'])} "
        f"(k={result['model'].get('layers')}, online layers {result['model'].get('online_variant') or 'its own'}), "
        f"{result['encoding']} store, mu={result['mu']}.",
        "",
        "| model | EM w/o | EM w/ | F1 w/o | F1 w/ | R |",
        "|---|---|---|---|---|---|",
    ]
    for row in result["rows"]:
        lines.append(
            f"| DilBert (p={row['top_p']}) | {row['em_without_bm25']:.1f} | {row['em_with_bm25']:.1f} | "
            f"{row['f1_without_bm25']:.1f} | {row['f1_with_bm25']:.1f} | {row['recall']:.1f} |"
        )
    return "\n".join(lines)


@one_line_errors
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", type=Path, required=True, help="folder for the store, index and collection")
    parser.add_argument(
        "--store", type=Path, help="an existing store with STORE/bm25 (skips steps 1 and 2; read, never written)"
    )
    parser.add_argument("--model", type=Path, help="reader checkpoint (default: the shipped default checkpoint)")
    parser.add_argument("--no-online-variant", action="store_true",
                        help="read a 2bit/1bit store with the checkpoint's own online layers, not its tuned ones")
    parser.add_argument("--data", type=Path, default=SHARED_DATA, help="the shared data folder")
    parser.add_argument(
        "--limit", type=positive_int, help="a seeded random subset of N questions (default: all 10,570)"
    )
    parser.add_argument("--seed", type=sample_seed, default=0, help="seed of the --limit subset (default 0)")
    parser.add_argument(
        "--top-p", type=positive_int, nargs="+", default=list(SEED_TOP_PS), help="p values (default 29 100)"
    )
    parser.add_argument("--mu", type=float, default=0.5, help="BM25 fusion weight of the 'w/' columns (default 0.5)")
    parser.add_argument("--encoding", choices=("fp32", "fp16", "int8", "2bit", "1bit"), default="fp16",
                        help="state encoding of the store (2bit/1bit: codebook trained on the first shard)")
    parser.add_argument(
        "--max-length", type=positive_int, default=384, help="stored window length in tokens (default 384)"
    )
    parser.add_argument("--shard-passages", type=positive_int, default=4096, help="passages per shard (default 4096)")
    parser.add_argument("--squad-paragraphs", type=positive_int, help="use only the first N SQuAD paragraphs (tests)")
    parser.add_argument("--msmarco-passages", type=positive_int, help="use only the first N MS MARCO passages (tests)")
    parser.add_argument("--question-batch", type=positive_int, default=8)
    parser.add_argument("--threads", type=positive_int, default=2, help="torch threads (default 2)")
    parser.add_argument("--output", type=Path, default=Path("/tmp/bench-mini-opensquad.json"))
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    check_output_file(args.output, "--output", [], args.work)  # before the evaluation, whose result it would lose
    if args.store is not None:
        refuse_output_inside_store(args.output, str(args.store), "--output")
    result = run(args)
    args.output.write_text(json.dumps(result, indent=1))
    print(render(result))
    print(json.dumps(result))
    return 0


def refuse_other_settings(store: Path, args: argparse.Namespace) -> None:
    """A DilstoreError when the store --work already holds was built with other settings than these: it was read
    as it was, so an --encoding int8 run reported the fp16 store's scores. (A store of another model is refused by
    its fingerprint when it opens.)"""
    manifest = read_manifest(StoreLocation.parse(store))
    built = {"--encoding": manifest.encoding, "--max-length": manifest.fingerprint.max_length,
             "--squad-paragraphs": manifest.creation.get("squad_paragraphs", args.squad_paragraphs),
             "--msmarco-passages": manifest.creation.get("msmarco_passages", args.msmarco_passages)}  # fmt: skip
    asked = {"--encoding": args.encoding, "--max-length": args.max_length,
             "--squad-paragraphs": args.squad_paragraphs, "--msmarco-passages": args.msmarco_passages}  # fmt: skip
    shown = {None: "all"}  # no passage count: every passage
    differ = [f"{flag} {shown.get(built[flag], built[flag])} (asked: {shown.get(asked[flag], asked[flag])})"
              for flag in built if built[flag] != asked[flag]]  # fmt: skip
    if differ:
        raise DilstoreError(f"--work {args.work} holds a store built with {', '.join(differ)}; give another --work, "
                            "or the same settings")  # fmt: skip


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Build what is missing, evaluate, and return the result document."""
    model_dir = args.model or default_checkpoint_dir()
    store = args.store or args.work / "store"
    started = time.perf_counter()
    if not (store / MANIFEST_FILE).is_file():
        if args.store:
            raise DilstoreError(f"{store} is not a finalized store")
        passages = squad_passages(args.data / "squad" / "dev-v1.1.json", args.squad_paragraphs) + msmarco_passages(
            args.data / "msmarco" / "passages.dl19-dl20-pool.jsonl", args.msmarco_passages
        )
        build_store(store, DilBertReader.from_pretrained(model_dir), passages, args)
    elif not args.store:
        refuse_other_settings(store, args)
    if not any(bm25_index_dir(store).glob("segments_*")):
        if args.store:
            raise DilstoreError(f"--store {store} has no BM25 index at {bm25_index_dir(store)}: build it with "
                                f"`dilstore index {store}`, or leave out --store to build a store and index in --work")
        build_index(store, stored_ids(store), args.work)
    build_seconds = time.perf_counter() - started
    odqa = open_reader(store, model_dir, settings=OdqaSettings(top_p=max(args.top_p), mu=args.mu),
                       online_variant=not args.no_online_variant)
    questions = seeded_subset(
        load_questions(args.data / "opensquad" / "questions.dev-v1.1.jsonl"), args.limit, args.seed
    )
    # The full question set reads for over an hour on a 2-core CPU: show the rate and the time left.
    with tqdm(total=len(questions), unit="question", file=sys.stderr) as bar:
        evaluations = evaluate_top_ps(
            odqa,
            questions,
            top_ps=args.top_p,
            mu=args.mu,
            question_batch=args.question_batch,
            on_batch=lambda done: bar.update(done - bar.n),
        )
    rows = []
    for top_p, evaluation in sorted(evaluations.items()):
        em_without, f1_without = evaluation.scores[1.0]
        em_with, f1_with = evaluation.scores[float(args.mu)]
        rows.append(
            {
                "top_p": top_p,
                "em_without_bm25": em_without,
                "em_with_bm25": em_with,
                "f1_without_bm25": f1_without,
                "f1_with_bm25": f1_with,
                "recall": evaluation.recall,
                "refused": evaluation.refused,
            }
        )
    any_run = next(iter(evaluations.values()))
    return {
        "benchmark": "mini-opensquad",
        "questions": len(questions),
        "limit": args.limit,
        "seed": args.seed,
        "passages": len(odqa.store),
        "store": str(store),
        "encoding": odqa.store.encoding,
        "model": {**model_description(Path(model_dir)), "online_variant": odqa.model.online_variant},
        "mu": args.mu,
        "threads": args.threads,
        "rows": rows,
        "build_seconds": build_seconds,
        "evaluation_seconds": any_run.seconds,
        "timings": any_run.timings.to_dict(),
    }


if __name__ == "__main__":
    sys.exit(main())
