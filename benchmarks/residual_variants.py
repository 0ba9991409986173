"""Comparison codecs for bench_codes: ColBERTv2-style centroid residual codes, and least-squares token scales.

Both reuse the store's residual machinery (storage.encodings: codebook
training, quantile buckets, bit packing, table decoding) and change one thing
each, so a row measures that one thing:

- centroids (ColBERTv2): faiss k-means centroids trained on the codebook's
  token sample; each token stores its nearest centroid's id (uint16, 2 bytes)
  and its residual against that centroid in the 1- or 2-bit residual code,
  whose codebook is trained on the sample's residuals after centroid
  subtraction. Decoding adds the centroid back.
- least-squares scale: the token scale s = <r, w> / <w, w> (r the token's
  residual after the per-dimension mean, w its decoded buckets at scale 1)
  instead of the residual's RMS: the scale that minimises the token's squared
  error for the buckets chosen. The arrays and the decoder stay those of the
  store's 1bit/2bit encodings; only the encoder's scale changes.

Nothing here is a store format: bench_codes puts the decoded states in place of
the store's, as it does for faiss PQ. The residual codebooks here have no
centroids of the store's own (storage.encodings.train_residual_codebook), so
`1bit`/`2bit` rows here are the store's codes from before centroids, and the
`c…` rows use faiss k-means and uint16 ids where the store now uses its own
k-means (scipy's kmeans2, as many rounds as here) with 256 centroids and uint8 ids.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from dilstore.storage.encodings import Encoding, get_encoding, train_residual_codebook
from dilstore.storage.residual_codes import CODEBOOK_SEED, KMEANS_ITERATIONS

_FLOAT16_MAX = float(np.finfo(np.float16).max)
_SCALE_BYTES = 2  # float16 per-token scale
_ID_BYTES = 2  # uint16 centroid id


@dataclass(frozen=True)
class Variant:
    """One comparison row: `centroids` k-means centroids (0: none), `bits` per dimension, least-squares or RMS scale."""

    centroids: int
    bits: int
    least_squares: bool

    @property
    def name(self) -> str:
        """E.g. `c1024-1bit`, `1bit-ls`, `c4096-2bit-ls`."""
        prefix = f"c{self.centroids}-" if self.centroids else ""
        return f"{prefix}{self.bits}bit" + ("-ls" if self.least_squares else "")

    @property
    def encoding(self) -> Encoding:
        """The store encoding whose residual code this variant uses (`1bit` or `2bit`)."""
        return get_encoding(f"{self.bits}bit")


@dataclass(frozen=True)
class Codec:
    """A trained variant: centroids `(C, d)` float32 (C = 0 without) and the residual codebook plus its decode table."""

    variant: Variant
    centroids: np.ndarray
    codebook: dict[str, np.ndarray]

    def bytes_per_token(self, dims: int) -> int:
        """Bytes each token stores: packed codes, the float16 scale, and a uint16 centroid id if there are centroids."""
        (width,) = self.variant.encoding.array("codes").shape((dims,))
        return width + _SCALE_BYTES + (_ID_BYTES if self.variant.centroids else 0)

    def table_bytes(self) -> int:
        """Bytes stored once per store: centroids (float32) and the residual codebook (mean, cutoffs, weights)."""
        return self.centroids.nbytes + sum(self.codebook[name].nbytes for name in ("mean", "cutoffs", "weights"))


def train_centroids(sample: np.ndarray, count: int, seed: int = CODEBOOK_SEED) -> np.ndarray:
    """Seeded faiss k-means on a token sample `(N, d)` -> centroids `(count, d)` float32."""
    import faiss

    if not 0 < count <= np.iinfo(np.uint16).max + 1:
        raise ValueError(f"centroid count {count} does not fit a uint16 id")
    sample = np.ascontiguousarray(sample, dtype=np.float32)
    kmeans = faiss.Kmeans(sample.shape[1], count, niter=KMEANS_ITERATIONS, seed=seed, verbose=False)
    kmeans.train(sample)
    return np.asarray(kmeans.centroids, dtype=np.float32)  # (C, d)


def nearest_centroids(states: np.ndarray, centroids: np.ndarray) -> np.ndarray:
    """The id of each state's nearest centroid (L2): `(T, d)`, `(C, d)` -> `(T,)` uint16."""
    import faiss

    index = faiss.IndexFlatL2(centroids.shape[1])
    index.add(np.ascontiguousarray(centroids, dtype=np.float32))
    _, ids = index.search(np.ascontiguousarray(states, dtype=np.float32), 1)  # (T, 1) int64
    return ids[:, 0].astype(np.uint16)


def train(sample: np.ndarray, variant: Variant, seed: int = CODEBOOK_SEED) -> Codec:
    """The variant's centroids (seeded k-means, if it has any) and residual codebook, trained on a sample `(N, d)`."""
    sample = np.asarray(sample, dtype=np.float32)
    centroids = (train_centroids(sample, variant.centroids, seed) if variant.centroids
                 else np.zeros((0, sample.shape[1]), dtype=np.float32))  # (C, d)
    return with_centroids(sample, centroids, variant)


def with_centroids(sample: np.ndarray, centroids: np.ndarray, variant: Variant) -> Codec:
    """A codec over given centroids `(C, d)` (C = 0: none), its residual codebook trained on the sample's residuals."""
    if len(centroids) != variant.centroids:
        raise ValueError(f"variant {variant.name} needs {variant.centroids} centroids, got {len(centroids)}")
    sample = np.asarray(sample, dtype=np.float32)  # (N, d)
    residuals = sample - centroids[nearest_centroids(sample, centroids)] if len(centroids) else sample  # (N, d)
    encoding = variant.encoding
    codebook = encoding.prepare(train_residual_codebook(encoding.name, residuals))  # mean, cutoffs, weights, table
    return Codec(variant, centroids, codebook)


def least_squares_scales(residuals: np.ndarray, unit: np.ndarray) -> np.ndarray:
    """Per-token s = <r, w> / <w, w> as float16: `(T, d)`, `(T, d)` -> `(T,)` float16.

    Clipped to [0, float16 max] (0 where w = 0), the range the store accepts for scales.
    """
    numerator = np.einsum("td,td->t", residuals, unit, dtype=np.float64)  # (T,)
    denominator = np.einsum("td,td->t", unit, unit, dtype=np.float64)  # (T,)
    scales = numerator / np.where(denominator > 0, denominator, 1)  # (T,)
    return np.clip(scales, 0, _FLOAT16_MAX).astype(np.float16)


def encode(states: np.ndarray, codec: Codec) -> dict[str, np.ndarray]:
    """States `(T, d)` -> per-token arrays: `codes (T, width)` uint8, `scales (T,)` float16, `ids (T,)` uint16.

    `ids` only when the codec has centroids; the residual code is then of each state minus its nearest centroid.
    """
    states = np.asarray(states, dtype=np.float32)
    arrays: dict[str, np.ndarray] = {}
    if codec.variant.centroids:
        arrays["ids"] = nearest_centroids(states, codec.centroids)  # (T,)
        states = states - codec.centroids[arrays["ids"]]  # (T, d)
    encoding = codec.variant.encoding
    encoded = encoding.encode(states, codec.codebook)
    arrays.update(codes=encoded["codes"], scales=encoded["scales"])  # (T, width), (T,)
    if codec.variant.least_squares:
        mean = codec.codebook["mean"]  # (d,)
        ones = np.ones(len(states), dtype=np.float16)  # (T,)
        unit = encoding.decode({**codec.codebook, "codes": encoded["codes"], "scales": ones}) - mean  # (T, d)
        arrays["scales"] = least_squares_scales(states - mean, unit)
    return arrays


def decode(arrays: Mapping[str, np.ndarray], codec: Codec) -> np.ndarray:
    """Per-token arrays from `encode` -> states `(T, d)` float32: the store's residual decoding plus the centroid."""
    states = codec.variant.encoding.decode(
        {**codec.codebook, "codes": arrays["codes"], "scales": arrays["scales"]})  # (T, d)
    if codec.variant.centroids:
        states += codec.centroids[arrays["ids"]]
    return states
