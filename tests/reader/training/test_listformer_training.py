"""`dilstore train listformer`: the shared ranking loop with listwise losses, fp16 releases, exact resumption.

Tiny random 2-layer BERTs with the MiniLM tokenizer (tests/fixtures/qa_training_fixtures.py)
trained on four triples (tests/fixtures/ranking_fixtures.py); the real MiniLM is never trained here.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from dilstore.reader.modeling.checkpoints import TRAINING_METADATA_FILE
from dilstore.reader.modeling.listformer import ListformerConfig, ListformerRanker
from dilstore.reader.modeling.rankers import load_ranker
from dilstore.reader.training.ranking import RankingTrainingConfig, load_ranking_data, train_ranker
from dilstore.runners.cli import main
from dilstore.storage.errors import DilstoreError
from tests.fixtures.qa_training_fixtures import write_tiny_checkpoint
from tests.fixtures.ranking_fixtures import OVERFIT_TRIPLES, write_overfit_files
from tests.fixtures.training_runs import cut_after_last_checkpoint

SMALL = dict(negatives=2, max_query_length=16, max_doc_length=24, log_every=1000)


@pytest.fixture(scope="module")
def overfit_files(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return write_overfit_files(tmp_path_factory.mktemp("overfit-data"))


@pytest.mark.parametrize(("loss", "delayed_layers", "learning_rate"), [("approx-ndcg", 0, 5e-3), ("listnet", 1, 5e-3)])
def test_the_listformer_overfits_four_lists(
    loss, delayed_layers, learning_rate, tiny_base: Path, overfit_files, tmp_path
) -> None:
    """Every query ranks its positive first; each positive is another query's negative."""
    triples, paragraphs = overfit_files
    config = RankingTrainingConfig(kind="listformer", loss=loss, delayed_layers=delayed_layers, epochs=80,
                                   batch_size=4, learning_rate=learning_rate, warmup_ratio=0.0, **SMALL)  # fmt: skip
    result = train_ranker(tiny_base, triples, paragraphs, tmp_path, config, command="test", progress=False)
    assert sum(result.losses[-3:]) < sum(result.losses[:3]) - 0.5
    data = load_ranking_data(result.ranker, triples, paragraphs, config)
    with torch.no_grad():
        scores = result.ranker.score_groups(*data.batch(range(len(OVERFIT_TRIPLES))))  # (4, 3)
    assert scores.argmax(dim=1).tolist() == [0, 0, 0, 0]
    reloaded = load_ranker(tmp_path)
    assert isinstance(reloaded, ListformerRanker) and reloaded.delayed_layers == delayed_layers
    assert {tensor.dtype for tensor in load_file(tmp_path / "model.safetensors").values()} == {torch.float16}
    with torch.no_grad():
        assert reloaded.score_groups(*data.batch(range(4))).argmax(dim=1).tolist() == [0, 0, 0, 0]


@pytest.mark.parametrize("prior", [False, True])
def test_resume_continues_exactly_where_the_run_stopped(prior: bool, overfit_files, tmp_path: Path) -> None:
    """A run cut after step 2 and resumed ends with the same weights (dropout on): periodic checkpoints are fp32.

    With the prior, they name the base instead of storing the prior encoder, which resuming takes from it.
    """
    base = write_tiny_checkpoint(tmp_path / "base", dropout=0.1)
    triples, paragraphs = overfit_files
    config = RankingTrainingConfig(kind="listformer", loss="approx-ndcg", delayed_layers=1, epochs=3, batch_size=2,
                                   learning_rate=1e-3, save_every=2, keep_checkpoints=5, seed=7, prior=prior,
                                   **SMALL)  # fmt: skip
    straight = train_ranker(base, triples, paragraphs, tmp_path / "a", config, command="a", progress=False)
    step = tmp_path / "a" / "checkpoints" / "step-0000002"
    assert {tensor.dtype for tensor in load_file(step / "model.safetensors").values()} == {torch.float32}
    cut = tmp_path / "b"
    (cut / "checkpoints").mkdir(parents=True)
    shutil.copytree(step, cut / "checkpoints" / step.name)
    shutil.copy2(tmp_path / "a" / "run_config.json", cut / "run_config.json")
    resumed = train_ranker(base, triples, paragraphs, cut, config, command="b", resume=True, progress=False)
    assert resumed.steps == straight.steps == 6
    assert resumed.losses == pytest.approx(straight.losses[2:], rel=1e-5)
    want, got = straight.ranker.state_dict(), resumed.ranker.state_dict()
    for name in want:
        assert torch.allclose(want[name], got[name], atol=1e-6), name


def test_resume_reads_a_run_config_written_before_a_setting_existed(tiny_base, overfit_files, tmp_path) -> None:
    """A setting missing from an older run_config.json counts as its default, so that run can still resume."""
    triples, paragraphs = overfit_files
    config = RankingTrainingConfig(kind="siamese", max_steps=2, batch_size=2, save_every=1, **SMALL)
    train_ranker(tiny_base, triples, paragraphs, tmp_path, config, command="c", progress=False)
    cut_after_last_checkpoint(tmp_path)
    record = json.loads((tmp_path / "run_config.json").read_text())
    del record["config"]["temperature"], record["config"]["delayed_layers"]
    (tmp_path / "run_config.json").write_text(json.dumps(record))
    assert train_ranker(tiny_base, triples, paragraphs, tmp_path, config, command="c", resume=True,
                        progress=False).steps == 2  # fmt: skip


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"temperature": 0.0}, "temperature must be a positive finite number, got 0.0"),
        ({"delayed_layers": -1}, "non-negative integer"),
        ({"kind": "earl", "delayed_layers": 1}, "delayed-layers describes a Listformer only"),
        ({"kind": "cross-encoder", "prior": True}, "prior describes an EARL ranker or a Listformer only"),
    ],
)
def test_config_errors_name_the_option(changes: dict, message: str) -> None:
    with pytest.raises(DilstoreError, match=message):
        RankingTrainingConfig(**{"kind": "listformer", **changes})


def test_cli_trains_a_delayed_listformer_end_to_end(tiny_base: Path, overfit_files, tmp_path: Path, capsys) -> None:
    triples, _ = overfit_files
    status = main(["train", "listformer", "--triples", str(triples), "--output", str(tmp_path), "--base-model",
                   str(tiny_base), "--negatives", "2", "--loss", "listnet", "--delayed-layers", "1", "--max-steps", "2",
                   "--batch-size", "2", "--max-query-length", "16", "--max-doc-length", "24", "--device", "cpu",
                   "--threads", "1", "--no-progress", "--json"])  # fmt: skip
    assert status == 0
    summary = json.loads(capsys.readouterr().out)  # the step lines went to stdout before it (rank38 M1)
    assert summary["kind"] == "listformer" and summary["train_steps"] == 2 and summary["triples_seen"] == 4
    ranker = load_ranker(tmp_path)
    assert isinstance(ranker, ListformerRanker) and ranker.delayed_layers == 1
    assert json.loads((tmp_path / "dilstore.json").read_text())["kind"] == "listformer"
    metadata = json.loads((tmp_path / TRAINING_METADATA_FILE).read_text())
    assert "--loss listnet" in metadata["command"] and "--delayed-layers 1" in metadata["command"]
    assert metadata["config"]["delayed_layers"] == 1


def test_cli_trains_a_prior_listformer_that_names_its_base(tiny_base: Path, overfit_files, tmp_path: Path) -> None:
    """`--prior`: the checkpoint leaves the frozen prior encoder out, and it comes back as the base's weights."""
    triples, _ = overfit_files
    status = main(["train", "listformer", "--triples", str(triples), "--output", str(tmp_path), "--base-model",
                   str(tiny_base), "--negatives", "2", "--delayed-layers", "1", "--prior", "--max-steps", "2",
                   "--batch-size", "2", "--learning-rate", "1e-2", "--max-query-length", "16", "--max-doc-length",
                   "24", "--device", "cpu", "--threads", "1", "--no-progress", "--json"])  # fmt: skip
    assert status == 0
    metadata = json.loads((tmp_path / "dilstore.json").read_text())
    assert metadata["prior"] is True and metadata["base_encoder"]["model"] == str(tiny_base.resolve())
    assert not any(name.startswith("prior_encoder.") for name in load_file(tmp_path / "model.safetensors"))
    ranker = load_ranker(tmp_path)
    assert isinstance(ranker, ListformerRanker) and ranker.prior
    base = ListformerRanker.from_base(tiny_base, ListformerConfig(1, prior=True))
    for (name, got), want in zip(ranker.prior_encoder.state_dict().items(), base.prior_encoder.state_dict().values()):
        assert torch.equal(got, want), name
    assert not torch.equal(ranker.encoder.encoder.layer[1].output.dense.weight,
                           base.encoder.encoder.layer[1].output.dense.weight), \
        "the Listformer itself trained"  # fmt: skip


def test_cli_refuses_a_delayed_split_the_encoder_cannot_take(tiny_base, overfit_files, tmp_path, capsys) -> None:
    triples, _ = overfit_files
    status = main(["train", "listformer", "--triples", str(triples), "--output", str(tmp_path), "--base-model",
                   str(tiny_base), "--negatives", "2", "--delayed-layers", "2", "--max-steps", "1",
                   "--no-progress"])  # fmt: skip
    assert status == 2
    assert "delayed_layers (k) must be in 0..1" in capsys.readouterr().err
