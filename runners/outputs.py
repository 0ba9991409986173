"""Where a command may write: never inside the store or model it reads, onto an input, or into a folder that is
not there."""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dilstore.reader.packaged.shipped import packaged_models_dir
from dilstore.storage.errors import DilstoreError
from dilstore.storage.file_errors import path_limit
from dilstore.storage.format import FORMAT_NAME, MANIFEST_FILE, SPEC_FILE

# Room a store's folder needs in a file system's limits (port58 F3): the files beside it take its name with up to 21
# bytes more (`.NAME.dilstore-index-lock`; `.NAME.dilstore-building`, where --overwrite and compact build), and the
# longest path inside it, an append's shard being written (`appends/G/shards/.tmp-shard-NNNNN-UUID/passages/titles/
# offsets/zarr.json`), takes 115 bytes: 160 leaves room for more shards and deeper arrays.
BESIDE_STORE_BYTES = 21
INSIDE_STORE_BYTES = 160


# The bytes the files written beside an output file add to its name (port58 F4): the journal of a long run,
# `.NAME.dilstore-partial` (19), written through a temporary, `.tmp-JOURNAL.HOST-PID.XXXXXXXX.tmp` (35 more).
BESIDE_FILE_BYTES = 54


def check_file_name_length(output: Path, flag: str) -> None:
    """A DilstoreError naming `flag` when the name of the output file `output` leaves too little room, within the
    file system's NAME_MAX, for the files written beside it: a `--predictions` or `--output` named in 202 to 255
    bytes (a legal name) ended evaluate-qa, evaluate-rc and rerank after their first part's work with "cannot keep
    part 1 of the run in .NAME.dilstore-partial: File name too long; ... check its disk" (port58 F4)."""
    name = len(os.fsencode(output.name))
    most = path_limit(output.parent, "PC_NAME_MAX", 255) - BESIDE_FILE_BYTES
    if name > most:
        raise DilstoreError(f"{flag} {output}: its name is {name} bytes long, and this file system allows at most "
                            f"{most} here (the files written beside it as it is made, `.NAME.dilstore-partial` and "
                            f"its temporary, take the name with {BESIDE_FILE_BYTES} bytes more, within the "
                            f"{most + BESIDE_FILE_BYTES} of a file name); give a shorter name")  # fmt: skip


def check_store_path_length(output: Path, flag: str) -> None:
    """A DilstoreError naming `flag` when the store folder `output` leaves too little room for the files in and
    beside it within the file system's NAME_MAX and PATH_MAX: a path that fitted only the folder ran the whole
    encoding and failed at its first shard's write with "File name too long" and a 4,000-byte path, and a 240-byte
    name was "File name too long: .NAME.dilstore-lock", a file the user never named (port58 F3)."""
    resolved = output.resolve()
    above = next((folder for folder in (resolved, *resolved.parents) if folder.exists()), Path(resolved.anchor))
    name_max = path_limit(above, "PC_NAME_MAX", 255)
    path_max = path_limit(above, "PC_PATH_MAX", 4096)
    name = len(os.fsencode(resolved.name))
    if name + BESIDE_STORE_BYTES > name_max:
        raise DilstoreError(f"{flag} {output}: its name is {name} bytes long, and this file system allows a store's "
                            f"name at most {name_max - BESIDE_STORE_BYTES} (its lock file beside it takes the name "
                            f"with {BESIDE_STORE_BYTES} bytes more, within the {name_max} of a file name); give a "
                            "shorter name")  # fmt: skip
    length = len(os.fsencode(str(resolved)))
    if length + BESIDE_STORE_BYTES + INSIDE_STORE_BYTES >= path_max:
        room = path_max - 1 - BESIDE_STORE_BYTES - INSIDE_STORE_BYTES
        raise DilstoreError(f"{flag} {output}: its full path is {length} bytes long, and the files a store holds need "
                            f"it at most {room} (their paths below it must fit the {path_max} bytes of a path here); "
                            "give a shorter path")  # fmt: skip


def refuse_output_inside_store(output: Path, store: str, flag: str) -> None:
    """A DilstoreError when `output` lies inside the local store `store` (a URL store cannot be written to here).

    A file written there would replace or add to the store's own files (`--output STORE/manifest.json` destroyed the
    store), and `dilstore verify` would then report the store as damaged. A folder without a manifest is no store:
    the command names that itself, rather than blaming `flag`. A store given as a `file:` URL is its local folder, as
    its readers take it: `file:/abs/st` was looked for at ./file:/abs/st and `file:///abs/st` passed as remote, so
    an output inside either was written into the store (url59 F1). So is a chain whose last link is that folder
    (`simplecache::file:///abs/st`), which passed as remote (left60 F2).
    """
    from dilstore.storage.location import local_folder

    local = local_folder(store)
    if local is None:
        return
    root = local.resolve()
    if (root / MANIFEST_FILE).is_file() and output.resolve().is_relative_to(root):
        raise DilstoreError(f"{flag} {output} is inside the store {store}; write it elsewhere")


def refuse_output_inside_models(output: Path, model: Path | None, flag: str) -> None:
    """A DilstoreError when `output` lies inside the model folder read (`--model`) or among the shipped models.

    Written there it would replace the model's own files (`evaluate-rc --predictions MODEL/config.json`, `rerank
    --output MODEL/model.safetensors`) and leave a model that no longer loads.
    """
    for folder, what in ((model, "the model folder"), (packaged_models_dir(), "the shipped models")):
        if folder is not None and output.resolve().is_relative_to(Path(folder).resolve()):
            raise DilstoreError(f"{flag} {output} is inside {what} {folder}; write it elsewhere")


def refuse_store_inside_store(output: Path, flag: str, what: str = "the new store") -> None:
    """A DilstoreError when the new store (or other folder: `what`) `output` would lie inside a store (`is_store` of
    a folder above it): its files would swell that store's size, show as untracked in its `verify`, and go with
    it in an --overwrite."""
    for folder in output.resolve().parents:
        if is_store(folder):
            raise DilstoreError(f"{flag} {output} is inside the store {folder}; put {what} elsewhere")


def is_store(folder: Path) -> bool:
    """Whether `folder` holds a dilstore store: a manifest.json in dilstore's format, or the precompute.json of a
    store being built. Other tools name files manifest.json too (web apps, datasets), so the name alone is not
    enough."""
    manifest, spec = _json_object(folder / MANIFEST_FILE), _json_object(folder / SPEC_FILE)
    return manifest.get("format") == FORMAT_NAME or {"inputs", "fingerprint"} <= spec.keys()


def _json_object(path: Path) -> dict[str, Any]:
    """The JSON object in `path`, or {} when there is none (no regular file, unreadable, not JSON, not an object, or
    nested deeper than Python's parser goes: a RecursionError traceback, complex61 F7)."""
    if not path.is_file():  # a FIFO of that name would block the read
        return {}
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError, RecursionError):
        return {}
    return value if isinstance(value, dict) else {}


# What a plot may be written as: matplotlib picks the format by the suffix, and refuses .json after the work.
PLOT_SUFFIXES = (".png", ".svg", ".pdf")


def check_output_file(
    output: Path, flag: str, inputs: Sequence[Path], work: Path | None = None, suffixes: Sequence[str] = ()
) -> None:
    """A DilstoreError, before any work, when the file `output` could not be written or would overwrite an input,
    lies inside `work`, the folder (`--work`) where the run keeps its own files (a store, an index, task files),
    or, with `suffixes`, ends in none of them.

    Checked up front, a long evaluation is not lost to a typo in the path at its end. The file is written whole
    and renamed into place, which would replace a symbolic link, a device or a pipe (`--output /dev/null` as root
    replaced the machine's /dev/null with a file): those are refused, and so is `-`, which would be a file named `-`.
    """
    if str(output) == "-":
        raise DilstoreError(f"{flag} -: the output is written to a file, not to stdout; give its path")
    if output.is_symlink():
        raise DilstoreError(f"{flag} {output} is a symbolic link (to {os.readlink(output)}), which writing would "
                            "replace with a file; give the path it points to")  # fmt: skip
    if output.exists() and not output.is_file() and not output.is_dir():
        raise DilstoreError(f"{flag} {output} is not a regular file (a device, pipe or socket), which writing would "
                            "replace with a file; give a file path")  # fmt: skip
    if suffixes and output.suffix.lower() not in suffixes:
        raise DilstoreError(f"{flag} {output}: give a file ending in {', '.join(suffixes)}")
    if work is not None and output.resolve().is_relative_to(work.resolve()):
        raise DilstoreError(f"{flag} {output} is inside --work {work}, among the files the run keeps there; "
                            "write it elsewhere")  # fmt: skip
    if output.is_dir():
        raise DilstoreError(f"{flag} {output} is a directory; give a file path")
    if not output.parent.is_dir():
        raise DilstoreError(f"{flag} {output}: the folder {output.parent} does not exist")
    if not os.access(output.parent, os.W_OK | os.X_OK):  # a read-only mount, or another user's folder
        raise DilstoreError(f"{flag} {output}: the folder {output.parent} cannot be written to")
    check_file_name_length(output, flag)
    from dilstore.storage.replacement import sticky_keeps

    # The rename that writes the file is refused there (EPERM): an evaluation of hours failed at its end with
    # "Operation not permitted: DIR/.tmp-NAME... -> NAME" (perm57 F6).
    if sticky_keeps(output):
        raise DilstoreError(f"{flag} {output} belongs to another user, and its folder {output.parent} has the sticky "
                            "bit (as /tmp has), where only a file's owner may replace it; give another path, or have "
                            "its owner remove it")  # fmt: skip
    for given in inputs:
        if given.exists() and output.resolve() == given.resolve():
            raise DilstoreError(f"{flag} {output} is the input file {given}; write it elsewhere")


def check_output_option(parser: argparse.ArgumentParser, output: str | Path | None, flag: str) -> None:
    """check_output_file for a script that writes its result at the end: a usage error (exit 2) before the run, not
    a traceback after it (bench53 F16). Nothing to check where the option was not given."""
    if output is None:
        return
    try:
        check_output_file(Path(output), flag, [])
    except DilstoreError as error:
        parser.error(str(error))


def check_output_folder(output: Path, flag: str) -> None:
    """A DilstoreError naming `flag` when the folder `output` is an existing file (mkdir said only "File exists"),
    or lies under one (review46 L4: "Not a directory: OUTPUT/collection.sha256")."""
    if output.exists() and not output.is_dir():
        raise DilstoreError(f"{flag} {output}: is a file, not a folder")
    above = next((parent for parent in output.parents if parent.exists()), None)
    if above is not None and not above.is_dir():
        raise DilstoreError(f"{flag} {output}: {above} is a file, not a folder")
