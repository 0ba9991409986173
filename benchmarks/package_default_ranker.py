"""Package a trained EARL or Listformer run as the project's default of its kind (fp16 safetensors + model card).

    python benchmarks/package_default_ranker.py --checkpoint RUN_DIR \
        --quality DL19_REPORT.json --quality SQUAD_REPORT.json [--notes TEXT]

The run's training record says its kind: an EARL run becomes the default
ranker (reader/models/earl-minilm-squad), a Listformer run the default
Listformer (reader/models/listformer-minilm-squad).
Each `--quality` is a `benchmarks/rank_quality.py --output` report that scored
RUN_DIR (and, for the card's target line, a trained cross-encoder); every row
of every report goes into the card's results table. Prints the packaged size:
a shipped file must stay under 60 MB.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from package_size import report_package_size
from script_errors import one_line_errors

from dilstore.reader.packaged.shipped import DEFAULT_LISTFORMER_NAME, DEFAULT_RANKER_NAME, packaged_models_dir
from dilstore.reader.text.files import read_json
from dilstore.reader.training.model_cards import card_hardware, render_ranker_card
from dilstore.reader.training.release import load_training_metadata, package_checkpoint
from dilstore.storage.errors import DilstoreError

SIZE_LIMIT_MB = 60.0
# Per packaged kind: the shipped folder's name.
PACKAGES = {"earl": DEFAULT_RANKER_NAME, "listformer": DEFAULT_LISTFORMER_NAME}


def quality_rows(reports: list[Path]) -> list[dict[str, Any]]:
    """Every result row of the reports, each with its task's query count; a (task, model) seen before is skipped.

    Each report repeats BM25 for its tasks, so reports of the same tasks
    would otherwise list it once per report.
    """
    rows: dict[tuple[str, str], dict[str, Any]] = {}
    for path in reports:
        report = read_json(path)
        for row in report["results"]:
            rows.setdefault((row["task"], row["model"]), {**row, "queries": report["tasks"][row["task"]]["queries"]})
    return list(rows.values())


def rows_of_checkpoint(rows: list[dict[str, Any]], checkpoint: Path) -> list[dict[str, Any]]:
    """`rows` with the path of each that names `checkpoint` (relative or absolute, as rank_quality.py was given it)
    spelled as `checkpoint` is, so that the card marks them and states the target; a DilstoreError when none does:
    a card without its own model's scores said that no cross-encoder was given."""
    target = checkpoint.resolve()
    matched = [{**row, "path": str(checkpoint)} if row.get("path") and Path(row["path"]).resolve() == target else row
               for row in rows]  # fmt: skip
    if not any(row.get("path") == str(checkpoint) for row in matched):
        scored = sorted({str(row["path"]) for row in rows if row.get("path")})
        raise DilstoreError(
            f"no row of the --quality reports scored {checkpoint} (they scored: "
            f"{', '.join(scored) or 'no checkpoint'}); give a rank_quality.py report of it"
        )
    return matched


@one_line_errors
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", type=Path, required=True, help="the EARL or Listformer run's output directory")
    parser.add_argument("--quality", type=Path, action="append", required=True,
                        help="a rank_quality.py report that scored --checkpoint (repeat)")  # fmt: skip
    parser.add_argument("--hardware", help="the card's hardware line (default: what the run's record names)")
    parser.add_argument("--notes", default="", help="extra Markdown for the card's Notes section")
    parser.add_argument("--destination", type=Path, help="default: the shipped folder of the run's kind")
    args = parser.parse_args(argv)
    training = load_training_metadata(args.checkpoint)
    if training.get("kind") not in PACKAGES:
        raise DilstoreError(
            f"{args.checkpoint} holds a {training.get('kind')!r} run, not an EARL ranker or a Listformer"
        )
    name = PACKAGES[training["kind"]]
    card = render_ranker_card(
        training, rows_of_checkpoint(quality_rows(args.quality), args.checkpoint), checkpoint=str(args.checkpoint),
        hardware=card_hardware(training, args.hardware), notes=args.notes,
    )  # fmt: skip
    destination = package_checkpoint(args.checkpoint, args.destination or packaged_models_dir() / name, card)
    return report_package_size(destination, SIZE_LIMIT_MB)


if __name__ == "__main__":
    sys.exit(main())
