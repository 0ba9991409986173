"""The project's per-shard sink: everything one shard group writes, as plain functions.

For shard s, one call writes, in this order:

1. `passages/part-s.parquet`: id, doc_id, title, text of each stored unit;
2. `passages/jsonl/part-s.jsonl`: `{"id", "contents"}` (title, newline, text)
   for pyserini's JsonCollection;
3. the store shard `shards/shard-s` (`storage.writer.write_shard`);
4. `passages/meta/part-s.json`: the shard's counts, written last. It is the
   shard's commit marker: a re-run skips a shard whose marker exists
   (ColBERT-style resume), and rewrites, byte-identically, any shard killed
   before it.

Every file is written atomically (temporary name, then rename) and its bytes
depend only on the shard's records, sorted by id, so a retried bundle or a
re-run writes the same bytes whatever the runner's order. Beam's own
WriteToParquet/WriteToText are not used: on the Dask runner they write empty
files.

A shard that the hash leaves empty gets only its marker (the store holds no
empty shards). Dead letters go to `rejected/part-r.jsonl` the same way.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Container, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from dilstore.pipelines.corpora import Rejected
from dilstore.pipelines.run_stats import RunStats
from dilstore.reader.batching import BatchPolicy
from dilstore.reader.offline.encoding import TokenizedPassage, encode_tokenized
from dilstore.reader.offline.kinds import OfflineModel
from dilstore.storage.atomic_files import atomic_write_bytes, atomic_write_text
from dilstore.storage.codebook import read_codebook
from dilstore.storage.collection import collection_jsonl
from dilstore.storage.fingerprint import Fingerprint
from dilstore.storage.passage_files import jsonl_path, meta_path, parquet_path, rejected_path
from dilstore.storage.passage_tables import passage_table_bytes
from dilstore.storage.writer import shard_generation, shard_written, write_shard


@dataclass(frozen=True)
class ShardSettings:
    """What every shard writer of one run shares.

    compressor: None (uncompressed, memory-mappable) or a storage compressor
    name ("zstd", "blosc") applied to every array of the store shard.
    codebook: the store's codebook folder (2bit/1bit), read by every shard writer.
    generation: the run's build id (pipelines.spec_file.spec_generation), recorded
    in every shard with the model's fingerprint hash.
    """

    store: str
    kind: str
    encoding: str
    policy: BatchPolicy
    compressor: str | None = None
    codebook: str | None = None
    generation: str | None = None
    fingerprint: Fingerprint | None = None


def read_meta(store: Path, shard: int, generation: str | None = None) -> RunStats | None:
    """The counts of a shard already committed by an earlier attempt of this build, or None.

    A commit marker is not trusted, and the shard is written again, when its
    store shard belongs to another build (a second writer with other
    settings, before the write lock), or when it counts passages but a file
    written before it is gone (a shard folder deleted by hand or by a partial
    copy: trusting it finalized a store that silently lacked the shard). Nor is one that does not read as counts (a
    disk's damage: NUL bytes, a cut line), which ended a resumed `precompute` with a JSONDecodeError, TypeError or
    AttributeError traceback (fuzz60 F11).
    """
    path = meta_path(store, shard)
    if not path.is_file():
        return None
    if shard_generation(store, shard) not in (None, generation):
        return None
    try:
        stats = RunStats.from_dict(json.loads(path.read_text(encoding="utf-8")))
    except (ValueError, TypeError, AttributeError, RecursionError):  # UnicodeDecodeError is a ValueError
        return None
    return stats if not stats.passages or shard_outputs_present(store, shard) else None


def committed_passages(settings: ShardSettings, shards: Iterable[int]) -> int:
    """The passages of `shards` that earlier attempts of this build committed: what a resumed run finds done."""
    committed = (read_meta(Path(settings.store), shard, settings.generation) for shard in shards)
    return sum(stats.passages for stats in committed if stats is not None)


def committed_shards(settings: ShardSettings, shards: Iterable[int]) -> frozenset[int]:
    """Those of `shards` that earlier attempts of this build committed: the ones a run starting now resumes."""
    return frozenset(shard for shard in shards if read_meta(Path(settings.store), shard, settings.generation))


def shard_outputs_present(store: Path, shard: int) -> bool:
    """Whether the passage tables and the store shard, which a shard with passages writes before its marker, exist."""
    tables = (parquet_path(store, shard), jsonl_path(store, shard))
    return all(path.is_file() for path in tables) and shard_written(store, shard)


def write_shard_outputs(
    settings: ShardSettings,
    shard: int,
    pieces: Sequence[TokenizedPassage],
    reader: OfflineModel,
    on_batch: Callable[[int], None] | None = None,
    committed_before: Container[int] | None = None,
) -> RunStats:
    """Encode with `reader` and write one shard group (see the module docstring); its counts.

    `pieces` must be sorted by id. A shard whose marker exists is not
    recomputed: its counts come back with shards_resumed = 1 when the shard is
    one of `committed_before` (those committed before the run started; None:
    every marker found), and 0 for a retry of this run's own task, whose
    first attempt committed it before its worker died: that is no resume
    (dask50 F7).
    """
    store = Path(settings.store)
    done = read_meta(store, shard, settings.generation)
    if done is not None:
        resumed = committed_before is None or shard in committed_before
        return RunStats(**{**done.to_dict(), "shards_resumed": int(resumed)})
    written = 0  # bytes the shard added to disk: its store folder and its passage tables
    if pieces:
        records = encode_tokenized(reader, settings.kind, pieces, settings.policy, on_batch)
        tables = {parquet_path(store, shard): passage_table_bytes(pieces),
                  jsonl_path(store, shard): collection_jsonl(pieces).encode("utf-8")}  # fmt: skip
        for path, data in tables.items():
            atomic_write_bytes(path, data)
        codebook = None if settings.codebook is None else read_codebook(settings.codebook, settings.encoding)[0]
        summary = write_shard(
            store, shard, records, kind=settings.kind, encoding=settings.encoding, compressor=settings.compressor,
            codebook=codebook, generation=settings.generation, fingerprint=settings.fingerprint,
        )  # fmt: skip
        written = summary.bytes + sum(len(data) for data in tables.values())
    stats = RunStats(
        passages=len(pieces),
        tokens=sum(piece.length for piece in pieces),
        shards=1 if pieces else 0,
        bytes=written,
    )
    atomic_write_text(meta_path(store, shard), json.dumps(stats.to_dict(), sort_keys=True) + "\n")
    return stats


def _rejected_order(record: Rejected) -> tuple[str, bool, int, str, str]:
    """Dead letters sorted by file, then line number (numbers first), then id and reason."""
    position = record.line_or_id
    is_line = isinstance(position, int)
    return (record.source, not is_line, position if is_line else 0, "" if is_line else str(position), record.reason)


def write_rejected_part(store: str, part: int, records: Iterable[Rejected]) -> RunStats:
    """Write one dead-letter file (JSONL, one `{"source", "line_or_id", "reason"}` per line); its counts: records
    rejected whole, and passages left out (a record all of whose passages are left out is counted by `route`)."""
    ordered = sorted(records, key=_rejected_order)
    atomic_write_text(rejected_path(Path(store), part), "".join(f"{record.to_json()}\n" for record in ordered))
    passages = sum(record.passage is not None for record in ordered)
    return RunStats(rejected=len(ordered) - passages, rejected_passages=passages)
