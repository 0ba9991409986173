"""The k sweep (the seed's Figure 3): SQuAD dev EM/F1 against k, as a Markdown table and a PNG.

Reads the `eval-dev.json` each `dilstore train qa --dev ...` run writes, or a
`dilstore evaluate-rc --json` output saved to a file; `--pair EVAL CHECKPOINT`
takes the training steps and time from the checkpoint's training record.
Prints the table, then the rows as JSON.

    python benchmarks/plot_k_sweep.py [RUN_DIR_OR_EVAL_JSON...] [--pair EVAL.json CHECKPOINT]... \
        --png k_sweep.png [--markdown table.md]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import matplotlib
from script_errors import one_line_errors

from dilstore.reader.modeling.checkpoints import TRAINING_METADATA_FILE
from dilstore.reader.text.files import read_json_object
from dilstore.reader.training.release import load_training_metadata
from dilstore.runners.outputs import PLOT_SUFFIXES, check_output_file

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (the backend must be chosen first)

EVAL_FILE = "eval-dev.json"
BASE_INIT = "base"
EVALUATION = "an evaluation (eval-dev.json, or `dilstore evaluate-rc --json` saved to a file)"


def load_rows(paths: list[Path], pairs: list[tuple[Path, Path]]) -> list[dict[str, Any]]:
    """One row per run, sorted by k: run directories' eval-dev.json, eval JSON files, and (eval, checkpoint) pairs."""
    rows = []
    for path in paths:
        file = path / EVAL_FILE if path.is_dir() else path
        row = read_json_object(file, EVALUATION)
        row["source"] = str(file)
        if path.is_dir():
            training = load_training_metadata(path)
            # An evaluation by `evaluate-rc` (a sweep run whose own was cut off) lacks the training budget.
            row = {**budget(training), **row, "run": path.name, "init": initialisation(training)}
        rows.append(row)
    for file, checkpoint in pairs:
        training = load_training_metadata(checkpoint)
        row = read_json_object(file, EVALUATION)
        row.update(source=str(file), checkpoint=str(checkpoint), init=initialisation(training), **budget(training))
        rows.append(row)
    return sorted(rows, key=lambda row: (row.get("init", BASE_INIT) != BASE_INIT, int(row["k"])))


def budget(training: dict[str, Any]) -> dict[str, Any]:
    """A run's training budget from its record: steps, seconds and examples seen."""
    return {
        "train_steps": training["steps"],
        "train_seconds": training["train_seconds"],
        "features_seen": training["features_seen"],
    }


def initialisation(training: dict[str, Any]) -> str:
    """Where a run started: "base" (all-MiniLM-L6-v2) or the name of the fine-tuned checkpoint it continued.

    A distilled run started from its teacher (`sweep --distil`), which may live only on the GPU machine that
    trained both, so its record's teacher says so where the start folder cannot."""
    start = Path(training["base_model"])
    teacher = training.get("config", {}).get("teacher")
    return start.name if (start / "dilstore.json").is_file() or teacher is not None else BASE_INIT


def markdown_table(rows: list[dict[str, Any]]) -> str:
    """The sweep as a Markdown table; training columns are blank where a row has none."""
    header = "| k | init | EM | F1 | ΔF1 vs k=0 | dev questions | train steps | train min | eval min |"
    lines = [header, "|---|---|---|---|---|---|---|---|---|"]
    baseline = next((float(row["f1"]) for row in rows if int(row["k"]) == 0), None)
    for row in rows:
        delta = "" if baseline is None else f"{float(row['f1']) - baseline:+.2f}"
        steps = row.get("train_steps", "")
        train_min = f"{row['train_seconds'] / 60:.1f}" if "train_seconds" in row else ""
        lines.append(
            f"| {row['k']} | {row.get('init', BASE_INIT)} | {float(row['em']):.2f} | {float(row['f1']):.2f} | {delta} "
            f"| {row['questions']} "
            f"| {steps} | {train_min} | {float(row['seconds']) / 60:.1f} |"
        )
    return "\n".join(lines) + "\n"


def plot(rows: list[dict[str, Any]], png: Path, title: str) -> None:
    """EM and F1 against k, one line per initialisation (a warm-started line starts at the run it continued)."""
    figure, axes = plt.subplots(figsize=(5.5, 3.8), dpi=120)
    for init in dict.fromkeys(row.get("init", BASE_INIT) for row in rows):
        series = [row for row in rows if row.get("init", BASE_INIT) == init]
        if init != BASE_INIT:
            series = [row for row in rows if row.get("run") == init] + series
        ks = [int(row["k"]) for row in series]
        label = "from all-MiniLM-L6-v2" if init == BASE_INIT else f"warm-started from {init}"
        axes.plot(ks, [float(row["f1"]) for row in series], marker="o", label=f"F1, {label}")
        axes.plot(ks, [float(row["em"]) for row in series], marker="s", linestyle="--", label=f"EM, {label}")
    axes.set_xlabel("k (non-interaction layers)")
    axes.set_ylabel("SQuAD v1.1 dev score")
    axes.set_xticks(sorted({int(row["k"]) for row in rows}))
    axes.set_title(title, fontsize=9)
    axes.grid(alpha=0.3)
    axes.legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(png)
    plt.close(figure)


@one_line_errors
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="*", type=Path, help="run directories or eval JSON files")
    parser.add_argument(
        "--pair", nargs=2, type=Path, action="append", default=[], metavar=("EVAL", "CHECKPOINT"),
        help="an evaluate-rc JSON and the checkpoint it scored (for steps and train time)",
    )
    parser.add_argument("--png", type=Path, required=True, help="where to write the plot")
    parser.add_argument("--markdown", type=Path, help="also write the table here")
    parser.add_argument("--title", default="DilBert (all-MiniLM-L6-v2), SQuAD v1.1 dev")
    args = parser.parse_args(argv)
    if not args.runs and not args.pair:
        parser.error("give at least one run directory, eval JSON or --pair")
    given = [*args.runs, *(path for pair in args.pair for path in pair)]
    inputs = [path for run in given for path in (run, run / "eval-dev.json", run / TRAINING_METADATA_FILE)]
    # Before any work: `--markdown RUN/eval-dev.json` replaced the evaluation with the table.
    check_output_file(args.png, "--png", inputs, suffixes=PLOT_SUFFIXES)
    if args.markdown:
        check_output_file(args.markdown, "--markdown", inputs)
    rows = load_rows(args.runs, [tuple(pair) for pair in args.pair])  # a missing run: a line, not a traceback
    table = markdown_table(rows)
    print(table)
    if args.markdown:
        args.markdown.write_text(table, encoding="utf-8")
    plot(rows, args.png, args.title)
    print(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
