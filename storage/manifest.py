"""The manifest: the store's table of contents and its commit point.

`manifest.json` is written last by finalize, atomically. It lists the shards
and their counts, the size and SHA-256 of every file present at finalize, the
fingerprint and creation info. It carries the SHA-256 of its own canonical
JSON, so a flipped byte in the manifest itself is caught too.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dilstore.storage.atomic_files import atomic_write_bytes
from dilstore.storage.checks import is_size_list
from dilstore.storage.file_errors import path_limit
from dilstore.storage.fingerprint import Fingerprint
from dilstore.storage.format import (
    APPENDED_FORMAT_VERSION,
    BUILD_ID,
    FORMAT_NAME,
    FORMAT_VERSION,
    INDEX_DIR,
    MANIFEST_FILE,
    SHARDS_DIR,
    SPEC_FILE,
    StoreFormatError,
    append_index_dir,
    append_shard_path,
    is_special_file,
    shard_path,
)
from dilstore.storage.location import StoreLocation
from dilstore.storage.messages import first_clause, path_text
from dilstore.storage.read_failures import read_failure
from dilstore.storage.replacement import replaced_dir
from dilstore.storage.write_lock import writer_of

# The longest manifest read: one lists each file of each shard (4.4 KB a shard in BENCHMARKS.md's "Scale", 5.3-6.0
# KB in stores review47b measured), so precompute's most shards (16,384) make about 100 MB; a longer file is no
# manifest, and reading it whole took twice its size in memory.
MAX_MANIFEST_BYTES = 256 << 20


@dataclass(frozen=True)
class ShardEntry:
    """One committed shard: its index (from its name), name and counts (rows, superseded ones included).

    generation: the build of a shard an append added (None: the manifest's own
    generation). path: where such a shard lives, relative to the root (None:
    `shards/NAME`). Both stay None for every shard of a store never appended to.
    """

    index: int
    name: str
    passages: int
    tokens: int
    generation: str | None = None
    path: str | None = None

    @property
    def directory(self) -> str:
        """The shard's folder relative to the store root."""
        return self.path if self.path is not None else shard_path(self.index)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict; the append-only keys are left out when None, so other manifests keep their bytes."""
        return {key: value for key, value in vars(self).items() if value is not None}

    @classmethod
    def from_dict(cls, data: dict[str, Any], position: int) -> ShardEntry:
        """Parse `to_dict` output; a field of another type is a ValueError naming it (a shard index "0" made
        `verify` fail with a TypeError traceback, a path 5 a TypeError from fetch)."""
        entry = cls(**data)
        for name in ("index", "passages", "tokens"):
            value = getattr(entry, name)
            if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < 2**63:
                raise ValueError(f"shards[{position}].{name} is {value!r:.40}, not a count")
        for name, optional in (("name", False), ("generation", True), ("path", True)):
            value = getattr(entry, name)
            if not isinstance(value, str) and not (optional and value is None):
                raise ValueError(f"shards[{position}].{name} is {value!r:.40}, not a string")
        if entry.generation is not None and not BUILD_ID.fullmatch(entry.generation):
            raise ValueError(f"shards[{position}].generation is {entry.generation!r:.40}, not a build id")
        if entry.path is not None and entry.path != append_shard_path(entry.generation or "", entry.index):
            raise ValueError(f"shards[{position}].path is {entry.path!r:.60}, not where an append puts shard "
                             f"{entry.index}")  # fmt: skip
        return entry


@dataclass(frozen=True)
class FileEntry:
    """Size and SHA-256 of one file at finalize."""

    bytes: int
    sha256: str


@dataclass(frozen=True)
class Manifest:
    """Everything finalize recorded about a store.

    state_shape is the per-token shape of the states (None for a store without passages).
    vector_size is d of the shards' passages/vectors, None when they have none.
    generation names the build every shard belongs to (None in stores made before generations); a shard an
    append added records its own build in its ShardEntry.
    files maps '/'-separated paths relative to the store root to their entries.
    passages and tokens count the rows the id index reaches; an append with replace
    leaves superseded rows in their shards (superseded_passages, superseded_tokens),
    listed in the index group. index: the id index group, relative to the root.
    appends: one record per committed append, oldest first (STORE_FORMAT.md §13).
    """

    kind: str
    encoding: str
    compressor: str | None
    state_shape: tuple[int, ...] | None
    passages: int
    tokens: int
    shards: tuple[ShardEntry, ...]
    fingerprint: Fingerprint
    creation: dict[str, Any]
    files: dict[str, FileEntry]
    vector_size: int | None = None
    generation: str | None = None
    index: str = INDEX_DIR
    superseded_passages: int = 0
    superseded_tokens: int = 0
    appends: tuple[dict[str, Any], ...] = ()
    format: str = FORMAT_NAME
    format_version: int = FORMAT_VERSION
    shard_by_index: dict[int, ShardEntry] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "shard_by_index", {shard.index: shard for shard in self.shards})

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (without the self-checksum)."""
        return {
            "format": self.format,
            "format_version": self.format_version,
            "kind": self.kind,
            "encoding": self.encoding,
            "compressor": self.compressor,
            "state_shape": None if self.state_shape is None else list(self.state_shape),
            "passages": self.passages,
            "tokens": self.tokens,
            "shards": [shard.to_dict() for shard in self.shards],
            "fingerprint": self.fingerprint.to_dict(),
            "creation": self.creation,
            "files": {path: vars(entry) for path, entry in self.files.items()},
            # Only for stores with vectors, so the manifests of stores without them stay as they were.
            **({} if self.vector_size is None else {"vector_size": self.vector_size}),
            **({} if self.generation is None else {"generation": self.generation}),
            **({} if not self.appends else self._append_keys()),
        }

    def _append_keys(self) -> dict[str, Any]:
        """The keys only an appended store's manifest has."""
        return {
            "index": self.index,
            "superseded": {"passages": self.superseded_passages, "tokens": self.superseded_tokens},
            "appends": list(self.appends),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Manifest:
        """Parse `to_dict` output; a malformed manifest is a StoreFormatError."""
        try:
            if data["format"] != FORMAT_NAME:
                raise StoreFormatError(f"not a dilstore manifest (format {data['format']!r})")
            if not isinstance(data["format_version"], int) or data["format_version"] > APPENDED_FORMAT_VERSION:
                raise StoreFormatError(
                    f"store format version {data['format_version']} is newer than this dilstore reads "
                    f"({APPENDED_FORMAT_VERSION}); upgrade dilstore"
                )
            shape = data["state_shape"]
            superseded = data.get("superseded", {})
            appends = _appends(data.get("appends", ()))
            return cls(
                kind=str(data["kind"]),
                encoding=str(data["encoding"]),
                compressor=data["compressor"],
                state_shape=None if shape is None else _state_shape(shape),
                passages=_count(data["passages"], "passages"),
                tokens=_count(data["tokens"], "tokens"),
                shards=tuple(ShardEntry.from_dict(shard, position) for position, shard in enumerate(data["shards"])),
                fingerprint=Fingerprint.from_dict(data["fingerprint"]),
                creation=dict(data["creation"]),
                files={path: FileEntry(**entry) for path, entry in data["files"].items()},
                vector_size=None if data.get("vector_size") is None else int(data["vector_size"]),
                generation=None if data.get("generation") is None else str(data["generation"]),
                index=_index(data.get("index", INDEX_DIR), appends),
                superseded_passages=_count(superseded.get("passages", 0), "superseded.passages"),
                superseded_tokens=_count(superseded.get("tokens", 0), "superseded.tokens"),
                appends=appends,
                format=data["format"],
                format_version=data["format_version"],
            )
        except (KeyError, TypeError, ValueError, AttributeError, OverflowError) as error:
            raise StoreFormatError(f"malformed manifest: {type(error).__name__}: {error}") from None


def _count(value: Any, name: str) -> int:
    """A manifest's count: an integer of 0 to 2**63 - 1 (a count of 4,000 digits was printed whole by `info` and
    quoted whole by `verify`, hostile46 F10)."""
    count = int(value)
    if not 0 <= count < 2**63:
        raise ValueError(f"{name} is {value!r:.40}, not a count")
    return count


def _appends(records: Any) -> tuple[dict[str, Any], ...]:
    """A manifest's append records, each naming its build by a build id: a generation names folders that are
    written and deleted (hostile46 F1: "../../victim" made an append delete a folder outside the store)."""
    appends = tuple(dict(record) for record in records)
    for position, record in enumerate(appends):
        generation = record.get("generation")
        if not isinstance(generation, str) or not BUILD_ID.fullmatch(generation):
            raise ValueError(f"appends[{position}].generation is {generation!r:.40}, not a build id (16 hex digits)")
    return appends


def _index(index: Any, appends: tuple[dict[str, Any], ...]) -> str:
    """A manifest's id index folder: `index`, or the one a committed append wrote."""
    allowed = [INDEX_DIR, *(append_index_dir(record["generation"]) for record in appends)]
    if index not in allowed:
        raise ValueError(f"index is {index!r:.60}, not {INDEX_DIR!r} or a committed append's index")
    return str(index)


def _state_shape(shape: Any) -> tuple[int, ...]:
    """A manifest's state_shape: a list of positive sizes ("16" read as (1, 6), and -16 was taken as it is)."""
    if not is_size_list(shape):
        raise ValueError(f"state_shape is {shape!r:.40}, not a list of positive sizes")
    return tuple(shape)


def _canonical(data: dict[str, Any]) -> bytes:
    return json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def manifest_json(manifest: Manifest) -> bytes:
    """The manifest file's bytes: indented JSON with the SHA-256 of its canonical form under 'checksum'."""
    data = manifest.to_dict()
    data["checksum"] = hashlib.sha256(_canonical(data)).hexdigest()
    return (json.dumps(data, sort_keys=True, indent=1, ensure_ascii=False) + "\n").encode("utf-8")


def parse_manifest(raw: bytes, where: str) -> Manifest:
    """Parse and self-check manifest bytes read from `where`."""
    try:
        data = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise StoreFormatError(f"{where} is not valid JSON: {error}") from None
    except ValueError as error:  # a number of over 4,300 digits: `info` and `verify` showed a traceback (fuzz60 F3)
        raise StoreFormatError(f"{where} is not a dilstore manifest: {first_clause(error)}") from None
    except RecursionError:
        raise StoreFormatError(f"{where} is not a dilstore manifest: JSON nested too deep to read") from None
    if not isinstance(data, dict) or "checksum" not in data:
        raise StoreFormatError(f"{where} has no checksum; not a dilstore manifest")
    recorded = data.pop("checksum")
    try:
        canonical = _canonical(data)
    except UnicodeEncodeError as error:  # JSON's "\ud800": `info`, `verify` said "text that is not valid UTF-8" alone
        raise StoreFormatError(f"{where} is damaged: a string in it holds a lone surrogate "
                               f"U+{ord(error.object[error.start]):04X}, which is not Unicode text") from None
    if hashlib.sha256(canonical).hexdigest() != recorded:
        raise StoreFormatError(f"{where} is damaged: its content does not match its own checksum")
    return Manifest.from_dict(data)


def _interrupted_swap(location: StoreLocation) -> str:
    """What to say where no store is because a `precompute --overwrite` or `compact` was killed between swap_in's
    renames."""
    local = location.local_root
    if local is None or not replaced_dir(local).is_dir():
        return ""
    return (f": a `dilstore precompute --overwrite` or `dilstore compact` was stopped while it put a new store here "
            f"(the old one is in {replaced_dir(local).name}); the next `dilstore precompute` or `dilstore compact` of "
            "this store finishes it")


def _home_meant(location: StoreLocation) -> str:
    """What to say where a local store path begins with `~` and no store is there, but one is in the home it names.

    A store path is taken as written (port58 F1), `~` too, as the writers take it: a program's `open_store("~/st")`,
    which no shell expands, read $HOME/st until then, and then said only "no store at ~/st" (read58 F4)."""
    given = location.url
    if location.local_root is None or not given.startswith("~"):
        return ""
    try:
        home = Path(given).expanduser()
    except RuntimeError:  # `~nosuchuser/st`, which a shell leaves as typed: a traceback (fuzz60 F9)
        return ""
    if str(home) == given or not (home / MANIFEST_FILE).is_file():
        return ""
    return (f": a store path is taken as written, and its '~' is a folder of that name in {path_text(Path.cwd())}, "
            f"not a home folder; the store there is {path_text(home)}")


def compacted_record(location: StoreLocation) -> dict[str, Any] | None:
    """The `compacted` record of the spec in the store folder at `location` (`dilstore compact` writes it: the
    generation and appends of the build it compacted), or None: no spec, one that does not read, or no such record.
    The one reader of it for the manifest's words, index coverage, journals and a stopped `compact --output`."""
    try:
        spec = json.loads(location.read_bytes(SPEC_FILE, at_most=1 << 20))
    except Exception:  # noqa: BLE001 - no spec, or one that does not read (any filesystem's error): no record
        return None
    record = spec.get("compacted") if isinstance(spec, dict) else None
    return record if isinstance(record, dict) else None


def read_manifest(location: StoreLocation) -> Manifest:
    """The manifest of the store at `location`, or a clear error when it is missing or damaged."""
    where = location.path(MANIFEST_FILE)
    missing = not location.exists(MANIFEST_FILE)
    if missing and (refused := _unreachable_folder(location)):
        raise StoreFormatError(f"no store at {location.url}: {refused}")
    if missing and not _there_after_all(location, where):
        folder = location.is_dir()  # first: a host that cannot be reached is named as such
        if not folder:
            raise StoreFormatError(f"no store at {location.url}{_interrupted_swap(location) or _home_meant(location)}")
        if not any(location.exists(begun) for begun in (SPEC_FILE, SHARDS_DIR)):  # no run began here: not a store
            raise StoreFormatError(f"no store at {location.url}: a folder with no dilstore manifest")
        writer = None if location.local_root is None else writer_of(location.local_root)
        if writer is not None:  # a store still being written is not one that was never finalized
            raise StoreFormatError(f"the store at {location.url} is being written by pid {writer} (a `dilstore "
                                   "precompute` or `dilstore compact` not finished yet): wait for it")  # fmt: skip
        if compacted_record(location) is not None:  # a compaction starts over (conc54 F7)
            raise StoreFormatError(f"{where} is missing: the store at {location.url} was never finalized (a `dilstore "
                                   "compact --output` into it stopped before its end: the same command again starts "
                                   "it over)")  # fmt: skip
        raise StoreFormatError(
            f"{where} is missing: the store at {location.url} was never finalized (a `dilstore precompute` killed "
            "before its end: the same command again goes on from the shards it finished), or its manifest was deleted"
        )
    local = location.local_root
    if local is not None and is_special_file(local / MANIFEST_FILE):
        raise StoreFormatError(f"{where} is not a regular file (a pipe, socket or device)")  # a read would block
    try:
        raw = location.read_bytes(MANIFEST_FILE, at_most=MAX_MANIFEST_BYTES)
    except IsADirectoryError:
        raise StoreFormatError(f"{where} is a directory, not a manifest file") from None
    except FileNotFoundError:
        raise StoreFormatError(f"{where} went missing while it was read") from None
    except Exception as error:  # noqa: BLE001 - each fsspec backend raises its own kind (aiohttp, botocore, ...)
        raise read_failure(where, error, local=location.local_root is not None) from None
    if len(raw) > MAX_MANIFEST_BYTES:  # read whole, a 3 GB file took 6.3 GB of memory to say "not JSON" (hostile47 F7)
        raise StoreFormatError(f"{where} is longer than {MAX_MANIFEST_BYTES:,} bytes, more than any store's manifest: "
                               "not a dilstore manifest")  # fmt: skip
    return parse_manifest(raw, where)


def _unreachable_folder(location: StoreLocation) -> str:
    """Why the local store folder at `location` cannot be reached, in words, where its path is the cause: a loop of
    symbolic links, or a name or path longer than this filesystem takes; "" otherwise.

    `info`, `ask` and `serve` said "cannot read PATH/manifest.json: File name too long …; every file of a store
    must be a readable file (`dilstore verify` checks them)", blaming a file of a store that is not there, and
    `verify` named a `bm25` the user never gave (url59 F5)."""
    local = location.local_root
    if local is None:
        return ""
    try:
        os.stat(local)
    except ValueError:  # a null byte in the path: the manifest's read names it (a bare ValueError, read59 F2)
        return ""
    except OSError as error:
        if error.errno == errno.ELOOP:
            return "its path runs into a loop of symbolic links"
        if error.errno == errno.ENAMETOOLONG:
            return _too_long(local)
    return ""


def _too_long(path: Path) -> str:
    """Which of `path`'s names is longer than its filesystem's NAME_MAX bytes, that the whole is over PATH_MAX, or,
    where neither is, that a symbolic link on it leads to a name or path too long."""
    above = next((folder for folder in path.parents if os.path.isdir(folder)), Path("/"))
    name_max = path_limit(above, "PC_NAME_MAX", 255)
    for name in path.parts:
        size = len(os.fsencode(name))
        if size > name_max:
            return (f"its name {path_text(name[:40])}… is {size} bytes long, and a file name here may have at most "
                    f"{name_max}")  # fmt: skip
    most = path_limit(above, "PC_PATH_MAX", 4096) - 1
    size = len(os.fsencode(path))
    if size > most:
        return f"its path is {size} bytes long, and a path here may have at most {most}"
    # A link to an over-long name: "its path is 20 bytes long, and a path here may have at most 4095" (read59 F3).
    return (f"a symbolic link on its path leads to a name or path longer than this filesystem takes (a name of at "
            f"most {name_max} bytes, a path of {most})")


def _there_after_all(location: StoreLocation, where: str) -> bool:
    """Whether the manifest `exists` called absent can be read after all (a server's hiccup: fsspec's `exists`
    reads a 429, 500 or 503 as absent, and one of them made a store `no store at URL`, remote52 F3); False when
    it is absent, a StoreReadError when it still cannot be read (an HTTP 500 again), so a failing server is not
    taken for a wrong URL or an unfinalized store. (A read of at most a byte opens a stream over HTTP, which
    fsspec opens with `info`: a 503 read as absent again.)"""
    try:
        location.read_bytes(MANIFEST_FILE)
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
        return False
    except Exception as error:  # noqa: BLE001 - each fsspec backend raises its own kind (aiohttp, botocore, ...)
        location.is_dir()  # a host that cannot be reached is named as such (`cannot reach store URL`)
        raise read_failure(where, error, local=location.local_root is not None) from None
    return True


def write_manifest(root: Path, manifest: Manifest) -> None:
    """Write `root/manifest.json` atomically (temporary file, fsync, rename, fsync the directory)."""
    atomic_write_bytes(root / MANIFEST_FILE, manifest_json(manifest))

