"""Names, versions and rules of the on-disk store format (the code side of STORE_FORMAT.md).

Everything that both the writer and the readers must agree on lives here:
the directory layout, the array names inside a shard, the representation
kinds and their per-token shapes, the compressors and the fixed chunking.
"""

from __future__ import annotations

import errno
import os
import re
import stat
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from dilstore.storage.errors import DilstoreError

FORMAT_NAME = "dilstore-store"
FORMAT_VERSION = 1
# The manifest of a store that passages were appended to (STORE_FORMAT.md §13): its index may live elsewhere, some
# shards under `appends/`, and some rows may be superseded, which a dilstore that reads only version 1 would miss.
APPENDED_FORMAT_VERSION = 2
# A shard whose `states/` hold `centroid_ids` (2bit/1bit codes against centroids, STORE_FORMAT.md §4): a dilstore
# that reads only version 1 would decode it without the centroids, silently wrong, so it refuses the shard instead.
CENTROIDS_SHARD_VERSION = 2
# A shard coded against a rotated codebook (storage.rotated_codes, STORE_FORMAT.md §4): a dilstore that reads only
# versions 1-2 finds no `cutoffs` to decode its codes with, so it refuses the shard with a clear error instead.
ROTATED_SHARD_VERSION = 3
# The newest shard format version this dilstore reads; a shard of a later one is refused with a clear error.
SHARD_FORMAT_VERSION = ROTATED_SHARD_VERSION

# Directory layout under the store root.
MANIFEST_FILE = "manifest.json"
SPEC_FILE = "precompute.json"  # the settings of the run that builds the store, written first (pipelines/spec_file.py)
ZARR_METADATA_FILE = "zarr.json"  # each Zarr v3 group's and array's metadata
SHARDS_DIR = "shards"
INDEX_DIR = "index"
APPENDS_DIR = "appends"
TMP_PREFIX = ".tmp-"
_SHARD_NAME = re.compile(r"shard-(\d{5,})")

# Key under which dilstore keeps its metadata in a Zarr group's attributes.
ATTRIBUTES_KEY = "dilstore"

# Arrays inside one shard group (the states arrays come from the encoding).
ID_BYTES, ID_OFFSETS = "passages/ids/bytes", "passages/ids/offsets"
TITLE_BYTES, TITLE_OFFSETS = "passages/titles/bytes", "passages/titles/offsets"
TEXT_BYTES, TEXT_OFFSETS = "passages/texts/bytes", "passages/texts/offsets"
# Optional: one float32 vector per passage (an EARL prior ranker's mean S1 row), (n, d).
VECTORS = "passages/vectors"
TOKEN_OFFSETS = "tokens/offsets"
TOKEN_IDS = "tokens/ids"
CHAR_SPANS = "tokens/char_spans"
STATES_GROUP = "states"
# The store's 2bit/1bit codebook group at the root, and the shard attribute value
# (`codebook: "store"`) of a shard that decodes with it instead of holding a copy.
CODEBOOK_DIR = "codebook"
STORE_CODEBOOK = "store"

# Arrays of the global id index, and of the rows an append with replace superseded (STORE_FORMAT.md §13).
INDEX_HASHES, INDEX_SHARDS, INDEX_ROWS = "hashes", "shards", "rows"
SUPERSEDED_SHARDS, SUPERSEDED_ROWS = "superseded_shards", "superseded_rows"

# Fixed chunking (idempotent writes need it fixed): rows per inner chunk of the
# sharding codec. Token arrays hold 256 tokens per chunk: a random passage of
# ~130 tokens touches one or two chunks on the zarr-python path (one ranged read
# each, 0.2-0.8 MB at d=768, a good size for object stores), and writing
# stays fast (zarr-python's cost per chunk dominates writes below ~256 rows).
# Byte arrays hold 16 KiB and offset and index arrays 1024 entries per chunk
# (8 KiB), so the padding of the last chunk stays small even in small stores.
TOKENS_PER_CHUNK = 256
BYTES_PER_CHUNK = 16384
OFFSETS_PER_CHUNK = 1024
VECTORS_PER_CHUNK = 256

COMPRESSORS: tuple[str, ...] = ("zstd", "blosc")


class StoreFormatError(DilstoreError):
    """A store or shard that does not follow the format (damaged, foreign or too new)."""


class StoreChangedError(StoreFormatError):
    """The store changed under an open reader: a shard opened lazily belongs to another build than the manifest
    the store was opened with, or a memory-mapped file was cut, written, replaced or deleted since it was mapped.

    Raised instead of reading it: mixing two builds (say, layer-3 states
    under a layer-4 model) would give wrong answers with no error, and a map
    of a file cut short kills the process on the next read (SIGBUS).
    """


class StoreReadError(DilstoreError):
    """Reading a remote store's file failed in transit (a server error, a cut body, a timeout), or a local store's
    disk failed a look at its manifest (an I/O error).

    Not a StoreFormatError: the store may be whole, and the same read may
    work a moment later, so a long-running reader keeps serving it.
    `in_transit` is True for a remote read that was tried READ_ATTEMPTS times
    (a timeout, a 5xx); a refusal (401, 403), an untrusted certificate or a
    local disk's error was not tried again, and may be one file's alone.
    """

    in_transit: bool = False


@dataclass(frozen=True)
class Kind:
    """A representation kind: what the per-token states mean and what shape they have.

    `state_shape` below is the per-token shape: states of a passage with n tokens
    are `(n, *state_shape)`.
    """

    name: str
    description: str
    rank: int  # len(state_shape)

    def check_state_shape(self, state_shape: Sequence[int]) -> tuple[int, ...]:
        """The per-token shape as a tuple, or a StoreFormatError saying why it does not fit this kind."""
        shape = tuple(int(size) for size in state_shape)
        if len(shape) != self.rank or any(size < 1 for size in shape):
            raise StoreFormatError(
                f"kind {self.name!r} stores per-token states of rank {self.rank} "
                f"({self.description}), got per-token shape {shape}"
            )
        if self.name == "earl-s2" and shape[1] != 2:
            raise StoreFormatError(f"kind 'earl-s2' stores (blocks, 2, d) per token (key and value), got {shape}")
        return shape


# The kinds' names, for the readers that check a store's kind (DilBertReader.kind, the rerankers).
DILBERT, EARL_S1, EARL_S2, LISTFORMER = "dilbert", "earl-s1", "earl-s2", "listformer"
KINDS: dict[str, Kind] = {
    kind.name: kind
    for kind in (
        Kind(DILBERT, "DilBert passage states after layer k, (T, d)", 1),
        Kind(EARL_S1, "EARL S1 document-module output states, (T, d)", 1),
        Kind(EARL_S2, "EARL S2 judger-block key/value projections, (T, blocks, 2, d)", 3),
        Kind(LISTFORMER, "Listformer document states after its delayed layers k, (T, d)", 1),
    )
}


def get_kind(name: str) -> Kind:
    """The representation kind called `name`, or a clear error listing the known ones."""
    try:
        return KINDS[name]
    except KeyError:
        raise StoreFormatError(f"unknown representation kind {name!r}; known: {', '.join(KINDS)}") from None


def check_compressor(name: str | None) -> str | None:
    """`name` if it is a known compressor (or None for uncompressed), else a clear error."""
    if name is not None and name not in COMPRESSORS:
        raise StoreFormatError(f"unknown compressor {name!r}; known: {', '.join(COMPRESSORS)} (or none)")
    return name


def shard_name(index: int) -> str:
    """Directory name of shard `index` under `shards/` (zero-padded so names sort by index)."""
    if index < 0:
        raise DilstoreError(f"shard index must be >= 0, got {index}")
    return f"shard-{index:05d}"


def parse_shard_name(name: str) -> int | None:
    """The shard index a directory name stands for, or None when it is not a shard name."""
    match = _SHARD_NAME.fullmatch(name)
    return int(match.group(1)) if match else None


def shard_path(index: int) -> str:
    """Path of shard `index` relative to the store root."""
    return f"{SHARDS_DIR}/{shard_name(index)}"


# A build id (pipelines/spec_file.spec_generation): what names an append's folder, so the only form a manifest's
# appends may give (a generation of "../../x" made an append delete a folder outside the store, hostile46 F1).
BUILD_ID = re.compile(r"[0-9a-f]{16}")


def fixed_arrays(passages: int, tokens: int, vector_size: int | None) -> dict[str, tuple[str, tuple[int, ...] | None]]:
    """The dtype and shape of each array every shard holds whatever its encoding (None: a 1-D array of any length):
    its ids, titles, texts, tokens, char spans and passage vectors, as the writer makes them; what a reader expects
    when a shard opens and what verify checks."""
    rows = (passages + 1,)
    arrays: dict[str, tuple[str, tuple[int, ...] | None]] = {
        ID_BYTES: ("uint8", None), ID_OFFSETS: ("int64", rows), TITLE_BYTES: ("uint8", None),
        TITLE_OFFSETS: ("int64", rows), TEXT_BYTES: ("uint8", None), TEXT_OFFSETS: ("int64", rows),
        TOKEN_OFFSETS: ("int64", rows), TOKEN_IDS: ("int32", (tokens,)), CHAR_SPANS: ("int32", (tokens, 2)),
    }  # fmt: skip
    if vector_size is not None:
        arrays[VECTORS] = ("float32", (passages, vector_size))
    return arrays


def is_special_file(path: Path) -> bool:
    """Whether a local `path` is a pipe, socket or device: neither a file nor a folder, so a read of it would block.
    One `stat` (links followed; a path that is not there, as Path.exists sees it, is not special): the compressed
    read path asks before each chunk."""
    try:
        mode = os.stat(path).st_mode
    except OSError as error:
        if error.errno in (errno.ENOENT, errno.ENOTDIR, errno.ELOOP, errno.EBADF):
            return False
        raise
    return not stat.S_ISREG(mode) and not stat.S_ISDIR(mode)


def append_dir(generation: str) -> str:
    """Folder, relative to the store root, that holds everything one append of build `generation` wrote."""
    return f"{APPENDS_DIR}/{generation}"


def append_shard_path(generation: str, index: int) -> str:
    """Where the append of build `generation` puts its shard `index`, relative to the store root."""
    return f"{append_dir(generation)}/{shard_path(index)}"


def append_index_dir(generation: str) -> str:
    """The id index the append of build `generation` writes, relative to the store root."""
    return f"{append_dir(generation)}/{INDEX_DIR}"


def states_array(name: str) -> str:
    """Path of an encoding's array inside a shard group."""
    return f"{STATES_GROUP}/{name}"
