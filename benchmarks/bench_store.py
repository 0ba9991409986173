"""Shard-store benchmark: fetch 100 random passages' states through memory maps and through zarr-python.

For each dimension (384, 768) and encoding (fp32, fp16, int8) it builds a store of --passages
passages of 100..160 tokens (mean ~130), measures it, and deletes it before building the next
(one store at a time: d=768 fp32 at 100k passages is ~40 GB). Per store it reports build time,
bytes per token, and the time to fetch --fetch random ids and pack their float32 states into the
padded (b, n, d) batch the online layers take (the pack touches every byte, so lazily mapped pages
are really read), median of --repeats, warm (ids fetched once before) and cold (page cache dropped
before each repetition, when this process may; otherwise marked unavailable), on both read paths.

Next to it, the same run times the online layers for one question and --fetch passages:
`DilBertReader.interact` (layers k+1..l and the QA head) of the packaged all-MiniLM-L6-v2 at k=4
for d=384, and of a randomly initialised BERT-base-sized reader (12 layers, hidden 768) at k=10 for
d=768 (random weights: speed only). The ratio fetch / online is the target (at most 5%).

States are real: a pool of all-MiniLM-L6-v2 layer-4 passage states (`p [SEP]`, segment 1) of SQuAD
dev paragraphs; each stored passage is a random contiguous run of pool tokens. At d=768 each token
is two independent pool tokens side by side (the same statistics, outlier channels included).
Store shards cycle through --templates generated shards under fresh ids and titles: generating
40 GB of new states per store would dominate the run and does not change what is measured.
A small --compression-sample store per setting measures what zstd and blosc save.

    python benchmarks/bench_store.py --json-out /tmp/bench-store.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import torch
import transformers
from page_cache import drop_page_cache
from transformers import AutoModelForQuestionAnswering, BertConfig

from dilstore.reader.modeling.checkpoints import base_model_dir
from dilstore.reader.modeling.dilbert import DilBertReader
from dilstore.runners.arg_types import positive_int
from dilstore.runners.outputs import check_output_option
from dilstore.storage.finalize import finalize
from dilstore.storage.fingerprint import Fingerprint
from dilstore.storage.info import store_info
from dilstore.storage.reader import Store, open_store
from dilstore.storage.records import PassageRecord
from dilstore.storage.writer import write_shard

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_SQUAD = ROOT.parent / "shared" / "data" / "squad" / "dev-v1.1.json"
QUESTION = "Which team won the championship game that season?"
WORD_TEXT = " ".join(f"w{index:04d}" for index in range(400))  # fixed-width words: token i spans 6i..6i+5
STARTED = time.perf_counter()


def log(message: str) -> None:
    print(f"[{time.perf_counter() - STARTED:7.1f}s] {message}", file=sys.stderr, flush=True)


def minilm_reader(layers: int) -> DilBertReader:
    return DilBertReader.from_pretrained(base_model_dir(), layers=layers)


def bert_base_reader(layers: int, tokenizer: Any) -> DilBertReader:
    """A BERT-base-sized reader with random weights (speed only)."""
    torch.manual_seed(0)
    config = BertConfig(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072)
    model = AutoModelForQuestionAnswering.from_config(config, attn_implementation="sdpa").eval()
    return DilBertReader(model, tokenizer, layers).eval()


def state_pool(reader: DilBertReader, squad: Path, paragraphs: int) -> np.ndarray:
    """Layer-k passage states `(tokens, 384)` of the first SQuAD dev paragraphs, concatenated."""
    document = json.loads(squad.read_text(encoding="utf-8"))
    texts = [p["context"] for article in document["data"] for p in article["paragraphs"]][:paragraphs]
    states = []
    with torch.no_grad():
        for text in texts:
            ids = reader.tokenizer(text, add_special_tokens=False, truncation=True, max_length=255)["input_ids"]
            ids = torch.tensor([ids + [reader.tokenizer.sep_token_id]])  # (1, n)
            states.append(reader.encode_passages(ids, torch.ones_like(ids))[0].numpy())  # (n, 384)
    return np.concatenate(states)


SPANS = np.stack([np.arange(161) * 6, np.arange(161) * 6 + 5], axis=1).astype(np.int32)  # (161, 2)


def shard_records(
    first: int, count: int, dim: int, pool: np.ndarray, rng: np.random.Generator
) -> list[PassageRecord]:
    """`count` passages of 100..160 tokens; states are runs of pool tokens (two side by side at d=768)."""
    lengths = rng.integers(100, 161, count)
    starts = rng.integers(0, len(pool) - 161, count)
    rows = (np.repeat(starts - np.cumsum(lengths) + lengths, lengths) + np.arange(lengths.sum()))  # (T,)
    states = pool[rows]  # (T, 384)
    if dim == 2 * pool.shape[1]:
        states = np.concatenate([states, pool[rng.integers(0, len(pool), len(rows))]], axis=1)  # (T, 768)
    token_ids = rng.integers(1000, 30000, len(rows)).astype(np.int32)  # (T,)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).tolist()
    records = []
    for i, length in enumerate(lengths.tolist()):
        spans = SPANS[:length].copy()
        spans[-1] = -1  # the trailing [SEP]
        start, stop = offsets[i], offsets[i + 1]
        records.append(
            PassageRecord(
                id=f"passage-{first + i:07d}",
                title=f"Article {(first + i) // 20}",
                text=WORD_TEXT[: 6 * (length - 1) - 1],
                token_ids=token_ids[start:stop],
                char_spans=spans,
                states=states[start:stop],
            )
        )
    return records


def templates(dim: int, per_shard: int, pool: np.ndarray, count: int) -> list[list[PassageRecord]]:
    """`count` distinct shards' worth of passages; store shards cycle through them under new ids.

    Generating 13M tokens of float32 states per store (40 GB at d=768) would dominate the run;
    which passage holds which states does not change what is measured.
    """
    rng = np.random.default_rng(dim)
    return [shard_records(0, per_shard, dim, pool, rng) for _ in range(count)]


def build_store(
    root: Path, passages: int, per_shard: int, encoding: str, compressor: str | None,
    shard_templates: list[list[PassageRecord]],
) -> dict[str, float]:
    """Write and finalize one store; return the seconds each step took."""
    dim = shard_templates[0][0].states.shape[1]
    written = time.perf_counter()
    for shard, first in enumerate(range(0, passages, per_shard)):
        template = shard_templates[shard % len(shard_templates)][: min(per_shard, passages - first)]
        records = [replace(record, id=f"passage-{first + i:07d}", title=f"Article {(first + i) // 20}")
                   for i, record in enumerate(template)]
        write_shard(root, shard, records, kind="dilbert", encoding=encoding, compressor=compressor)
    finalized = time.perf_counter()
    fingerprint = Fingerprint("BertModel", "bench", "bench", "bench", "dilbert", 4 if dim == 384 else 10, encoding, 256)
    finalize(root, fingerprint, {"command": "benchmarks/bench_store.py"})
    return {"write_s": finalized - written, "finalize_s": time.perf_counter() - finalized}


def pack(store: Store, ids: Sequence[str]) -> np.ndarray:
    """Fetch `ids` and copy their states into the zero-padded float32 batch `(b, n, *S)` the model takes."""
    passages = store.fetch(ids)
    longest = max(len(passage.token_ids) for passage in passages)
    batch = np.zeros((len(passages), longest, *passages[0].states.shape[1:]), dtype=np.float32)  # (b, n, d)
    for row, passage in enumerate(passages):
        batch[row, : len(passage.states)] = passage.states
    return batch


def time_fetches(
    store: Store, all_ids: list[str], fetch: int, repeats: int, rng: np.random.Generator, cold: bool
) -> dict[str, Any]:
    """Median seconds of `pack` over `repeats` sets of random ids, warm (each set fetched once before) or cold."""
    seconds, tokens = [], []
    for _ in range(repeats):
        ids = [all_ids[i] for i in rng.integers(0, len(all_ids), fetch)]
        if cold:
            if not drop_page_cache():
                return {"available": False, "reason": "dropping the page cache is not permitted"}
        else:
            pack(store, ids)
        start = time.perf_counter()
        batch = pack(store, ids)
        seconds.append(time.perf_counter() - start)
        tokens.append(int(sum(len(p.token_ids) for p in store.fetch(ids))))
    del batch
    return {"available": True, "median_s": statistics.median(seconds), "runs_s": seconds,
            "tokens_median": statistics.median(tokens)}


def time_online(reader: DilBertReader, passages: int, dim: int, repeats: int) -> dict[str, Any]:
    """Median seconds of `interact` for one question × `passages` passages of 130 tokens (padded to 160)."""
    tokenizer = reader.tokenizer
    question_ids = torch.tensor([tokenizer(QUESTION)["input_ids"]])  # (1, nq)
    with torch.no_grad():
        question_states = reader.encode_questions(question_ids, torch.ones_like(question_ids))  # (1, nq, d)
        passage_states = torch.randn(passages, 160, dim)  # (b, np, d)
        passage_mask = torch.zeros(passages, 160, dtype=torch.long)  # (b, np)
        passage_mask[:, :130] = 1
        question_mask = torch.ones_like(question_ids)  # (1, nq)
        reader.interact(question_states, question_mask, passage_states, passage_mask)
        seconds = []
        for _ in range(repeats):
            start = time.perf_counter()
            reader.interact(question_states, question_mask, passage_states, passage_mask)
            seconds.append(time.perf_counter() - start)
    return {"median_s": statistics.median(seconds), "runs_s": seconds, "layers": reader.layers,
            "num_layers": reader.num_layers, "question_tokens": question_ids.shape[1],
            "passage_tokens": "130 of 160 (padded)"}


def measure_store(
    root: Path, dim: int, encoding: str, args: argparse.Namespace, build: dict[str, float], online_s: float
) -> dict[str, Any]:
    info = store_info(root)
    state_bytes_per_token = info["bytes_per_token"]["dilbert"]
    result: dict[str, Any] = {
        "dim": dim, "encoding": encoding, "passages": info["passages"], "tokens": info["tokens"],
        "shards": info["shards"], "bytes_on_disk": info["bytes_on_disk"],
        "state_bytes_per_token": state_bytes_per_token, "bytes_per_token_by_part": info["bytes_per_token_by_part"],
        **build, "paths": {},
    }
    ids = [f"passage-{index:07d}" for index in range(info["passages"])]
    for read_path in ("mmap", "zarr"):
        store = open_store(root, read_path=read_path)
        for shard in store.manifest.shard_by_index:
            store.shard(shard)  # a server opens its shards once; steady-state fetches are what is timed
        rng = np.random.default_rng(7)
        timings = {}
        for temperature, cold in (("warm", False), ("cold", True)):
            timing = time_fetches(store, ids, args.fetch, args.repeats if not cold else args.cold_repeats, rng, cold)
            if timing["available"]:
                moved = timing["tokens_median"] * state_bytes_per_token
                timing["state_MB_per_s"] = moved / timing["median_s"] / 1e6
                timing["fraction_of_online"] = timing["median_s"] / online_s
            timings[temperature] = timing
        result["paths"][read_path] = timings
        store.close()
        log(f"d={dim} {encoding} {read_path}: warm {timings['warm']['median_s'] * 1e3:.1f} ms"
            + (f", cold {timings['cold']['median_s'] * 1e3:.1f} ms" if timings["cold"]["available"] else ""))
    return result


def compression_sample(
    work: Path, encoding: str, args: argparse.Namespace, shard_templates: list[list[PassageRecord]]
) -> dict[str, Any]:
    """State bytes per token and warm zarr-python fetch time of a small store, uncompressed vs zstd vs blosc."""
    dim = shard_templates[0][0].states.shape[1]
    passages = min(args.compression_sample, len(shard_templates[0]))
    sample: dict[str, Any] = {"dim": dim, "encoding": encoding, "passages": passages}
    for compressor in (None, "zstd", "blosc"):
        root = work / f"sample-{dim}-{encoding}-{compressor}"
        shutil.rmtree(root, ignore_errors=True)
        build = build_store(root, passages, passages, encoding, compressor, shard_templates)
        info = store_info(root)
        store = open_store(root, read_path="zarr")
        timing = time_fetches(store, [f"passage-{i:07d}" for i in range(info["passages"])], args.fetch,
                              args.repeats, np.random.default_rng(3), cold=False)
        sample[compressor or "none"] = {"state_bytes_per_token": info["bytes_per_token"]["dilbert"],
                                        "zarr_warm_median_s": timing["median_s"], **build}
        shutil.rmtree(root)
    for compressor in ("zstd", "blosc"):
        sample[compressor]["ratio"] = (
            sample["none"]["state_bytes_per_token"] / sample[compressor]["state_bytes_per_token"]
        )
    return sample


def _cells(timing: dict[str, Any], key: str, scale: float, form: str) -> str:
    return format(timing[key] * scale, form) if timing["available"] else "n/a"


def render(result: dict[str, Any]) -> str:
    """Markdown tables of the stores and of the compression samples, after one line per d naming the model of the
    online column: at d=768 it has random weights (speed only), which the table alone would not say."""
    lines = [f"online layers d={dim}: {online['model']}" for dim, online in result["online"].items()]
    lines += [
        "",
        "| d | encoding | state B/token | store GB | build s | path | warm ms | warm MB/s | cold ms | cold MB/s "
        "| online ms | warm / online | cold / online |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for store in result["stores"]:
        online = result["online"][str(store["dim"])]["median_s"]
        for path, timing in store["paths"].items():
            warm, cold = timing["warm"], timing["cold"]
            cells = [
                str(store["dim"]), store["encoding"], f"{store['state_bytes_per_token']:.1f}",
                f"{store['bytes_on_disk'] / 1e9:.2f}", f"{store['write_s'] + store['finalize_s']:.0f}", path,
                _cells(warm, "median_s", 1e3, ".1f"), _cells(warm, "state_MB_per_s", 1, ".0f"),
                _cells(cold, "median_s", 1e3, ".1f"), _cells(cold, "state_MB_per_s", 1, ".0f"),
                f"{online * 1e3:.0f}", _cells(warm, "fraction_of_online", 100, ".1f") + "%",
                _cells(cold, "fraction_of_online", 100, ".1f") + "%",
            ]
            lines.append("| " + " | ".join(cells) + " |")
    lines += [
        "",
        "| d | encoding | none B/token | zstd B/token (ratio) | blosc B/token (ratio) "
        "| zarr warm ms none / zstd / blosc |",
        "|---|---|---|---|---|---|",
    ]
    for sample in result["compression"]:
        none, zstd, blosc = sample["none"], sample["zstd"], sample["blosc"]
        lines.append(
            f"| {sample['dim']} | {sample['encoding']} | {none['state_bytes_per_token']:.1f} | "
            f"{zstd['state_bytes_per_token']:.1f} ({zstd['ratio']:.2f}×) | "
            f"{blosc['state_bytes_per_token']:.1f} ({blosc['ratio']:.2f}×) | "
            f"{none['zarr_warm_median_s'] * 1e3:.0f} / {zstd['zarr_warm_median_s'] * 1e3:.0f} / "
            f"{blosc['zarr_warm_median_s'] * 1e3:.0f} |"
        )
    return "\n".join(lines)


def parse_arguments(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--passages", type=positive_int, default=100_000, help="passages per store (default 100000)")
    parser.add_argument("--passages-per-shard", type=positive_int, default=2500, help="default 2500")
    parser.add_argument(
        "--templates", type=positive_int, default=4, help="distinct generated shards to cycle (default 4)"
    )
    parser.add_argument("--dims", type=int, nargs="+", default=[384, 768], choices=[384, 768])
    parser.add_argument("--encodings", nargs="+", default=["fp32", "fp16", "int8"], choices=["fp32", "fp16", "int8"])
    parser.add_argument("--fetch", type=positive_int, default=100, help="passages per fetch (default 100)")
    parser.add_argument("--repeats", type=positive_int, default=7, help="warm repetitions (default 7)")
    parser.add_argument(
        "--online-repeats", type=positive_int, default=3, help="repetitions of the online layers (default 3)"
    )
    parser.add_argument("--cold-repeats", type=positive_int, default=3, help="cold repetitions (default 3)")
    parser.add_argument(
        "--compression-sample", type=positive_int, default=2000, help="passages in the compression sample"
    )
    parser.add_argument("--pool-paragraphs", type=positive_int, default=150, help="SQuAD paragraphs in the state pool")
    parser.add_argument("--squad", type=Path, default=DEFAULT_SQUAD)
    parser.add_argument("--work-dir", type=Path, default=Path("/tmp/dilstore-bench-store"))
    parser.add_argument("--threads", type=positive_int, help="torch threads for the online layers (default: torch's)")
    parser.add_argument("--json-out", type=Path, default=Path("/tmp/bench-store.json"))
    args = parser.parse_args(argv)
    check_output_option(parser, args.json_out, "--json-out")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_arguments(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    args.work_dir.mkdir(parents=True, exist_ok=True)
    minilm = minilm_reader(layers=4)
    log("computing the state pool (all-MiniLM-L6-v2 layer 4 over SQuAD dev paragraphs)")
    pool = state_pool(minilm, args.squad, args.pool_paragraphs)
    online_readers: dict[int, Callable[[], DilBertReader]] = {
        384: lambda: minilm, 768: lambda: bert_base_reader(10, minilm.tokenizer)}
    result: dict[str, Any] = {
        "started": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "settings": {key: str(value) if isinstance(value, Path) else value for key, value in vars(args).items()},
        "environment": {"cpus": os.cpu_count(), "torch_threads": torch.get_num_threads(),
                        "load_average_at_start": os.getloadavg(), "python": platform.python_version(),
                        "torch": torch.__version__, "transformers": transformers.__version__,
                        "numpy": np.__version__},
        "states": {"source": "all-MiniLM-L6-v2 layer-4 passage states of SQuAD dev paragraphs, resampled "
                             "(d=768: two pool tokens side by side); store shards cycle through "
                             f"{args.templates} generated shards under new ids", "pool_tokens": len(pool)},
        "online": {}, "stores": [], "compression": [],
    }
    for dim in args.dims:
        log(f"timing the online layers at d={dim}")
        result["online"][str(dim)] = {
            "model": "all-MiniLM-L6-v2 (real weights), k=4 of 6" if dim == 384
            else "BERT-base-sized reader, RANDOM weights (speed only), k=10 of 12",
            **time_online(online_readers[dim](), args.fetch, dim, args.online_repeats),
        }
        online_s = result["online"][str(dim)]["median_s"]
        shard_templates = templates(dim, args.passages_per_shard, pool, args.templates)
        for encoding in args.encodings:
            root = args.work_dir / f"store-{dim}-{encoding}"
            shutil.rmtree(root, ignore_errors=True)
            log(f"building d={dim} {encoding}: {args.passages} passages")
            build = build_store(root, args.passages, args.passages_per_shard, encoding, None, shard_templates)
            log(f"built in {build['write_s']:.0f} s + finalize {build['finalize_s']:.0f} s")
            result["stores"].append(measure_store(root, dim, encoding, args, build, online_s))
            shutil.rmtree(root)
            result["compression"].append(compression_sample(args.work_dir, encoding, args, shard_templates))
            args.json_out.write_text(json.dumps(result, indent=2))  # partial results survive an interruption
    result["environment"]["load_average_at_end"] = os.getloadavg()
    result["wall_s"] = time.perf_counter() - STARTED
    args.json_out.write_text(json.dumps(result, indent=2))
    print(render(result))
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
