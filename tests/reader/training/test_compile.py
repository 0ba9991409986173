"""`train qa --compile`: the compiled layers compute what the plain ones do, one compilation serves every
length, the weights keep their names, and a compiled run trains (and resumes) like a plain one."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from dilstore.reader.modeling.dilbert import DilBertReader
from dilstore.reader.training.qa import TrainingConfig, train_qa
from dilstore.runners.cli import main
from tests.fixtures.qa_training_fixtures import SMALL_WINDOWS
from tests.fixtures.training_runs import cut_after_last_checkpoint


def _inputs(batch: int, question: int, passage: int) -> tuple[torch.Tensor, ...]:
    """Random question and passage ids with some padding in each half: (b, nq), (b, nq), (b, np), (b, np)."""
    generator = torch.Generator().manual_seed(question * 1000 + passage)
    question_ids = torch.randint(1000, 2000, (batch, question), generator=generator)
    passage_ids = torch.randint(1000, 2000, (batch, passage), generator=generator)
    question_mask, passage_mask = torch.ones_like(question_ids), torch.ones_like(passage_ids)
    question_mask[0, -2:] = 0
    passage_mask[-1, -3:] = 0
    return question_ids, question_mask, passage_ids, passage_mask


def test_compiled_layers_give_the_plain_logits_at_every_length_from_one_compilation(tiny_base: Path) -> None:
    plain = DilBertReader.from_pretrained(tiny_base, layers=1)
    compiled = DilBertReader.from_pretrained(tiny_base, layers=1)
    names = list(compiled.model.state_dict())
    compiled.compile_layers()
    layers = [compiled.architecture.layer_module(compiled.model, index) for index in range(compiled.num_layers)]
    assert all(layer._compiled_call_impl is not None for layer in layers)
    assert list(compiled.model.state_dict()) == names, "a compiled reader saves and loads as before"
    torch._dynamo.reset()
    with torch.no_grad():
        for index, shape in enumerate([(3, 6, 20), (2, 9, 31), (4, 5, 12)]):
            inputs = _inputs(*shape)
            with torch._dynamo.config.patch(error_on_recompile=index > 0):
                got = compiled(*inputs)
            for mine, want in zip(got, plain(*inputs), strict=True):
                torch.testing.assert_close(mine, want, atol=1e-5, rtol=1e-5)


def test_a_compiled_run_trains_like_a_plain_one_and_resumes_without_compiling(
    tiny_base: Path, squad_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    config = TrainingConfig(layers=1, max_steps=3, batch_size=3, learning_rate=1e-3, save_every=2,
                            save_every_minutes=0, seed=5, **SMALL_WINDOWS)  # fmt: skip
    plain = train_qa(tiny_base, squad_file, tmp_path / "plain", config, command="a", progress=False)
    common = ["train", "qa", "--model", str(tiny_base), "--layers", "1", "--train", str(squad_file),
              "--batch-size", "3", "--learning-rate", "1e-3", "--save-every", "2", "--save-every-minutes", "0",
              "--seed", "5", "--max-seq-length", str(SMALL_WINDOWS["max_seq_length"]),
              "--doc-stride", str(SMALL_WINDOWS["doc_stride"]),
              "--max-question-length", str(SMALL_WINDOWS["max_question_length"]), "--no-progress", "--json",
              "--output", str(tmp_path / "compiled"), "--max-steps", "3"]  # fmt: skip
    compiled_readers: list[DilBertReader] = []
    original = DilBertReader.compile_layers

    def compile_layers(reader: DilBertReader) -> None:
        compiled_readers.append(reader)
        original(reader)

    monkeypatch.setattr(DilBertReader, "compile_layers", compile_layers)
    assert main([*common, "--compile"]) == 0
    assert len(compiled_readers) == 1
    assert json.loads((tmp_path / "compiled" / "run_config.json").read_text())["config"]["compile"] is True
    compiled = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert compiled["train_steps"] == 3 and compiled["final_loss"] == pytest.approx(plain.final_loss, rel=1e-4)
    cut_after_last_checkpoint(tmp_path / "compiled")
    assert main([*common, "--resume"]) == 0, "compile may change between the parts of a run"
    assert len(compiled_readers) == 1, "no --compile, no compilation"
    resumed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert resumed["train_steps"] == 3 and resumed["final_loss"] == pytest.approx(plain.final_loss, rel=1e-4)
