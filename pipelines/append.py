"""`precompute --append`: what the launcher does before the Beam job adds shards to a finalized store.

1. `check_store_settings`: the run must make what the store holds (the model
   fingerprint: model, kind, k, encoding, max length; the compression; the
   split), and a 2bit/1bit run uses the store's own `codebook/` (a `--codebook`
   that differs is refused); one line names what differs. A `codebook/` whose
   files no longer match the manifest's SHA-256s is refused too, naming them.
2. `refuse_duplicates`: an input document id given twice, or a passage id the
   store already holds, is refused before any model runs, unless `--replace`
   (then the first document of an id is kept, as in any run, and the new rows
   supersede the stored ones). The commit checks the stored ids again, exactly,
   window ids included (storage.append). With `--replace` a document replaces
   every stored passage of its id, also those its new version no longer has
   (`retired_passages`, from the passage tables, at the commit), and a
   Wikipedia page the input skips (now a redirect, a disambiguation page or
   another namespace: `skipped_documents`) retires the stored passages of its id.
   Before anything is written, `check_stored_tables` refuses a store whose
   passage tables do not describe their shards, as their doc_ids decide which
   rows are superseded.
3. `prepare_append`: the run's build id (generation) comes from its spec, as
   for any run, plus `replace`; the run writes into `STORE/appends/<generation>/`,
   numbering its shards from the store's first free shard. A folder of the same
   spec and first shard (a killed run) is resumed, anything else there is
   removed, and so are the leftovers of other killed appends. When the store's
   manifest already lists the generation, the append is complete.

The Beam job then runs as usual with the append folder as its store, and its
last step commits the folder into the store (pipelines/finish.py,
storage.append.commit_append).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dilstore.pipelines.corpora import Document, Skipped
from dilstore.pipelines.job import PrecomputeJob, retimed_inputs, run_spec
from dilstore.pipelines.passages import split_document
from dilstore.pipelines.routing import ReadTask, read_task
from dilstore.pipelines.spec_file import read_spec, spec_generation, spec_json
from dilstore.storage.append import (
    AppendMismatchError,
    fingerprint_differences,
    first_free_shard,
    remove_leftovers,
)
from dilstore.storage.atomic_files import atomic_write_text
from dilstore.storage.codebook import CODEBOOK_DIR, codebook_digest, read_codebook, refuse_changed_codebook
from dilstore.storage.encodings import needs_codebook
from dilstore.storage.errors import DilstoreError
from dilstore.storage.file_errors import remove_tree
from dilstore.storage.format import APPENDS_DIR, BUILD_ID, SPEC_FILE, StoreFormatError, append_dir
from dilstore.storage.location import StoreLocation
from dilstore.storage.manifest import Manifest, read_manifest
from dilstore.storage.messages import listed
from dilstore.storage.passage_tables import (
    checked_document_ids,
    has_tables,
    passage_column,
    passage_tables,
    shard_table,
)
from dilstore.storage.reader import open_store


@dataclass(frozen=True)
class AppendPlan:
    """Where an append writes: its build id, folder and first shard; `committed` when the store lists it already."""

    generation: str
    folder: Path
    first_shard: int
    committed: dict[str, Any] | None  # the manifest's record of this append, when it is committed


def check_store_settings(store: Path, job: PrecomputeJob) -> Manifest:
    """The store's manifest, after checking the run makes what the store holds (AppendMismatchError otherwise,
    naming every difference at once: the model fingerprint's, the compression, the split and the codebook)."""
    manifest = read_manifest(StoreLocation.parse(store))
    model = fingerprint_differences(manifest.fingerprint, job.fingerprint)
    differing = [model] if model else []
    if manifest.shards and manifest.compressor != job.compressor:
        differing.append(f"compression: store {manifest.compressor or 'none'}, this run {job.compressor or 'none'}")
    split = (read_spec(store) or {}).get("split")
    if split is not None and split != job.strategy:
        differing.append(f"split: store {split!r}, this run {job.strategy!r}")
    if needs_codebook(job.encoding) and job.encoding == manifest.fingerprint.encoding:  # else not the same codebook
        differing += _codebook_differences(store, job)
    if differing:
        # The shipped model's weights alone: a run of another --encoding or --max-length was told that this dilstore
        # ships another model (read58b F2).
        retrained = "weights_sha256" in manifest.fingerprint.differences(job.fingerprint)
        advice = _shipped_model_advice(manifest, job) if retrained else ""
        raise AppendMismatchError(f"cannot append to {store}: the store was made with other settings "
                                  f"({'; '.join(differing)}){'. ' + advice if advice else ''}")
    if needs_codebook(job.encoding):  # the new shards are encoded with it: not with one edited after finalize
        refuse_changed_codebook(store / CODEBOOK_DIR, f"cannot append to {store}")
    return manifest


def _shipped_model_advice(manifest: Manifest, job: PrecomputeJob) -> str:
    """What to do when the store and this run both took the model their dilstore shipped (neither command names
    --model) and the two differ: the shipped checkpoints are retrained between versions, and an append after an
    upgrade was refused naming only the weights' hashes (upgrade58 F3)."""
    from dilstore.reader.packaged.shipped import names_model, shipped_model_advice

    command = job.creation.get("command")
    return shipped_model_advice(manifest.creation, isinstance(command, str) and not names_model(command),
                                manifest.appends)


def _codebook_differences(store: Path, job: PrecomputeJob) -> list[str]:
    """Why the run could not encode with the store's codebook (an empty list when it can)."""
    if not (store / CODEBOOK_DIR).is_dir():
        return [f"codebook: the store has no {CODEBOOK_DIR}/ to encode the new shards with"]
    if job.codebook is None:
        return []
    stored = codebook_digest(read_codebook(store / CODEBOOK_DIR, job.encoding)[0])
    given = codebook_digest(read_codebook(job.codebook, job.encoding)[0])
    return [] if stored == given else [f"codebook: --codebook {job.codebook} is not the store's {CODEBOOK_DIR}/"]


def append_spec(job: PrecomputeJob) -> dict[str, Any]:
    """What fixes an append's contents: the run's spec (inputs, split, shards, model) and whether it replaces."""
    return {**run_spec(job), "append": {"replace": job.replace}}


def prepare_append(store: Path, job: PrecomputeJob, manifest: Manifest) -> AppendPlan:
    """Make the append folder ready for this run (see the module docstring); call it under the write lock."""
    spec = append_spec(job)
    generation = spec_generation(spec)
    folder = store / append_dir(generation)
    committed = next((record for record in manifest.appends if record.get("generation") == generation), None)
    first = first_free_shard(manifest)
    folder_spec = {**spec, "first_shard": first}
    if committed is None:
        refuse_to_delete_a_retimed_append(store, manifest, generation, folder_spec)
    remove_leftovers(store, manifest, keep=() if committed else (generation,))
    if committed is not None:
        return AppendPlan(generation, folder, int(committed.get("first_shard", first)), committed)
    if folder.is_dir() and read_spec(folder) != folder_spec:
        remove_tree(folder, "the append of other settings a stopped run left")
    folder.mkdir(parents=True, exist_ok=True)
    if read_spec(folder) is None:
        atomic_write_text(folder / SPEC_FILE, spec_json(folder_spec))
    return AppendPlan(generation, folder, first, None)


def refuse_to_delete_a_retimed_append(store: Path, manifest: Manifest, generation: str,
                                      folder_spec: dict[str, Any]) -> None:
    """A DilstoreError, before `remove_leftovers` deletes it, for an uncommitted append folder holding work (more
    than its spec) whose spec is this run's but for its inputs' modification times (`job.retimed_inputs`).

    Such a folder is likely this append, stopped, its input since copied or downloaded again byte for byte: it
    was deleted without a word as another killed append's leftovers, and its committed shards encoded again
    (time58 F4). An input edited in place to the same size looks the same: the message says to delete the folder
    then.
    """
    appends, listed_generations = store / APPENDS_DIR, {str(record.get("generation")) for record in manifest.appends}
    if not appends.is_dir():
        return
    for folder in sorted(appends.iterdir()):
        if (folder.name == generation or folder.name in listed_generations or not BUILD_ID.fullmatch(folder.name)
                or folder.is_symlink() or not folder.is_dir()):  # fmt: skip
            continue
        found = read_spec(folder)
        hint = retimed_inputs(found, folder_spec) if isinstance(found, dict) else ""
        if not hint:  # "" unless only the inputs' modification times differ
            continue
        if any(entry.name != SPEC_FILE for entry in folder.iterdir()):
            raise DilstoreError(f"cannot append to {store}: {folder} holds what a stopped append of these settings "
                                f"and inputs wrote, made when the inputs had other modification times{hint}; "
                                "if they were edited, delete that folder and run this command again")  # fmt: skip


def input_passage_ids(inputs: Iterable[ReadTask], strategy: str) -> Iterator[tuple[str, list[str]]]:
    """(document id, its passage ids before windowing) for every document of the inputs, in file order."""
    for task in inputs:
        for record in read_task(task):
            if isinstance(record, Document):
                yield record.id, [passage.id for passage in split_document(record, strategy)]


def refuse_duplicates(store: Path, job: PrecomputeJob) -> None:
    """Without `job.replace`: one DilstoreError naming a few ids of each kind of duplicate the inputs hold, input
    document ids given twice and passage ids the store holds already, so one fix of the input clears both."""
    if job.replace:
        return
    documents: Counter[str] = Counter()
    passage_ids: list[str] = []
    for document_id, passages in input_passage_ids(job.inputs, job.strategy):
        documents[document_id] += 1
        passage_ids += passages
    twice = [document_id for document_id, count in documents.items() if count > 1]
    with open_store(store) as opened:
        stored = list(dict.fromkeys(passage_id for passage_id in passage_ids if passage_id in opened))
    found = []
    if twice:
        found.append(f"{len(twice)} document ids occur more than once in the input: {listed(twice)}")
    if stored:
        found.append(f"{len(stored)} passage id{'s are' if len(stored) > 1 else ' is'} in {store} already: "
                     f"{listed(stored)}")
    if found:
        raise DilstoreError(f"--append: {'; '.join(found)}; pass --replace to keep the first copy of each document "
                            "and let the new rows win over the stored ones")


def check_stored_tables(store: Path) -> None:
    """Refuse an append with --replace to a store whose passage tables do not describe their shards (one
    StoreFormatError line naming the first such table): `retired_passages` supersedes every stored row whose doc_id
    the append stores again, so forged doc_ids superseded unrelated passages, and a table without the column failed
    only at the end of the run (hostile47 F8)."""
    with open_store(store) as opened:
        for entry in opened.manifest.shards:
            if not has_tables(store, entry):
                continue
            reader = opened.shard(entry.index)
            try:
                checked_document_ids(shard_table(store, entry), [reader.id_at(row) for row in range(len(reader))])
            except StoreFormatError as error:
                raise StoreFormatError(f"cannot replace documents in {store}: {error} (the passage table of "
                                       f"{entry.name}, whose doc_ids say which stored rows a document replaces); "
                                       "run `dilstore verify`") from error  # fmt: skip


def skipped_documents(inputs: Iterable[ReadTask]) -> set[str]:
    """The ids of the documents the inputs name but skip: Wikipedia pages that are redirects, disambiguation pages
    or of another namespace. Their pages are read again here, without converting any wikitext (a small part of
    the append's own reading).

    A refresh from a newer dump kept the passages of a page that had become a redirect or a disambiguation page
    (wiki45 M2): the append stored nothing of it, so nothing replaced them.
    """
    from dilstore.pipelines.corpus_wikipedia import read_wikipedia

    return {record.document_id for task in inputs if task.format == "wikipedia"
            for record in read_wikipedia(task.path, plain_text=False)
            if isinstance(record, Skipped) and record.document_id is not None}  # fmt: skip


def retired_passages(store: Path, folder: Path, skipped: Iterable[str] = ()) -> list[str]:
    """The store's passage ids of every document the append in `folder` stores again (from the passage tables), or
    whose id is in `skipped` (`skipped_documents`).

    A new version of a document may split into fewer passages or windows than
    the stored one; --replace supersedes the stored ones it does not bring
    again too, so no text of the old version stays reachable.
    """
    replaced = {document_id for table in passage_tables(folder) for document_id in passage_column(table, "doc_id")}
    replaced.update(skipped)
    manifest = read_manifest(StoreLocation.parse(store))
    folders = [store, *(store / append_dir(str(record.get("generation"))) for record in manifest.appends)]
    return [
        passage_id
        for stored in folders
        for table in passage_tables(stored)
        for passage_id, document_id in zip(passage_column(table, "id"), passage_column(table, "doc_id"), strict=True)
        if document_id in replaced
    ]
