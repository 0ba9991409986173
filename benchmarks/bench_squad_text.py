"""Throughput of the text side of the QA reader: SQuAD features, label round trips, span decoding, the metric.

Needs ../shared/data. Prints a table, then the same numbers as JSON (also
written to --json-out). No model is run: these are tokenizer and numpy costs.

    .venv/bin/python benchmarks/bench_squad_text.py --json-out /tmp/bench-squad-text.json
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path
from typing import Any

import numpy as np
from transformers import AutoTokenizer, PreTrainedTokenizerBase

from dilstore.reader.data.qa_features import answer_text, build_features
from dilstore.reader.data.squad import SquadExample, load_predictions, load_squad
from dilstore.reader.evaluation.squad_metric import evaluate, normalize_answer
from dilstore.reader.modeling.checkpoints import base_model_dir
from dilstore.reader.serving.decode import best_spans
from dilstore.reader.text.files import read_json

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data" / "squad"


def bench_features(
    tokenizer: PreTrainedTokenizerBase, examples: list[SquadExample], max_seq_length: int, doc_stride: int
) -> dict[str, Any]:
    """Build labelled features for every example; count windows and label round trips."""
    started = time.perf_counter()
    features = list(build_features(tokenizer, examples, max_seq_length=max_seq_length, doc_stride=doc_stride))
    seconds = time.perf_counter() - started
    gold = {example.id: example.answers[0].text for example in examples}
    labelled = [feature for feature in features if feature.has_answer]
    exact = sum(
        normalize_answer(answer_text(f.context, f.passage, f.start_position, f.end_position))
        == normalize_answer(gold[f.example_id])
        for f in labelled
    )
    return {
        "questions": len(examples),
        "max_seq_length": max_seq_length,
        "doc_stride": doc_stride,
        "windows": len(features),
        "labelled_windows": len(labelled),
        "questions_without_label": len(gold) - len({f.example_id for f in labelled}),
        "label_round_trip_exact": exact / len(labelled),
        "seconds": seconds,
        "questions_per_s": len(examples) / seconds,
    }


def bench_decode(windows: int, length: int, n_best: int, max_answer_length: int) -> dict[str, Any]:
    """best_spans on random full-length windows."""
    rng = np.random.default_rng(0)
    spans = np.stack([np.arange(length) * 5, np.arange(length) * 5 + 4], axis=1).astype(np.int32)
    logits = rng.standard_normal((windows, 2, length)).astype(np.float32)
    started = time.perf_counter()
    for start, end in logits:
        best_spans(start, end, spans, n_best=n_best, max_answer_length=max_answer_length)
    seconds = time.perf_counter() - started
    return {"windows": windows, "tokens": length, "n_best": n_best, "max_answer_length": max_answer_length,
            "microseconds_per_window": 1e6 * seconds / windows}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json-out", type=Path, default=Path("/tmp/bench-squad-text.json"))
    args = parser.parse_args()
    tokenizer = AutoTokenizer.from_pretrained(base_model_dir())
    started = time.perf_counter()
    train = load_squad(SHARED / "train-v1.1.json")
    load_seconds = time.perf_counter() - started
    started = time.perf_counter()
    scores = evaluate(
        read_json(SHARED / "dev-v1.1.json"), load_predictions(SHARED / "predictions.bert-ensemble.dev-v1.1.json")
    )
    metric_seconds = time.perf_counter() - started
    results = {
        "machine": f"{platform.processor() or platform.machine()}, CPU only, shared with other jobs",
        "load_train_seconds": load_seconds,
        "metric": {**scores, "seconds_incl_loading": metric_seconds},
        "features": [bench_features(tokenizer, train, 384, 128), bench_features(tokenizer, train, 128, 64)],
        "decode": bench_decode(windows=2000, length=384, n_best=20, max_answer_length=30),
    }
    print(f"load SQuAD train ({len(train)} questions): {load_seconds:.2f} s")
    print(f"metric on dev: EM {scores['exact_match']:.3f} F1 {scores['f1']:.3f} in {metric_seconds:.2f} s")
    print("| max_seq_length | doc_stride | windows | labelled | unlabelled questions | round trip exact | q/s |")
    print("|---|---|---|---|---|---|---|")
    for row in results["features"]:
        print(
            f"| {row['max_seq_length']} | {row['doc_stride']} | {row['windows']} | {row['labelled_windows']} | "
            f"{row['questions_without_label']} | {100 * row['label_round_trip_exact']:.2f}% | "
            f"{row['questions_per_s']:.0f} |"
        )
    print(
        f"best_spans, 384-token window, n_best 20, max answer 30: {results['decode']['microseconds_per_window']:.0f} µs"
    )
    print(json.dumps(results, indent=1))
    args.json_out.write_text(json.dumps(results, indent=1), encoding="utf-8")


if __name__ == "__main__":
    main()
