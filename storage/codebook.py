"""A store's codebook for the 2bit/1bit encodings: one Zarr v3 group, written once before any shard.

The pipeline trains the codebook on a seeded sample of the corpus's states
(or takes one given with `--codebook`) and writes it to `STORE/codebook/`
before the shards, so finalize checksums it with every other file and every
shard writer encodes with the same arrays. The shards hold no copy of it (their
attributes say `codebook: "store"`); the reader loads this group once per store
and decodes every shard with it (`load_store_codebook`). A codebook group of one
store can be given to another run, e.g. to append passages with the same codes.

Like a shard, the group records the build it belongs to (`generation`) and the
hash of the model fingerprint (`fingerprint_sha256`), so finalize and verify
can tell a codebook left by another build or made for another model, and
check that every shard that needs it finds it, and that any shard that keeps a
codebook of its own (one written without the store's) holds this one
(`store_codebook_problems`).

    codebook/zarr.json   attrs dilstore = {format, format_version, node: "codebook", encoding, state_shape,
                                           generation, fingerprint_sha256, sample_tokens}  (the last three when
                                           known; sample_tokens: how many token states it was trained on)
    codebook/<name>      float32 arrays named by the encoding (`mean`, `cutoffs`, `weights`, and `centroids`
                         in codebooks trained since centroids were added: storage.encodings)
"""

from __future__ import annotations

import hashlib
import shutil
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import zarr

from dilstore.storage.arrays import local_group, write_array
from dilstore.storage.checks import is_size_list
from dilstore.storage.digests import sha256_file
from dilstore.storage.durability import replace_dir
from dilstore.storage.encodings import check_codebook, get_encoding
from dilstore.storage.file_errors import naming
from dilstore.storage.fingerprint import Fingerprint, fingerprint_sha256
from dilstore.storage.format import (
    ATTRIBUTES_KEY,
    CODEBOOK_DIR,
    FORMAT_NAME,
    FORMAT_VERSION,
    MANIFEST_FILE,
    STORE_CODEBOOK,
    TMP_PREFIX,
    ZARR_METADATA_FILE,
    StoreFormatError,
    states_array,
)
from dilstore.storage.location import StoreLocation
from dilstore.storage.manifest import read_manifest
from dilstore.storage.messages import command_text
from dilstore.storage.read_failures import describe, raise_if_shortage
from dilstore.storage.writer import build_attributes
from dilstore.storage.zarr_reads import METADATA_ERRORS

__all__ = ["CODEBOOK_DIR", "codebook_build", "codebook_digest", "codebook_sample_tokens", "distinct_centroids",
           "load_store_codebook",
           "read_codebook", "refuse_changed_codebook", "store_codebook_problems", "write_codebook"]


def write_codebook(
    path: str | Path,
    encoding: str,
    codebook: Mapping[str, np.ndarray],
    state_shape: tuple[int, ...],
    *,
    generation: str | None = None,
    fingerprint: Fingerprint | None = None,
    sample_tokens: int | None = None,
) -> Path:
    """Write `codebook` of `encoding` for states of `state_shape` as a Zarr group at `path` (temporary, then rename).

    generation and fingerprint: the build and model the store's shards record
    (storage.writer.write_shard); sample_tokens: how many token states the
    codebook was trained on (`codebook_sample_tokens`); each left out when None.
    """
    spec = get_encoding(encoding)
    check_codebook(spec, codebook, state_shape)
    target = Path(path)
    temporary = target.with_name(f"{TMP_PREFIX}{target.name}-{uuid.uuid4().hex}")
    attributes = {
        ATTRIBUTES_KEY: {
            "format": FORMAT_NAME,
            "format_version": FORMAT_VERSION,
            "node": "codebook",
            "encoding": spec.name,
            "state_shape": list(state_shape),
            **build_attributes(generation, fingerprint),
            **({} if sample_tokens is None else {"sample_tokens": int(sample_tokens)}),
        }
    }
    try:
        with naming(target):  # zarr's writes name no file: a full disk said "No space left on device" alone (disk56 F7)
            group = local_group(temporary, mode="w-", zarr_format=3, attributes=attributes)
            for name in spec.codebook_layout(codebook):
                values = np.ascontiguousarray(codebook[name], dtype=np.float32)
                write_array(group, name, values, rows_per_chunk=values.shape[0], compressor=None,
                            dimension_names=[f"axis_{axis}" for axis in range(values.ndim)])
            replace_dir(temporary, target)
    finally:
        shutil.rmtree(temporary, ignore_errors=True)
    return target


def read_codebook(path: str | Path, encoding: str) -> tuple[dict[str, np.ndarray], tuple[int, ...]]:
    """The codebook arrays at `path` and the state shape they are for; StoreFormatError unless it is `encoding`'s
    (naming `path`: a `--codebook` with a damaged rotation was refused naming only the array). An array's zarr.json
    is read as the array is first looked at, past `_open`: one of a malformed field (codecs "x", data_type 5) was
    zarr's TypeError or ValueError traceback from `precompute --codebook` (fuzz60 F7)."""
    try:
        return _codebook_of(_open(path), str(path), encoding)
    except StoreFormatError as error:
        if str(path) in str(error):
            raise
        raise StoreFormatError(f"codebook {path}: {error}") from None
    except METADATA_ERRORS as error:
        raise StoreFormatError(f"codebook {path}: an array's metadata does not read ({type(error).__name__}: "
                               f"{error})") from None


def codebook_build(path: str | Path) -> dict[str, str]:
    """The build attributes (`generation`, `fingerprint_sha256`) the codebook at `path` records.

    {} when it records none or is no readable codebook, so a run never takes it for its own.
    """
    try:
        return _build_of(_open(path))
    except StoreFormatError:
        return {}


def codebook_sample_tokens(path: str | Path) -> int | None:
    """How many token states the codebook at `path` was trained on, as it records; None when it records none (one
    written before the count was recorded) or is no readable codebook.

    A codebook trained on a few hundred states fits those states and few others (codes51 F1): appends and
    `--codebook` runs measure such a codebook on their own states (runners/cmd_precompute.py `check_codebook_sample`).
    """
    try:
        count = _attributes(_open(path), str(path)).get("sample_tokens")
    except StoreFormatError:
        return None
    return count if isinstance(count, int) and not isinstance(count, bool) and count >= 0 else None


def distinct_centroids(path: str | Path, encoding: str) -> int | None:
    """The fewest distinct rows the `centroids` table of the codebook at `path` holds at any token vector position;
    None when it has no centroids (codebooks written before centroids were added).

    Codebooks written before `sample_tokens` was recorded trained one centroid per sample token up to the table's
    CENTROIDS rows, so for them a count under CENTROIDS is the size of their sample (codes51 F1, review51 R1); codebooks
    trained since repeat one of every TOKENS_PER_CENTROID sample tokens' centroids, and record their sample.
    """
    centroids = read_codebook(path, encoding)[0].get("centroids")  # (C, *S)
    if centroids is None:
        return None
    tables = centroids.reshape(len(centroids), -1, centroids.shape[-1])  # (C, G, d)
    return min(len(np.unique(tables[:, group], axis=0)) for group in range(tables.shape[1]))


def load_store_codebook(location: StoreLocation, encoding: str) -> dict[str, np.ndarray]:
    """The arrays of the store's `codebook/` group, checked to be a codebook of `encoding` (what readers decode with).

    A missing or invalid group is a StoreFormatError that points at `verify`.
    """
    where = location.path(CODEBOOK_DIR)
    try:
        group = location.open_group(CODEBOOK_DIR)
        return _codebook_of(group, where, encoding)[0]
    except METADATA_ERRORS as error:
        raise StoreFormatError(
            f"cannot read the store's codebook {where}: {type(error).__name__}: {error}; run `dilstore verify`"
        ) from None


def store_codebook_problems(
    location: StoreLocation, shards: Sequence[str], encoding: str, generation: str | None, fingerprint: Fingerprint
) -> list[str]:
    """What is wrong with a store's `codebook/` group and the shards' use of it, for finalize and verify.

    The group, when present, must be a valid codebook of the store's
    `encoding`, belong to its build `generation`, record the hash of
    `fingerprint` (when it records one), and equal every copy a shard in
    `shards` (paths under the root) still holds (shards written without the
    store's codebook train and keep their own). A shard that decodes with the
    store's codebook (`codebook: "store"`) needs the group. An empty list means sound.
    """
    users, copies, problems = [], [], []
    for shard in shards:
        try:
            data = location.open_group(shard).attrs.asdict().get(ATTRIBUTES_KEY, {})
        except Exception as error:  # noqa: BLE001 - a damaged shard gives a problem line, not a traceback
            raise_if_shortage(error)
            problems.append(f"{shard}: cannot read its attributes: {type(error).__name__}: {error}")
            continue
        (users if isinstance(data, dict) and data.get("codebook") == STORE_CODEBOOK else copies).append(shard)
    try:
        location.read_bytes(f"{CODEBOOK_DIR}/zarr.json")
    except FileNotFoundError:
        if not location.is_dir(CODEBOOK_DIR):  # a folder without its zarr.json is a damaged group, told below
            return problems + [f"{shard} decodes with the store's {CODEBOOK_DIR}/, which is missing" for shard in users]
    except Exception as error:  # noqa: BLE001 - a server's failure (an HTTP 500) is one problem, blamed on no shard
        raise_if_shortage(error)
        return problems + [f"{CODEBOOK_DIR}: cannot be read: {describe(error)}"]
    try:
        group = location.open_group(CODEBOOK_DIR)
        arrays, _ = _codebook_of(group, CODEBOOK_DIR, encoding)
        build = _build_of(group)
    except (StoreFormatError, *METADATA_ERRORS) as error:
        return problems + [f"{CODEBOOK_DIR}: {error}"]
    if build.get("generation") != generation:
        problems.append(f"{CODEBOOK_DIR} belongs to build {build.get('generation')!r}, the store to {generation!r}")
    if build.get("fingerprint_sha256") not in (None, fingerprint_sha256(fingerprint)):
        problems.append(f"{CODEBOOK_DIR} was made by another model than the fingerprint says")
    for shard in copies:
        for name, values in arrays.items():
            try:
                copy = np.asarray(location.open_group(shard)[states_array(name)][...])
            except Exception as error:  # noqa: BLE001 - a damaged shard gives a problem line, not a traceback
                raise_if_shortage(error)
                problems.append(f"{shard}: cannot read its codebook copy {states_array(name)}: {error}")
                continue
            if not np.array_equal(copy, values):
                problems.append(f"{shard}: its codebook copy {states_array(name)} differs from {CODEBOOK_DIR}/{name}")
    return problems


def codebook_changes(path: str | Path) -> tuple[Path | None, list[str]]:
    """Where `path` is a finalized store's `codebook/` folder (the folder beside it holds a manifest): that store,
    and what differs from the file sizes and SHA-256s its manifest recorded (one line per file);
    (None, []) for a codebook of no finalized store.

    read_codebook checks only shapes and values: a chunk edited after finalize (a mean moved, a rotation zeroed)
    still reads, and encoded every new shard of an append or of a `--codebook` run with it (codes51 F2, F3).
    """
    folder = Path(path).resolve()
    store = folder.parent
    if folder.name != CODEBOOK_DIR or not (store / MANIFEST_FILE).is_file():
        return None, []
    recorded = {name: entry for name, entry in read_manifest(StoreLocation.parse(store)).files.items()
                if name.startswith(f"{CODEBOOK_DIR}/")}  # fmt: skip
    present = {file.relative_to(store).as_posix(): file for file in folder.rglob("*") if not file.is_dir()}
    changes = [f"{name} is not in it" for name in sorted(set(present) - set(recorded))]
    for name, entry in sorted(recorded.items()):
        file = present.get(name)
        if file is None:
            changes.append(f"{name} is missing")
        elif not file.is_file() or file.stat().st_size != entry.bytes or sha256_file(file) != entry.sha256:
            changes.append(f"{name} changed after finalize: its SHA-256 differs")
    return store, changes


def refuse_changed_codebook(path: str | Path, refused: str) -> None:
    """A StoreFormatError starting with `refused` when `path` is a finalized store's `codebook/` whose files differ
    from its manifest (codebook_changes), naming them and pointing at `dilstore verify`."""
    store, changes = codebook_changes(path)
    if changes:
        more = f"; and {len(changes) - 3} more" if len(changes) > 3 else ""
        verify = command_text("dilstore", "verify", store)
        raise StoreFormatError(f"{refused}: the codebook does not match {store}/{MANIFEST_FILE} "
                               f"({'; '.join(changes[:3])}{more}), so it would encode new passages with damaged "
                               f"codes; `{verify}` lists what changed: put codebook/ back from a copy "
                               "of the store, or build the store again with --overwrite")  # fmt: skip


def _open(path: str | Path) -> zarr.Group:
    """The codebook group at `path`, read-only; a StoreFormatError naming `path` when none opens there.

    A folder (or file) with no group said zarr's "No group found in store LocalStore('file:///…') at path ''", the
    path again as a URL of zarr's (url59 F4): it says what is missing, as the path was given.
    """
    try:
        return local_group(path, mode="r")
    except METADATA_ERRORS as error:
        inside = Path(path) / CODEBOOK_DIR
        hint = f"; a store's codebook is its {CODEBOOK_DIR}/ folder: {inside}?" if inside.is_dir() else ""
        if isinstance(error, zarr.errors.GroupNotFoundError):
            raise StoreFormatError(f"cannot open codebook {path}: no Zarr group is there (no {ZARR_METADATA_FILE} of "
                                   f"one){hint}") from None  # fmt: skip
        raise StoreFormatError(f"cannot open codebook {path}: {type(error).__name__}: {error}{hint}") from None


def _attributes(group: zarr.Group, where: str) -> dict[str, Any]:
    """The group's dilstore attributes; StoreFormatError unless they are a codebook's."""
    data = group.attrs.asdict().get(ATTRIBUTES_KEY)
    if not isinstance(data, dict) or data.get("format") != FORMAT_NAME or data.get("node") != "codebook":
        raise StoreFormatError(f"{where} is not a dilstore codebook (no '{ATTRIBUTES_KEY}' codebook attributes)")
    return data


def _build_of(group: zarr.Group) -> dict[str, str]:
    data = _attributes(group, str(group.store))
    return {key: str(data[key]) for key in ("generation", "fingerprint_sha256") if data.get(key) is not None}


def _codebook_of(group: zarr.Group, where: str, encoding: str) -> tuple[dict[str, np.ndarray], tuple[int, ...]]:
    spec = get_encoding(encoding)
    data = _attributes(group, where)
    if data.get("encoding") != spec.name:
        raise StoreFormatError(f"{where} is a codebook for {data.get('encoding')!r}, not {spec.name!r}")
    state_shape = _recorded_shape(data.get("state_shape", []), where)
    present = [name for name in spec.codebook if name in group]
    arrays = {}
    for name in spec.codebook_layout(present):  # optional arrays (2bit/1bit `centroids`) where the group has them
        if name not in group:
            raise StoreFormatError(f"codebook {where} lacks array {name!r}")
        array = group[name]
        if not isinstance(array, zarr.Array):  # a group in its place raised AttributeError ('shape') (types58 F3)
            raise StoreFormatError(f"codebook {where}/{name} is not an array")
        declared, expected = tuple(array.shape), spec.array(name).shape(state_shape)
        if declared != expected:  # checked before the read: a shape of [10**9, 384] was read first (hostile46 F8)
            raise StoreFormatError(f"codebook array {where}/{name} has shape {declared}, but states of shape "
                                   f"{state_shape} need it to be {expected}")  # fmt: skip
        arrays[name] = _read_array(array, f"{where}/{name}")
    check_codebook(spec, arrays, state_shape)
    return arrays, state_shape


def _recorded_shape(shape: Any, where: str) -> tuple[int, ...]:
    """The state shape a codebook's attributes record: a list of positive sizes, else a StoreFormatError naming it.

    Read with int() per item, a shape of 5, [null] or [1e400] was a TypeError, ValueError or OverflowError
    traceback from `precompute --codebook` (fuzz60 F6), and "16" was read as (1, 6)."""
    if not is_size_list(shape):
        raise StoreFormatError(f"codebook {where} records state_shape {shape!r:.40}, not a list of positive sizes")
    return tuple(shape)


def _read_array(array: zarr.Array, where: str) -> np.ndarray:
    """The array's values as float32; a StoreFormatError when a local chunk file is missing (zarr reads it as its
    fill value: a store built with all-zero centroids passed verify) or a chunk cannot be decoded (a cut one failed
    its checksum with a traceback). Chunks are counted on local files only: over HTTP a folder cannot be listed."""
    try:
        if isinstance(array.store, zarr.storage.LocalStore) and array.nchunks_initialized < array.nchunks:
            raise StoreFormatError(f"codebook array {where} is missing {array.nchunks - array.nchunks_initialized} of "
                                   f"its {array.nchunks} chunk file(s)")  # fmt: skip
        return np.asarray(array[...], dtype=np.float32)
    except (ValueError, KeyError, OSError, MemoryError) as error:
        raise StoreFormatError(f"cannot read codebook array {where}: {type(error).__name__}: {error}") from None


def codebook_digest(codebook: Mapping[str, np.ndarray]) -> str:
    """SHA-256 of the codebook's arrays (names, shapes and float32 bytes), to tell codebooks apart in a run spec."""
    digest = hashlib.sha256()
    for name in sorted(codebook):
        values = np.ascontiguousarray(codebook[name], dtype="<f4")
        digest.update(f"{name}{values.shape}".encode())
        digest.update(values.tobytes())
    return digest.hexdigest()
