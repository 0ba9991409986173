"""The 2bit and 1bit encodings: plain zarr-python reads the codes and the codebook, verify catches damage.

Decoding by hand from arrays read with zarr-python (the recipe STORE_FORMAT.md §4
gives) must equal what the store returns; a byte flipped in a shard's codebook
copy or in the store's `codebook/` group is a verify problem; and on Gaussian
states with uneven per-dimension spreads the error stays near the textbook
values of 4- and 2-level quantizers.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import zarr

from dilstore.storage.codebook import CODEBOOK_DIR, read_codebook, write_codebook
from dilstore.storage.encodings import get_encoding, train_codebook
from dilstore.storage.finalize import finalize
from dilstore.storage.format import StoreFormatError, shard_path
from dilstore.storage.reader import open_store
from dilstore.storage.records import PassageRecord
from dilstore.storage.verify import verify_store
from dilstore.storage.writer import write_shard
from tests.fixtures.store_fixtures import fingerprint_for

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


@pytest.fixture(params=["2bit", "1bit"])
def lowbit_store(request, tmp_path: Path) -> tuple[str, Path, list[PassageRecord]]:
    """A two-shard store of one encoding with one trained codebook, also kept at STORE/codebook."""
    encoding = request.param
    shards = [_records(0), _records(1)]
    every = [record for shard in shards for record in shard]
    codebook = train_codebook(encoding, np.concatenate([record.states for record in every]))
    write_codebook(tmp_path / CODEBOOK_DIR, encoding, codebook, (DIMS,))
    for index, records in enumerate(shards):
        write_shard(tmp_path, index, records, kind="dilbert", encoding=encoding, durable=False, codebook=codebook)
    finalize(tmp_path, fingerprint_for("dilbert", encoding), {"command": "test"})
    return encoding, tmp_path, every


def test_zarr_python_reads_codes_and_codebook_and_decodes_like_the_store(lowbit_store) -> None:
    encoding, root, records = lowbit_store
    bits = int(encoding[0])
    stored = {passage.id: passage.states for passage in open_store(root).fetch([r.id for r in records])}
    codebook = zarr.open_group(root / CODEBOOK_DIR, mode="r")
    for shard in range(2):
        group = zarr.open_group(root / shard_path(shard), mode="r")
        codes = np.asarray(group["states/codes"][...])  # (T, ceil(d * bits / 8)) uint8
        assert codes.dtype == np.uint8 and codes.shape[1] == -(-DIMS * bits // 8)
        scales = np.asarray(group["states/scales"][...]).astype(np.float32)  # (T,) float16 on disk
        mean, weights = np.asarray(group["states/mean"][...]), np.asarray(group["states/weights"][...])
        for name in ("mean", "cutoffs", "weights"):
            np.testing.assert_array_equal(group[f"states/{name}"][...], codebook[name][...])
        buckets = np.unpackbits(codes, axis=1).reshape(len(codes), -1, bits)  # (T, 8 * width / bits, bits)
        buckets = (buckets * (1 << np.arange(bits - 1, -1, -1))).sum(axis=2)[:, :DIMS]  # (T, d)
        decoded = mean + scales[:, None] * weights[buckets, np.arange(DIMS)]  # (T, d)
        offsets = np.asarray(group["tokens/offsets"][...])
        ids = [r.id for r in records if r.id.startswith(f"p{shard}-")]
        for row, passage_id in enumerate(ids):
            np.testing.assert_allclose(decoded[offsets[row] : offsets[row + 1]], stored[passage_id], rtol=1e-6)


def test_verify_catches_a_damaged_codebook_in_a_shard_or_the_store(lowbit_store) -> None:
    _, root, _ = lowbit_store
    assert verify_store(root).ok
    for path in (root / shard_path(1) / "states" / "cutoffs" / "c" / "0" / "0", root / CODEBOOK_DIR / "weights" / "c" / "0" / "0"):
        original = path.read_bytes()
        path.write_bytes(bytes([original[0] ^ 0x40]) + original[1:])
        report = verify_store(root)
        path.write_bytes(original)
        relative = path.relative_to(root).as_posix()
        assert not report.ok and any(relative in problem for problem in report.problems), report.problems


def test_a_codebook_for_another_shape_or_encoding_is_refused(tmp_path: Path) -> None:
    codebook = train_codebook("2bit", np.ones((5, DIMS), dtype=np.float32))
    with pytest.raises(StoreFormatError, match=r"has shape \(11,\); states \(10,\) need \(10,\)"):
        write_shard(tmp_path, 0, _records(0), kind="dilbert", encoding="2bit", codebook=train_codebook(
            "2bit", np.ones((5, DIMS + 1), dtype=np.float32)))
    with pytest.raises(StoreFormatError, match="holds arrays"):
        write_shard(tmp_path, 0, _records(0), kind="dilbert", encoding="1bit", codebook={"mean": codebook["mean"]})
    write_codebook(tmp_path / "book", "2bit", codebook, (DIMS,))
    with pytest.raises(StoreFormatError, match="not '1bit'"):
        read_codebook(tmp_path / "book", "1bit")


@pytest.mark.parametrize(("encoding", "bound"), [("2bit", 0.16), ("1bit", 0.40)])
def test_gaussian_error_is_near_the_optimal_quantizers(encoding: str, bound: float) -> None:
    """Optimal 4-/2-level Gaussian quantizers leave 0.118 / 0.363 of the variance; quantile buckets are close."""
    rng = np.random.default_rng(7)
    states = (rng.standard_normal((4000, 64)) * rng.gamma(2, size=64) + rng.standard_normal(64) * 10).astype(np.float32)
    spec = get_encoding(encoding)
    decoded = spec.decode(spec.encode(states, train_codebook(encoding, states[:2000])))
    residual = states - states.mean(axis=0)
    assert np.square(decoded - states).sum() / np.square(residual).sum() < bound
