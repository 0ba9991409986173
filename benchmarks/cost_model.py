"""Cost model (#15, #16): store size, precompute hours and a GPU estimate for full English Wikipedia and MS MARCO.

It measures nothing. It computes from the figures in benchmarks/cost_inputs.json, each copied from
BENCHMARKS.md with its section, unit, date and status (measured, given, spec or assumed). For every
corpus × store kind (dilbert, earl-s1, earl-s2) × encoding (fp16, int8, 2bit, 1bit) it gives:

- storage (derived): tokens × (measured state bytes per token + measured token id/span bytes per
  token) + passages × the measured id-index bytes per passage. Texts, titles and the manifest are
  left out.
- precompute on the 2-vCPU development VM (derived): tokens ÷ the kind's measured fp16 rate of the
  whole `dilstore precompute` command, plus the measured extra encoder time of the encoding per token
  (one thread, scaled by the kind's stored values per token), plus, for codebook encodings, the
  sampling pass (512 documents through the offline layers at the same rate) and the measured
  codebook training. Also in core-hours (× the VM's vCPUs).
- a GPU ESTIMATE (no GPU run of precompute exists): the largest of three floors, each from a stated
  assumption: the offline layers' FLOPs at an assumed fraction of an H100's datasheet bf16 peak; the
  measured encoder time spread over the assumed host cores; the store's bytes at an assumed write
  bandwidth. Reading, tokenizing and Beam overheads are not in it, so the real time is higher.

It also shows how the id index and `open_store` time grow with the passage count: the scale
section's measured points, their least-squares lines (bench_scale.fit), and the fitted values at
1M, 10M and 34.65M passages; and it checks the precompute model against the measured 2bit/1bit
DL19 runs it was not built from.

    python benchmarks/cost_model.py [--inputs benchmarks/cost_inputs.json] [--output /tmp/cost-model.json]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_scale import fit  # noqa: E402

from dilstore.storage.encodings import get_encoding  # noqa: E402
from dilstore.storage.format import KINDS  # noqa: E402

INPUTS = Path(__file__).resolve().parent / "cost_inputs.json"
ENTRY_FIELDS = ("value", "unit", "source", "date", "status")
STATUSES = ("measured", "given", "spec", "assumed")
DESCRIPTIONS = ("about", "what")  # keys whose value is plain prose, not an entry
ENCODINGS = ("fp16", "int8", "2bit", "1bit")
GROWTH_PASSAGES = (1_000_000, 10_000_000, 34_650_000)
TB = 1e12
HOUR = 3600.0


class InputError(ValueError):
    """The inputs file is missing or unreadable, not JSON, or has an entry without a required field or with a
    value that is no positive finite number (or list of [x, y] pairs of them), or names a kind or encoding the
    model lacks."""


# ---- inputs ----

def entries(tree: dict[str, Any], prefix: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    """Every entry of the inputs tree as (dotted path, entry); descriptions are skipped."""
    for key, node in tree.items():
        path = f"{prefix}{key}"
        if key in DESCRIPTIONS:
            continue
        if not isinstance(node, dict):
            raise InputError(f"{path} is neither an entry nor a group")
        if "value" in node:
            yield path, node
        else:
            yield from entries(node, f"{path}.")


def check_entries(tree: dict[str, Any]) -> None:
    """Every entry carries value, unit, source, date and a known status; its value is a positive finite number or a
    list of [x, y] pairs of them (a zero divided, a string or a negative gave a traceback or a negative cost); the
    kinds and encodings named are the model's."""
    if not isinstance(tree, dict):
        raise InputError(f"the inputs are a JSON object of entries, not {type(tree).__name__}")
    for path, entry in entries(tree):
        missing = [field for field in ENTRY_FIELDS if entry.get(field) in (None, "")]
        if missing:
            raise InputError(f"{path} lacks {', '.join(missing)}")
        if entry["status"] not in STATUSES:
            raise InputError(f"{path} has status {entry['status']!r}, not one of {', '.join(STATUSES)}")
        value = entry["value"]
        if "_by_" in path.rpartition(".")[2]:  # a measured series, "y_by_x": [[x, y], ...]
            pairs = isinstance(value, list) and all(isinstance(pair, list) and len(pair) == 2 for pair in value)
            if not pairs or not value or not all(_positive(x) for pair in value for x in pair):
                raise InputError(f"{path} has value {value!r:.80}: not a list of [x, y] pairs of positive finite "
                                 "numbers")  # fmt: skip
        elif not _positive(value):
            raise InputError(f"{path} has value {value!r:.80}: not a positive finite number")
        elif path.endswith(".utilisation") and value > 1:
            raise InputError(f"{path} has value {value!r:.80}: a share of the peak, at most 1")
    _check_names("kinds", tree.get("kinds", {}), KINDS)
    for kind, groups in tree.get("kinds", {}).items():
        _check_names(f"kinds.{kind}.state_bytes_per_token", groups.get("state_bytes_per_token", {}), ENCODINGS)
    _check_names("encode_us_per_token", tree.get("encode_us_per_token", {}), ENCODINGS)


def _positive(value: Any) -> bool:
    """A number above 0 that is neither a bool nor infinite nor NaN, nor an int too large for a float."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    try:
        number = float(value)
    except OverflowError:
        return False
    return number > 0 and math.isfinite(number)


def _check_names(path: str, group: Any, known: Sequence[str]) -> None:
    """The group's entries are named for `known` names (an unknown one was computed as another's, or ignored)."""
    unknown = sorted(set(group) - set(known) - set(DESCRIPTIONS)) if isinstance(group, dict) else []
    if unknown:
        raise InputError(f"{path} names {', '.join(map(repr, unknown))}, not one of {', '.join(known)}")


def values(tree: dict[str, Any]) -> dict[str, Any]:
    """The inputs tree with every entry replaced by its value."""
    return {key: node["value"] if "value" in node else values(node)
            for key, node in tree.items() if key not in DESCRIPTIONS}


def read_inputs(path: Path) -> dict[str, Any]:
    """Load, check and reduce the inputs file to plain values."""
    try:
        tree = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InputError(f"{path} does not exist") from None
    except (OSError, UnicodeDecodeError) as error:
        raise InputError(f"cannot read {path}: {error}") from None
    except json.JSONDecodeError as error:
        raise InputError(f"{path} is not JSON: {error}") from None
    check_entries(tree)
    return values(tree)


# ---- arithmetic ----

def corpus_tokens(corpus: dict[str, float]) -> float:
    """A corpus's tokens: given outright, or passages × tokens per passage."""
    return corpus["tokens"] if "tokens" in corpus else corpus["passages"] * corpus["tokens_per_passage"]


def storage_bytes(tokens: float, passages: float, state_per_token: float, ids_per_token: float,
                  index_per_passage: float) -> dict[str, float]:
    """Store bytes by part: states and token ids/spans per token, the id index per passage."""
    parts = {"states": tokens * state_per_token, "token_ids_and_spans": tokens * ids_per_token,
             "index": passages * index_per_passage}
    return {**parts, "total": sum(parts.values())}


def precompute_seconds(tokens: float, tokens_per_passage: float, kind: dict[str, Any], encoding: str,
                       inputs: dict[str, Any]) -> dict[str, float]:
    """Precompute seconds on the VM by part (see the module docstring); `kind` is one of inputs["kinds"]."""
    rate = kind["precompute_tokens"] / kind["precompute_seconds"]  # tokens/s, fp16, whole command
    encode = inputs["encode_us_per_token"]
    scale = kind["values_per_token"] / inputs["model"]["hidden"]  # encoder cost ∝ values stored per token
    extra_us = max(0.0, encode[encoding] - encode["fp16"]) * scale
    codebook = inputs["codebook"]
    sampling = (codebook["sample_documents"] * tokens_per_passage / rate + codebook["train_seconds"]
                if get_encoding(encoding).codebook else 0.0)
    parts = {"offline_layers_and_write": tokens / rate, "extra_encode": tokens * extra_us * 1e-6,
             "codebook_sampling": sampling}
    return {**parts, "total": sum(parts.values())}


def flops_per_token(model: dict[str, float], kind: str, window: float) -> float:
    """Offline FLOPs per token: the offline BERT layers (QKV, output, FFN, attention over `window` tokens),
    and for earl-s2 each judger block's key and value projections."""
    d, f = model["hidden"], model["intermediate"]
    layer = 2 * (4 * d * d + 2 * d * f) + 4 * window * d
    judger = model["judger_blocks"] * 2 * 2 * d * d if kind == "earl-s2" else 0.0
    return model["offline_layers"] * layer + judger


def gpu_estimate_seconds(tokens: float, flops: float, encode_us: float, store_bytes: float,
                         gpu: dict[str, float]) -> dict[str, Any]:
    """ESTIMATE: the largest of the model, host-encode and write floors, each from gpu's assumptions."""
    floors = {"model_flops": tokens * flops / (gpu["peak_bf16_flops"] * gpu["utilisation"]),
              "host_encode": tokens * encode_us * 1e-6 / gpu["host_cores"],
              "write": store_bytes / gpu["write_bytes_per_s"]}
    bound = max(floors, key=floors.__getitem__)
    return {**floors, "total": floors[bound], "bound_by": bound}


def cost_rows(inputs: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per corpus × kind × encoding: storage, CPU hours on the VM, and the GPU estimate."""
    rows = []
    for corpus_name, corpus in inputs["corpora"].items():
        tokens = corpus_tokens(corpus)
        per_passage = tokens / corpus["passages"]
        for kind_name, kind in inputs["kinds"].items():
            flops = flops_per_token(inputs["model"], kind_name, per_passage)
            scale = kind["values_per_token"] / inputs["model"]["hidden"]
            for encoding in ENCODINGS:
                stored = storage_bytes(tokens, corpus["passages"], kind["state_bytes_per_token"][encoding],
                                       inputs["token_ids_and_spans_bytes_per_token"], inputs["index_bytes_per_passage"])
                cpu = precompute_seconds(tokens, per_passage, kind, encoding, inputs)
                gpu = gpu_estimate_seconds(tokens, flops, inputs["encode_us_per_token"][encoding] * scale,
                                           stored["total"], inputs["gpu"])
                rows.append({
                    "corpus": corpus_name, "kind": kind_name, "encoding": encoding, "passages": corpus["passages"],
                    "tokens": tokens, "state_bytes_per_token": kind["state_bytes_per_token"][encoding],
                    "storage_bytes": stored, "cpu_seconds": cpu, "cpu_hours": cpu["total"] / HOUR,
                    "core_hours": cpu["total"] / HOUR * inputs["vm_vcpus"], "flops_per_token": flops,
                    "gpu_estimate_seconds": gpu, "gpu_estimate_hours": gpu["total"] / HOUR,
                })
    return rows


def growth(points: Sequence[Sequence[float]], at: Sequence[float]) -> dict[str, Any]:
    """The least-squares line through measured (x, y) points and its value at each x in `at`;
    an x that was measured reports the measurement."""
    measured = {x: y for x, y in points}
    intercept, slope = fit([x for x, _ in points], [y for _, y in points])
    return {"intercept": intercept, "slope": slope,
            "at": [{"x": x, "value": measured.get(x, intercept + slope * x),
                    "status": "measured" if x in measured else "fitted"} for x in at]}


def scale_growth(scale: dict[str, Any], passages: Sequence[int] = GROWTH_PASSAGES) -> dict[str, Any]:
    """Id-index bytes and open time against the passage count (25k per shard) and against the shard count."""
    shards = [-(-n // scale["passages_per_shard"]) for n in passages]
    return {"passages": list(passages), "shards": shards,
            "index_bytes": growth(scale["index_bytes_by_passages"], passages),
            "open_ms_by_passages": growth(scale["open_ms_by_passages"], passages),
            "open_ms_by_shards": growth(scale["open_ms_by_shards"], [*shards, scale["max_shards"]]),
            "manifest_bytes": [n * scale["manifest_bytes_per_shard"] for n in [*shards, scale["max_shards"]]]}


def dl19_check(inputs: dict[str, Any]) -> list[dict[str, Any]]:
    """The precompute model against measured runs it was not fitted to: 2bit/1bit DL19 stores."""
    check = inputs["check"]
    rows = []
    for kind_name, measured in check.items():
        if kind_name == "dl19_passages":
            continue
        kind = inputs["kinds"][kind_name]
        per_passage = kind["precompute_tokens"] / check["dl19_passages"]
        for encoding, seconds in measured.items():
            model = precompute_seconds(kind["precompute_tokens"], per_passage, kind, encoding, inputs)["total"]
            rows.append({"kind": kind_name, "encoding": encoding, "measured_s": seconds, "model_s": model,
                         "model_over_measured": model / seconds})
    return rows


def cost_model(inputs: dict[str, Any]) -> dict[str, Any]:
    """Everything the report shows, as plain data."""
    return {"rows": cost_rows(inputs), "growth": scale_growth(inputs["scale"]), "check": dl19_check(inputs),
            "gpu_assumptions": inputs["gpu"]}


# ---- output ----

def render(result: dict[str, Any]) -> str:
    """Markdown tables of a cost_model() result."""
    gpu = result["gpu_assumptions"]
    lines = [
        "| corpus | kind | encoding | state B/token (measured) | storage TB (derived) | CPU h, 2-vCPU VM (derived) "
        "| core-h (derived) | GPU h (ESTIMATE) | GPU bound by |",
        "|---|---|---|---:|---:|---:|---:|---:|---|",
    ]
    for row in result["rows"]:
        lines.append(
            f"| {row['corpus']} | {row['kind']} | {row['encoding']} | {row['state_bytes_per_token']:,.2f} | "
            f"{row['storage_bytes']['total'] / TB:.3f} | {row['cpu_hours']:,.0f} | {row['core_hours']:,.0f} | "
            f"{row['gpu_estimate_hours']:.2f} | {row['gpu_estimate_seconds']['bound_by']} |")
    lines += ["", f"GPU ESTIMATE assumptions (none measured): {gpu['peak_bf16_flops'] / 1e12:.0f} TFLOP/s bf16 peak "
                  f"at {gpu['utilisation']:.0%} utilisation, {gpu['host_cores']:.0f} host cores encoding, "
                  f"{gpu['write_bytes_per_s'] / 1e9:.1f} GB/s store writes; reading, tokenizing and Beam not included.",
              "", "| passages | shards (25k each) | id index MB | open ms, fit in passages | open ms, fit in shards "
                  "| manifest MB |", "|---:|---:|---:|---:|---:|---:|"]
    grown = result["growth"]
    for i, passages in enumerate(grown["passages"]):
        index, by_n, by_shards = (grown[key]["at"][i]
                                  for key in ("index_bytes", "open_ms_by_passages", "open_ms_by_shards"))
        lines.append(f"| {passages:,} | {grown['shards'][i]:,} | {index['value'] / 1e6:.1f} ({index['status']}) | "
                     f"{by_n['value']:.0f} ({by_n['status']}) | {by_shards['value']:.0f} ({by_shards['status']}) | "
                     f"{grown['manifest_bytes'][i] / 1e6:.2f} |")
    capped = grown["open_ms_by_shards"]["at"][-1]
    lines += [f"| (precompute's cap) | {capped['x']:,} | | | {capped['value']:.0f} ({capped['status']}) | "
              f"{grown['manifest_bytes'][-1] / 1e6:.2f} |",
              "", "| check: DL19 precompute | measured s | model s | model / measured |", "|---|---:|---:|---:|"]
    for row in result["check"]:
        lines.append(f"| {row['kind']} {row['encoding']} | {row['measured_s']:.1f} | {row['model_s']:.1f} | "
                     f"{row['model_over_measured']:.2f} |")
    return "\n".join(lines)


def parse_arguments(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--inputs", type=Path, default=INPUTS, help="the measured inputs (default: %(default)s)")
    parser.add_argument("--output", type=Path, help="also write the JSON here")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_arguments(argv)
    if args.output is not None and not args.output.parent.is_dir():
        print(f"cost_model: error: --output {args.output}: the folder {args.output.parent} does not exist",
              file=sys.stderr)
        return 2
    try:
        result = cost_model(read_inputs(args.inputs))
        document = json.dumps(result, allow_nan=False)
    except (InputError, KeyError) as error:
        print(f"cost_model: error: {error if isinstance(error, InputError) else f'inputs lack {error}'}",
              file=sys.stderr)
        return 2
    except ValueError:  # a product of finite inputs overflowed: JSON has no Infinity
        print("cost_model: error: the inputs give a result too large for a number (Infinity); check their scale",
              file=sys.stderr)
        return 2
    print(render(result))
    print(document)
    if args.output is not None:
        args.output.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
