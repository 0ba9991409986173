"""benchmarks/bench_scale.py's builder makes a real store: it verifies, and fetches what was written.

The scale benchmark builds its stores with the project's writer and finalize;
this runs its builder and in-process measurement at a tiny N (2,000 passages,
2 shards) so the benchmark code cannot silently rot: in one process and in two
worker processes (the same bytes), its disk check, and its report's labels.
"""

from __future__ import annotations

import json
from functools import partial
from pathlib import Path

import numpy as np
import pytest

from dilstore.storage.codebook import read_codebook
from dilstore.storage.encodings import get_encoding
from dilstore.storage.format import CODEBOOK_DIR
from dilstore.storage.reader import open_store
from dilstore.storage.verify import verify_store
from tests.fixtures.benchmarks import benchmark_module

# Two shards of about 20,000 tokens each (60 to 100 a passage): each shard's states are still encoded in several
# blocks of residual_codes.BLOCK_ROWS (8,192) tokens. 2,000 passages of 1,000 a shard took four times as long and
# proved nothing more.
PASSAGES, PER_SHARD, SEED = 500, 250, 3
# The state pool the open-shards and compaction benchmarks draw their few passages' states from, for their default
# of 2**18 tokens: 400 MB of normals, some 1.5 s to draw, for 24 passages.
SMALL_POOL = 4096


@pytest.fixture(scope="module")
def bench():
    """benchmarks/bench_scale.py as module `bench_scale`, importable by name: its --jobs workers import it."""
    with benchmark_module("bench_scale") as module:
        yield module


@pytest.fixture(scope="module")
def one_bit(bench, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    """The 1bit store of the builder in one process, made once for the tests that only read it; its build record."""
    root = tmp_path_factory.mktemp("bench-scale") / "one"
    return root, bench.build_store(root, PASSAGES, PER_SHARD, "1bit", seed=SEED, pool_tokens=4096)


def _files(root: Path) -> dict[str, bytes]:
    return {str(path.relative_to(root)): path.read_bytes() for path in sorted(root.rglob("*")) if path.is_file()}


@pytest.mark.parametrize("encoding", ["1bit", "fp16"])
def test_builder_store_verifies_and_fetches_what_was_written(
    bench, request: pytest.FixtureRequest, tmp_path: Path, encoding: str
) -> None:
    if encoding == "1bit":
        root, build = request.getfixturevalue("one_bit")
    else:
        root = tmp_path / "store"
        build = bench.build_store(root, PASSAGES, PER_SHARD, encoding, seed=SEED, pool_tokens=4096)
    assert (build["passages"], build["shards"]) == (PASSAGES, 2)
    report = verify_store(root)
    assert report.ok, report.problems
    assert (report.passages, report.shards, report.tokens) == (PASSAGES, 2, build["tokens"])

    # The builder's records again, from the same seeds, then compare a few across both shards.
    pool = bench.state_pool(4096, SEED)
    records = [record for shard in range(2)
               for record in bench.shard_records(shard * PER_SHARD, PER_SHARD, pool, bench.shard_rng(SEED, shard))]
    assert {len(record.token_ids) for record in records} <= set(range(bench.MIN_TOKENS, bench.MAX_TOKENS + 1))
    chosen = [records[i] for i in (0, PER_SHARD - 1, PER_SHARD, PASSAGES - 1, PER_SHARD + 134)]  # both shards' ends
    encoder = get_encoding(encoding)
    codebook = read_codebook(root / CODEBOOK_DIR, encoding)[0] if encoder.codebook else None
    with open_store(root) as store:
        fetched = store.fetch([record.id for record in chosen])
        for record, passage in zip(chosen, fetched, strict=True):
            assert passage.id == record.id and passage.text == record.text
            np.testing.assert_array_equal(passage.token_ids, record.token_ids)
            expected = encoder.decode(encoder.encode(np.asarray(record.states, dtype=np.float32), codebook))
            # fp16 decodes by a cast, exactly; a codebook's decode ends in a float32 product with the axes, whose
            # rounding may change with the number of rows decoded at once (OpenBLAS on AMD EPYC: up to 1.2e-6).
            rtol, atol = (1e-6, 1e-5) if encoder.codebook else (0, 0)
            np.testing.assert_allclose(passage.states, expected.astype(passage.states.dtype), rtol=rtol, atol=atol)


def test_measure_open_and_report_run_on_a_tiny_store(bench, one_bit: tuple[Path, dict]) -> None:
    root, _ = one_bit
    opened = bench.measure_open(root, PASSAGES, lookups=20, fetch=10, seed=0, drop_cache=False)
    assert opened["fetch_passages"] == 10 and opened["open_s"] > 0 and not opened["fetch_first_is_cold"]
    disk = bench.disk_sizes(root)
    assert disk["index_bytes"] >= 16 * PASSAGES and disk["manifest_bytes"] > 0
    store = {"passages": PASSAGES, "tokens": 80 * PASSAGES, "shards": 2, "open": opened, "disk": disk,
             "build": {"write_s": 1.0, "finalize_s": 1.0}}
    result = {"stores": [store], "extrapolation": bench.extrapolate([store], PER_SHARD), "cost": bench.cost_table(12)}
    # codes, float16 scale, uint8 centroid id
    assert result["cost"]["1bit"]["state_bytes_per_token"] == 384 // 8 + 2 + 1
    assert result["cost"]["fp16"]["state_bytes_per_token"] == 768
    rendered = bench.render(result)
    assert rendered.startswith("MEASURED") and "EXTRAPOLATION (NOT MEASURED" in rendered
    ten_million = result["extrapolation"]["corpora"]["10M passages (synthetic mean length)"]
    assert ten_million["basis"] == "fit, extrapolated 20000.0x past the largest measured N"  # 10M / PASSAGES
    assert ten_million["basis"] in rendered and "not recorded" in rendered  # a build without CPU seconds


def test_two_jobs_write_the_same_store_as_one(bench, one_bit: tuple[Path, dict], tmp_path: Path) -> None:
    root_one, one = one_bit
    two = bench.build_store(tmp_path / "two", PASSAGES, PER_SHARD, "1bit", seed=SEED, pool_tokens=4096, jobs=2)
    assert (two["jobs"], two["tokens"]) == (2, one["tokens"]) and two["write_cpu_s"] > 0
    assert verify_store(tmp_path / "two").ok
    files_one, files_two = _files(root_one), _files(tmp_path / "two")
    assert sorted(files_one) == sorted(files_two)
    assert [name for name in files_one if name != "manifest.json" and files_one[name] != files_two[name]] == []


def test_the_disk_check_refuses_a_store_that_would_leave_too_little_free(bench, tmp_path: Path, capsys) -> None:
    assert bench.projected_store_bytes(1_000_000, "1bit") == 1_000_000 * 80 * (384 // 8 + 2 + 1 + 13.5)
    assert bench.projected_store_bytes(1_000_000, "1bit", bytes_per_token=63.4) == pytest.approx(5.072e9)
    assert bench.disk_problem(tmp_path, 0, 0) is None
    assert "GB free" in bench.disk_problem(tmp_path, 0, 1e18)
    output = tmp_path / "result.json"
    status = bench.main(["--passages", "1000", "--work-dir", str(tmp_path / "work"), "--min-free-gb", "1e9",
                         "--output", str(output)])
    error = capsys.readouterr().err
    assert status == 2 and error.startswith("bench_scale.py: error:") and error.count("\n") == 1
    assert "--min-free-gb 1e+09" in error and not output.exists()


def test_the_report_labels_measured_and_extrapolated_figures(bench) -> None:
    assert bench.basis(3_000_000, [1_000_000, 3_000_000]) == "fit, at a measured N"
    assert bench.basis(2_000_000, [1_000_000, 3_000_000]) == "fit, interpolated"
    assert bench.basis(10_000_000, [1_000_000, 4_000_000]) == "fit, extrapolated 2.5x past the largest measured N"


def test_the_open_shards_benchmark_compares_a_cap_with_the_default(
    tmp_path: Path, capsys, monkeypatch: pytest.MonkeyPatch
) -> None:
    """benchmarks/bench_open_shards.py at a tiny size: with a cap below the shard count the fetches reopen shards,
    with the default none (storage43 M1's figure in BENCHMARKS.md comes from it)."""
    with benchmark_module("bench_open_shards") as module:
        monkeypatch.setattr(module, "build_store", partial(module.build_store, pool_tokens=SMALL_POOL))
        module.main(["--shards", "12", "--passages-per-shard", "2", "--old-cap", "4", "--fetches", "20",
                     "--fetch", "6", "--work-dir", str(tmp_path), "--json-out", str(tmp_path / "r.json")])  # fmt: skip
    result = json.loads((tmp_path / "r.json").read_text())
    capped, default = result["rows"]
    assert (capped["max_open_shards"], capped["shards_kept"]) == (4, 4) and capped["shards_opened"] > 0
    assert (default["max_open_shards"], default["shards_kept"], default["shards_opened"]) == ("default", 12, 0)
    assert "default / old cap:" in capsys.readouterr().out


def test_the_compaction_benchmark_measures_an_appended_store_against_its_compaction(
    tmp_path: Path, capsys, monkeypatch: pytest.MonkeyPatch
) -> None:
    """benchmarks/bench_compact.py at a tiny size: the compacted store serves every live passage from fewer shards
    and files, and the report says its states are random (the figure in BENCHMARKS.md comes from it)."""
    with benchmark_module("bench_compact") as module:
        pool = module.state_pool  # the base store's passages and the appended ones draw from one pool, as they do
        monkeypatch.setattr(module, "build_store", partial(module.build_store, pool_tokens=SMALL_POOL))
        monkeypatch.setattr(module, "state_pool", lambda tokens, seed: pool(SMALL_POOL, seed))
        module.main(["--passages", "12", "--per-shard", "4", "--appends", "4", "--append-passages", "3",
                     "--replaced", "1", "--fetches", "5", "--fetch", "4", "--work-dir", str(tmp_path),
                     "--json-out", str(tmp_path / "r.json")])  # fmt: skip
    result = json.loads((tmp_path / "r.json").read_text())
    appended, compacted = result["rows"]["appended"], result["rows"]["compacted"]
    assert result["passages"] == 12 + 4 * 3 - 4 and result["states"].startswith("random")
    assert (appended["shards"], compacted["shards"]) == (3 + 4, 1)  # compact's default: few tokens, one shard
    assert compacted["files"] < appended["files"]
    assert "compaction:" in capsys.readouterr().out


def test_the_decode_benchmark_times_both_ways_on_the_same_codes(tmp_path: Path, capsys) -> None:
    """benchmarks/bench_decode_blocks.py at a tiny size (more tokens than one block): both paths agree, and the
    report says its states are random."""
    with benchmark_module("bench_decode_blocks") as module:
        module.main(["--tokens", str(module.BLOCK_ROWS + 10), "--dim", "8", "--repeats", "1",
                     "--json-out", str(tmp_path / "r.json")])  # fmt: skip
    result = json.loads((tmp_path / "r.json").read_text())
    assert [row["encoding"] for row in result["rows"]] == ["2bit", "1bit"] and result["states"].startswith("random")
    assert all(row["at_once_best_s"] > 0 and row["blocked_best_s"] > 0 for row in result["rows"])
    assert "first: at once s" in capsys.readouterr().out


def test_the_fetch_column_names_the_passages_fetched(bench, one_bit: tuple[Path, dict]) -> None:
    """bench53 F7: the header said "fetch 100" whatever --fetch asked."""
    root, _ = one_bit
    opened = bench.measure_open(root, PASSAGES, lookups=20, fetch=10, seed=0, drop_cache=False)
    store = {"passages": PASSAGES, "tokens": 80 * PASSAGES, "shards": 2, "open": opened, "disk": bench.disk_sizes(root),
             "build": {"write_s": 1.0, "finalize_s": 1.0}}  # fmt: skip
    rendered = bench.render({"stores": [store], "extrapolation": None, "cost": bench.cost_table(12)})
    assert "| fetch 10 ms cold / warm |" in rendered and "fetch 100" not in rendered


@pytest.mark.parametrize("case", ["more lookups than passages", "output in a missing folder"])
def test_what_would_fail_after_the_build_is_a_usage_error_before_it(bench, tmp_path: Path, capsys, case) -> None:
    """bench53 F7: both failed as tracebacks once the first store was built and measured."""
    work, output = tmp_path / "work", tmp_path / "result.json"
    argv = ["--passages", "50", "--passages-per-shard", "50", "--pool-tokens", "512", "--min-free-gb", "0",
            "--work-dir", str(work)]  # fmt: skip
    if case == "more lookups than passages":
        argv += ["--lookups", "60", "--fetch", "10", "--output", str(output)]
        message = "draw distinct ids of each store: give at most the smallest --passages (50)"
    else:
        output = tmp_path / "missing" / "result.json"
        argv += ["--lookups", "10", "--fetch", "10", "--output", str(output)]
        message = f"--output {output}: the folder {output.parent} does not exist"
    with pytest.raises(SystemExit) as stopped:
        bench.main(argv)
    assert stopped.value.code == 2 and message in capsys.readouterr().err
    assert not work.exists() and not output.exists()
