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
  by a per-shard power-of-two channel scale (the channel's RMS rounded to a power
  of two). BERT-like states have a few outlier dimensions that would otherwise
  set every token's scale; the channel scale evens them out (all-MiniLM-L6-v2
  states of SQuAD paragraphs, layers 1-5: 1.28-1.68% relative error with plain
  per-token int8, 0.87-0.96% with channel scales; tests/test_store_int8_minilm.py).
  Powers of two keep the channel step exact. Arrays: `codes (T, *S) int8`,
  `scales (T, *S[:-1]) float32` and `channel_scales (*S) float32`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np

from dilstore.storage.format import StoreFormatError

# Rows encoded at a time, so that temporaries stay small for multi-GB shards.
_BLOCK_ROWS = 8192
_FLOAT16_MAX = float(np.finfo(np.float16).max)
_INT8_LEVELS = 127
_MIN_EXPONENT, _MAX_EXPONENT = -126, 127

Shape = tuple[int, ...]


@dataclass(frozen=True)
class EncodedArray:
    """One array an encoding stores.

    per_token: leading axis is the token axis (T); otherwise the array holds
    shard-wide parameters. shape: per-token trailing shape (per_token) or the
    whole shape (per shard), from the kind's per-token state shape.
    check: a problem found in a block of stored values, or None.
    """

    name: str
    dtype: str
    per_token: bool
    shape: Callable[[Shape], Shape]
    check: Callable[[np.ndarray], str | None]


@dataclass(frozen=True)
class Encoding:
    """A named on-disk encoding of per-token states.

    encode: float32 `(T, *S)` -> its arrays by name. decode: one passage's
    per-token arrays (sliced to its n tokens) plus the shard arrays -> states
    `(n, *S)` of `output_dtype`. zero_copy: decode returns the stored array
    itself, so memory-mapped reads stay views.
    """

    name: str
    description: str
    arrays: tuple[EncodedArray, ...]
    encode: Callable[[np.ndarray], dict[str, np.ndarray]]
    decode: Callable[[Mapping[str, np.ndarray]], np.ndarray]
    output_dtype: str
    zero_copy: bool

    def array(self, name: str) -> EncodedArray:
        """The spec of array `name` of this encoding."""
        return next(spec for spec in self.arrays if spec.name == name)


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


def _encode_fp32(states: np.ndarray) -> dict[str, np.ndarray]:
    return {"values": np.ascontiguousarray(states, dtype=np.float32)}


def _encode_fp16(states: np.ndarray) -> dict[str, np.ndarray]:
    if states.size and float(np.abs(states).max()) > _FLOAT16_MAX:
        raise StoreFormatError(
            f"states reach {float(np.abs(states).max()):.4g}, beyond float16's range ({_FLOAT16_MAX:g}); use fp32 or int8"
        )
    return {"values": np.ascontiguousarray(states, dtype=np.float16)}


def _decode_values(arrays: Mapping[str, np.ndarray]) -> np.ndarray:
    return arrays["values"]


def channel_scales(states: np.ndarray) -> np.ndarray:
    """Per-channel RMS over all tokens, rounded to the nearest power of two (1 where the RMS is 0).

    Powers of two are kept within float32's normal range (2**-126 .. 2**127).

    states: `(T, *S)` float32 -> `(*S)` float32. Sums run in float64, row block by
    row block in a fixed order, and the rounding uses the exact binary exponent,
    so a retried writer gets the same bits.
    """
    squares = np.zeros(states.shape[1:], dtype=np.float64)  # (*S)
    buffer = np.empty((min(len(states), _BLOCK_ROWS), *states.shape[1:]), dtype=np.float64)  # (rows, *S)
    for start in range(0, len(states), _BLOCK_ROWS):
        block = states[start : start + _BLOCK_ROWS]  # (rows, *S)
        squared = np.square(block, out=buffer[: len(block)], dtype=np.float64)  # (rows, *S)
        squares += squared.sum(axis=0)
    rms = np.sqrt(squares / max(len(states), 1))  # (*S)
    mantissa, exponent = np.frexp(rms)  # rms = mantissa * 2**exponent, mantissa in [0.5, 1)
    exponent = np.where(mantissa >= np.sqrt(0.5), exponent, exponent - 1)
    exponent = np.clip(exponent, _MIN_EXPONENT, _MAX_EXPONENT)  # stay a normal float32
    return np.where(rms > 0, np.ldexp(1.0, exponent), 1.0).astype(np.float32)


def _encode_int8(states: np.ndarray) -> dict[str, np.ndarray]:
    channel = channel_scales(states)  # (*S)
    inverse_channel = np.float32(1) / channel  # (*S), exact: powers of two
    codes = np.empty(states.shape, dtype=np.int8)  # (T, *S)
    scales = np.empty(states.shape[:-1], dtype=np.float32)  # (T, *S[:-1])
    for start in range(0, len(states), _BLOCK_ROWS):
        rows = slice(start, start + _BLOCK_ROWS)
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


ENCODINGS: dict[str, Encoding] = {
    encoding.name: encoding
    for encoding in (
        Encoding(
            name="fp32",
            description="float32 values, exact",
            arrays=(EncodedArray("values", "float32", True, _same_shape, _finite),),
            encode=_encode_fp32,
            decode=_decode_values,
            output_dtype="float32",
            zero_copy=True,
        ),
        Encoding(
            name="fp16",
            description="float16 values",
            arrays=(EncodedArray("values", "float16", True, _same_shape, _finite),),
            encode=_encode_fp16,
            decode=_decode_values,
            output_dtype="float16",
            zero_copy=True,
        ),
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
            output_dtype="float32",
            zero_copy=False,
        ),
    )
}


def get_encoding(name: str) -> Encoding:
    """The encoding called `name`, or a clear error listing the ones this version knows."""
    try:
        return ENCODINGS[name]
    except KeyError:
        raise StoreFormatError(
            f"unknown encoding {name!r}; this dilstore version knows: {', '.join(ENCODINGS)}"
        ) from None
