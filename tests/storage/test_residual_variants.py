"""benchmarks/residual_variants.py, the codecs bench_codes compares with the store's residual codes.

Small random states only: the shapes and bytes the benchmark reports come from
what the codecs really emit, a centroid codec is exact on states that are its
centroids, its k-means finds well-separated clusters, the plain variant is the
store's own encoding with a codebook without centroids (stores from before them),
and the least-squares scale only moves the token scale,
never increasing a token's error.
"""

from __future__ import annotations

import numpy as np
import pytest

from dilstore.storage.encodings import get_encoding, train_residual_codebook
from tests.fixtures.benchmarks import benchmark_module

DIMS = 24


@pytest.fixture(scope="module")
def variants():
    """benchmarks/residual_variants.py as module `residual_variants`."""
    with benchmark_module("residual_variants") as module:
        yield module


def _states(rows: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((rows, DIMS)) * rng.uniform(0.5, 3, DIMS)).astype(np.float32)  # (rows, d)


@pytest.mark.parametrize("centroids", [0, 8])
@pytest.mark.parametrize("bits", [1, 2])
@pytest.mark.parametrize("least_squares", [False, True])
def test_round_trip_shapes_and_bytes_per_token(variants, centroids: int, bits: int, least_squares: bool) -> None:
    sample, states = _states(400), _states(30, seed=1)
    codec = variants.train(sample, variants.Variant(centroids, bits, least_squares))
    arrays = variants.encode(states, codec)
    expected = {"codes": ((30, -(-DIMS * bits // 8)), np.uint8), "scales": ((30,), np.float16)}
    if centroids:
        expected["ids"] = ((30,), np.uint16)
    assert {name: (array.shape, array.dtype) for name, array in arrays.items()} == expected
    assert codec.bytes_per_token(DIMS) == sum(array.nbytes for array in arrays.values()) / len(states)
    assert codec.table_bytes() == 4 * DIMS * (centroids + 1 + (2**bits - 1) + 2**bits)
    decoded = variants.decode(arrays, codec)
    assert decoded.shape == states.shape and decoded.dtype == np.float32
    assert np.square(decoded - states).sum() < 0.6 * np.square(states).sum()  # 1 bit: about 0.36-0.55


@pytest.mark.parametrize("bits", [1, 2])
def test_centroid_codec_is_exact_on_states_that_are_centroids(variants, bits: int) -> None:
    centroids = _states(16, seed=2)  # (C, d)
    chosen = np.random.default_rng(3).integers(0, len(centroids), 200)
    states = centroids[chosen]  # (200, d)
    codec = variants.with_centroids(states, centroids, variants.Variant(len(centroids), bits, False))
    arrays = variants.encode(states, codec)
    np.testing.assert_array_equal(arrays["ids"], chosen)
    np.testing.assert_array_equal(arrays["scales"], 0)
    np.testing.assert_array_equal(variants.decode(arrays, codec), states)


def test_kmeans_finds_separated_clusters(variants) -> None:
    rng = np.random.default_rng(4)
    centres = 100 * np.eye(4, DIMS, dtype=np.float32)  # (4, d), far apart
    labels = np.repeat(np.arange(4), 50)  # (200,)
    sample = centres[labels] + rng.standard_normal((200, DIMS)).astype(np.float32)  # (200, d)
    centroids = variants.train_centroids(sample, 4)
    assert centroids.shape == (4, DIMS) and centroids.dtype == np.float32
    ids = variants.nearest_centroids(sample, centroids)
    assert ids.dtype == np.uint16
    # Each true cluster maps to one centroid of its own, and that centroid sits near its centre.
    mapping = {label: set(ids[labels == label]) for label in range(4)}
    assert all(len(found) == 1 for found in mapping.values())
    assert len(set().union(*mapping.values())) == 4
    for label, (centroid,) in mapping.items():
        assert np.linalg.norm(centroids[centroid] - centres[label]) < 1
    np.testing.assert_array_equal(variants.train_centroids(sample, 4), centroids)  # seeded


@pytest.mark.parametrize("bits", [1, 2])
def test_plain_variant_is_the_store_encoding_without_centroids(variants, bits: int) -> None:
    sample, states = _states(400), _states(30, seed=1)
    codec = variants.train(sample, variants.Variant(0, bits, False))
    encoding = get_encoding(f"{bits}bit")
    stored = encoding.encode(states, train_residual_codebook(f"{bits}bit", sample))
    arrays = variants.encode(states, codec)
    np.testing.assert_array_equal(arrays["codes"], stored["codes"])
    np.testing.assert_array_equal(arrays["scales"], stored["scales"])
    np.testing.assert_array_equal(variants.decode(arrays, codec), encoding.decode(stored))


@pytest.mark.parametrize("bits", [1, 2])
def test_least_squares_scale_changes_only_the_scale_and_lowers_each_tokens_error(variants, bits: int) -> None:
    sample, states = _states(400), _states(200, seed=1)
    rms = variants.train(sample, variants.Variant(0, bits, False))
    fitted = variants.train(sample, variants.Variant(0, bits, True))
    rms_arrays, fitted_arrays = variants.encode(states, rms), variants.encode(states, fitted)
    np.testing.assert_array_equal(fitted_arrays["codes"], rms_arrays["codes"])
    assert not np.array_equal(fitted_arrays["scales"], rms_arrays["scales"])
    rms_error = np.square(variants.decode(rms_arrays, rms) - states).sum(axis=1)  # (T,)
    fitted_error = np.square(variants.decode(fitted_arrays, fitted) - states).sum(axis=1)  # (T,)
    assert (fitted_error <= rms_error * (1 + 1e-3) + 1e-4).all()  # up to float16 rounding of the scale
    assert fitted_error.sum() < rms_error.sum()


def test_least_squares_scales_values(variants) -> None:
    unit = np.array([[1, -1, 2], [0, 0, 0], [1, 1, 1]], dtype=np.float32)  # (3, 3)
    residuals = np.array([[2, -2, 4], [1, 2, 3], [-1, -1, -1]], dtype=np.float32)  # (3, 3)
    scales = variants.least_squares_scales(residuals, unit)
    assert scales.dtype == np.float16
    np.testing.assert_array_equal(scales, [2, 0, 0])  # exact fit; no code -> 0; negative -> clipped to 0


def test_centroid_count_must_match_the_variant(variants) -> None:
    with pytest.raises(ValueError, match="needs 8 centroids, got 4"):
        variants.with_centroids(_states(50), _states(4), variants.Variant(8, 1, False))


@pytest.mark.parametrize("encoding", ["2bit", "1bit"])
@pytest.mark.parametrize("rotate", [True, False], ids=["rotated", "buckets"])
def test_a_decode_of_more_tokens_than_a_block_equals_its_pieces_decoded_apart(encoding: str, rotate: bool) -> None:
    """decode_residual works BLOCK_ROWS tokens at a time (a whole shard's worth at once ran ~3x slower): the
    blocks must join to what each passage's own decode gives, prepared codebook or not. Exactly for bucket codes;
    rotated codes go through a matrix product, and BLAS may round a row's last bit differently with the number of
    rows it is given (this VM's AMD EPYC did, 1 element in 2, by at most 7.2e-7; the one before did not)."""
    from dilstore.storage.encodings import train_codebook
    from dilstore.storage.residual_codes import BLOCK_ROWS

    spec = get_encoding(encoding)
    states = np.random.default_rng(3).standard_normal((2 * BLOCK_ROWS + 77, 2, 16)).astype(np.float32)  # (T, 2, 16)
    codebook = train_codebook(encoding, states[:4000], rotate=rotate)
    arrays = spec.encode(states, codebook)
    per_token = {name: values for name, values in arrays.items() if spec.array(name).per_token}
    shared = {name: values for name, values in arrays.items() if not spec.array(name).per_token}
    prepared = spec.prepare(shared)
    whole = spec.decode({**per_token, **prepared})  # (T, 2, 16)
    cuts = [0, 1, 5000, BLOCK_ROWS, BLOCK_ROWS + 1, len(states)]
    pieces = [spec.decode({**{name: values[a:b] for name, values in per_token.items()}, **prepared})
              for a, b in zip(cuts, cuts[1:], strict=False)]  # fmt: skip
    same = np.array_equal if not rotate else lambda a, b: np.allclose(a, b, rtol=1e-6, atol=1e-6)
    assert same(whole, np.concatenate(pieces))
    assert np.array_equal(whole, spec.decode({**per_token, **shared}))  # unprepared: prepared once, not per block
