"""Training on what a low-bit store gives back: `train qa --freeze-lower --store-encoding ENC`.

A 2bit or 1bit store returns layer-k passage states with an error that the
upper layers never saw in training, and the reader loses F1 through it
(BENCHMARKS.md, "Low-bit store encodings"). With frozen lower layers the
cached passage states can be exactly what such a store returns: encoded with
a codebook and decoded again (storage.encodings.round_trip). Only layers
k+1..l and the head train, so they learn to read decoded states, while the
passage states, and so any store precomputed with the starting model, stay
as they were. Question states are computed online and never stored: they
stay fp16.

The codebook is given (`codebook`: a store's `codebook/` group, to train on
that store's exact codes) or trained the way the pipeline's sampling pass
trains a store's (pipelines/codebook.py): on a seeded sample of at most
CODEBOOK_SAMPLE_TOKENS layer-k token states of at most CODEBOOK_SAMPLE_UNITS
distinct training passage windows. A store of another corpus trains its own
codebook, so the upper layers are meant to learn the codec's kind of error,
not one codebook. The codebook is written to OUTPUT/codebook, and a resumed
run reads it back, so every step of a run sees the same codes.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from dilstore.reader.modeling.dilbert import DilBertReader
from dilstore.reader.training.frozen_lower import StateTransform, encode_windows
from dilstore.storage.codebook import CODEBOOK_DIR, codebook_sample_tokens, read_codebook, write_codebook
from dilstore.storage.encodings import get_encoding, round_trip, train_codebook
from dilstore.storage.residual_codes import (
    CODEBOOK_SAMPLE_TOKENS,
    CODEBOOK_SAMPLE_UNITS,
    CODEBOOK_SEED,
    MIN_REUSE_TOKENS,
    SMALL_SAMPLE_TOKENS,
    sample_rows,
)

_ENCODE_BATCH = 32


def passage_state_sample(
    reader: DilBertReader, windows: Sequence[Sequence[int]], device: torch.device, seed: int = CODEBOOK_SEED
) -> np.ndarray:
    """A seeded sample of at most CODEBOOK_SAMPLE_TOKENS layer-k token states `(N, d)` of CODEBOOK_SAMPLE_UNITS
    distinct windows.

    The windows are drawn from the distinct token-id rows in sorted order, so
    the sample does not depend on the order or repeats of `windows`.
    """
    distinct = sorted({tuple(int(token) for token in ids) for ids in windows})
    chosen = [distinct[int(index)] for index in sample_rows(len(distinct), CODEBOOK_SAMPLE_UNITS, seed)]
    states = [
        row
        for start in range(0, len(chosen), _ENCODE_BATCH)
        for row in encode_windows(reader, reader.encode_passages, chosen[start : start + _ENCODE_BATCH], device)
    ]
    joined = torch.cat(states).numpy()  # (Σn, d)
    return joined[sample_rows(len(joined), CODEBOOK_SAMPLE_TOKENS, seed)]  # (N, d)


def training_round_trip(
    reader: DilBertReader,
    windows: Sequence[Sequence[int]],
    encoding: str,
    codebook: Path | None,
    output_dir: Path,
    device: torch.device,
    *,
    resume: bool,
) -> StateTransform:
    """The round trip through `encoding` that a run's passage states take, with its codebook saved to OUTPUT/codebook.

    A resumed run reads back the codebook its first part saved; otherwise it
    is the given `codebook` or one trained on `windows` (module docstring).
    """
    target = Path(output_dir) / CODEBOOK_DIR
    if resume and target.is_dir():
        arrays, _ = read_codebook(target, encoding)
        return round_trip(encoding, arrays)
    if not get_encoding(encoding).codebook:
        return round_trip(encoding)
    if codebook is not None:
        arrays, state_shape = read_codebook(codebook, encoding)
        sample_tokens = codebook_sample_tokens(codebook)
        if sample_tokens is not None:  # one written before the count was recorded: nothing to say
            warn_small_given(codebook, encoding, sample_tokens)
    else:
        sample = passage_state_sample(reader, windows, device)  # (N, d)
        arrays, state_shape = train_codebook(encoding, sample), sample.shape[1:]  # rotated, as DilBert stores are
        sample_tokens = len(sample)
        warn_small_sample(encoding, sample_tokens)
    target.parent.mkdir(parents=True, exist_ok=True)
    write_codebook(target, encoding, arrays, tuple(state_shape), sample_tokens=sample_tokens)
    return round_trip(encoding, arrays)


def warn_small_sample(encoding: str, sample_tokens: int) -> None:
    """Say on stderr, before training starts, that the codebook a run trained is one of fewer than
    SMALL_SAMPLE_TOKENS token states, what that does and what is needed.

    (left55b F2) `train qa --freeze-lower --store-encoding 2bit` on a small training set saved a codebook of a few
    hundred states without a word, where `precompute` warns: such a codebook codes the training windows' own states
    better than a store's unseen ones, so the upper layers learn to read less error than a store built with it
    gives, and below MIN_REUSE_TOKENS `precompute --codebook OUTPUT/codebook` refuses it only after the training.
    """
    if sample_tokens >= SMALL_SAMPLE_TOKENS:
        return
    refused = (f"; with fewer than {MIN_REUSE_TOKENS:,}, `dilstore precompute --codebook OUTPUT/{CODEBOOK_DIR}` will "
               "refuse it" if sample_tokens < MIN_REUSE_TOKENS else "")  # fmt: skip
    print(f"dilstore train qa: warning: the {encoding} codebook was trained on only {sample_tokens:,} token states "
          f"of the training windows, fewer than the {SMALL_SAMPLE_TOKENS:,} a codebook needs to code unseen passages "
          f"as well as a full sample does: it codes these windows' states better than a store's, so the upper layers "
          f"train on less error than a store gives them{refused}. Train on more passages (a sample takes up to "
          f"{CODEBOOK_SAMPLE_TOKENS:,} token states of {CODEBOOK_SAMPLE_UNITS} windows), or give a store's codebook "
          "with --codebook", file=sys.stderr)  # fmt: skip


def warn_small_given(codebook: Path, encoding: str, sample_tokens: int) -> None:
    """Say on stderr, before training starts, that the codebook given with --codebook records a sample of fewer than
    SMALL_SAMPLE_TOKENS token states, what that does and what to do.

    (left56 F4) `warn_small_sample` spoke only of a codebook the run trained: a store's small codebook given with
    `--codebook` was taken without a word, though it codes the training windows, which it never saw, worse than a
    full sample's would, and below MIN_REUSE_TOKENS `precompute --codebook OUTPUT/codebook` refuses its copy only
    after the training.
    """
    if sample_tokens >= SMALL_SAMPLE_TOKENS:
        return
    refused = (f"; with fewer than {MIN_REUSE_TOKENS:,}, `dilstore precompute --codebook` refuses it (and its copy "
               f"OUTPUT/{CODEBOOK_DIR})" if sample_tokens < MIN_REUSE_TOKENS else "")  # fmt: skip
    print(f"dilstore train qa: warning: --codebook {codebook} ({encoding}) was trained on only {sample_tokens:,} token "
          f"states, fewer than the {SMALL_SAMPLE_TOKENS:,} a codebook needs to code unseen passages as well as a full "
          f"sample does: it codes these training windows, which it did not see, worse than a full sample's "
          f"would{refused}. Give the codebook of a store built from more passages, or leave --codebook out to train "
          "one on the training windows", file=sys.stderr)  # fmt: skip
