"""benchmarks/ensemble_readers.py: each reader scored as evaluate-rc scores it, from one pass, and their mean."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from dilstore.reader.evaluation.reading_comprehension import evaluate_file
from dilstore.reader.modeling.dilbert import DilBertReader
from tests.fixtures.benchmarks import benchmark_module


def write_readers(base: Path, root: Path) -> list[Path]:
    """Two random k=1 readers of the tiny base that differ in their QA head, saved as reader folders."""
    folders = []
    for seed in (0, 1):
        reader = DilBertReader.from_pretrained(base, layers=1)
        with torch.no_grad():
            reader.model.qa_outputs.weight.copy_(torch.randn(reader.model.qa_outputs.weight.shape,
                                                       generator=torch.Generator().manual_seed(seed)))  # fmt: skip
        folders.append(reader.save_pretrained(root / f"r{seed}"))
    return folders


def test_each_reader_scores_as_evaluate_rc_scores_it_and_the_ensemble_is_their_mean(
    tiny_base: Path, squad_file: Path, tmp_path: Path, capsys
) -> None:
    first, second = write_readers(tiny_base, tmp_path)
    with benchmark_module("ensemble_readers") as ensemble_readers:
        assert ensemble_readers.main([str(first), str(first), "--also", str(second), "--data", str(squad_file),
                                      "--threads", "1"]) == 0  # fmt: skip
        record = json.loads(capsys.readouterr().out.splitlines()[-1])
        scores = record["scores"]
        for folder in (first, second):
            alone = evaluate_file(DilBertReader.from_pretrained(folder), squad_file, device="cpu")
            assert scores[str(folder)] == {"em": alone.em, "f1": alone.f1}
        assert scores[str(first)] != scores[str(second)], "the two random heads should answer differently"
        assert scores["ensemble of 2"] == scores[str(first)], "the mean of one reader's logits twice is its logits"
        logits = [(torch.tensor([[1.0, 3.0]]), torch.tensor([[0.0, 2.0]])),
                  (torch.tensor([[3.0, 1.0]]), torch.tensor([[4.0, 0.0]]))]  # fmt: skip
        replayed = ensemble_readers.replayed_scorer([logits, logits], 1)
        assert replayed(None) == logits[1] and replayed(None) == logits[1]
