"""`dilstore index STORE`: a Lucene BM25 index over a store's passages, with pyserini.

Indexes the pyserini JsonCollection files that `dilstore precompute` wrote to
STORE/passages/jsonl (`{"id", "contents"}`, contents = title, newline, text)
into STORE/bm25, so BM25 hits carry exactly the store's passage ids. For a
store that passages were appended to (`precompute --append`), the index is
rebuilt over every part, the store's and each append's, leaving out the rows
an append with --replace superseded (storage/collection.py); a collection whose text Unicode's compatibility
folding (NFKC, as questions are read) changes is indexed from a folded copy (`searched_form`). The JVM
runs in this process, which never forks after starting it; its log, the
progress bar and the closing line go to stderr, so that stdout carries only
`--json`'s result, and nothing from the Python API's `build_index`. The index
is built in a temporary folder next to STORE/bm25 and renamed into place when complete,
under a lock (`.STORE.dilstore-index-lock` beside it, storage/write_lock.py), so
that two runs on one store cannot delete each other's half-built index.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dilstore.reader.retrieval import bm25_index_dir
from dilstore.runners.arg_types import thread_count
from dilstore.runners.quiet import add_verbose_argument
from dilstore.runners.scratch import scratch_dir
from dilstore.storage.errors import DilstoreError
from dilstore.storage.format import MANIFEST_FILE
from dilstore.storage.messages import command_text, path_text
from dilstore.storage.replacement import refuse_undeletable
from dilstore.storage.write_lock import INDEX_ROLE, WRITE_ROLE, compactor_of, write_lock

if TYPE_CHECKING:
    from dilstore.storage.manifest import Manifest



def register(subparsers: argparse._SubParsersAction) -> None:
    """Add `index`."""
    parser = subparsers.add_parser(
        "index",
        help="Lucene BM25 index over a store's passages (pyserini)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("store", metavar="STORE", help="a store written by `dilstore precompute` (a local folder)")
    parser.add_argument("--threads", type=thread_count, default=1, help="indexing threads (default 1)")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar on stderr (none with --json)")
    add_verbose_argument(parser)
    parser.set_defaults(run=run_command)


_LUCENE_IS_LOCAL = (", and Lucene writes only local files: index a local copy of the store, then give its bm25/ "
                    "folder to ask, evaluate-qa or serve with --index")


def local_store(argument: str, url_advice: str = _LUCENE_IS_LOCAL) -> Path:
    """STORE as a local folder, for a command that writes inside it (the index is built by Lucene on local files
    and written to STORE/bm25); a URL is refused with `url_advice` after "URL is a URL", a `file:` URL with the
    folder to give. `file:/abs/st` (one slash) was taken as the folder ./file:/abs/st, "no store at file:/abs/st",
    and `file:///abs/st`, a local folder, was told to be copied to a local one (left58b F6)."""
    if not argument.strip():
        raise DilstoreError("the store path is empty")
    from dilstore.storage.location import file_url_folder, is_url, redacted

    if is_url(argument):
        local = file_url_folder(argument)
        if local is not None:
            raise DilstoreError(f"{redacted(argument)} is a URL: give the store's folder, {path_text(local)}")
        raise DilstoreError(f"{redacted(argument)} is a URL{url_advice}")
    return Path(argument)


@contextlib.contextmanager
def stdout_to_stderr() -> Iterator[None]:
    """Send everything written to file descriptor 1 to stderr meanwhile.

    Anserini logs to the JVM's System.out, which writes to descriptor 1
    directly; redirecting the descriptor keeps stdout for the command's own
    result (`--json`).
    """
    sys.stdout.flush()
    saved = os.dup(1)
    try:
        os.dup2(2, 1)
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


def build_index(
    collection: Path, target: Path, threads: int, store: Manifest, show_progress: bool, reread: Callable[[], Manifest]
) -> None:
    """Index the JSONL folder `collection` of `store` into `target`, with Anserini's log on stderr and, when
    `show_progress`, a bar of the passages indexed; `reread` reads the store's manifest again before the index goes
    in place (a precompute may rebuild or append to the store meanwhile)."""
    from tqdm import tqdm

    from dilstore.reader.progress_lines import bar_options, steady_bar
    from dilstore.reader.retrieval import build_bm25_index_in_place

    bar = steady_bar(tqdm)(total=store.passages, unit="passage", desc="index",
               disable=not show_progress, **bar_options(mininterval=0.5))  # fmt: skip
    with bar, stdout_to_stderr():
        build_bm25_index_in_place(collection, target, threads=threads, store=store, reread=reread,
                                  progress=lambda indexed: bar.update(indexed - bar.n))  # fmt: skip


def run_command(args: argparse.Namespace) -> int:
    """Build STORE/bm25 and say what was indexed (one line on stderr, or the JSON on stdout); 0 on success."""
    result = index_store(args)
    if args.json:
        print(json.dumps(result, indent=1))
    else:
        source = f"{result['collection']} and the store's appends" if result["appended"] else result["collection"]
        print(f"BM25 index of {result['passages']:,} passages ({source}) written to {result['index']} in "
              f"{result['seconds']} s", file=sys.stderr)  # fmt: skip
    return 0


@contextlib.contextmanager
def _store_lock(store: Path, role: str = WRITE_ROLE, doing: str = "written") -> Iterator[Path]:
    """`write_lock(store, role, doing)`, whose refusal names a `dilstore compact` holding it as a compaction: an
    index that passed the write lock's probe as a compaction took both locks was refused as if another `dilstore
    index` (the compaction's pid) were building the index (left55 F3)."""
    with contextlib.ExitStack() as stack:
        try:
            held = stack.enter_context(write_lock(store, role, doing))
        except DilstoreError:
            compactor = compactor_of(store)
            if compactor is None:
                raise
            rerun = command_text("dilstore", "index", store)
            raise DilstoreError(f"{store} is being compacted by pid {compactor} (`dilstore compact`): wait for it, "
                                f"then run `{rerun}` again unless the compaction says its BM25 index came "
                                "along") from None  # fmt: skip
        yield held


def index_store(args: argparse.Namespace) -> dict[str, Any]:
    """Build STORE/bm25 from STORE/passages/jsonl (and, in an appended store, every append's parts); what was
    indexed, as `--json` prints it. Prints nothing of its own (`dilstore.build_index` calls it, api45 L5)."""
    from dilstore.storage.collection import collection_dir, folds_anything, is_appended, write_live_collection
    from dilstore.storage.location import StoreLocation
    from dilstore.storage.manifest import read_manifest

    store = local_store(args.store)
    collection = collection_dir(store)
    if not store.is_dir():  # read_manifest names a stopped swap that left no store here, as `info` does (conc54 L)
        read_manifest(StoreLocation.parse(store))
        raise DilstoreError(f"no store at {store}")
    if not os.access(store, os.W_OK | os.X_OK):  # found only after the collection was copied and the JVM started
        raise DilstoreError(f"{store} is not writable by this user: its index is built inside it ({store}/bm25)")
    # An index this user could not delete (another account's) was renamed aside and left in the store for good, with
    # success said (perm57 F7).
    refuse_undeletable(bm25_index_dir(store), "a rebuilt index replaces the old one, which is deleted")
    with _store_lock(store):  # a store a precompute is still writing is refused as such, naming the writer
        pass
    if not collection.is_dir():
        if (store / MANIFEST_FILE).is_file() and read_manifest(StoreLocation.parse(store)).passages == 0:
            raise DilstoreError(f"{store} holds no passages (its precompute stored none): there is nothing to index")
        raise DilstoreError(f"{store} has no passage collection at {collection}; was it made by `dilstore precompute`?")
    target = bm25_index_dir(store)
    show_progress = not (args.no_progress or args.json)
    started = time.monotonic()  # a duration: no wall-clock step in it (time58 F1)
    with _store_lock(store, INDEX_ROLE, doing="indexed"):
        manifest = read_manifest(StoreLocation.parse(store))
        reread = functools.partial(read_manifest, StoreLocation.parse(store))  # the store's write lock is not held
        appended = is_appended(store)
        folded = appended or folds_anything(collection)  # an appended store is copied anyway: folded as it is
        if folded:
            with scratch_dir("dilstore-collection-") as live:
                files = write_live_collection(store, live, searched=True)
                build_index(live, target, args.threads, manifest, show_progress, reread)
        else:
            files = len(list(collection.glob("*.jsonl")))
            build_index(collection, target, args.threads, manifest, show_progress, reread)
    return {
        "index": str(target),
        "collection": str(collection),
        "appended": appended,  # the appends' parts were indexed too, from a scratch copy of the live rows
        "folded": folded,  # indexed from a scratch copy with compatibility forms folded (collection.searched_form)
        "files": files,
        "passages": manifest.passages,
        "seconds": round(time.monotonic() - started, 2),
    }
