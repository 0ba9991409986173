"""EARL speed, the seed's Table 3 protocol: seconds to rank 1,000 candidates for one query, on CPU.

A cross-encoder (all-MiniLM-L6-v2 over `[CLS] q [SEP] d [SEP]`, every pair
through all 6 layers) against EARL reading its precomputed documents from a
real store: S1 (document-module states; the judger blocks project them to
keys and values online) and S2 (the judger blocks' keys and values
themselves). The EARL side is what `dilstore rerank` runs per query: the
query module once, the store fetch (memory-mapped; fp16 cast to fp32) and
the judger blocks over all 1,000 pairs (reader/serving/rerank.py's EarlReranker).

- Documents: `[CLS] d [SEP]` of exactly L tokens (L = 128, 256, 512), cut
  from SQuAD dev paragraphs run together; --unique distinct documents are
  encoded and stored under 1,000 ids (the seed's "reuse candidates").
- Query: a SQuAD dev question cut to 16 tokens, `[CLS] q [SEP]` included.
- The cross-encoder reads the same query and the same word pieces, cut so the
  pair fits the model's 512 positions (at L = 512 the pair is 512 tokens,
  the document 497 of them).
- Weights (--size): "minilm" is all-MiniLM-L6-v2 with base-initialised,
  UNTRAINED judger blocks and score heads (N = 4 query layers, M = 2 judger
  blocks); "bert-base" has the seed's BERT-base dimensions (12 layers,
  hidden 768, N = 10, M = 2) with RANDOM weights. Speed only: the scores
  mean nothing.
- Timing: the median of --repeats runs after one warm-up (EARL), and of
  --cross-repeats runs (the cross-encoder, which takes minutes); torch uses
  --threads threads. Batches: --batch pairs for the cross-encoder, the
  reranker's default token budget for EARL.

    .venv/bin/python benchmarks/bench_earl_speed.py --work /tmp/earl-speed --threads 2 \
        --json-out /tmp/earl-speed.json [--size bert-base --lengths 128]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from random_models import write_random_bert_base
from script_errors import one_line_errors
from transformers import BertModel

from dilstore.reader.batching import pad_id, pad_token_ids
from dilstore.reader.modeling.checkpoints import base_model_dir
from dilstore.reader.modeling.cross_encoder import CrossEncoderRanker
from dilstore.reader.modeling.earl import EarlRanker
from dilstore.reader.modeling.fingerprint import model_fingerprint
from dilstore.reader.serving.rerank import EarlReranker, RerankSettings, RerankStats
from dilstore.reader.text.files import read_json
from dilstore.reader.text.tokenization import encode_document, encode_question
from dilstore.runners.arg_types import positive_int
from dilstore.runners.outputs import check_output_file
from dilstore.storage.finalize import finalize
from dilstore.storage.reader import open_store
from dilstore.storage.records import PassageRecord
from dilstore.storage.writer import write_shard

SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
QUERY_TOKENS = 16
MAX_POSITIONS = 512
SIZES = {
    "minilm": "all-MiniLM-L6-v2, judger blocks and score heads base-initialised and UNTRAINED (speed only)",
    "bert-base": "BERT-base dimensions (12 layers, hidden 768), RANDOM weights (speed only)",
}


def dev_text_and_question(data: Path) -> tuple[str, str]:
    """All SQuAD dev paragraphs run together, and the first dev question of at least 16 tokens' worth of words."""
    articles = read_json(data / "squad" / "dev-v1.1.json")["data"]
    paragraphs = [paragraph for article in articles for paragraph in article["paragraphs"]]
    question = next(qa["question"] for p in paragraphs for qa in p["qas"] if len(qa["question"].split()) >= 16)
    return " ".join(paragraph["context"] for paragraph in paragraphs), question


def documents(ranker: EarlRanker, text: str, length: int, unique: int) -> list[PassageRecord]:
    """`unique` documents of exactly `length` tokens from consecutive stretches of `text`, states not yet filled."""
    words = text.split()
    records = []
    start = 0
    while len(records) < unique:
        chunk = " ".join(words[start : start + length])
        tokens = encode_document(ranker.tokenizer, chunk, length)
        start += length
        if len(tokens.token_ids) != length:
            continue
        records.append(
            PassageRecord(
                id=f"doc-{len(records)}", title="", text=chunk, token_ids=tokens.token_ids,
                char_spans=tokens.char_spans, states=np.zeros((length, 1), np.float32),
            )
        )
    return records


def encode(ranker: EarlRanker, records: list[PassageRecord], kind: str, batch: int) -> list[np.ndarray]:
    """S1 states (n, d) or S2 keys and values (n, M, 2, d) of each document, float32."""
    outputs = []
    with torch.inference_mode():
        for first in range(0, len(records), batch):
            ids = torch.from_numpy(np.stack([r.token_ids for r in records[first : first + batch]]).astype(np.int64))
            mask = torch.ones_like(ids)  # (b, n)
            states = ranker.encode_documents(ids, mask)  # (b, n, d)
            if kind == "earl-s2":
                states = ranker.document_key_values(states)  # (b, n, M, 2, d)
            outputs.extend(states.float().numpy())
    return outputs


def build_store(
    directory: Path, ranker: EarlRanker, records: list[PassageRecord], kind: str, candidates: int, encoding: str
) -> None:
    """A finalized one-shard store of `candidates` ids, reusing the encoded documents in turn."""
    if (directory / "manifest.json").exists():
        return
    states = encode(ranker, records, kind, batch=16)
    stored = [
        PassageRecord(
            id=f"cand-{index:05d}", title="", text=records[index % len(records)].text,
            token_ids=records[index % len(records)].token_ids, char_spans=records[index % len(records)].char_spans,
            states=states[index % len(records)],
        )
        for index in range(candidates)
    ]
    write_shard(directory, 0, stored, kind=kind, encoding=encoding, durable=False)
    finalize(directory, model_fingerprint(ranker, kind, encoding, MAX_POSITIONS))


def store_folder(args: argparse.Namespace, kind: str, length: int) -> Path:
    """The store of one kind and length in --work, named by every setting its contents depend on.

    A store already there is reused, so a name without --candidates and --unique gave a rerun with more candidates
    a store short of ids (a traceback after the stores were built) and one with another --unique the EARL side
    reading other documents than the cross-encoder (bench53 F2).
    """
    return args.work / f"{args.size}-{kind}-{length}-{args.encoding}-{args.candidates}c-{args.unique}u"


def time_earl(reranker: EarlReranker, query: str, ids: list[str], repeats: int) -> dict[str, float]:
    """Median seconds of `rerank(query, ids)` over `repeats` runs after a warm-up, with its stage times."""
    reranker.rerank(query, ids)
    runs = []
    for _ in range(repeats):
        stats = RerankStats()
        reranker.rerank(query, ids, stats=stats)
        runs.append(stats)
    best = sorted(runs, key=lambda stats: stats.seconds)[len(runs) // 2]
    return {"seconds": best.seconds, **best.to_dict()["timings"]}


def time_cross(
    model: CrossEncoderRanker, query_ids: np.ndarray, records: list[PassageRecord], candidates: int, batch: int,
    repeats: int,
) -> float:
    """Median seconds to score `candidates` (query, document) pairs with the cross-encoder."""
    room = MAX_POSITIONS - len(query_ids)
    pairs = []
    for index in range(candidates):
        document = records[index % len(records)].token_ids[1:]  # `d [SEP]`: drop EARL's [CLS]
        if len(document) > room:
            document = np.concatenate([document[: room - 1], document[-1:]])  # keep the closing [SEP]
        pairs.append((np.concatenate([query_ids, document]), len(query_ids)))
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        with torch.inference_mode():
            for first in range(0, candidates, batch):
                chunk = pairs[first : first + batch]
                ids, mask = pad_token_ids([pair for pair, _ in chunk], pad_id(model.tokenizer))  # (b, L) each
                segments = torch.zeros_like(ids)  # (b, L)
                for row, (_, query_length) in enumerate(chunk):
                    segments[row, query_length:] = 1
                model(ids, segments, mask)  # (b,)
        times.append(time.perf_counter() - started)
    return statistics.median(times)


@one_line_errors
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, required=True, help="folder for the S1 and S2 stores")
    parser.add_argument("--data", type=Path, default=SHARED_DATA, help="the shared data folder")
    parser.add_argument("--lengths", type=positive_int, nargs="+", default=[128, 256, 512])
    parser.add_argument("--candidates", type=positive_int, default=1000)
    parser.add_argument("--unique", type=positive_int, default=100, help="distinct documents per length (default 100)")
    parser.add_argument("--encoding", choices=("fp32", "fp16", "int8"), default="fp16")
    parser.add_argument("--repeats", type=positive_int, default=3)
    parser.add_argument("--cross-repeats", type=positive_int, default=1)
    parser.add_argument("--batch", type=positive_int, default=32, help="cross-encoder pairs per batch (default 32)")
    parser.add_argument("--threads", type=positive_int, default=2)
    parser.add_argument("--size", choices=SIZES, default="minilm", help="model dimensions (default minilm)")
    parser.add_argument("--json-out", type=Path, default=Path("/tmp/bench-earl-speed.json"))
    args = parser.parse_args(argv)
    check_output_file(args.json_out, "--json-out", [])  # before the run, whose result it would lose
    result = run(args)
    args.json_out.write_text(json.dumps(result, indent=1), encoding="utf-8")
    print(json.dumps(result))
    return 0


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Build the stores that are missing, time both sides per length, print the rows and table; the result."""
    torch.set_num_threads(args.threads)
    text, question = dev_text_and_question(args.data)  # a missing --data stops the run before the models load
    if args.size == "minilm":
        base = base_model_dir()
    else:
        base = write_random_bert_base(args.work / "bert-base-random", BertModel)
    earl = EarlRanker.from_base(base).eval()  # N = l - 2, M = 2
    cross = CrossEncoderRanker.from_base(base).eval()
    query_ids = encode_question(earl.tokenizer, question, QUERY_TOKENS).token_ids
    settings = RerankSettings(max_query_length=QUERY_TOKENS)
    ids = [f"cand-{index:05d}" for index in range(args.candidates)]

    rows: list[dict[str, Any]] = []
    for length in args.lengths:
        records = documents(earl, text, length, args.unique)
        row: dict[str, Any] = {"length": length, "query_tokens": len(query_ids), "candidates": args.candidates}
        for kind in ("earl-s1", "earl-s2"):
            store_dir = store_folder(args, kind, length)
            build_store(store_dir, earl, records, kind, args.candidates, args.encoding)
            reranker = EarlReranker(earl, open_store(store_dir), settings)
            row[kind] = time_earl(reranker, question, ids, args.repeats)
        row["cross_encoder"] = time_cross(cross, query_ids, records, args.candidates, args.batch, args.cross_repeats)
        for kind in ("earl-s1", "earl-s2"):
            row[f"speedup_{kind}"] = row["cross_encoder"] / row[kind]["seconds"]
        rows.append(row)
        print(json.dumps(row), flush=True)

    print(f"\nSeconds per query, 1 query x {args.candidates} candidates ({SIZES[args.size]})")
    print(
        "| doc tokens | cross-encoder | EARL S1 | EARL S2 | S1 speedup | S2 speedup | S1 store read | S2 store read |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for row in rows:
        s1, s2 = row["earl-s1"], row["earl-s2"]
        print(
            f"| {row['length']} | {row['cross_encoder']:.2f} | {s1['seconds']:.3f} | {s2['seconds']:.3f} "
            f"| ×{row['speedup_earl-s1']:.1f} | ×{row['speedup_earl-s2']:.1f} "
            f"| {s1['store_read']:.3f} | {s2['store_read']:.3f} |"
        )
    return {"size": args.size, "weights": SIZES[args.size], "query_layers": earl.query_layers,
            "judger_blocks": earl.judger_blocks, "threads": args.threads, "encoding": args.encoding,
            "unique": args.unique, "rows": rows}  # fmt: skip


if __name__ == "__main__":
    raise SystemExit(main())
