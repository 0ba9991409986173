"""A store's spec file (`precompute.json`: the settings that decide its contents) and its run summary's name.

Apart from `pipelines/job.py`, which pulls in the model code (and torch) through the routing, so that a
command that only reads or copies stores (`compact`) starts as fast as `info` does (scale45 L1: 3-5 s and
about 250 MB more).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from dilstore.storage.errors import DilstoreError
from dilstore.storage.format import SPEC_FILE

SUMMARY_FILE = "run-summary.json"


def spec_generation(spec: dict[str, Any]) -> str:
    """The build id of a run: the first 16 hex digits of the SHA-256 of its spec file's text.

    Equal specs give equal ids, so a resumed run writes the same bytes as an
    uninterrupted one; any other spec (another k, model, input or encoding)
    gives another id, which every shard and the manifest record, so a reader
    never mixes shards of two builds.
    """
    return hashlib.sha256(spec_json(spec).encode("utf-8")).hexdigest()[:16]


def spec_json(spec: dict[str, Any]) -> str:
    """The spec file's text (sorted keys, so equal specs are equal bytes)."""
    return json.dumps(spec, indent=1, sort_keys=True, ensure_ascii=False) + "\n"


def read_spec(store: Path) -> dict[str, Any] | None:
    """The spec an earlier run wrote into `store`, or None when there is none. One that holds no JSON object (`[1]`)
    was taken as it was, and `dilstore compact` ended with "TypeError: 'list' object is not a mapping" (fuzz60 F12).
    """
    path = store / SPEC_FILE
    if not path.is_file():
        return None
    try:
        spec = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError) as error:  # not UTF-8 or JSON, a long integer (fuzz60 F3), too deep
        raise DilstoreError(f"{path}: cannot read the earlier run's settings: {error}") from error
    if not isinstance(spec, dict):
        raise DilstoreError(f"{path}: cannot read the earlier run's settings: a JSON {type(spec).__name__}, not an "
                            "object")  # fmt: skip
    return spec
