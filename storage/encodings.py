"""On-disk encodings of per-token states: a small registry of named, frozen codecs.

An encoding names the arrays it stores in a shard's `states/` group and how to
turn float32 states into them and back. Arrays are either per token (leading
axis T, ragged through the shard's token offsets) or per shard (encoding
parameters such as scales or, later, codebooks). A released name never changes
meaning: lower-bit, product or residual codes are added under new names, and
old stores keep reading.

- fp32: `values (T, *S) float32`, exact.
- fp16: `values (T, *S) float16`.
- int8: symmetric int8 with one scale per token vector, on values first divided
  by a per-shard power-of-two channel scale (the channel's RMS, of values clipped
  at its 99.9th percentile of |x|, rounded to a power of two). BERT-like states
  have a few outlier dimensions that would otherwise set every token's scale; the
  channel scale evens them out (all-MiniLM-L6-v2 states of SQuAD paragraphs,
  layers 1-5: 1.28-1.68% relative error with plain per-token int8, 0.87-0.96%
  with channel scales; tests/storage/test_store_int8_minilm.py).
  Powers of two keep the channel step exact. Arrays: `codes (T, *S) int8`,
  `scales (T, *S[:-1]) float32` and `channel_scales (*S) float32`.
- 2bit / 1bit: residual codes against a codebook trained on a sample of the
  corpus's own states (storage.residual_codes holds the scheme: centroids,
  per-dimension quantile buckets or rotated codes, and the packing).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass

import numpy as np

from dilstore.storage.format import StoreFormatError
from dilstore.storage.residual_codes import (
    BLOCK_ROWS,
    CENTROIDS,
    FLOAT16_MAX,
    RESIDUAL_CODEBOOK,
    decode_residual,
    encode_residual,
    prepare_residual,
    train_centroid_residual,
    train_residual,
)
from dilstore.storage.rotated_codes import MAX_BITS, allocation_problem, packed_width

_INT8_LEVELS = 127
_MIN_EXPONENT, _MAX_EXPONENT = -126, 127

Shape = tuple[int, ...]
# A shard's stored array by name (e.g. "scales"), read block by block along its leading axis.
ArrayBlocks = Callable[[str], Iterable[np.ndarray]]


@dataclass(frozen=True)
class EncodedArray:
    """One array an encoding stores.

    per_token: leading axis is the token axis (T); otherwise the array holds
    shard-wide parameters. shape: per-token trailing shape (per_token) or the
    whole shape (per shard), from the kind's per-token state shape.
    check: a problem found in a block of stored values, or None.
    requires: the codebook array without which this array is not stored
    (None: always stored), so stores written before it was added keep reading.
    replaced_by: the codebook array whose presence means this array is not
    stored (None: never replaced).
    """

    name: str
    dtype: str
    per_token: bool
    shape: Callable[[Shape], Shape]
    check: Callable[[np.ndarray], str | None]
    requires: str | None = None
    replaced_by: str | None = None


@dataclass(frozen=True)
class Encoding:
    """A named on-disk encoding of per-token states.

    encode: float32 `(T, *S)` and the codebook (None without one) -> its
    arrays by name. decode: one passage's per-token arrays (sliced to its n
    tokens) plus the shard arrays -> states `(n, *S)` (STORE_FORMAT.md §4 gives each one's dtype).
    zero_copy: decode returns the stored array itself, so memory-mapped reads
    stay views. train: a sample of states `(N, *S)` -> the codebook (the
    per-shard arrays named in `codebook`), for encodings that need one (the
    flag: whether to train rotated codes, where the encoding has them); the
    same codebook is given to every shard of a store, which keeps it once in its
    `codebook/` group. prepare: the per-shard arrays -> the same plus derived
    lookup tables that make decode faster, for a reader to build once per shard
    (None: decode takes the stored arrays as they are). shard_problems: a
    shard's arrays (each already found valid by its own `check`) -> problems
    between them that no one array shows, as (array name, problem) pairs (None:
    no such check). max_abs: the largest magnitude of a state it can store
    (None: every finite float32), which the writer checks token by token.
    """

    name: str
    description: str
    arrays: tuple[EncodedArray, ...]
    encode: Callable[[np.ndarray, Mapping[str, np.ndarray] | None], dict[str, np.ndarray]]
    decode: Callable[[Mapping[str, np.ndarray]], np.ndarray]
    zero_copy: bool
    train: Callable[[np.ndarray, bool], dict[str, np.ndarray]] | None = None
    codebook: tuple[str, ...] = ()
    prepare: Callable[[Mapping[str, np.ndarray]], dict[str, np.ndarray]] | None = None
    shard_problems: Callable[[ArrayBlocks], list[tuple[str, str]]] | None = None
    max_abs: float | None = None  # the largest |value| it stores (fp16: 65504); None: any finite float32

    def array(self, name: str) -> EncodedArray:
        """The spec of array `name` of this encoding."""
        return next(spec for spec in self.arrays if spec.name == name)

    def layout(self, codebook: Collection[str]) -> tuple[EncodedArray, ...]:
        """The arrays stored with a codebook holding the arrays named in `codebook`.

        An array that `requires` a codebook array is left out where that array
        is absent: a 2bit/1bit codebook without `centroids` (written before
        centroids were added) has no `centroid_ids` either. An array
        `replaced_by` a codebook array is left out where that one is present
        (a rotated 2bit/1bit codebook has no `cutoffs`).
        """
        present = set(codebook)
        return tuple(spec for spec in self.arrays if (spec.requires is None or spec.requires in present)
                     and (spec.replaced_by is None or spec.replaced_by not in present))

    def optional_codebook(self) -> tuple[str, ...]:
        """The codebook arrays that some codebooks lack (an array `requires` one or is `replaced_by` one): what a
        reader looks for to choose the layout, in the store's codebook or in a shard's own."""
        names = (name for spec in self.arrays for name in (spec.requires, spec.replaced_by) if name is not None)
        return tuple(dict.fromkeys(names))

    def absent_reason(self, spec: EncodedArray) -> str:
        """Why `spec` is not stored with some codebook: the codebook array it needs, or the one that replaces it."""
        if spec.replaced_by is not None:
            return f"its codebook has {spec.replaced_by!r}"
        return f"its codebook has no {spec.requires!r}"

    def codebook_layout(self, codebook: Collection[str]) -> tuple[str, ...]:
        """The names of the codebook arrays a codebook holding `codebook` must hold (see `layout`)."""
        stored = {spec.name for spec in self.layout(codebook)}
        return tuple(name for name in self.codebook if name in stored)


def _same_shape(state_shape: Shape) -> Shape:
    return state_shape


def _finite(values: np.ndarray) -> str | None:
    return None if np.isfinite(values).all() else "holds NaN or infinite values"


def _int8_codes_in_range(codes: np.ndarray) -> str | None:
    return None if (codes >= -_INT8_LEVELS).all() else f"holds codes below -{_INT8_LEVELS}"


def _non_negative_finite(values: np.ndarray) -> str | None:
    return None if (np.isfinite(values) & (values >= 0)).all() else "holds negative, NaN or infinite scales"


def _positive_finite(values: np.ndarray) -> str | None:
    return None if (np.isfinite(values) & (values > 0)).all() else "holds zero, negative, NaN or infinite scales"


def _finite_sorted(values: np.ndarray) -> str | None:
    if not np.isfinite(values).all():
        return "holds NaN or infinite values"
    return None if (np.diff(values, axis=0) >= 0).all() else "holds bucket cutoffs out of order"


# How far a codebook's `rotation` may be from orthonormal rows, |R Rᵀ − I| per entry: trained axes (eigenvectors
# computed in float64, stored as float32) were within 2e-8 at d = 384 (codes51's stores), and a damaged one (rows
# zeroed, scaled or repeated) is off by order 1.
ROTATION_TOLERANCE = 1e-3


def _orthonormal_rows(rotation: np.ndarray) -> str | None:
    """Of `rotation` `(rows, *S)` (all d rows, or a block of them): a problem unless each vector position's rows
    are finite unit vectors orthogonal to each other (row j is component j's axis)."""
    if not np.isfinite(rotation).all():
        return "holds NaN or infinite values"
    dims = rotation.shape[-1]
    axes = np.moveaxis(rotation.reshape(len(rotation), -1, dims), 1, 0).astype(np.float64)  # (G, rows, d)
    gram = axes @ axes.transpose(0, 2, 1)  # (G, rows, rows)
    off = float(np.abs(gram - np.eye(len(rotation))).max(initial=0.0))
    if off > ROTATION_TOLERANCE:
        return (f"does not hold orthonormal rows (unit axes at right angles): |R Rᵀ − I| reaches {off:.3g}, over "
                f"{ROTATION_TOLERANCE:g}")
    return None


def _encode_fp32(states: np.ndarray, codebook: Mapping[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
    return {"values": np.ascontiguousarray(states, dtype=np.float32)}


def beyond_range(encoding: Encoding, peak: float) -> str:
    """Why states reaching |x| = `peak` (over `encoding.max_abs`) cannot be stored as `encoding`, and what can."""
    return (f"reach {peak:.4g}, beyond {encoding.arrays[0].dtype}'s range ({encoding.max_abs:g}); use fp32 or int8, "
            "which hold them (2bit and 1bit too, within their error)")


def _encode_fp16(states: np.ndarray, codebook: Mapping[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
    if states.size and float(np.abs(states).max()) > FLOAT16_MAX:
        raise StoreFormatError(f"states {beyond_range(ENCODINGS['fp16'], float(np.abs(states).max()))}")
    return {"values": np.ascontiguousarray(states, dtype=np.float16)}


def _decode_values(arrays: Mapping[str, np.ndarray]) -> np.ndarray:
    return arrays["values"]


# The channel statistic is the RMS of the channel's values clipped at the |x| below which this share of the
# shard's tokens lie: a plain RMS let one outlier token set it for the whole shard, and zero that channel in every
# other token (codes51 F9). In shards of at most 1,000 tokens the clip is the largest |x|: the plain RMS.
CHANNEL_QUANTILE = 0.999
# The clipped RMS leaves the outlier token beyond the clip; a channel scale is at least 2**-64 times its channel's
# largest |x| (as a power of two), so no value normalizes past 2**64 and its token's scale stays finite: a channel of
# 1e-30 values with one 1e10 got an inf scale and was refused, where the plain RMS stored it (review51 R3). Real
# states have a largest |x| within ~1e3 of the clipped RMS, so this changes no channel scale of theirs.
_CHANNEL_PEAK_EXPONENT = 64
_CHANNEL_COLUMNS = 64  # channels sorted at a time: a (T, 64) float32 copy


def channel_clips(states: np.ndarray) -> np.ndarray:
    """Per channel, the 99.9th percentile of |x| over the tokens: the order statistic of rank ceil(0.999 T)
    (1-based; the largest |x| where T <= 1000), so that fewer than one token in 1,000 lies above it.

    states: `(T, *S)` float32 -> `(*S)` float32 (0 for T = 0). Exact: a selection, no arithmetic.
    """
    flat = states.reshape(len(states), math.prod(states.shape[1:]))  # (T, F)
    clips = np.zeros(flat.shape[1], dtype=np.float32)  # (F,)
    if len(flat):
        rank = math.ceil(CHANNEL_QUANTILE * len(flat)) - 1
        for start in range(0, flat.shape[1], _CHANNEL_COLUMNS):
            block = np.abs(flat[:, start : start + _CHANNEL_COLUMNS])  # (T, columns)
            clips[start : start + block.shape[1]] = np.partition(block, rank, axis=0)[rank]
    return clips.reshape(states.shape[1:])


def channel_scales(states: np.ndarray) -> np.ndarray:
    """Per-channel RMS over all tokens of the values clipped to ±`channel_clips` (the 99.9th percentile of |x|;
    stores written before codes51 F9 used the plain RMS, which the same formula decodes), rounded to the nearest
    power of two (1 where it is 0), and raised where needed to the power of two at or above 2**-64 times the
    channel's largest |x| (_CHANNEL_PEAK_EXPONENT: the outlier's per-token scale stays finite).

    Powers of two are kept within float32's normal range (2**-126 .. 2**127).

    states: `(T, *S)` float32 -> `(*S)` float32. Sums run in float64, row block by
    row block in a fixed order, and the rounding uses the exact binary exponent,
    so a retried writer gets the same bits.
    """
    clips = channel_clips(states).astype(np.float64)  # (*S)
    squares = np.zeros(states.shape[1:], dtype=np.float64)  # (*S)
    peaks = np.zeros(states.shape[1:], dtype=np.float64)  # (*S): the largest |x|
    buffer = np.empty((min(len(states), BLOCK_ROWS), *states.shape[1:]), dtype=np.float64)  # (rows, *S)
    for start in range(0, len(states), BLOCK_ROWS):
        block = states[start : start + BLOCK_ROWS]  # (rows, *S)
        magnitudes = np.abs(block, out=buffer[: len(block)], dtype=np.float64)  # (rows, *S)
        np.maximum(peaks, magnitudes.max(axis=0), out=peaks)
        clipped = np.minimum(magnitudes, clips, out=magnitudes)
        squares += np.square(clipped, out=clipped).sum(axis=0)
    rms = np.sqrt(squares / max(len(states), 1))  # (*S)
    mantissa, exponent = np.frexp(rms)  # rms = mantissa * 2**exponent, mantissa in [0.5, 1)
    exponent = np.where(mantissa >= np.sqrt(0.5), exponent, exponent - 1)
    _, floor = np.frexp(peaks)  # peaks < 2**floor: the scale 2**(floor - 64) leaves |x / C| below 2**64
    exponent = np.where(peaks > 0, np.maximum(exponent, floor - _CHANNEL_PEAK_EXPONENT), exponent)
    exponent = np.clip(exponent, _MIN_EXPONENT, _MAX_EXPONENT)  # stay a normal float32
    return np.where(rms > 0, np.ldexp(1.0, exponent), 1.0).astype(np.float32)


def _encode_int8(states: np.ndarray, codebook: Mapping[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
    channel = channel_scales(states)  # (*S)
    inverse_channel = np.float32(1) / channel  # (*S), exact: powers of two
    codes = np.empty(states.shape, dtype=np.int8)  # (T, *S)
    scales = np.empty(states.shape[:-1], dtype=np.float32)  # (T, *S[:-1])
    for start in range(0, len(states), BLOCK_ROWS):
        rows = slice(start, start + BLOCK_ROWS)
        normalized = np.multiply(states[rows], inverse_channel, dtype=np.float32)  # (rows, *S)
        absmax = np.maximum(normalized.max(axis=-1), -normalized.min(axis=-1))  # (rows, *S[:-1])
        step = absmax / np.float32(_INT8_LEVELS)  # (rows, *S[:-1])
        scales[rows] = step
        np.divide(normalized, np.where(step > 0, step, np.float32(1))[..., None], out=normalized)
        np.rint(normalized, out=normalized)
        codes[rows] = np.clip(normalized, -_INT8_LEVELS, _INT8_LEVELS, out=normalized)
    return {"codes": codes, "scales": scales, "channel_scales": channel}


def _decode_int8(arrays: Mapping[str, np.ndarray]) -> np.ndarray:
    step = arrays["scales"][..., None] * arrays["channel_scales"]  # (n, *S)
    return np.multiply(arrays["codes"], step, dtype=np.float32)


def _int8_shard_problems(blocks: ArrayBlocks) -> list[tuple[str, str]]:
    """Per-token scales whose product with the channel scales overflows float32 when decoded (`ask` then found no
    finite score in a store that verified), and a shard whose per-token scales are all zero, which decodes every
    state to zeros (no transformer layer gives that): each passed the checks of one array (hostile47 F9)."""
    largest, tokens = 0.0, 0
    for block in blocks("scales"):
        largest = max(largest, float(block.max(initial=0)))
        tokens += len(block)
    channel = max((float(block.max(initial=0)) for block in blocks("channel_scales")), default=0.0)
    problems = []
    if largest * channel * _INT8_LEVELS > float(np.finfo(np.float32).max):
        problems.append(("scales", f"holds a scale ({largest:.3g}) that overflows float32 when decoded: times the "
                                   f"largest channel_scales ({channel:.3g}) and code {_INT8_LEVELS}"))
    if tokens and largest == 0:
        problems.append(("scales", "are all zero, so every state of the shard decodes to zeros"))
    return problems


def _residual_encoding(bits: int) -> Encoding:
    levels = 2**bits
    return Encoding(
        name=f"{bits}bit",
        description=f"{bits}-bit residual codes: nearest of {CENTROIDS} centroids, per-dimension mean, float16 token "
        f"scale, {levels} quantile buckets per dimension from a codebook trained on the corpus",
        arrays=(
            EncodedArray("codes", "uint8", True, lambda shape: (*shape[:-1], packed_width(shape[-1], bits)),
                         lambda codes: None),
            EncodedArray("scales", "float16", True, lambda shape: shape[:-1], _non_negative_finite),
            EncodedArray("mean", "float32", False, _same_shape, _finite),
            EncodedArray("cutoffs", "float32", False, lambda shape: (levels - 1, *shape), _finite_sorted,
                         replaced_by="rotation"),
            EncodedArray("weights", "float32", False, lambda shape: (levels, *shape), _finite, replaced_by="rotation"),
            EncodedArray("centroid_ids", "uint8", True, lambda shape: shape[:-1], lambda ids: None,
                         requires="centroids"),
            EncodedArray("centroids", "float32", False, lambda shape: (CENTROIDS, *shape), _finite,
                         requires="centroids"),
            EncodedArray("rotation", "float32", False, lambda shape: (shape[-1], *shape), _orthonormal_rows,
                         requires="rotation"),
            EncodedArray("allocation", "float32", False, _same_shape, lambda values: allocation_problem(values, bits),
                         requires="rotation"),
            EncodedArray("component_cutoffs", "float32", False, lambda shape: (2**MAX_BITS - 1, *shape),
                         _finite_sorted, requires="rotation"),
            EncodedArray("component_weights", "float32", False, lambda shape: (2**MAX_BITS, *shape), _finite,
                         requires="rotation"),
        ),
        encode=lambda states, codebook=None: encode_residual(states, codebook, bits),
        decode=lambda arrays: decode_residual(arrays, bits),
        zero_copy=False,
        train=lambda sample, rotate: train_centroid_residual(sample, bits, rotate),
        prepare=lambda arrays: prepare_residual(arrays, bits),
        codebook=RESIDUAL_CODEBOOK,
    )


def _float_encoding(
    name: str,
    dtype: str,
    description: str,
    encode: Callable[[np.ndarray, Mapping[str, np.ndarray] | None], dict[str, np.ndarray]],
    max_abs: float | None = None,
) -> Encoding:
    """fp32 or fp16: the states themselves as one `dtype` array, returned as stored (zero-copy from a memory map)."""
    return Encoding(
        name=name,
        description=description,
        arrays=(EncodedArray("values", dtype, True, _same_shape, _finite),),
        encode=encode,
        decode=_decode_values,
        zero_copy=True,
        max_abs=max_abs,
    )


ENCODINGS: dict[str, Encoding] = {
    encoding.name: encoding
    for encoding in (
        _float_encoding("fp32", "float32", "float32 values, exact", _encode_fp32),
        _float_encoding("fp16", "float16", "float16 values", _encode_fp16, max_abs=FLOAT16_MAX),
        Encoding(
            name="int8",
            description="symmetric int8, one scale per token vector, power-of-two channel scales per shard",
            arrays=(
                EncodedArray("codes", "int8", True, _same_shape, _int8_codes_in_range),
                EncodedArray("scales", "float32", True, lambda shape: shape[:-1], _non_negative_finite),
                EncodedArray("channel_scales", "float32", False, _same_shape, _positive_finite),
            ),
            encode=_encode_int8,
            decode=_decode_int8,
            zero_copy=False,
            shard_problems=_int8_shard_problems,
        ),
        _residual_encoding(2),
        _residual_encoding(1),
    )
}


def train_codebook(encoding: str, sample: np.ndarray, *, rotate: bool = True) -> dict[str, np.ndarray]:
    """The codebook of `encoding` trained on a sample of states `(N, *S)`; {} for encodings without one.

    rotate: 2bit/1bit codes on the sample's principal axes with bits by
    variance (storage.rotated_codes), or per-dimension buckets without.
    """
    spec = get_encoding(encoding)
    return {} if spec.train is None else spec.train(np.asarray(sample, dtype=np.float32), rotate)


def train_residual_codebook(encoding: str, sample: np.ndarray) -> dict[str, np.ndarray]:
    """A 2bit/1bit codebook without centroids trained on `(N, *S)`: the scheme of stores written before centroids.

    Such stores keep encoding with their own codebook (appends); this trains
    one afresh, for comparisons (benchmarks/residual_variants.py) and tests.
    """
    spec = get_encoding(encoding)
    if "centroids" not in spec.codebook:
        raise StoreFormatError(f"{spec.name} has no residual codebook; only 2bit and 1bit do")
    (bits,) = spec.array("codes").shape((8,))  # 8 values pack into `bits` bytes
    return train_residual(np.asarray(sample, dtype=np.float32), bits)


def round_trip(encoding: str, codebook: Mapping[str, np.ndarray] | None = None) -> Callable[[np.ndarray], np.ndarray]:
    """What a store of `encoding` with `codebook` gives back for float32 states `(T, *S)`: encode, then decode.

    The codebook's lookup tables are prepared once, as a reader prepares them
    once per store. Encodings with a codebook need one here: encoding without
    would train a new codebook on every call's states.
    """
    spec = get_encoding(encoding)
    if spec.codebook and codebook is None:
        raise StoreFormatError(f"a {spec.name} round trip needs the codebook the store would encode with")
    prepared = {} if codebook is None else dict(codebook if spec.prepare is None else spec.prepare(codebook))

    def encode_and_decode(states: np.ndarray) -> np.ndarray:
        encoded = spec.encode(np.asarray(states, dtype=np.float32), codebook)
        return np.asarray(spec.decode({**encoded, **prepared}), dtype=np.float32)  # (T, *S)

    return encode_and_decode


def check_codebook(encoding: Encoding, codebook: Mapping[str, np.ndarray], state_shape: Shape) -> None:
    """Raise StoreFormatError unless `codebook` has the encoding's codebook arrays, shaped for `state_shape`, valid.

    Optional arrays (`EncodedArray.requires`, e.g. 2bit/1bit `centroids`) may be absent; no others may.
    """
    expected = encoding.codebook_layout(codebook)  # the required arrays, and the optional ones it holds
    if set(codebook) != set(expected):
        optional = sorted(set(encoding.codebook) - set(encoding.codebook_layout(())))
        raise StoreFormatError(f"a {encoding.name} codebook holds arrays {sorted(encoding.codebook_layout(()))}"
                               f"{f' (and optionally {optional})' if optional else ''}, got {sorted(codebook)}")
    for name in expected:
        spec = encoding.array(name)
        values = np.asarray(codebook[name])
        if values.shape != spec.shape(state_shape):
            raise StoreFormatError(
                f"codebook array {name!r} has shape {values.shape}, but states of shape {state_shape} need it to be "
                f"{spec.shape(state_shape)}"
            )
        problem = spec.check(values)
        if problem:
            raise StoreFormatError(f"codebook array {name!r} {problem}")


def get_encoding(name: str) -> Encoding:
    """The encoding called `name`, or a clear error listing the ones this version knows."""
    try:
        return ENCODINGS[name]
    except KeyError:
        raise StoreFormatError(
            f"unknown encoding {name!r}; this dilstore version knows: {', '.join(ENCODINGS)}"
        ) from None


def needs_codebook(encoding: str) -> bool:
    """Whether stores of `encoding` carry a codebook (here, not in pipelines/codebook.py, which imports torch:
    `precompute` checks its --codebook before the model loads, fast59 F3)."""
    return bool(get_encoding(encoding).codebook)
