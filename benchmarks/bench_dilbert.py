"""DilBert speed: the seed's Table 1 protocol (q questions × p passages), full model against k = l-2 and l-1.

For each model size it times, on real SQuAD dev questions and paragraphs:

- Full: the unmodified Hugging Face QA model on every `[CLS] q [SEP] p [SEP]` pair ("I Q-P" only);
- DilBert k=l-2 and k=l-1: "NI Q" (layers 1..k over the q questions), "NI P" (layers 1..k over the p
  passages) and "I Q-P" (layers k+1..l and the QA head over every question–passage pair).

Both sides use the same batching and padding: pairs go in batches of --batch-size passages for one
question, each batch padded to its longest member; NI Q and NI P use the same batch size. NI Q and NI P
always cover all q questions and p passages. I Q-P covers --pairs-questions questions × all p passages;
when that is fewer than q, the q×p column is computed from the measured per-pair rate and says so.

Sizes: "minilm" is the packaged all-MiniLM-L6-v2 (real encoder weights; its QA head is the seeded
initialisation, since no fine-tuned head ships with it; speed is all that is measured), "bert-base" has
BERT-base dimensions (12 layers, hidden 768, 12 heads) with random weights, for speed only.

    python benchmarks/bench_dilbert.py --sizes minilm --pairs-questions 3 --json-out /tmp/bench-dilbert.json
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch
import transformers
from transformers import (
    AutoModelForQuestionAnswering,
    AutoTokenizer,
    BertConfig,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from dilstore.reader.modeling.checkpoints import base_model_dir
from dilstore.reader.modeling.dilbert import DilBertReader
from dilstore.runners.arg_types import positive_int
from dilstore.runners.outputs import check_output_option

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_SQUAD = ROOT.parent / "shared" / "data" / "squad" / "dev-v1.1.json"
SIZES = ("minilm", "bert-base")
WEIGHTS_LABEL = {
    "minilm": "all-MiniLM-L6-v2, real encoder weights (QA head: seeded init; speed only)",
    "bert-base": "BERT-base dimensions (12 layers, hidden 768, 12 heads), random weights, speed only",
}


@dataclass(frozen=True)
class Workload:
    """Token ids of the benchmark's questions (`[CLS] q [SEP]`) and passages (`p [SEP]`), truncated."""

    questions: list[list[int]]
    passages: list[list[int]]


@dataclass(frozen=True)
class Padded:
    """A right-padded batch: ids (b, n), 1/0 mask (b, n) and segment ids (b, n)."""

    ids: torch.Tensor
    mask: torch.Tensor
    segments: torch.Tensor


def load_workload(
    squad: Path, questions: int, passages: int, question_length: int, passage_length: int,
    tokenizer: PreTrainedTokenizerBase,
) -> Workload:
    """The first `passages` SQuAD dev paragraphs and the first `questions` dev questions, tokenized and truncated."""
    document = json.loads(squad.read_text(encoding="utf-8"))
    paragraphs = [paragraph for article in document["data"] for paragraph in article["paragraphs"]]
    texts = [paragraph["context"] for paragraph in paragraphs][:passages]
    asked = [qa["question"] for paragraph in paragraphs for qa in paragraph["qas"]][:questions]
    if len(texts) < passages or len(asked) < questions:
        raise SystemExit(f"{squad} has only {len(texts)} paragraphs and {len(asked)} questions")
    sep = tokenizer.sep_token_id
    return Workload(
        questions=[
            tokenizer(text, truncation=True, max_length=question_length)["input_ids"] for text in asked
        ],
        passages=[
            tokenizer(text, add_special_tokens=False)["input_ids"][: passage_length - 1] + [sep] for text in texts
        ],
    )


def pad(sequences: Sequence[list[int]], segment_lengths: Sequence[int] | None = None) -> Padded:
    """Right-pad id lists; segment id 1 from `segment_lengths[i]` on in row i (0 everywhere when None)."""
    length = max(len(sequence) for sequence in sequences)
    ids = torch.zeros((len(sequences), length), dtype=torch.long)  # (b, n)
    mask = torch.zeros_like(ids)  # (b, n)
    segments = torch.zeros_like(ids)  # (b, n)
    for row, sequence in enumerate(sequences):
        ids[row, : len(sequence)] = torch.tensor(sequence)
        mask[row, : len(sequence)] = 1
        if segment_lengths is not None:
            segments[row, segment_lengths[row] : len(sequence)] = 1
    return Padded(ids, mask, segments)


def batches(count: int, size: int) -> list[range]:
    return [range(start, min(start + size, count)) for start in range(0, count, size)]


class FullModelRun:
    """The unmodified QA model on `measured` questions × all passages, in batches of pairs (I Q-P only)."""

    def __init__(self, model: PreTrainedModel, workload: Workload, measured: int, batch_size: int) -> None:
        self.model = model
        self.pair_batches = [
            pad([question + workload.passages[j] for j in chunk], [len(question)] * len(chunk))
            for question in workload.questions[:measured]
            for chunk in batches(len(workload.passages), batch_size)
        ]

    def warm_up(self) -> None:
        self._run(self.pair_batches[:1])

    def phases(self) -> dict[str, Callable[[], None]]:
        return {"i_qp": lambda: self._run(self.pair_batches)}

    def _run(self, selected: list[Padded]) -> None:
        for batch in selected:
            self.model(input_ids=batch.ids, attention_mask=batch.mask, token_type_ids=batch.segments)


class SplitModelRun:
    """DilBert: NI Q over all questions, NI P over all passages, I Q-P over `measured` questions × all passages."""

    def __init__(self, reader: DilBertReader, workload: Workload, measured: int, batch_size: int) -> None:
        self.reader = reader
        self.measured = measured
        self.question_batches = [
            pad([workload.questions[i] for i in chunk]) for chunk in batches(len(workload.questions), batch_size)
        ]
        self.passage_batches = [
            pad([workload.passages[j] for j in chunk]) for chunk in batches(len(workload.passages), batch_size)
        ]
        self.question_states: list[tuple[torch.Tensor, torch.Tensor]] = []  # per question: (1, nq, d), (1, nq)
        self.passage_states: list[tuple[torch.Tensor, torch.Tensor]] = []  # per batch: (b, np, d), (b, np)

    def warm_up(self) -> None:
        self._encode_questions(self.question_batches[:1])
        self._encode_passages(self.passage_batches[:1])
        self._interact(1)

    def phases(self) -> dict[str, Callable[[], None]]:
        """In this order: I Q-P uses the states the NI phases leave."""
        return {
            "ni_q": lambda: self._encode_questions(self.question_batches),
            "ni_p": lambda: self._encode_passages(self.passage_batches),
            "i_qp": lambda: self._interact(self.measured),
        }

    def _encode_questions(self, selected: list[Padded]) -> None:
        self.question_states.clear()
        for batch in selected:
            states = self.reader.encode_questions(batch.ids, batch.mask)  # (b, nq, d)
            for row in range(states.shape[0]):
                length = int(batch.mask[row].sum())
                self.question_states.append((states[row : row + 1, :length], batch.mask[row : row + 1, :length]))

    def _encode_passages(self, selected: list[Padded]) -> None:
        self.passage_states.clear()
        for batch in selected:
            self.passage_states.append((self.reader.encode_passages(batch.ids, batch.mask), batch.mask))

    def _interact(self, questions: int) -> None:
        for states, mask in self.question_states[:questions]:  # (1, nq, d), (1, nq)
            for passages, passage_mask in self.passage_states:  # (b, np, d), (b, np)
                self.reader.interact(states, mask, passages, passage_mask)


def measure(runs: dict[str, FullModelRun | SplitModelRun], repeats: int) -> dict[str, dict[str, list[float]]]:
    """Seconds per phase per run, `repeats` times, the runs interleaved so that background load hits all alike."""
    for run in runs.values():
        run.warm_up()
    samples: dict[str, dict[str, list[float]]] = {name: {} for name in runs}
    for _ in range(repeats):
        for name, run in runs.items():
            for phase, work in run.phases().items():
                start = time.perf_counter()
                work()
                samples[name].setdefault(phase, []).append(time.perf_counter() - start)
    return samples


def build_model(size: str) -> PreTrainedModel:
    """The size's QA model in fp32 with sdpa attention, in eval mode."""
    if size == "minilm":
        return DilBertReader.from_pretrained(base_model_dir(), layers=0).model
    torch.manual_seed(0)
    config = BertConfig(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072)
    return AutoModelForQuestionAnswering.from_config(config, attn_implementation="sdpa").eval()


def benchmark_size(
    size: str, workload: Workload, measured: int, batch_size: int, repeats: int, tokenizer: PreTrainedTokenizerBase
) -> dict[str, Any]:
    """Time the full model and DilBert at k = l-2 and l-1 for one model size; each phase's median of `repeats`."""
    model = build_model(size)
    layers = model.config.num_hidden_layers
    questions, passages = len(workload.questions), len(workload.passages)
    pairs_measured, pairs_protocol = measured * passages, questions * passages
    splits = {f"k={k}": k for k in (layers - 2, layers - 1)}
    runs: dict[str, FullModelRun | SplitModelRun] = {"full": FullModelRun(model, workload, measured, batch_size)}
    for name, k in splits.items():
        runs[name] = SplitModelRun(DilBertReader(model, tokenizer, layers=k), workload, measured, batch_size)
    with torch.inference_mode():
        samples = measure(runs, repeats)
    columns = []
    for name, phases in samples.items():
        k = splits.get(name)
        seconds = {phase: statistics.median(values) for phase, values in phases.items()}
        per_pair = seconds["i_qp"] / pairs_measured
        column: dict[str, Any] = {
            "name": name,
            "k": k,
            "ni_q": seconds.get("ni_q", 0.0),
            "ni_p": seconds.get("ni_p", 0.0),
            "i_qp": seconds["i_qp"],
            "samples": phases,
            "i_qp_per_pair_ms": 1000 * per_pair,
            "i_qp_protocol": per_pair * pairs_protocol,
            "i_qp_protocol_computed": measured < questions,
        }
        column["total_protocol"] = column["ni_q"] + column["ni_p"] + column["i_qp_protocol"]
        column["normalised"] = {
            "ni_q": column["ni_q"] / (k * questions) if k else None,
            "ni_p": column["ni_p"] / (k * passages) if k else None,
            "i_qp": per_pair / (layers - (k or 0)),
        }
        columns.append(column)
    full = columns[0]
    for column in columns:
        column["i_qp_speedup"] = full["i_qp"] / column["i_qp"]
        column["total_speedup"] = full["total_protocol"] / column["total_protocol"]
        if column["k"] is not None:
            column["i_qp_target"] = 0.9 * layers / (layers - column["k"])
            column["i_qp_target_met"] = column["i_qp_speedup"] >= column["i_qp_target"]
    return {
        "size": size,
        "weights": WEIGHTS_LABEL[size],
        "layers": layers,
        "hidden_size": model.config.hidden_size,
        "pairs_measured": pairs_measured,
        "pairs_protocol": pairs_protocol,
        "repeats": repeats,
        "columns": columns,
    }


def render_table(result: dict[str, Any], settings: dict[str, Any]) -> str:
    """One size in the seed's Table 1 layout: rows NI Q, NI P, I Q-P, Total, Speedup; a column per model."""
    columns = result["columns"]
    computed = columns[0]["i_qp_protocol_computed"]
    names = ["Full"] + [f"DilBert {column['name']}" for column in columns[1:]]

    def cell(value: float | None, normalised: float | None = None) -> str:
        if value is None:
            return ""
        return f"{value:.1f} ({normalised:.1e})" if normalised is not None else f"{value:.1f}"

    qp_label = f"I Q-P, {settings['questions']}×{settings['passages']}" + (" (computed)" if computed else "")
    rows = [
        ("NI Q", [None] + [cell(c["ni_q"], c["normalised"]["ni_q"]) for c in columns[1:]]),
        ("NI P", [None] + [cell(c["ni_p"], c["normalised"]["ni_p"]) for c in columns[1:]]),
        (f"I Q-P, {result['pairs_measured']} pairs (measured)", [cell(c["i_qp"]) for c in columns]),
        (qp_label, [cell(c["i_qp_protocol"], c["normalised"]["i_qp"]) for c in columns]),
        ("Total" + (" (computed)" if computed else ""), [cell(c["total_protocol"]) for c in columns]),
        ("Speedup total", [f"x{c['total_speedup']:.1f}" for c in columns]),
        ("Speedup I Q-P", [f"x{c['i_qp_speedup']:.1f}" for c in columns]),
        (
            "I Q-P target 0.9·l/(l−k)",
            [""]
            + [f"x{c['i_qp_target']:.1f} {'met' if c['i_qp_target_met'] else 'NOT met'}" for c in columns[1:]],
        ),
    ]
    header = "seconds, median of repeats (s per block per input)"
    label_width = max(len(header), *(len(label) for label, _ in rows))
    widths = [max(len(name), *(len(values[i] or "") for _, values in rows)) for i, name in enumerate(names)]
    lines = [
        f"{result['size']}: {result['weights']}; l={result['layers']}, hidden {result['hidden_size']}",
        f"{header:<{label_width}}  " + "  ".join(f"{n:>{w}}" for n, w in zip(names, widths)),
    ]
    for label, values in rows:
        lines.append(f"{label:<{label_width}}  " + "  ".join(f"{(v or ''):>{w}}" for v, w in zip(values, widths)))
    return "\n".join(lines)


def parse_arguments(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--questions", type=positive_int, default=100, help="q: questions (default 100, the protocol)")
    parser.add_argument("--passages", type=positive_int, default=100, help="p: passages (default 100, the protocol)")
    parser.add_argument(
        "--pairs-questions",
        type=positive_int,
        default=None,
        help="time I Q-P for this many questions × all p passages (default: all q); fewer is computed up to q×p",
    )
    parser.add_argument(
        "--batch-size", type=positive_int, default=32, help="pairs / questions / passages per batch (32)"
    )
    parser.add_argument(
        "--question-length", type=positive_int, default=32, help="max question tokens incl. [CLS], [SEP] (32)"
    )
    parser.add_argument("--passage-length", type=positive_int, default=192, help="max passage tokens incl. [SEP] (192)")
    parser.add_argument("--sizes", default=",".join(SIZES), help=f"comma-separated, of {', '.join(SIZES)}")
    parser.add_argument(
        "--repeats", type=positive_int, default=3, help="timed repetitions per phase; the median is reported (3)"
    )
    parser.add_argument("--threads", type=positive_int, default=None, help="torch intra-op threads (default: torch's)")
    parser.add_argument("--squad", type=Path, default=DEFAULT_SQUAD, help="SQuAD v1.1 dev JSON")
    parser.add_argument("--json-out", type=Path, default=None, help="also write the JSON result here")
    arguments = parser.parse_args(argv)
    check_output_option(parser, arguments.json_out, "--json-out")
    arguments.pairs_questions = arguments.pairs_questions or arguments.questions
    sizes = arguments.sizes.split(",")
    if unknown := [size for size in sizes if size not in SIZES]:
        parser.error(f"unknown size(s) {unknown}; choose from {', '.join(SIZES)}")
    if not 1 <= arguments.pairs_questions <= arguments.questions:
        parser.error("--pairs-questions must be in 1..--questions")
    if not arguments.squad.is_file():
        parser.error(f"SQuAD dev file not found: {arguments.squad}")
    arguments.sizes = sizes
    return arguments


def main(argv: Sequence[str] | None = None) -> int:
    arguments = parse_arguments(argv)
    if arguments.threads:
        torch.set_num_threads(arguments.threads)
    tokenizer = AutoTokenizer.from_pretrained(base_model_dir())
    workload = load_workload(
        arguments.squad,
        arguments.questions,
        arguments.passages,
        arguments.question_length,
        arguments.passage_length,
        tokenizer,
    )
    settings = {
        "questions": arguments.questions,
        "passages": arguments.passages,
        "pairs_questions": arguments.pairs_questions,
        "batch_size": arguments.batch_size,
        "repeats": arguments.repeats,
        "question_length_max": arguments.question_length,
        "passage_length_max": arguments.passage_length,
        "question_tokens_mean": sum(map(len, workload.questions)) / len(workload.questions),
        "passage_tokens_mean": sum(map(len, workload.passages)) / len(workload.passages),
        "threads": torch.get_num_threads(),
        "device": "cpu",
        "processor": platform.processor() or platform.machine(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join([Path(sys.argv[0]).name, *(argv if argv is not None else sys.argv[1:])]),
    }
    results = []
    for size in arguments.sizes:
        result = benchmark_size(
            size, workload, arguments.pairs_questions, arguments.batch_size, arguments.repeats, tokenizer
        )
        results.append(result)
        print(render_table(result, settings), end="\n\n", flush=True)
    document = {"benchmark": "dilbert-table1", "settings": settings, "results": results}
    text = json.dumps(document, indent=1)
    print(text)
    if arguments.json_out:
        arguments.json_out.write_text(text + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
