"""A running `dilstore serve` and a store that grows and is compacted under it: what its clients see.

On a copy of STORE (a dilbert store with its BM25 index) the script starts the real server, then:

1. appends one passage that answers QUESTION (`dilstore precompute --append`) and asks QUESTION: the store is
   still served as it was (its index does not cover the append yet);
2. rebuilds the index (`dilstore index`), waits for the server's `opened again` line (how long after the index
   finished) and asks QUESTION again: the new passage answers it;
3. runs one closed-loop client asking QUESTION for `--seconds` while `dilstore compact` rewrites the store, and
   counts the answers by status and answer, with the slowest request's time;
4. reads how long each reopen took (the server's `opened in` figure) and the server's peak and last resident
   memory (VmHWM, VmRSS): a reopen that keeps the served model holds one model, not two.

It prints a table and then the JSON of every figure. The reader is the shipped one (trained), so the answers are
real; the timings depend on the machine.

    .venv/bin/python benchmarks/bench_serve_reopen.py --store dilstore-store --work /tmp/reopen-bench
"""

from __future__ import annotations

import argparse
import json
import platform
import re
import shutil
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the test fixtures' ServeProcess, as `python benchmarks/bench_serve_reopen.py` runs it

from dilstore.runners.arg_types import absolute_path  # noqa: E402
from tests.fixtures.serve_process import ServeProcess  # noqa: E402

QUESTION = "Who built the town hall of Quorvale?"
PASSAGE = {"id": "quorvale-0", "title": "Quorvale", "text": (
    "Quorvale is a small market town in the hills. The river that flows through Quorvale is the Silverrun, which "
    "joins the sea at Port Amber after forty miles. The town hall of Quorvale was built in 1743 by the mason Edwin "
    "Harrow.")}  # fmt: skip
WAIT = 120.0
SCRATCH = frozenset({"store", "new.jsonl"})  # what a run leaves in --work, which the next run empties


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--store", type=Path, default=ROOT / "dilstore-store", help="dilbert store with STORE/bm25")
    # Absolute: the dilstore commands on the copy run in the repository's folder (bench53 F8).
    parser.add_argument("--work", type=absolute_path, required=True,
                        help="scratch folder (emptied first) for the copy")  # fmt: skip
    parser.add_argument("--seconds", type=float, default=30.0, help="how long the client asks during the compaction")
    args = parser.parse_args(argv)
    if not args.seconds > 1:
        parser.error(f"--seconds must be more than 1 (the compaction starts after one), got {args.seconds:g}")
    problem = work_problem(args.store, args.work)
    if problem:
        parser.error(problem)
    return args


def work_problem(store: Path, work: Path) -> str | None:
    """Why --work may not be emptied for a run on a copy of --store, or None.

    The run empties --work first: a --work that held the store (or the store's own folder) deleted it and then
    failed to copy it, and a folder of other files lost them (bench53 F4). So --store must be a store outside
    --work, and --work absent, empty, or holding only what an earlier run left there.
    """
    if not (store / "manifest.json").is_file():
        return f"--store {store}: no store there (no manifest.json)"
    if store.resolve().is_relative_to(work.resolve()) or work.resolve().is_relative_to(store.resolve()):
        return f"--work {work} holds --store {store} (or lies inside it), and --work is emptied first; give another"
    if work.exists() and not work.is_dir():
        return f"--work {work} is not a folder"
    others = sorted(entry.name for entry in work.iterdir() if entry.name not in SCRATCH) if work.is_dir() else []
    if others:
        return (f"--work {work} holds {', '.join(others[:3])}{' ...' if len(others) > 3 else ''}, which no earlier "
                "run left there, and --work is emptied first; give a new or empty folder")  # fmt: skip
    return None


def dilstore(*args: str) -> float:
    """Run `dilstore ARGS` to completion (exit 0 required); its wall time in seconds."""
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "dilstore", *args], capture_output=True, text=True, cwd=ROOT)
    if done.returncode != 0:
        raise SystemExit(f"dilstore {' '.join(args)} exited {done.returncode}:\n{done.stderr}")
    return time.perf_counter() - started


def ask(client: httpx.Client) -> str:
    """`status answer` (or `status detail`) of one /ask of QUESTION."""
    response = client.post("/ask", json={"question": QUESTION})
    body = response.json()
    return f"{response.status_code} {body.get('answer', body.get('detail'))}"


def wait_for_line(server: ServeProcess, text: str, count: int) -> float:
    """Seconds until the server's log holds `text` `count` times."""
    started = time.perf_counter()
    while sum(text in line for line in server.log) < count:
        if time.perf_counter() - started > WAIT:
            raise SystemExit(f"no {text!r} in the server's log after {WAIT:g} s:\n{''.join(server.log)}")
        time.sleep(0.05)
    return time.perf_counter() - started


def reopen_seconds(server: ServeProcess) -> list[float]:
    """How long each reopen took, from the server's `opened again: ... opened in S s)` lines."""
    return [float(found.group(1)) for line in server.log if (found := re.search(r"opened in ([\d.]+) s\)", line))]


def memory_mb(pid: int) -> dict[str, float]:
    """The process's peak (VmHWM) and current (VmRSS) resident memory in MB, from /proc (Linux only)."""
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
    return {name: round(int(fields[name].split()[0]) / 1024, 1) for name in ("VmHWM", "VmRSS")}


def compaction_under_load(client: httpx.Client, store: Path, seconds: float) -> dict[str, Any]:
    """Ask QUESTION in a loop for `seconds`, compacting the store after the first second."""
    answers: Counter[str] = Counter()
    slowest, compact = 0.0, None
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        if compact is None and time.perf_counter() > end - seconds + 1:
            compact = subprocess.Popen([sys.executable, "-m", "dilstore", "compact", str(store), "--no-progress"],
                                       cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        started = time.perf_counter()
        answers[ask(client)] += 1
        slowest = max(slowest, time.perf_counter() - started)
    assert compact is not None
    _, err = compact.communicate(timeout=WAIT)
    if compact.returncode != 0:
        raise SystemExit(f"dilstore compact exited {compact.returncode}:\n{err}")
    return {"answers": dict(answers), "slowest_request_s": round(slowest, 3)}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    shutil.rmtree(args.work, ignore_errors=True)
    store = shutil.copytree(args.store, args.work / "store")
    corpus = args.work / "new.jsonl"
    corpus.write_text(json.dumps(PASSAGE) + "\n", encoding="utf-8")
    server = ServeProcess([str(store), "--threads", "1"], timeout=WAIT)
    try:
        with httpx.Client(base_url=server.url, timeout=WAIT) as client:
            before = ask(client)
            append_s = dilstore("precompute", "--input", str(corpus), "--output", str(store), "--append",
                                "--no-progress", "--threads", "1")  # fmt: skip
            time.sleep(6)  # a watch of the stores (every 5 s) has seen the append
            appended = ask(client)
            index_s = dilstore("index", str(store))
            reopen_s = wait_for_line(server, "opened again: store", 1)
            indexed = ask(client)
            during = compaction_under_load(client, store, args.seconds)
            served = client.get("/stores").json()["stores"][0]
            wait_for_line(server, "opened again: store", 2)  # the compacted store (a request may have waited for it)
            memory = memory_mb(server.process.pid)
    finally:
        status = server.stop()
    result = {
        "machine": f"{platform.node()} ({platform.processor() or platform.machine()})",
        "store": str(args.store), "question": QUESTION, "before_append": before, "append_s": round(append_s, 2),
        "after_append_before_index": appended, "index_s": round(index_s, 2),
        "reopened_after_index_s": round(reopen_s, 2), "after_index": indexed, "during_compaction": during,
        "served_after": {"passages": served["info"]["passages"], "shards": served["info"]["shards"],
                         "problem": served.get("problem")},
        "server_exit": status, "opened_again_lines": sum("opened again: store" in line for line in server.log),
        "reopen_s": reopen_seconds(server), "server_memory_mb": memory,
    }  # fmt: skip
    rows = [
        ("before the append", before),
        (f"appended ({append_s:.1f} s), index not rebuilt", appended),
        (f"index rebuilt ({index_s:.1f} s), reopened {reopen_s:.1f} s after", indexed),
        (f"during compaction ({args.seconds:g} s of one client)",
         ", ".join(f"{answer} ×{n}" for answer, n in during["answers"].items())),
        ("slowest request during compaction", f"{during['slowest_request_s']} s"),
        ("served after", f"{served['info']['passages']} passages in {served['info']['shards']} shard(s), "
                         f"problem {served.get('problem')}"),
        ("each reopen took", ", ".join(f"{seconds:.2f} s" for seconds in result["reopen_s"])),
        ("server memory at the end", f"peak {memory['VmHWM']:.0f} MB, now {memory['VmRSS']:.0f} MB"),
    ]  # fmt: skip
    width = max(len(step) for step, _ in rows)
    for step, what in rows:
        print(f"{step:<{width}}  {what}")
    print(json.dumps(result, indent=1))
    return 0 if status == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
