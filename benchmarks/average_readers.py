"""A uniform weight average of readers fine-tuned along one lineage (a "model soup"): a new reader folder.

Readers that continue one another (each round of `gpu_reader_schedule.py sweep --students-from-start` starts
from the previous default) lie close together in weight space, and the average of such points often scores
higher than any of them. Averaging costs no training, so it is worth one full-dev evaluation:

    .venv/bin/python benchmarks/average_readers.py READER_A READER_B [...] --output /tmp/soup
    .venv/bin/dilstore evaluate-rc --model /tmp/soup --data ../shared/data/squad/dev-v1.1.json --threads 2 --json

Every reader must have the same config.json and dilstore.json (the same architecture and k) and the same tensor
names and shapes. The average is taken in float32 and stored as fp16, like a shipped reader; config, dilstore.json
and the tokenizer come from the first reader. dilstore_training.json is the last reader's (give the newest run
last), with every source and its SHA-256 under "averaged_from", so `package_default_checkpoint.py --checkpoint`
takes the folder as it is.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from dilstore.reader.modeling.checkpoints import TRAINING_METADATA_FILE
from dilstore.reader.text.files import read_json_object
from dilstore.storage.errors import DilstoreError

SAME_FILES = ("config.json", "dilstore.json")
# Written by whichever transformers saved the reader: not the architecture (a GPU run's 5.17 against 5.23 here).
IGNORED_KEYS = frozenset({"transformers_version"})
COPIED_FILES = (*SAME_FILES, "tokenizer.json", "tokenizer_config.json")


def sha256(path: Path) -> str:
    """The SHA-256 of a file (hex)."""
    with path.open("rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


def check_same_reader_kind(readers: list[Path]) -> None:
    """Refuse, by folder and file, readers whose config.json or dilstore.json differ from the first's (but for the
    version of transformers that wrote them)."""
    for reader in readers:
        for name in (*SAME_FILES, "model.safetensors"):
            if not (reader / name).is_file():
                raise DilstoreError(f"{reader}: no {name}; give reader folders")
    for name in SAME_FILES:
        first = _settings(readers[0] / name)
        for reader in readers[1:]:
            if _settings(reader / name) != first:
                raise DilstoreError(f"{reader / name} differs from {readers[0] / name}: "
                                    "only readers of one kind average")  # fmt: skip


def _settings(path: Path) -> dict:
    """A config file's settings, without the keys that do not describe the reader (IGNORED_KEYS)."""
    return {key: value for key, value in read_json_object(path).items() if key not in IGNORED_KEYS}


def average_weights(paths: list[Path]) -> dict[str, torch.Tensor]:
    """The float32 mean of each floating tensor over the files, as fp16; integer tensors must be equal."""
    total = {name: tensor.to(torch.float32) if tensor.is_floating_point() else tensor
             for name, tensor in load_file(paths[0]).items()}  # fmt: skip
    for path in paths[1:]:
        tensors = load_file(path)
        if tensors.keys() != total.keys():
            only = sorted(tensors.keys() ^ total.keys())
            raise DilstoreError(f"{path}: other tensors than {paths[0]}, e.g. {only[0]!r} ({len(only)} differ)")
        for name, tensor in tensors.items():
            if tensor.shape != total[name].shape:
                raise DilstoreError(f"{path}: tensor {name!r} is {tuple(tensor.shape)}, "
                                    f"{tuple(total[name].shape)} in {paths[0]}")  # fmt: skip
            if tensor.is_floating_point():
                total[name] += tensor.to(torch.float32)
            elif not torch.equal(tensor, total[name]):
                raise DilstoreError(f"{path}: integer tensor {name!r} differs from {paths[0]}'s")
    return {name: (tensor / len(paths)).to(torch.float16).contiguous() if tensor.is_floating_point() else tensor
            for name, tensor in total.items()}  # fmt: skip


def average_readers(readers: list[Path], output: Path) -> dict[str, object]:
    """Write the averaged reader to `output` (which must not exist yet); returns its training record's
    "averaged_from"."""
    if len(readers) < 2:
        raise DilstoreError(f"give 2 or more readers to average, not {len(readers)}")
    if output.exists():
        raise DilstoreError(f"{output} exists already; give a new folder")
    check_same_reader_kind(readers)
    weights = [reader / "model.safetensors" for reader in readers]
    digests = [sha256(path) for path in weights]
    for index, digest in enumerate(digests):
        if digest in digests[:index]:
            raise DilstoreError(f"{readers[index]} holds the weights of {readers[digests.index(digest)]}: a reader "
                                "given twice would weigh double in a uniform average")  # fmt: skip
    averaged = average_weights(weights)
    output.mkdir(parents=True)
    save_file(averaged, output / "model.safetensors", metadata={"format": "pt"})
    for name in COPIED_FILES:
        if (readers[0] / name).is_file():
            shutil.copy2(readers[0] / name, output / name)
    record = {
        "method": "uniform float32 mean of every floating tensor, stored as fp16",
        "sources": [{"reader": str(reader), "sha256": digest} for reader, digest in zip(readers, digests)],
        "output_sha256": sha256(output / "model.safetensors"),
    }
    newest = readers[-1] / TRAINING_METADATA_FILE
    training = read_json_object(newest) if newest.is_file() else {}
    training["averaged_from"] = record
    (output / TRAINING_METADATA_FILE).write_text(json.dumps(training, indent=1) + "\n", encoding="utf-8")
    return record


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("readers", type=Path, nargs="+", help="reader folders of one architecture and k")
    parser.add_argument("--output", type=Path, required=True, help="the new reader folder")
    args = parser.parse_args(argv)
    try:
        record = average_readers(args.readers, args.output)
    except DilstoreError as error:
        raise SystemExit(f"average_readers: {error}") from None
    print(f"{args.output}: the mean of {len(args.readers)} readers")
    print(json.dumps(record))
    return 0


if __name__ == "__main__":
    sys.exit(main())
