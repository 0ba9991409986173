"""Where a command may write: never inside the store it reads, whose files the manifest checksums."""

from __future__ import annotations

from pathlib import Path

from dilstore.storage.errors import DilstoreError


def refuse_output_inside_store(output: Path, store: str, flag: str) -> None:
    """A DilstoreError when `output` lies inside the local store `store` (a URL store cannot be written to here).

    A file written there would replace or add to the store's own files (`--output STORE/manifest.json` destroyed the
    store), and `dilstore verify` would then report the store as damaged.
    """
    if "://" in store:
        return
    root = Path(store).resolve()
    if output.resolve().is_relative_to(root):
        raise DilstoreError(f"{flag} {output} is inside the store {store}; write it elsewhere")
