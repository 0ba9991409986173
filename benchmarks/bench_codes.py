"""Low-bit store encodings on real states: size, reconstruction error, SQuAD F1 through the store, speed.

For the first --paragraphs SQuAD v1.1 dev paragraphs this script

1. runs `dilstore precompute --format squad --split paragraphs` with the shipped
   DilBert reader once per encoding (fp32 as the reference, fp16, int8, 2bit,
   1bit; one worker, one shard) and records the wall time and `dilstore info
   --json`'s state bytes per token (total, and split into what each token adds
   and fixed bytes), then `dilstore verify`;
2. compares each store's decoded states with the fp32 store's: relative MSE
   (sum of squared errors over sum of squares) and mean per-token cosine;
3. compares the residual codes with faiss product quantization at about the
   same bytes per token (faiss.ProductQuantizer, M = d/4 or d/8 one-byte
   sub-quantizers: 96 / 48 bytes at d = 384 against 99 / 51, the store's codes
   with their uint8 centroid id, 256 centroids), trained on the
   same seeded token sample as the codebooks (storage.residual_codes.sample_rows):
   error, and F1 with the PQ-decoded fp32 states put in place of the store's;
   likewise the residual_variants codecs (VARIANTS), trained on that sample:
   least-squares token scales (on the codes from before centroids), and
   ColBERTv2-style faiss k-means centroid ids plus 1/2-bit residual codes
   against the centroid (bytes per token: codes, fp16 scale, uint16 id): the
   prototype of the store's centroids, at 256 to 4096 centroids; with their
   encode and decode times;
4. reads every question of those paragraphs against its own paragraph's stored
   units (reading comprehension through the store, μ = 1) and scores SQuAD F1;
5. times decoding 100 passages (store.fetch; for PQ, fetching the fp32 store
   plus faiss decoding) against one question over the same 100 passages
   (OpenDomainReader.read, which includes the fetch): `decode_share` is
   fetch / (read - fetch), the share of the online layers' time.

Both quantizers are trained here on the states they encode (in-sample);
bench_codes_heldout.py trains them on other paragraphs' states instead.

    .venv/bin/python benchmarks/bench_codes.py --work /tmp/bench-codes --paragraphs 60 --threads 1 \\
        --output /tmp/bench-codes.json

The token sample must hold at least MIN_SAMPLE_TOKENS tokens (k-means with 4096
centroids; PQ with 256 per sub-quantizer): a run whose paragraphs hold fewer
stops with a usage error right after the fp32 store, before the other encodings.
Prints a table and the JSON; --output gets the JSON after every stage
(`"complete": false` until the last), so a run that fails keeps what it measured.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from dilstore.runners.arg_types import positive_int

sys.path.insert(0, str(Path(__file__).resolve().parent))
import residual_variants  # noqa: E402
from residual_variants import Variant  # noqa: E402

ENCODINGS = ("fp32", "fp16", "int8", "2bit", "1bit")
# Least-squares scales alone; ColBERTv2-style centroids (RMS scale) at 256 / 1024 / 4096 centroids; both together.
VARIANTS = (Variant(0, 2, True), Variant(0, 1, True),
            *(Variant(centroids, bits, False) for bits in (2, 1) for centroids in (256, 1024, 4096)),
            Variant(1024, 1, True))
CLI = [sys.executable, "-m", "dilstore"]
PQ_BITS = 8  # one-byte sub-quantizers: 2**8 centroids each
MOST_CENTROIDS = max(variant.centroids for variant in VARIANTS)
# faiss k-means and PQ training refuse fewer training points than centroids: the sample must hold the largest k.
MIN_SAMPLE_TOKENS = max(2**PQ_BITS, MOST_CENTROIDS)


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


def precompute(corpus: Path, store: Path, encoding: str, threads: int, *extra: str) -> float:
    """`dilstore precompute` of a SQuAD-format corpus into a one-shard store (`extra`: more options); seconds."""
    started = time.perf_counter()
    subprocess.run([*CLI, "precompute", "--input", str(corpus), "--format", "squad", "--split", "paragraphs",
                    "--output", str(store), "--encoding", encoding, "--shards", "1", "--workers", "1",
                    "--threads", str(threads), "--overwrite", "--no-progress", "--json", *extra],
                   check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - started


def train_pq(sample: np.ndarray, reference: np.ndarray, bytes_per_token: int) -> tuple[Any, dict[str, float]]:
    """faiss ProductQuantizer with `bytes_per_token` 8-bit sub-quantizers, trained on `sample`, measured on
    `reference`."""
    import faiss

    quantizer = faiss.ProductQuantizer(reference.shape[1], bytes_per_token, PQ_BITS)
    started = time.perf_counter()
    quantizer.train(np.ascontiguousarray(sample))
    trained = time.perf_counter()
    codes = quantizer.compute_codes(reference)
    encoded = time.perf_counter()
    decoded = quantizer.decode(codes)
    done = time.perf_counter()
    return quantizer, {**errors(reference, decoded), "bytes_per_token": bytes_per_token,
                       "codebook_bytes": 4 * reference.shape[1] * 2**PQ_BITS, "train_s": trained - started,
                       "encode_s": encoded - trained, "decode_s": done - encoded}


def pq_through_reader(
    sample: np.ndarray, reference: np.ndarray, reader: Any, questions: list[dict[str, Any]], by_doc: Any,
    ids: list[str], results: dict[str, dict[str, Any]], save: Callable[[], None],
) -> None:
    """PQ at d/4 and d/8 bytes per token: its error, and F1 of `reader` (the fp32 store's) reading PQ-decoded states,
    into `results` by name; `save` after each, so a later failure keeps the rows measured."""
    dims = reference.shape[1]
    for bytes_per_token in (dims // 4, dims // 8):
        quantizer, measured = train_pq(sample, reference, bytes_per_token)
        reader.store = CodedStore(reader.store, lambda states, q=quantizer: {"codes": q.compute_codes(states)},
                                  lambda arrays, q=quantizer: q.decode(arrays["codes"]), ids)
        measured.update(through_reader(reader, questions, by_doc, ids))
        reader.store = reader.store._store
        results[f"pq{bytes_per_token}x{PQ_BITS}"] = measured
        save()
        print(f"pq{bytes_per_token}x{PQ_BITS}: done", file=sys.stderr, flush=True)


def variants_through_reader(
    sample: np.ndarray, reference: np.ndarray, reader: Any, questions: list[dict[str, Any]], by_doc: Any,
    ids: list[str], results: dict[str, dict[str, Any]], save: Callable[[], None],
) -> None:
    """Each of VARIANTS trained on `sample`: its error on `reference`, sizes, times, and F1 of `reader` reading it,
    into `results` by name; `save` after each, so a later failure keeps the rows measured."""
    for variant in VARIANTS:
        started = time.perf_counter()
        codec = residual_variants.train(sample, variant)
        trained = time.perf_counter()
        arrays = residual_variants.encode(reference, codec)
        encoded = time.perf_counter()
        decoded = residual_variants.decode(arrays, codec)  # (T, d)
        done = time.perf_counter()
        measured = {**errors(reference, decoded), "bytes_per_token": codec.bytes_per_token(reference.shape[1]),
                    "codebook_bytes": codec.table_bytes(), "train_s": trained - started,
                    "encode_s": encoded - trained, "decode_s": done - encoded}
        reader.store = CodedStore(reader.store, functools.partial(residual_variants.encode, codec=codec),
                                  functools.partial(residual_variants.decode, codec=codec), ids)
        measured.update(through_reader(reader, questions, by_doc, ids))
        reader.store = reader.store._store
        results[variant.name] = measured
        save()
        print(f"{variant.name}: done", file=sys.stderr, flush=True)


class CodedStore:
    """An fp32 store whose states come back through a codec, so the reader reads decoded states (PQ, residual variants).

    `encode` turns a passage's states `(n, d)` into per-token arrays by name;
    the arrays of every passage are computed once up front (what such a store
    would hold). fetch reads the fp32 passages for their text and token ids
    (memory-mapped views), joins their arrays and decodes them at once with
    `decode` (arrays of T tokens -> `(T, d)`), so fetch time is decoding time.
    """

    def __init__(self, store: Any, encode: Callable[[np.ndarray], dict[str, np.ndarray]],
                 decode: Callable[[dict[str, np.ndarray]], np.ndarray], ids: list[str]) -> None:
        self._store, self._decode = store, decode
        self._arrays = {p.id: encode(np.ascontiguousarray(p.states, dtype=np.float32)) for p in store.fetch(ids)}

    def fetch(self, passage_ids: list[str]) -> list[Any]:
        passages = self._store.fetch(passage_ids)
        if not passages:
            return []
        names = self._arrays[passages[0].id]
        decoded = self._decode({name: np.concatenate([self._arrays[p.id][name] for p in passages])
                                for name in names})  # (T, d) float32
        bounds = np.cumsum([0, *(len(p.states) for p in passages)])
        return [dataclasses.replace(p, states=decoded[start:stop])
                for p, start, stop in zip(passages, bounds[:-1], bounds[1:], strict=True)]

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)


def through_reader(reader: Any, questions: list[dict[str, Any]], by_doc: dict[str, list[str]],
                   ids: list[str]) -> dict[str, float]:
    """SQuAD F1 (μ = 1, each question against its own paragraph) and the decode time of 100 passages vs the read."""
    from dilstore.reader.evaluation.squad_metric import f1
    from dilstore.reader.serving.answers import aggregate

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
    return {"f1": 100 * float(np.mean(scores)), "fetch_100_s": fetch, "read_100_s": online,
            "decode_share": fetch / (online - fetch)}


def errors(reference: np.ndarray, decoded: np.ndarray) -> dict[str, float]:
    decoded = decoded.astype(np.float32)
    cosine = (reference * decoded).sum(1) / (np.linalg.norm(reference, axis=1) * np.linalg.norm(decoded, axis=1))
    return {"relative_mse": float(np.square(decoded - reference).sum() / np.square(reference).sum()),
            "cosine": float(cosine.mean())}


def parse_arguments(
    doc: str, threads: int, extra: Callable[[argparse.ArgumentParser], None]
) -> tuple[argparse.ArgumentParser, argparse.Namespace]:
    """--work, --paragraphs, --threads, --output and the script's `extra` options; torch and faiss on --threads.
    The parser comes back too, for the usage error of a sample too small (require_sample_tokens)."""
    import faiss
    import torch

    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--paragraphs", type=positive_int, default=60)
    parser.add_argument("--threads", type=positive_int, default=threads)
    parser.add_argument("--output", type=Path)
    extra(parser)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    faiss.omp_set_num_threads(args.threads)
    args.work.mkdir(parents=True, exist_ok=True)
    return parser, args


def require_sample_tokens(parser: argparse.ArgumentParser, option: str, paragraphs: int, tokens: int) -> None:
    """A usage error unless `tokens`, the states of `paragraphs` paragraphs (`option`), fill the smallest sample the
    codecs train on: with fewer, faiss stops with a traceback after every encoding has been computed."""
    if tokens < MIN_SAMPLE_TOKENS:
        estimate = -(-paragraphs * MIN_SAMPLE_TOKENS // max(tokens, 1))
        parser.error(f"{option} {paragraphs}: those paragraphs hold {tokens:,} tokens, and the codecs compared need a "
                     f"sample of at least {MIN_SAMPLE_TOKENS:,} (k-means with {MOST_CENTROIDS:,} centroids, PQ with "
                     f"{2**PQ_BITS} per sub-quantizer): give more, about {option} {estimate} at this "
                     "many tokens per paragraph")


def save_json(results: dict[str, Any], output: Path | None) -> None:
    """Write `results` to `output` (if given) as JSON: after every stage, so that a failure keeps what was measured."""
    if output:
        output.write_text(json.dumps(results, indent=1) + "\n", encoding="utf-8")


def print_table(rows: dict[str, dict[str, Any]]) -> None:
    """One line per encoding or method: bytes per token (the JSON's `bytes_per_token`: `dilstore info`'s total for
    the stores, codebook included, the codes alone for PQ and the variants) and the stores' marginal bytes, error
    against fp32, SQuAD F1 and the decode share of 100 passages; "-" where a row has no such figure."""

    def cell(row: dict[str, Any], key: str, spec: str, scale: float = 1.0) -> str:
        return format(scale * row[key], spec) if key in row else "-"

    width = max(len("method"), *(len(name) for name in rows))
    print(f"{'method':<{width}} {'B/token':>8} {'marginal':>8} {'rel. MSE':>9} {'cosine':>7} {'F1':>6} "
          f"{'fetch 100 ms':>12} {'read 100 ms':>11} {'decode share':>12}")  # fmt: skip
    for name, row in rows.items():
        print(f"{name:<{width}} {cell(row, 'bytes_per_token', '.1f'):>8} "
              f"{cell(row, 'state_bytes_per_token_marginal', '.0f'):>8} {cell(row, 'relative_mse', '.4f'):>9} "
              f"{cell(row, 'cosine', '.4f'):>7} {cell(row, 'f1', '.2f'):>6} "
              f"{cell(row, 'fetch_100_s', '.2f', 1000):>12} {cell(row, 'read_100_s', '.1f', 1000):>11} "
              f"{cell(row, 'decode_share', '.4f'):>12}")  # fmt: skip


def main() -> None:
    squad = Path(__file__).resolve().parents[1] / "../shared/data/squad/dev-v1.1.json"
    parser, args = parse_arguments(__doc__, 2, lambda parser: parser.add_argument("--squad", type=Path, default=squad))

    from dilstore.reader.serving.odqa import open_reader

    corpus = args.work / "squad-subset.json"
    questions = squad_subset(args.squad, args.paragraphs, corpus)
    results: dict[str, Any] = {"paragraphs": args.paragraphs, "questions": len(questions), "threads": args.threads,
                               "complete": False, "encodings": {}}
    save = functools.partial(save_json, results, args.output)
    states: dict[str, np.ndarray] = {}
    readers: dict[str, Any] = {}
    for encoding in ENCODINGS:
        store = args.work / encoding
        seconds = precompute(corpus, store, encoding, args.threads)
        info = json.loads(subprocess.run([*CLI, "info", str(store), "--json"], check=True, capture_output=True,
                                         text=True).stdout)
        verified = subprocess.run([*CLI, "verify", str(store), "--json"], capture_output=True, text=True)
        table = pa.concat_tables(
            [pq.read_table(part) for part in sorted((store / "passages").glob("*.parquet"))]
        ).to_pydict()
        ids = table["id"]
        reader = readers[encoding] = open_reader(store, with_index=False)
        states[encoding] = np.concatenate([p.states for p in reader.store.fetch(ids)]).astype(np.float32)
        if encoding == "fp32":  # the first: the sample is these states, known before the other encodings run
            require_sample_tokens(parser, "--paragraphs", args.paragraphs, len(states[encoding]))
        by_doc: dict[str, list[str]] = {}
        for passage_id, doc_id in zip(ids, table["doc_id"], strict=True):
            by_doc.setdefault(doc_id, []).append(passage_id)
        results["encodings"][encoding] = {
            "precompute_s": seconds,
            "tokens": info["tokens"],
            "shards": info["shards"],
            "bytes_per_token": info["bytes_per_token"]["dilbert"],
            "state_bytes_per_token_marginal": info["state_bytes_per_token_marginal"],
            "state_bytes_fixed": info["state_bytes"]["fixed"],
            "verify_ok": verified.returncode == 0,
            **through_reader(reader, questions, by_doc, ids),
        }
        save()
        print(f"{encoding}: done", file=sys.stderr, flush=True)
    reference = states["fp32"]
    for encoding in ENCODINGS[1:]:
        results["encodings"][encoding].update(errors(reference, states[encoding]))
    from dilstore.storage.residual_codes import CODEBOOK_SAMPLE_TOKENS, sample_rows

    sample = reference[sample_rows(len(reference), CODEBOOK_SAMPLE_TOKENS)]
    save()
    results["pq"], results["variants"] = {}, {}
    pq_through_reader(sample, reference, readers["fp32"], questions, by_doc, ids, results["pq"], save)
    variants_through_reader(sample, reference, readers["fp32"], questions, by_doc, ids, results["variants"], save)
    results["complete"] = True
    save()
    print_table({**results["encodings"], **results["pq"], **results["variants"]})
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
