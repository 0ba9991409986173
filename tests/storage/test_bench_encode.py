"""benchmarks/bench_encode.py: it reads a store's first states exactly and times every encoding's encoder.

The timings themselves are the benchmark's output; here the states it encodes are the store's own
(in the order of shards and rows, cut at --tokens), a store with too few tokens is a clear error,
and every encoding gives a positive time per token, 2bit/1bit with rotated codes or with
per-dimension buckets (--buckets).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from dilstore.storage.finalize import finalize
from dilstore.storage.records import PassageRecord
from dilstore.storage.writer import write_shard
from tests.fixtures.benchmarks import benchmark_module
from tests.fixtures.store_fixtures import fingerprint_for

DIMS = 16


@pytest.fixture(scope="module")
def bench_encode():
    """benchmarks/bench_encode.py as module `bench_encode`."""
    with benchmark_module("bench_encode") as module:
        yield module


def _store(root: Path) -> np.ndarray:
    """A two-shard fp32 store of random states; all its token states in shard and row order."""
    rng = np.random.default_rng(5)
    everything = []
    for shard in range(2):
        records = []
        for row in range(40):
            n = int(rng.integers(1, 12))
            states = rng.standard_normal((n, DIMS)).astype(np.float32)  # (n, d)
            everything.append(states)
            records.append(PassageRecord(id=f"s{shard}-{row:02d}", title="", text="",
                                         token_ids=np.arange(n, dtype=np.int32),
                                         char_spans=np.full((n, 2), -1, dtype=np.int32), states=states))  # fmt: skip
        write_shard(root, shard, records, kind="dilbert", encoding="fp32", durable=False)
    finalize(root, fingerprint_for("dilbert", "fp32"), {"command": "test"})
    return np.concatenate(everything)


def test_first_states_are_the_stores_own_in_order(bench_encode, tmp_path: Path) -> None:
    expected = _store(tmp_path)
    tokens = len(expected) - 7  # crosses into the second shard
    states = bench_encode.first_states(str(tmp_path), tokens)
    np.testing.assert_array_equal(states, expected[:tokens])
    with pytest.raises(SystemExit, match=f"holds only {len(expected)} tokens"):
        bench_encode.first_states(str(tmp_path), len(expected) + 1)


@pytest.mark.parametrize("encoding", ["fp16", "int8", "2bit", "1bit"])
@pytest.mark.parametrize("rotate", [True, False])
def test_every_encoding_is_timed_with_either_codes(bench_encode, encoding: str, rotate: bool, monkeypatch) -> None:
    states = np.random.default_rng(1).standard_normal((600, DIMS)).astype(np.float32)  # (T, d)
    trained = []
    original = bench_encode.train_codebook
    monkeypatch.setattr(bench_encode, "train_codebook", lambda *args, **kwargs: trained.append(
        original(*args, **kwargs)) or trained[-1])
    row = bench_encode.measure(states, encoding, sample=512, repeats=2, seed=0, rotate=rotate)
    assert row["encode_us_per_token"] > 0
    assert row["train_s"] >= 0
    assert ("rotation" in trained[0]) == (rotate and encoding in ("2bit", "1bit"))


@pytest.mark.parametrize(("argv", "named"), [
    (["--tokens", "0"], "--tokens: expected a positive integer, got 0"),
    (["--repeats", "0"], "--repeats: expected a positive integer, got 0"),
    (["--encodings", "bogus"], "--encodings: invalid choice: 'bogus'"),
])
def test_bad_arguments_are_usage_errors(bench_encode, tmp_path: Path, capsys, argv: list[str], named: str) -> None:
    """--tokens 0 was a ZeroDivisionError, --repeats 0 printed Infinity into the JSON, a bad encoding a traceback."""
    _store(tmp_path)
    with pytest.raises(SystemExit) as stopped:
        bench_encode.main([str(tmp_path), *argv])
    assert stopped.value.code == 2 and named in capsys.readouterr().err


def test_a_missing_store_is_a_usage_error(bench_encode, tmp_path: Path, capsys) -> None:
    with pytest.raises(SystemExit) as stopped:
        bench_encode.main([str(tmp_path / "nowhere")])
    assert stopped.value.code == 2 and "no store at" in capsys.readouterr().err
