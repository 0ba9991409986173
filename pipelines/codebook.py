"""The sampling pass of a 2bit/1bit run: train the store's codebook before any shard is encoded.

Codes are only comparable across shards when every shard uses the same
codebook, so the codebook is made once, in the launcher, before the Beam job:

1. read the inputs and keep the `CODEBOOK_SAMPLE_UNITS` documents whose id has the
   smallest seeded hash (a uniform sample that does not depend on file order
   or runner; of a duplicate id, the document the store keeps; only the
   sampled documents are split and tokenized);
2. run the offline layers on their passages and keep a seeded sample of at
   most `CODEBOOK_SAMPLE_TOKENS` token states;
3. train the codebook (storage.encodings.train_codebook; rotated codes where
   the kind wants them, reader.offline.kinds) and write it to
   `STORE/codebook/` (storage.codebook), where every shard writer reads it.

A codebook given with `--codebook` (e.g. another store's `codebook/` folder,
to append passages with the same codes) is copied there instead, and a resumed
run reuses the one already in the store. The folder is the one being built:
the store itself, or with --overwrite the replacement beside it. The codebook
records the run's build and model like every shard, and how many token states
it was trained on (storage.codebook): one trained on fewer than
`MIN_REUSE_TOKENS` is refused by an append or a `--codebook` run
(`too_few_to_reuse`), and one trained on fewer than `SMALL_SAMPLE_TOKENS` fits
those passages better than new ones, so such a run measures it on its own
states (`codebook_fit`) first.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from dilstore.pipelines.corpora import Document
from dilstore.pipelines.duplicate_ids import keep_order
from dilstore.pipelines.job import PrecomputeJob
from dilstore.pipelines.routing import SHARD, ReadTask, RouteSettings, read_task, route
from dilstore.pipelines.sharding import stable_hash
from dilstore.reader.batching import BatchPolicy
from dilstore.reader.offline.encoding import TokenizedPassage, encode_batch, encode_tokenized
from dilstore.reader.offline.kinds import OfflineModel, offline_kind
from dilstore.storage.codebook import (
    CODEBOOK_DIR,
    codebook_build,
    codebook_sample_tokens,
    distinct_centroids,
    read_codebook,
    write_codebook,
)
from dilstore.storage.encodings import round_trip, train_codebook
from dilstore.storage.errors import DilstoreError
from dilstore.storage.fingerprint import Fingerprint, fingerprint_sha256
from dilstore.storage.residual_codes import (
    CENTROIDS,
    CODEBOOK_SAMPLE_TOKENS,
    CODEBOOK_SAMPLE_UNITS,
    CODEBOOK_SEED,
    MIN_REUSE_TOKENS,
    SMALL_SAMPLE_TOKENS,  # noqa: F401 (read here by runners.cmd_precompute)
    sample_rows,
)
from dilstore.storage.writer import build_attributes, refuse_non_finite


def sample_documents(
    inputs: Iterable[ReadTask], limit: int, strategy: str, seed: int = CODEBOOK_SEED
) -> list[Document]:
    """The `limit` documents whose `stable_hash(seed, id)` is smallest, in that hash order, in one pass.

    Of several documents with one id, the one the store keeps (the first in `keep_order` for the run's `strategy`
    split), so that with a duplicate id across --input files the codebook never learns from a document the
    pipeline rejects. Only the current `limit` ids are held, never every id of the corpus.
    """
    kept: dict[str, Document] = {}  # the ids of the `limit` smallest keys so far -> the document the store keeps
    largest: list[_Largest] = []  # their keys, the largest on top

    for task in inputs:
        for record in read_task(task):
            if not isinstance(record, Document):
                continue
            if record.id in kept:
                if keep_order(record, strategy) < keep_order(kept[record.id], strategy):
                    kept[record.id] = record
                continue
            key = _Largest(_sample_key(record.id, seed))
            if len(kept) < limit:
                heapq.heappush(largest, key)
            elif largest and key.key < largest[0].key:
                del kept[heapq.heapreplace(largest, key).key[1]]
            else:
                continue
            kept[record.id] = record
    return sorted(kept.values(), key=lambda document: _sample_key(document.id, seed))


def _sample_key(doc_id: str, seed: int) -> tuple[int, str]:
    """Where a document id falls in the seeded sample order (the id breaks the unlikely tie of two hashes)."""
    return stable_hash(f"{seed}\0{doc_id}"), doc_id


@dataclass(frozen=True)
class _Largest:
    """A sample key that heapq, a min-heap, keeps with the largest on top."""

    key: tuple[int, str]

    def __lt__(self, other: _Largest) -> bool:
        return self.key > other.key


def sample_states(
    documents: Iterable[Document], settings: RouteSettings, reader: OfflineModel, policy: BatchPolicy
) -> np.ndarray:
    """A seeded sample of at most CODEBOOK_SAMPLE_TOKENS token states `(N, *S)` of the documents' stored units."""
    states = _all_states(documents, settings, reader, policy)
    if states is None:
        raise DilstoreError("the codebook sample holds no passage to encode; give one with --codebook")
    return states[sample_rows(len(states), CODEBOOK_SAMPLE_TOKENS)]  # (N, *S)


def _all_states(
    documents: Iterable[Document], settings: RouteSettings, reader: OfflineModel, policy: BatchPolicy
) -> np.ndarray | None:
    """Every token state `(N, *S)` of the documents' stored units, or None when they have none; a passage with a NaN
    or infinite state is refused as the shard writers refuse it."""
    pieces: list[TokenizedPassage] = [
        value  # type: ignore[misc]  # SHARD keys carry tokenized passages
        for document in documents
        for key, value in route(document, settings, reader.tokenizer)
        if key[0] == SHARD
    ]
    if not pieces:
        return None
    records = encode_tokenized(reader, settings.kind, pieces, policy)
    for record in records:  # kmeans2 on a NaN was a scipy traceback naming no passage (codes51 F4)
        refuse_non_finite(record.id, record.states)
    return np.concatenate([record.states for record in records])


def check_codebook_fits(path: Path, encoding: str, kind: str, reader: OfflineModel) -> None:
    """Refuse, before any work, a --codebook made for states of another shape than `reader` makes as `kind`.

    The shard writers check every codebook too, but only inside the pipeline,
    after the store folder was begun: a Listformer store's codebook given to an
    EARL S2 run was a traceback there, with a half-made store left behind.
    """
    _, shape = read_codebook(path, encoding)
    probe = np.asarray(reader.tokenizer.encode("codebook probe"), dtype=np.int64)  # (n,)
    states, _ = encode_batch(reader, kind, [probe])  # [(n, *S)]
    made = tuple(states[0].shape[1:])
    if tuple(shape) != made:
        raise DilstoreError(f"--codebook {path} is for states of shape {tuple(shape)}, but this model's {kind} "
                            f"states have shape {made}: give the codebook of a store of this model and kind "
                            f"({kind})")  # fmt: skip


# SMALL_SAMPLE_TOKENS and MIN_REUSE_TOKENS (storage.residual_codes): the sample sizes below which a codebook is
# measured, or refused, before an --append or a --codebook run reuses it.

# How much worse than a codebook trained on a run's own sample a --codebook made for another model may encode it
# (relative error): a frozen-lower reader's states are its base's, which its base's codebook fits as well as a new
# one; another model's states got 0.954 against 0.322 (BENCHMARKS.md), near what all-zero states give (1.0).
FOREIGN_CODEBOOK_SLACK = 1.5
# The fewest token states each half of the fit's sample needs for a verdict: on a few passages a codebook trained
# on half of them is no yardstick (its held-out error was 0.63 on 5 MS MARCO passages).
FIT_MIN_TOKENS = 1000


def too_few_to_reuse(path: Path, encoding: str) -> str | None:
    """Why the codebook at `path` was trained on too few token states to code an append's or a --codebook run's
    passages (MIN_REUSE_TOKENS), in words that follow its path; None when it was not, or cannot tell.

    The count is the one it records (`sample_tokens`); a codebook that records none was written before the count
    was, when k-means trained one centroid per sample token up to CENTROIDS, so fewer distinct centroid rows than
    CENTROIDS at a vector position are its sample (storage.codebook `distinct_centroids`). One without centroids,
    or with all CENTROIDS distinct, is measured as before (`codebook_fit`).
    """
    why = (f"fewer than the {MIN_REUSE_TOKENS:,} a codebook needs to code passages it did not see (2bit relative "
           "error about 0.31 at 256 and 0.24 at 512 token states, against 0.17 for a full sample)")  # fmt: skip
    count = codebook_sample_tokens(path)
    if count is not None:
        return f"was trained on only {count:,} token states, {why}" if count < MIN_REUSE_TOKENS else None
    distinct = distinct_centroids(path, encoding)
    if distinct is None or distinct >= CENTROIDS:
        return None
    return (f"does not record how many token states it was trained on, and has only {distinct:,} distinct centroids "
            f"of {CENTROIDS}: written before the count was, when a codebook trained one centroid per sample token, "
            f"it was trained on {distinct:,} token states, {why}")


def codebook_fit(path: Path, job: PrecomputeJob, reader: OfflineModel) -> tuple[float, float] | None:
    """The relative error ||x - x̂|| / ||x|| with which the codebook at `path` encodes held-out states of this run,
    and with which a codebook trained on the rest does; None when the sample is too small to tell (FIT_MIN_TOKENS).

    The sampling pass's documents (as a run without --codebook takes them), every other one held out, and held-out
    states equal to a training state dropped: neither codebook is scored on what it was trained on (a corpus of
    repeated text gave the trained one an error of 0).
    """
    documents = sample_documents(job.inputs, CODEBOOK_SAMPLE_UNITS, job.strategy)
    halves = [_all_states(documents[start::2], job.route_settings(), reader, job.policy) for start in (0, 1)]
    if any(half is None for half in halves):
        return None
    training, held_out = halves  # (N, *S) each
    training = training[sample_rows(len(training), CODEBOOK_SAMPLE_TOKENS)]
    held_out = held_out[sample_rows(len(held_out), CODEBOOK_SAMPLE_TOKENS)]
    seen = {hash(row.tobytes()) for row in training}
    held_out = held_out[[hash(row.tobytes()) not in seen for row in held_out]]
    if min(len(training), len(held_out)) < FIT_MIN_TOKENS:
        return None
    given, _ = read_codebook(path, job.encoding)
    trained = train_codebook(job.encoding, training, rotate=offline_kind(job.kind).rotated_codes)
    norm = float(np.linalg.norm(held_out))
    errors = [float(np.linalg.norm(held_out - round_trip(job.encoding, book)(held_out))) / norm
              for book in (given, trained)]  # fmt: skip
    return errors[0], errors[1]


def codebook_in_place(job: PrecomputeJob) -> bool:
    """Whether the folder being built holds this build's codebook already (a resumed run), so none is copied."""
    target = Path(job.store) / CODEBOOK_DIR
    return target.is_dir() and codebook_build(target) == build_attributes(job.generation, job.fingerprint)


def made_for_another_model(path: Path, fingerprint: Fingerprint) -> bool:
    """Whether the codebook at `path` records the fingerprint of a store of another model or other settings.

    Its codes then fit this run's states only if they are that model's too (a
    reader trained with its lower layers frozen): a codebook of a model of the
    same width otherwise encodes every state several times worse, unseen by
    `verify`. A codebook that records none (one `train qa` wrote) cannot tell.
    """
    recorded = codebook_build(path).get("fingerprint_sha256")
    return recorded is not None and recorded != fingerprint_sha256(fingerprint)


def prepare_codebook(job: PrecomputeJob, reader: OfflineModel) -> Path:
    """Make sure `job.store/codebook/` holds this build's codebook (see the module docstring); its path.

    A codebook already there is reused only when it records this run's build
    and model (a resumed run); one of another build is replaced, as a shard
    of another build is written again.
    """
    target = Path(job.store) / CODEBOOK_DIR
    if codebook_in_place(job):
        return target
    if job.codebook is not None:
        codebook, state_shape = read_codebook(job.codebook, job.encoding)
        sample_tokens = codebook_sample_tokens(job.codebook)  # the copy tells what it was trained on, as the original
    else:
        documents = sample_documents(job.inputs, CODEBOOK_SAMPLE_UNITS, job.strategy)
        sample = sample_states(documents, job.route_settings(), reader, job.policy)  # (N, *S)
        rotate = offline_kind(job.kind).rotated_codes
        codebook, state_shape = train_codebook(job.encoding, sample, rotate=rotate), sample.shape[1:]
        sample_tokens = len(sample)
    return write_codebook(target, job.encoding, codebook, state_shape, generation=job.generation,
                          fingerprint=job.fingerprint, sample_tokens=sample_tokens)
