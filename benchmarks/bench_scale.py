"""Scale benchmark (#16 part 3): open, id lookup, fetch and verify on synthetic stores of growing N.

For each --passages N it builds a real finalized store with the project's own writer
(`write_codebook`, `write_shard` per shard, `finalize`: what `dilstore precompute` calls), then
measures it, each measurement in a fresh Python process so nothing is already imported, mapped
or cached in the interpreter:

- `open_store` time and resident memory (VmRSS) right after it, against the same process before
  it (imports done); then after 100 id lookups and after a fetch;
- id lookups: --lookups (100) random ids one by one (`id in store`), first touch and again;
- fetch of --fetch (100) random passages (decoded float32 states): "cold" after dropping the page cache
  (`/proc/sys/vm/drop_caches`, root only; otherwise reported unavailable) in a fresh process,
  and warm (the same ids again);
- `dilstore verify --json` as a subprocess: passages/s and MB/s of the files it hashed;
- on-disk sizes: the id index, the manifest, and bytes per token by part (`dilstore info`).

Synthetic passages: d=384 (`dilbert`), 60..100 tokens (uniform, seeded), random token ids, every
token's char span (-1, -1) (allowed: special tokens), texts of about 25 characters and empty titles
(kept short on purpose to save disk; real texts add their UTF-8 bytes). States are float32
standard normals: each passage is a random run of a seeded pool of --pool-tokens random
tokens (drawing fresh normals for 80M tokens would dominate the build and does not change what is
measured; the encoder still encodes every token). Each shard's records come from a generator of
its own (seed, shard), so --jobs N writes the same store with N shards at once, one spawned
process each. The codebook is trained once on CODEBOOK_SAMPLE_TOKENS pool tokens, as the pipeline
trains one per store, and written to `codebook/` before the shards. The writer holds a whole
shard's float32 states in memory (T x d x 4 bytes, concatenated from the records), per job, which
bounds --passages-per-shard x --jobs on a small machine.

Before building, the script estimates each store's disk (mean tokens x bytes per token, measured
on this run's previous store when there is one) and stops with an error, keeping the results so
far, when it would leave less than --min-free-gb free under --work-dir. The report's first table
is measured; the EXTRAPOLATION table is linear fits in N, each row saying how far past the largest
measured N it lies; the DERIVED table is arithmetic on the encodings' array sizes.

    python benchmarks/bench_scale.py --passages 100000 300000 1000000 --work-dir /work/scale-stores \
        --output /tmp/bench-scale.json
    python benchmarks/bench_scale.py --passages 1000000 3000000 6000000 --work-dir /work/scale-stores \
        --output /tmp/bench-scale-6m.json   # --jobs 2: two shards written at once, on a machine with cores to spare
    python benchmarks/bench_scale.py --passages 20000 --passages-per-shard 5 --pool-tokens 65536 \
        --work-dir /work/scale-stores/s4000 --output /tmp/bench-scale-4000shards.json   # many small shards
    python benchmarks/bench_scale.py --report-only /tmp/bench-scale.json   # the tables again

Each store is deleted after it is measured unless --keep is given; use one --work-dir per concurrent run.
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import math
import multiprocessing
import os
import platform
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
from page_cache import drop_page_cache

from dilstore.reader.training.hardware import cpu_model  # torch-free
from dilstore.runners.arg_types import numpy_seed, positive_int
from dilstore.runners.outputs import check_output_file
from dilstore.storage.codebook import write_codebook
from dilstore.storage.encodings import ENCODINGS, get_encoding, train_codebook
from dilstore.storage.errors import DilstoreError
from dilstore.storage.finalize import finalize
from dilstore.storage.fingerprint import Fingerprint
from dilstore.storage.format import CODEBOOK_DIR, INDEX_DIR, MANIFEST_FILE
from dilstore.storage.records import PassageRecord
from dilstore.storage.residual_codes import CODEBOOK_SAMPLE_TOKENS
from dilstore.storage.writer import write_shard

DIM = 384
MIN_TOKENS, MAX_TOKENS = 60, 100  # inclusive
MEAN_TOKENS = (MIN_TOKENS + MAX_TOKENS) / 2
# Bytes per token besides the states, for disk estimates before a store of the run is measured: token ids and
# char spans (12) plus texts, offsets, index and chunk padding (1.4 measured at 1M passages, 1bit).
OTHER_BYTES_PER_TOKEN = 13.5
GENERATION = "bench-scale"
STARTED = time.perf_counter()
# Corpora to extrapolate to: passages and tokens (Wikipedia from the DPR split; MS MARCO tokens from the
# DL19 top-100 mean of 87.23 tokens per passage, as in BENCHMARKS.md "Cost for full corpora").
CORPORA = {
    "10M passages (synthetic mean length)": (10_000_000, None),
    "MS MARCO passages": (8_841_823, 8_841_823 * 87.23),
    "English Wikipedia (DPR 100-word passages)": (34_650_000, 4.5e9),
}


def log(message: str) -> None:
    print(f"[{time.perf_counter() - STARTED:7.1f}s] {message}", file=sys.stderr, flush=True)


def passage_id(index: int) -> str:
    return f"wiki-{index:09d}"


def fingerprint(encoding: str) -> Fingerprint:
    return Fingerprint("BertModel", "bench-scale", "bench-scale", "bench-scale", "dilbert", 4, encoding, 128)


@functools.cache
def state_pool(tokens: int, seed: int) -> np.ndarray:
    """`(tokens, DIM)` float32 standard normals, seeded; made once per process and read-only."""
    pool = np.random.default_rng(seed).standard_normal((tokens, DIM), dtype=np.float32)
    pool.flags.writeable = False
    return pool


def shard_rng(seed: int, shard: int) -> np.random.Generator:
    """The generator of shard `shard`'s records: a stream of its own, so shards can be built in any order."""
    return np.random.default_rng([seed + 1, shard])


def shard_records(first: int, count: int, pool: np.ndarray, rng: np.random.Generator) -> list[PassageRecord]:
    """Passages first..first+count-1: random lengths, token ids and pool runs (views, no copy)."""
    lengths = rng.integers(MIN_TOKENS, MAX_TOKENS + 1, count)
    starts = rng.integers(0, len(pool) - MAX_TOKENS, count)
    token_ids = rng.integers(1000, 30000, int(lengths.sum())).astype(np.int32)  # (T,)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    spans = np.full((MAX_TOKENS, 2), -1, dtype=np.int32)
    records = []
    for i, (length, start) in enumerate(zip(lengths.tolist(), starts.tolist(), strict=True)):
        index = first + i
        records.append(PassageRecord(
            id=passage_id(index), title="", text=f"synthetic passage {index}",
            token_ids=token_ids[offsets[i]:offsets[i + 1]], char_spans=spans[:length],
            states=pool[start:start + length],
        ))
    return records


@dataclass(frozen=True)
class BuildSettings:
    """What every shard of one synthetic store is written with (picklable, for worker processes)."""

    root: Path
    passages: int
    per_shard: int
    encoding: str
    seed: int
    pool_tokens: int
    durable: bool
    codebook: Mapping[str, np.ndarray] | None


def write_one_shard(settings: BuildSettings, shard: int) -> dict[str, Any]:
    """Write shard `shard` of the store with `write_shard`; its passages, tokens, bytes and CPU seconds.

    The CPU seconds are this process's (user + system) for the records and the write, not the state pool.
    """
    pool = state_pool(settings.pool_tokens, settings.seed)
    cpu = time.process_time()
    first = shard * settings.per_shard
    records = shard_records(first, min(settings.per_shard, settings.passages - first), pool,
                            shard_rng(settings.seed, shard))
    summary = write_shard(settings.root, shard, records, kind="dilbert", encoding=settings.encoding,
                          codebook=settings.codebook, durable=settings.durable, generation=GENERATION,
                          fingerprint=fingerprint(settings.encoding))
    return {"shard": shard, "passages": summary.passages, "tokens": summary.tokens, "bytes": summary.bytes,
            "cpu_s": time.process_time() - cpu}


def write_shards(settings: BuildSettings, shards: int, jobs: int) -> Iterator[dict[str, Any]]:
    """`write_one_shard` of every shard, in shard order: in this process, or in `jobs` worker processes.

    Workers are spawned (not forked: zarr-python runs an event-loop thread) and each makes the state pool once.
    """
    if jobs == 1:
        yield from (write_one_shard(settings, shard) for shard in range(shards))
        return
    with ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn")) as workers:
        yield from workers.map(write_one_shard, itertools.repeat(settings), range(shards))


def build_store(root: Path, passages: int, per_shard: int, encoding: str, *, seed: int = 0,
                pool_tokens: int = 1 << 18, durable: bool = False, jobs: int = 1) -> dict[str, Any]:
    """Write and finalize a synthetic store of `passages` passages at `root`; return timings and counts.

    jobs: shards written at once, each by its own process. The store's bytes do not depend on it.
    """
    timings: dict[str, Any] = {}
    start = time.perf_counter()
    pool = state_pool(pool_tokens, seed)
    spec = get_encoding(encoding)
    if spec.codebook:
        sample = pool[np.random.default_rng(seed).choice(len(pool), min(len(pool), CODEBOOK_SAMPLE_TOKENS),
                                                          replace=False)]
        codebook = train_codebook(encoding, sample)
        root.mkdir(parents=True, exist_ok=True)
        write_codebook(root / CODEBOOK_DIR, encoding, codebook, (DIM,), generation=GENERATION,
                       fingerprint=fingerprint(encoding))
    else:
        codebook = None
    timings["setup_s"] = time.perf_counter() - start
    settings = BuildSettings(root, passages, per_shard, encoding, seed, pool_tokens, durable, codebook)
    shards = math.ceil(passages / per_shard)
    tokens, cpu_s = 0, 0.0
    start = time.perf_counter()
    for summary in write_shards(settings, shards, jobs):
        tokens += summary["tokens"]
        cpu_s += summary["cpu_s"]
        log(f"  shard {summary['shard'] + 1}/{shards}: {summary['passages']} passages, {summary['bytes'] / 1e6:.0f} MB")
    timings["write_s"] = time.perf_counter() - start
    timings["write_cpu_s"] = cpu_s
    start = time.perf_counter()
    finalize(root, fingerprint(encoding), {"command": "benchmarks/bench_scale.py"}, expected_shards=shards,
             generation=GENERATION)
    timings["finalize_s"] = time.perf_counter() - start
    return {**timings, "passages": passages, "tokens": tokens, "shards": shards, "jobs": jobs}


# ---- disk ----

def projected_store_bytes(passages: int, encoding: str, bytes_per_token: float | None = None) -> float:
    """Disk a synthetic store of `passages` passages will take (an estimate): mean tokens x bytes per token.

    bytes_per_token: measured on a store of this run; without it, the encoding's state bytes plus
    OTHER_BYTES_PER_TOKEN.
    """
    if bytes_per_token is None:
        bytes_per_token = encoding_bytes_per_token(encoding) + OTHER_BYTES_PER_TOKEN
    return passages * MEAN_TOKENS * bytes_per_token


def disk_problem(work_dir: Path, needed_bytes: float, min_free_bytes: float) -> str | None:
    """Why writing `needed_bytes` more under `work_dir` would leave less than `min_free_bytes` free; None if it fits."""
    free = shutil.disk_usage(work_dir).free
    if free - needed_bytes >= min_free_bytes:
        return None
    return (f"{work_dir} has {free / 1e9:.1f} GB free; stores of about {needed_bytes / 1e9:.1f} GB would leave "
            f"{(free - needed_bytes) / 1e9:.1f} GB, less than --min-free-gb {min_free_bytes / 1e9:g}")


# ---- measurements run in a fresh process (`--measure-open ROOT`) ----

def rss_bytes(field: str = "VmRSS") -> int:
    """This process's resident memory from /proc/self/status: VmRSS, or RssAnon / RssFile (mapped files)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) * 1024
    return -1


def measure_open(root: Path, passages: int, lookups: int, fetch: int, seed: int, *,
                 drop_cache: bool = True) -> dict[str, Any]:
    """In this (fresh) process: open time and RSS, id lookups, a cold then a warm fetch.

    drop_cache: drop the page cache first (root only), so the first lookups and fetch read the disk.
    """
    from dilstore.storage.reader import open_store  # imported before the RSS baseline

    rng = np.random.default_rng(seed)
    lookup_ids = [passage_id(i) for i in rng.choice(passages, lookups, replace=False)]
    fetch_ids = [passage_id(i) for i in rng.choice(passages, fetch, replace=False)]
    cold = drop_cache and drop_page_cache()
    rss_before = rss_bytes()
    rss_before_split = {"anon": rss_bytes("RssAnon"), "file": rss_bytes("RssFile")}
    start = time.perf_counter()
    store = open_store(root)
    open_s = time.perf_counter() - start
    rss_open = rss_bytes()
    lookup_s = []
    for label in ("first", "again"):
        start = time.perf_counter()
        found = sum(passage in store for passage in lookup_ids)
        lookup_s.append(time.perf_counter() - start)
        assert found == lookups, f"{lookups - found} ids not found ({label})"
    rss_lookups = rss_bytes()
    rss_lookups_split = {"anon": rss_bytes("RssAnon"), "file": rss_bytes("RssFile")}
    fetched = []
    for label in ("cold", "warm"):
        start = time.perf_counter()
        batch = store.fetch(fetch_ids)
        states = [passage.states.sum() for passage in batch]  # touch every decoded value
        fetched.append(time.perf_counter() - start)
        assert len(states) == fetch
    tokens = int(sum(len(passage.token_ids) for passage in batch))
    return {
        "read_path": store.read_path,
        "page_cache_dropped": cold,
        "open_s": open_s,
        "rss_before_open_bytes": rss_before,
        "rss_after_open_bytes": rss_open,
        "rss_open_delta_bytes": rss_open - rss_before,
        "rss_after_lookups_bytes": rss_lookups,
        "rss_after_lookups_anon_file_bytes": rss_lookups_split,
        "rss_before_open_anon_file_bytes": rss_before_split,
        "rss_after_fetch_bytes": rss_bytes(),
        "shards_opened_by_lookups": len(store._shards),  # noqa: SLF001 - a benchmark may look
        "lookups": lookups,
        "lookup_first_us": lookup_s[0] / lookups * 1e6,
        "lookup_again_us": lookup_s[1] / lookups * 1e6,
        "fetch_passages": fetch,
        "fetch_tokens": tokens,
        "fetch_first_ms": fetched[0] * 1e3,
        "fetch_warm_ms": fetched[1] * 1e3,
        "fetch_first_is_cold": cold,
    }


def run_measure_open(root: Path, passages: int, args: argparse.Namespace) -> dict[str, Any]:
    command = [sys.executable, __file__, "--measure-open", str(root), "--measure-passages", str(passages),
               "--lookups", str(args.lookups), "--fetch", str(args.fetch), "--seed", str(args.seed)]
    done = subprocess.run(command, check=True, capture_output=True, text=True)
    return json.loads(done.stdout)


def run_verify(root: Path) -> dict[str, Any]:
    """`dilstore verify --json` in a subprocess, timed from a dropped page cache where this process may drop it.

    The time includes the command's start (imports, about a second).
    """
    dilstore = Path(sys.executable).with_name("dilstore")
    cold = drop_page_cache()
    start = time.perf_counter()
    done = subprocess.run([str(dilstore), "verify", str(root), "--json"], capture_output=True, text=True)
    seconds = time.perf_counter() - start
    report = json.loads(done.stdout)
    return {"ok": report["ok"], "problems": report["problems"][:5], "exit_code": done.returncode,
            "page_cache_dropped": cold,
            "seconds": seconds, "bytes_checked": report["bytes_checked"], "files_checked": report["files_checked"],
            "passages_per_s": report["passages"] / seconds, "MB_per_s": report["bytes_checked"] / seconds / 1e6}


def disk_sizes(root: Path) -> dict[str, Any]:
    from dilstore.storage.info import store_info

    info = store_info(root)
    index_bytes = sum(path.stat().st_size for path in (root / INDEX_DIR).rglob("*") if path.is_file())
    return {
        "bytes_on_disk": info["bytes_on_disk"],
        "index_bytes": index_bytes,
        "manifest_bytes": (root / MANIFEST_FILE).stat().st_size,
        "bytes_by_part": info["bytes_by_part"],
        "bytes_per_token_by_part": info["bytes_per_token_by_part"],
        "bytes_per_token_total": info["bytes_on_disk"] / info["tokens"],
        "state_bytes_per_token_marginal": info["state_bytes_per_token_marginal"],
    }


# ---- extrapolation and cost ----

def fit(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float]:
    """Least-squares line y = a + b x (b = 0 with one point)."""
    if len(xs) < 2:
        return float(ys[0]), 0.0
    slope, intercept = np.polyfit(np.asarray(xs, dtype=float), np.asarray(ys, dtype=float), 1)
    if slope < 0:  # no growth within the noise: extrapolate the measured mean, flat
        return float(np.mean(ys)), 0.0
    return float(intercept), float(slope)


def encoding_bytes_per_token(encoding: str, state_shape: tuple[int, ...] = (DIM,)) -> int:
    """Per-token state bytes of an encoding, from its array specs (what `dilstore info` calls marginal)."""
    spec = get_encoding(encoding)
    return sum(math.prod(array.shape(state_shape)) * np.dtype(array.dtype).itemsize
               for array in spec.arrays if array.per_token)


def basis(passages: int, measured: Sequence[int]) -> str:
    """Where `passages` lies against the measured N: a fit there is interpolated, or extrapolated how far."""
    if passages <= max(measured):
        return "fit, at a measured N" if passages in measured else "fit, interpolated"
    return f"fit, extrapolated {passages / max(measured):.1f}x past the largest measured N"


def extrapolate(stores: list[dict[str, Any]], per_shard: int) -> dict[str, Any]:
    """Linear fits in N of what was measured, evaluated at the CORPORA sizes (extrapolation, not measured)."""
    ns = [store["passages"] for store in stores]
    fits = {
        "open_s": fit(ns, [store["open"]["open_s"] for store in stores]),
        "rss_open_delta_bytes": fit(ns, [store["open"]["rss_open_delta_bytes"] for store in stores]),
        "index_bytes": fit(ns, [store["disk"]["index_bytes"] for store in stores]),
        "manifest_bytes": fit(ns, [store["disk"]["manifest_bytes"] for store in stores]),
    }
    verified = [store for store in stores if "verify" in store]
    if verified:
        fits["verify_s"] = fit(
            [store["passages"] for store in verified], [store["verify"]["seconds"] for store in verified]
        )
    tokens_per_passage = sum(store["tokens"] for store in stores) / sum(ns)
    bytes_per_token = stores[-1]["disk"]["bytes_per_token_total"]
    rows = {}
    for name, (passages, tokens) in CORPORA.items():
        tokens = tokens if tokens is not None else passages * tokens_per_passage
        rows[name] = {
            "passages": passages, "tokens": tokens, "shards_at_per_shard": math.ceil(passages / per_shard),
            "basis": basis(passages, ns),
            **{key: intercept + slope * passages for key, (intercept, slope) in fits.items()},
            "store_bytes_at_measured_bytes_per_token": tokens * bytes_per_token,
        }
    return {"fits": {key: {"intercept": a, "slope_per_passage": b} for key, (a, b) in fits.items()},
            "measured_passages": sorted(ns), "tokens_per_passage_measured": tokens_per_passage,
            "bytes_per_token_measured": bytes_per_token, "corpora": rows}


def cost_table(tokens_extra: float) -> dict[str, Any]:
    """Derived: state bytes per token of every encoding at d=384 and the state size of each corpus."""
    table = {}
    for encoding in ENCODINGS:
        per_token = encoding_bytes_per_token(encoding)
        table[encoding] = {
            "state_bytes_per_token": per_token,
            "with_token_ids_and_spans": per_token + tokens_extra,
            **{name: (tokens or passages * 80) * (per_token + tokens_extra)
               for name, (passages, tokens) in CORPORA.items()},
        }
    return table


# ---- output ----

def render(result: dict[str, Any]) -> str:
    lines = [
        "MEASURED (each row one store, built and measured in this run):", "",
        "| N passages | shards | tokens | build s (write + finalize) | write passages/s (jobs) | write CPU ms/passage "
        f"| open ms | RSS +open MB | RSS +lookups MB | lookup µs first / again | {fetch_label(result['stores'])} ms "
        "cold / warm | verify s "
        "| verify passages/s | verify MB/s | index MB | manifest KB | B/token total | KB/passage total |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for store in result["stores"]:
        opened, disk, verify = store["open"], store["disk"], store.get("verify")
        cold = f"{opened['fetch_first_ms']:.0f}" + ("" if opened["fetch_first_is_cold"] else " (not cold)")
        build = store["build"]
        cpu = build.get("write_cpu_s")  # absent from results of older versions of this script
        lines.append("| " + " | ".join([
            f"{store['passages']:,}", str(store["shards"]), f"{store['tokens']:,}",
            f"{build['write_s']:.0f} + {build['finalize_s']:.0f}",
            f"{store['passages'] / build['write_s']:,.0f} ({build.get('jobs', 1)})",
            "not recorded" if cpu is None else f"{cpu / store['passages'] * 1e3:.2f}",
            f"{opened['open_s'] * 1e3:.1f}", f"{opened['rss_open_delta_bytes'] / 1e6:.1f}",
            f"{(opened['rss_after_lookups_bytes'] - opened['rss_before_open_bytes']) / 1e6:.1f}",
            f"{opened['lookup_first_us']:.0f} / {opened['lookup_again_us']:.0f}",
            f"{cold} / {opened['fetch_warm_ms']:.0f}",
            *(["not run"] * 3 if verify is None else
              [f"{verify['seconds']:.0f}", f"{verify['passages_per_s']:,.0f}", f"{verify['MB_per_s']:.0f}"]),
            f"{disk['index_bytes'] / 1e6:.2f}", f"{disk['manifest_bytes'] / 1e3:.1f}",
            f"{disk['bytes_per_token_total']:.1f}", f"{disk['bytes_on_disk'] / store['passages'] / 1e3:.2f}",
        ]) + " |")
    extrapolation = result.get("extrapolation")
    if extrapolation:
        measured = extrapolation.get("measured_passages") or sorted(store["passages"] for store in result["stores"])
        lines += ["", f"EXTRAPOLATION (NOT MEASURED: linear fits in N of the measured rows above, N = "
                      f"{', '.join(f'{n:,}' for n in measured)}; store GB at the largest store's B/token):", "",
                  "| corpus | passages | basis | shards | open ms | RSS +open MB | index MB | manifest KB | verify h "
                  "| store GB |",
                  "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|"]
        for name, row in extrapolation["corpora"].items():
            verify = f"{row['verify_s'] / 3600:.1f}" if "verify_s" in row else "not run"
            lines.append(
                f"| {name} | {row['passages']:,} | {row.get('basis', 'fit')} | {row['shards_at_per_shard']} | "
                f"{row['open_s'] * 1e3:.0f} | "
                f"{row['rss_open_delta_bytes'] / 1e6:.0f} | {row['index_bytes'] / 1e6:.0f} | "
                f"{row['manifest_bytes'] / 1e3:.0f} | {verify} | "
                f"{row['store_bytes_at_measured_bytes_per_token'] / 1e9:.0f} |")
    lines += ["", "DERIVED state bytes per token (d=384, from the encodings' array specs) and state + token "
                  "ids/spans size per corpus:", "",
              "| encoding | state B/token | + ids/spans | " + " | ".join(CORPORA) + " |",
              "|---|---:|---:|" + "---:|" * len(CORPORA)]
    for encoding, row in result["cost"].items():
        lines.append(f"| {encoding} | {row['state_bytes_per_token']} | {row['with_token_ids_and_spans']} | "
                     + " | ".join(f"{row[name] / 1e12:.2f} TB" for name in CORPORA) + " |")
    return "\n".join(lines)


def fetch_label(stores: Sequence[Mapping[str, Any]]) -> str:
    """`fetch N`: the passages each store's timed fetch read (--fetch), which the header said was 100 whatever
    --fetch asked (bench53 F7)."""
    counts = sorted({store["open"].get("fetch_passages", 100) for store in stores})
    return "fetch " + " / ".join(f"{count:,}" for count in counts)


def parse_arguments(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--passages", type=positive_int, nargs="+", default=[100_000, 300_000, 1_000_000])
    parser.add_argument("--passages-per-shard", type=positive_int, default=25_000,
                        help="default 25000 (the writer holds a shard's float32 states: ~3 GB here)")
    parser.add_argument("--encoding", default="1bit", choices=sorted(ENCODINGS))
    parser.add_argument("--lookups", type=positive_int, default=100)
    parser.add_argument("--fetch", type=positive_int, default=100)
    parser.add_argument("--seed", type=numpy_seed, default=0)
    parser.add_argument("--pool-tokens", type=positive_int, default=1 << 18)
    parser.add_argument("--verify-max-passages", type=int, default=10_000_000,
                        help="skip the full verify above this N")
    parser.add_argument("--keep", action="store_true", help="keep each store (default: delete it after measuring)")
    parser.add_argument("--jobs", type=int, default=1,
                        help="shards written at once, one process each (default 1; each holds a shard in memory)")
    parser.add_argument("--min-free-gb", type=float, default=15.0,
                        help="refuse a store that would leave less free disk under --work-dir (default 15)")
    parser.add_argument("--work-dir", type=Path, default=Path("/tmp/dilstore-bench-scale"))
    parser.add_argument("--output", type=Path, default=Path("/tmp/bench-scale.json"))
    parser.add_argument("--report-only", type=Path, metavar="JSON", help="print the tables of a saved --output file")
    parser.add_argument("--measure-open", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--measure-passages", type=positive_int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.jobs < 1:
        parser.error(f"--jobs must be at least 1, got {args.jobs}")
    if args.measure_open is None and args.report_only is None:
        problem = run_problem(args)
        if problem:
            parser.error(problem)
    return args


def run_problem(args: argparse.Namespace) -> str | None:
    """What would fail only after a store was built and measured (hours at the largest N), or None.

    Each store's lookups and fetch draw distinct ids, so more than its passages failed in the measuring child
    (a CalledProcessError traceback), and an --output that cannot be written failed when the first store's result
    was saved (a FileNotFoundError traceback) (bench53 F7).
    """
    smallest = min(args.passages)
    if max(args.lookups, args.fetch) > smallest:
        return (f"--lookups {args.lookups} and --fetch {args.fetch} draw distinct ids of each store: give at most "
                f"the smallest --passages ({smallest:,})")  # fmt: skip
    try:
        check_output_file(args.output, "--output", [])
    except DilstoreError as error:
        return str(error)
    return None


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_arguments(argv)
    if args.measure_open is not None:  # the fresh child process
        print(json.dumps(measure_open(args.measure_open, args.measure_passages, args.lookups, args.fetch, args.seed)))
        return 0
    if args.report_only is not None:  # tables again from a saved (possibly partial) result
        result = json.loads(args.report_only.read_text())
        result["extrapolation"] = extrapolate(result["stores"], result["settings"]["passages_per_shard"])
        result["cost"] = cost_table(12)
        print(render(result))
        return 0
    args.work_dir.mkdir(parents=True, exist_ok=True)
    # Stores are deleted after measuring unless --keep: the disk must hold the largest, or all of them.
    needed = (sum if args.keep else max)(projected_store_bytes(n, args.encoding) for n in args.passages)
    problem = disk_problem(args.work_dir, needed, args.min_free_gb * 1e9)
    if problem is not None:
        print(f"bench_scale.py: error: {problem}; measure smaller N or free disk", file=sys.stderr)
        return 2
    result: dict[str, Any] = {
        "started": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "settings": {key: str(value) if isinstance(value, Path) else value for key, value in vars(args).items()
                     if not key.startswith(("measure", "report"))},
        "environment": {"cpu_model": cpu_model(), "cpus": os.cpu_count(), "load_average_at_start": os.getloadavg(),
                        "python": platform.python_version(), "numpy": np.__version__},
        "stores": [],
    }
    for passages in args.passages:
        root = args.work_dir / f"scale-{passages}-{args.encoding}"
        shutil.rmtree(root, ignore_errors=True)
        measured = result["stores"][-1]["disk"]["bytes_per_token_total"] if result["stores"] else None
        problem = disk_problem(args.work_dir, projected_store_bytes(passages, args.encoding, measured),
                               args.min_free_gb * 1e9)
        if problem is not None:  # the stores measured so far are in --output
            print(f"bench_scale.py: error: not building {passages:,} passages: {problem}", file=sys.stderr)
            return 2
        log(f"building {passages:,} passages ({args.encoding}, {args.passages_per_shard:,} per shard, "
            f"{args.jobs} job(s)) at {root}")
        build = build_store(root, passages, args.passages_per_shard, args.encoding, seed=args.seed,
                            pool_tokens=args.pool_tokens, jobs=args.jobs)
        log(f"built: write {build['write_s']:.0f} s, finalize {build['finalize_s']:.0f} s")
        store: dict[str, Any] = {"passages": passages, "tokens": build["tokens"], "shards": build["shards"],
                                 "build": build, "disk": disk_sizes(root)}
        store["open"] = run_measure_open(root, passages, args)
        log(f"open {store['open']['open_s'] * 1e3:.1f} ms, fetch {store['open']['fetch_first_ms']:.0f} / "
            f"{store['open']['fetch_warm_ms']:.0f} ms")
        if passages <= args.verify_max_passages:
            store["verify"] = run_verify(root)
            log(f"verify {store['verify']['seconds']:.0f} s ok={store['verify']['ok']}")
        result["stores"].append(store)
        if not args.keep:
            shutil.rmtree(root)
        args.output.write_text(json.dumps(result, indent=2))  # partial results survive an interruption
    token_extra = 12  # token id int32 + char span 2 x int32 per token
    result["extrapolation"] = extrapolate(result["stores"], args.passages_per_shard)
    result["cost"] = cost_table(token_extra)
    result["environment"]["load_average_at_end"] = os.getloadavg()
    result["wall_s"] = time.perf_counter() - STARTED
    args.output.write_text(json.dumps(result, indent=2))
    print(render(result))
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
