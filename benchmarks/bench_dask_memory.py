"""Precompute on a dask.distributed LocalCluster whose workers have less memory than the states they write.

The question: does `dilstore precompute --runner dask` stream, or does some
worker hold the whole corpus's states? The script

1. saves a small reader with RANDOM weights and MiniLM's width (hidden 384,
   2 layers, k = 1; benchmarks/random_models.py), so the states have the real
   size per token (fp16: 768 bytes) at a fraction of the full model's compute;
2. writes a JSONL corpus (random English words, one token each, one passage
   per document under --split none, in --files files) sized so that its
   stored states are `--state-factor` times the per-worker memory limit, and
   a shard count that keeps one shard's states at 1/32 of the limit (a shard
   is the unit one worker encodes and writes);
3. starts a LocalCluster of 2 worker processes, 1 thread each, with that
   `memory_limit` per worker, and measures each worker's resident memory
   after importing what a precompute worker imports (torch, transformers,
   Beam, dilstore's pipeline);
4. runs `dilstore precompute` on the corpus twice, as a fresh command each
   time: the DirectRunner (2 worker processes, 1 thread each; the cluster
   sits idle meanwhile) and the Dask runner on the cluster
   (`--dask_client_address`), sampling the resident memory (RSS) of every
   process involved every 0.1 s;
5. checks both stores with `dilstore verify` and compares them passage by
   passage: the same ids, titles, texts, token ids and stored states
   (bitwise);
6. collects the Dask workers' and nannies' memory warnings (high unmanaged
   memory, spilling, pausing, restarting a worker over its budget) and checks
   that the worker processes after the run are the ones that started.

Prints a table and JSON (also written to --json-out); exits 1 when a run
failed, ran past --precompute-timeout, or the stores differ. A precompute that
runs past --precompute-timeout (a worker paused at its limit waits for memory
that never frees) is killed with the processes below it, and so is one still
running when the script stops (an error, Ctrl-C, or SIGTERM, which the script
turns into SystemExit for that cleanup): none is left orphaned. Every number is measured on this run; the
model's weights are random, so the run says nothing about quality. The
corpus text itself stays far below the limit (about 6 bytes of JSONL per
token against 768 bytes of fp16 states): a JSONL bigger than a worker's
memory would take hours of encoding on 2 CPUs.

    python benchmarks/bench_dask_memory.py --memory-limit 1.5GiB --state-factor 2 --json-out /tmp/dask-memory.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import platform
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import numpy as np
import psutil
from random_models import write_random_small_reader

from dilstore.runners.arg_types import positive_int
from dilstore.storage.reader import Store, open_store

HIDDEN = 384
# Stored state bytes per token at hidden 384, per encoding (dilbert stores d values per token).
STATE_BYTES_PER_TOKEN = {"fp16": 2 * HIDDEN, "fp32": 4 * HIDDEN}
# One shard's stored states are at most this fraction of the worker limit: while a worker encodes a shard it holds
# the model's float32 outputs, their float32 concatenation and the encoded copy, about 5x the shard's fp16 states.
SHARD_STATES_FRACTION = 1 / 32
WORKERS = 2
SAMPLE_SECONDS = 0.1
MIB = 1 << 20
# Common English words that the uncased WordPiece vocabulary holds whole: one token each.
WORDS = (
    "the river valley city was founded in early century by settlers who built a bridge across water and later "
    "railway station school church market hall museum library garden tower north south east west population grew "
    "during industrial period when factories opened old new small large first second village road house street "
    "park lake mountain forest island coast harbour castle palace king queen war army battle peace trade ship "
    "people family children history music art film book game team club season year month day night"
).split()
# Warnings of dask.distributed's memory manager (worker and nanny): high unmanaged memory, spilling, pausing,
# restarting a worker over its budget.
MEMORY_EVENTS = ("memory", "spill")
EVENT_LEVELS = ("WARNING", "ERROR", "CRITICAL")


def document(number: int, words: int, rng: np.random.Generator) -> dict[str, str]:
    """Document `number`: `{"id", "title", "text"}` with `words` random words from WORDS."""
    return {"id": f"doc-{number:08d}", "title": f"Title {number}", "text": " ".join(rng.choice(WORDS, size=words))}


def write_corpus(directory: Path, documents: int, words: int, files: int, seed: int = 0) -> list[Path]:
    """`documents` documents of `words` words each as JSONL, split into `files` files of consecutive documents."""
    directory.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    bounds = np.linspace(0, documents, files + 1).round().astype(int)
    paths = []
    for part, (first, end) in enumerate(zip(bounds[:-1], bounds[1:], strict=True)):
        path = directory / f"corpus-{part:03d}.jsonl"
        with path.open("w", encoding="utf-8") as writer:
            for number in range(first, end):
                writer.write(json.dumps(document(number, words, rng)) + "\n")
        paths.append(path)
    return paths


def documents_for(state_bytes: int, tokens_per_document: int, encoding: str = "fp16") -> int:
    """How many documents of `tokens_per_document` stored tokens make at least `state_bytes` of `encoding` states."""
    return math.ceil(state_bytes / (tokens_per_document * STATE_BYTES_PER_TOKEN[encoding]))


def shards_for(state_bytes: int, memory_limit: int) -> int:
    """The shard count that keeps one shard's states at SHARD_STATES_FRACTION of the worker limit (at least 2)."""
    return max(2, math.ceil(state_bytes / (memory_limit * SHARD_STATES_FRACTION)))


def process_tree(pid: int) -> list[int]:
    """`pid` and every process below it (none when it has ended)."""
    try:
        root = psutil.Process(pid)
        return [pid, *(child.pid for child in root.children(recursive=True))]
    except psutil.NoSuchProcess:
        return []


class PeakRss:
    """The peak resident memory of a changing set of processes, sampled in a thread every `interval` seconds.

    `processes()` names the processes to sample, `{pid: role}`; it is asked
    again at every sample, so processes started during the run are caught.
    A process that has ended is skipped. Use as a context manager.
    """

    def __init__(self, processes: Callable[[], dict[int, str]], interval: float = SAMPLE_SECONDS) -> None:
        self.processes = processes
        self.interval = interval
        self.peaks: dict[int, tuple[str, int]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="peak-rss", daemon=True)

    def sample(self) -> None:
        """Read every named process's RSS once and keep the largest seen per process (role with the process name)."""
        for pid, role in self.processes().items():
            try:
                process = psutil.Process(pid)
                rss, name = process.memory_info().rss, process.name()
            except psutil.NoSuchProcess:
                continue
            label = f"{role} ({name})"
            self.peaks[pid] = (label, max(rss, self.peaks.get(pid, (label, 0))[1]))

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.sample()

    def __enter__(self) -> PeakRss:
        self.sample()
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join()
        self.sample()

    def report(self) -> list[dict[str, Any]]:
        """`{"pid", "role", "peak_rss_bytes"}` per process, by role then pid."""
        rows = [{"pid": pid, "role": role, "peak_rss_bytes": rss} for pid, (role, rss) in self.peaks.items()]
        return sorted(rows, key=lambda row: (row["role"], row["pid"]))


def dilstore_command(arguments: Sequence[str]) -> list[str]:
    """The command line running `dilstore ARGS` with this Python."""
    return [sys.executable, "-m", "dilstore.runners.cli", *arguments]


def kill_tree(process: subprocess.Popen[str]) -> None:
    """Kill `process` (not yet reaped) and every process below it, which would outlive it as orphans (a
    DirectRunner's workers) and keep its pipes open, and wait for them."""
    try:
        below = psutil.Process(process.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        below = []
    process.kill()
    for child in below:
        with contextlib.suppress(psutil.NoSuchProcess):
            child.kill()
    psutil.wait_procs(below, timeout=10)
    process.wait()


def run_precompute(
    arguments: Sequence[str], roles: Callable[[int], dict[int, str]], timeout: float
) -> dict[str, Any]:
    """Run `dilstore precompute ARGS --json` as a fresh process while sampling RSS; rc, wall time, summary, peaks.

    `roles(launcher_pid)` names the processes to sample while it runs. Past `timeout` seconds the process and those
    below it are killed and the run says so (`timed_out_s`); on any exception meanwhile (SIGTERM's SystemExit
    included) they are killed before it propagates.
    """
    started = time.perf_counter()
    timed_out = None
    process = subprocess.Popen(
        dilstore_command(["precompute", *arguments, "--json", "--no-progress"]),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        with PeakRss(lambda: roles(process.pid)) as sampler:
            stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_tree(process)
        stdout, stderr = process.communicate()
        timed_out = timeout
        runner = arguments[arguments.index("--runner") + 1]
        print(f"bench_dask_memory: error: dilstore precompute --runner {runner} ran past --precompute-timeout "
              f"{timeout:g} s; killed it and the processes below it", file=sys.stderr, flush=True)  # fmt: skip
    finally:
        if process.poll() is None:
            kill_tree(process)
    wall = time.perf_counter() - started
    try:
        summary = json.loads(stdout) if process.returncode == 0 else {}
    except json.JSONDecodeError:
        summary = {}
    return {
        "rc": process.returncode,
        "timed_out_s": timed_out,
        "wall_s": round(wall, 2),
        "summary": summary,
        "processes": sampler.report(),
        "stderr_tail": stderr.strip().splitlines()[-5:],
    }


def verify_rc(store: Path) -> int:
    """The exit status of `dilstore verify STORE` (0: sound)."""
    return subprocess.run(dilstore_command(["verify", str(store)]), capture_output=True).returncode


def store_ids(store: Store) -> list[str]:
    """Every passage id the store's shards hold, shard by shard in row order."""
    ids = []
    for entry in store.manifest.shards:
        reader = store.shard(entry.index)
        ids.extend(reader.id_at(row) for row in range(reader.attributes.passages))
    return ids


def compare_stores(left: Path, right: Path, chunk: int = 256) -> dict[str, Any]:
    """Passage by passage: the same ids, titles, texts and token ids, and the same stored states bitwise.

    Fetches `chunk` passages at a time from each store, so it holds no more
    than that many passages' states. `max_abs_difference` is over the states
    as float32 (0.0 when bitwise equal).
    """
    with open_store(left) as first, open_store(right) as second:
        left_ids, right_ids = store_ids(first), store_ids(second)
        shared = sorted(set(left_ids) & set(right_ids))
        differing: list[str] = []
        largest = 0.0
        for start in range(0, len(shared), chunk):
            ids = shared[start : start + chunk]
            for one, other in zip(first.fetch(ids), second.fetch(ids), strict=True):
                same_text = (one.title, one.text) == (other.title, other.text)
                same_tokens = np.array_equal(one.token_ids, other.token_ids)
                same_shape = one.states.shape == other.states.shape
                if same_shape:
                    gap = np.abs(np.asarray(one.states, np.float32) - np.asarray(other.states, np.float32))
                    largest = max(largest, float(gap.max(initial=0.0)))
                if not (same_text and same_tokens and same_shape and np.array_equal(one.states, other.states)):
                    differing.append(one.id)
    ids_equal = sorted(left_ids) == sorted(right_ids) and len(set(left_ids)) == len(left_ids)
    return {
        "passages": len(left_ids),
        "ids_equal": ids_equal,
        "differing_passages": len(differing),
        "first_differing": differing[:3],
        "max_abs_difference": largest,
        "equal": ids_equal and not differing,
    }


def state_bytes(store: Path) -> int:
    """Bytes of every shard's `states/` arrays on disk."""
    return sum(path.stat().st_size for path in store.glob("shards/*/states/**/*") if path.is_file())


def tree_bytes(folder: Path) -> int:
    """Bytes of every file under `folder`."""
    return sum(path.stat().st_size for path in folder.rglob("*") if path.is_file())


def stored_facts(store: Path) -> dict[str, int]:
    """A store's state bytes and total bytes on disk, and the exit status of `dilstore verify` on it."""
    return {"state_bytes": state_bytes(store), "store_bytes": tree_bytes(store), "verify_rc": verify_rc(store)}


def imported_rss() -> int:
    """This process's RSS after importing what a precompute worker imports (run in each Dask worker)."""
    import apache_beam  # noqa: F401
    import torch  # noqa: F401
    import transformers  # noqa: F401

    import dilstore.pipelines.precompute  # noqa: F401

    return psutil.Process().memory_info().rss


def memory_events(logs: dict[str, Sequence[tuple[str, str]]]) -> list[str]:
    """The warnings about memory (level and first line), from `Client.get_worker_logs()`-shaped logs, oldest first."""
    return [
        f"{address}: {level} {message.splitlines()[0][:200]}"
        for address, lines in logs.items()
        for level, message in reversed(lines)
        if level in EVENT_LEVELS and any(word in message.lower() for word in MEMORY_EVENTS)
    ]


def precompute_arguments(inputs: Sequence[Path], model: Path, store: Path, plan: Plan) -> list[str]:
    """The precompute flags both runs share: one passage per document, the plan's encoding and shards, 1 thread."""
    flags = [flag for path in inputs for flag in ("--input", str(path))]
    return [*flags, "--output", str(store), "--model", str(model), "--split", "none", "--encoding", plan.encoding,
            "--max-length", str(plan.max_length), "--shards", str(plan.shards), "--threads", "1"]  # fmt: skip


def run_direct(arguments: Sequence[str], timeout: float) -> dict[str, Any]:
    """The DirectRunner run: 2 worker processes (multi_processing), sampled with the launcher; at most `timeout` s."""

    def roles(launcher: int) -> dict[int, str]:
        return {pid: "launcher" if pid == launcher else "direct worker" for pid in process_tree(launcher)}

    return run_precompute([*arguments, "--runner", "direct", "--workers", str(WORKERS)], roles, timeout)


def run_dask(arguments: Sequence[str], address: str, worker_pids: Sequence[int], timeout: float) -> dict[str, Any]:
    """The Dask run on the cluster at `address`, sampling its workers and the launcher; at most `timeout` s."""

    def roles(launcher: int) -> dict[int, str]:
        return {**{pid: "dask worker" for pid in worker_pids}, **{pid: "launcher" for pid in process_tree(launcher)}}

    return run_precompute([*arguments, "--runner", "dask", "--dask_client_address", address], roles, timeout)


def parse_arguments(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--memory-limit", default="1.5GiB", help="dask memory_limit per worker (default 1.5GiB)")
    parser.add_argument("--state-factor", type=float, default=2.0,
                        help="stored states as a multiple of the per-worker limit (default 2)")
    parser.add_argument("--encoding", choices=sorted(STATE_BYTES_PER_TOKEN), default="fp16",
                        help="state encoding; fp32 stores twice the bytes for the same compute (default fp16)")
    parser.add_argument("--words", type=int, default=120, help="words per document, one token each (default 120)")
    parser.add_argument("--files", type=int, default=4, help="corpus JSONL files (default 4)")
    parser.add_argument("--work-dir", type=Path,
                        help="folder for the model, corpus and both stores, kept afterwards (default: a temporary "
                             "folder, removed)")
    parser.add_argument("--json-out", type=Path, help="also write the JSON result here")
    parser.add_argument("--precompute-timeout", type=positive_int, default=3600, metavar="SECONDS",
                        help="kill a precompute run (and fail) past this many seconds (default 3600)")
    args = parser.parse_args(argv)
    if args.state_factor <= 0 or args.words < 1 or args.files < 1:
        parser.error("--state-factor must be > 0, --words and --files >= 1")
    try:
        from dask.utils import parse_bytes

        args.limit = parse_bytes(args.memory_limit)
    except ValueError as error:
        parser.error(f"--memory-limit {args.memory_limit!r}: {error}")
    return args


@dataclass(frozen=True)
class Plan:
    """The corpus and store one measurement makes: sized from the worker limit and the state factor."""

    documents: int
    words: int
    shards: int
    encoding: str
    state_target: int

    @property
    def tokens_per_document(self) -> int:
        return self.words + 1  # p [SEP], one token per word

    @property
    def max_length(self) -> int:
        return self.words + 8  # room to spare: no document is split into windows


def plan_for(limit: int, state_factor: float, words: int, encoding: str) -> Plan:
    """Enough documents for `state_factor` x `limit` bytes of stored states, and shards of 1/32 of the limit each."""
    target = math.ceil(state_factor * limit)
    return Plan(documents=documents_for(target, words + 1, encoding), words=words, shards=shards_for(target, limit),
                encoding=encoding, state_target=target)  # fmt: skip


def run_both(
    inputs: Sequence[Path], model: Path, work: Path, plan: Plan, limit: int, timeout: float
) -> dict[str, Any]:
    """Start the LocalCluster, measure its workers after imports, run Direct and then Dask; runs and cluster facts.

    The DirectRunner runs while the cluster's workers sit idle, so both runs
    see the same machine; the Dask workers have their imports done by then.
    """
    import dask
    from distributed import LocalCluster

    with LocalCluster(n_workers=WORKERS, threads_per_worker=1, processes=True, memory_limit=limit,
                      dashboard_address=":0") as cluster, cluster.get_client() as client:  # fmt: skip
        baseline = client.run(imported_rss)
        if max(baseline.values()) >= limit:
            raise SystemExit(f"bench_dask_memory: the memory limit ({limit / MIB:.0f} MiB) is below a worker's RSS "
                             f"after imports ({max(baseline.values()) / MIB:.0f} MiB); raise --memory-limit")
        started = client.run(os.getpid)
        direct = run_direct(precompute_arguments(inputs, model, work / "store-direct", plan), timeout)
        arguments = precompute_arguments(inputs, model, work / "store-dask", plan)
        on_dask = run_dask(arguments, cluster.scheduler_address, list(started.values()), timeout)
        ended = client.run(os.getpid)
        limits = [info["memory_limit"] for info in client.scheduler_info()["workers"].values()]
        events = memory_events(client.get_worker_logs()) + memory_events(client.get_worker_logs(nanny=True))
    cluster_facts = {"workers": WORKERS, "threads_per_worker": 1, "memory_limit_bytes": limit,
                     "memory_limit_seen_by_scheduler": sorted(limits),
                     "memory_thresholds": dask.config.get("distributed.worker.memory"),
                     "worker_rss_after_imports_bytes": sorted(baseline.values()),
                     "same_worker_processes_after_run": sorted(started.items()) == sorted(ended.items()),
                     "memory_events": events}  # fmt: skip
    return {"dask": cluster_facts, "runs": {"direct": direct, "dask": on_dask}}


def measure(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """The whole measurement in folder `work` (see the module docstring); the JSON result."""
    plan = plan_for(args.limit, args.state_factor, args.words, args.encoding)
    model = write_random_small_reader(work / "model")
    inputs = write_corpus(work / "corpus", plan.documents, plan.words, args.files)
    result = run_both(inputs, model, work, plan, args.limit, args.precompute_timeout)
    stores = {"direct": work / "store-direct", "dask": work / "store-dask"}
    done = all(run["rc"] == 0 for run in result["runs"].values())
    return {
        "model": "RANDOM weights: BERT, hidden 384, 12 heads, FFN 1536, 2 layers, k=1, MiniLM tokenizer",
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version()},
        "corpus": {"documents": plan.documents, "files": len(inputs), "words_per_document": plan.words,
                   "tokens_per_document": plan.tokens_per_document,
                   "bytes": sum(path.stat().st_size for path in inputs)},
        "shards": plan.shards,
        "encoding": plan.encoding,
        "state_target_bytes": plan.state_target,
        **result,
        "stored": {name: stored_facts(path) for name, path in stores.items() if path.is_dir()},
        "comparison": compare_stores(stores["direct"], stores["dask"]) if done else None,
    }  # fmt: skip


def mib(value: int) -> str:
    return f"{value / MIB:,.0f}"


def render(result: dict[str, Any]) -> str:
    """The result as an aligned table."""
    dask, corpus = result["dask"], result["corpus"]
    limit = dask["memory_limit_bytes"]
    lines = [
        f"model     {result['model']}",
        f"corpus    {corpus['documents']:,} documents x {corpus['tokens_per_document']} tokens, "
        f"{mib(corpus['bytes'])} MiB JSONL in {corpus['files']} files; {result['shards']} shards",
        f"dask      {dask['workers']} workers x 1 thread, memory_limit {mib(limit)} MiB each; "
        f"RSS after imports {', '.join(mib(rss) for rss in dask['worker_rss_after_imports_bytes'])} MiB",
        "",
        f"{'run':<8}{'rc':>4}{'wall s':>9}{'states MiB':>12}{'x limit':>9}{'verify':>8}  peak RSS MiB per process",
    ]
    for name, run in result["runs"].items():
        stored = result["stored"].get(name, {"state_bytes": 0, "verify_rc": None})
        peaks = ", ".join(f"{row['role']} {mib(row['peak_rss_bytes'])}" for row in run["processes"])
        lines.append(
            f"{name:<8}{run['rc']:>4}{run['wall_s']:>9.1f}{mib(stored['state_bytes']):>12}"
            f"{stored['state_bytes'] / limit:>9.2f}{str(stored['verify_rc']):>8}  {peaks}"
        )
    lines += [f"{name:<8}killed: ran past --precompute-timeout {run['timed_out_s']:g} s"
              for name, run in result["runs"].items() if run["timed_out_s"] is not None]  # fmt: skip
    comparison = result["comparison"]
    if comparison is None:
        lines.append("equal     not compared: a run failed")
    else:
        lines.append(f"equal     {'yes' if comparison['equal'] else 'NO'}: {comparison['passages']:,} passages, "
                     f"{comparison['differing_passages']} differing, max |difference| "
                     f"{comparison['max_abs_difference']:g}")  # fmt: skip
    lines.append(f"workers   the same processes before and after the run: "
                 f"{'yes' if dask['same_worker_processes_after_run'] else 'NO (a worker was restarted)'}; "
                 f"memory events in worker/nanny logs: {len(dask['memory_events'])}")  # fmt: skip
    lines += [f"          {event}" for event in dask["memory_events"][:10]]
    return "\n".join(lines)


@contextlib.contextmanager
def work_folder(folder: Path | None) -> Iterator[Path]:
    """`folder`, made and kept; or, when it is None, a temporary folder removed afterwards."""
    if folder is not None:
        folder.mkdir(parents=True, exist_ok=True)
        yield folder
        return
    with tempfile.TemporaryDirectory(prefix="bench-dask-memory-") as temporary:
        yield Path(temporary)


def exit_on_sigterm(number: int, _frame: object) -> NoReturn:
    """SIGTERM as SystemExit (status 128 + 15), so that `finally` blocks run: the precompute child is killed and
    the cluster closed rather than left running, as SIGTERM's default action (ending at once) left them."""
    raise SystemExit(128 + number)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_arguments(argv)
    previous = signal.signal(signal.SIGTERM, exit_on_sigterm)
    try:
        with work_folder(args.work_dir) as work:
            result = measure(args, work)
    finally:
        signal.signal(signal.SIGTERM, previous)
    print(render(result))
    text = json.dumps(result, indent=1, default=str)
    print(text)
    if args.json_out is not None:
        args.json_out.write_text(text + "\n", encoding="utf-8")
    runs_ok = all(run["rc"] == 0 for run in result["runs"].values())
    return 0 if runs_ok and result["comparison"] and result["comparison"]["equal"] else 1


if __name__ == "__main__":
    sys.exit(main())
