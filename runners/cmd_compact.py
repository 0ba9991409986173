"""`dilstore compact`: rewrite a store's live passages into a few shards, superseded rows left out.

Each `precompute --append` adds shards of its own, and `--replace` leaves the rows it supersedes where they
were, so a store appended to often grows in files and bytes, and in the time it takes to open, fetch from
and verify. `compact` writes the passages the store serves into new shards, as a fresh build would place
them, states copied byte for byte (storage/compact.py), and finalizes the result as a new build.

Without --output the new store is built beside STORE (`.STORE.dilstore-building`, which needs free space for
the store's live rows) under STORE's write and index locks and then swapped in, as `precompute --overwrite`
does: a failed or killed compaction leaves STORE as it was, and the next `compact` or `precompute` of STORE
finishes a swap a kill cut short. A store that is compact already (no appends, no superseded rows, the shard
count asked for) is left as it is. Readers that have STORE open are told it was rebuilt (README: when). With
--output DIR, STORE is left as it is and the compacted copy is written to DIR. A BM25 index (`STORE/bm25`) that
covers the store as it is comes along; a stale one does not (run `dilstore index` again).
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import json
import math
import os
import shlex
import shutil
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dilstore.runners.arg_types import positive_int
from dilstore.storage.errors import DilstoreError, StoppedBySignal
from dilstore.storage.messages import path_text

# Live tokens a compacted shard holds by default: about what precompute's default shard (1 MiB of input) holds.
SHARD_TOKENS = 1 << 18

if TYPE_CHECKING:
    from dilstore.storage.compact import Compaction
    from dilstore.storage.manifest import Manifest


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add `compact`."""
    parser = subparsers.add_parser(
        "compact",
        help="rewrite a store's live passages into fewer shards (after many appends)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("store", metavar="STORE", help="a store written by `dilstore precompute` (a local folder)")
    parser.add_argument("--output", metavar="DIR", help="write the compacted store to DIR (absent or empty) and "
                        "leave STORE as it is (default: replace STORE)")  # fmt: skip
    parser.add_argument("--shards", type=positive_int, help="shards of the compacted store (default: one per "
                        f"{SHARD_TOKENS:,} tokens the store serves, at most as many as it has now)")  # fmt: skip
    parser.add_argument("--json", action="store_true", help="print the result as one JSON object")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar on stderr (none with --json)")
    parser.set_defaults(run=run_command)


def default_shards(manifest: Manifest) -> int:
    """One shard per SHARD_TOKENS live tokens, at least 1 and never more shards than the store has now."""
    wanted = max(1, math.ceil(manifest.tokens / SHARD_TOKENS))
    return min(wanted, max(1, len(manifest.shards)))


def run_command(args: argparse.Namespace) -> int:
    """Compact STORE in place or into --output; print what changed; 0 on success."""
    summary = compact_command(args)
    if args.json:
        print(json.dumps(summary, indent=1))
    elif summary.get("already_compact"):
        written = "nothing else was changed" if summary["finished"] else "nothing was written"
        print(f"dilstore compact: {_finished_words(summary)}{summary['store']} is compact already "
              f"({summary['reason']}); {written}", file=sys.stderr)  # fmt: skip
    else:
        print(f"{_finished_words(summary)}{_summary_line(summary)}", file=sys.stderr)
    return 0


def _finished_words(summary: dict[str, Any]) -> str:
    """What the command finished of a stopped run's work before it compacted, as the start of its line ("" for
    nothing)."""
    return "".join(f"{done}; " for done in summary["finished"])


def compact_command(args: argparse.Namespace) -> dict[str, Any]:
    """Compact STORE in place or into --output (the command's parsed `args`); the summary `--json` prints."""
    from dilstore.pipelines.sharding import MAX_DEFAULT_SHARDS
    from dilstore.storage.durability import remove_path
    from dilstore.storage.format import MANIFEST_FILE
    from dilstore.storage.replacement import finish_interrupted_swap, refuse_undeletable, swap_in
    from dilstore.storage.write_lock import INDEX_ROLE, write_lock

    store = _local_store(args.store, in_place=args.output is None)
    if args.shards is not None and args.shards > MAX_DEFAULT_SHARDS:
        raise DilstoreError(f"--shards {args.shards} is more than {MAX_DEFAULT_SHARDS}, the most a store is split into")
    output = None if args.output is None else _output_folder(Path(args.output).resolve(), store)
    started, done, finished = time.monotonic(), False, []  # a duration: no wall-clock step in it (time58 F1)
    try:
        with contextlib.ExitStack() as locks:
            if output is None or _lockable(store):
                # No precompute, other compaction or `dilstore index` writes the store meanwhile.
                locks.enter_context(write_lock(store))
                locks.enter_context(write_lock(store, INDEX_ROLE, doing="indexed"))
                finished = finish_interrupted_swap(store)  # a compaction or overwrite killed between its renames
            if output is not None:
                locks.enter_context(write_lock(output))  # no other compaction writes (or clears) --output meanwhile
                if stopped_compaction(output):
                    remove_path(output)  # what a compaction into it that was killed left: it starts over
            if not (store / MANIFEST_FILE).is_file():
                raise DilstoreError(f"no finished store at {store} (no {MANIFEST_FILE}); give a folder `dilstore "
                                    "precompute` finished")  # fmt: skip
            before = _footprint(store)
            reason = None if output is not None else already_compact(store, args.shards)
            if reason is not None:
                return {**_unchanged(store, before, reason, time.monotonic() - started), "finished": finished}
            if output is None:  # before any work: the swap's deletion of the old store failed silently (perm57 F4)
                refuse_undeletable(store, "an in-place compaction deletes the store it replaces; --output writes the "
                                   "compacted store elsewhere")  # fmt: skip
            target = output or _building_folder(store)
            result, index = _compact_into(store, target, args.shards, before["bytes"],
                                          show_progress=not (args.no_progress or args.json))  # fmt: skip
            if output is None:
                swap_in(store, target)
            done = True
        seconds = time.monotonic() - started
        summary = _summary(store, output, result, before, _footprint(output or store), index, seconds)
        return {**summary, "finished": finished}
    except KeyboardInterrupt as interrupt:
        raise _stopped(interrupt, store, output, done) from None


def _lockable(store: Path) -> bool:
    """Whether STORE's lock files can be made beside it. A store on a read-only mount cannot be locked, and needs no
    lock to be copied with --output: shards are never rewritten in place (an append adds shards and a new manifest,
    so the copy is the store as compaction found it), and a store rebuilt under the copy is refused by the reader as
    for any program that reads it (compact44 L4: it was refused for want of its lock file)."""
    from dilstore.storage.write_lock import lock_path

    return os.access(lock_path(store).parent, os.W_OK)


def _stopped(interrupt: KeyboardInterrupt, store: Path, output: Path | None, done: bool) -> StoppedBySignal:
    """The stop an interrupt ends in, saying where the compacted store is: a stop after it was in place said only
    "interrupted", as if nothing had been done (compact44 L5)."""
    from dilstore.runners.stop_signals import interrupt_number, interrupt_words

    if done:
        where = f"{output} holds the compacted store" if output is not None else f"{store} is compacted"
        return StoppedBySignal(f"{interrupt_words(interrupt)} after the compaction had finished: {where}",
                               interrupt_number(interrupt))  # fmt: skip
    kept = _in_place_stop(store) if output is None else f"{store} is as it was, and nothing was left in {output}"
    return StoppedBySignal(f"{interrupt_words(interrupt)}; {kept}", interrupt_number(interrupt))


def _in_place_stop(store: Path) -> str:
    """Where an in-place compaction stopped before it had finished leaves STORE, in words. Every stop said "as it
    was (stopped while the new store was put in place, ...)": one while the new store was being written left no
    swap to finish, and one while the old copy was being deleted had put the compacted store in place (scale53 F2)."""
    from dilstore.storage.replacement import building_dir, replaced_dir

    old = replaced_dir(store)
    if not old.is_dir():
        return f"{store} is as it was"
    if store.is_dir() and not building_dir(store).exists():
        return (f"{store} is compacted; the old store's copy left at {old} is deleted by the next `dilstore compact` "
                "or `precompute` of it")
    return (f"{store} is as it was (stopped while the new store was put in place, the next `dilstore compact` of it "
            "finishes that)")


def already_compact(store: Path, shards: int | None) -> str | None:
    """Why compacting `store` in place would write the same store again, in words (no appends, no superseded rows,
    and the shard count asked for, or the default's, or the fewer shards its passages fill of that count), or None
    when it would not."""
    from dilstore.storage.location import StoreLocation
    from dilstore.storage.manifest import read_manifest

    manifest = read_manifest(StoreLocation.parse(store))
    if not manifest.passages and not manifest.appends:
        return "no passages"
    count, held = shards or default_shards(manifest), len(manifest.shards)
    if manifest.appends or manifest.superseded_passages:
        return None
    if held != count and not (held < count and _routed_to(store, manifest, count)):
        return None
    filled = "" if held == count else f" (all that its passages fill of {count})"
    return (f"{manifest.passages:,} passages in {held} shard{'s' if held != 1 else ''}{filled}, no appends, no "
            "superseded rows")


def _routed_to(store: Path, manifest: Manifest, count: int) -> bool:
    """Whether every passage of `store` is in the shard a compaction to `count` shards routes it to, in id order, as
    that compaction writes it. A store whose passages fill fewer than `count` shards was compacted again by every
    `compact --shards COUNT`, as its shard count never reached COUNT (tail61 F2). A store laid out otherwise fails
    at its first misrouted id."""
    from dilstore.pipelines.sharding import shard_of
    from dilstore.storage.reader import open_store

    if any(entry.index >= count for entry in manifest.shards):
        return False
    with open_store(store) as opened:
        for entry in manifest.shards:
            ids = opened.shard(entry.index).ids()
            if ids != sorted(ids) or any(shard_of(passage_id, count) != entry.index for passage_id in ids):
                return False
    return True


def _building_folder(store: Path) -> Path:
    """The folder beside STORE the compacted store is built in, emptied of what a killed compaction left there; one
    a killed `precompute --overwrite` left (it resumes from it) is not deleted, but named.

    Only a folder with a run's spec is a build to resume: a compaction stopped twice (a second Ctrl-C while it
    deleted its half-built store) left shards without the spec, which `precompute --overwrite` deletes too, and every
    later compaction was refused as if that folder were an overwrite's, with a remedy no command could follow
    (scale53 F1)."""
    from dilstore.pipelines.spec_file import read_spec
    from dilstore.storage.durability import remove_path
    from dilstore.storage.replacement import building_dir

    building = building_dir(store)
    spec = read_spec(building) if building.is_dir() else None
    if spec is not None and "compacted" not in spec:
        raise DilstoreError(f"{building} holds the new store a stopped `dilstore precompute --overwrite` of {store} "
                            "was building: run that command again to finish it, or delete the folder, then compact")
    remove_path(building)
    return building


def _check_room(target: Path, needed: int, what: str = "the store's live rows") -> None:
    """A DilstoreError when the disk `target` goes on has less free space than the compacted store needs (`what`
    it holds, in words)."""
    free = shutil.disk_usage(next(folder for folder in (target, *target.parents) if folder.is_dir())).free
    if free < needed:
        raise DilstoreError(f"compacting needs about {needed / 1e6:,.2f} MB free for the compacted copy at {target} "
                            f"({what}), and its disk has {free / 1e6:,.2f} MB "
                            f"({(needed - free) / 1e6:,.2f} MB short): free space, or give --output on another disk")


def _local_store(argument: str, *, in_place: bool) -> Path:
    """STORE as a local folder, resolved (a link to the store: the store it names is compacted, the link kept); in
    place, never the current folder or one above it, which the swap would pull from under the shell."""
    from dilstore.runners.cmd_index import local_store

    store = local_store(argument, ": compact a local copy of the store (it is rewritten through local files)").resolve()
    here = Path.cwd().resolve()
    if in_place and (store == here or store in here.parents):
        raise DilstoreError(f"{argument} is the current folder or one of its parents, which an in-place compaction "
                            "would replace under you: run it from elsewhere, or give --output")  # fmt: skip
    return store


def stopped_compaction(folder: Path) -> bool:
    """Whether `folder` holds what a `compact --output` into it left when it was killed: the compacted spec it writes
    first, and no manifest. The same command was refused ("exists and is not an empty folder"), and `info` called it
    a precompute to run again (conc54 F7). A spec that does not read is no compaction's to clear."""
    from dilstore.storage.format import MANIFEST_FILE
    from dilstore.storage.location import StoreLocation
    from dilstore.storage.manifest import compacted_record

    return compacted_record(StoreLocation.parse(folder)) is not None and not os.path.lexists(folder / MANIFEST_FILE)


def _output_folder(output: Path, store: Path) -> Path:
    """--output as a folder to write the compacted store into: absent, empty or what a stopped compaction left there
    (`stopped_compaction`, cleared once its lock is held), neither STORE nor inside it, nor inside another store."""
    from dilstore.runners.outputs import check_store_path_length, refuse_store_inside_store
    from dilstore.storage.atomic_files import remove_dead_writers_temporaries
    from dilstore.storage.format import SPEC_FILE

    here = Path.cwd().resolve()
    if output == here or output in here.parents:
        raise DilstoreError(f"--output {output} is the current folder or one of its parents; give a folder elsewhere")
    if output.resolve() == store.resolve() or store.resolve() in output.resolve().parents:
        raise DilstoreError(f"--output {output} is STORE or inside it; give a folder elsewhere, or leave --output out "
                            "to compact STORE in place")  # fmt: skip
    if output.is_dir():  # a compaction killed while it wrote its spec, the first file, left only its temporary
        remove_dead_writers_temporaries(output / SPEC_FILE)  # (state56 F3)
    if output.exists() and (not output.is_dir() or (any(output.iterdir()) and not stopped_compaction(output))):
        held = _compacted_copy_words(output, store)
        raise DilstoreError(f"--output {output} exists and is not an empty folder{held}")
    refuse_store_inside_store(output, "--output", "the compacted store")
    check_store_path_length(output, "--output")
    return output


def _compacted_copy_words(output: Path, store: Path) -> str:
    """What a finished store in --output is, when a `compact` wrote it ("" when not): STORE compacted as it is now,
    and what it lacks of what the command copies along after its commit point (the BM25 index, the user's files),
    or a compaction of another build. A `compact --output` killed after the copy was finalized but before it had
    copied the index along (or with part of it copied) was refused by the same command as "not an empty folder",
    which said neither what DIR held nor what to do (left56b F1). The copy is not redone or finished here: DIR may
    have been used since."""
    from dilstore.storage.format import MANIFEST_FILE
    from dilstore.storage.location import StoreLocation
    from dilstore.storage.manifest import compacted_record, read_manifest

    record = compacted_record(StoreLocation.parse(output)) if output.is_dir() else None
    if record is None or not (output / MANIFEST_FILE).is_file():
        return ""
    try:
        source, copy = (read_manifest(StoreLocation.parse(folder)) for folder in (store, output))
    except (DilstoreError, OSError):
        return ""
    if record.get("generation") != source.generation or record.get("appends") != [
            append.get("generation") for append in source.appends]:  # fmt: skip
        return (f": it holds a compacted store, of another build than {store} as it is now (appended to since, or "
                "another store); delete it to compact again, or give another --output")
    missing, remedies = [], []
    if _index_state(store, source) == "carried" and _index_state(output, copy) != "carried":
        missing.append("its BM25 index")
        # quoted for a shell, as the copy's own command is: a DIR with a space was named bare (read56 F4)
        remedies.append(f"run `{shlex.join(['dilstore', 'index', path_text(output)])}`")
    own = [entry.name for entry in _own_entries(store) if not os.path.lexists(output / entry.name)]
    if own:
        missing.append(f"your files in it ({', '.join(sorted(own))})")
        remedies.append(f"copy them into {output}")
    if not missing:
        return f": it holds {store} compacted already; use it, or delete it to compact again"
    return (f": it holds {store} compacted, without {' or '.join(missing)} (a `dilstore compact --output` stopped "
            f"before it had copied them along): {', and '.join(remedies)}; or delete {output} and run the command "
            "again")


def _compact_into(store: Path, target: Path, shards: int | None, store_bytes: int, *, show_progress: bool
                  ) -> tuple[Compaction, str]:
    """Write `store` compacted into `target` (its spec file first, so that a later precompute knows it), and
    bring the BM25 index along when it covers the store; the compaction, and what became of the index. A failure
    leaves nothing of `target` (an --output folder that was empty is removed too)."""
    from tqdm import tqdm

    from dilstore.pipelines.sharding import shard_of
    from dilstore.pipelines.spec_file import SUMMARY_FILE, read_spec, spec_generation, spec_json
    from dilstore.reader.progress_lines import bar_options, steady_bar
    from dilstore.storage.atomic_files import atomic_write_text
    from dilstore.storage.compact import compact_store, copyable_problem
    from dilstore.storage.durability import fsync_tree, remove_path
    from dilstore.storage.file_errors import FILE_SIZE_ADVICE, NO_ROOM, copy_file
    from dilstore.storage.format import SPEC_FILE
    from dilstore.storage.reader import open_store
    from dilstore.storage.replacement import building_dir

    with open_store(store) as opened:  # memory-mapped, or through zarr-python where compressed
        problem = copyable_problem(opened)
        if problem is not None:
            raise DilstoreError(f"cannot compact {store}: {problem}; `dilstore precompute --overwrite` builds it "
                                "again with other shards")  # fmt: skip
        manifest = opened.manifest
        live = manifest.tokens / max(1, manifest.tokens + manifest.superseded_tokens)
        index_state = _index_state(store, manifest)  # read once: the room check and the carry go by the same state
        index_bytes = _carried_index_bytes(store, index_state)
        _check_room(target, int(store_bytes * live) + index_bytes,
                    "the store's live rows and its BM25 index" if index_bytes else "the store's live rows")
        spec = read_spec(store) or {}
        count = shards or default_shards(manifest)
        appends = [record.get("generation") for record in manifest.appends]
        compacted = {**spec, "shards": count, "compacted": {"generation": manifest.generation, "appends": appends}}
        try:
            target.mkdir(parents=True, exist_ok=True)  # an --output is absent or empty; a building folder was cleared
            atomic_write_text(target / SPEC_FILE, spec_json(compacted))
            if (store / SUMMARY_FILE).is_file():  # the first build's summary, which precompute shows for the store
                copy_file(store / SUMMARY_FILE, target / SUMMARY_FILE)
            bar = steady_bar(tqdm)(total=manifest.passages, unit="passage", desc="compact",
                       disable=not show_progress, **bar_options(mininterval=0.5))  # fmt: skip
            with bar:
                command = shlex.join(["dilstore", "compact", path_text(store), "--shards", str(count)])
                result = compact_store(opened, target, lambda passage_id: shard_of(passage_id, count),
                                       generation=spec_generation(compacted), creation_info={"command": command},
                                       progress=bar.update)  # fmt: skip
            index = _carry_index(store, index_state, target, result.manifest)
            _carry_own_files(store, target)
            # The copies reach the disk before the command says it is done: into --output nothing else flushed them,
            # and a write-back error (EIO) went unseen (disk56 F8). Files already flushed cost no write here.
            fsync_tree(target)
            return result, index
        except OSError as error:
            remove_path(target)
            if error.errno not in NO_ROOM:
                raise
            # "No space left on device" and where, with what became of STORE (disk56 F3)
            where = f" ({error.filename})" if error.filename not in (None, str(target)) else ""
            other = "give --output on another disk" if target == building_dir(store) else "give another --output"
            # A file size limit (EFBIG) is no full disk: it was told to free space, which changes nothing (read56 F3).
            advice = FILE_SIZE_ADVICE if error.errno == errno.EFBIG else f"free space on that disk, or {other}"
            raise DilstoreError(f"cannot write the compacted store at {target}: {error.strerror}{where}; {store} is "
                                f"as it was: {advice}") from None
        except BaseException:
            remove_path(target)  # nothing half-built is left; STORE is as it was
            raise


def _carry_own_files(store: Path, target: Path) -> None:
    """Copy what a user put in STORE beside the store's own files (notes, evaluation results) into the compacted
    store, after it is finalized: not in its manifest, as they were not in the old one. Hidden entries, pipes and
    sockets are left out."""
    from dilstore.storage.file_errors import copy_file, copy_tree

    for entry in _own_entries(store):
        if (target / entry.name).exists():
            continue
        if entry.is_dir() and not entry.is_symlink():
            copy_tree(entry, target / entry.name, symlinks=True)
        else:
            copy_file(entry, target / entry.name, follow_symlinks=False)


def _own_entries(store: Path) -> list[Path]:
    """What a user put in STORE beside the store's own files: files and folders, hidden entries left out (this
    project's work in progress: an index being built, `.tmp-` writes), and pipes and sockets (no data to copy)."""
    from dilstore.reader.retrieval import BM25_INDEX_DIR
    from dilstore.storage.codebook import CODEBOOK_DIR
    from dilstore.storage.format import APPENDS_DIR, INDEX_DIR, MANIFEST_FILE, SHARDS_DIR
    from dilstore.storage.passage_files import PASSAGES_DIR, REJECTED_DIR

    own = {APPENDS_DIR, INDEX_DIR, SHARDS_DIR, PASSAGES_DIR, REJECTED_DIR, CODEBOOK_DIR, BM25_INDEX_DIR, MANIFEST_FILE}
    return [entry for entry in store.iterdir()
            if entry.name not in own and not entry.name.startswith(".") and (entry.is_file() or entry.is_dir())]


def _index_state(store: Path, manifest: Manifest) -> str:
    """Whether STORE/bm25 records the store as `manifest` has it (the same live passages): "carried" (it does, and
    comes along), "stale" (it covers another state) or "none"."""
    from dilstore.reader.retrieval import INDEX_RECORD, bm25_index_dir, indexed_state

    index = bm25_index_dir(store)
    try:
        recorded = json.loads((index / INDEX_RECORD).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return "none" if not index.is_dir() else "stale"
    except (OSError, ValueError):
        return "stale"
    return "carried" if recorded == indexed_state(manifest) and any(index.glob("segments_*")) else "stale"


def _carry_index(store: Path, state: str, target: Path, new: Manifest) -> str:
    """Copy STORE/bm25 into the compacted store when it records the store as it is (`state`, what `_index_state`
    says of it, is "carried"), with its record moved on to the new build; `state`."""
    from dilstore.reader.retrieval import INDEX_RECORD, bm25_index_dir, indexed_state
    from dilstore.storage.file_errors import copy_tree

    if state != "carried":
        return state
    index = bm25_index_dir(store)
    copied = bm25_index_dir(target)
    copy_tree(index, copied)
    (copied / INDEX_RECORD).write_text(json.dumps(indexed_state(new), sort_keys=True) + "\n", encoding="utf-8")
    return "carried"


def _carried_index_bytes(store: Path, state: str) -> int:
    """The bytes of STORE/bm25 when it comes along into the compacted store (its `_index_state` is "carried"), else
    0: the room check counted the store's live rows alone, and a compaction it let through ran out of room copying
    the index (disk56 F3)."""
    from dilstore.reader.retrieval import bm25_index_dir

    if state != "carried":
        return 0
    return sum(path.stat().st_size for path in bm25_index_dir(store).rglob("*") if path.is_file())


def _footprint(store: Path) -> dict[str, int]:
    """Files and bytes under a store folder (its BM25 index left out: compaction does not change it)."""
    from dilstore.reader.retrieval import BM25_INDEX_DIR

    sizes = [path.stat().st_size for path in store.rglob("*")
             if path.is_file() and BM25_INDEX_DIR not in path.relative_to(store).parts[:1]]  # fmt: skip
    return {"files": len(sizes), "bytes": sum(sizes)}


def _unchanged(store: Path, footprint: dict[str, int], reason: str, seconds: float) -> dict[str, Any]:
    """The result for a store compact already: the keys of `_summary`, with nothing changed (a program reading
    `shards` got a KeyError, api45 L7)."""
    from dilstore.storage.location import StoreLocation
    from dilstore.storage.manifest import read_manifest

    manifest = read_manifest(StoreLocation.parse(store))
    return {"store": str(store), "already_compact": True, "reason": reason, "output": str(store),
            "passages": manifest.passages, "tokens": manifest.tokens, "shards": len(manifest.shards),
            "shards_before": len(manifest.shards), "appends_before": 0, "superseded_rows_dropped": 0,
            "files_before": footprint["files"], "files": footprint["files"], "bytes_before": footprint["bytes"],
            "bytes": footprint["bytes"], "bm25_index": _index_state(store, manifest), "generation": manifest.generation,
            "seconds": round(seconds, 2)}  # fmt: skip


def _summary(store: Path, output: Path | None, result: Compaction, before: dict[str, int], after: dict[str, int],
             index: str, seconds: float) -> dict[str, Any]:
    """The command's result, as `--json` prints it."""
    return {
        "store": str(store),
        "already_compact": False,
        "reason": None,
        "output": str(output or store),
        "passages": result.manifest.passages,
        "tokens": result.manifest.tokens,
        "shards": len(result.manifest.shards),
        "shards_before": result.source_shards,
        "appends_before": result.source_appends,
        "superseded_rows_dropped": result.dropped_rows,
        "files_before": before["files"],
        "files": after["files"],
        "bytes_before": before["bytes"],
        "bytes": after["bytes"],
        "bm25_index": index,
        "generation": result.manifest.generation,
        "seconds": round(seconds, 2),
    }


def _summary_line(summary: dict[str, Any]) -> str:
    """The summary as one line, and what to do about the BM25 index when it did not come along."""
    index = {"carried": "; its BM25 index came along",
             "stale": f"; its BM25 index covered an older state and was left out: run `dilstore index "
                      f"{summary['output']}`",
             "none": ""}[summary["bm25_index"]]  # fmt: skip
    return (f"compacted {summary['store']} into {summary['output']}: {summary['passages']:,} passages in "
            f"{summary['shards']} shards (was {summary['shards_before']} shards, {summary['appends_before']} appends; "
            f"{summary['superseded_rows_dropped']:,} superseded rows dropped); {summary['files_before']:,} -> "
            f"{summary['files']:,} files, {summary['bytes_before'] / 1e6:.1f} -> {summary['bytes'] / 1e6:.1f} MB, in "
            f"{summary['seconds']} s{index}")
