"""Reader learning curves (issue #12): SQuAD dev EM/F1 against training windows seen, per recipe, as a table and a PNG.

Each RUN is a `dilstore train qa` output directory; every periodic checkpoint
under RUN/checkpoints (keep them with --keep-checkpoints) and the final model
(when the run finished) is evaluated on the same seeded subset of --dev
(--limit questions, --seed), so the points of every run are comparable.
Scores are cached per checkpoint in --cache, keyed by the checkpoint's path,
its weights' modification time and the subset, so a curve that grows over
sessions evaluates only its new points.

    .venv/bin/python benchmarks/reader_curve.py RUN [RUN...] --dev ../shared/data/squad/dev-v1.1.json \
        --limit 500 --png reader_curve.png --cache /work/runs/curve-cache.json

Prints the table (run, step, windows seen, hours of training, EM, F1), then
the rows as JSON. --scored FILE [FILE...] tables and plots rows printed by an
earlier call instead (the checkpoints scored on a lent GPU that kept them):

    .venv/bin/python benchmarks/reader_curve.py --scored rows.json --png curve.png
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import torch

from dilstore.reader.evaluation.reading_comprehension import evaluate_file
from dilstore.reader.modeling.dilbert import DilBertReader
from dilstore.reader.text.files import read_json
from dilstore.reader.training.release import load_training_metadata
from dilstore.runners.arg_types import positive_int, sample_seed
from dilstore.runners.outputs import PLOT_SUFFIXES, check_output_file
from dilstore.storage.errors import DilstoreError

sys.path.insert(0, str(Path(__file__).resolve().parent))  # its neighbours, when loaded by path
from script_errors import one_line_errors  # noqa: E402

WEIGHTS = "model.safetensors"
ROW_KEYS = frozenset({"run", "k", "step", "windows_seen", "train_hours", "em", "f1"})


def checkpoints(run: Path) -> list[Path]:
    """The run's periodic checkpoints in step order, then its final model when it has one."""
    found = sorted((run / "checkpoints").glob("step-*")) if (run / "checkpoints").is_dir() else []
    found = [path for path in found if (path / WEIGHTS).is_file()]
    if (run / WEIGHTS).is_file():
        found.append(run)
    return found


def point(
    checkpoint: Path, dev: Path, limit: int, seed: int, cache: dict[str, Any], device: str | None = None
) -> dict[str, Any]:
    """One curve point: the checkpoint's training position and its dev scores (from the cache when current)."""
    training = load_training_metadata(checkpoint)
    key = f"{checkpoint.resolve()}|{(checkpoint / WEIGHTS).stat().st_mtime_ns}|{dev.resolve()}|{limit}|{seed}"
    if key not in cache:
        result = evaluate_file(DilBertReader.from_pretrained(checkpoint), dev, limit=limit, seed=seed, device=device)
        cache[key] = {"em": result.em, "f1": result.f1, "questions": result.questions}
    return {
        "run": checkpoint.name if checkpoint.parent.name != "checkpoints" else checkpoint.parent.parent.name,
        "checkpoint": str(checkpoint),
        "k": training.get("layers"),
        "step": training["steps"],
        "windows_seen": training["features_seen"] * int(training.get("windows_per_example") or 1),
        "train_hours": round(training["train_seconds"] / 3600, 3),
        **cache[key],
    }


def plot(rows: list[dict[str, Any]], png: Path) -> None:
    """F1 against windows seen, one line per run (matplotlib is imported here: a GPU machine may lack it)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    figure, axes = plt.subplots(figsize=(7, 4.5))
    for run in dict.fromkeys(row["run"] for row in rows):
        points = sorted((row["windows_seen"], row["f1"]) for row in rows if row["run"] == run)
        axes.plot(*zip(*points, strict=True), marker="o", label=run)
    axes.set_xlabel("training windows seen")
    axes.set_ylabel("SQuAD v1.1 dev F1 (seeded subset)")
    axes.grid(alpha=0.3)
    axes.legend()
    figure.tight_layout()
    figure.savefig(png, dpi=120)


def read_cache(path: Path) -> dict[str, Any]:
    """The scores cached in `path` ({} when it does not exist yet); a DilstoreError, before any evaluation, for a
    file that is no such cache: scores were written into whatever JSON object it named (a run's own
    dilstore_training.json), and a folder or other JSON failed after the first checkpoint was scored."""
    if path.is_dir():
        raise DilstoreError(f"--cache {path} is a folder; give a JSON file")
    if not path.exists():
        check_output_file(path, "--cache", [])
        return {}
    try:
        cache = read_json(path)
    except DilstoreError as error:
        raise DilstoreError(f"--cache {error}") from None
    entries = cache.values() if isinstance(cache, dict) else None
    if entries is None or any(not isinstance(entry, dict) or not {"em", "f1", "questions"} <= entry.keys()
                              for entry in entries):  # fmt: skip
        raise DilstoreError(f"--cache {path} is not a cache of scores (an object of {{em, f1, questions}} entries)")
    return cache


def evaluated_rows(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Every checkpoint of every RUN scored (or taken from the cache), the cache saved after each point."""
    torch.set_num_threads(args.threads)
    cache = read_cache(args.cache)
    rows = []
    for run in args.runs:
        for checkpoint in checkpoints(run):
            if not (checkpoint / WEIGHTS).is_file():  # a run still training prunes its off-grid checkpoints
                print(f"reader_curve: {checkpoint} is gone (pruned by its run while earlier points were scored): "
                      "skipped", file=sys.stderr)  # fmt: skip
                continue
            rows.append(point(checkpoint, args.dev, args.limit, args.seed, cache, args.device))
            args.cache.write_text(json.dumps(cache, indent=1))
    return rows


def scored_rows(files: list[Path]) -> list[dict[str, Any]]:
    """The rows of earlier calls: each file holds the JSON list such a call printed last."""
    rows = []
    for file in files:
        try:
            found = json.loads(file.read_text(encoding="utf-8"))
        except (OSError, ValueError) as error:
            raise DilstoreError(f"{file}: not a readable JSON list of curve rows ({error})") from error
        if not isinstance(found, list) or not all(isinstance(row, dict) and ROW_KEYS <= row.keys() for row in found):
            raise DilstoreError(f"{file}: expected a JSON list of rows with {', '.join(sorted(ROW_KEYS))}")
        rows += found
    return rows


@one_line_errors
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="*", type=Path, metavar="RUN", help="`dilstore train qa` output directories")
    parser.add_argument("--scored", nargs="+", type=Path, metavar="FILE", help="JSON rows of an earlier call")
    parser.add_argument("--dev", type=Path, help="SQuAD v1.1 dev JSON (needed with RUN)")
    parser.add_argument("--limit", type=positive_int, default=500, help="seeded subset of dev questions (default 500)")
    parser.add_argument("--seed", type=sample_seed, default=0, help="seed of the subset (default 0)")
    parser.add_argument("--cache", type=Path, help="JSON file of scores already computed (needed with RUN)")
    parser.add_argument("--png", type=Path, help="write the plot here")
    parser.add_argument("--threads", type=positive_int, default=2, help="torch threads (default 2)")
    parser.add_argument("--device", help="torch device of the evaluations (default: CUDA when present, else the CPU)")
    args = parser.parse_args(argv)
    if bool(args.runs) == bool(args.scored) or (args.runs and (args.dev is None or args.cache is None)):
        parser.error("give RUN... with --dev and --cache, or --scored FILE...")
    if args.png:  # before the evaluations, whose plot it would lose
        inputs = [*(args.scored or []), *([args.cache] if args.cache else [])]
        check_output_file(args.png, "--png", inputs, suffixes=PLOT_SUFFIXES)
    rows = scored_rows(args.scored) if args.scored else evaluated_rows(args)
    if not rows:
        raise DilstoreError("no checkpoint with weights in the runs given")
    print(f"{'run':<22} {'k':>2} {'step':>6} {'windows':>8} {'hours':>6} {'EM':>6} {'F1':>6}")
    for row in rows:
        print(f"{row['run']:<22} {row['k']!s:>2} {row['step']:>6} {row['windows_seen']:>8} {row['train_hours']:>6.2f} "
              f"{row['em']:>6.2f} {row['f1']:>6.2f}")  # fmt: skip
    if args.png:
        plot(rows, args.png)
    print(json.dumps(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
