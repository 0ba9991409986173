"""The 2bit and 1bit encodings: plain zarr-python reads the codes and the codebook, verify catches damage.

Decoding by hand from arrays read with zarr-python (the recipe STORE_FORMAT.md §4
gives: codes, scales and centroid ids from the shard, the codebook from the
store's `codebook/` group, which the shards do not copy) must equal what the
store returns on both read paths, for rotated codebooks (trained now) and for
codebooks without rotation or without centroids (stores written before them),
which still decode by the recipe, verify, and append in their own scheme; a byte
flipped in the store's `codebook/` group
(centroids included), in the shards' centroid ids, or in a codebook a shard
keeps of its own is a verify problem; a missing codebook
group, a codebook of another build or model, or one that a shard's own
codebook differs from, is refused by finalize and reported by verify; and on
Gaussian states with uneven per-dimension spreads the error stays near the
textbook values of 4- and 2-level quantizers. `dilstore info` counts a
centroid id byte per token only where the shards store ids, a shard
newer than rotated codes' version 3 is refused, and verify reports centroid ids
beside a codebook without centroids.
"""

from __future__ import annotations

import functools
import json
import shutil
import warnings
from pathlib import Path

import numpy as np
import pytest
import zarr
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from dilstore.storage.codebook import (
    CODEBOOK_DIR,
    codebook_build,
    codebook_changes,
    read_codebook,
    refuse_changed_codebook,
    write_codebook,
)
from dilstore.storage.encodings import check_codebook, get_encoding, round_trip, train_codebook
from dilstore.storage.errors import DilstoreError
from dilstore.storage.finalize import finalize
from dilstore.storage.fingerprint import fingerprint_sha256
from dilstore.storage.format import StoreFormatError, shard_path
from dilstore.storage.info import store_info
from dilstore.storage.location import StoreLocation
from dilstore.storage.reader import open_store
from dilstore.storage.records import PassageRecord
from dilstore.storage.verify import verify_store
from dilstore.storage.writer import write_shard
from tests.fixtures.store_fixtures import fingerprint_for

pytestmark = pytest.mark.usefixtures("quick_retries")  # reads fail on purpose here

DIMS = 10


def _records(seed: int, passages: int = 4) -> list[PassageRecord]:
    rng = np.random.default_rng(seed)
    records = []
    for row in range(passages):
        n = int(rng.integers(1, 9))
        states = (rng.standard_normal((n, DIMS)) * np.linspace(0.1, 5, DIMS) + 3).astype(np.float32)  # (n, d)
        records.append(PassageRecord(id=f"p{seed}-{row}", title="", text="", token_ids=np.arange(n, dtype=np.int32),
                                     char_spans=np.full((n, 2), -1, dtype=np.int32), states=states))
    return records


# The three codebook schemes a store may hold: rotated codes (trained now), per-dimension buckets against
# centroids (stores written before rotation), per-dimension buckets alone (stores written before centroids).
SCHEMES = ("rotated", "centroids", "plain")
SHARD_VERSIONS = {"rotated": 3, "centroids": 2, "plain": 1}


def _codebook(encoding: str, scheme: str = "rotated") -> dict[str, np.ndarray]:
    """A codebook of `scheme` trained on other tokens than the stores' (about 1800 of them, so no stored token is
    a centroid); copies of arrays trained once per module."""
    trained = _trained_codebook(encoding, rotate=scheme == "rotated")
    return {name: values.copy() for name, values in trained.items() if scheme != "plain" or name != "centroids"}


@functools.cache
def _trained_codebook(encoding: str, *, rotate: bool) -> dict[str, np.ndarray]:
    """`train_codebook` on the same sample for every store of the module: the training takes longer than the store
    (a "plain" codebook is the unrotated one without its centroids, as it was trained before)."""
    sample = np.concatenate([record.states for record in _records(99, passages=400)])  # (N, d)
    return train_codebook(encoding, sample, rotate=rotate)


def _hand_components(codes: np.ndarray, codebook: zarr.Group, bits: int) -> np.ndarray:
    """The per-dimension buckets' values `(T, d)` coded in `codes`, or for a rotated codebook the normalized
    residuals: each component's allocated bits in turn, its bucket's weight, times its axis."""
    unpacked = np.unpackbits(codes, axis=1)  # (T, 8 * width)
    if "rotation" not in codebook:
        buckets = unpacked.reshape(len(codes), -1, bits)  # (T, 8 * width / bits, bits)
        buckets = (buckets * (1 << np.arange(bits - 1, -1, -1))).sum(axis=2)[:, :DIMS]  # (T, d)
        return np.asarray(codebook["weights"][...])[buckets, np.arange(DIMS)]  # (T, d)
    allocation = np.asarray(codebook["allocation"][...]).astype(int)  # (d,)
    weights = np.asarray(codebook["component_weights"][...])  # (16, d)
    rotation = np.asarray(codebook["rotation"][...])  # (d, d): row j, component j's axis
    assert (np.diff(allocation[:8]) == 0).all() and set(allocation) <= {0, 1, 2, 4}  # blocks of 8 share bits
    assert allocation.sum() <= 8 * codes.shape[1]
    normalized = np.zeros((len(codes), DIMS), dtype=np.float64)  # (T, d)
    offset = 0
    for component, count in enumerate(allocation):
        code = (unpacked[:, offset : offset + count] * (1 << np.arange(count - 1, -1, -1))).sum(axis=1)  # (T,)
        normalized += weights[code, component][:, None] * rotation[component]
        offset += count
    assert not unpacked[:, offset:].any()  # the rest is zero padding
    return normalized


def _hand_decoded(shard: zarr.Group, codebook: zarr.Group, bits: int) -> np.ndarray:
    """STORE_FORMAT.md §4's decoding recipe on arrays read with zarr-python: `(T, d)` float32."""
    codes = np.asarray(shard["states/codes"][...])  # (T, ceil(d * bits / 8)) uint8
    assert codes.dtype == np.uint8 and codes.shape[1] == -(-DIMS * bits // 8)
    scales = np.asarray(shard["states/scales"][...]).astype(np.float32)  # (T,) float16 on disk
    mean = np.asarray(codebook["mean"][...])
    decoded = mean + scales[:, None] * _hand_components(codes, codebook, bits)  # (T, d)
    if "centroids" in codebook:
        ids = np.asarray(shard["states/centroid_ids"][...])  # (T,) uint8
        assert ids.dtype == np.uint8 and codebook["centroids"].shape == (256, DIMS)
        decoded += np.asarray(codebook["centroids"][...])[ids]  # (T, d)
    else:
        assert "states/centroid_ids" not in shard
    return decoded


def _build(root: Path, encoding: str, codebook: dict[str, np.ndarray]) -> list[PassageRecord]:
    """A two-shard store of `encoding` encoded with `codebook`, kept at STORE/codebook; its records."""
    shards = [_records(0), _records(1)]
    write_codebook(root / CODEBOOK_DIR, encoding, codebook, (DIMS,))
    for index, records in enumerate(shards):
        write_shard(root, index, records, kind="dilbert", encoding=encoding, durable=False, codebook=codebook)
    finalize(root, fingerprint_for("dilbert", encoding), {"command": "test"})
    return [record for shard in shards for record in shard]


@pytest.fixture(scope="module", params=["2bit", "1bit"])
def lowbit_template(request, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path]:
    """The store `lowbit_store` copies, built once per encoding: its encoding and folder (never changed)."""
    root = tmp_path_factory.mktemp(f"lowbit-{request.param}")
    _build(root, request.param, _codebook(request.param))
    return request.param, root


@pytest.fixture
def lowbit_store(lowbit_template: tuple[str, Path], tmp_path: Path) -> tuple[str, Path, list[PassageRecord]]:
    """A two-shard store of one encoding with one trained codebook (with centroids), also kept at STORE/codebook:
    a copy of the module's, in the test's own folder (tests damage it); its records."""
    encoding, template = lowbit_template
    shutil.copytree(template, tmp_path, dirs_exist_ok=True)
    return encoding, tmp_path, [*_records(0), *_records(1)]


@pytest.mark.parametrize("scheme", SCHEMES)
def test_zarr_python_reads_codes_and_codebook_and_decodes_like_the_store(lowbit_store, scheme, tmp_path_factory
                                                                         ) -> None:
    encoding, root, records = lowbit_store
    centroids = scheme != "plain"
    if scheme != "rotated":  # a store written before rotation (or before centroids): its codebook has none
        root = tmp_path_factory.mktemp("old")
        _build(root, encoding, _codebook(encoding, scheme))
        assert verify_store(root).ok
    bits = int(encoding[0])
    stored = {passage.id: passage.states for passage in open_store(root).fetch([r.id for r in records])}
    codebook = zarr.open_group(root / CODEBOOK_DIR, mode="r")
    assert ("centroids" in codebook) == centroids and ("rotation" in codebook) == (scheme == "rotated")
    assert ("cutoffs" in codebook) == (scheme != "rotated")
    marginal = -(-DIMS * bits // 8) + 2 + (1 if centroids else 0)  # codes, float16 scale, uint8 centroid id
    assert store_info(root)["state_bytes_per_token_marginal"] == marginal
    for shard in range(2):
        group = zarr.open_group(root / shard_path(shard), mode="r")
        assert group.attrs["dilstore"]["codebook"] == "store"
        assert group.attrs["dilstore"]["format_version"] == SHARD_VERSIONS[scheme]  # older dilstores refuse newer
        assert not any(f"states/{name}" in group for name in ("mean", "cutoffs", "weights", "centroids", "rotation",
                                                              "allocation", "component_weights"))  # no copy
        decoded = _hand_decoded(group, codebook, bits)
        offsets = np.asarray(group["tokens/offsets"][...])
        ids = [r.id for r in records if r.id.startswith(f"p{shard}-")]
        for row, passage_id in enumerate(ids):
            np.testing.assert_allclose(decoded[offsets[row] : offsets[row + 1]], stored[passage_id], rtol=1e-6,
                                       atol=1e-5)  # a float32 product with the axes
        # §4's scale recipe from the written states, the centroid ids and the mean (spec61 F3)
        states = np.concatenate([r.states for r in records if r.id.startswith(f"p{shard}-")])  # (T, d)
        if centroids:
            states = states - np.asarray(codebook["centroids"][...])[np.asarray(group["states/centroid_ids"][...])]
        residuals = np.subtract(states, np.asarray(codebook["mean"][...]), dtype=np.float32)  # (T, d)
        scales = np.sqrt(np.mean(np.square(residuals, dtype=np.float64), axis=-1)).astype(np.float16)  # (T,)
        np.testing.assert_array_equal(np.asarray(group["states/scales"][...]), scales)


def test_round_trip_gives_back_what_the_store_returns(lowbit_store) -> None:
    """`round_trip` (what `train qa --store-encoding` trains on) equals the store's own reads, to float32 rounding.

    The store decodes each passage's rows and round_trip all of them at once; the final float32 product with the
    axes may round differently with the row count (OpenBLAS on AMD EPYC: up to 1.2e-6 apart)."""
    encoding, root, records = lowbit_store
    codebook = read_codebook(root / CODEBOOK_DIR, encoding)[0]
    through = round_trip(encoding, codebook)
    stored = open_store(root).fetch([record.id for record in records])
    joined = through(np.concatenate([record.states for record in records]))  # (T, d)
    np.testing.assert_allclose(joined, np.concatenate([passage.states for passage in stored]), rtol=1e-6, atol=1e-5)
    assert not np.array_equal(joined, np.concatenate([record.states for record in records]))  # it is lossy
    with pytest.raises(StoreFormatError, match="needs the codebook"):
        round_trip(encoding)


@pytest.mark.parametrize("bits", [1, 2])
def test_bucket_codes_pack_high_bits_first_and_decode_to_their_bucket_s_weight(bits: int) -> None:
    """A hand-made codebook of per-dimension buckets (the scheme of stores written before rotation) whose values
    each lie inside a known bucket: the codes are the buckets, packed first value and high bit first (STORE_FORMAT.md
    §4), and decode to the bucket's weight times the token's float16 scale, plus the mean (mut57b: packing the bits
    of a bucket low bit first passed every test, as the hand decoder above reads codes the encoder wrote)."""
    levels = 2**bits
    values = np.array([-1.5, -0.5, 0.5, 1.5] if bits == 2 else [-1.0, 1.0], dtype=np.float32)  # one per bucket
    buckets = np.array([[(token + dim) % levels for dim in range(DIMS)] for token in range(6)])  # (T, d)
    mean = np.linspace(-2, 2, DIMS, dtype=np.float32)  # (d,)
    states = values[buckets] + mean  # (T, d)
    codebook = {"mean": mean,
                "cutoffs": np.repeat(np.array([-1.0, 0.0, 1.0] if bits == 2 else [0.0], np.float32)[:, None], DIMS, 1),
                "weights": np.repeat((np.arange(levels, dtype=np.float32) - 7)[:, None], DIMS, 1)}  # fmt: skip
    encoded = get_encoding(f"{bits}bit").encode(states, codebook)
    bit_rows = (buckets[..., None] >> np.arange(bits - 1, -1, -1)) & 1  # (T, d, bits), high bit first
    np.testing.assert_array_equal(encoded["codes"], np.packbits(bit_rows.reshape(len(states), -1), axis=1))
    scales = np.sqrt(np.mean(np.square(values[buckets], dtype=np.float64), axis=1)).astype(np.float16)  # (T,)
    np.testing.assert_array_equal(encoded["scales"], scales)
    expected = (buckets - 7).astype(np.float32) * scales.astype(np.float32)[:, None] + mean  # (T, d)
    np.testing.assert_array_equal(get_encoding(f"{bits}bit").decode(encoded), expected)


def test_round_trip_of_a_float_encoding_is_its_rounding() -> None:
    states = np.random.default_rng(3).standard_normal((7, DIMS)).astype(np.float32)  # (T, d)
    np.testing.assert_array_equal(round_trip("fp16")(states), states.astype(np.float16).astype(np.float32))
    np.testing.assert_array_equal(round_trip("fp32")(states), states)


def test_both_read_paths_and_a_compressed_store_decode_with_the_store_codebook(lowbit_store, tmp_path_factory) -> None:
    encoding, root, records = lowbit_store
    ids = [record.id for record in records]
    codebook = read_codebook(root / CODEBOOK_DIR, encoding)[0]
    packed = tmp_path_factory.mktemp("packed")
    write_codebook(packed / CODEBOOK_DIR, encoding, codebook, (DIMS,))
    for index, prefix in enumerate(("p0-", "p1-")):
        write_shard(packed, index, [r for r in records if r.id.startswith(prefix)], kind="dilbert", encoding=encoding,
                    durable=False, codebook=codebook, compressor="zstd")
    finalize(packed, fingerprint_for("dilbert", encoding), {"command": "test"})
    mapped = open_store(root, read_path="mmap")
    reads = [mapped.fetch(ids), open_store(root, read_path="zarr").fetch(ids), open_store(packed).fetch(ids)]
    for passages in reads[1:]:
        for first, other in zip(reads[0], passages, strict=True):
            np.testing.assert_array_equal(first.states, other.states)
    assert mapped.codebook() is mapped.codebook()  # loaded once per store, shared by its shards
    assert verify_store(packed).ok


def test_verify_catches_a_damaged_store_codebook_or_shard_codebook(lowbit_store, tmp_path_factory) -> None:
    encoding, root, records = lowbit_store
    assert verify_store(root).ok
    own = tmp_path_factory.mktemp("own")  # shards written without the store's codebook keep their own (older layout)
    write_shard(own, 0, records, kind="dilbert", encoding=encoding, durable=False)
    finalize(own, fingerprint_for("dilbert", encoding), {"command": "test"})
    assert verify_store(own).ok and not (own / CODEBOOK_DIR).exists()
    damaged = ((own, f"{shard_path(0)}/states/component_cutoffs/c/0/0"),
               (own, f"{shard_path(0)}/states/centroids/c/0/0"), (own, f"{shard_path(0)}/states/rotation/c/0/0"),
               (root, f"{CODEBOOK_DIR}/component_weights/c/0/0"), (root, f"{CODEBOOK_DIR}/centroids/c/0/0"),
               (root, f"{CODEBOOK_DIR}/allocation/c/0"), (root, f"{shard_path(1)}/states/centroid_ids/c/0"))
    for store, relative in damaged:
        path = store / relative
        original = path.read_bytes()
        path.write_bytes(bytes([original[0] ^ 0x40]) + original[1:])
        report = verify_store(store)
        path.write_bytes(original)
        assert not report.ok and any(relative in problem for problem in report.problems), report.problems


@pytest.mark.parametrize("damage", ["metadata", "array", "removed"])
def test_a_damaged_or_missing_store_codebook_is_named_and_no_shard_is_blamed(lowbit_store, damage: str) -> None:
    """Each shard was reported as "states/centroid_ids is there, but its codebook has no 'centroids'" beside the
    codebook's own damage (quant44 M2)."""
    _, root, _ = lowbit_store
    if damage == "metadata":
        (root / CODEBOOK_DIR / "zarr.json").write_text("{not json")
    elif damage == "array":
        shutil.rmtree(root / CODEBOOK_DIR / "centroids")
    else:
        shutil.rmtree(root / CODEBOOK_DIR)
    report = verify_store(root)
    assert not report.ok
    assert not any("its codebook has no" in problem for problem in report.problems), report.problems
    assert any(problem.startswith(f"{CODEBOOK_DIR}/") or f"file {CODEBOOK_DIR}/" in problem
               for problem in report.problems), report.problems  # fmt: skip


def test_a_codebook_a_server_fails_to_send_is_one_problem_not_one_per_shard(lowbit_store) -> None:
    """verify took an HTTP 500 on codebook/zarr.json for a store without a codebook and blamed every shard ("its
    codebook has no 'centroids'", "decodes with the store's codebook/, which is missing")."""
    from tests.fixtures.http_store import serve_directory

    _, root, _ = lowbit_store
    with serve_directory(root.parent, listings=False) as server:
        server.faults[f"{root.name}/{CODEBOOK_DIR}/zarr.json"] = 500
        report = verify_store(f"{server.url}/{root.name}")
    assert not any(problem.startswith("shards/") for problem in report.problems), report.problems
    assert any(problem.startswith(f"{CODEBOOK_DIR}: cannot be read: ClientResponseError: 500")
               for problem in report.problems), report.problems


def test_a_shard_that_uses_the_store_codebook_needs_the_group(lowbit_store, tmp_path_factory) -> None:
    encoding, root, records = lowbit_store
    codebook = read_codebook(root / CODEBOOK_DIR, encoding)[0]
    bare = tmp_path_factory.mktemp("bare")
    write_shard(bare, 0, records, kind="dilbert", encoding=encoding, durable=False, codebook=codebook)
    with pytest.raises(DilstoreError, match=r"shards/shard-00000 decodes with the store's codebook/, which is missing"):
        finalize(bare, fingerprint_for("dilbert", encoding), {"command": "test"})
    (root / CODEBOOK_DIR).rename(root / "moved")  # a finalized store that lost its codebook
    with pytest.raises(StoreFormatError, match="cannot read the store's codebook .* run `dilstore verify`"):
        open_store(root).fetch([records[0].id])
    problems = verify_store(root).problems
    assert "shards/shard-00000 decodes with the store's codebook/, which is missing" in problems
    assert "missing file codebook/component_weights/c/0/0" in problems  # the manifest lists it


def test_codes_whose_codebook_array_is_gone_are_refused_not_decoded(lowbit_store) -> None:
    """Without codebook/centroids, the shards' centroid ids were ignored: states off by several times their scale."""
    encoding, root, records = lowbit_store
    shutil.rmtree(root / CODEBOOK_DIR / "centroids")
    with pytest.raises(StoreFormatError, match=r"holds states/centroid_ids, but its codebook has no 'centroids'"):
        open_store(root).fetch([records[0].id])


def test_a_codebook_array_declaring_a_huge_shape_is_refused_before_it_is_read(lowbit_store) -> None:
    """A codebook array declaring shape [10**9, d] was read at that size first: a 1.4 TiB MemoryError traceback
    (hostile46 F8)."""
    _, root, records = lowbit_store
    metadata = root / CODEBOOK_DIR / "mean" / "zarr.json"
    document = json.loads(metadata.read_text(encoding="utf-8"))
    document["shape"] = [10**9, *document["shape"][1:]]
    metadata.write_text(json.dumps(document), encoding="utf-8")
    with pytest.raises(StoreFormatError, match=r"codebook array .*mean has shape \(1000000000,.*need it to be"):
        open_store(root).fetch([records[0].id])


def test_a_codebook_group_in_place_of_an_array_is_refused_naming_it(lowbit_store) -> None:
    """A group where the codebook's `mean` array belongs: a fetch raised AttributeError ('Group' object has no
    attribute 'shape'), a traceback from `ask` or `serve`, and verify named the AttributeError (types58 F3)."""
    _, root, records = lowbit_store
    mean = root / CODEBOOK_DIR / "mean"
    shutil.rmtree(mean)
    mean.mkdir()
    (mean / "zarr.json").write_text(json.dumps({"zarr_format": 3, "node_type": "group", "attributes": {}}))
    with pytest.raises(StoreFormatError, match=r"^codebook .*codebook/mean is not an array$"):
        open_store(root).fetch([records[0].id])


def test_a_codebook_for_another_shape_or_encoding_is_refused(tmp_path: Path) -> None:
    codebook = train_codebook("2bit", np.ones((5, DIMS), dtype=np.float32))
    with pytest.raises(StoreFormatError, match=r"has shape \(11,\), but states of shape \(10,\) need it to be \(10,\)"):
        write_shard(tmp_path, 0, _records(0), kind="dilbert", encoding="2bit", codebook=train_codebook(
            "2bit", np.ones((5, DIMS + 1), dtype=np.float32)))
    with pytest.raises(StoreFormatError, match="holds arrays"):
        write_shard(tmp_path, 0, _records(0), kind="dilbert", encoding="1bit", codebook={"mean": codebook["mean"]})
    write_codebook(tmp_path / "book", "2bit", codebook, (DIMS,))
    with pytest.raises(StoreFormatError, match="not '1bit'"):
        read_codebook(tmp_path / "book", "1bit")


def _unfinalized(root: Path, generation: str, *, book_generation: str, book_model: str = "dilbert",
                 copied: bool = True) -> None:
    """Two 2bit shards of build `generation`, and a codebook of build `book_generation` made by `book_model`'s
    fingerprint; the shards are encoded with it (`copied`, they refer to it) or train and keep their own."""
    shards = [_records(0), _records(1)]
    codebook = train_codebook("2bit", np.concatenate([record.states for shard in shards for record in shard]))
    write_codebook(root / CODEBOOK_DIR, "2bit", codebook, (DIMS,), generation=book_generation,
                   fingerprint=fingerprint_for(book_model, "2bit"))
    for index, records in enumerate(shards):
        write_shard(root, index, records, kind="dilbert", encoding="2bit", durable=False,
                    codebook=codebook if copied else None, generation=generation,
                    fingerprint=fingerprint_for("dilbert", "2bit"))


@pytest.mark.parametrize(
    ("book_generation", "book_model", "copied", "message"),
    [
        ("theirs", "dilbert", True, "codebook belongs to build 'theirs', the store to 'mine'"),
        ("mine", "earl-s1", True, "codebook was made by another model than the fingerprint says"),
        ("mine", "dilbert", False, r"shard-00000: its codebook copy states/(\w+) differs from codebook/\1"),
    ],
)
def test_finalize_refuses_a_codebook_of_another_build_or_model_or_that_a_shard_does_not_copy(
    tmp_path: Path, book_generation: str, book_model: str, copied: bool, message: str
) -> None:
    _unfinalized(tmp_path, "mine", book_generation=book_generation, book_model=book_model, copied=copied)
    with pytest.raises(DilstoreError, match=message):
        finalize(tmp_path, fingerprint_for("dilbert", "2bit"), generation="mine")


def test_the_codebook_records_the_build_and_verify_tells_an_edited_one(tmp_path: Path) -> None:
    _unfinalized(tmp_path, "mine", book_generation="mine")
    (tmp_path / ".tmp-codebook-0123").mkdir()  # a run killed while it wrote the codebook
    finalize(tmp_path, fingerprint_for("dilbert", "2bit"), generation="mine")
    assert not (tmp_path / ".tmp-codebook-0123").exists()
    expected = {"generation": "mine", "fingerprint_sha256": fingerprint_sha256(fingerprint_for("dilbert", "2bit"))}
    assert codebook_build(tmp_path / CODEBOOK_DIR) == expected
    assert verify_store(tmp_path).ok
    (tmp_path / CODEBOOK_DIR / "notes.txt").write_text("not the store's")
    attributes = tmp_path / CODEBOOK_DIR / "zarr.json"
    metadata = json.loads(attributes.read_text())
    metadata["attributes"]["dilstore"]["generation"] = "edited"
    attributes.write_text(json.dumps(metadata))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        problems = verify_store(tmp_path).problems
    assert [str(warning.message) for warning in caught] == []  # the stray file is a problem, not also zarr noise
    assert "codebook/notes.txt: inside the store's data but not in the manifest" in problems
    assert any(problem.startswith("codebook/zarr.json: ") for problem in problems)  # its checksum entry
    assert "codebook belongs to build 'edited', the store to 'mine'" in problems


@pytest.mark.parametrize(("encoding", "bound"), [("2bit", 0.16), ("1bit", 0.40)])
def test_gaussian_error_is_near_the_optimal_quantizers(encoding: str, bound: float) -> None:
    """Optimal 4-/2-level Gaussian quantizers leave 0.118 / 0.363 of the variance; quantile buckets are close."""
    rng = np.random.default_rng(7)
    states = (rng.standard_normal((4000, 64)) * rng.gamma(2, size=64) + rng.standard_normal(64) * 10).astype(np.float32)
    spec = get_encoding(encoding)
    decoded = spec.decode(spec.encode(states, train_codebook(encoding, states[:2000])))
    residual = states - states.mean(axis=0)
    assert np.square(decoded - states).sum() / np.square(residual).sum() < bound


@pytest.mark.parametrize("encoding", ["2bit", "1bit"])
@settings(max_examples=25, deadline=None)
@given(data=st.data())
def test_few_tokens_train_one_centroid_per_32_and_still_fill_the_table(encoding: str, data) -> None:
    """A sample of N tokens trains max(1, N // 32) centroids and the table repeats them to its 256 rows (codes51 F1:
    one centroid per token, what up to 256 tokens got before, left the residual codes nothing to learn); every
    token's id is a trained row, equal tokens decode exactly, and an empty sample gives an all-zero table."""
    state_shape = data.draw(st.sampled_from([(1,), (7,), (3, 5)]))
    tokens = data.draw(st.integers(0, 100))
    states = data.draw(hnp.arrays(np.float32, (tokens, *state_shape), elements=st.integers(-100, 100).map(float)))
    if data.draw(st.booleans()) and tokens:
        states[:] = states[0]  # every token the same
    spec = get_encoding(encoding)
    codebook = train_codebook(encoding, states)
    centroids = codebook["centroids"]
    assert centroids.shape == (256, *state_shape)
    if tokens == 0:
        assert not centroids.any()
    trained = max(1, tokens // 32)
    assert np.array_equal(centroids, centroids[np.arange(256) % trained])
    encoded = spec.encode(states, codebook)
    assert encoded["centroid_ids"].shape == (tokens, *state_shape[:-1]) and encoded["centroid_ids"].dtype == np.uint8
    assert (encoded["centroid_ids"] < trained).all()
    decoded = spec.decode({**spec.prepare(codebook), **{name: encoded[name] for name in
                                                        ("codes", "scales", "centroid_ids")}})
    assert np.isfinite(decoded).all()
    if tokens and (states == states[0]).all():
        np.testing.assert_array_equal(decoded, states)


@pytest.mark.parametrize("encoding", ["2bit", "1bit"])
def test_centroids_shrink_the_error_and_a_codebook_without_them_encodes_as_before(encoding: str) -> None:
    """Clustered states: centroids cut the error; without them, the arrays and values are the pre-centroid ones."""
    rng = np.random.default_rng(3)
    centres = rng.standard_normal((40, 32)) * 4  # (40, d)
    states = (centres[rng.integers(0, 40, 3000)] + rng.standard_normal((3000, 32))).astype(np.float32)  # (T, d)
    spec = get_encoding(encoding)
    codebook = train_codebook(encoding, states[:1500], rotate=False)
    old = {name: values for name, values in codebook.items() if name != "centroids"}
    new_arrays, old_arrays = spec.encode(states, codebook), spec.encode(states, old)
    assert "centroid_ids" not in old_arrays and set(old_arrays) == {"codes", "scales", "mean", "cutoffs", "weights"}
    residuals = (states - old["mean"]).astype(np.float32)  # the pre-centroid scheme: residual against the mean
    np.testing.assert_array_equal(old_arrays["scales"],
                                  np.sqrt(np.mean(np.square(residuals, dtype=np.float64), axis=1)).astype(np.float16))
    errors = [np.square(spec.decode(arrays) - states).sum() for arrays in (new_arrays, old_arrays)]
    assert errors[0] < 0.6 * errors[1]
    with pytest.raises(StoreFormatError, match="holds arrays"):
        check_codebook(spec, {**old, "extra": old["mean"]}, (32,))


@pytest.mark.parametrize("scheme", ["rotated", "plain"])
def test_a_token_whose_residual_is_beyond_a_float16_scale_is_refused_naming_it(tmp_path: Path, scheme: str) -> None:
    """A token vector whose residual against the codebook has an RMS past 65504 cannot keep its float16 scale, so
    write_shard refuses it naming its passage and token, as fp16 refuses such values (spec61 F2: the scale was
    clipped to 65504 and the shard stored; the token then decoded about 10 times too small, with a relative error
    of 0.93, and verify passed the store). A token of RMS below the limit is stored as before."""
    codebook = _codebook("2bit", scheme)
    records = _records(3)
    moderate = records[1].states.copy()
    moderate[0] *= 1e4  # (n, d): an RMS of about 5e4
    stored = [*records[:1], PassageRecord(**{**records[1].__dict__, "states": moderate}), *records[2:]]
    write_shard(tmp_path / "a", 0, stored, kind="dilbert", encoding="2bit", codebook=codebook, durable=False)
    huge = records[1].states.copy()
    huge[0] *= 1e6  # an RMS of about 5e6
    refused = [*records[:1], PassageRecord(**{**records[1].__dict__, "states": huge}), *records[2:]]
    with pytest.raises(DilstoreError, match=r"^passage 'p3-1': token 0 has a residual of RMS 5\.\d+e\+06 .*65504"):
        write_shard(tmp_path / "b", 0, refused, kind="dilbert", encoding="2bit", codebook=codebook, durable=False)
    assert not (tmp_path / "b" / shard_path(0)).exists()


def test_a_shard_newer_than_rotated_codes_is_refused(lowbit_store) -> None:
    _, root, records = lowbit_store
    attributes = root / shard_path(0) / "zarr.json"
    metadata = json.loads(attributes.read_text())
    metadata["attributes"]["dilstore"]["format_version"] = 4
    attributes.write_text(json.dumps(metadata))
    with pytest.raises(StoreFormatError, match=r"format version 4, newer than this dilstore reads \(3\); upgrade"):
        open_store(root).fetch([records[0].id])


def test_verify_reports_centroid_ids_beside_a_codebook_without_centroids(tmp_path: Path) -> None:
    _build(tmp_path, "2bit", _codebook("2bit", "plain"))
    group = zarr.open_group(tmp_path / shard_path(0), mode="r+")
    tokens = group["states/scales"].shape[0]
    group.create_array("states/centroid_ids", shape=(tokens,), dtype="uint8", fill_value=0)
    problems = verify_store(tmp_path).problems
    assert "shards/shard-00000: states/centroid_ids is there, but its codebook has no 'centroids'" in problems


def test_verify_opens_the_store_codebook_once_for_all_shards(lowbit_store, monkeypatch) -> None:
    """Which layout each shard has is decided from the store's codebook/ read once, not once per shard."""
    _, root, _ = lowbit_store
    opened: list[str] = []
    original = StoreLocation.open_group

    def counting(self, relative: str = "", *args, **kwargs):
        opened.append(relative)
        return original(self, relative, *args, **kwargs)

    monkeypatch.setattr(StoreLocation, "open_group", counting)
    assert verify_store(root).ok
    shards = [relative for relative in opened if relative.startswith("shards/")]
    assert len(set(shards)) == 2  # both shards were checked
    assert opened.count(CODEBOOK_DIR) <= 2  # the layout once, store_codebook_problems once: not per shard


def test_a_store_given_for_its_codebook_is_pointed_to_its_codebook_folder(tmp_path: Path) -> None:
    """`--codebook STORE` said only zarr's "GroupNotFoundError: No group found" (lowbit39 L3), and named the folder
    again as zarr's `LocalStore('file:///…')` (url59 F4): it says no group is there, naming the path once."""
    states = np.random.default_rng(0).standard_normal((64, 8)).astype(np.float32)
    write_codebook(tmp_path / "store" / CODEBOOK_DIR, "2bit", train_codebook("2bit", states), (8,))
    with pytest.raises(StoreFormatError, match=rf"^cannot open codebook {tmp_path / 'store'}: no Zarr group is there "
                                               rf"\(no zarr.json of one\); a store's codebook is its codebook/ folder: "
                                               rf"{tmp_path / 'store' / CODEBOOK_DIR}\?$"):  # fmt: skip
        read_codebook(tmp_path / "store", "2bit")
    with pytest.raises(StoreFormatError, match=r"cannot open codebook .*\w$"):  # no hint where none fits
        read_codebook(tmp_path / "nowhere", "2bit")


def test_a_codebook_with_a_chunk_missing_or_cut_is_refused_naming_the_array(tmp_path: Path) -> None:
    """A missing chunk file was read as zeros (a store built with all-zero centroids passed verify), and a cut one
    ended in a traceback (crash40 M1, M2)."""
    states = np.random.default_rng(0).standard_normal((64, 8)).astype(np.float32)
    book = write_codebook(tmp_path / "book", "2bit", train_codebook("2bit", states), (8,))
    chunk = next((book / "mean").rglob("c/*"))
    whole = chunk.read_bytes()
    chunk.write_bytes(whole[: len(whole) // 2])
    with pytest.raises(StoreFormatError, match=rf"^cannot read codebook array {book}/mean: "):
        read_codebook(book, "2bit")
    chunk.unlink()
    with pytest.raises(StoreFormatError, match=rf"^codebook array {book}/mean is missing 1 of its 1 chunk file"):
        read_codebook(book, "2bit")


@pytest.mark.parametrize("damage", ["zeroed", "scaled", "a row repeated"])
def test_a_rotation_without_orthonormal_rows_is_refused_and_verify_names_it(lowbit_store, damage: str) -> None:
    """A codebook whose rotation was zeroed (every value finite) read as valid: a --codebook run encoded with it
    (F1 25.0 instead of 73.6) and its store passed verify (codes51 F2). STORE_FORMAT §4: unit rows, at right
    angles, per vector position."""
    encoding, root, _ = lowbit_store
    codebook = read_codebook(root / CODEBOOK_DIR, encoding)[0]
    rotation = codebook["rotation"].copy()  # (d, d)
    if damage == "zeroed":
        rotation[:] = 0
    elif damage == "scaled":
        rotation *= 1.01
    else:
        rotation[1] = rotation[0]
    refused = "codebook array 'rotation' does not hold orthonormal rows"
    with pytest.raises(StoreFormatError, match=refused):
        check_codebook(get_encoding(encoding), {**codebook, "rotation": rotation}, (DIMS,))
    with zarr.config.set({"array.write_empty_chunks": True}):  # else an all-zero chunk is dropped, not written
        zarr.open_array(str(root / CODEBOOK_DIR / "rotation"), mode="r+")[...] = rotation
    with pytest.raises(StoreFormatError, match=rf"^codebook {root / CODEBOOK_DIR}: {refused}"):  # names the path
        read_codebook(root / CODEBOOK_DIR, encoding)
    problems = verify_store(root).problems
    assert f"{CODEBOOK_DIR}: {refused}" in "\n".join(problems), problems


def test_a_trained_rotation_of_many_positions_passes_the_orthonormal_check() -> None:
    """The check holds per vector position (a rotation `(d, *S)`), also for a block of its rows (verify reads a
    shard's own arrays a block of rows at a time)."""
    spec = get_encoding("2bit")
    rotation = train_codebook("2bit", np.random.default_rng(3).standard_normal((300, 2, 16)))["rotation"]  # (16,2,16)
    assert spec.array("rotation").check(rotation) is None and spec.array("rotation").check(rotation[5:9]) is None
    rotation[:, 1] *= 2  # the second position's axes are no longer unit vectors
    assert "does not hold orthonormal rows" in spec.array("rotation").check(rotation)


def test_a_store_codebook_is_compared_with_its_manifest(lowbit_store, tmp_path_factory) -> None:
    """What codebook_changes tells of a store's codebook/ against the manifest's sizes and SHA-256s (codes51 F2,
    F3): nothing for an intact one or for a codebook of no store; a file changed, gone or added."""
    encoding, root, _ = lowbit_store
    assert codebook_changes(root / CODEBOOK_DIR) == (root, [])
    loose = write_codebook(tmp_path_factory.mktemp("loose") / CODEBOOK_DIR, encoding, _codebook(encoding), (DIMS,))
    assert codebook_changes(loose) == (None, [])  # no manifest beside it
    (root / CODEBOOK_DIR / "mean" / "c" / "0").unlink()
    (root / CODEBOOK_DIR / "extra.json").write_text("{}")
    zarr.open_array(str(root / CODEBOOK_DIR / "centroids"), mode="r+")[0, 0] = 7.0
    assert codebook_changes(root / CODEBOOK_DIR) == (root, [
        f"{CODEBOOK_DIR}/extra.json is not in it", f"{CODEBOOK_DIR}/centroids/c/0/0 changed after finalize: its "
        "SHA-256 differs", f"{CODEBOOK_DIR}/mean/c/0 is missing"])  # fmt: skip
    with pytest.raises(StoreFormatError, match=rf"^refused: the codebook does not match {root}/manifest.json \("
                                               rf"{CODEBOOK_DIR}/extra.json is not in it; .*; `dilstore verify "
                                               rf"{root}` lists what changed: put codebook/ back from a copy of the "
                                               r"store, or build the store again with --overwrite$"):  # fmt: skip
        refuse_changed_codebook(root / CODEBOOK_DIR, "refused")
