"""benchmarks/bench_codes_heldout.py's held-out codebooks record their sample size, so `precompute --codebook`
measures them for what they are.

bench53 F9: written without `sample_tokens`, a codebook trained on thousands of held-out states whose k-means left
fewer than 256 distinct centroids was taken for a legacy codebook trained on that few states and refused: the
script stopped in a CalledProcessError traceback after building its training and fp32 stores.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from dilstore.storage.codebook import codebook_sample_tokens
from tests.fixtures.benchmarks import benchmark_module


@pytest.mark.parametrize("encoding", ["2bit", "1bit"])
def test_the_held_out_codebook_records_how_many_states_it_was_trained_on(tmp_path: Path, encoding: str) -> None:
    sample = np.random.default_rng(0).standard_normal((600, 16)).astype(np.float32)
    with benchmark_module("bench_codes_heldout") as bench:
        folder, seconds = bench.write_heldout_codebook(tmp_path / f"codebook-{encoding}", encoding, sample)
    assert codebook_sample_tokens(folder) == 600 and seconds >= 0
