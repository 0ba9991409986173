"""2bit/1bit codebooks trained on few token states, and on states whose squares overflow float32 (codes51 F1, F5).

A codebook trained on 256 tokens or fewer had one centroid per token: every
residual was 0, the residual codes learnt nothing, and states it had not seen
were coded with a relative error of 0.93, near what all-zero states give. It
now trains one centroid per TOKENS_PER_CENTROID sample tokens and records how
many states it was trained on.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import zarr

from dilstore.storage import codebook as codebooks
from dilstore.storage import residual_codes
from dilstore.storage.codebook import read_codebook, write_codebook
from dilstore.storage.encodings import round_trip, train_codebook
from dilstore.storage.format import StoreFormatError

DIMS = 32


def low_rank_states(rows: int, seed: int) -> np.ndarray:
    """`(rows, DIMS)` float32 states of a few directions plus noise, like a model's (one distribution per call)."""
    generator = np.random.default_rng(seed)
    basis = np.random.default_rng(99).standard_normal((6, DIMS))  # (6, d), the same for every call
    return (generator.standard_normal((rows, 6)) @ basis + 0.3 * generator.standard_normal((rows, DIMS))).astype(
        np.float32
    )


def relative_error(codebook: dict[str, np.ndarray], states: np.ndarray) -> float:
    return float(np.linalg.norm(states - round_trip("2bit", codebook)(states)) / np.linalg.norm(states))


def test_a_codebook_of_few_tokens_codes_states_it_did_not_see() -> None:
    """Trained on 72 tokens it coded held-out states with an error near 1; with fewer centroids, near a full one's."""
    held_out = low_rank_states(2000, seed=1)
    full = relative_error(train_codebook("2bit", low_rank_states(8192, seed=2)), held_out)
    small = train_codebook("2bit", low_rank_states(72, seed=3))
    assert relative_error(small, held_out) < 2 * full, (relative_error(small, held_out), full)
    # The table keeps the format's 256 rows: 72 // 32 = 2 trained ones, each later row repeating row i mod 2.
    centroids, table = small["centroids"], residual_codes.CENTROIDS
    assert centroids.shape == (table, DIMS) and 72 // residual_codes.TOKENS_PER_CENTROID == 2
    assert np.array_equal(centroids, centroids[np.arange(table) % 2]) and not np.array_equal(*centroids[:2])


def test_the_centroid_count_grows_with_the_sample_up_to_the_table() -> None:
    counts = [residual_codes.trained_centroids(rows) for rows in (0, 1, 31, 64, 8191, 8192, 10**6)]
    assert counts == [1, 1, 1, 2, 255, 256, 256]


def test_a_codebook_records_the_states_it_was_trained_on_and_one_without_the_count_still_reads(
    tmp_path: Path,
) -> None:
    book = train_codebook("2bit", low_rank_states(300, seed=0))
    write_codebook(tmp_path / "counted", "2bit", book, (DIMS,), sample_tokens=300)
    assert codebooks.codebook_sample_tokens(tmp_path / "counted") == 300
    write_codebook(tmp_path / "old", "2bit", book, (DIMS,))  # as written before the count was recorded
    attributes = zarr.open_group(str(tmp_path / "old"), mode="r").attrs.asdict()["dilstore"]
    assert "sample_tokens" not in attributes and codebooks.codebook_sample_tokens(tmp_path / "old") is None
    arrays, shape = read_codebook(tmp_path / "old", "2bit")
    assert shape == (DIMS,) and all(np.array_equal(arrays[name], book[name]) for name in book)
    assert codebooks.codebook_sample_tokens(tmp_path / "no-such-codebook") is None



def test_a_recorded_sample_count_is_read_back_when_it_is_a_count_and_ignored_otherwise(tmp_path: Path) -> None:
    """Zero states is a count (of a codebook that learnt nothing, which an append must refuse); a negative, boolean,
    fractional or text value is no count, read as a codebook that records none."""
    book = train_codebook("2bit", low_rank_states(300, seed=4))
    for recorded, read in ((0, 0), (1, 1), (300, 300), (-1, None), (True, None), (2.5, None), ("300", None)):
        folder = tmp_path / str(recorded)
        write_codebook(folder, "2bit", book, (DIMS,), sample_tokens=300)
        group = zarr.open_group(str(folder), mode="r+")
        group.attrs.update({"dilstore": {**group.attrs.asdict()["dilstore"], "sample_tokens": recorded}})
        assert codebooks.codebook_sample_tokens(folder) == read and type(codebooks.codebook_sample_tokens(folder)) is (
            type(read)), recorded


def test_a_recorded_state_shape_that_is_no_list_of_sizes_is_named(tmp_path: Path) -> None:
    """(fuzz60 F6) Each size was read with int(): a state_shape of 5, [null], ["x"] or a number past int's range ended
    `precompute --codebook` with a TypeError, ValueError or OverflowError traceback, and "32" was read as (3, 2)."""
    book = train_codebook("2bit", low_rank_states(300, seed=5))
    write_codebook(tmp_path / "book", "2bit", book, (DIMS,))
    group = zarr.open_group(str(tmp_path / "book"), mode="r+")
    for recorded in (5, [None], ["x"], [1e300], "32", [True], [0]):
        group.attrs.update({"dilstore": {**group.attrs.asdict()["dilstore"], "state_shape": recorded}})
        with pytest.raises(StoreFormatError, match=r"^codebook .*book records state_shape .*, not a list of positive "):
            read_codebook(tmp_path / "book", "2bit")


@pytest.mark.parametrize(("relative", "content", "message"), [
    ("zarr.json", "5", r"cannot open codebook .*book: AttributeError: 'int' object has no attribute"),
    ("mean/zarr.json", None, r"codebook .*book: an array's metadata does not read \(TypeError: Expected dict"),
])
def test_codebook_metadata_that_does_not_read_is_named(tmp_path: Path, relative: str, content: str | None,
                                                       message: str) -> None:  # fmt: skip
    """(fuzz60 F7) An array's zarr.json is read as `read_codebook` first looks at the array, past the group's opening:
    one with a malformed field (codecs "x") was zarr's TypeError traceback from `precompute --codebook`, and a group
    zarr.json holding a number (`5`) zarr's AttributeError."""
    write_codebook(tmp_path / "book", "2bit", train_codebook("2bit", low_rank_states(300, seed=6)), (DIMS,))
    metadata = tmp_path / "book" / relative
    if content is None:
        content = json.dumps({**json.loads(metadata.read_text(encoding="utf-8")), "codecs": "x"})
    metadata.write_text(content, encoding="utf-8")
    with pytest.raises(StoreFormatError, match=message):
        read_codebook(tmp_path / "book", "2bit")


TRAIN_HUGE = """
import numpy as np
from dilstore.storage.encodings import round_trip, train_codebook
from dilstore.storage.format import StoreFormatError
states = np.random.default_rng(0).standard_normal((300, 8)).astype(np.float32)
states[:, 3] *= {scale}
for rotate in (True, False):
    book = train_codebook("2bit", states, rotate=rotate)
    assert all(np.isfinite(values).all() for values in book.values())
    try:
        round_trip("2bit", book)(states)
    except StoreFormatError as error:
        assert "beyond the range of its float16 scale" in str(error), error
    else:
        raise AssertionError("residuals past float16's range were encoded with clipped scales")
print("trained")
"""


def test_training_on_states_whose_squares_overflow_float32_does_not_crash() -> None:
    """scipy's kmeans2 on float32 states of |x| near 1e19 crashed the process (a segmentation fault or a double
    free, codes51 F5); it runs in float64. In a child process, so that a crash fails this test, not the run.
    Encoding such states is refused: their residuals' RMS is past the float16 scale's range (spec61 F2), where
    clipped scales decoded them finite but orders of magnitude too small."""
    for scale in ("1e30", "1e20"):
        done = subprocess.run([sys.executable, "-c", TRAIN_HUGE.format(scale=scale)], capture_output=True, text=True,
                              timeout=120)  # fmt: skip
        assert done.returncode == 0 and "trained" in done.stdout, (scale, done.returncode, done.stderr[-2000:])
