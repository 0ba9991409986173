"""The commands a user waits on, timed end to end for two source trees side by side: cold `ask`, `serve`'s start
and warm /ask latency, a small `precompute`, and `info`.

Each tree is a checkout of dilstore with the layer links (`dilstore/storage -> ../storage`, and so on), run as
`python -m dilstore` with PYTHONPATH=TREE, so that the code before a change and after it are timed in one run on
one machine, alternating tree by tree within each repeat (a loaded machine slows both alike). Each tree runs
every command once first, unmeasured, which also writes its bytecode caches (a user's install has them). The
median of `--repeats` runs of each is reported, with each tree's ratio to the first.

    git clone -q . /tmp/before && git -C /tmp/before checkout -q REV && \
        for l in storage reader pipelines runners; do ln -sfn ../$l /tmp/before/dilstore/$l; done
    .venv/bin/python benchmarks/bench_trees.py --trees /tmp/before . --store /tmp/store --threads 1
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from dilstore.runners.arg_types import absolute_path, positive_int

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_PASSAGES = ROOT.parent / "shared" / "data" / "msmarco" / "passages.dl19-dl20-pool.jsonl"
DEFAULT_QUESTIONS = ROOT.parent / "shared" / "data" / "opensquad" / "questions.dev-v1.1.jsonl"
START_TIMEOUT = 300.0
# Requests to the server this script starts go to it, never through a proxy that HTTP_PROXY names (port58 F8).
_LOCAL = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trees", type=Path, nargs="+", required=True, help="source trees, the first the baseline")
    # Absolute: every command runs in its tree's folder (bench53 F8).
    parser.add_argument("--store", type=absolute_path, required=True,
                        help="a dilbert store with its BM25 index (read only)")  # fmt: skip
    parser.add_argument("--question", default="When did the Zurich tram network open?")
    parser.add_argument("--questions", type=Path, default=DEFAULT_QUESTIONS, help="JSONL questions for /ask")
    parser.add_argument("--requests", type=positive_int, default=20, help="warm /ask requests per server")
    parser.add_argument("--passages", type=Path, default=DEFAULT_PASSAGES, help="JSONL passages for precompute")
    parser.add_argument("--precompute-passages", type=positive_int, default=300)
    parser.add_argument("--repeats", type=positive_int, default=3)
    parser.add_argument("--threads", type=positive_int, default=1)
    parser.add_argument("--json-out", type=Path)
    args = parser.parse_args(argv)
    for tree in args.trees:
        if not (tree / "dilstore" / "storage").exists():
            parser.error(f"{tree} has no dilstore/storage link: make the layer links (see the docstring)")
    return args


def tree_env(tree: Path) -> dict[str, str]:
    """The environment a tree's commands run in: its code first on the path, bytecode caches written and used."""
    env = {key: value for key, value in os.environ.items() if key != "PYTHONDONTWRITEBYTECODE"}
    return {**env, "PYTHONPATH": str(tree.resolve()), "OMP_NUM_THREADS": "1"}


def timed(command: list[str], tree: Path) -> float:
    """Seconds `python -m dilstore COMMAND` takes with `tree`'s code; an error if it fails."""
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "dilstore", *command], env=tree_env(tree), cwd=tree,
                          capture_output=True, text=True)  # fmt: skip
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"{tree}: dilstore {' '.join(command)} failed ({done.returncode}): {done.stderr[-2000:]}")
    return seconds


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def serve_once(tree: Path, args: argparse.Namespace, questions: list[str]) -> dict[str, float]:
    """Start `serve` on the store, time it to the first /health 200, then time `--requests` /ask one at a time."""
    port = free_port()
    started = time.perf_counter()
    server = subprocess.Popen([sys.executable, "-m", "dilstore", "serve", str(args.store), "--port", str(port),
                               "--threads", str(args.threads)], env=tree_env(tree), cwd=tree,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        ready = _wait_ready(port, server, started)
        latencies = []
        for question in questions[: args.requests]:
            body = json.dumps({"question": question}).encode("utf-8")
            request = urllib.request.Request(f"http://127.0.0.1:{port}/ask", data=body,
                                             headers={"Content-Type": "application/json"})  # fmt: skip
            sent = time.perf_counter()
            with _LOCAL.open(request, timeout=120) as response:
                response.read()
            latencies.append(time.perf_counter() - sent)
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=60)
    return {"serve_ready_s": ready, "ask_p50_ms": 1000 * statistics.median(latencies)}


def _wait_ready(port: int, server: subprocess.Popen[bytes], started: float) -> float:
    """Seconds from the start until /health answers 200; an error if the server exits or never answers."""
    while time.perf_counter() - started < START_TIMEOUT:
        if server.poll() is not None:
            raise SystemExit(f"the server exited with {server.returncode} before answering /health")
        try:
            with _LOCAL.open(f"http://127.0.0.1:{port}/health", timeout=5) as response:
                if response.status == 200:
                    return time.perf_counter() - started
        except OSError:
            time.sleep(0.05)
    raise SystemExit(f"no /health answer within {START_TIMEOUT:.0f} s")


def one_round(tree: Path, args: argparse.Namespace, questions: list[str], corpus: Path) -> dict[str, float]:
    """Every measurement of one tree, once."""
    threads = ["--threads", str(args.threads)]
    output = Path(tempfile.mkdtemp(prefix="bench-trees-"))
    try:
        precompute = timed(["precompute", "--input", str(corpus), "--split", "none", "--workers", "1", *threads,
                            "--output", str(output / "store"), "--no-progress"], tree)  # fmt: skip
    finally:
        shutil.rmtree(output, ignore_errors=True)
    return {
        "ask_cold_s": timed(["ask", str(args.store), args.question, *threads, "--json"], tree),
        "info_s": timed(["info", str(args.store)], tree),
        "precompute_s": precompute,
        **serve_once(tree, args, questions),
    }


def served_questions(path: Path, requests: int) -> list[str]:
    """The first `requests` questions of `path`, one /ask each; a SystemExit naming the file when it holds fewer.

    Only the first 200 lines were read, so `--requests 500` timed 200 requests while the report said 500, and a
    file of 20 questions gave 20 whatever --requests asked (bench53 F13).
    """
    try:
        questions = [json.loads(line)["question"] for line in path.read_text("utf-8").splitlines()[:requests]]
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError) as error:
        raise SystemExit(f"bench_trees: error: --questions {path}: not JSONL with a \"question\" per line ({error})")
    if len(questions) < requests:
        raise SystemExit(f"bench_trees: error: --questions {path} holds {len(questions)} questions; --requests asks "
                         f"for {requests}")  # fmt: skip
    return questions


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    questions = served_questions(args.questions, args.requests)
    with tempfile.TemporaryDirectory(prefix="bench-trees-corpus-") as folder:
        corpus = Path(folder) / "passages.jsonl"
        lines = args.passages.read_text(encoding="utf-8").splitlines()[: args.precompute_passages]
        corpus.write_text("\n".join(lines) + "\n", encoding="utf-8")
        for tree in args.trees:  # unmeasured: bytecode caches, the page cache
            one_round(tree, args, questions, corpus)
        runs: dict[str, list[dict[str, float]]] = {str(tree): [] for tree in args.trees}
        for repeat in range(args.repeats):
            for tree in args.trees:
                runs[str(tree)].append(one_round(tree, args, questions, corpus))
                print(f"repeat {repeat + 1}/{args.repeats} {tree}: {runs[str(tree)][-1]}", file=sys.stderr)
    report = summary(args, runs)
    print_table(report)
    print(json.dumps(report))
    if args.json_out:
        args.json_out.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    return 0


def summary(args: argparse.Namespace, runs: dict[str, list[dict[str, float]]]) -> dict[str, Any]:
    """Medians per tree and measure, each tree's ratio to the first, and the raw runs."""
    medians = {tree: {key: statistics.median(run[key] for run in rounds) for key in rounds[0]}
               for tree, rounds in runs.items()}  # fmt: skip
    base = medians[str(args.trees[0])]
    return {
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count(), "platform": platform.platform()},
        "settings": {"store": str(args.store), "question": args.question, "requests": args.requests,
                     "precompute_passages": args.precompute_passages, "repeats": args.repeats,
                     "threads": args.threads},  # fmt: skip
        "medians": medians,
        "ratios": {tree: {key: value / base[key] for key, value in row.items()} for tree, row in medians.items()},
        "runs": runs,
    }


def print_table(report: dict[str, Any]) -> None:
    keys = list(next(iter(report["medians"].values())))
    print("| tree | " + " | ".join(keys) + " |")
    print("|---|" + "---:|" * len(keys))
    for tree, row in report["medians"].items():
        ratios = report["ratios"][tree]
        print(f"| {tree} | " + " | ".join(f"{row[key]:.3f} (×{ratios[key]:.2f})" for key in keys) + " |")


if __name__ == "__main__":
    sys.exit(main())
