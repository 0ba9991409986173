"""Where the checkpoints shipped inside the package are: the default DilBert reader, EARL ranker and Listformer.

Every command that reads answers (`precompute`, `ask`, `evaluate-qa`,
`evaluate-rc`) falls back to the reader when no `--model` is given,
`precompute --kind earl-s1|earl-s2` and `rerank` of an EARL store fall back
to the EARL ranker, and `precompute --kind listformer` and `rerank` of a
Listformer store to the Listformer. All are fine-tuned all-MiniLM-L6-v2 models stored as fp16 safetensors inside
the package, so an installed dilstore works with no download; the model card
next to the weights says how each was trained and what it scores.

The checkpoint folders stay physically at `reader/models/` (installed as
`dilstore/reader/models/`), not under `reader/packaged/`: moving some 100 MB
of weights would add them to the repository's history a second time for no
gain, so this module points at that folder instead.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from dilstore.storage.errors import DilstoreError

DEFAULT_CHECKPOINT_NAME = "dilbert-minilm-squad"
DEFAULT_RANKER_NAME = "earl-minilm-squad"
DEFAULT_LISTFORMER_NAME = "listformer-minilm-squad"


def packaged_models_dir() -> Path:
    """The folder inside the installed package that holds shipped checkpoints (`dilstore/reader/models`)."""
    return Path(__file__).resolve().parents[1] / "models"


def default_checkpoint_dir() -> Path:
    """The shipped default reader checkpoint folder; a DilstoreError says how to get one when it is missing."""
    return _shipped(DEFAULT_CHECKPOINT_NAME, "reader checkpoint", "train qa", "package_default_checkpoint.py")


def default_ranker_dir() -> Path:
    """The shipped default EARL checkpoint folder; a DilstoreError says how to get one when it is missing."""
    return _shipped(DEFAULT_RANKER_NAME, "EARL ranker checkpoint", "train earl", "package_default_ranker.py")


def default_listformer_dir() -> Path:
    """The shipped default Listformer checkpoint folder; a DilstoreError says how to get one when it is missing."""
    return _shipped(
        DEFAULT_LISTFORMER_NAME, "Listformer checkpoint", "train listformer", "package_default_ranker.py"
    )


def _shipped(name: str, what: str, train: str, package_script: str) -> Path:
    """packaged_models_dir()/name, or a DilstoreError saying how to train and package one."""
    path = packaged_models_dir() / name
    if not (path / "config.json").is_file():
        raise DilstoreError(
            f"the default {what} is missing: {path} has no config.json; pass --model DIR, "
            f"or train one with `dilstore {train}` and package it with benchmarks/{package_script}"
        )
    return path


def names_model(command: str) -> bool:
    """Whether a recorded `dilstore` command line gives --model, as `--model PATH` or `--model=PATH`: the second form
    was taken for the shipped model, and the advice to build the store again followed a model the user chose."""
    return any(word == "--model" or word.startswith("--model=") for word in _words(command))


def _words(command: str) -> list[str]:
    """A recorded command's words, as the shell splits them."""
    try:
        return shlex.split(command)
    except ValueError:  # a hand-edited record: its words as they stand
        return command.split()


def shipped_model_advice(
    creation: Mapping[str, Any], default_model: bool, appends: Sequence[Mapping[str, Any]] = ()
) -> str:
    """What to do when a store made with the model its dilstore shipped (its `creation` command names no `--model`)
    is opened with the model this dilstore ships (`default_model`: no --model given) and the two differ: the shipped
    checkpoints were retrained between versions, so a store built before an upgrade met a fingerprint table that
    blamed a "different model" and said nothing of what to do (upgrade58 F2). "" in every other case.

    `appends`: the manifest's records of the appends since. The command to build the store again is its precompute's,
    found below any compaction's record, followed by its appends' commands. Before, a compacted store was told to run
    `dilstore compact STORE --shards N --overwrite` (an option compact has not, and a compaction copies the states
    it has) whatever model its precompute named, and an appended store its first command alone, which dropped every
    appended passage; a command holding --overwrite got it twice (read58b F1)."""
    if not default_model:
        return ""
    commands = [record.get("command") for record in appends]
    while isinstance(creation.get("compacted_from"), Mapping):  # a compaction records the store it was made from
        before = creation["compacted_from"]
        commands = [record.get("command") for record in before.get("appends") or []] + commands
        creation = before.get("creation") if isinstance(before.get("creation"), Mapping) else {}
    command = creation.get("command")
    if not isinstance(command, str) or names_model(command) or not all(isinstance(each, str) for each in commands):
        return ""
    rebuild = command if "--overwrite" in _words(command) else f"{command} --overwrite"
    then = f", then append as before: {'; '.join(f'`{each}`' for each in commands)}" if commands else ""
    built = creation.get("finalized_at")
    when = f" ({built})" if isinstance(built, str) else ""
    return (f"The store was built{when} with the model its dilstore shipped, and this dilstore ships another: build "
            f"the store again with this one (`{rebuild}`{then}), or give --model the checkpoint that made it")
