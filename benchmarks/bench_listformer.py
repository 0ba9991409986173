"""Listformer speed and memory on CPU (seed 003, Table 4.3's protocol): rerank 100 documents for one query.

Four rankers over the same query and documents, all with all-MiniLM-L6-v2's
dimensions (6 layers, hidden 384, 12 heads) and RANDOM weights: speed and
memory only, the scores mean nothing.

- plain Listformer (k = 0): the query and all documents through 6 global-local layers in one pass;
- delayed Listformer (k = --delayed-layers, default 4): the documents' layers 1..k are precomputed
  (as `precompute --kind listformer` stores them; held in memory here, not read from a store), so
  per query only the query's layers 1..k and the 6 − k global-local layers over the list run;
- the same with the bi-encoder prior (the shipped kind): the documents' prior vectors are
  precomputed too, and per query the frozen base encoder also runs over the query;
- pointwise cross-encoder: every `[CLS] q [SEP] d [SEP]` pair through all 6 layers, in batches
  of --batch pairs (the thesis's pointwise BERT);
- pairwise (duoBERT-style): every ordered document pair as `[CLS] q [SEP] d_i [SEP] d_j [SEP]`
  through all 6 layers and a score head, D·(D − 1) inputs in batches of --batch, each document's
  score the sum of its pairs' (the thesis extrapolated this one from the pointwise time; here it
  is run, once: at 100 documents that is 9,900 inputs).

--rankers picks which rows run (default all); --no-memory skips the memory curve.

Inputs: a `[CLS] q [SEP]` query of 16 tokens and `d [SEP]` documents of --doc-tokens (128)
random word pieces. Time: the median of --repeats runs after one warm-up, with --threads torch
threads, under torch.inference_mode.

Memory: peak resident memory added by one plain (and one delayed) Listformer forward over lists
of 10, 25, 50 and 100 documents (--list-lengths), each measured in a fresh subprocess: the kernel's peak-RSS mark
is reset (/proc/self/clear_refs) after the model and inputs exist, and VmHWM − VmRSS read after
the forward. Beside it, the attention scores per head and layer that the blocked attention
computes, D·n·(n + nq + D) + nq·(nq + D·n), against the N² of a dense list of
N = nq + D·n tokens (computed, not run: the dense list at 100 documents would need
12 heads × 12,816² × 4 bytes ≈ 7.9 GB per layer).

    .venv/bin/python benchmarks/bench_listformer.py --threads 1 --json-out /tmp/bench-listformer.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import torch
from transformers import AutoConfig, AutoTokenizer, BertConfig, PreTrainedTokenizerBase

from dilstore.reader.modeling import listformer
from dilstore.reader.modeling.checkpoints import base_model_dir
from dilstore.reader.modeling.cross_encoder import DOCUMENT_SEGMENT, CrossEncoderRanker
from dilstore.reader.modeling.listformer import ListformerConfig, ListformerRanker
from dilstore.runners.arg_types import non_negative_int, positive_int
from dilstore.runners.outputs import check_output_option

QUERY_TOKENS = 16
LIST_LENGTHS = (10, 25, 50, 100)
FIRST_WORD = 1000  # random word pieces come from [FIRST_WORD, vocab): no special tokens
RANKERS = {
    "listformer": "listformer (k=0)",
    "delayed": "delayed listformer (k={k})",
    "delayed-prior": "delayed listformer (k={k}, prior)",
    "cross-encoder": "cross-encoder (pointwise)",
    "pairwise": "pairwise (duoBERT-style, 1 run)",
}
WEIGHTS = "all-MiniLM-L6-v2 dimensions (6 layers, hidden 384, 12 heads), RANDOM weights (speed and memory only)"


def minilm_shape() -> tuple[BertConfig, PreTrainedTokenizerBase]:
    """The packaged all-MiniLM-L6-v2's config and tokenizer; the rankers built from them get random weights."""
    directory = base_model_dir()
    return AutoConfig.from_pretrained(directory, local_files_only=True), AutoTokenizer.from_pretrained(directory)


def random_inputs(
    tokenizer: PreTrainedTokenizerBase, documents: int, doc_tokens: int, seed: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """A `[CLS] q [SEP]` query (1, 16) and `d [SEP]` documents (D, doc_tokens) of random word pieces."""
    generator = torch.Generator().manual_seed(seed)
    vocab = tokenizer.vocab_size
    words = torch.randint(FIRST_WORD, vocab, (QUERY_TOKENS - 2,), generator=generator)
    query = torch.cat([torch.tensor([tokenizer.cls_token_id]), words, torch.tensor([tokenizer.sep_token_id])])[None]
    docs = torch.randint(FIRST_WORD, vocab, (documents, doc_tokens), generator=generator)
    docs[:, -1] = tokenizer.sep_token_id
    return query, docs  # (1, nq), (D, n)


def listformer_pass(ranker: ListformerRanker, query: torch.Tensor, docs: torch.Tensor) -> Callable[[], torch.Tensor]:
    """One query's online work: all layers (k = 0) or, over precomputed document states, the layers after k."""
    query_mask = torch.ones_like(query)  # (1, nq)
    doc_mask = torch.ones_like(docs)[None]  # (1, D, n)
    with torch.inference_mode():
        stored = ranker.encode_documents(docs, doc_mask[0])[None]  # (1, D, n, d): offline, not timed
        doc_vectors = ranker.document_vectors(docs, doc_mask[0])[None] if ranker.prior else None  # (1, D, d)

    def run() -> torch.Tensor:
        if ranker.delayed_layers == 0:
            return ranker(query, query_mask, docs[None], doc_mask)  # (1, D)
        query_states = ranker.encode_queries(query, query_mask)  # (1, nq, d)
        if doc_vectors is None:
            return ranker.score_lists(query_states, query_mask, stored, doc_mask)  # (1, D)
        query_vectors = ranker.query_vectors(query, query_mask)  # (1, d)
        return ranker.score_lists(query_states, query_mask, stored, doc_mask, query_vectors, doc_vectors)  # (1, D)

    return run


def cross_encoder_pass(
    ranker: CrossEncoderRanker, query: torch.Tensor, docs: torch.Tensor, batch: int
) -> Callable[[], torch.Tensor]:
    """Every (query, document) pair through all layers, `batch` pairs at a time."""
    pairs = torch.cat([query.expand(docs.shape[0], -1), docs], dim=1)  # (D, nq + n)
    segments = torch.cat(
        [torch.zeros_like(query).expand(docs.shape[0], -1), torch.full_like(docs, DOCUMENT_SEGMENT)], dim=1
    )  # (D, nq + n)
    mask = torch.ones_like(pairs)  # (D, nq + n)

    def run() -> torch.Tensor:
        return torch.cat(
            [
                ranker(pairs[i : i + batch], segments[i : i + batch], mask[i : i + batch])
                for i in range(0, len(pairs), batch)
            ]
        )  # (D,)

    return run


def pairwise_pass(
    ranker: CrossEncoderRanker, query: torch.Tensor, docs: torch.Tensor, batch: int
) -> Callable[[], torch.Tensor]:
    """Every ordered pair (d_i, d_j), i ≠ j, with the query through all layers, `batch` inputs at a time.

    Each document's score is the sum of its pairs' scores; the pair tensors
    are built per batch, so memory stays that of one batch.
    """
    count = docs.shape[0]
    first, second = (
        index.flatten() for index in torch.meshgrid(torch.arange(count), torch.arange(count), indexing="ij")
    )
    keep = first != second
    first, second = first[keep], second[keep]  # (D·(D − 1),)
    query_segment = torch.zeros_like(query[0])  # (nq,)
    doc_segment = torch.full((2 * docs.shape[1],), DOCUMENT_SEGMENT)  # (2n,)
    segments = torch.cat([query_segment, doc_segment])  # (nq + 2n,)

    def run() -> torch.Tensor:
        scores = torch.zeros(count)  # (D,)
        for start in range(0, len(first), batch):
            i, j = first[start : start + batch], second[start : start + batch]  # (b,)
            pairs = torch.cat([query.expand(len(i), -1), docs[i], docs[j]], dim=1)  # (b, nq + 2n)
            batch_segments = segments.expand(len(i), -1)  # (b, nq + 2n)
            scores.index_add_(0, i, ranker(pairs, batch_segments, torch.ones_like(pairs)))  # (b,) into (D,)
        return scores

    return run


def timed_once(run: Callable[[], torch.Tensor]) -> float:
    """The wall time of one run under inference_mode (for a row too long to repeat)."""
    with torch.inference_mode():
        started = time.perf_counter()
        run()
        return time.perf_counter() - started


def median_seconds(run: Callable[[], torch.Tensor], repeats: int) -> float:
    """The median wall time of `repeats` runs after one warm-up, under inference_mode."""
    with torch.inference_mode():
        run()
        times = []
        for _ in range(repeats):
            started = time.perf_counter()
            run()
            times.append(time.perf_counter() - started)
    return statistics.median(times)


def attention_scores(documents: int, doc_tokens: int) -> dict[str, int]:
    """Attention scores per head and layer: blocked global-local, and a dense list of N tokens."""
    n, nq, count = doc_tokens, QUERY_TOKENS, documents
    blocked = count * n * (n + nq + count) + nq * (nq + count * n)  # documents (separators too); the query
    dense = (nq + count * n) ** 2
    return {"blocked": blocked, "dense": dense}


def memory_point(documents: int, doc_tokens: int, delayed_layers: int, threads: int) -> dict[str, float]:
    """In this process: the peak RSS one Listformer forward adds over a list of `documents` (MiB)."""
    torch.set_num_threads(threads)
    config, tokenizer = minilm_shape()
    torch.manual_seed(0)
    ranker = ListformerRanker(config, tokenizer, ListformerConfig(delayed_layers)).eval()
    query, docs = random_inputs(tokenizer, documents, doc_tokens)
    run = listformer_pass(ranker, query, docs)
    with open("/proc/self/clear_refs", "w", encoding="ascii") as marks:
        marks.write("5")  # reset VmHWM, the peak resident set, to the current resident set
    before = _status_kib("VmRSS")
    with torch.inference_mode():
        run()
    return {"peak_mib": (_status_kib("VmHWM") - before) / 1024}


def _status_kib(field: str) -> int:
    """A kB field of /proc/self/status."""
    with open("/proc/self/status", encoding="ascii") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}")


def measured_memory(documents: int, doc_tokens: int, delayed_layers: int, threads: int) -> float:
    """memory_point in a fresh subprocess, so nothing freed by an earlier point hides this one's peak."""
    output = subprocess.run(
        [sys.executable, __file__, "--memory-point", str(documents), "--doc-tokens", str(doc_tokens),
         "--delayed-layers", str(delayed_layers), "--threads", str(threads),
         "--local-block-keys", str(listformer.LOCAL_BLOCK_KEYS)],
        check=True, capture_output=True, text=True,
    ).stdout  # fmt: skip
    return json.loads(output.strip().splitlines()[-1])["peak_mib"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--documents", type=positive_int, default=100, help="documents reranked per query (default 100)"
    )
    parser.add_argument(
        "--doc-tokens", type=positive_int, default=128, help="tokens per document, [SEP] included (128)"
    )
    parser.add_argument(
        "--delayed-layers", type=non_negative_int, default=4, help="k of the delayed Listformer (default 4)"
    )
    parser.add_argument("--batch", type=positive_int, default=100, help="cross-encoder pairs per batch (default 100)")
    parser.add_argument(
        "--repeats", type=positive_int, default=3, help="timed runs per ranker after a warm-up (default 3)"
    )
    parser.add_argument("--threads", type=positive_int, default=1, help="torch threads (default 1)")
    parser.add_argument("--rankers", nargs="+", choices=RANKERS, default=list(RANKERS), help="rows to run (all)")
    parser.add_argument("--no-memory", action="store_true", help="skip the list-length memory curve")
    parser.add_argument("--list-lengths", type=positive_int, nargs="+", default=list(LIST_LENGTHS),
                        help="documents per list on the memory curve (default 10 25 50 100)")
    parser.add_argument("--json-out", help="also write the results as JSON here")
    parser.add_argument("--local-block-keys", type=positive_int, default=listformer.LOCAL_BLOCK_KEYS,
                        help="key rows per block of the local attention (default %(default)s; 1000000000000: the "
                             "whole list in one block, as before blocks)")  # fmt: skip
    parser.add_argument("--memory-point", type=positive_int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    check_output_option(parser, args.json_out, "--json-out")
    listformer.LOCAL_BLOCK_KEYS = args.local_block_keys
    if args.memory_point is not None:
        print(json.dumps(memory_point(args.memory_point, args.doc_tokens, args.delayed_layers, args.threads)))
        return

    torch.set_num_threads(args.threads)
    config, tokenizer = minilm_shape()
    query, docs = random_inputs(tokenizer, args.documents, args.doc_tokens)
    torch.manual_seed(0)
    build: dict[str, Callable[[], Callable[[], torch.Tensor]]] = {
        "listformer": lambda: listformer_pass(ListformerRanker(config, tokenizer).eval(), query, docs),
        "delayed": lambda: listformer_pass(
            ListformerRanker(config, tokenizer, ListformerConfig(args.delayed_layers)).eval(), query, docs
        ),
        "delayed-prior": lambda: listformer_pass(
            ListformerRanker(config, tokenizer, ListformerConfig(args.delayed_layers, prior=True)).eval(), query, docs
        ),
        "cross-encoder": lambda: cross_encoder_pass(
            CrossEncoderRanker(config, tokenizer).eval(), query, docs, args.batch
        ),
        "pairwise": lambda: pairwise_pass(CrossEncoderRanker(config, tokenizer).eval(), query, docs, args.batch),
    }
    speed = {}
    for name in args.rankers:
        label = RANKERS[name].format(k=args.delayed_layers)
        # The pairwise row runs D·(D − 1) inputs: one timed run, no warm-up.
        speed[label] = timed_once(build[name]()) if name == "pairwise" else median_seconds(build[name](), args.repeats)
    memory = [] if args.no_memory else [
        {
            "documents": count,
            "tokens": QUERY_TOKENS + count * args.doc_tokens,
            "listformer_peak_mib": measured_memory(count, args.doc_tokens, 0, args.threads),
            "delayed_peak_mib": measured_memory(count, args.doc_tokens, args.delayed_layers, args.threads),
            "attention_scores_per_head": attention_scores(count, args.doc_tokens),
        }
        for count in args.list_lengths
    ]
    result: dict[str, Any] = {
        "weights": WEIGHTS,
        "device": f"CPU, {args.threads} torch thread(s)",
        "documents": args.documents,
        "doc_tokens": args.doc_tokens,
        "local_block_keys": args.local_block_keys,
        "query_tokens": QUERY_TOKENS,
        "seconds_per_query": speed,
        "memory": memory,
    }
    print(f"Rerank {args.documents} documents of {args.doc_tokens} tokens for one {QUERY_TOKENS}-token query "
          f"({result['device']}; {WEIGHTS})")  # fmt: skip
    print(f"{'ranker':<32} {'s/query':>8}")
    for name, seconds in speed.items():
        print(f"{name:<32} {seconds:>8.2f}")
    if memory:  # --no-memory measures none: no table rather than a header over nothing
        print()
        print(f"{'documents':>9} {'tokens':>7} {'peak MiB k=0':>13} {'peak MiB k=' + str(args.delayed_layers):>13} "
              f"{'blocked scores':>15} {'dense scores':>13}")  # fmt: skip
        for row in memory:
            scores = row["attention_scores_per_head"]
            print(f"{row['documents']:>9} {row['tokens']:>7} {row['listformer_peak_mib']:>13.1f} "
                  f"{row['delayed_peak_mib']:>13.1f} {scores['blocked']:>15,} {scores['dense']:>13,}")  # fmt: skip
    print(json.dumps(result))
    if args.json_out:
        with open(args.json_out, "w", encoding="utf-8") as handle:
            json.dump(result, handle, indent=1)


if __name__ == "__main__":
    main()
