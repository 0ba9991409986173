"""Package a `train qa --freeze-lower --store-encoding ENC` run as a checkpoint's online layers for ENC stores.

    python benchmarks/package_online_variant.py --checkpoint RUN_OR_STEP_DIR [--base DIR] [--into DIR] \
        [--eval TUNED.json --baseline PLAIN.json --reference FP16.json] [--hardware TEXT] [--notes TEXT]

Writes `online-ENC.safetensors` (reader/modeling/online_variants.py) from the
run's online weights into `--into` (default: `--base`, the shipped default
reader). When `--into` is another folder, the base checkpoint's files are
copied there too (the folder appears only once the variant is written), so
a checkpoint can be tried on a store without touching the shipped one. The
run must have started from `--base` with frozen lower layers: its offline
weights must equal the base's bit for bit.

With `--eval` (benchmarks/mini_opensquad.py's JSON on an ENC store with the
variant), `--baseline` (the same store with `--no-online-variant`) and
`--reference` (an fp16 store), the model card beside the weights gets a
section for the variant: data, recipe, command, hardware, time and those
scores. Prints the variant's size and its rows as JSON.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from script_errors import one_line_errors

from dilstore.reader.modeling.dilbert import DilBertReader
from dilstore.reader.modeling.online_variants import write_online_variant
from dilstore.reader.packaged.shipped import default_checkpoint_dir
from dilstore.reader.text.files import read_json
from dilstore.reader.training.model_cards import card_hardware
from dilstore.reader.training.release import load_training_metadata
from dilstore.storage.atomic_files import process_umask
from dilstore.storage.errors import DilstoreError

CARD = "MODEL_CARD.md"


def write_into(base: Path, into: Path, write: Callable[[Path], Path]) -> Path:
    """`write(folder)` (the variant and card; the variant's path) in `base` itself when `into` is it, else in a
    copy of the base's files (not its online variants) that becomes the new folder `into` only once `write`
    succeeded: a checkpoint refused there left a copy without a variant, and the corrected rerun was refused."""
    if into.resolve() == base.resolve():
        return write(into)
    if into.exists():
        raise DilstoreError(f"--into {into} exists; give a new folder, or --base itself")
    into.parent.mkdir(parents=True, exist_ok=True)
    staged = Path(tempfile.mkdtemp(prefix=f".{into.name}.", dir=into.parent))
    staged.chmod(0o777 & ~process_umask())  # mkdtemp's 0700 would keep the packaged checkpoint from other accounts
    try:
        for path in base.iterdir():
            if path.is_file() and not path.name.startswith("online-"):
                shutil.copy2(path, staged / path.name)
        written = write(staged)
    except BaseException:
        shutil.rmtree(staged, ignore_errors=True)
        raise
    staged.rename(into)
    return into / written.name


def score_rows(evaluations: Sequence[tuple[str, Mapping[str, Any]]]) -> list[str]:
    """Markdown rows, one per (evaluation, p): fused (mu) and reader-alone F1 and recall, labelled by online layers."""
    rows = []
    for label, result in evaluations:
        for row in result["rows"]:
            rows.append(
                f"| {label} | {result['encoding']} | {row['top_p']} | {row['f1_with_bm25']:.1f} | "
                f"{row['f1_without_bm25']:.1f} | {row['recall']:.1f} |"
            )
    return rows


def card_section(
    encoding: str,
    training: Mapping[str, Any],
    evaluations: Sequence[tuple[str, Mapping[str, Any]]],
    hardware: str,
    notes: str,
) -> str:
    """The model card's section for the `encoding` variant."""
    config = training["config"]
    windows = training["features_seen"] * training.get("windows_per_example", 1)
    negatives = (
        f"shared normalisation with {config['shared_norm_negatives']} BM25 negative paragraphs each"
        if config.get("shared_norm")
        else "no negatives"
    )
    codebook = (
        f"the given {config['codebook']}"
        if config.get("codebook")
        else "trained on a seeded sample of the training passage windows' own layer-k states"
    )
    lines = [
        f"## Online layers for {encoding} stores: `online-{encoding}.safetensors`",
        "",
        f"Layers {training['layers'] + 1}..{training['num_layers']} and the QA head of this checkpoint, tuned on the "
        f"passage states a {encoding} store returns (encoded with a codebook, then decoded), with the embeddings "
        f"and layers 1..{training['layers']} frozen: stores precomputed with this checkpoint are unchanged, and a "
        f"reader opening a {encoding} store swaps these layers in after the fingerprint check "
        "(`--no-online-variant` to read with the checkpoint's own).",
        "",
        f"- Data: SQuAD v1.1 train, {training['features_seen']:,} questions seen ({windows:,} windows; {negatives}).",
        f"- Codebook: {codebook} (a store trains its own on its corpus, so these layers never saw the evaluation "
        "store's codebook).",
        f"- Recipe: step {training['steps']:,} of a {training['total_steps']:,}-step schedule, {config['batch_size']} "
        f"questions a step, AdamW peak lr {config['learning_rate']:g}, warm-up {config['warmup_ratio']:g}, "
        "linear decay, "
        f"seed {config['seed']}.",
        f"- Command: `{training['command']}`",
        f"- Hardware: {hardware}; {training['train_seconds'] / 3600:.2f} h of training.",
    ]
    if evaluations:
        lines += [
            "",
            f"Mini OpenSQuAD (benchmarks/mini_opensquad.py), the same {evaluations[0][1]['questions']:,} questions "
            f"(seed {evaluations[0][1]['seed']}) in every row:",
            "",
            "| online layers | store | p | F1 fused (mu = 0.5) | F1 reader alone (mu = 1) | R |",
            "|---|---|---|---|---|---|",
            *score_rows(evaluations),
        ]
    if notes:
        lines += ["", notes.strip()]
    return "\n".join(lines) + "\n"


def read_evaluations(args: argparse.Namespace, encoding: str) -> list[tuple[str, dict[str, Any]]]:
    """The card's rows: (label, mini_opensquad result) of --reference, --baseline and --eval, each checked to be
    what its row says (fp16; `encoding` with the checkpoint's own layers; with the variant) and all of the same
    questions, which the card states (it claimed so of files scored on other questions, and called an fp16 store
    read without a variant "tuned")."""
    given = [(flag, label, file, wanted) for flag, label, file, wanted in (
        ("--reference", "own", args.reference, ("fp16", False)),
        ("--baseline", "own", args.baseline, (encoding, False)),
        ("--eval", "tuned", args.eval, (encoding, True))) if file is not None]  # fmt: skip
    evaluations = []
    for flag, label, file, (wanted_encoding, tuned) in given:
        result = read_json(file)
        if not isinstance(result, dict) or not {"encoding", "model", "questions", "seed", "rows"} <= result.keys():
            raise DilstoreError(f"{flag} {file} is not a mini_opensquad.py result")
        if any(type(result[key]) is not int for key in ("questions", "seed")):
            raise DilstoreError(f"{flag} {file} is not a mini_opensquad.py result: its questions and seed must be "
                                f"whole numbers, not {result['questions']!r} and {result['seed']!r}")  # fmt: skip
        variant = (result["model"] or {}).get("online_variant") if isinstance(result["model"], dict) else None
        if result["encoding"] != wanted_encoding or bool(variant) != tuned:
            raise DilstoreError(f"{flag} {file} scored a {result['encoding']} store "
                                f"{'with' if variant else 'without'} an online variant; its row needs a "
                                f"{wanted_encoding} store {'with' if tuned else 'without'} one")  # fmt: skip
        evaluations.append((label, result))
    asked = {(result["questions"], result["seed"]) for _, result in evaluations}
    if len(asked) > 1:
        raise DilstoreError(f"the evaluations scored other questions: (questions, seed) {sorted(asked)}; the card's "
                            "rows must be of the same questions")  # fmt: skip
    return evaluations


def with_section(card: str, encoding: str, section: str) -> str:
    """`card` with its section for `encoding` replaced by `section` (appended when it has none)."""
    heading = re.escape(f"## Online layers for {encoding} stores")
    pattern = re.compile(rf"^{heading}.*?(?=^## |\Z)", re.DOTALL | re.MULTILINE)
    if pattern.search(card):
        return pattern.sub(lambda match: section + "\n", card).rstrip("\n") + "\n"
    return card.rstrip("\n") + "\n\n" + section


@one_line_errors
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", type=Path, required=True, help="run output dir or checkpoints/step-N")
    parser.add_argument("--base", type=Path, help="the checkpoint the run started from (default: the shipped reader)")
    parser.add_argument("--into", type=Path, help="where to write the variant (default: --base)")
    parser.add_argument("--eval", type=Path, help="mini_opensquad.py JSON: the ENC store, with the variant")
    parser.add_argument("--baseline", type=Path, help="mini_opensquad.py JSON: the ENC store, --no-online-variant")
    parser.add_argument("--reference", type=Path, help="mini_opensquad.py JSON: an fp16 store")
    parser.add_argument("--hardware", help="the card's hardware line (default: what the run's record names)")
    parser.add_argument("--notes", default="", help="extra Markdown for the card section")
    args = parser.parse_args(argv)
    base_dir = args.base or default_checkpoint_dir()
    training = load_training_metadata(args.checkpoint)
    encoding = training["config"].get("store_encoding")
    if not encoding:
        raise DilstoreError(f"{args.checkpoint} was not trained with --store-encoding")
    evaluations = read_evaluations(args, encoding)  # before anything is written: a typo left --into half-made

    def write(folder: Path) -> Path:
        """The variant and, with --eval, the card's section for it, written into `folder`."""
        written = write_online_variant(
            DilBertReader.from_pretrained(args.checkpoint), DilBertReader.from_pretrained(base_dir), encoding,
            folder,
        )
        if args.eval is not None:
            card = folder / CARD
            text = card.read_text(encoding="utf-8") if card.is_file() else ""
            section = card_section(encoding, training, evaluations, card_hardware(training, args.hardware),
                                   args.notes)  # fmt: skip
            card.write_text(with_section(text, encoding, section), encoding="utf-8")
        return written

    path = write_into(base_dir, args.into or base_dir, write)
    print(json.dumps({"variant": str(path), "megabytes": round(path.stat().st_size / 1e6, 2), "encoding": encoding}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
