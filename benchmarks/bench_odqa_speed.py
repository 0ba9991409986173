"""Seed 002's Table 1 through the store: q questions × p passages, the full model against DilBert k=l−2 and k=l−1.

What is timed, per model size:

- **Full model** (the seed's "Bert" column): every (question, passage) pair
  through the embeddings and all l layers plus the QA head (the model core's
  forward at k = 0), from token ids, in the same length-bucketed batches the
  reader uses. Its total is its I Q-P.
- **DilBert k** (k = l−2 and l−1), end to end through a store, once per encoding:
  - NI Q: layers 1..k over the q questions (online, once per question);
  - NI P: layers 1..k over the p passages: offline in dilstore (precompute),
    listed because the seed's total includes it;
  - store read: fetching the p passages' layer-k states from a store of that
    encoding (fp16: memory-mapped views; int8: dequantized), after one warm-up
    fetch, so the page cache is warm, as on a serving machine;
  - I Q-P: the reader's interaction stage (OpenDomainReader): assembling each
    padded batch from the stored states, layers k+1..l and the QA head.
  - online total = NI Q + store read + I Q-P; the seed's total = NI Q + NI P + I Q-P.
- Speedup = full-model total / DilBert online total; target 0.9 · l / (l − k).

I Q-P is measured over the first `--measure-questions` questions × all p
passages. When that is fewer than q, the q×p figures are the measured time
per pair times q·p and are marked "extrapolated" in the table and the JSON;
NI Q, NI P and store read are always measured over all q and p.

Sizes: "minilm" is all-MiniLM-L6-v2 (6 layers, hidden 384; real encoder
weights, untrained QA head: speed only); "bert-base" has BERT-base dimensions
(12 layers, hidden 768, 12 heads, FFN 3072) with RANDOM weights: speed only.
Inputs: the first q OpenSQuAD dev questions, and the first 100 words of the
first p SQuAD dev paragraphs (the seed's 100-word passages).

    .venv/bin/python benchmarks/bench_odqa_speed.py --q 100 --p 100 --measure-questions 4 --threads 2
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from random_models import write_random_bert_base
from transformers import BertForQuestionAnswering

from dilstore.pipelines.passages import Passage
from dilstore.reader.batching import BatchPolicy, length_batches, pad_id, pad_token_ids
from dilstore.reader.data.squad import load_open_questions, load_squad
from dilstore.reader.modeling.checkpoints import base_model_dir
from dilstore.reader.modeling.dilbert import DilBertReader
from dilstore.reader.modeling.fingerprint import model_fingerprint
from dilstore.reader.offline.encoding import encode_tokenized, tokenize_passage
from dilstore.reader.serving.odqa import OdqaSettings, OpenDomainReader
from dilstore.reader.text.tokenization import encode_question
from dilstore.runners.arg_types import positive_int
from dilstore.runners.outputs import check_output_option
from dilstore.storage.finalize import finalize
from dilstore.storage.reader import open_store
from dilstore.storage.writer import write_shard

SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
PASSAGE_WORDS = 100
MAX_LENGTH = 384
QUESTION_LENGTH = 64
SIZES = ("minilm", "bert-base")


@dataclass(frozen=True)
class Inputs:
    questions: list[str]
    passages: list[Passage]


def load_inputs(data: Path, q: int, p: int) -> Inputs:
    """The first q OpenSQuAD dev questions and the first 100 words of the first p SQuAD dev paragraphs."""
    questions = [item.question for item in load_open_questions(data / "opensquad" / "questions.dev-v1.1.jsonl")[:q]]
    contexts = list(dict.fromkeys(example.context for example in load_squad(data / "squad" / "dev-v1.1.json")))[:p]
    passages = [
        Passage(f"squad-dev#{i}", f"squad-dev-{i}", "", " ".join(context.split()[:PASSAGE_WORDS]))
        for i, context in enumerate(contexts)
    ]
    if len(questions) < q or len(passages) < p:
        raise SystemExit(f"the data has only {len(questions)} questions and {len(passages)} paragraphs")
    return Inputs(questions, passages)


def build_full_model(size: str, work: Path) -> tuple[DilBertReader, str]:
    """The size's model at k = 0 (the full model) and its label."""
    base = base_model_dir()
    if size == "minilm":
        return DilBertReader.from_pretrained(base, layers=0), "all-MiniLM-L6-v2 (real weights, QA head untrained)"
    directory = write_random_bert_base(work / "bert-base-random", BertForQuestionAnswering)
    return DilBertReader.from_pretrained(directory, layers=0), "BERT-base dimensions, RANDOM weights (speed only)"


def at_layers(full: DilBertReader, k: int) -> DilBertReader:
    """The same network split at k (shares the weights)."""
    return DilBertReader(full.model, full.tokenizer, k).eval()


def pair_batches(question_lengths: list[int], passage_lengths: list[int], policy: BatchPolicy) -> list[list[tuple]]:
    """All (question, passage) index pairs cut into the reader's length-bucketed batches."""
    pairs = [(qi, pi) for qi in range(len(question_lengths)) for pi in range(len(passage_lengths))]
    lengths = [question_lengths[qi] + passage_lengths[pi] for qi, pi in pairs]
    return [[pairs[index] for index in batch] for batch in length_batches(lengths, policy)]


def time_full_model(full: DilBertReader, question_ids: list, passage_ids: list, policy: BatchPolicy) -> float:
    """Seconds for layers 1..l + head over every pair of the given questions × passages."""
    pad = pad_id(full.tokenizer)
    batches = pair_batches([len(ids) for ids in question_ids], [len(ids) for ids in passage_ids], policy)
    started = time.perf_counter()
    with torch.inference_mode():
        for batch in batches:
            q_ids, q_mask = pad_token_ids([question_ids[qi] for qi, _ in batch], pad)  # (b, nq)
            p_ids, p_mask = pad_token_ids([passage_ids[pi] for _, pi in batch], pad)  # (b, np)
            full(q_ids, q_mask, p_ids, p_mask)
    return time.perf_counter() - started


def time_question_layers(reader: DilBertReader, question_ids: list) -> float:
    """Seconds for layers 1..k over all questions in one padded batch."""
    pad = pad_id(reader.tokenizer)
    started = time.perf_counter()
    with torch.inference_mode():
        ids, mask = pad_token_ids(question_ids, pad)  # (q, nq)
        reader.encode_questions(ids, mask)
    return time.perf_counter() - started


def warm_up(full: DilBertReader, question_ids: list, passage_ids: list) -> None:
    """One small forward, so that one-time setup is not timed."""
    time_full_model(full, question_ids[:1], passage_ids[:2], BatchPolicy())


def run_size(size: str, inputs: Inputs, args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """Every column of the table for one model size.

    The I Q-P runs are interleaved question by question (full model, then each
    DilBert column, for the same question's p pairs), so that load changes on a
    shared machine hit every column alike.
    """
    full, label = build_full_model(size, work)
    layers = full.num_layers
    tokenizer = full.tokenizer
    question_ids = [encode_question(tokenizer, question, QUESTION_LENGTH).token_ids for question in inputs.questions]
    pieces = [piece for passage in inputs.passages
              for piece in tokenize_passage(tokenizer, passage, MAX_LENGTH, "dilbert")]
    passage_ids = [piece.tokens.token_ids for piece in pieces]
    ids = [piece.id for piece in pieces]
    q, p, m = len(question_ids), len(pieces), min(args.measure_questions, len(question_ids))
    scale = q / m
    settings = OdqaSettings(pair_batch_tokens=args.pair_batch_tokens, max_pairs_per_batch=args.max_pairs_per_batch)
    policy = BatchPolicy(settings.pair_batch_tokens, settings.max_pairs_per_batch)
    warm_up(full, question_ids, passage_ids)
    columns: list[dict[str, Any]] = [{"model": "full", "k": 0, "measured_pairs": m * p, "iqp_measured": 0.0}]
    runners: list[Callable[[int], float]] = [
        lambda index: time_full_model(full, [question_ids[index]], passage_ids, policy)
    ]
    for k in (layers - 2, layers - 1):
        reader = at_layers(full, k)
        print(f"[{size}] k={k}: NI P over {p} passages, NI Q over {q} questions ...", file=sys.stderr, flush=True)
        started = time.perf_counter()
        records = encode_tokenized(reader, "dilbert", pieces)
        ni_p = time.perf_counter() - started
        ni_q = time_question_layers(reader, question_ids)
        for encoding in args.encodings:
            store_dir = work / f"{size}-k{k}-{encoding}"
            write_shard(store_dir, 0, records, kind="dilbert", encoding=encoding)
            finalize(store_dir, model_fingerprint(reader, "dilbert", encoding, MAX_LENGTH))
            store = open_store(store_dir)
            store.fetch(ids)  # warm-up: opens the shard and maps its files
            started = time.perf_counter()
            store.fetch(ids)
            read = time.perf_counter() - started
            odqa = OpenDomainReader(reader, store, None, settings)
            columns.append(
                {
                    "model": f"dilbert-k{k}",
                    "k": k,
                    "encoding": encoding,
                    "ni_q": ni_q,
                    "ni_p_offline": ni_p,
                    "store_read": read,
                    "measured_pairs": m * p,
                    "iqp_measured": 0.0,
                    "decode_measured": 0.0,
                    "target_speedup": 0.9 * layers / (layers - k),
                }
            )
            runners.append(_interaction_runner(odqa, inputs.questions, ids, columns[-1]))
    for index in range(m):
        print(f"[{size}] I Q-P: question {index + 1}/{m} × {p} passages, every column ...", file=sys.stderr, flush=True)
        for column, runner in zip(columns, runners, strict=True):
            column["iqp_measured"] += runner(index)
    for column in columns:
        column["iqp"] = column["iqp_measured"] * scale
        column["online_total"] = column.get("ni_q", 0.0) + column.get("store_read", 0.0) + column["iqp"]
        if "ni_p_offline" in column:
            column["seed_total"] = column["ni_q"] + column["ni_p_offline"] + column["iqp"]
    baseline = columns[0]["online_total"]
    for column in columns:
        column["speedup"] = baseline / column["online_total"]
        if "target_speedup" in column:
            column["meets_target"] = column["speedup"] >= column["target_speedup"]
    return {
        "size": size,
        "label": label,
        "layers": layers,
        "hidden_size": full.hidden_size,
        "q": q,
        "p": p,
        "measured_questions": m,
        "extrapolated": m < q,
        "mean_question_tokens": float(np.mean([len(ids) for ids in question_ids])),
        "mean_passage_tokens": float(np.mean([len(ids) for ids in passage_ids])),
        "columns": columns,
    }


def _interaction_runner(
    odqa: OpenDomainReader, questions: list[str], ids: list[str], column: dict[str, Any]
) -> Callable[[int], float]:
    """A callable timing the reader's interaction stage for one question × all passages (decode added to column)."""

    def run(index: int) -> float:
        timings = odqa.read([questions[index]], [ids])[0].timings
        column["decode_measured"] += timings.decode
        return timings.interaction_layers

    return run


def render(result: dict[str, Any]) -> str:
    """A Markdown table in the seed's layout (seconds), one column per model and encoding."""
    columns = result["columns"]
    names = ["full model"] + [f"DilBert k={c['k']} {c['encoding']}" for c in columns[1:]]
    q, p, m = result["q"], result["p"], result["measured_questions"]
    mark = " (extrapolated)" if result["extrapolated"] else ""

    def row(label: str, key: str, fmt: str = "{:.2f}") -> str:
        cells = [fmt.format(c[key]) if key in c else "–" for c in columns]
        return f"| {label} | " + " | ".join(cells) + " |"

    lines = [
        f"**{result['size']}**: {result['label']}; l={result['layers']}, d={result['hidden_size']}; "
        f"q={q} questions (mean {result['mean_question_tokens']:.1f} tokens) × p={p} passages "
        f"(mean {result['mean_passage_tokens']:.1f} tokens); I Q-P measured on {m}×{p} = {m * p} pairs.",
        "",
        "| seconds | " + " | ".join(names) + " |",
        "|---|" + "---|" * len(names),
        row("NI Q (online, all q measured)", "ni_q"),
        row("NI P (offline precompute, all p measured)", "ni_p_offline"),
        row("store read + dequantize (all p measured)", "store_read", "{:.4f}"),
        row(f"I Q-P measured ({m * p} pairs)", "iqp_measured"),
        row(f"I Q-P for {q}×{p}{mark}", "iqp"),
        row(f"online total{mark}", "online_total"),
        row(f"seed-style total incl. NI P{mark}", "seed_total"),
        row("speedup (online total)", "speedup", "x{:.2f}"),
        row("target 0.9·l/(l−k)", "target_speedup", "x{:.2f}"),
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--q", type=positive_int, default=100, help="questions (default 100, as in the seed)")
    parser.add_argument("--p", type=positive_int, default=100, help="passages (default 100, as in the seed)")
    parser.add_argument(
        "--measure-questions", type=positive_int, default=100,
        help="questions whose q×p pairs are run through I Q-P; fewer than --q extrapolates (default 100)",
    )  # fmt: skip
    parser.add_argument("--sizes", nargs="+", choices=SIZES, default=list(SIZES))
    parser.add_argument("--encodings", nargs="+", choices=("fp32", "fp16", "int8"), default=["fp16", "int8"])
    parser.add_argument("--threads", type=positive_int, default=2, help="torch threads (default 2)")
    parser.add_argument("--pair-batch-tokens", type=positive_int, default=8192)
    parser.add_argument("--max-pairs-per-batch", type=positive_int, default=64)
    parser.add_argument("--data", type=Path, default=SHARED_DATA, help="the shared data folder")
    parser.add_argument("--output", type=Path, default=Path("/tmp/bench-odqa-speed.json"))
    args = parser.parse_args(argv)
    check_output_option(parser, args.output, "--output")
    torch.set_num_threads(args.threads)
    inputs = load_inputs(args.data, args.q, args.p)
    results = []
    with tempfile.TemporaryDirectory(prefix="bench-odqa-") as temporary:
        for size in args.sizes:
            results.append(run_size(size, inputs, args, Path(temporary)))
            print(render(results[-1]) + "\n", flush=True)
    document = {
        "benchmark": "odqa-speed (seed 002 Table 1 protocol, through the store)",
        "threads": args.threads,
        "torch": torch.__version__,
        "machine": f"{platform.machine()} {platform.processor() or ''}".strip(),
        "results": results,
    }
    args.output.write_text(json.dumps(document, indent=1))
    print(json.dumps(document))
    return 0


if __name__ == "__main__":
    sys.exit(main())
