"""Residual codes against faiss PQ with codebooks trained on held-out states (bench_codes.py trains in-sample).

bench_codes.py trains both the residual codebook and faiss PQ on the very
states they then encode (a few thousand tokens of the evaluation paragraphs),
which flatters the quantizer with more parameters: PQ with M one-byte
sub-quantizers holds 256·d float32 values (393 KB at d = 384), the residual
codebook 256·d + 2^(b+1)·d (its 256 centroids and the bucket tables: 405 KB
for 2bit; 12 KB in stores from before centroids). Here both are trained on the states of
other text and evaluated on the first --paragraphs SQuAD dev paragraphs:

1. `dilstore precompute` (fp32, shipped DilBert reader) of the first
   --train-paragraphs SQuAD *train* paragraphs (other articles than dev);
2. the 2bit/1bit codebooks (storage.encodings.train_codebook) and faiss
   ProductQuantizer (M = d/4, d/8, 8 bits) and the bench_codes.VARIANTS
   (least-squares scales, k-means centroid residual codes) on the same seeded
   sample of those states (storage.residual_codes.sample_rows, at most 65,536 tokens);
3. 2bit/1bit stores of the evaluation paragraphs with `--codebook` (the
   held-out codebooks), an fp32 store of them for reference and for PQ;
4. relative MSE and cosine against fp32, SQuAD F1 through the reader
   (bench_codes.through_reader: each question against its own paragraph, μ = 1),
   and the decode time of 100 passages against the read.

    .venv/bin/python benchmarks/bench_codes_heldout.py --work /tmp/bench-heldout --paragraphs 60 \\
        --train-paragraphs 240 --threads 1 --output /tmp/bench-heldout.json

The training paragraphs must hold bench_codes.MIN_SAMPLE_TOKENS tokens (4096): fewer
stop with a usage error right after their fp32 store, before the evaluation stores.
Prints a table and the JSON; --output gets the JSON after every stage
(`"complete": false` until the last), so a run that fails keeps what it measured.
"""

from __future__ import annotations

import functools
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from dilstore.runners.arg_types import positive_int

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_codes import (  # noqa: E402
    errors,
    parse_arguments,
    pq_through_reader,
    precompute,
    print_table,
    require_sample_tokens,
    save_json,
    squad_subset,
    through_reader,
    variants_through_reader,
)

SQUAD = Path(__file__).resolve().parents[1] / "../shared/data/squad"


def store_ids(store: Path) -> tuple[list[str], list[str]]:
    """The passage ids of a store's passage tables and their doc ids, in store order."""
    table = pa.concat_tables([pq.read_table(part) for part in sorted((store / "passages").glob("*.parquet"))])
    return table.column("id").to_pylist(), table.column("doc_id").to_pylist()


def write_heldout_codebook(folder: Path, encoding: str, sample: np.ndarray) -> tuple[Path, float]:
    """The `encoding` codebook trained on the held-out `sample` (T, d), written to `folder` with its sample size;
    the folder and the training seconds.

    Without the count, `precompute --codebook` took the codebook for one written before counts were recorded and,
    when k-means left fewer than 256 distinct centroids, refused it as trained on that few states: the run stopped
    in a CalledProcessError traceback after the train and fp32 stores were built (bench53 F9).
    """
    from dilstore.storage.codebook import write_codebook
    from dilstore.storage.encodings import train_codebook

    started = time.perf_counter()
    codebook = train_codebook(encoding, sample)
    trained = time.perf_counter() - started
    return write_codebook(folder, encoding, codebook, sample.shape[1:], sample_tokens=len(sample)), trained


def main() -> None:
    parser, args = parse_arguments(
        __doc__, 1, lambda parser: parser.add_argument("--train-paragraphs", type=positive_int, default=240)
    )

    from dilstore.reader.serving.odqa import open_reader
    from dilstore.storage.residual_codes import CODEBOOK_SAMPLE_TOKENS, sample_rows

    train_corpus, eval_corpus = args.work / "train-subset.json", args.work / "eval-subset.json"
    squad_subset(SQUAD / "train-v1.1.json", args.train_paragraphs, train_corpus)
    questions = squad_subset(SQUAD / "dev-v1.1.json", args.paragraphs, eval_corpus)

    precompute(train_corpus, args.work / "train-fp32", "fp32", args.threads)
    train_ids, _ = store_ids(args.work / "train-fp32")
    train_reader = open_reader(args.work / "train-fp32", with_index=False)
    train_states = np.concatenate([p.states for p in train_reader.store.fetch(train_ids)]).astype(np.float32)
    require_sample_tokens(parser, "--train-paragraphs", args.train_paragraphs, len(train_states))
    sample = np.ascontiguousarray(train_states[sample_rows(len(train_states), CODEBOOK_SAMPLE_TOKENS)])
    results: dict[str, Any] = {"paragraphs": args.paragraphs, "questions": len(questions),
                               "train_paragraphs": args.train_paragraphs, "train_tokens": len(train_states),
                               "sample_tokens": len(sample), "threads": args.threads, "complete": False,
                               "methods": {}}  # fmt: skip
    save = functools.partial(save_json, results, args.output)

    precompute(eval_corpus, args.work / "fp32", "fp32", args.threads)
    ids, doc_ids = store_ids(args.work / "fp32")
    by_doc: dict[str, list[str]] = {}
    for passage_id, doc_id in zip(ids, doc_ids, strict=True):
        by_doc.setdefault(doc_id, []).append(passage_id)
    fp32 = open_reader(args.work / "fp32", with_index=False)
    reference = np.concatenate([p.states for p in fp32.store.fetch(ids)]).astype(np.float32)
    results["eval_tokens"] = len(reference)
    results["methods"]["fp32"] = through_reader(fp32, questions, by_doc, ids)
    save()

    for encoding in ("2bit", "1bit"):
        folder, trained = write_heldout_codebook(args.work / f"codebook-{encoding}", encoding, sample)
        store = args.work / encoding
        precompute(eval_corpus, store, encoding, args.threads, "--codebook", str(folder))
        reader = open_reader(store, with_index=False)
        decoded = np.concatenate([p.states for p in reader.store.fetch(ids)]).astype(np.float32)
        results["methods"][encoding] = {"train_s": trained, **errors(reference, decoded),
                                        **through_reader(reader, questions, by_doc, ids)}
        save()
        print(f"{encoding}: done", file=sys.stderr, flush=True)

    pq_through_reader(sample, reference, fp32, questions, by_doc, ids, results["methods"], save)
    variants_through_reader(sample, reference, fp32, questions, by_doc, ids, results["methods"], save)
    results["complete"] = True
    save()
    print_table(results["methods"])
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
