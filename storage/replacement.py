"""Replacing a whole store with one built beside it (`precompute --overwrite`), so that a failed build leaves
the old store as it was, and a kill between the renames is finished by the next writer of the store.

The replacement is built in `building_dir(store)`; `swap_in` puts it in place once complete.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from dilstore.storage.durability import fsync_dir, replace_dir
from dilstore.storage.errors import DilstoreError
from dilstore.storage.file_errors import remove_tree
from dilstore.storage.format import MANIFEST_FILE, SPEC_FILE
from dilstore.storage.location import StoreLocation


def swap_in(store: Path, built: Path) -> None:
    """Put the complete store `built` at `store` and delete the one it replaces (`replace_dir`, with the old store
    aside at `replaced_dir(store)`, where `finish_interrupted_swap` finds it after a kill)."""
    replace_dir(built, store, aside=replaced_dir(store))


def finish_interrupted_swap(store: Path) -> list[str]:
    """Complete what a run killed inside `swap_in` left beside `store`; call it holding the store's write lock.

    Killed between the two renames, it left no store at `store`, the old one aside and the finished new one in
    its building folder: the new one goes into place (the old one back, if the new one is not finished). Killed
    before the last delete, it left the old store aside. Either way the old store is then deleted, so a re-run
    neither builds from scratch beside both nor keeps the old store's full copy for good. What a compaction killed
    before its swap left in the building folder is deleted too (`stopped_compaction_beside`).

    Returns what it did, in words (empty when nothing was left): a `compact` that only finished a stopped one's
    work said "nothing was written" (left55 F2).
    """
    done = []
    old = replaced_dir(store)
    if old.is_dir() and not os.path.lexists(store):
        building = building_dir(store)
        finished = (building / MANIFEST_FILE).is_file()
        os.rename(building if finished else old, store)
        fsync_dir(store.parent)
        done.append(f"put the new store a stopped run had built at {building} in place" if finished else
                    f"put the store a stopped run had set aside at {old} back in place")  # fmt: skip
    if old.is_dir():
        remove_tree(old, "the old store's copy a stopped run left")
        done.append(f"deleted the old store's copy a stopped run left at {old}")
    stopped = stopped_compaction_beside(store)
    if stopped is not None:  # a compaction killed before its swap: the store is as it was (left55 F1)
        what = stopped_work(stopped)
        remove_tree(stopped, what)
        done.append(f"deleted {what} at {stopped}")
    return done


def stopped_work(stopped: Path) -> str:
    """What the building folder `stopped` (`stopped_compaction_beside`) holds, in words: a compaction's, when its spec
    says so; one without a spec may be a `precompute --overwrite`'s too, killed before it wrote its spec or whose
    deletion stopped part-way (left57 F1), and was called a compaction's: after `precompute --overwrite` alone, its
    next run or `compact` said "what a compaction stopped before its swap left" (left58 F4), as `info` did not."""
    if os.path.lexists(stopped / SPEC_FILE):
        return "what a compaction stopped before its swap left"
    return "what a stopped `dilstore compact` or `precompute --overwrite` left"


def refuse_undeletable(folder: Path, why: str) -> None:
    """A DilstoreError when this user could not delete the tree at `folder`, which `why` says is replaced: a folder
    in it (itself included) that it cannot list, or whose entries it cannot remove (no write permission: another
    account's store, `chmod -R a-w`). Nothing when `folder` is missing.

    A replacement renames the old tree aside (its parent's permission is enough), puts the new one in place and then
    deletes the old one, whose deletion failed silently: `precompute --overwrite` or an in-place `compact` of a store
    another user built ended with success, the old store's whole copy left hidden beside the new one, and every
    later write of the store failed with "Permission denied: precompute.json" (perm57 F4). Checked up front, before
    any work. The tree is refused too where it is another user's in a sticky folder (/tmp, a team's scratch folder
    of mode 1777 or 3775): its folders writable by the group passed, and the build ran to its end, where renaming the
    old tree aside failed with "Operation not permitted" (read57b F1).
    """
    def refuse(current: str) -> None:
        where = "it" if Path(current) == folder else f"its folder {current}"
        if _read_only_mount(current):
            raise DilstoreError(f"{folder} cannot be replaced: {where} is on a read-only filesystem ({why})")
        raise DilstoreError(f"{folder} cannot be replaced by this user: {where} is not writable by it, so the old "
                            f"files could not be deleted ({why}); run this as the user that owns them, or give "
                            f"their folders write permission (`chmod -R u+w {folder}`, or g+w for a group)")

    def unlisted(error: OSError) -> None:  # os.walk passes over a folder it cannot list: it is refused here
        if not isinstance(error, (FileNotFoundError, NotADirectoryError)) and error.filename is not None:
            refuse(os.fsdecode(error.filename))

    if sticky_keeps(folder):  # the rename aside fails (EPERM) after the whole build (read57b F1)
        raise DilstoreError(f"{folder} cannot be replaced by this user: it belongs to another user, and its folder "
                            f"{folder.parent} has the sticky bit (as /tmp has), where only its owner may rename or "
                            f"delete it ({why}); run this as its owner")  # fmt: skip
    access = {"effective_ids": True} if os.access in os.supports_effective_ids else {}
    for current, _, _ in os.walk(folder, onerror=unlisted):  # folders alone: deleting a file takes its folder's rights
        if not os.access(current, os.R_OK | os.W_OK | os.X_OK, **access):
            refuse(current)


def sticky_keeps(path: Path) -> bool:
    """Whether `path` is there, another user's, in a folder with the sticky bit that this user does not own (/tmp, a
    team's scratch folder): only the owner of the entry or of its folder (or root) may rename or delete it there."""
    user = os.geteuid()
    if user == 0:  # root renames and deletes anything
        return False
    try:
        folder, present = path.parent.stat(), path.lstat()
    except OSError:
        return False
    return bool(folder.st_mode & stat.S_ISVTX) and present.st_uid != user and folder.st_uid != user


def _read_only_mount(path: str) -> bool:
    """Whether `path` lies on a filesystem mounted read-only, where no permission would let a write through."""
    try:
        return bool(os.statvfs(path).f_flag & os.ST_RDONLY)
    except OSError:
        return False


def stopped_compaction_beside(store: Path) -> Path | None:
    """The building folder beside `store` when it holds what an in-place `dilstore compact` killed before its swap
    left (its spec records the compaction), or when it holds no spec at all, else None. Under the store's write lock
    it is no one's work: only the next `compact` deleted it, and a `precompute` (rerun or append) of the store left
    it, with `info` silent about the copy of the store's live rows it holds (left55 F1).

    A folder without a spec is a compaction's or `precompute --overwrite`'s stopped before it wrote one, or a
    compaction's whose deletion a second Ctrl-C stopped (shards of a half-built copy, its spec already deleted): an
    append or rerun left that too, `info` silent about it, until the next `compact` or `--overwrite` (left57 F1). An
    overwrite's folder with its spec is kept: its rerun resumes from it.
    """
    from dilstore.storage.manifest import compacted_record  # manifest imports this module

    building = building_dir(Path(os.path.realpath(store)))  # `compact` names it after the store a link leads to
    if not building.is_dir():
        return None
    if os.path.lexists(building / SPEC_FILE) and compacted_record(StoreLocation.parse(building)) is None:
        return None
    return building


def building_dir(store: Path) -> Path:
    """Where the store that replaces `store` is built (pipelines/job.replacement_dir readies it for a run)."""
    return store.parent / f".{store.name}.dilstore-building"


def replaced_dir(store: Path) -> Path:
    """Where swap_in puts the store it replaces until the new one is in place (gone once it is deleted)."""
    return store.parent / f".{store.name}.dilstore-replaced"

