"""Learning curve of a `train qa --store-encoding ENC` run: Mini OpenSQuAD F1 on an ENC store against questions seen.

    .venv/bin/python benchmarks/online_variant_curve.py RUN --store STORE --work DIR \
        [--base DIR] [--limit 300] [--top-p 29] [--png curve.png]

STORE is a Mini OpenSQuAD store of the run's encoding with its BM25 index
(benchmarks/mini_opensquad.py --encoding ENC), precomputed with --base (the
checkpoint the run started from, default the shipped reader). Step 0 is the
base read with its own online layers (--no-online-variant); every periodic
checkpoint of RUN (and its final model) is packaged as the base's online
variant in DIR/step-N (benchmarks/package_online_variant.py) and scored on the
same seeded questions (mini_opensquad.py --store). Results are kept in
DIR/step-N.json, so a second call scores only new checkpoints.
Prints a table, then the rows as JSON.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import mini_opensquad  # noqa: E402
from package_online_variant import write_into  # noqa: E402
from reader_curve import checkpoints  # noqa: E402
from script_errors import one_line_errors

from dilstore.reader.modeling.dilbert import DilBertReader  # noqa: E402
from dilstore.reader.modeling.online_variants import write_online_variant  # noqa: E402
from dilstore.reader.packaged.shipped import default_checkpoint_dir  # noqa: E402
from dilstore.reader.text.files import read_json_object  # noqa: E402
from dilstore.reader.training.release import load_training_metadata  # noqa: E402
from dilstore.runners.arg_types import positive_int, sample_seed  # noqa: E402
from dilstore.runners.outputs import PLOT_SUFFIXES, check_output_file  # noqa: E402
from dilstore.storage.errors import DilstoreError  # noqa: E402

# mini_opensquad.py's own --work, inside DIR: it refuses an --output inside its --work, so with --work DIR itself
# every call, step 0 first, failed (bench53 F11). With --store it keeps nothing there.
MINI_OPENSQUAD_WORK = "mini-opensquad"
SETTINGS_FILE = "curve-settings.json"


def check_settings(work: Path, settings: dict[str, Any]) -> None:
    """Record the curve's settings in DIR on its first call; a DilstoreError on a later call with other ones.

    DIR/step-N (a packaged checkpoint) and DIR/step-N.json (its scores) are reused by step number alone: a call
    with another RUN, --store, --base, --limit, --seed or --top-p printed the earlier call's scores as its own,
    and scored another run's packaged checkpoints as this run's (bench53 F12). A DIR from before the settings were
    recorded cannot be checked: its settings are taken to be these, and said so.
    """
    path = work / SETTINGS_FILE
    if path.is_file():
        recorded = read_json_object(path)
        differ = [f"{key} {recorded.get(key)} (asked: {value})" for key, value in settings.items()
                  if recorded.get(key) != value]  # fmt: skip
        if differ:
            raise DilstoreError(f"--work {work} holds a curve of {', '.join(differ)}: give another --work, or the "
                                "same settings")  # fmt: skip
        return
    if any(work.glob("step-*")):
        print(f"online_variant_curve: {work} holds steps scored before settings were recorded: taking them as "
              "scored with these", file=sys.stderr)  # fmt: skip
    path.write_text(json.dumps(settings, indent=1) + "\n", encoding="utf-8")


def scored(result_file: Path, arguments: list[str]) -> dict[str, Any]:
    """mini_opensquad.py's result for `arguments`, run once and kept in `result_file`."""
    if not result_file.is_file():
        if mini_opensquad.main([*arguments, "--output", str(result_file)]) != 0:
            raise DilstoreError(f"mini_opensquad.py {' '.join(arguments)} failed")
    return json.loads(result_file.read_text())


def curve_row(step: int, questions: int, hours: float, result: dict[str, Any]) -> dict[str, Any]:
    """One point: the training position and the first top-p row's scores."""
    row = result["rows"][0]
    return {
        "step": step,
        "questions_seen": questions,
        "train_hours": round(hours, 3),
        "online_variant": result["model"].get("online_variant"),
        "top_p": row["top_p"],
        "f1_fused": row["f1_with_bm25"],
        "f1_alone": row["f1_without_bm25"],
        "recall": row["recall"],
    }


def plot(rows: list[dict[str, Any]], png: Path, encoding: str) -> None:
    """Fused and reader-alone F1 against questions seen."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(7, 4.5))
    seen = [row["questions_seen"] for row in rows]
    axes.plot(seen, [row["f1_fused"] for row in rows], marker="o", label="fused with BM25 (mu = 0.5)")
    axes.plot(seen, [row["f1_alone"] for row in rows], marker="s", label="reader alone (mu = 1)")
    axes.set_xlabel("training questions seen (groups of 1 + 3 paragraphs)")
    axes.set_ylabel(f"Mini OpenSQuAD F1 on a {encoding} store")
    axes.grid(alpha=0.3)
    axes.legend()
    figure.tight_layout()
    figure.savefig(png, dpi=120)


@one_line_errors
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path)
    parser.add_argument("--store", type=Path, required=True, help="a Mini OpenSQuAD store of the run's encoding")
    parser.add_argument("--work", type=Path, required=True, help="folder for the packaged checkpoints and results")
    parser.add_argument("--base", type=Path, help="the checkpoint the run started from (default: the shipped reader)")
    parser.add_argument("--limit", type=positive_int, default=300)
    parser.add_argument("--seed", type=sample_seed, default=0)
    parser.add_argument("--top-p", type=positive_int, default=29)
    parser.add_argument("--threads", type=positive_int, default=2)
    parser.add_argument("--png", type=Path)
    args = parser.parse_args(argv)
    base = args.base or default_checkpoint_dir()
    common = ["--work", str(args.work / MINI_OPENSQUAD_WORK), "--store", str(args.store), "--limit", str(args.limit),
              "--seed", str(args.seed), "--top-p", str(args.top_p), "--threads", str(args.threads)]  # fmt: skip
    if args.png:  # before the evaluations, whose plot it would lose
        check_output_file(args.png, "--png", [], args.work, suffixes=PLOT_SUFFIXES)
    args.work.mkdir(parents=True, exist_ok=True)
    check_settings(args.work, {"run": str(args.run.resolve()), "store": str(args.store.resolve()),
                               "base": str(Path(base).resolve()), "limit": args.limit, "seed": args.seed,
                               "top_p": args.top_p})  # fmt: skip
    start = scored(args.work / "step-0.json", [*common, "--model", str(base), "--no-online-variant"])
    rows = [curve_row(0, 0, 0.0, start)]
    for checkpoint in checkpoints(args.run):
        training = load_training_metadata(checkpoint)
        packaged = args.work / f"step-{training['steps']}"
        if not packaged.is_dir():
            tuned, encoding = DilBertReader.from_pretrained(checkpoint), training["config"]["store_encoding"]
            write_into(base, packaged, lambda folder, tuned=tuned, encoding=encoding: write_online_variant(
                tuned, DilBertReader.from_pretrained(base), encoding, folder))  # fmt: skip
        result = scored(args.work / f"step-{training['steps']}.json", [*common, "--model", str(packaged)])
        rows.append(
            curve_row(training["steps"], training["features_seen"], training["train_seconds"] / 3600, result)
        )
    print("| step | questions seen | train h | F1 fused | F1 alone | R |")
    print("|---:|---:|---:|---:|---:|---:|")
    for row in rows:
        print(f"| {row['step']} | {row['questions_seen']:,} | {row['train_hours']:.2f} | {row['f1_fused']:.1f} | "
              f"{row['f1_alone']:.1f} | {row['recall']:.1f} |")
    if args.png:
        plot(rows, args.png, start["encoding"])
    print(json.dumps(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
