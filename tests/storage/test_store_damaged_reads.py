"""Damage that `verify` catches never gives a wrong passage or a traceback on the serving path.

Each test damages one array of a sound store through zarr-python (so the
damage is exactly the values named) and reads it on both read paths: the
reader must stop with one StoreFormatError line that names the shard and
points at `dilstore verify`.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import threading
from pathlib import Path

import numpy as np
import pytest
import zarr

from dilstore.storage.format import (
    INDEX_DIR,
    INDEX_ROWS,
    SHARD_FORMAT_VERSION,
    SUPERSEDED_ROWS,
    SUPERSEDED_SHARDS,
    TEXT_BYTES,
    TITLE_OFFSETS,
    TOKEN_OFFSETS,
    StoreFormatError,
    shard_path,
)
from dilstore.storage.reader import open_store
from dilstore.storage.verify import verify_store
from tests.fixtures.store_fixtures import build_store, random_shards

PATHS = ("mmap", "zarr")


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    shards = random_shards([5, 4], state_shape=(3,), seed=11, max_words=10)
    return build_store(tmp_path_factory.mktemp("pristine") / "store", shards, encoding="fp16")


@pytest.fixture
def store(pristine: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(pristine, tmp_path / "store"))


def damage(store: Path, relative: str, change) -> None:
    """Rewrite the array at `relative` with `change(values)` applied."""
    array = zarr.open_array(store / relative, mode="r+")
    values = np.asarray(array[...])
    array[...] = change(values.copy())


def all_ids(store: Path) -> list[str]:
    with open_store(store, read_path="zarr") as opened:
        return [opened.shard(0).id_at(row) for row in range(len(opened.shard(0)))]


def swap_middle(values: np.ndarray) -> np.ndarray:
    """Offsets that no longer increase: two inner entries swapped."""
    values[[1, 2]] = values[[2, 1]] if values[1] != values[2] else (values[2] + 1, values[1])
    return values


@pytest.mark.parametrize("read_path", PATHS)
@pytest.mark.parametrize("offsets", [TOKEN_OFFSETS, TITLE_OFFSETS])
def test_damaged_offsets_are_refused_when_the_shard_opens(store: Path, read_path: str, offsets: str) -> None:
    ids = all_ids(store)
    damage(store, f"{shard_path(0)}/{offsets}", swap_middle)
    assert not verify_store(store).ok
    with open_store(store, read_path=read_path) as opened, pytest.raises(StoreFormatError) as raised:
        opened.fetch([ids[0]])
    message = str(raised.value)
    assert "shard-00000" in message and offsets in message and "dilstore verify" in message
    assert "\n" not in message


@pytest.mark.parametrize("read_path", PATHS)
def test_offsets_ending_past_the_data_are_refused(store: Path, read_path: str) -> None:
    ids = all_ids(store)

    def stretch(values: np.ndarray) -> np.ndarray:
        values[-1] += 7
        return values

    damage(store, f"{shard_path(0)}/{TOKEN_OFFSETS}", stretch)
    with open_store(store, read_path=read_path) as opened, pytest.raises(StoreFormatError, match="dilstore verify"):
        opened.fetch([ids[-1]])


def test_an_id_index_array_shorter_than_the_store_is_refused_when_it_opens(store: Path) -> None:
    """An index whose rows array lost its last entry (its header still right) is refused by name when the store opens
    (mut57b: without the length check the store opened, and lookups read past the array)."""
    group = zarr.open_group(store / INDEX_DIR, mode="r+")
    rows = np.asarray(group[INDEX_ROWS][...])
    group.create_array(INDEX_ROWS, data=rows[:-1], overwrite=True)
    with pytest.raises(StoreFormatError, match=rf"{INDEX_DIR}/{INDEX_ROWS} is not an array of {len(rows)} entries"):
        open_store(store)


@pytest.mark.parametrize("attributes", [[1, 2], 5])
def test_id_index_attributes_that_are_no_object_are_refused_when_it_opens(store: Path, attributes) -> None:
    """An id index whose dilstore attributes were a list or a number: opening the store raised AttributeError ('list'
    object has no attribute 'get'), and verify named that AttributeError (types58 F4)."""
    metadata = store / INDEX_DIR / "zarr.json"
    document = json.loads(metadata.read_text(encoding="utf-8"))
    document["attributes"]["dilstore"] = attributes
    metadata.write_text(json.dumps(document), encoding="utf-8")
    with pytest.raises(StoreFormatError, match=rf"{INDEX_DIR} does not match the manifest .*run `dilstore verify`$"):
        open_store(store)
    assert f"attributes {attributes} do not match the manifest" in str(verify_store(store).problems)


@pytest.mark.parametrize(("relative", "named"), [
    (f"{shard_path(0)}/zarr.json", "shard"),
    (f"{INDEX_DIR}/zarr.json", "the id index"),
])
def test_a_group_metadata_file_holding_no_object_is_refused_naming_the_group(store: Path, relative: str,
                                                                            named: str) -> None:  # fmt: skip
    """(fuzz60 F7) A shard's or the id index's zarr.json that holds a JSON number (`5`) made zarr raise AttributeError
    ("'int' object has no attribute 'pop'"), which `open_store` let through: `ask`, `rerank` and `serve` showed a
    traceback. It is one StoreFormatError naming the group, as other damaged metadata."""
    ids = all_ids(store)
    (store / relative).write_text("5", encoding="utf-8")
    with pytest.raises(StoreFormatError, match=rf"cannot open {named} .*: AttributeError: 'int' object has no "):
        open_store(store).fetch(ids)


@pytest.mark.parametrize("rows", [None, 2], ids=["rows missing", "rows of another length"])
def test_superseded_arrays_that_do_not_pair_up_are_refused_naming_the_index(store: Path, rows) -> None:
    """An id index with superseded_shards but no superseded_rows (or rows of another length): `dilstore compact` and
    `index` ended in a KeyError (ValueError) traceback where the superseded rows were read (types58 F5). The line
    names the index by its path, so the store to verify is known (url59 F3: it named no store)."""
    group = zarr.open_group(store / INDEX_DIR, mode="r+")
    group.create_array(SUPERSEDED_SHARDS, data=np.ones(1, dtype=np.uint32))
    if rows is not None:
        group.create_array(SUPERSEDED_ROWS, data=np.ones(rows, dtype=np.uint32))
    refusal = (rf"^the id index {re.escape(str(store))}/{INDEX_DIR}: its superseded_shards and superseded_rows are "
               r"not two arrays of one length; run `dilstore verify`$")  # fmt: skip
    with open_store(store) as opened, pytest.raises(StoreFormatError, match=refusal):
        opened.superseded()


@pytest.mark.parametrize("read_path", PATHS)
@pytest.mark.parametrize(("rows", "asked"), [(lambda values: values + 1000, r"row 100\d of 5 passages"),
                                             (lambda values: np.full_like(values, 5), r"row 5 of 5 passages")],
                         ids=["far past the end", "one past the end"])  # fmt: skip
def test_an_index_row_out_of_range_is_one_line_not_an_index_error(store: Path, read_path: str, rows, asked) -> None:
    """Rows far past a shard's end, and the row just past it (shard 0 holds 5 passages: row 5 is the first out)."""
    ids = all_ids(store)
    damage(store, f"{INDEX_DIR}/{INDEX_ROWS}", rows)
    assert not verify_store(store).ok
    with open_store(store, read_path=read_path) as opened, pytest.raises(StoreFormatError) as raised:
        opened.fetch(ids[:2])
    message = str(raised.value)
    assert re.search(rf"shard-00000: asked for {asked} \(the id index is damaged\)", message), message
    assert "dilstore verify" in message and "\n" not in message


@pytest.mark.parametrize("read_path", PATHS)
def test_passage_text_that_is_not_utf8_is_one_line_not_a_decode_error(store: Path, read_path: str) -> None:
    ids = all_ids(store)
    with open_store(store, read_path="zarr") as opened:
        first = opened.fetch([ids[0]])[0]
    assert first.text, "the fixture's first passage has text"

    def break_first_byte(values: np.ndarray) -> np.ndarray:
        values[0] = 0xFF
        return values

    damage(store, f"{shard_path(0)}/{TEXT_BYTES}", break_first_byte)
    with open_store(store, read_path=read_path) as opened, pytest.raises(StoreFormatError) as raised:
        opened.fetch([ids[0]])
    assert "the text of row 0 is not UTF-8" in str(raised.value) and "dilstore verify" in str(raised.value)


def test_a_sound_store_still_reads_every_passage(store: Path) -> None:
    ids = all_ids(store)
    for read_path in PATHS:
        with open_store(store, read_path=read_path) as opened:
            assert [passage.id for passage in opened.fetch(ids)] == ids


@pytest.mark.parametrize("read_path", PATHS)
@pytest.mark.parametrize("relative", [f"{shard_path(0)}/{TEXT_BYTES}", f"{shard_path(0)}/states/values",
                                      f"{INDEX_DIR}/{INDEX_ROWS}"])  # fmt: skip
def test_a_truncated_array_zarr_json_is_refused_by_name(store: Path, read_path: str, relative: str) -> None:
    """Cut metadata is a JSONDecodeError inside zarr; the reader names the array instead, and verify catches it."""
    ids = all_ids(store)
    metadata = store / relative / "zarr.json"
    metadata.write_bytes(metadata.read_bytes()[:20])
    assert not verify_store(store).ok
    with pytest.raises(StoreFormatError) as raised:
        with open_store(store, read_path=read_path) as opened:
            opened.fetch([ids[0]])
    message = str(raised.value)
    assert f"cannot open {store / relative}: JSONDecodeError" in message and "dilstore verify" in message


@pytest.mark.parametrize("compressor", ["zstd", "blosc"])
@pytest.mark.parametrize("relative", ["states/values/c/0/0", "passages/ids/bytes/c/0"])
def test_compressed_bytes_the_codec_refuses_are_one_store_format_error(
    tmp_path: Path, compressor: str, relative: str
) -> None:
    """Bytes flipped at the start of a compressed chunk: the decompressor's RuntimeError came out bare, from a fetch
    (states) or from opening the shard (ids), and each sibling read was left pending ("Task was destroyed")."""
    shards = random_shards([5, 4], state_shape=(3,), seed=11, max_words=10)
    root = build_store(tmp_path / "store", shards, encoding="fp16", compressor=compressor)
    target = root / shard_path(1) / relative
    raw = bytearray(target.read_bytes())
    raw[:8] = bytes(byte ^ 0x5A for byte in raw[:8])
    target.write_bytes(bytes(raw))
    with open_store(root) as opened:
        assert opened.read_path == "zarr"
        with pytest.raises(StoreFormatError, match=r"shard-00001/.* cannot be decoded .*run `dilstore verify`"):
            opened.fetch([record.id for record in shards[1]])


@pytest.mark.parametrize("read_path", ["mmap", "zarr", "ranged"])
@pytest.mark.parametrize("damage", ["directory", "link loop"])
@pytest.mark.parametrize("relative", ["shards/shard-00001/states/values/c/0/0", "index/rows/c/0", "manifest.json"])
def test_a_local_file_that_cannot_be_read_is_a_store_error_not_a_read_to_try_again(
    store: Path, read_path: str, damage: str, relative: str
) -> None:
    """A directory or a loop of links in a file's place: a bare OSError on the mmap path, and elsewhere a
    StoreReadError saying "try again" (which `serve` answers 502 and keeps the store for), though it never mends."""
    target = store / relative
    target.unlink()
    if damage == "directory":
        target.mkdir()
    else:
        target.symlink_to(target)
    with pytest.raises(StoreFormatError) as raised:
        with open_store(store, read_path=read_path) as opened:
            opened.fetch(["s1/p0"])
    assert str(target) in str(raised.value) and "try again" not in str(raised.value)


@pytest.mark.parametrize("read_path", ["mmap", "ranged", "zarr"])
def test_a_pipe_standing_for_a_chunk_file_is_refused_not_waited_on(store: Path, read_path: str) -> None:
    """Opening a FIFO put where a chunk file was waited for a writer forever: `ask`, `compact` and `fetch` hung
    (hostile46 F3), on every read path (review46b 2: the fix had covered mapped files alone)."""
    chunk = next(path for path in sorted((store / shard_path(0)).rglob("c/0")) if path.is_file())
    chunk.unlink()
    os.mkfifo(chunk)
    outcome: list[BaseException | None] = []

    def fetch() -> None:
        try:
            with open_store(store, read_path=read_path) as opened:
                opened.fetch([all_ids_of(opened)[0]])
            outcome.append(None)
        except BaseException as error:  # noqa: BLE001 (handed to the test's thread)
            outcome.append(error)

    worker = threading.Thread(target=fetch, daemon=True)
    worker.start()
    worker.join(60)
    assert outcome, "the read did not return within 60 s: it is blocked opening a pipe"
    assert isinstance(outcome[0], StoreFormatError), outcome
    assert str(outcome[0]).endswith(f"{chunk} is not a regular file (a pipe, socket or device stands for it)")


def all_ids_of(opened) -> list[str]:
    return [opened.shard(0).id_at(row) for row in range(len(opened.shard(0)))]


DEEP_JSON = '{"a": ' + "[" * 100_000 + "]" * 100_000 + "}"


@pytest.mark.parametrize("relative", [f"{shard_path(0)}/zarr.json", f"{INDEX_DIR}/zarr.json",
                                      f"{INDEX_DIR}/{INDEX_ROWS}/zarr.json"])  # fmt: skip
def test_metadata_nested_too_deep_is_a_store_error(store: Path, relative: str) -> None:
    """JSON nested 100,000 deep in a zarr.json raised RecursionError through every command (hostile46 F4)."""
    first = all_ids(store)[0]
    (store / relative).write_text(DEEP_JSON, encoding="utf-8")
    with pytest.raises(StoreFormatError, match="RecursionError"):
        with open_store(store, read_path="zarr") as opened:
            opened.fetch([first])


@pytest.mark.parametrize("read_path", PATHS)
def test_states_declared_another_dtype_of_the_same_size_are_refused(store: Path, read_path: str) -> None:
    """fp16 states declared int16 (a same-size dtype, so every size check passes) were read as integers: silently
    wrong answers until `verify` ran (hostile47 F4)."""
    metadata = store / shard_path(0) / "states" / "values" / "zarr.json"
    declared = json.loads(metadata.read_text())
    metadata.write_text(json.dumps({**declared, "data_type": "int16"}))
    with pytest.raises(StoreFormatError, match=r"shard-00000/states/values is int16 \(\d+, 3\), expected float16 "
                                               r"\(\d+, 3\); run `dilstore verify`"):
        open_store(store, read_path=read_path).fetch(all_ids(store)[:1])


@pytest.mark.parametrize("change", ["zero", "short"])
def test_int8_channel_scales_that_cannot_decode_are_refused(tmp_path: Path, change: str) -> None:
    """Zero channel scales decoded every state to zeros (finite: no later check saw them; silently wrong answers),
    and scales of another length failed inside the decode with numpy's broadcast error (hostile47 F5)."""
    shards = random_shards([5, 4], state_shape=(3,), seed=11, max_words=10)
    store = build_store(tmp_path / "int8", shards, encoding="int8")
    scales = store / shard_path(0) / "states" / "channel_scales"
    if change == "zero":
        with zarr.config.set({"array.write_empty_chunks": True}):  # a chunk of zeros is written, not dropped
            damage(store, f"{shard_path(0)}/states/channel_scales", np.zeros_like)
        expected = r"states/channel_scales holds zero"
    else:
        declared = json.loads((scales / "zarr.json").read_text())
        (scales / "zarr.json").write_text(json.dumps({**declared, "shape": [2]}))
        expected = r"states/channel_scales is float32 \(2,\), expected float32 \(3,\)"
    with pytest.raises(StoreFormatError, match=expected):
        open_store(store, read_path="zarr").fetch([shards[0][0].id])


def test_a_shard_that_names_no_format_version_is_refused(store: Path) -> None:
    """A shard's attributes without a format version are not taken as the current version's."""
    ids = all_ids(store)
    attributes = store / shard_path(0) / "zarr.json"
    metadata = json.loads(attributes.read_text())
    del metadata["attributes"]["dilstore"]["format_version"]
    attributes.write_text(json.dumps(metadata))
    with open_store(store) as opened, pytest.raises(StoreFormatError, match="shard-00000 has format version None"):
        opened.fetch([ids[0]])


@pytest.mark.parametrize(("change", "found"), [
    (lambda data: data.update(format="other-store"), "its 'dilstore' attributes name format 'other-store', not "
                                                     "'dilstore-store'"),
    (lambda data: data.update(node="store"), "its 'dilstore' attributes name node 'store', not 'shard'"),
    (lambda data: data.clear(), "its 'dilstore' attributes name format None, not 'dilstore-store'"),
])  # fmt: skip
def test_a_shard_whose_attributes_name_another_format_or_node_is_refused_naming_what_it_found(
    store: Path, change, found: str
) -> None:
    """(tail61b F3) a shard whose `dilstore` attributes were there, but named another format or node, was refused as
    having "no 'dilstore' shard attributes", which sent its reader looking for attributes that exist."""
    ids = all_ids(store)
    attributes = store / shard_path(0) / "zarr.json"
    metadata = json.loads(attributes.read_text())
    change(metadata["attributes"]["dilstore"])
    attributes.write_text(json.dumps(metadata))
    with open_store(store) as opened, pytest.raises(StoreFormatError) as raised:
        opened.fetch([ids[0]])
    assert str(raised.value).endswith(f"shard-00000 is not a dilstore shard ({found})")


@pytest.mark.parametrize("newer", [1, 2, 100])
def test_a_shard_of_any_newer_format_version_is_refused_naming_it(store: Path, newer: int) -> None:
    """A shard written by a later dilstore (its format version above the reader's) is refused, the next version
    too, not read as if its layout were the current one; the message says to upgrade dilstore, as STORE_FORMAT.md
    §12 and the manifest's refusal do (spec61 F1: "has format version 4, newer than 3" left the reader to guess
    whether the store or the dilstore was at fault)."""
    ids = all_ids(store)
    attributes = store / shard_path(0) / "zarr.json"
    metadata = json.loads(attributes.read_text())
    assert metadata["attributes"]["dilstore"]["format_version"] <= SHARD_FORMAT_VERSION  # the store as written reads
    version = SHARD_FORMAT_VERSION + newer
    metadata["attributes"]["dilstore"]["format_version"] = version
    attributes.write_text(json.dumps(metadata))
    with open_store(store) as opened, pytest.raises(StoreFormatError) as raised:
        opened.fetch([ids[0]])
    assert str(raised.value).endswith(
        f"shard-00000 has format version {version}, newer than this dilstore reads ({SHARD_FORMAT_VERSION}); "
        "upgrade dilstore"
    )


@pytest.mark.parametrize("version", ["2", 2.5, True, [1]])
def test_a_shard_whose_format_version_is_not_an_integer_is_refused_in_one_line(store: Path, version) -> None:
    """A version "2" or [1] raised a TypeError from the comparison with the reader's version, and 2.5 or true was
    read as a version: each is a StoreFormatError naming the shard."""
    ids = all_ids(store)
    attributes = store / shard_path(0) / "zarr.json"
    metadata = json.loads(attributes.read_text())
    metadata["attributes"]["dilstore"]["format_version"] = version
    attributes.write_text(json.dumps(metadata))
    with open_store(store) as opened, pytest.raises(StoreFormatError) as raised:
        opened.fetch([ids[0]])
    assert str(raised.value).endswith(f"shard-00000 has format version {version!r}, not an integer; run `dilstore "
                                      "verify`")


@pytest.mark.parametrize(("field", "value"), [("passages", math.inf)])
def test_a_shard_attribute_too_large_for_an_integer_is_refused_in_one_line(store: Path, field: str, value) -> None:
    """A shard's count or size of 1e999 (JSON's number for infinity) was an OverflowError traceback from `compact` and
    from every reader that opened the shard (complex61 F8): a StoreFormatError naming the shard, as for a count that
    is not a number."""
    ids = all_ids(store)
    attributes = store / shard_path(0) / "zarr.json"
    metadata = json.loads(attributes.read_text())
    metadata["attributes"]["dilstore"][field] = value
    attributes.write_text(json.dumps(metadata))
    with open_store(store) as opened, pytest.raises(StoreFormatError, match=r"shard-00000 has malformed attributes: "
                                                    r"OverflowError: cannot convert float infinity to integer$"):
        opened.fetch([ids[0]])


@pytest.mark.parametrize("recorded", ["as text", [math.inf], [True], ["8"], 8])
def test_a_shard_state_shape_that_is_no_list_of_sizes_is_refused_in_one_line(store: Path, recorded) -> None:
    """(tail61 F1) A shard's state_shape was read with int() per item: the text "32" was the shape (3, 2), the text
    of the true width ("3" for this store's width of 3) was read as that width, and 1e999 was an OverflowError
    (complex61 F8). Each is now refused by name, as the manifest and codebook readers refuse it."""
    ids = all_ids(store)
    attributes = store / shard_path(0) / "zarr.json"
    metadata = json.loads(attributes.read_text())
    width = metadata["attributes"]["dilstore"]["state_shape"]
    metadata["attributes"]["dilstore"]["state_shape"] = "".join(map(str, width)) if recorded == "as text" else recorded
    attributes.write_text(json.dumps(metadata))
    with open_store(store) as opened, pytest.raises(StoreFormatError, match=r"shard-00000 has malformed attributes: "
                                                    r"ValueError: state_shape is .*, not a list of positive sizes$"):
        opened.fetch([ids[0]])
