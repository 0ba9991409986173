"""The residual codes of the 2bit and 1bit encodings (storage.encodings registers them), and codebook sampling.

2bit / 1bit codes are residuals against a codebook trained on a sample of the
corpus's own states (storage.encodings.train_codebook): subtract a per-dimension mean, divide
by a per-token float16 scale (the residual's RMS), and store each dimension's
bucket among 4 (2) per-dimension quantile buckets; decoding puts back the
bucket's mean. Codes are packed big-endian within a byte (first dimension in
the high bits). Arrays: `codes (T, *S[:-1], ceil(d*bits/8)) uint8`,
`scales (T, *S[:-1]) float16`, and the codebook, per shard: `mean (*S)`,
`cutoffs (2**bits - 1, *S)`, `weights (2**bits, *S)` float32. Quantile
buckets beat uniform levels on BERT-like states, whose dimensions have
different, heavy-tailed spreads; BENCHMARKS.md compares them with faiss
product quantization at the same size.
Codebooks trained now also hold `centroids (256, *S) float32`: seeded k-means
centroids of each token vector position (ColBERTv2-style), one per
TOKENS_PER_CENTROID sample tokens up to 256, the table's other rows repeating them. Each token vector
then stores its nearest centroid's id, `centroid_ids (T, *S[:-1]) uint8`, and
the residual code above is of the state minus that centroid (the mean,
cutoffs and weights are trained on those differences); decoding adds the
centroid back. The scheme is read off the codebook: one without `centroids`
(stores written before) decodes, verifies and appends exactly as before.
256 centroids with uint8 ids: every id a byte can hold is a valid row, and
a token costs one byte more (2bit at d=384: 96 + 2 + 1 = 99 bytes).
Codebooks trained with rotation (the default, `train_codebook(rotate=True)`)
replace `cutoffs` and `weights` by rotated codes (storage.rotated_codes): the
normalized residual is turned onto the sample's principal axes and each
component gets 0-4 bits by its variance, in the same ceil(d*bits/8) bytes;
arrays `rotation`, `allocation`, `component_cutoffs`, `component_weights`.
Decoding then costs a (d x d) product per token vector, which pays where the
online layers run over every stored token (DilBert, Listformer) and not for
EARL's judger (reader.offline.kinds chooses per kind).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping
from typing import Any

import numpy as np

from dilstore.storage.format import StoreFormatError
from dilstore.storage.rotated_codes import (
    ROTATED_CODEBOOK,
    bucket_of,
    decode_rotated,
    encode_rotated,
    packed_width,
    prepare_rotated,
    quantile_quantizer,
    train_rotated,
)

# Rows encoded at a time, so that temporaries stay small for multi-GB shards.
BLOCK_ROWS = 8192
FLOAT16_MAX = float(np.finfo(np.float16).max)
# Tokens of a seeded sample a codebook is trained on when none is given.
CODEBOOK_SAMPLE_TOKENS = 65536
# The documents (precompute's sampling pass) or passage windows (training on decoded states) they are drawn from.
CODEBOOK_SAMPLE_UNITS = 512
CODEBOOK_SEED = 0
# Centroids of the 2bit/1bit codebooks: one uint8 id per token vector addresses all of them.
CENTROIDS = 256
KMEANS_ITERATIONS = 20
# Sample token vectors per distinct centroid a codebook trains: with one centroid per sample token (what a sample of
# at most 256 tokens got before), every residual is 0, the residual codes learn nothing, and unseen states were
# coded with a relative error of 0.93 (codes51 F1); with 32 per centroid, 0.56 (BENCHMARKS.md, STORE_FORMAT §4).
TOKENS_PER_CENTROID = 32
# A codebook trained on fewer token states than this codes unseen states measurably worse than one trained on a full
# sample: 2bit held-out relative error on SQuAD dev states 0.56 at 72 tokens, 0.31 at 256, 0.21 at 1,000, 0.19 at
# 2,000, 0.17 at 20,000 (0.93 at 72 before TOKENS_PER_CENTROID; codes51 F1). A build that trains one says so, and an
# --append or a --codebook run measures it on its own states first (pipelines.codebook.codebook_fit); from 2,000 on,
# within 1.15x of a full sample's, appends skip that measurement. `train qa --store-encoding` warns below it too.
SMALL_SAMPLE_TOKENS = 2000
# A codebook trained on fewer token states than this is not reused by an --append or a --codebook run, without
# measuring it: its 2bit held-out relative error is 0.31 at 256 tokens (1.8x, past FOREIGN_CODEBOOK_SLACK) and 0.24
# at 512 (1.4x) against 0.17 for a full sample (BENCHMARKS.md "codebooks trained on few states"), and a run too small
# to measure it (pipelines.codebook: FIT_MIN_TOKENS per half) would otherwise take it with a warning at best: a
# 72-token store's 12-paragraph append was coded at 0.964 with exit 0 (review51 R1).
MIN_REUSE_TOKENS = 512


def sample_rows(rows: int, limit: int, seed: int = CODEBOOK_SEED) -> np.ndarray:
    """Sorted indices of a seeded sample of at most `limit` of `rows` rows (all rows when there are fewer)."""
    if rows <= limit:
        return np.arange(rows)
    return np.sort(np.random.default_rng(seed).choice(rows, size=limit, replace=False))


def _token_scales(residuals: np.ndarray) -> np.ndarray:
    """Per-token-vector RMS of `(rows, *S)` residuals, rounded to float16: `(rows, *S[:-1])` float16."""
    rms = np.sqrt(np.mean(np.square(residuals, dtype=np.float64), axis=-1))  # (rows, *S[:-1])
    return np.minimum(rms, FLOAT16_MAX).astype(np.float16)


class ScaleBeyondRange(StoreFormatError):
    """Token `row` of the states being encoded has a residual whose RMS float16, the dtype of its scale, cannot
    hold: clipped to 65504, the scale decoded the token about ten times too small (spec61 F2). `problem` is what
    is wrong with that token, for write_shard to name its passage; `scale_beyond_range` builds one."""

    def __init__(self, message: str, row: int, problem: str) -> None:
        super().__init__(message)
        self.row = row
        self.problem = problem

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickled with its row and problem, as every DilstoreError crosses a process boundary whole (api54 F1): a
        Beam or process-pool worker's refusal could not be unpickled, its arguments not those of `__init__`."""
        return type(self), (*self.args, self.row, self.problem), vars(self)


def scale_beyond_range(row: int, rms: float) -> ScaleBeyondRange:
    """The ScaleBeyondRange of token `row`, whose residual has RMS `rms` (write_shard names its passage)."""
    problem = (f"has a residual of RMS {rms:.4g} against the codebook, beyond the range of its float16 scale "
               f"({FLOAT16_MAX:g}); use fp32 or int8, which hold it")  # fmt: skip
    return ScaleBeyondRange(f"token {row} of the states encoded {problem}", row, problem)


def _refuse_clipped_scales(residuals: np.ndarray, mean: np.ndarray, scales: np.ndarray, start: int) -> None:
    """Raise ScaleBeyondRange for the first token of `residuals` `(rows, *S)` (less their centroids; `start`: the
    first one's row) whose RMS `_token_scales` clipped to FLOAT16_MAX. Only tokens whose `scales` `(rows, *S[:-1])`
    reached it are looked at again, so the encoder's pass stays one."""
    reached = np.flatnonzero(scales.reshape(len(scales), -1).max(axis=1, initial=0) >= FLOAT16_MAX)  # (k,)
    if not reached.size:
        return
    values = np.subtract(residuals[reached], mean, dtype=np.float32)  # (k, *S)
    rms = np.sqrt(np.mean(np.square(values, dtype=np.float64), axis=-1)).reshape(len(reached), -1).max(axis=1)  # (k,)
    beyond = np.flatnonzero(rms > FLOAT16_MAX)
    if beyond.size:
        raise scale_beyond_range(start + int(reached[beyond[0]]), float(rms[beyond[0]]))


def _normalized_residuals(states: np.ndarray, mean: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(residuals divided by their token scale `(rows, *S)` float32, the float16 scales `(rows, *S[:-1])`)."""
    residuals = np.subtract(states, mean, dtype=np.float32)  # (rows, *S)
    scales = _token_scales(residuals)  # (rows, *S[:-1])
    divisor = scales.astype(np.float32)
    np.divide(residuals, np.where(divisor > 0, divisor, np.float32(1))[..., None], out=residuals)
    return residuals, scales


def train_residual(states: np.ndarray, bits: int) -> dict[str, np.ndarray]:
    """A residual codebook from a sample `(N, *S)`: per-dimension mean, quantile cutoffs and bucket means.

    The cutoffs and weights are the per-dimension quantile buckets of the
    scale-normalized residuals (rotated_codes.quantile_quantizer: about 1/K of
    the sample in each of K = 2**bits buckets, weighted by their means).
    Deterministic for a given sample. An empty sample (a shard whose passages
    have no tokens) gets an all-zero codebook, which no code ever refers to.
    """
    states = np.asarray(states, dtype=np.float32)
    levels = 2**bits
    if len(states) == 0:
        return {"mean": np.zeros(states.shape[1:], dtype=np.float32),
                "cutoffs": np.zeros((levels - 1, *states.shape[1:]), dtype=np.float32),
                "weights": np.zeros((levels, *states.shape[1:]), dtype=np.float32)}
    mean = states.mean(axis=0, dtype=np.float64).astype(np.float32)  # (*S)
    normalized, _ = _normalized_residuals(states, mean)  # (N, *S)
    cutoffs, weights = quantile_quantizer(normalized, levels)  # (K-1, *S), (K, *S)
    return {"mean": mean, "cutoffs": cutoffs, "weights": weights}


def _nearest_centroids(vectors: np.ndarray, centroids: np.ndarray) -> np.ndarray:
    """The id of each vector's nearest centroid (squared L2, ties to the lower id): `(rows, d)`, `(C, d)` ->
    `(rows,)` intp."""
    norms = np.einsum("cd,cd->c", centroids, centroids)  # (C,)
    ids = np.empty(len(vectors), dtype=np.intp)  # (rows,)
    for start in range(0, len(vectors), BLOCK_ROWS):
        block = vectors[start : start + BLOCK_ROWS]  # (block, d)
        distances = norms - 2 * (block @ centroids.T)  # (block, C): |x - c|^2 less |x|^2, the same for every c
        ids[start : start + len(block)] = distances.argmin(axis=1)
    return ids


def trained_centroids(rows: int) -> int:
    """How many distinct centroids k-means trains on a sample of `rows` token vectors: one per TOKENS_PER_CENTROID
    of them, at least 1 and at most CENTROIDS (the table's other rows repeat them: `_kmeans`)."""
    return min(CENTROIDS, max(1, rows // TOKENS_PER_CENTROID))


def _kmeans(sample: np.ndarray, count: int, seed: int = CODEBOOK_SEED) -> np.ndarray:
    """Seeded k-means (scipy's kmeans2, KMEANS_ITERATIONS rounds, in float64) on `(N, d)` float32 -> `(count, d)`
    float32 centroids.

    It trains k = min(count, trained_centroids(N)) centroids, starting from k
    distinct sample rows chosen with `seed`; a centroid that is nobody's nearest
    keeps its place. With k below `count`, the rows past k repeat the trained
    ones (row i is row i mod k), so the table keeps its shape and a lower id
    always wins the tie; an empty sample gives all-zero centroids, which no
    token refers to. Deterministic for a given sample.
    """
    from scipy.cluster.vq import kmeans2  # only training a codebook needs scipy: reading a store never imports it

    rows, dims = sample.shape
    if rows == 0:
        return np.zeros((count, dims), dtype=np.float32)
    trained = min(count, trained_centroids(rows))
    start = np.sort(np.random.default_rng(seed).choice(rows, size=trained, replace=False))  # (k,)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "One of the clusters is empty": it keeps its place
        # In float64: scipy's kmeans2 on float32 states whose squared distances overflow (|x| near 1e19) crashed
        # the process (a segmentation fault or a double free, codes51 F5); float64 holds them, at the same speed.
        data = sample.astype(np.float64)  # (N, d)
        centroids, _ = kmeans2(data, data[start], iter=KMEANS_ITERATIONS, minit="matrix", missing="warn")
    return np.asarray(centroids, dtype=np.float32)[np.arange(count) % trained]  # (count, d)


def _train_centroids(sample: np.ndarray) -> np.ndarray:
    """CENTROIDS k-means centroids per token vector position: `(N, *S)` -> `(CENTROIDS, *S)` float32."""
    state_shape = sample.shape[1:]
    vectors = sample.reshape(len(sample), math.prod(state_shape[:-1]), state_shape[-1])  # (N, G, d)
    tables = [_kmeans(np.ascontiguousarray(vectors[:, group]), CENTROIDS) for group in range(vectors.shape[1])]
    return np.stack(tables, axis=1).reshape(CENTROIDS, *state_shape)  # (C, *S)


def _assign_centroids(states: np.ndarray, centroids: np.ndarray) -> np.ndarray:
    """Each token vector's nearest centroid of its position: `(rows, *S)`, `(C, *S)` -> `(rows, *S[:-1])` uint8."""
    groups, dims = math.prod(states.shape[1:-1]), states.shape[-1]
    vectors = states.reshape(len(states), groups, dims)  # (rows, G, d)
    tables = centroids.reshape(len(centroids), groups, dims)  # (C, G, d)
    ids = np.empty((len(states), groups), dtype=np.intp)  # (rows, G)
    for group in range(groups):
        ids[:, group] = _nearest_centroids(np.ascontiguousarray(vectors[:, group]), tables[:, group])
    return ids.astype(np.uint8).reshape(states.shape[:-1])


def _gather_centroids(ids: np.ndarray, centroids: np.ndarray) -> np.ndarray:
    """The centroids that ids name: `(rows, *S[:-1])` uint8, `(C, *S)` -> `(rows, *S)` float32."""
    groups, dims = math.prod(centroids.shape[1:-1]), centroids.shape[-1]
    tables = centroids.reshape(len(centroids), groups, dims)  # (C, G, d)
    flat = ids.reshape(len(ids), groups)  # (rows, G)
    return tables[flat, np.arange(groups)].reshape(*ids.shape, dims)  # (rows, *S)


def train_centroid_residual(states: np.ndarray, bits: int, rotate: bool) -> dict[str, np.ndarray]:
    """A codebook with centroids (`_train_centroids`) and the residual codebook of the states less their centroid:
    rotated codes (storage.rotated_codes) with `rotate`, per-dimension quantile buckets without."""
    states = np.asarray(states, dtype=np.float32)  # (N, *S)
    centroids = _train_centroids(states)  # (C, *S)
    residuals = states - _gather_centroids(_assign_centroids(states, centroids), centroids)  # (N, *S)
    if not rotate:
        return {**train_residual(residuals, bits), "centroids": centroids}
    mean = (residuals.mean(axis=0, dtype=np.float64) if len(residuals) else np.zeros(residuals.shape[1:]))
    mean = mean.astype(np.float32)  # (*S)
    normalized, _ = _normalized_residuals(residuals, mean)  # (N, *S)
    return {"mean": mean, "centroids": centroids, **train_rotated(normalized, bits)}


# Codebook arrays of 2bit/1bit; `centroids` only in codebooks trained since centroids were added, the rotated
# arrays (instead of `cutoffs` and `weights`) only in rotated ones.
RESIDUAL_CODEBOOK = ("mean", "cutoffs", "weights", "centroids", *ROTATED_CODEBOOK)


def _unpack_table(bits: int) -> np.ndarray:
    """Byte value -> its 8/bits codes, first code in the high bits: `(256, 8 // bits)` uint8."""
    per_byte = 8 // bits
    shifts = np.arange(per_byte - 1, -1, -1, dtype=np.uint8) * bits  # (per_byte,)
    return ((np.arange(256, dtype=np.uint8)[:, None] >> shifts) & (2**bits - 1)).astype(np.uint8)


_UNPACK = {bits: _unpack_table(bits) for bits in (1, 2)}


def _pack_codes(buckets: np.ndarray, bits: int) -> np.ndarray:
    """Buckets `(rows, *S)` (each below 2**bits) packed big-endian: `(rows, *S[:-1], ceil(d*bits/8))` uint8.

    Each bucket becomes its `bits` bits, highest first, and numpy packs the bit
    rows eight to a byte, first bit in the high bit and the last byte padded with
    zeros: the layout the module docstring describes, without a reduction over
    a short axis.
    """
    shifts = np.arange(bits - 1, -1, -1, dtype=np.uint8)  # (bits,)
    bit_rows = (buckets[..., None] >> shifts) & 1  # (rows, *S, bits)
    return np.packbits(bit_rows.reshape(*buckets.shape[:-1], buckets.shape[-1] * bits), axis=-1)


def encode_residual(
    states: np.ndarray, codebook: Mapping[str, np.ndarray] | None, bits: int
) -> dict[str, np.ndarray]:
    """States `(T, *S)` -> codes, scales and (with a codebook that has centroids) centroid_ids, plus the codebook.

    Without a codebook, a rotated one with centroids is trained on a seeded
    sample; a given codebook without centroids encodes in the scheme from before
    them, one without rotation with per-dimension buckets.
    """
    if codebook is None:
        codebook = train_centroid_residual(states[sample_rows(len(states), CODEBOOK_SAMPLE_TOKENS)], bits, True)
    mean = codebook["mean"]
    rotated = "rotation" in codebook
    centroids = codebook.get("centroids")  # (C, *S) or None
    codes = np.empty((*states.shape[:-1], packed_width(states.shape[-1], bits)), dtype=np.uint8)  # (T, *S[:-1], width)
    scales = np.empty(states.shape[:-1], dtype=np.float16)  # (T, *S[:-1])
    ids = np.empty(states.shape[:-1], dtype=np.uint8)  # (T, *S[:-1])
    for start in range(0, len(states), BLOCK_ROWS):
        rows = slice(start, start + BLOCK_ROWS)
        block = states[rows]  # (rows, *S)
        if centroids is not None:
            ids[rows] = _assign_centroids(block, centroids)
            block = block - _gather_centroids(ids[rows], centroids)  # (rows, *S)
        normalized, scales[rows] = _normalized_residuals(block, mean)  # (rows, *S)
        _refuse_clipped_scales(block, mean, scales[rows], start)
        if rotated:
            codes[rows] = encode_rotated(normalized, codebook, bits)
        else:
            codes[rows] = _pack_codes(bucket_of(normalized, codebook["cutoffs"]), bits)
    per_token = {"codes": codes, "scales": scales, **({} if centroids is None else {"centroid_ids": ids})}
    return {**per_token, **{name: np.asarray(values, dtype=np.float32) for name, values in codebook.items()
                            if name in RESIDUAL_CODEBOOK}}


def _decode_table(arrays: Mapping[str, np.ndarray], bits: int) -> np.ndarray:
    """Byte -> decoded normalized values, per byte position: `(prod(S[:-1]) * width * 256, 8 // bits)` float32.

    Row `(g * width + j) * 256 + v` holds the weights of the 8/bits values that
    byte value v codes at byte j of token vector g (dimensions past d are 0), so
    decoding is one row gather per stored byte instead of one per value.
    """
    weights = arrays["weights"]  # (K, *S)
    levels, state_shape = weights.shape[0], weights.shape[1:]
    dims, per_byte = state_shape[-1], 8 // bits
    width = packed_width(dims, bits)
    groups = math.prod(state_shape[:-1])
    padded = np.zeros((levels, groups, width * per_byte), dtype=np.float32)  # (K, G, width*per_byte)
    padded[..., :dims] = weights.reshape(levels, groups, dims)
    padded = padded.reshape(levels, groups, width, per_byte)  # (K, G, width, per_byte)
    buckets = _UNPACK[bits]  # (256, per_byte): the bucket of each value a byte codes
    table = padded[buckets, :, :, np.arange(per_byte)]  # (256, per_byte, G, width)
    return np.ascontiguousarray(table.transpose(2, 3, 0, 1)).reshape(groups * width * 256, per_byte)


def prepare_residual(arrays: Mapping[str, np.ndarray], bits: int) -> dict[str, np.ndarray]:
    """The per-shard arrays plus lookup tables (_decode_table, or rotated_codes.prepare_rotated for a rotated
    codebook), built once per shard or store by the reader."""
    if "rotation" in arrays:
        return {**arrays, **prepare_rotated(arrays)}
    return {**arrays, "decode_table": _decode_table(arrays, bits)}


def _decode_buckets(arrays: Mapping[str, np.ndarray], bits: int) -> np.ndarray:
    """Codes of per-dimension buckets `(n, *S[:-1], width)` -> normalized residuals `(n, *S)` float32."""
    table = arrays.get("decode_table")
    if table is None:
        table = _decode_table(arrays, bits)
    state_shape = arrays["mean"].shape
    codes = arrays["codes"]  # (n, *S[:-1], width)
    n, width = len(codes), codes.shape[-1]
    groups = math.prod(state_shape[:-1])
    base = (np.arange(groups * width, dtype=np.intp) * 256).reshape(*state_shape[:-1], width)  # (*S[:-1], width)
    values = np.take(table, codes + base, axis=0)  # (n, *S[:-1], width, 8 // bits)
    return values.reshape(n, *state_shape[:-1], width * table.shape[1])[..., : state_shape[-1]]  # (n, *S)


_PER_TOKEN = ("codes", "scales", "centroid_ids")  # the arrays with a row per token; the rest are the codebook's


def decode_residual(arrays: Mapping[str, np.ndarray], bits: int) -> np.ndarray:
    """The states `(n, *S)` float32 of `n` tokens' codes, decoded BLOCK_ROWS tokens at a time into one output.

    A fetch decodes every passage it reads from one shard in one call; a large shard's worth at once made
    temporaries of every token (hundreds of MB), 1.9-3x slower when their memory is fresh, as in a fetch (BENCHMARKS.md,
    "A store after 30 small appends": bench_decode_blocks.py and bench_compact.py).
    """
    if "rotation" in arrays and "rotated_runs" not in arrays:
        arrays = {**arrays, **prepare_rotated(arrays)}  # once, not per block
    rows = len(arrays["codes"])
    if rows <= BLOCK_ROWS:
        return _decode_block(arrays, bits)
    decoded: np.ndarray | None = None
    for start in range(0, rows, BLOCK_ROWS):
        block = {**arrays, **{name: arrays[name][start : start + BLOCK_ROWS] for name in _PER_TOKEN if name in arrays}}
        values = _decode_block(block, bits)  # (block, *S)
        if decoded is None:
            decoded = np.empty((rows, *values.shape[1:]), dtype=values.dtype)  # (n, *S)
        decoded[start : start + len(values)] = values
    assert decoded is not None  # rows > BLOCK_ROWS: the loop ran
    return decoded


def _decode_block(arrays: Mapping[str, np.ndarray], bits: int) -> np.ndarray:
    """The states `(n, *S)` of one block of tokens' codes (decode_residual)."""
    mean = arrays["mean"]  # (*S)
    if "rotation" in arrays:
        prepared = arrays if "rotated_runs" in arrays else prepare_rotated(arrays)
        values = decode_rotated(arrays["codes"], prepared)  # (n, *S)
    else:
        values = _decode_buckets(arrays, bits)  # (n, *S)
    values *= arrays["scales"].astype(np.float32)[..., None]
    values += mean
    if "centroids" in arrays:  # codebooks from before centroids have none
        values += _gather_centroids(arrays["centroid_ids"], arrays["centroids"])
    return values
