"""Per-shard checksums: each writer hashes the files it wrote, finalize collects them.

Hashing where the bytes were just written (still in the page cache, on many
workers at once) keeps finalize from reading a whole corpus back through one
process. The shard group's attributes (its root `zarr.json`) list the size and
SHA-256 of every other file of the shard under `dilstore.files`; finalize
checks the listing against the files present and their sizes, copies the
hashes into the manifest and hashes the root `zarr.json` itself. `dilstore
verify` then re-hashes every byte against the manifest.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from dilstore.storage.arrays import local_group
from dilstore.storage.digests import sha256_file
from dilstore.storage.format import ATTRIBUTES_KEY, ZARR_METADATA_FILE, StoreFormatError
from dilstore.storage.manifest import FileEntry

_HASH_THREADS = 4


def _data_files(directory: Path) -> list[str]:
    """Every file under `directory` except its root zarr.json, as sorted '/'-separated paths."""
    return sorted(
        name for name in (path.relative_to(directory).as_posix() for path in directory.rglob("*") if path.is_file())
        if name != ZARR_METADATA_FILE
    )


def record_checksums(directory: Path) -> None:
    """Hash every file of the group at `directory` and add the listing to its dilstore attributes."""
    files = _data_files(directory)
    with ThreadPoolExecutor(max_workers=_HASH_THREADS) as pool:
        digests = list(pool.map(lambda name: sha256_file(directory / name), files))
    listing = {
        name: {"bytes": (directory / name).stat().st_size, "sha256": digest}
        for name, digest in zip(files, digests, strict=True)
    }
    group = local_group(directory, mode="r+", zarr_format=3)
    group.update_attributes({ATTRIBUTES_KEY: {**group.attrs[ATTRIBUTES_KEY], "files": listing}})


def read_checksums(directory: Path) -> dict[str, FileEntry]:
    """A shard's recorded checksums after checking that they list exactly its files, at their sizes."""
    path = directory / ZARR_METADATA_FILE
    try:
        listing = json.loads(path.read_text(encoding="utf-8"))["attributes"][ATTRIBUTES_KEY]["files"]
        recorded = {name: FileEntry(**entry) for name, entry in listing.items()}
    except FileNotFoundError:
        raise StoreFormatError(f"{path} is missing: {directory.name} is not a shard") from None
    except (ValueError, TypeError, KeyError, AttributeError) as error:
        raise StoreFormatError(f"{path} holds no file checksums ({type(error).__name__}: {error}); "
                               "was the shard written by write_shard?") from None
    present = {name: (directory / name).stat().st_size for name in _data_files(directory)}
    changed = sorted(
        set(present) ^ set(recorded)
        | {name for name in present.keys() & recorded.keys() if present[name] != recorded[name].bytes}
    )
    if changed:
        raise StoreFormatError(
            f"{directory} changed after it was written (files added, removed or resized: {', '.join(changed[:5])}); "
            "write the shard again"
        )
    return recorded
