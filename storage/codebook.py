"""A store's codebook for the 2bit/1bit encodings: one Zarr v3 group, written once before any shard.

The pipeline trains the codebook on a seeded sample of the corpus's states
(or takes one given with `--codebook`) and writes it to `STORE/codebook/`
before the shards, so finalize checksums it with every other file and every
shard writer encodes with the same arrays (each shard also keeps a copy under
`states/`, which is what the reader decodes with). A codebook group of one
store can be given to another run, e.g. to append passages with the same codes.

    codebook/zarr.json   attrs dilstore = {format, format_version, node: "codebook", encoding, state_shape}
    codebook/<name>      float32 arrays named by the encoding (`mean`, `cutoffs`, `weights`)
"""

from __future__ import annotations

import hashlib
import shutil
import uuid
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import zarr

from dilstore.storage.arrays import write_array
from dilstore.storage.encodings import check_codebook, get_encoding
from dilstore.storage.format import ATTRIBUTES_KEY, FORMAT_NAME, FORMAT_VERSION, TMP_PREFIX, StoreFormatError

CODEBOOK_DIR = "codebook"


def write_codebook(path: str | Path, encoding: str, codebook: Mapping[str, np.ndarray], state_shape: tuple[int, ...]) -> Path:
    """Write `codebook` of `encoding` for states of `state_shape` as a Zarr group at `path` (temporary, then rename)."""
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
        }
    }
    try:
        group = zarr.open_group(str(temporary), mode="w-", zarr_format=3, attributes=attributes)
        for name in spec.codebook:
            values = np.ascontiguousarray(codebook[name], dtype=np.float32)
            write_array(group, name, values, rows_per_chunk=values.shape[0], compressor=None,
                        dimension_names=[f"axis_{axis}" for axis in range(values.ndim)])
        temporary.rename(target)
    finally:
        shutil.rmtree(temporary, ignore_errors=True)
    return target


def read_codebook(path: str | Path, encoding: str) -> tuple[dict[str, np.ndarray], tuple[int, ...]]:
    """The codebook arrays at `path` and the state shape they are for; StoreFormatError unless it is `encoding`'s."""
    spec = get_encoding(encoding)
    try:
        group = zarr.open_group(str(path), mode="r")
    except (FileNotFoundError, zarr.errors.NodeTypeValidationError, ValueError, KeyError) as error:
        raise StoreFormatError(f"cannot open codebook {path}: {type(error).__name__}: {error}") from None
    data = group.attrs.asdict().get(ATTRIBUTES_KEY)
    if not isinstance(data, dict) or data.get("format") != FORMAT_NAME or data.get("node") != "codebook":
        raise StoreFormatError(f"{path} is not a dilstore codebook (no '{ATTRIBUTES_KEY}' codebook attributes)")
    if data.get("encoding") != spec.name:
        raise StoreFormatError(f"{path} is a codebook for {data.get('encoding')!r}, not {spec.name!r}")
    state_shape = tuple(int(size) for size in data.get("state_shape", ()))
    arrays = {}
    for name in spec.codebook:
        if name not in group:
            raise StoreFormatError(f"codebook {path} lacks array {name!r}")
        arrays[name] = np.asarray(group[name][...], dtype=np.float32)
    check_codebook(spec, arrays, state_shape)
    return arrays, state_shape


def codebook_digest(codebook: Mapping[str, np.ndarray]) -> str:
    """SHA-256 of the codebook's arrays (names, shapes and float32 bytes), to tell codebooks apart in a run spec."""
    digest = hashlib.sha256()
    for name in sorted(codebook):
        values = np.ascontiguousarray(codebook[name], dtype="<f4")
        digest.update(f"{name}{values.shape}".encode())
        digest.update(values.tobytes())
    return digest.hexdigest()
