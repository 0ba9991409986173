"""One precompute run's settings, as one picklable value every worker gets.

`PrecomputeJob` carries what workers need (inputs, split, shard count, model
reference and fingerprint, encoding, compressor, batch policy, threads, where
to report progress). `run_spec` is the part that decides the store's contents:
a re-run may resume a store only when its spec is the same, and the spec is
written to `STORE/precompute.json` before any shard, so a later run can tell.
`prepare_store` makes the output folder ready for a run (start, resume, or
refuse, or with overwrite delete and start again); tests call it directly.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dilstore.pipelines.routing import ReadTask, RouteSettings
from dilstore.pipelines.shard_sink import ShardSettings
from dilstore.reader.batching import BatchPolicy
from dilstore.storage.atomic_files import atomic_write_text
from dilstore.storage.errors import DilstoreError
from dilstore.storage.fingerprint import Fingerprint
from dilstore.storage.format import MANIFEST_FILE

SPEC_FILE = "precompute.json"
SUMMARY_FILE = "run-summary.json"


@dataclass(frozen=True)
class PrecomputeJob:
    """Everything a precompute run's workers share.

    store: absolute local path of the output store. model: a path or a
    packaged-model reference (reader/offline/encoding.py). started_at: launch time
    (epoch seconds) for the summary's `seconds`. progress_dir: folder for
    live progress files (local runners), or None. compressor: None
    (uncompressed, memory-mappable) or a storage compressor name ("zstd",
    "blosc"). creation: facts recorded in the manifest (command line, runner).
    """

    inputs: tuple[ReadTask, ...]
    store: str
    strategy: str
    num_shards: int
    max_length: int
    model: str
    fingerprint: Fingerprint
    policy: BatchPolicy
    threads: int
    runner: str
    started_at: float
    progress_dir: str | None = None
    compressor: str | None = None
    generation: str | None = None
    creation: dict[str, Any] = field(default_factory=dict, compare=False)

    @property
    def kind(self) -> str:
        return self.fingerprint.kind

    @property
    def layers(self) -> int:
        """The split point: k for dilbert, the query layers N for the EARL kinds."""
        return self.fingerprint.layers

    @property
    def encoding(self) -> str:
        return self.fingerprint.encoding

    def route_settings(self) -> RouteSettings:
        return RouteSettings(
            strategy=self.strategy, num_shards=self.num_shards, max_length=self.max_length, kind=self.kind
        )

    def shard_settings(self) -> ShardSettings:
        return ShardSettings(
            store=self.store, kind=self.kind, encoding=self.encoding, policy=self.policy, compressor=self.compressor,
            generation=self.generation, fingerprint=self.fingerprint,
        )  # fmt: skip


def run_spec(job: PrecomputeJob) -> dict[str, Any]:
    """What fixes a store's contents: inputs (path, size, modification time), format, split, shards, model
    fingerprint, compression.

    The modification time makes an input edited in place (same size) a
    different spec, so a re-run does not call the old store complete.
    `compression` is only present for a compressed store.
    """
    spec: dict[str, Any] = {"inputs": [_input_entry(task.path, task.format) for task in job.inputs],
        "split": job.strategy,
        "shards": job.num_shards,
        "fingerprint": job.fingerprint.to_dict(),
    }
    if job.compressor is not None:
        spec["compression"] = job.compressor
    return spec


def _input_entry(path: str, format: str) -> dict[str, Any]:
    """One input as the spec records it: what the file is now, by size and modification time (ns)."""
    status = Path(path).stat()
    return {"path": path, "format": format, "bytes": status.st_size, "mtime_ns": status.st_mtime_ns}


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
    """The spec an earlier run wrote into `store`, or None when there is none."""
    path = store / SPEC_FILE
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise DilstoreError(f"{path}: cannot read the earlier run's settings: {error}") from error


def spec_differences(found: dict[str, Any], wanted: dict[str, Any]) -> list[str]:
    """Top-level spec entries that differ (names only, for an error message)."""
    return sorted(key for key in found.keys() | wanted.keys() if found.get(key) != wanted.get(key))


def prepare_store(store: Path, spec: dict[str, Any], overwrite: bool) -> bool:
    """Make `store` ready for this run's spec; True when it is already complete with that spec.

    An empty or absent folder is started; a folder holding an earlier run of
    the same spec is resumed (or, when finalized, left as it is); anything
    else is refused unless `overwrite`, which deletes the folder. It runs
    once, before the pipeline starts, so no worker ever sees a half-prepared store.
    """
    if store.exists() and not store.is_dir():
        raise DilstoreError(f"--output {store} exists and is not a directory")
    if store.is_dir() and any(store.iterdir()):
        found = read_spec(store)
        if found == spec:
            return (store / MANIFEST_FILE).is_file()
        if not overwrite:
            if found is None:
                raise DilstoreError(
                    f"--output {store} is not empty and was not made by `dilstore precompute`; "
                    "choose another folder or pass --overwrite"
                )
            raise DilstoreError(
                f"--output {store} holds a run with other settings (differs in: "
                f"{', '.join(spec_differences(found, spec))}); choose another folder or pass --overwrite"
            )
        shutil.rmtree(store)
    atomic_write_text(store / SPEC_FILE, spec_json(spec))
    return False

