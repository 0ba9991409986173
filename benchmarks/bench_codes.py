"""Low-bit store encodings on real states: size, reconstruction error, SQuAD F1 through the store, speed.

For the first --paragraphs SQuAD v1.1 dev paragraphs this script

1. runs `dilstore precompute --format squad --split paragraphs` with the shipped
   DilBert reader once per encoding (fp32 as the reference, fp16, int8, 2bit,
   1bit; one worker) and records the wall time and `dilstore info --json`'s
   state bytes per token, then `dilstore verify`;
2. compares each store's decoded states with the fp32 store's: relative MSE
   (sum of squared errors over sum of squares) and mean per-token cosine;
3. compares the residual codes with faiss product quantization at the same
   bytes per token (M = d/4 or d/8 one-byte sub-quantizers), trained on the
   same seeded token sample as the codebooks (storage.encodings.sample_rows);
4. reads every question of those paragraphs against its own paragraph's stored
   units (reading comprehension through the store, μ = 1) and scores SQuAD F1;
5. times decoding 100 passages (store.fetch) against the online layers for
   one question over the same 100 passages (OpenDomainReader.read).

    .venv/bin/python benchmarks/bench_codes.py --work /tmp/bench-codes --paragraphs 60 --output codes.json
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

ENCODINGS = ("fp32", "fp16", "int8", "2bit", "1bit")
CLI = [sys.executable, "-m", "dilstore"]


def squad_subset(source: Path, paragraphs: int, target: Path) -> list[dict[str, Any]]:
    """Write the first `paragraphs` dev paragraphs as SQuAD JSON; their questions as {id, paragraph, answers}."""
    data = json.loads(source.read_text(encoding="utf-8"))["data"]
    kept, questions, left = [], [], paragraphs
    for article in data:
        if left == 0:
            break
        taken = article["paragraphs"][:left]
        left -= len(taken)
        kept.append({"title": article["title"], "paragraphs": taken})
        for index, paragraph in enumerate(taken):
            for qa in paragraph["qas"]:
                questions.append({"id": qa["id"], "question": qa["question"], "doc": f"{article['title']}#p{index}",
                                  "answers": [answer["text"] for answer in qa["answers"]]})
    target.write_text(json.dumps({"version": "1.1", "data": kept}), encoding="utf-8")
    return questions


def precompute(corpus: Path, store: Path, encoding: str, threads: int) -> float:
    started = time.perf_counter()
    subprocess.run([*CLI, "precompute", "--input", str(corpus), "--format", "squad", "--split", "paragraphs",
                    "--output", str(store), "--encoding", encoding, "--shards", "1", "--workers", "1", "--threads", str(threads),
                    "--overwrite", "--no-progress", "--json"], check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - started


def pq_errors(reference: np.ndarray, bytes_per_token: int) -> dict[str, float]:
    """faiss ProductQuantizer with `bytes_per_token` 8-bit sub-quantizers on `(T, d)` states."""
    import faiss

    from dilstore.storage.encodings import CODEBOOK_SAMPLE_TOKENS, sample_rows

    quantizer = faiss.ProductQuantizer(reference.shape[1], bytes_per_token, 8)
    started = time.perf_counter()
    quantizer.train(np.ascontiguousarray(reference[sample_rows(len(reference), CODEBOOK_SAMPLE_TOKENS)]))
    trained = time.perf_counter()
    codes = quantizer.compute_codes(reference)
    encoded = time.perf_counter()
    decoded = quantizer.decode(codes)
    done = time.perf_counter()
    return {**errors(reference, decoded), "train_s": trained - started, "encode_s": encoded - trained,
            "decode_s": done - encoded}


def errors(reference: np.ndarray, decoded: np.ndarray) -> dict[str, float]:
    decoded = decoded.astype(np.float32)
    cosine = (reference * decoded).sum(1) / (np.linalg.norm(reference, axis=1) * np.linalg.norm(decoded, axis=1))
    return {"relative_mse": float(np.square(decoded - reference).sum() / np.square(reference).sum()),
            "cosine": float(cosine.mean())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--squad", type=Path, default=Path(__file__).resolve().parents[1] / "../shared/data/squad/dev-v1.1.json")
    parser.add_argument("--paragraphs", type=int, default=60)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--output", type=Path)
    args = parser.parse_args()

    import torch

    from dilstore.reader.evaluation.squad_metric import f1
    from dilstore.reader.serving.answers import aggregate
    from dilstore.reader.serving.odqa import open_reader
    from dilstore.storage.reader import open_store

    torch.set_num_threads(args.threads)
    args.work.mkdir(parents=True, exist_ok=True)
    corpus = args.work / "squad-subset.json"
    questions = squad_subset(args.squad, args.paragraphs, corpus)
    results: dict[str, Any] = {"paragraphs": args.paragraphs, "questions": len(questions), "encodings": {}}
    states: dict[str, np.ndarray] = {}
    for encoding in ENCODINGS:
        store = args.work / encoding
        seconds = precompute(corpus, store, encoding, args.threads)
        info = json.loads(subprocess.run([*CLI, "info", str(store), "--json"], check=True, capture_output=True,
                                         text=True).stdout)
        verified = subprocess.run([*CLI, "verify", str(store), "--json"], capture_output=True, text=True)
        table = pa.concat_tables([pq.read_table(part) for part in sorted((store / "passages").glob("*.parquet"))]).to_pydict()
        ids = table["id"]
        reader = open_reader(store, with_index=False)
        states[encoding] = np.concatenate([p.states for p in reader.store.fetch(ids)]).astype(np.float32)
        by_doc: dict[str, list[str]] = {}
        for passage_id, doc_id in zip(ids, table["doc_id"], strict=True):
            by_doc.setdefault(doc_id, []).append(passage_id)
        readings = reader.read([q["question"] for q in questions], [by_doc[q["doc"]] for q in questions])
        scores = [max(f1(aggregate(reading, 1.0, 20).text, answer) for answer in q["answers"])
                  for reading, q in zip(readings, questions, strict=True)]
        hundred = (ids * (100 // len(ids) + 1))[:100]
        fetch = online = float("inf")
        for _ in range(3):
            started = time.perf_counter()
            reader.store.fetch(hundred)
            fetch = min(fetch, time.perf_counter() - started)
            started = time.perf_counter()
            reader.read([questions[0]["question"]], [hundred])
            online = min(online, time.perf_counter() - started)
        results["encodings"][encoding] = {
            "precompute_s": seconds,
            "tokens": info["tokens"],
            "bytes_per_token": info["bytes_per_token"]["dilbert"],
            "verify_ok": verified.returncode == 0,
            "f1": 100 * float(np.mean(scores)),
            "fetch_100_s": fetch,
            "read_100_s": online,
            "decode_share": fetch / online,
        }
        print(encoding, results["encodings"][encoding], flush=True)
    reference = states["fp32"]
    for encoding in ENCODINGS[1:]:
        results["encodings"][encoding].update(errors(reference, states[encoding]))
    dims = reference.shape[1]
    results["pq"] = {f"pq{dims // 4}x8": pq_errors(reference, dims // 4), f"pq{dims // 8}x8": pq_errors(reference, dims // 8)}
    print(json.dumps(results, indent=1))
    if args.output:
        args.output.write_text(json.dumps(results, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
