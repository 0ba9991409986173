"""`dilstore train earl|cross-encoder|siamese`: the shared ranking loop, its checkpoints, resumption and CLI.

Tiny random 2-layer BERTs with the MiniLM tokenizer (tests/fixtures/qa_training_fixtures.py)
trained on four triples (tests/fixtures/ranking_fixtures.py); the real MiniLM is never trained here.
"""

from __future__ import annotations

import gzip
import json
import shutil
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file

from dilstore.reader.data.ranking_data import SUMMARY_FILE
from dilstore.reader.data.ranking_files import PARAGRAPHS_FILE, TRIPLES_FILE
from dilstore.reader.modeling.checkpoints import TRAINING_METADATA_FILE
from dilstore.reader.modeling.earl import EarlConfig
from dilstore.reader.modeling.rankers import load_ranker, new_ranker
from dilstore.reader.training.ranking import (
    RankingTrainingConfig,
    accumulate_ranking_gradients,
    load_ranking_data,
    ranking_loss,
    train_ranker,
)
from dilstore.runners.cli import main
from dilstore.storage.digests import sha256_file
from dilstore.storage.errors import DilstoreError
from tests.fixtures.ranking_fixtures import OVERFIT_TRIPLES, write_overfit_files
from tests.fixtures.training_runs import cut_after_last_checkpoint

SMALL = dict(negatives=2, max_query_length=16, max_doc_length=24, log_every=1000)


@pytest.fixture(scope="module")
def overfit_files(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return write_overfit_files(tmp_path_factory.mktemp("overfit-data"))


def parameters(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {name: tensor.detach().clone() for name, tensor in module.state_dict().items()}


@pytest.mark.parametrize(
    ("kind", "options", "learning_rate", "epochs"),
    [
        ("earl", dict(query_layers=1, loss="softmax"), 2e-3, 120),
        ("earl", dict(query_layers=1, pooling="mean", tied=True, loss="hinge"), 5e-3, 60),
        ("cross-encoder", dict(loss="softmax"), 5e-3, 60),
        ("siamese", dict(loss="hinge"), 5e-3, 30),
    ],
)
def test_each_ranker_overfits_four_triples(
    kind: str, options: dict, learning_rate: float, epochs: int, tiny_base: Path, overfit_files, tmp_path: Path
) -> None:
    """The loss falls to a fraction of its start and every query ranks its positive first.

    Each positive is another query's negative, so a ranker that scored
    paragraphs without looking at the query could not pass.
    """
    triples, paragraphs = overfit_files
    config = RankingTrainingConfig(kind=kind, epochs=epochs, batch_size=4, learning_rate=learning_rate,
                                   warmup_ratio=0.0, **options, **SMALL)  # fmt: skip
    result = train_ranker(tiny_base, triples, paragraphs, tmp_path, config, command="test", progress=False)
    assert result.steps == epochs and result.triples_seen == 4 * epochs
    assert sum(result.losses[-3:]) < 0.2 * sum(result.losses[:3])
    data = load_ranking_data(result.ranker, triples, paragraphs, config)
    with torch.no_grad():
        scores = result.ranker.score_groups(*data.batch(range(len(OVERFIT_TRIPLES))))  # (4, 3)
    assert scores.argmax(dim=1).tolist() == [0, 0, 0, 0]
    reloaded = load_ranker(tmp_path)
    assert reloaded.kind == kind
    with torch.no_grad():
        assert torch.equal(reloaded.score_groups(*data.batch(range(4))), scores)


def test_each_log_line_means_the_losses_since_the_line_before(
    tiny_base: Path, overfit_files, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """With --log-every 4 and 6 steps, the step-6 line gave the mean of steps 3-6, not of 5-6."""
    triples, paragraphs = overfit_files
    config = RankingTrainingConfig(kind="siamese", epochs=6, batch_size=4, learning_rate=1e-3, warmup_ratio=0.0,
                                   **{**SMALL, "log_every": 4})  # fmt: skip
    result = train_ranker(tiny_base, triples, paragraphs, tmp_path, config, command="test", progress=False)
    logged = [float(line.split(" loss ")[1].split()[0]) for line in capsys.readouterr().err.splitlines()
              if line.startswith("step ")]  # fmt: skip
    assert logged == pytest.approx([sum(result.losses[:4]) / 4, sum(result.losses[4:]) / 2], abs=1e-4)


def test_max_steps_beyond_the_epochs_says_where_the_run_ends(
    tiny_base: Path, overfit_files, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--max-steps 1000 on 8 triples ran 2 steps without a word (train46 F6)."""
    triples, paragraphs = overfit_files
    config = RankingTrainingConfig(kind="siamese", epochs=2, max_steps=5, batch_size=4, **SMALL)
    assert train_ranker(tiny_base, triples, paragraphs, tmp_path, config, command="t", progress=False).steps == 2
    note = "--max-steps 5 is more than the 2 step(s) of 2 epoch(s): the run ends there; raise --epochs for more"
    assert note in capsys.readouterr().err.splitlines()


def test_metadata_records_kind_command_data_and_budget(tiny_base: Path, overfit_files, tmp_path: Path) -> None:
    triples, paragraphs = overfit_files
    config = RankingTrainingConfig(kind="siamese", epochs=1, max_steps=3, batch_size=1, **SMALL)
    train_ranker(tiny_base, triples, paragraphs, tmp_path, config, command="dilstore train siamese …", progress=False)
    metadata = json.loads((tmp_path / TRAINING_METADATA_FILE).read_text())
    assert metadata["kind"] == "siamese" and metadata["command"] == "dilstore train siamese …"
    assert metadata["triples"] == str(triples) and metadata["paragraphs"] == str(paragraphs)
    assert metadata["steps"] == metadata["total_steps"] == 3
    assert metadata["triples_seen"] == 3 and metadata["pairs_seen"] == 9
    assert metadata["hardware"].startswith("CPU") and metadata["train_seconds"] >= 0
    assert metadata["config"]["negatives"] == 2
    assert json.loads((tmp_path / "dilstore.json").read_text())["kind"] == "siamese"


@pytest.mark.parametrize("kind", ["earl", "cross-encoder"])
def test_resume_continues_exactly_where_the_run_stopped(
    kind: str, tiny_base_with_dropout: Path, overfit_files, tmp_path: Path
) -> None:
    """A run cut after step 2 and resumed ends at the same step with the same weights (dropout on)."""
    triples, paragraphs = overfit_files
    options = dict(query_layers=1) if kind == "earl" else {}
    config = RankingTrainingConfig(kind=kind, epochs=3, batch_size=2, learning_rate=1e-3, save_every=2,
                                   keep_checkpoints=5, seed=7, **options, **SMALL)  # fmt: skip
    straight = train_ranker(tiny_base_with_dropout, triples, paragraphs, tmp_path / "a", config, command="a",
                            progress=False)  # fmt: skip
    assert straight.steps == 6
    cut = tmp_path / "b"
    (cut / "checkpoints").mkdir(parents=True)
    shutil.copytree(tmp_path / "a" / "checkpoints" / "step-0000002", cut / "checkpoints" / "step-0000002")
    shutil.copy2(tmp_path / "a" / "run_config.json", cut / "run_config.json")
    resumed = train_ranker(tiny_base_with_dropout, triples, paragraphs, cut, config, command="b", resume=True,
                           progress=False)  # fmt: skip
    assert resumed.steps == straight.steps and resumed.triples_seen == straight.triples_seen
    assert resumed.losses == pytest.approx(straight.losses[2:], rel=1e-5)
    want, got = parameters(straight.ranker), parameters(resumed.ranker)
    assert want.keys() == got.keys()
    for name in want:
        assert torch.allclose(want[name], got[name], atol=1e-6), name


def test_resume_refuses_changed_settings_or_a_missing_checkpoint(
    tiny_base: Path, overfit_files, tmp_path: Path
) -> None:
    triples, paragraphs = overfit_files
    config = RankingTrainingConfig(kind="siamese", max_steps=2, batch_size=2, save_every=1, **SMALL)
    with pytest.raises(DilstoreError, match="no complete checkpoint"):
        train_ranker(tiny_base, triples, paragraphs, tmp_path, config, command="c", resume=True)
    train_ranker(tiny_base, triples, paragraphs, tmp_path, config, command="c", progress=False)
    cut_after_last_checkpoint(tmp_path)
    with pytest.raises(DilstoreError, match=r"--learning-rate 1\.0 \(the run had 3e-05\)"):
        train_ranker(tiny_base, triples, paragraphs, tmp_path, replace(config, learning_rate=1.0), command="c",
                     resume=True)  # fmt: skip


@pytest.mark.parametrize("kind", ["earl", "listformer"])
@pytest.mark.parametrize(("field", "flag"), [("max_doc_length", "--max-doc-length"),
                                             ("max_query_length", "--max-query-length")])
def test_a_length_past_the_model_s_positions_is_refused_before_step_1(
    kind: str, field: str, flag: str, tiny_base: Path, overfit_files, tmp_path: Path
) -> None:
    """The rankers took any length and failed at the first long text, maybe hours in, leaving a run that could
    neither resume nor restart in its folder (trainqa36 4)."""
    triples, paragraphs = overfit_files
    config = replace(RankingTrainingConfig(kind=kind, max_steps=2, batch_size=2, **SMALL), **{field: 600})
    with pytest.raises(DilstoreError, match=rf"limit 600 \({flag}\) is more than this model's 512 positions"):
        train_ranker(tiny_base, triples, paragraphs, tmp_path / "run", config, command="c", progress=False)
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_gradient_accumulation_matches_the_larger_batch(tiny_base: Path, overfit_files) -> None:
    """Two accumulated micro-batches of 2 triples give the gradient and loss of one batch of 4."""
    triples, paragraphs = overfit_files
    config = RankingTrainingConfig(kind="earl", query_layers=1, **SMALL)
    ranker = new_ranker("earl", tiny_base, EarlConfig(query_layers=1)).train()
    data = load_ranking_data(ranker, triples, paragraphs, config)
    cpu = torch.device("cpu")
    large_loss = accumulate_ranking_gradients(ranker, data, [[0, 1, 2, 3]], config, cpu).item()
    large = {name: p.grad.clone() for name, p in ranker.named_parameters() if p.grad is not None}
    ranker.zero_grad(set_to_none=True)
    accumulated_loss = accumulate_ranking_gradients(ranker, data, [[0, 1], [2, 3]], config, cpu).item()
    assert accumulated_loss == pytest.approx(large_loss, rel=1e-5)
    assert large
    for name, parameter in ranker.named_parameters():
        if name in large:
            assert torch.allclose(parameter.grad, large[name], atol=1e-6, rtol=1e-4), name


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"kind": "bm25"}, "unknown ranker kind"),
        ({"negatives": 0}, "negatives"),
        ({"loss": "listmle"}, "loss"),
        ({"max_steps": 0}, "max-steps"),
        ({"precision": "fp8"}, "precision"),
        ({"max_doc_length": 2}, "max-doc-length"),
        ({"kind": "siamese", "tied": True}, "EARL ranker only"),
        ({"kind": "cross-encoder", "prior": True}, "prior describes an EARL ranker or a Listformer only"),
        ({"kind": "siamese", "freeze_encoder": True}, "EARL ranker only"),
        ({"freeze_encoder": True, "encoder_learning_rate": 1e-6}, "exclude each other"),
        ({"encoder_learning_rate": 0.0}, "encoder-learning-rate must be positive"),
        ({"encoder_learning_rate": float("nan")}, "encoder-learning-rate must be a finite number, got nan"),
        ({"learning_rate": float("inf")}, "learning-rate must be a finite number, got inf"),
        ({"pooling": "max"}, "pooling"),
        ({"kind": "listformer", "temperature": float("inf")}, "temperature must be a positive finite number, got inf"),
        ({"loss": "hinge", "margin": float("nan")}, "margin must be a positive finite number, got nan"),
        ({"margin": 5.0}, "margin is the hinge loss's; with the softmax loss it would be ignored"),
        ({"kind": "listformer", "loss": "listnet", "temperature": 0.5}, "with the listnet loss it would be ignored"),
        ({"seed": -1}, "seed must be from 0 to 4294967295, got -1"),
        ({"seed": 2**32}, "seed must be from 0 to 4294967295, got 4294967296"),
    ],
)
def test_config_errors_name_the_option(changes: dict, message: str) -> None:
    with pytest.raises(DilstoreError, match=message):
        RankingTrainingConfig(**{"kind": "earl", **changes})


def test_a_precision_the_device_lacks_is_refused_before_the_run_writes_anything(
    tiny_base: Path, overfit_files, tmp_path: Path
) -> None:
    """`--precision fp16` on a CPU was refused only after the run folder and run_config.json were made (train46 F2)."""
    triples, paragraphs = overfit_files
    config = RankingTrainingConfig(kind="siamese", precision="fp16", **SMALL)
    with pytest.raises(DilstoreError, match="precision fp16 needs a CUDA device; this run is on cpu"):
        train_ranker(tiny_base, triples, paragraphs, tmp_path / "run", config, command="t", device="cpu",
                     progress=False)  # fmt: skip
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("kind", ["earl", "cross-encoder", "siamese"])
def test_cli_trains_each_kind_end_to_end(kind: str, tiny_base: Path, overfit_files, tmp_path: Path, capsys) -> None:
    triples, _ = overfit_files
    extra = ["--query-layers", "1", "--pooling", "mean", "--tied"] if kind == "earl" else []
    status = main(["train", kind, "--triples", str(triples), "--output", str(tmp_path), "--base-model", str(tiny_base),
                   "--negatives", "2", "--loss", "hinge", "--max-steps", "2", "--batch-size", "2",
                   "--max-query-length", "16", "--max-doc-length", "24", "--device", "cpu", "--threads", "1",
                   "--no-progress", "--json", *extra])  # fmt: skip
    assert status == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["kind"] == kind and summary["train_steps"] == 2 and summary["triples_seen"] == 4
    ranker = load_ranker(tmp_path)
    assert ranker.kind == kind
    if kind == "earl":
        assert (ranker.query_layers, ranker.pooling, ranker.tied) == (1, "mean", True)
    metadata = json.loads((tmp_path / TRAINING_METADATA_FILE).read_text())
    assert metadata["command"].startswith(f"dilstore train {kind} ") and "--loss hinge" in metadata["command"]
    assert not [path for path in tmp_path.rglob("*") if path.suffix in {".bin", ".pt", ".pth", ".pkl"}]


def test_cli_refuses_bad_input_naming_file_and_line(tiny_base: Path, overfit_files, tmp_path: Path, capsys) -> None:
    triples, paragraphs = overfit_files
    base = ["--output", str(tmp_path / "out"), "--base-model", str(tiny_base), "--negatives", "2", "--no-progress"]
    assert main(["train", "earl", "--triples", str(tmp_path / "missing.jsonl.gz"), *base]) == 2
    assert "missing.jsonl.gz: no such file" in capsys.readouterr().err

    broken = tmp_path / "broken"
    broken.mkdir()
    shutil.copy2(paragraphs, broken / PARAGRAPHS_FILE)
    lines = gzip.decompress(triples.read_bytes()).decode().splitlines()
    record = json.loads(lines[2])
    record["negs"][1] = "atlantis"
    lines[2] = json.dumps(record)
    (broken / TRIPLES_FILE).write_bytes(gzip.compress(("\n".join(lines) + "\n").encode()))
    assert main(["train", "siamese", "--triples", str(broken / TRIPLES_FILE), *base]) == 2
    error = capsys.readouterr().err
    assert f"{broken / TRIPLES_FILE}:3: paragraph id 'atlantis' is not in {broken / PARAGRAPHS_FILE}" in error

    assert main(["train", "cross-encoder", "--triples", str(triples), *base[:-2], "5", "--no-progress"]) == 2
    assert ":1: 'q1' has 2 negatives, fewer than the 5 asked for" in capsys.readouterr().err

    shutil.copy2(triples, broken / TRIPLES_FILE)  # the paragraphs of another run of `train ranking-data`
    (broken / SUMMARY_FILE).write_text(json.dumps({"triples_sha256": sha256_file(triples),
                                                   "paragraphs_sha256": "0" * 64}))  # fmt: skip
    assert main(["train", "earl", "--triples", str(broken / TRIPLES_FILE), *base]) == 2
    assert f"{broken / PARAGRAPHS_FILE} is not the file {broken / SUMMARY_FILE} describes" in capsys.readouterr().err


@pytest.mark.parametrize("invisible", ["query", "paragraph"])
def test_text_without_word_pieces_is_named_by_file_line_and_id(
    tiny_base: Path, overfit_files, tmp_path: Path, capsys, invisible: str
) -> None:
    """A query or paragraph of zero-width spaces only was one line naming neither file, line nor id (earl42 M1)."""
    triples, paragraphs = overfit_files
    lines = gzip.decompress(triples.read_bytes()).decode().splitlines()
    records = [json.loads(line) for line in gzip.decompress(paragraphs.read_bytes()).decode().splitlines()]
    second = json.loads(lines[1])
    if invisible == "query":
        second["query"] = "\u200b\u200b"
        lines[1] = json.dumps(second)
    else:
        next(record for record in records if record["id"] == second["pos"])["contents"] = "\u200b \u200b"
    (tmp_path / TRIPLES_FILE).write_bytes(gzip.compress(("\n".join(lines) + "\n").encode()))
    (tmp_path / PARAGRAPHS_FILE).write_bytes(gzip.compress("".join(json.dumps(r) + "\n" for r in records).encode()))
    assert main(["train", "earl", "--triples", str(tmp_path / TRIPLES_FILE), "--output", str(tmp_path / "out"),
                 "--base-model", str(tiny_base), "--negatives", "2", "--no-progress"]) == 2  # fmt: skip
    error = capsys.readouterr().err
    where = (f"{tmp_path / TRIPLES_FILE}:2: the query of {second['qid']!r}" if invisible == "query"
             else f"{tmp_path / PARAGRAPHS_FILE}: paragraph {second['pos']!r}")  # fmt: skip
    assert error.startswith(f"dilstore train: error: {where}: ") and "no word pieces" in error


def test_cli_prior_with_a_frozen_encoder_trains_judger_head_and_scale_only(
    tiny_base: Path, overfit_files, tmp_path: Path, capsys
) -> None:
    """`--prior --freeze-encoder`: the encoder stays the (fp16-rounded) base; the checkpoint names it instead."""
    triples, _ = overfit_files
    status = main(["train", "earl", "--triples", str(triples), "--output", str(tmp_path), "--base-model",
                   str(tiny_base), "--negatives", "2", "--max-steps", "3", "--batch-size", "2",
                   "--learning-rate", "1e-2", "--warmup-ratio", "0", "--max-query-length", "16",
                   "--max-doc-length", "24", "--tied", "--prior", "--freeze-encoder", "--device", "cpu",
                   "--threads", "1", "--no-progress", "--json"])  # fmt: skip
    assert status == 0, capsys.readouterr().err
    base = new_ranker("earl", tiny_base, EarlConfig(tied=True, prior=True))
    ranker = load_ranker(tmp_path)
    assert ranker.prior and ranker.base_encoder.model == str(tiny_base.resolve())
    for name, tensor in ranker.document_encoder.state_dict().items():
        assert torch.equal(tensor, base.document_encoder.state_dict()[name].half().float()), name
    assert ranker.prior_scale.item() != 20.0 and ranker.score.weight.any(), "scale and head were trained"
    assert not torch.equal(ranker.blocks[0].output.weight, base.blocks[0].output.weight)
    stored = load_file(tmp_path / "model.safetensors")
    assert not [name for name in stored if name.startswith(("document_encoder.", "query_encoder."))]
    record = json.loads((tmp_path / TRAINING_METADATA_FILE).read_text())
    assert record["config"]["prior"] and record["config"]["freeze_encoder"]
    assert "--prior --freeze-encoder" in record["command"]


def test_encoder_learning_rate_gives_the_encoder_copies_their_own_rate(
    tiny_base: Path, overfit_files, tmp_path: Path
) -> None:
    triples, paragraphs = overfit_files
    config = RankingTrainingConfig(kind="earl", query_layers=1, prior=True, max_steps=2, batch_size=2,
                                   learning_rate=1e-2, encoder_learning_rate=1e-9, warmup_ratio=0.0,
                                   **SMALL)  # fmt: skip
    base = new_ranker("earl", tiny_base, EarlConfig(query_layers=1, prior=True))
    result = train_ranker(tiny_base, triples, paragraphs, tmp_path, config, command="lr", progress=False)
    trained, start = parameters(result.ranker), parameters(base)
    for name in trained:
        change = float((trained[name] - start[name]).abs().max())
        if name.startswith(("document_encoder.", "query_encoder.")):
            assert change < 1e-6, name
        elif name.startswith("blocks.") and name.endswith(".output.weight") or name == "score.weight":
            assert change > 1e-4, name
    assert load_file(tmp_path / "model.safetensors").keys() == result.ranker.state_dict().keys(), "full checkpoint"


@pytest.mark.parametrize("loss", ["softmax", "hinge", "approx-ndcg", "listnet"])
def test_each_loss_name_trains_with_that_loss_positive_first(loss: str) -> None:
    """--loss listnet trained with ApproxNDCG and no test noticed (mut59 M16): each name gives its loss of the group's
    scores, the positive in column 0."""
    from dilstore.reader.training import losses

    scores = torch.tensor([[0.5, 2.0, -1.0], [1.5, 0.0, 0.3]])  # (b, 1 + n)
    labels = torch.tensor([[1.0, 0.0, 0.0], [1.0, 0.0, 0.0]])
    expected = {"softmax": losses.softmax_cross_entropy_loss(scores),
                "hinge": losses.pairwise_hinge_loss(scores, losses.DEFAULT_MARGIN),
                "approx-ndcg": losses.approx_ndcg_loss(scores, labels, 1.0),
                "listnet": losses.listnet_loss(scores, labels)}  # fmt: skip
    got = ranking_loss(scores, RankingTrainingConfig(kind="earl", loss=loss))
    assert float(got) == pytest.approx(float(expected[loss]))
    # ListNet of one positive is the softmax cross-entropy; the other losses differ on these scores
    assert len({round(float(value), 6) for value in expected.values()}) == 3


def test_train_limit_keeps_that_many_triples_and_tokenizes_only_their_paragraphs(tmp_path: Path) -> None:
    """--train-limit N trains on the first N triples, each query and used paragraph tokenized once (mut59 M19: one
    triple fewer went unseen)."""
    import numpy as np

    triples, paragraphs = write_overfit_files(tmp_path)
    seen: list[str] = []

    def tokenize(text: str, max_length: int) -> np.ndarray:
        seen.append(text)
        return np.arange(3)

    ranker = SimpleNamespace(tokenize_query=tokenize, tokenize_document=tokenize)
    config = RankingTrainingConfig(kind="earl", negatives=1, train_limit=2)
    data = load_ranking_data(ranker, triples, paragraphs, config)
    assert len(data.triples) == len(data.query_tokens) == 2
    used = {pid for triple in data.triples for pid in (triple.positive, *triple.negatives)}
    assert set(data.doc_tokens) == used and len(seen) == 2 + len(used)
