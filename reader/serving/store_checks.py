"""Checks of a store's kind, its BM25 index and its model folder that need no model, and so no torch.

`open_reader` and `open_reranker` run them on the store they open, before they load a model; `ask`, `evaluate-qa`
and `rerank` run them on the store's manifest before torch and transformers load (2-5 s), so that a mistyped
--index or --model, a store without an index or a store of the wrong kind is named at once (left60 F1).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from dilstore.reader.modeling.checkpoints import require_checkpoint_dir
from dilstore.reader.packaged.shipped import default_checkpoint_dir, default_listformer_dir, default_ranker_dir
from dilstore.reader.retrieval import bm25_index_dir, check_index_covers, require_index_files, require_jvm_room
from dilstore.storage.errors import DilstoreError
from dilstore.storage.format import DILBERT, EARL_S1, EARL_S2, LISTFORMER

if TYPE_CHECKING:
    from dilstore.storage.manifest import Manifest

EARL_KINDS = (EARL_S1, EARL_S2)
RERANK_KINDS = (EARL_S1, EARL_S2, LISTFORMER)


def require_kind(kind: str, url: str, kinds: Sequence[str], needed: str) -> str:
    """`kind`, the kind of the store at `url`, if it is one of `kinds`; any other raises DilstoreError saying what
    is `needed`."""
    if kind not in kinds:
        raise DilstoreError(f"store {url} holds {kind!r} states; {needed}")
    return kind


def require_reader_kind(kind: str, url: str) -> None:
    """A DilstoreError unless the store at `url` holds DilBert states (`kind`), the only kind the QA reader reads."""
    require_kind(kind, url, (DILBERT,), f"the QA reader needs a {DILBERT!r} store")


def require_rerank_kind(kind: str, url: str) -> str:
    """`kind` if a reranker reads it (RERANK_KINDS); any other kind raises DilstoreError."""
    return require_kind(
        kind,
        url,
        RERANK_KINDS,
        f"reranking needs an {EARL_S1!r} or {EARL_S2!r} store (`dilstore precompute --kind earl-s1|earl-s2`) "
        f"or a {LISTFORMER!r} one (`--kind listformer`)",
    )


def reader_dir(model_dir: str | Path | None) -> Path:
    """The reader checkpoint's folder: `model_dir`, by default the shipped checkpoint's."""
    return Path(model_dir) if model_dir is not None else default_checkpoint_dir()


def ranker_dir(kind: str, model_dir: str | Path | None) -> Path:
    """The folder of the ranker that reranks a store of `kind`: `model_dir`, by default the shipped ranker of that
    kind (the Listformer for a Listformer store, else EARL)."""
    if model_dir is not None:
        return Path(model_dir)
    return default_listformer_dir() if kind == LISTFORMER else default_ranker_dir()


def checked_reader_index(
    manifest: Manifest, store_path: str | Path, index_dir: str | Path | None, local_root: Path | None
) -> Path:
    """The BM25 index a reader of the store at `store_path` searches (`index_dir`, else STORE/bm25), once the store
    holds passages and the index is there and covers the store as `manifest` records it."""
    if manifest.passages == 0:
        raise DilstoreError(f"store {store_path} holds no passages (its precompute stored none): nothing to search")
    index = Path(index_dir) if index_dir is not None else bm25_index_dir(store_path)
    require_index_files(index, store_path, given=index_dir is not None, local_root=local_root)
    check_index_covers(index, manifest, store_path)
    return index


def check_reader_inputs(store_path: str, model_dir: Path | None, index_dir: Path | None) -> None:
    """What `open_reader` checks before it loads a model, in its order, from the store's manifest: the store is
    there (ci59 F1: "no store at" came after 6 s of imports), it holds DilBert states, its index is there and covers
    it, the model folder is there. A missing --index or --model was named after 5-8 s of torch (left60 F1). Then
    that the address-space limit leaves the index's JVM room to start, which torch and the model only take from
    (left60 F4: libgomp ended the process first)."""
    from dilstore.storage.location import StoreLocation
    from dilstore.storage.manifest import read_manifest

    location = StoreLocation.parse(store_path)
    manifest = read_manifest(location)
    require_reader_kind(manifest.fingerprint.kind, location.url)
    checked_reader_index(manifest, store_path, index_dir, location.local_root)
    require_checkpoint_dir(reader_dir(model_dir))
    require_jvm_room()


def check_rerank_inputs(store_path: str, model_dir: Path | None) -> None:
    """What `open_reranker` checks before it loads a ranker, from the store's manifest: the store is there, a
    reranker reads its kind, the ranker's folder (--model, else the packaged ranker of the store's kind) is there. A
    store of the wrong kind was named after 7-9 s of torch and the rankers' imports (left60 F1), and a missing
    packaged ranker after 7.5 s (left61 F3)."""
    from dilstore.storage.location import StoreLocation
    from dilstore.storage.manifest import read_manifest

    location = StoreLocation.parse(store_path)
    kind = require_rerank_kind(read_manifest(location).kind, location.url)
    require_checkpoint_dir(ranker_dir(kind, model_dir))
