"""Load test of `dilstore serve`: throughput and latency percentiles at several concurrencies, batching on and off.

For each mode (batching on: `--max-batch-pairs` of the server's default;
off: `--max-batch-pairs 1`) the script starts `dilstore serve STORE` on
127.0.0.1 (port 0), waits for /health, warms it up, and then, for each
concurrency c, runs c closed-loop clients (bounded async httpx) that POST
/ask until `--requests` answers (at least c) have come back or
`--seconds` have passed. It reports answers per second, p50/p95/p99 latency
and every status code seen, then stops the server with SIGTERM and checks
that it exits 0.

Past the queue bound: one more server with `--queue-size` `--overload-queue`
gets `--overload-requests` requests from `--overload-clients` clients at once;
the 200s and 503s are counted, and /health must answer 200 afterwards.

Beside them, the CLI: `dilstore ask STORE --json` answering `--cli-questions`
questions from stdin in one process, its wall time (start-up included) and
the median per-question `timings.total`.

Only 127.0.0.1 is contacted, and every phase is bounded in requests and time.

    .venv/bin/dilstore precompute --output /tmp/serve-store --workers 1 && .venv/bin/dilstore index /tmp/serve-store
    .venv/bin/python benchmarks/bench_serve.py --store /tmp/serve-store --threads 1 --top-p 10
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import platform
import re
import statistics
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
from script_errors import one_line_errors

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the test fixtures' ServeProcess, as `python benchmarks/bench_serve.py` runs it

from dilstore.runners.arg_types import absolute_path, positive_int  # noqa: E402
from dilstore.runners.outputs import check_output_option  # noqa: E402
from dilstore.storage.errors import DilstoreError  # noqa: E402
from tests.fixtures.serve_process import ServeProcess  # noqa: E402

DEFAULT_QUESTIONS = ROOT.parent / "shared" / "data" / "opensquad" / "questions.dev-v1.1.jsonl"
FALLBACK_QUESTIONS = [
    "Which Carolina Panthers player was named Most Valuable Player?",
    "In what year did Nikola Tesla emigrate to the United States?",
    "How long did Project Apollo run?",
    "What is the name of the property that designates a number as being prime or not?",
]
START_TIMEOUT = 600.0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    # Absolute: the server and the CLI run in the repository's folder (bench53 F8).
    parser.add_argument("--store", type=absolute_path, required=True, help="a dilbert store with its BM25 index")
    parser.add_argument("--model", type=absolute_path, help="the store's model (default: the shipped reader)")
    parser.add_argument("--questions", type=Path,
                        help="DPR-style JSONL questions (default: the shared OpenSQuAD dev questions, where present)")
    parser.add_argument("--concurrency", type=positive_int, nargs="+", default=[1, 4, 16, 64])
    parser.add_argument(
        "--requests", type=positive_int, default=64, help="answers per level (at least the concurrency)"
    )
    parser.add_argument("--seconds", type=float, default=120.0, help="time limit per level")
    parser.add_argument("--top-p", type=positive_int, default=10)
    parser.add_argument("--threads", type=positive_int, default=1, help="torch threads of the server and the CLI")
    parser.add_argument("--max-batch-pairs", type=positive_int, default=256, help="the batching-on setting")
    parser.add_argument("--max-wait-ms", type=float, default=10.0)
    parser.add_argument("--warmup", type=int, default=4, help="requests before each mode's levels")
    parser.add_argument("--overload-queue", type=positive_int, default=8)
    parser.add_argument("--overload-clients", type=positive_int, default=64)
    parser.add_argument("--overload-requests", type=positive_int, default=128)
    parser.add_argument("--cli-questions", type=positive_int, default=8)
    parser.add_argument("--json-out", type=Path, help="also write the JSON report here")
    args = parser.parse_args(argv)
    check_output_option(parser, args.json_out, "--json-out")
    return args


def load_questions(path: Path | None) -> tuple[list[str], str]:
    """The distinct questions of --questions and where they came from; without --questions, those of the shared
    OpenSQuAD dev file, or four fixed ones about the default corpus where it is absent (said on stderr and in the
    report).

    A --questions that is no file gave the four fixed ones too, silently: every level cycled 4 questions, and the
    CLI answered 4 whatever --cli-questions asked (bench53 F3).
    """
    if path is None and not DEFAULT_QUESTIONS.is_file():
        print(f"bench_serve: no {DEFAULT_QUESTIONS}: asking {len(FALLBACK_QUESTIONS)} built-in questions about the "
              "default corpus", file=sys.stderr)  # fmt: skip
        return FALLBACK_QUESTIONS, f"{len(FALLBACK_QUESTIONS)} built-in questions about the default corpus"
    path = path or DEFAULT_QUESTIONS
    if not path.is_file():
        raise DilstoreError(f"--questions {path}: no such file")
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
        questions = list(dict.fromkeys(json.loads(line)["question"] for line in lines if line.strip()))
    except (UnicodeDecodeError, ValueError, KeyError, TypeError) as error:
        raise DilstoreError(f"--questions {path}: not DPR-style JSONL with a \"question\" per line ({error})") from None
    if not questions:
        raise DilstoreError(f"--questions {path} holds no questions")
    return questions, str(path)


def start_server(args: argparse.Namespace, *extra: str) -> ServeProcess:
    """`dilstore serve` over --store with the benchmark's threads and model, plus `extra` options."""
    options = [str(args.store), "--threads", str(args.threads), *extra]
    if args.model:
        options += ["--model", str(args.model)]
    try:
        return ServeProcess(options, timeout=START_TIMEOUT, cwd=ROOT)
    except RuntimeError as error:
        raise SystemExit(str(error)) from None


async def load(url: str, questions: list[str], top_p: int, clients: int, requests: int, seconds: float) -> dict:
    """`clients` closed-loop clients until `requests` answers or `seconds`: throughput, percentiles, codes."""
    latencies: list[float] = []
    codes: Counter[str] = Counter()
    issued = 0
    deadline = time.perf_counter() + seconds
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)

    async def client(session: httpx.AsyncClient) -> None:
        nonlocal issued
        while issued < requests and time.perf_counter() < deadline:
            question = questions[issued % len(questions)]
            issued += 1
            sent = time.perf_counter()
            try:
                response = await session.post("/ask", json={"question": question, "top_p": top_p})
                codes[str(response.status_code)] += 1
                if response.status_code == 200:
                    latencies.append(time.perf_counter() - sent)
            except httpx.HTTPError as error:
                codes[type(error).__name__] += 1

    started = time.perf_counter()
    async with httpx.AsyncClient(base_url=url, timeout=seconds + 60, limits=limits) as session:
        await asyncio.gather(*(client(session) for _ in range(clients)))
    wall = time.perf_counter() - started
    return {
        "clients": clients,
        "answered": len(latencies),
        "seconds": wall,
        "throughput": len(latencies) / wall,
        **{f"p{q}": percentile(latencies, q) for q in (50, 95, 99)},
        "codes": dict(codes),
    }


def percentile(values: list[float], q: float) -> float | None:
    """The q-th percentile (nearest rank) of values, in seconds."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


def run_mode(args: argparse.Namespace, questions: list[str], batch_pairs: int) -> dict[str, Any]:
    """One server with `--max-batch-pairs batch_pairs`, every concurrency level, then SIGTERM."""
    server = start_server(args, "--max-batch-pairs", str(batch_pairs), "--max-wait-ms", str(args.max_wait_ms))
    try:
        asyncio.run(load(server.url, questions[::-1], args.top_p, 1, args.warmup, args.seconds))
        levels = []
        for clients in args.concurrency:
            level = asyncio.run(load(server.url, questions, args.top_p, clients, max(args.requests, clients),
                                     args.seconds))  # fmt: skip
            print(f"  max-batch-pairs {batch_pairs}, {clients} clients: {level['throughput']:.2f} answers/s, "
                  f"codes {level['codes']}", file=sys.stderr)  # fmt: skip
            levels.append(level)
        metrics = httpx.get(server.url + "/metrics", timeout=60).text
    finally:
        status = server.stop()
    return {"max_batch_pairs": batch_pairs, "start_seconds": server.start_seconds, "levels": levels,
            "batches": batch_totals(metrics), "exit_status": status}  # fmt: skip


def batch_totals(metrics: str) -> dict[str, float]:
    """Batches run and requests and pairs in them, from the server's /metrics."""
    totals = {}
    for name in ("batch_requests_count", "batch_requests_sum", "batch_pairs_sum"):
        match = re.search(rf"^dilstore_{name}{{[^}}]*}} (\S+)$", metrics, re.MULTILINE)
        totals[name] = float(match.group(1)) if match else 0.0
    return totals


def run_overload(args: argparse.Namespace, questions: list[str]) -> dict[str, Any]:
    """A server with a small queue under a burst: how many 200s and 503s, and /health afterwards."""
    server = start_server(args, "--queue-size", str(args.overload_queue))
    try:
        burst = asyncio.run(load(server.url, questions, args.top_p, args.overload_clients, args.overload_requests,
                                 args.seconds))  # fmt: skip
        health = httpx.get(server.url + "/health", timeout=60).status_code
    finally:
        status = server.stop()
    return {"queue_size": args.overload_queue, "clients": args.overload_clients, "requests": args.overload_requests,
            "codes": burst["codes"], "health_after": health, "exit_status": status}  # fmt: skip


def run_cli(args: argparse.Namespace, questions: list[str]) -> dict[str, Any]:
    """`dilstore ask --json` over stdin questions in one process: wall time, per-question totals, and how many it
    refused (over the reader's question limit: `ask` then exits 2 and goes on, and prints `{"line", "error"}` on
    stdout for it, which has no timings: a refusal ended the load test with a KeyError and no report, json61 F1)."""
    asked = questions[: args.cli_questions]
    command = [sys.executable, "-m", "dilstore", "ask", str(args.store), "--json", "--top-p", str(args.top_p),
               "--threads", str(args.threads)]  # fmt: skip
    if args.model:
        command += ["--model", str(args.model)]
    started = time.perf_counter()
    done = subprocess.run(command, input="\n".join(asked) + "\n", capture_output=True, text=True, cwd=ROOT,
                          timeout=1800)  # fmt: skip
    wall = time.perf_counter() - started
    refused = sum(line.startswith("dilstore ask: error:") for line in done.stderr.splitlines())
    if done.returncode not in (0, 2) or (done.returncode == 2) != (refused > 0):
        raise RuntimeError(f"{' '.join(command)} exited {done.returncode}:\n{done.stderr[-3000:]}")
    objects = [json.loads(line) for line in done.stdout.splitlines()]
    totals = [answer["timings"]["total"] for answer in objects if "error" not in answer]
    if not totals:
        raise DilstoreError(f"`dilstore ask --json` refused all {len(asked)} questions: {done.stderr.strip()[-500:]}")
    return {"questions": len(totals), "refused": refused, "wall_seconds": wall,
            "median_question_seconds": statistics.median(totals), "mean_question_seconds": statistics.fmean(totals)}


def table(report: dict[str, Any]) -> str:
    """The markdown table of both modes, level by level."""
    on, off = report["batching_on"], report["batching_off"]
    lines = [
        "| clients | on: answers/s | off: answers/s | gain | on: p50 / p95 / p99 (s) | off: p50 / p95 / p99 (s) "
        "| 5xx or failed |",
        "|---:|---:|---:|---:|---|---|---:|",
    ]

    def pcts(level: dict) -> str:
        return " / ".join("-" if level[p] is None else f"{level[p]:.2f}" for p in ("p50", "p95", "p99"))

    for a, b in zip(on["levels"], off["levels"], strict=True):
        errors = sum(n for code, n in [*a["codes"].items(), *b["codes"].items()] if not code.isdigit() or code >= "500")
        gain = a["throughput"] / b["throughput"] if b["throughput"] else float("nan")
        lines.append(f"| {a['clients']} | {a['throughput']:.2f} | {b['throughput']:.2f} | ×{gain:.2f} | {pcts(a)} | "
                     f"{pcts(b)} | {errors} |")  # fmt: skip
    return "\n".join(lines)


@one_line_errors
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    questions, source = load_questions(args.questions)
    started = time.perf_counter()
    report: dict[str, Any] = {
        "store": str(args.store),
        "questions": {"source": source, "distinct": len(questions)},
        "top_p": args.top_p,
        "threads": args.threads,
        "requests_per_level": args.requests,
        "machine": {"platform": platform.platform(), "python": platform.python_version()},
    }
    print("batching on", file=sys.stderr)
    report["batching_on"] = run_mode(args, questions, args.max_batch_pairs)
    print("batching off", file=sys.stderr)
    report["batching_off"] = run_mode(args, questions, 1)
    print("overload", file=sys.stderr)
    report["overload"] = run_overload(args, questions)
    print("cli", file=sys.stderr)
    report["cli"] = run_cli(args, questions)
    report["seconds"] = time.perf_counter() - started
    print(table(report))
    cli, over = report["cli"], report["overload"]
    print(f"\nCLI `dilstore ask --json`: {cli['questions']} questions ({cli['refused']} refused) in "
          f"{cli['wall_seconds']:.1f} s wall (start-up included), median "
          f"{1000 * cli['median_question_seconds']:.0f} ms per question (timings.total)")
    print(f"Past the queue bound (queue {over['queue_size']}, {over['clients']} clients, {over['requests']} "
          f"requests): codes {over['codes']}, /health after: {over['health_after']}")
    print(json.dumps(report, indent=2))
    if args.json_out:
        args.json_out.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
