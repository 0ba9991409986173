"""The end of a run: check every shard is committed, write the summary, then finalize the store.

Runs once, after every shard and dead-letter group has been written (the
pipeline feeds it the sum of all their counts). The summary and `rejected/`
are written before `storage.finalize`, which checksums every file present,
so they are covered by the manifest.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from dilstore.pipelines.append import retired_passages, skipped_documents
from dilstore.pipelines.job import PrecomputeJob
from dilstore.pipelines.run_stats import RunStats
from dilstore.pipelines.shard_sink import read_meta
from dilstore.pipelines.spec_file import SUMMARY_FILE
from dilstore.reader.text.files import read_json_object
from dilstore.storage.append import commit_append
from dilstore.storage.atomic_files import atomic_write_text
from dilstore.storage.errors import DilstoreError
from dilstore.storage.finalize import finalize
from dilstore.storage.format import MANIFEST_FILE
from dilstore.storage.location import StoreLocation
from dilstore.storage.manifest import read_manifest
from dilstore.storage.passage_files import REJECTED_DIR
from dilstore.storage.reader import open_store


def missing_shards(store: Path, num_shards: int, first_shard: int = 0, generation: str | None = None) -> list[int]:
    """Shard indices in [first_shard, first_shard + num_shards) without a commit marker `read_meta` trusts."""
    shards = range(first_shard, first_shard + num_shards)
    return [shard for shard in shards if read_meta(store, shard, generation) is None]


def run_summary(stats: RunStats, job: PrecomputeJob) -> dict[str, Any]:
    """The end-of-run summary: the counts, seconds since launch (`job.seconds_since_start`), runner, store and
    settings, and where the dead letters are, relative to the store (`rejected_records`: rejected/, or an append's
    own under appends/). The rate is None where no time is known to have passed (a worker's clock behind the
    launcher's), not the passages over 1e-9 s (time58 F2)."""
    written = Path(job.store).relative_to(job.append_to) if job.append_to is not None else Path()
    # This invocation's rate, as its progress bar shows it: a resumed shard's passages were encoded by an earlier
    # one (docs50 L1: 63.41/s against the bar's 29.39/s).
    resumed, seconds = job.resumed_passages(), job.seconds_since_start()
    return {
        **stats.to_dict(),
        "rejected_records": str(written / REJECTED_DIR),
        "seconds": round(seconds, 3),
        "passages_per_second": round((stats.passages - resumed) / seconds, 2) if seconds > 0 else None,
        "runner": job.runner,
        "store": job.destination or job.store,
        "shard_count": job.num_shards,
        "kind": job.kind,
        "layers": job.layers,
        "encoding": job.encoding,
        "split": job.strategy,
        "max_length": job.max_length,
    }


def read_summary(store: Path) -> dict[str, Any]:
    """The `run-summary.json` a finished run wrote in `store`, or {} when there is none; a DilstoreError naming
    the file when it holds no JSON object (cut short, or edited by hand)."""
    path = Path(store) / SUMMARY_FILE
    if not path.is_file():
        return {}
    return read_json_object(path, "a run summary (a JSON object)")


def finished_where(job: PrecomputeJob) -> str | None:
    """Where the job's Finish has already put its result (a store complete at its --output, or an append its store
    lists), in words; None while it has not, and for a replacement, which still has to be swapped in."""
    if job.append_to is not None:
        appends = read_manifest(StoreLocation.parse(job.append_to)).appends
        if any(record.get("generation") == job.generation for record in appends):
            return f"{job.append_to} holds this append"
    elif job.destination is None and (Path(job.store) / MANIFEST_FILE).is_file():
        return f"{job.store} is complete"
    return None


def finish_run(stats: RunStats, job: PrecomputeJob) -> dict[str, Any]:
    """Write `run-summary.json` and `rejected/`, then finalize the store, or commit an append into its store; the
    summary. An append that stored no passage is left uncommitted in its folder, with its dead letters.

    Raises DilstoreError, leaving the store unfinalized (a re-run completes
    it), when some shard has no commit marker.
    """
    store = Path(job.store)
    absent = missing_shards(store, job.num_shards, job.first_shard, job.generation)
    if absent:
        raise DilstoreError(f"{store}: shards {absent[:10]} are not committed; re-run to complete them")
    (store / REJECTED_DIR).mkdir(exist_ok=True)
    retire: list[str] = []
    if job.append_to is not None and job.replace and stats.passages > 0:  # an append that stores nothing is not made
        retire = retired_passages(Path(job.append_to), store, skipped_documents(job.inputs))
    summary = run_summary(stats, job)
    if job.append_to is not None and job.replace:
        summary["superseded"] = _stored_count(Path(job.append_to), retire)
    atomic_write_text(store / SUMMARY_FILE, json.dumps(summary, indent=1, sort_keys=True) + "\n")
    creation = {**job.creation, "summary": summary}
    if job.append_to is None:
        finalize(store, job.fingerprint, creation, generation=job.generation)
    elif job.generation is None:
        raise DilstoreError("an append needs its run's generation (pipelines/append.py sets it)")
    elif stats.passages == 0:
        pass  # an append that stored nothing is not committed: the store stays as it was, and the command says why
    else:
        commit_append(job.append_to, job.generation, job.fingerprint, creation, replace=job.replace, retire=retire)
    return summary


def _stored_count(store: Path, passage_ids: list[str]) -> int:
    """How many of `passage_ids` the store serves now: the passages an --append --replace supersedes (its
    documents' earlier passages, and those of pages it now skips), which its summary did not say (review45b L3)."""
    distinct = list(dict.fromkeys(passage_ids))
    with open_store(store) as opened:
        return len(distinct) - len(opened.missing(distinct))
