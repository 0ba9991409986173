"""Package a trained DilBert run as the project's default reader (fp16 safetensors + model card).

    python benchmarks/package_default_checkpoint.py --checkpoint RUN_OR_STEP_DIR --eval EVAL.json \
        [--baseline-eval K0_EVAL.json] [--sweep-table TABLE.md] [--eval-seed 0] [--notes TEXT]

`--eval` is the chosen run's `dilstore evaluate-rc --json` output (or its
eval-dev.json); `--baseline-eval` the k=0 run's, so the card states whether
the default k is within 3 F1 of k=0. Prints the packaged size; the issue asks
for at most 50 MB.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from package_size import report_package_size
from script_errors import one_line_errors

from dilstore.reader.packaged.shipped import DEFAULT_CHECKPOINT_NAME, packaged_models_dir
from dilstore.reader.text.files import read_json
from dilstore.reader.training.model_cards import card_hardware, render_model_card
from dilstore.reader.training.release import load_training_metadata, package_checkpoint
from dilstore.runners.arg_types import sample_seed

SIZE_LIMIT_MB = 50.0


@one_line_errors
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", type=Path, required=True, help="run output dir or checkpoints/step-N")
    parser.add_argument("--eval", type=Path, required=True, help="the checkpoint's dev evaluation JSON")
    parser.add_argument("--baseline-eval", type=Path, help="the k=0 run's dev evaluation JSON")
    parser.add_argument("--sweep-table", type=Path, help="Markdown k-sweep table to include")
    parser.add_argument("--eval-seed", type=sample_seed, help="seed of the dev subset when --limit was used")
    parser.add_argument("--hardware", help="the card's hardware line (default: what the run's record names)")
    parser.add_argument("--notes", default="", help="extra Markdown for the card's Notes section")
    parser.add_argument("--destination", type=Path, default=packaged_models_dir() / DEFAULT_CHECKPOINT_NAME)
    args = parser.parse_args(argv)

    destination = package(args)
    return report_package_size(destination, SIZE_LIMIT_MB)


def package(args: argparse.Namespace) -> Path:
    """Render the card from the run's record and its evaluation, then package the checkpoint with it; a
    DilstoreError (a checkpoint without a record, an evaluation of another model) before anything is written."""
    evaluation = read_json(args.eval)
    if args.eval_seed is not None:
        evaluation.update(limit=evaluation["questions"], seed=args.eval_seed)
    baseline = None if args.baseline_eval is None else float(read_json(args.baseline_eval)["f1"])
    training = load_training_metadata(args.checkpoint)
    card = render_model_card(
        training,
        evaluation,
        hardware=card_hardware(training, args.hardware),
        baseline_f1=baseline,
        sweep_table=args.sweep_table.read_text(encoding="utf-8") if args.sweep_table else "",
        notes=args.notes,
    )
    return package_checkpoint(args.checkpoint, args.destination, card)


if __name__ == "__main__":
    sys.exit(main())
