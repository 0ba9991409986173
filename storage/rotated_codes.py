"""Rotated residual codes: principal axes and bits spent where the variance is (2bit/1bit, since rotations).

A token vector's normalized residual (storage.encodings: the state less its
centroid and the mean, divided by the token's RMS) is turned onto the
principal axes of the codebook's sample, and each component gets its own
number of bits: components in order of falling variance form blocks of
`BLOCK` (the last block may be shorter); a block's components share 0, 1, 2
or 4 bits, chosen greedily to cut the sample's squared error most per bit
spent, within the encoding's ceil(d * bits / 8) bytes. The codebook then
lists the full blocks in order of falling bits (by variance within a bit
count; the shorter block stays last), so that a reader decodes one run of
whole bytes per bit count; any block order is valid and decodes. Each component then
stores its bucket among 2**b quantile buckets of its own (the bucket's mean
decodes it; a 0-bit component decodes to its sample mean). On the states of
the shipped DilBert reader this halves the squared error of the unrotated
codes at the same size (BENCHMARKS.md, "Rotated codes").

Byte layout of one token vector: the blocks' codes in component order, big
endian within a byte (first component in the high bits), each code's bits
highest first; a block of 8 components of b bits fills b whole bytes, so no
code straddles a byte, the shorter last block is padded with zero bits, and
unused bytes at the end are zero.

Codebook arrays (float32, S the per-token state shape, d = S[-1]):
    rotation (d, *S)              row j: component j's axis for each vector position (unit vectors)
    allocation (*S)               bits of each component: 0, 1, 2 or 4, the same within a block
    component_cutoffs (15, *S)    the first 2**b - 1 rows: the component's bucket cutoffs; then the last repeated
    component_weights (16, *S)    the first 2**b rows: the buckets' means (row 0 of a 0-bit component: its mean)
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

BLOCK = 8
MAX_BITS = 4
ALLOWED_BITS = (0, 1, 2, 4)
_NEXT_BITS = {0: 1, 1: 2, 2: 4}
# Arrays of a rotated codebook, beside the residual codebook's mean (and centroids).
ROTATED_CODEBOOK = ("rotation", "allocation", "component_cutoffs", "component_weights")


def quantile_quantizer(values: np.ndarray, levels: int) -> tuple[np.ndarray, np.ndarray]:
    """Per-column quantile buckets of a sample `(N, *S)`: cutoffs `(levels-1, *S)`, bucket means `(levels, *S)`.

    The cutoffs are the quantiles j/levels, so every bucket holds about 1/levels
    of the sample; a bucket's weight is the mean of the sample values in it
    (the midpoint of its cutoffs where it is empty). float64 inside.
    """
    cutoffs = np.quantile(values, np.arange(1, levels) / levels, axis=0).astype(np.float32)  # (L-1, *S)
    buckets = bucket_of(values, cutoffs)  # (N, *S)
    edges = np.concatenate([cutoffs[:1] - 1, cutoffs, cutoffs[-1:] + 1])  # (L+1, *S)
    weights = np.empty((levels, *values.shape[1:]), dtype=np.float32)  # (L, *S)
    for level in range(levels):
        inside = buckets == level  # (N, *S)
        count = inside.sum(axis=0)  # (*S)
        total = np.where(inside, values, 0).sum(axis=0, dtype=np.float64)  # (*S)
        midpoint = (edges[level].astype(np.float64) + edges[level + 1]) / 2  # (*S)
        weights[level] = np.where(count > 0, total / np.maximum(count, 1), midpoint)
    return cutoffs, weights


def bucket_of(values: np.ndarray, cutoffs: np.ndarray) -> np.ndarray:
    """The bucket of each value: how many cutoffs lie below it. `(rows, *S)`, `(K-1, *S)` -> `(rows, *S)` uint8."""
    buckets = np.zeros(values.shape, dtype=np.uint8)  # (rows, *S)
    for cutoff in cutoffs:
        buckets += values > cutoff
    return buckets


def packed_width(dims: int | np.ndarray, bits: int | np.ndarray) -> int | np.ndarray:
    """Bytes of `dims` values at `bits` bits each, rounded up (elementwise for arrays)."""
    return -(-dims * bits // 8)


def allocation_problem(allocation: np.ndarray, bits: int) -> str | None:
    """What is wrong with an allocation `(*S)` for codes of `bits` bits per dimension on average, or None."""
    if not np.isin(allocation, ALLOWED_BITS).all():
        return f"holds bit counts other than {ALLOWED_BITS}"
    dims = allocation.shape[-1]
    rows = allocation.reshape(-1, dims)  # (G, d)
    starts = np.arange(0, dims, BLOCK)
    if (np.repeat(rows[:, starts], BLOCK, axis=1)[:, :dims] != rows).any():
        return f"gives components of one block of {BLOCK} different bit counts"
    sizes = np.diff(np.append(starts, dims))  # (blocks,)
    used = packed_width(sizes, rows[:, starts].astype(np.int64)).sum(axis=1)  # (G,)
    if (used > packed_width(dims, bits)).any():
        return f"needs {int(used.max())} bytes per token vector, more than the {packed_width(dims, bits)} of {bits}bit"
    return None


def principal_axes(normalized: np.ndarray) -> np.ndarray:
    """The principal axes of a sample `(N, d)`: eigenvectors of its second moments, largest first.

    `(d, d)` float32, row j the j-th axis, signed so that its largest entry
    is positive (an eigenvector's sign is otherwise arbitrary).
    """
    sample = normalized.astype(np.float64)
    moments = sample.T @ sample / max(len(sample), 1)  # (d, d)
    _, vectors = np.linalg.eigh(moments)
    axes = vectors[:, ::-1].T  # (d, d): row j, the eigenvector of the j-th largest eigenvalue
    largest = np.abs(axes).argmax(axis=1)  # (d,)
    axes *= np.sign(axes[np.arange(len(axes)), largest])[:, None]
    return axes.astype(np.float32)


def _quantizers(components: np.ndarray) -> dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """For each bit count: (cutoffs, weights, per-component mean squared error) on a sample `(N, d)`."""
    mean = components.mean(axis=0, dtype=np.float64)  # (d,)
    zero_cutoffs = np.zeros((0, components.shape[1]), dtype=np.float32)
    result = {0: (zero_cutoffs, mean[None].astype(np.float32),
                  np.square(components - mean, dtype=np.float64).mean(axis=0))}
    for bits in ALLOWED_BITS[1:]:
        cutoffs, weights = quantile_quantizer(components, 2**bits)
        decoded = np.take_along_axis(weights, bucket_of(components, cutoffs).astype(np.intp), axis=0)  # (N, d)
        result[bits] = (cutoffs, weights, np.square(decoded - components, dtype=np.float64).mean(axis=0))
    return result


def allocate(errors: dict[int, np.ndarray], bits: int) -> np.ndarray:
    """Bits per component `(d,)` from each bit count's per-component error, within ceil(d * bits / 8) bytes.

    Blocks of BLOCK components in order share a bit count. Starting from 0
    bits everywhere, the upgrade (0 -> 1 -> 2 -> 4 bits of one block) that
    removes the most error per bit spent is taken while one fits; ties go to the
    earlier block, so the result is deterministic.
    """
    dims = len(errors[0])
    starts = np.arange(0, dims, BLOCK)
    sizes = np.diff(np.append(starts, dims))  # (blocks,)
    block_errors = {count: np.add.reduceat(values, starts) for count, values in errors.items()}  # (blocks,) each
    chosen = np.zeros(len(starts), dtype=np.int64)  # (blocks,)
    budget = packed_width(dims, bits)
    while True:
        upgradable = chosen < MAX_BITS
        nexts = np.array([_NEXT_BITS.get(int(count), MAX_BITS) for count in chosen])  # (blocks,)
        extra = packed_width(sizes, nexts) - packed_width(sizes, chosen)  # (blocks,)
        fits = upgradable & (packed_width(sizes, chosen).sum() + extra <= budget)
        gain = np.array([block_errors[int(c)][b] - block_errors[int(n)][b] if f else -np.inf
                         for b, (c, n, f) in enumerate(zip(chosen, nexts, fits, strict=True))])
        gain = gain / np.maximum(sizes * (nexts - chosen), 1)
        if not fits.any() or gain.max() <= 0:
            break
        best = int(gain.argmax())
        chosen[best] = nexts[best]
    return np.repeat(chosen, sizes)


def _block_order(allocation: np.ndarray) -> np.ndarray:
    """Component order `(d,)` that puts the full blocks in order of falling bits (stable: by variance within a bit
    count) and keeps a shorter last block last, so a reader decodes at most one run of bytes per bit count."""
    dims = len(allocation)
    full = dims // BLOCK
    blocks = sorted(range(full), key=lambda block: -allocation[block * BLOCK])
    return np.concatenate([np.arange(block * BLOCK, (block + 1) * BLOCK) for block in blocks]
                          + [np.arange(full * BLOCK, dims)]).astype(np.intp)


def train_rotated(normalized: np.ndarray, bits: int) -> dict[str, np.ndarray]:
    """A rotated codebook (the module docstring) from normalized residuals `(N, *S)`, per vector position.

    An empty sample gives the identity rotation, `bits` bits everywhere and
    all-zero quantizers, which decode every code to zero.
    """
    state_shape = normalized.shape[1:]
    groups, dims = math.prod(state_shape[:-1]), state_shape[-1]
    vectors = normalized.reshape(len(normalized), groups, dims)  # (N, G, d)
    rotation = np.zeros((groups, dims, dims), dtype=np.float32)  # (G, d, d)
    allocation = np.zeros((groups, dims), dtype=np.float32)  # (G, d)
    cutoffs = np.zeros((groups, 2**MAX_BITS - 1, dims), dtype=np.float32)  # (G, 15, d)
    weights = np.zeros((groups, 2**MAX_BITS, dims), dtype=np.float32)  # (G, 16, d)
    for group in range(groups):
        if len(normalized) == 0:
            rotation[group] = np.eye(dims, dtype=np.float32)
            allocation[group] = bits
            continue
        rotation[group] = principal_axes(vectors[:, group])
        components = vectors[:, group] @ rotation[group].T  # (N, d)
        quantizers = _quantizers(components)
        chosen = allocate({count: error for count, (_, _, error) in quantizers.items()}, bits)  # (d,)
        order = _block_order(chosen)  # (d,)
        rotation[group], chosen = rotation[group, order], chosen[order]
        quantizers = {count: (c[:, order], w[:, order], e[order]) for count, (c, w, e) in quantizers.items()}
        allocation[group] = chosen
        for count, (count_cutoffs, count_weights, _) in quantizers.items():
            columns = chosen == count  # (d,)
            levels = 2**count
            weights[group, :levels, columns] = count_weights[:, columns].T
            if count:
                cutoffs[group, : levels - 1, columns] = count_cutoffs[:, columns].T
                cutoffs[group, levels - 1 :, columns] = count_cutoffs[-1, columns][:, None]
    return {
        "rotation": np.moveaxis(rotation, 1, 0).reshape(dims, *state_shape),
        "allocation": allocation.reshape(state_shape),
        "component_cutoffs": np.moveaxis(cutoffs, 1, 0).reshape(2**MAX_BITS - 1, *state_shape),
        "component_weights": np.moveaxis(weights, 1, 0).reshape(2**MAX_BITS, *state_shape),
    }


def _per_group(codebook: Mapping[str, np.ndarray], name: str, groups: int, dims: int) -> np.ndarray:
    """Codebook array `name` `(L, *S)` as `(G, L, d)`."""
    values = np.asarray(codebook[name])
    return np.moveaxis(values.reshape(len(values), groups, dims), 1, 0)


def encode_rotated(normalized: np.ndarray, codebook: Mapping[str, np.ndarray], bits: int) -> np.ndarray:
    """Normalized residuals `(rows, *S)` -> packed codes `(rows, *S[:-1], ceil(d*bits/8))` uint8."""
    state_shape = normalized.shape[1:]
    groups, dims = math.prod(state_shape[:-1]), state_shape[-1]
    vectors = normalized.reshape(len(normalized), groups, dims)  # (rows, G, d)
    rotation = _per_group(codebook, "rotation", groups, dims)  # (G, d, d)
    cutoffs = _per_group(codebook, "component_cutoffs", groups, dims)  # (G, 15, d)
    allocation = np.asarray(codebook["allocation"]).reshape(groups, dims).astype(np.int64)  # (G, d)
    width = packed_width(dims, bits)
    codes = np.zeros((len(normalized), groups, width), dtype=np.uint8)  # (rows, G, width)
    for group in range(groups):
        coded, counts, offsets = _code_layout(allocation[group])
        if not len(coded):
            continue
        shifts = (8 - offsets % 8 - counts).astype(np.uint8)  # (A,): where each code sits in its byte
        starts = np.flatnonzero(np.diff(offsets // 8, prepend=-1))  # (used bytes,): the first code of each byte
        components = vectors[:, group] @ rotation[group, coded].T  # (rows, A)
        counted = np.arange(2**MAX_BITS - 1)[:, None] < (2 ** allocation[group, coded] - 1)  # (15, A): real cutoffs
        buckets = bucket_of(components, np.where(counted, cutoffs[group][:, coded], np.inf))  # (rows, A)
        packed = np.add.reduceat(buckets << shifts, starts, axis=1, dtype=np.uint8)  # (rows, used bytes): OR of codes
        codes[:, group, : packed.shape[1]] = packed
    return codes.reshape(*normalized.shape[:-1], width)


def _code_layout(allocation: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Of one position's allocation `(d,)`: the coded components `(A,)`, their bit counts `(A,)` and the bit
    offset of each code in the token vector's stream `(A,)`. Codes never straddle a byte."""
    coded = np.flatnonzero(allocation > 0)  # (A,)
    counts = allocation[coded]  # (A,)
    return coded, counts, np.cumsum(counts) - counts


def prepare_rotated(codebook: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Lookup tables for `decode_rotated`, built once per store, per run of coded components of one bit count.

    A run of b-bit codes fills whole bytes (blocks are whole bytes; only the
    last, shorter block may end inside a byte), so each run decodes with one
    table row per stored byte holding its 8/b values: `rotated_runs (R, 6)`
    int64 rows (position g, first byte, end byte, values per byte, offset of
    the run's table in `rotated_tables`, first column in the coded values);
    `rotated_tables` the runs' tables, flat; `rotated_axes (G, A, d)` the axis
    of each column of the coded values (A: the most columns of any position;
    zero rows for padding, so what those read adds nothing); `rotated_offset
    (*S)` what the 0-bit components add (their mean times their axis).
    """
    state_shape = np.asarray(codebook["allocation"]).shape
    groups, dims = math.prod(state_shape[:-1]), state_shape[-1]
    rotation = _per_group(codebook, "rotation", groups, dims)  # (G, d, d)
    weights = _per_group(codebook, "component_weights", groups, dims)  # (G, 16, d)
    allocation = np.asarray(codebook["allocation"]).reshape(groups, dims).astype(np.int64)  # (G, d)
    runs, tables, columns = [], [], []
    flat = 0
    values = np.arange(256)  # (256,)
    offset = np.zeros((groups, dims), dtype=np.float32)  # (G, d)
    for group in range(groups):
        coded, counts, offsets = _code_layout(allocation[group])
        uncoded = allocation[group] == 0  # (d,)
        offset[group] = weights[group, 0, uncoded] @ rotation[group, uncoded]
        axes, column = [], 0
        for first, end in _runs(counts):
            count, per_byte = int(counts[first]), 8 // int(counts[first])
            start_byte, end_byte = int(offsets[first] // 8), int(-(-(offsets[end - 1] + count) // 8))
            slots = (end_byte - start_byte) * per_byte
            table = np.zeros((end_byte - start_byte, 256, per_byte), dtype=np.float32)  # (bytes, 256, 8/b)
            run_axes = np.zeros((slots, dims), dtype=np.float32)  # (slots, d)
            for position in range(first, end):
                byte, slot = divmod(int(offsets[position] - start_byte * 8) // count, per_byte)
                buckets = (values >> (8 - (slot + 1) * count)) & (2**count - 1)  # (256,)
                table[byte, :, slot] = weights[group, buckets, coded[position]]
                run_axes[byte * per_byte + slot] = rotation[group, coded[position]]
            runs.append((group, start_byte, end_byte, per_byte, flat, column))
            tables.append(table.ravel())
            axes.append(run_axes)
            flat, column = flat + table.size, column + slots
        columns.append(np.concatenate(axes) if axes else np.zeros((0, dims), dtype=np.float32))
    most = max(len(axes) for axes in columns)
    padded = np.zeros((groups, most, dims), dtype=np.float32)  # (G, A, d)
    for group, axes in enumerate(columns):
        padded[group, : len(axes)] = axes
    return {"rotated_runs": np.array(runs, dtype=np.int64).reshape(-1, 6),
            "rotated_tables": np.concatenate(tables) if tables else np.zeros(0, dtype=np.float32),
            "rotated_axes": padded, "rotated_offset": offset.reshape(state_shape)}


def _runs(counts: np.ndarray) -> list[tuple[int, int]]:
    """(first, end) of each run of equal values in `counts` `(A,)`."""
    breaks = [0, *(np.flatnonzero(np.diff(counts)) + 1).tolist(), len(counts)]
    return [(first, end) for first, end in zip(breaks[:-1], breaks[1:], strict=True) if end > first]


def decode_rotated(codes: np.ndarray, prepared: Mapping[str, np.ndarray]) -> np.ndarray:
    """Packed codes `(n, *S[:-1], width)` -> normalized residuals `(n, *S)` float32 (before the token scale)."""
    tables = prepared["rotated_tables"]  # (sum of the runs' table sizes,)
    axes = prepared["rotated_axes"]  # (G, A, d)
    offset = prepared["rotated_offset"]  # (*S)
    groups, most, dims = axes.shape
    flat = codes.reshape(len(codes), groups, codes.shape[-1])  # (n, G, width)
    coded = np.zeros((len(codes), groups, most), dtype=np.float32)  # (n, G, A)
    for group, start_byte, end_byte, per_byte, table_at, column in prepared["rotated_runs"].tolist():
        count = end_byte - start_byte
        table = tables[table_at : table_at + count * 256 * per_byte].reshape(count * 256, per_byte)
        rows = flat[:, group, start_byte:end_byte] + np.arange(0, count * 256, 256)  # (n, bytes)
        coded[:, group, column : column + count * per_byte] = np.take(table, rows, axis=0).reshape(
            len(codes), count * per_byte)
    out = np.empty((len(codes), groups, dims), dtype=np.float32)  # (n, G, d)
    for group in range(groups):
        np.matmul(coded[:, group], axes[group], out=out[:, group])  # (n, A) @ (A, d)
    out += offset.reshape(groups, dims)
    return out.reshape(*codes.shape[:-1], dims)
