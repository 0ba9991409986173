"""benchmarks/ensemble_readers.py: each reader scored as evaluate-rc scores it, from one pass, and their mean."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from dilstore.reader.batching import pad_id
from dilstore.reader.data.qa_batches import collate_features
from dilstore.reader.data.qa_features import window_features
from dilstore.reader.data.squad import load_squad
from dilstore.reader.evaluation.reading_comprehension import ReadingSettings, evaluate_file, reader_scorer
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
        # The run above averaged one reader with itself, which any pick of a member passes: two readers here, and
        # a replay over two different batches, which one that does not advance fails.
        readers = [DilBertReader.from_pretrained(folder).float().eval() for folder in (first, second)]
        features = window_features(readers[0].tokenizer, load_squad(squad_file), ReadingSettings())
        batches = [collate_features(features[:2], pad_id(readers[0].tokenizer)),
                   collate_features(features[2:4], pad_id(readers[0].tokenizer))]  # fmt: skip
        record: list = []
        ensemble = ensemble_readers.recorded_scorer(readers, 2, record)
        for batch in batches:
            start, end = ensemble(batch)  # (b, tokens) each
            scorers = [reader_scorer(reader, torch.device("cpu")) for reader in readers]
            (start_a, end_a), (start_b, end_b) = (scorer(batch) for scorer in scorers)
            assert not torch.allclose(start_a, start_b)
            assert torch.allclose(start, (start_a + start_b) / 2) and torch.allclose(end, (end_a + end_b) / 2)
        replayed = ensemble_readers.replayed_scorer(record, 1)
        for recorded in record:
            assert all(torch.equal(got, want) for got, want in zip(replayed(None), recorded[1]))
        assert not torch.equal(record[0][1][0], record[1][1][0])
