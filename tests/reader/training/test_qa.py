"""`dilstore train qa`: the training loop, its checkpoints and its resumption.

The tiny random reader (tests/fixtures/qa_training_fixtures.py) keeps every run to a
second or two; the real MiniLM is never trained here.
"""

from __future__ import annotations

import json
import re
import shutil
import stat
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st
from safetensors.torch import load_file
from transformers import get_linear_schedule_with_warmup

from dilstore.reader.evaluation.reading_comprehension import ReadingSettings, evaluate_file
from dilstore.reader.modeling.checkpoints import TRAINING_METADATA_FILE
from dilstore.reader.modeling.dilbert import DilBertReader
from dilstore.reader.modeling.online_variants import load_online_variant, write_online_variant
from dilstore.reader.packaged.shipped import default_checkpoint_dir
from dilstore.reader.training.checkpoint_files import latest_checkpoint
from dilstore.reader.training.loop import build_optimizer, start_optimization, total_optimizer_steps
from dilstore.reader.training.model_cards import render_model_card
from dilstore.reader.training.qa import (
    TrainingConfig,
    accumulate_gradients,
    load_training_data,
    optimizer_step_batches,
    train_qa,
)
from dilstore.reader.training.release import load_training_metadata, package_checkpoint, weights_megabytes
from dilstore.reader.training.state import (
    LoopPosition,
    load_training_state,
    save_training_state,
    verify_checkpoint,
)
from dilstore.runners.cli import main
from dilstore.storage.errors import DilstoreError
from tests.fixtures.benchmarks import benchmark_module
from tests.fixtures.qa_training_fixtures import SMALL_WINDOWS
from tests.fixtures.training_runs import cut_after_last_checkpoint


@pytest.fixture(scope="module")
def overfit_run(tiny_base: Path, squad_file: Path, tmp_path_factory: pytest.TempPathFactory):
    """The tiny reader trained to memorise the handful of questions (k=1)."""
    config = TrainingConfig(
        layers=1, epochs=150, batch_size=16, learning_rate=1e-2, warmup_ratio=0.05, seed=3, log_every=1000,
        **SMALL_WINDOWS,
    )
    output = tmp_path_factory.mktemp("overfit")
    return train_qa(tiny_base, squad_file, output, config, command="test overfit", progress=False)


def parameters(reader: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {name: tensor.detach().clone() for name, tensor in reader.state_dict().items()}


def test_tiny_model_overfits_a_handful_of_questions(overfit_run, squad_file: Path) -> None:
    """The loss falls by an order of magnitude, and the trained reader answers every question exactly."""
    losses = overfit_run.losses
    assert sum(losses[-5:]) / 5 < 0.1 * sum(losses[:5]) / 5
    result = evaluate_file(
        DilBertReader.from_pretrained(overfit_run.output),
        squad_file,
        settings=ReadingSettings(**SMALL_WINDOWS, batch_size=8),
    )
    assert result.questions == 6
    assert result.em == 100.0 and result.f1 == 100.0
    assert result.k == 1


def test_saved_checkpoint_gives_identical_logits(overfit_run) -> None:
    """save_pretrained then from_pretrained reproduces the in-memory trained reader bit for bit."""
    reloaded = DilBertReader.from_pretrained(overfit_run.output).eval()
    trained = overfit_run.reader.eval()
    assert reloaded.layers == trained.layers == 1
    tokenizer = trained.tokenizer
    question = tokenizer(["Who runs the tram network?"], return_tensors="pt")
    passage = tokenizer(["It is run by VBZ."], add_special_tokens=False, return_tensors="pt")
    passage_ids = torch.cat([passage.input_ids, torch.tensor([[tokenizer.sep_token_id]])], dim=1)  # (1, np)
    passage_mask = torch.ones_like(passage_ids)
    with torch.no_grad():
        expected = trained(question.input_ids, question.attention_mask, passage_ids, passage_mask)
        actual = reloaded(question.input_ids, question.attention_mask, passage_ids, passage_mask)
    for want, got in zip(expected, actual, strict=True):
        assert torch.equal(want, got)


def test_metadata_records_k_command_and_budget(overfit_run) -> None:
    metadata = json.loads((overfit_run.output / TRAINING_METADATA_FILE).read_text())
    assert metadata["layers"] == 1
    assert metadata["command"] == "test overfit"
    assert metadata["steps"] == overfit_run.steps == overfit_run.total_steps
    assert metadata["features_seen"] == overfit_run.train_features * 150
    assert metadata["config"]["learning_rate"] == 1e-2


def test_every_file_of_the_saved_reader_has_the_mode_the_umask_gives(overfit_run) -> None:
    """safetensors wrote model.safetensors 0600, so a server running as another user could not read the model."""
    from dilstore.storage.atomic_files import process_umask

    modes = {path.name: stat.S_IMODE(path.stat().st_mode) for path in overfit_run.output.rglob("*") if path.is_file()}
    assert "model.safetensors" in modes and set(modes.values()) == {0o666 & ~process_umask()}, modes


def test_resume_continues_exactly_where_the_run_stopped(
    tiny_base_with_dropout: Path, squad_file: Path, tmp_path: Path
) -> None:
    """A run cut after step 3 and resumed ends with the same weights as one never cut (dropout on)."""
    config = TrainingConfig(
        layers=1, epochs=2, batch_size=3, learning_rate=1e-3, save_every=3, keep_checkpoints=5, seed=7, **SMALL_WINDOWS
    )
    straight = train_qa(tiny_base_with_dropout, squad_file, tmp_path / "a", config, command="a", progress=False)
    assert straight.steps > 3
    cut = tmp_path / "b"
    (cut / "checkpoints").mkdir(parents=True)
    shutil.copytree(tmp_path / "a" / "checkpoints" / "step-0000003", cut / "checkpoints" / "step-0000003")
    shutil.copy2(tmp_path / "a" / "run_config.json", cut / "run_config.json")
    resumed = train_qa(tiny_base_with_dropout, squad_file, cut, config, command="b", resume=True, progress=False)
    assert resumed.steps == straight.steps
    assert resumed.features_seen == straight.features_seen
    assert resumed.losses == straight.losses[3:]
    want, got = parameters(straight.reader), parameters(resumed.reader)
    assert want.keys() == got.keys()
    for name in want:
        assert torch.allclose(want[name], got[name], atol=1e-6), name


def test_resume_refuses_changed_settings(tiny_base: Path, squad_file: Path, tmp_path: Path) -> None:
    config = TrainingConfig(layers=1, epochs=1, max_steps=2, batch_size=2, save_every=1, **SMALL_WINDOWS)
    train_qa(tiny_base, squad_file, tmp_path, config, command="c", progress=False)
    cut_after_last_checkpoint(tmp_path)
    with pytest.raises(DilstoreError, match=r"--learning-rate 1\.0 \(the run had 3e-05\)"):
        train_qa(tiny_base, squad_file, tmp_path, replace(config, learning_rate=1.0), command="c", resume=True)


@pytest.mark.parametrize("damage", ["zeroed", "removed"])
def test_resume_refuses_a_checkpoint_whose_weights_changed_since_it_was_saved(
    tiny_base: Path, squad_file: Path, tmp_path: Path, damage: str
) -> None:
    """Zeroing 4 KiB inside model.safetensors left a file that loads: the run resumed from damaged weights."""
    config = TrainingConfig(layers=1, epochs=1, max_steps=2, batch_size=2, save_every=1, **SMALL_WINDOWS)
    train_qa(tiny_base, squad_file, tmp_path, config, command="c", progress=False)
    cut_after_last_checkpoint(tmp_path)
    checkpoint = tmp_path / "checkpoints" / "step-0000001"
    weights = checkpoint / "model.safetensors"
    if damage == "zeroed":
        data = bytearray(weights.read_bytes())
        data[-4096:] = bytes(4096)
        weights.write_bytes(bytes(data))
        load_file(weights)  # still a readable safetensors file: only the checksum shows the damage
    else:
        weights.unlink()
    what = "is missing" if damage == "removed" else "does not match the SHA-256 recorded when it was saved"
    with pytest.raises(DilstoreError) as raised:
        train_qa(tiny_base, squad_file, tmp_path, config, command="c", resume=True)
    assert str(raised.value).startswith(f"{weights} {what}") and f"move {checkpoint} aside" in str(raised.value)


def test_a_checkpoint_saved_before_checksums_were_recorded_still_resumes(
    tiny_base: Path, squad_file: Path, tmp_path: Path
) -> None:
    config = TrainingConfig(layers=1, epochs=1, max_steps=2, batch_size=2, save_every=1, **SMALL_WINDOWS)
    train_qa(tiny_base, squad_file, tmp_path, config, command="c", progress=False)
    cut_after_last_checkpoint(tmp_path)
    state = tmp_path / "checkpoints" / "step-0000001" / "training_state.json"
    document = json.loads(state.read_text())
    assert set(document.pop("sha256")) >= {"model.safetensors", "training_state.safetensors", "config.json"}
    state.write_text(json.dumps(document))
    assert train_qa(tiny_base, squad_file, tmp_path, config, command="c", resume=True, progress=False).steps == 2
    state.write_text(json.dumps({**document, "sha256": ["model.safetensors"]}))
    with pytest.raises(DilstoreError, match="its 'sha256' entry is not a mapping of file names to checksums"):
        verify_checkpoint(state.parent)


def test_resume_without_checkpoint_is_a_user_error(tiny_base: Path, squad_file: Path, tmp_path: Path) -> None:
    config = TrainingConfig(layers=1, epochs=1, **SMALL_WINDOWS)
    with pytest.raises(DilstoreError, match="no complete checkpoint"):
        train_qa(tiny_base, squad_file, tmp_path, config, command="c", resume=True)


def test_gradient_accumulation_matches_the_larger_batch(tiny_base: Path, squad_file: Path) -> None:
    """Two accumulated micro-batches of 2 give the gradient and loss of one batch of 4 (dropout off)."""
    reader = DilBertReader.from_pretrained(tiny_base, layers=1).train()
    data = load_training_data(reader.tokenizer, squad_file, TrainingConfig(layers=1, **SMALL_WINDOWS))
    cpu = torch.device("cpu")
    large_loss = accumulate_gradients(reader, data, [[0, 1, 2, 3]], cpu).item()
    large = {name: p.grad.clone() for name, p in reader.named_parameters() if p.grad is not None}
    reader.zero_grad(set_to_none=True)
    accumulated_loss = accumulate_gradients(reader, data, [[0, 1], [2, 3]], cpu).item()
    assert accumulated_loss == pytest.approx(large_loss, rel=1e-5)
    assert large
    for name, parameter in reader.named_parameters():
        if name in large:
            assert torch.allclose(parameter.grad, large[name], atol=1e-6, rtol=1e-4), name


def test_training_state_round_trips_through_safetensors(tmp_path: Path) -> None:
    """AdamW moments, scheduler position and the RNG come back exactly; no pickle involved."""
    model = torch.nn.Linear(4, 3)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, betas=(0.8, 0.95))
    scheduler = get_linear_schedule_with_warmup(optimizer, 2, 10)
    for _ in range(3):
        model(torch.randn(5, 4)).square().sum().backward()
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
    save_training_state(tmp_path, optimizer, scheduler, LoopPosition(step=3, features_seen=15, train_seconds=1.5))
    expected_draw = torch.rand(3)

    fresh_optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    fresh_scheduler = get_linear_schedule_with_warmup(fresh_optimizer, 2, 10)
    position = load_training_state(tmp_path, fresh_optimizer, fresh_scheduler)
    assert position == LoopPosition(step=3, features_seen=15, train_seconds=1.5)
    assert torch.equal(torch.rand(3), expected_draw)
    assert fresh_scheduler.get_last_lr() == scheduler.get_last_lr()
    assert fresh_optimizer.param_groups[0]["betas"] == (0.8, 0.95)
    saved, restored = optimizer.state_dict()["state"], fresh_optimizer.state_dict()["state"]
    assert saved.keys() == restored.keys()
    for index, want in saved.items():
        got = restored[index]
        for key in want:
            assert torch.equal(want[key], got[key])
    assert {path.name for path in tmp_path.iterdir()} == {"training_state.safetensors", "training_state.json"}


class _FakeCuda:
    """torch.cuda's RNG calls on a machine of `devices` GPUs, each generator's state a distinct byte tensor."""

    def __init__(self, devices: int, states: list[torch.Tensor]) -> None:
        self.devices, self.states, self.restored = devices, states, None

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setattr(torch.cuda, "is_available", lambda: self.devices > 0)
        monkeypatch.setattr(torch.cuda, "is_initialized", lambda: self.devices > 0)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: self.devices)
        monkeypatch.setattr(torch.cuda, "get_rng_state_all", lambda: list(self.states))
        monkeypatch.setattr(torch.cuda, "set_rng_state_all", lambda states: setattr(self, "restored", list(states)))


@pytest.mark.parametrize(("devices_at_resume", "restored"), [(2, True), (3, True), (1, False), (0, False)])
def test_each_gpu_s_generator_is_saved_and_put_back_where_the_resuming_machine_has_the_gpus(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, devices_at_resume: int, restored: bool
) -> None:
    """Dropout on a GPU draws from that device's generator: a run resumed on a GPU went on with other masks than one
    never stopped when only the CPU generator was saved (train52). A machine with fewer GPUs, or none, draws afresh."""
    model = torch.nn.Linear(4, 3)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    scheduler = get_linear_schedule_with_warmup(optimizer, 2, 10)
    generators = [torch.arange(16, dtype=torch.uint8) + 50 * device for device in range(2)]
    _FakeCuda(2, generators).install(monkeypatch)
    save_training_state(tmp_path, optimizer, scheduler, LoopPosition(step=3, features_seen=15, train_seconds=1.5))
    cpu_draw = torch.rand(3)
    resuming = _FakeCuda(devices_at_resume, [])
    resuming.install(monkeypatch)
    load_training_state(tmp_path, optimizer, scheduler)
    assert torch.equal(torch.rand(3), cpu_draw)
    if restored:
        assert resuming.restored is not None and all(map(torch.equal, resuming.restored, generators))
        assert len(resuming.restored) == 2
    else:
        assert resuming.restored is None


def test_a_run_on_a_cpu_saves_no_gpu_generator(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without CUDA in use, the checkpoint holds the CPU generator's state and the optimizer's tensors only."""
    from safetensors.torch import load_file

    _FakeCuda(0, []).install(monkeypatch)
    model = torch.nn.Linear(4, 3)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    save_training_state(tmp_path, optimizer, get_linear_schedule_with_warmup(optimizer, 2, 10),
                        LoopPosition(step=0, features_seen=0, train_seconds=0.0))  # fmt: skip
    assert [key for key in load_file(tmp_path / "training_state.safetensors") if key.startswith("rng.")] == [
        "rng.torch"]


@pytest.mark.parametrize(
    ("damage", "error"),
    [
        (lambda state: (state / "training_state.json").write_text(""), "JSONDecodeError"),
        (lambda state: (state / "training_state.json").write_text('{"step": "x"}'), "KeyError"),
        (lambda state: (state / "training_state.safetensors").write_bytes(b"\x00" * 50), "SafetensorError"),
    ],
)
def test_a_damaged_training_state_is_one_error_naming_the_checkpoint(tmp_path: Path, damage, error: str) -> None:
    """Resuming from a cut or edited checkpoint was a traceback; the error says which folder to move aside."""
    model = torch.nn.Linear(4, 3)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    scheduler = get_linear_schedule_with_warmup(optimizer, 2, 10)
    save_training_state(tmp_path, optimizer, scheduler, LoopPosition(step=3, features_seen=15, train_seconds=1.5))
    damage(tmp_path)
    expected = f"^{re.escape(str(tmp_path))} is a damaged training checkpoint \\({error}: "
    with pytest.raises(DilstoreError, match=expected):
        load_training_state(tmp_path, optimizer, scheduler)


def test_latest_checkpoint_ignores_partial_folders(tmp_path: Path) -> None:
    (tmp_path / "step-0000009.partial").mkdir()
    (tmp_path / "step-0000004").mkdir()
    (tmp_path / "step-0000004" / "training_state.json").write_text("{}")
    (tmp_path / "step-0000012").mkdir()  # no state file: incomplete
    assert latest_checkpoint(tmp_path) == tmp_path / "step-0000004"


@settings(max_examples=60, deadline=None)
@given(
    lengths=st.lists(st.integers(3, 300), min_size=1, max_size=400),
    batch_size=st.integers(1, 9),
    accumulation=st.integers(1, 4),
    epochs=st.integers(1, 3),
    grouped=st.booleans(),
)
def test_every_window_is_seen_once_per_epoch(
    lengths: list[int], batch_size: int, accumulation: int, epochs: int, grouped: bool
) -> None:
    num_features = len(lengths)
    config = TrainingConfig(
        layers=0, epochs=epochs, batch_size=batch_size, gradient_accumulation=accumulation, group_by_length=grouped
    )
    steps = list(optimizer_step_batches(num_features, config, lengths))
    seen = [index for step in steps for micro in step for index in micro]
    assert len(seen) == num_features * epochs
    for epoch in range(epochs):
        assert sorted(seen[epoch * num_features : (epoch + 1) * num_features]) == list(range(num_features))
    assert all(1 <= len(step) <= accumulation for step in steps)
    assert all(1 <= len(micro) <= batch_size for step in steps for micro in step)


@settings(max_examples=60, deadline=None)
@given(
    num_features=st.integers(1, 200),
    batch_size=st.integers(1, 9),
    accumulation=st.integers(1, 4),
    epochs=st.integers(1, 3),
    max_steps=st.none() | st.integers(1, 100),
)
@example(num_features=5, batch_size=2, accumulation=2, epochs=1, max_steps=None)  # 3 micro-batches: 2 steps
def test_the_run_s_step_count_is_the_steps_its_batches_make(
    num_features: int, batch_size: int, accumulation: int, epochs: int, max_steps: int | None
) -> None:
    """The schedule's length (and each log line's "step n/total") counts an epoch's last, shorter step too."""
    config = TrainingConfig(layers=0, epochs=epochs, batch_size=batch_size, gradient_accumulation=accumulation,
                            max_steps=max_steps)  # fmt: skip
    made = len(list(optimizer_step_batches(num_features, config)))
    assert total_optimizer_steps(num_features, config) == (made if max_steps is None else min(made, max_steps))


@pytest.mark.parametrize(
    ("steps", "ratio", "first_rates"),
    [(15, 0.05, [0.0, 1.0, 13 / 14]),  # 0.75 steps: one warm-up step, not none
     (15, 0.1, [0.0, 0.5, 1.0]),  # 1.5 steps: two
     (40, 0.1, [0.0, 0.25, 0.5, 0.75, 1.0]),
     (10, 0.0, [1.0, 0.9, 0.8])],
)
def test_the_warm_up_lasts_its_share_of_the_steps_rounded(steps: int, ratio: float, first_rates: list[float]) -> None:
    """The learning rate of each of the first steps, as a share of the peak: a short run's warm-up share of under
    one step still warms up for one."""
    config = TrainingConfig(layers=0, epochs=1, batch_size=1, warmup_ratio=ratio, learning_rate=1e-3)
    optimization = start_optimization(torch.nn.Linear(2, 2), steps, config, None)
    rates = []
    for _ in first_rates:
        rates.append(optimization.scheduler.get_last_lr()[0] / 1e-3)
        optimization.optimizer.step()
        optimization.scheduler.step()
    assert rates == pytest.approx(first_rates)


def test_length_grouping_cuts_padding() -> None:
    """Grouped micro-batches pad to far fewer tokens than random ones on SQuAD-like lengths."""
    lengths = torch.randint(60, 256, (3000,), generator=torch.Generator().manual_seed(0)).tolist()

    def padded_tokens(grouped: bool) -> int:
        config = TrainingConfig(layers=0, epochs=1, batch_size=16)
        steps = optimizer_step_batches(len(lengths), config, lengths if grouped else None)
        return sum(len(micro) * max(lengths[i] for i in micro) for step in steps for micro in step)

    assert padded_tokens(True) < 0.8 * padded_tokens(False)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"batch_size": 0}, "batch-size"),
        ({"max_steps": 0}, "max-steps"),
        ({"warmup_ratio": 1.0}, "warmup-ratio"),
        ({"precision": "fp8"}, "precision"),
        ({"doc_stride": 400}, "doc-stride"),
        ({"layers": -1}, "layers"),
        ({"learning_rate": float("inf")}, "learning-rate must be a finite number, got inf"),
        ({"learning_rate": float("nan")}, "learning-rate must be a finite number, got nan"),
        ({"weight_decay": float("nan")}, "weight-decay must be a finite number, got nan"),
        ({"weight_decay": -0.01}, "weight-decay must be at least 0"),
        ({"max_grad_norm": 0.0}, "max-grad-norm must be positive"),
        ({"distillation_temperature": float("nan")}, "distillation temperature must be a finite number"),
        ({"distillation_weight": float("inf")}, "alpha must be a finite number"),
        ({"seed": -1}, "seed must be from 0 to 4294967295, got -1"),
        ({"distillation_weight": 5.0}, r"^--distillation-weight acts only with --teacher, which is not given$"),
        ({"shared_norm_negatives": 0, "group_length": "sum"},
         r"^--shared-norm-negatives, --group-length act only with --shared-norm, which is not given$"),
        ({"freeze_lower": True, "store_encoding": "int8", "codebook": "/tmp/codebook"},
         r"^codebook is for the 2bit and 1bit encodings, not int8: its round trip reads none$"),
    ],
)
def test_config_rejects_bad_values(changes: dict, message: str) -> None:
    with pytest.raises(DilstoreError, match=message):
        TrainingConfig(**{"layers": 0, **changes})


@pytest.mark.parametrize("seed", [0, 2**32 - 1])
def test_the_seed_bounds_the_message_names_are_taken_and_one_past_is_refused(seed: int) -> None:
    """A seed is "from 0 to 4294967295" (what numpy's and torch's seeding take): both ends are seeds."""
    assert TrainingConfig(layers=0, seed=seed).seed == seed
    with pytest.raises(DilstoreError, match="seed must be from 0 to 4294967295, got 4294967296"):
        TrainingConfig(layers=0, seed=2**32)


def test_weight_decay_falls_on_matrices_only_not_on_biases_or_norms() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.LayerNorm(4), torch.nn.Linear(4, 2, bias=False))
    optimizer = build_optimizer(model, TrainingConfig(layers=0, weight_decay=0.25))
    decay = {id(parameter): group["weight_decay"] for group in optimizer.param_groups for parameter in group["params"]}
    assert {name: decay[id(parameter)] for name, parameter in model.named_parameters()} == {
        "0.weight": 0.25, "0.bias": 0.0, "1.weight": 0.0, "1.bias": 0.0, "2.weight": 0.25}


def test_a_doc_stride_as_long_as_the_window_is_refused_and_one_shorter_taken() -> None:
    """The stride must be "smaller than max-seq-length", as the message says: equal is refused, one less taken."""
    with pytest.raises(DilstoreError, match=r"doc-stride \(48\) must be smaller than max-seq-length \(48\)"):
        TrainingConfig(layers=0, max_seq_length=48, doc_stride=48, max_question_length=24)
    assert TrainingConfig(layers=0, max_seq_length=48, doc_stride=47, max_question_length=24).doc_stride == 47


def small_train_qa(model: Path, train: Path, output: Path, *extra: str) -> list[str]:
    """`dilstore train qa` arguments for the tiny reader: short windows, no progress bar, then `extra`."""
    return ["train", "qa", "--model", str(model), "--train", str(train), "--output", str(output),
            "--max-seq-length", "48", "--doc-stride", "16", "--max-question-length", "24", "--no-progress",
            *extra]  # fmt: skip


def test_cli_trains_evaluates_and_writes_the_run(
    tiny_base: Path, squad_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    output = tmp_path / "run"
    status = main(small_train_qa(tiny_base, squad_file, output, "--layers", "2", "--dev", str(squad_file),
                                 "--max-steps", "2", "--batch-size", "4", "--json"))  # fmt: skip
    assert status == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["k"] == 2 and summary["train_steps"] == 2 and summary["questions"] == 6
    assert 0 <= summary["em"] <= summary["f1"] <= 100
    evaluation = json.loads((output / "eval-dev.json").read_text())
    assert {"questions", "em", "f1", "k", "seconds", "train_seconds", "train_steps"} <= evaluation.keys()
    metadata = json.loads((output / TRAINING_METADATA_FILE).read_text())
    assert metadata["layers"] == 2
    assert metadata["command"].startswith("dilstore train qa --model ")
    assert "--max-steps 2" in metadata["command"] and "--learning-rate 3e-05" in metadata["command"]
    assert DilBertReader.from_pretrained(output).layers == 2


def test_cli_prints_one_line_without_json(
    tiny_base: Path, squad_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    status = main(small_train_qa(tiny_base, squad_file, tmp_path / "run", "--layers", "1", "--dev", str(squad_file),
                                 "--max-steps", "1", "--batch-size", "4", "--eval-limit", "2"))  # fmt: skip
    assert status == 0
    assert re.fullmatch(r"k=1  steps 1  train \d+\.\d s  dev EM \d+\.\d\d  F1 \d+\.\d\d  eval \d+\.\d s\n",
                        capsys.readouterr().out)


def test_a_diverging_run_saves_no_nan_weights_and_says_so(
    tiny_base: Path, squad_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A learning rate of 1e6 drives the weights to NaN; the run stops with exit 2 instead of shipping them (exit 0)."""
    output = tmp_path / "run"
    status = main(small_train_qa(tiny_base, squad_file, output, "--layers", "1", "--max-steps", "6",
                                 "--batch-size", "2", "--learning-rate", "1e6", "--save-every", "3"))  # fmt: skip
    err = capsys.readouterr().err
    assert status == 2 and "dilstore train: error: training diverged: at step " in err
    assert "hold NaN or infinity" in err and "lower --learning-rate" in err
    assert not (output / "model.safetensors").exists()


def test_cli_reports_missing_training_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "nope.json"
    status = main(["train", "qa", "--layers", "1", "--train", str(missing), "--output", str(tmp_path / "o")])
    assert status == 2
    assert f"--train {missing}: no such file" in capsys.readouterr().err


def test_a_bad_dev_file_or_eval_limit_is_refused_before_training(
    tiny_base: Path, squad_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Both failed only after the training, whose folder a rerun then refused: the run was lost."""
    broken = tmp_path / "dev.json"
    broken.write_text('{"data": [{"paragraphs": [{"context": "x"}]}]}', encoding="utf-8")
    status = main(small_train_qa(tiny_base, squad_file, tmp_path / "a", "--layers", "1", "--dev", str(broken)))
    assert status == 2 and "has no 'qas' key" in capsys.readouterr().err
    assert not (tmp_path / "a").exists()
    with pytest.raises(SystemExit):
        main(small_train_qa(tiny_base, squad_file, tmp_path / "b", "--layers", "1", "--dev", str(squad_file),
                            "--eval-limit", "0"))  # fmt: skip
    assert "argument --eval-limit: expected a positive integer, got 0" in capsys.readouterr().err
    assert not (tmp_path / "b").exists()
    status = main(small_train_qa(tiny_base, squad_file, tmp_path / "c", "--layers", "1", "--eval-limit", "5"))
    assert status == 2 and "--eval-limit picks the dev questions" in capsys.readouterr().err  # was run, not evaluated
    assert not (tmp_path / "c").exists()
    too_long = ["--max-seq-length", "100000"]
    status = main([*small_train_qa(tiny_base, squad_file, tmp_path / "d", "--layers", "1"), *too_long])
    assert status == 2 and "limit 100000 (--max-seq-length) is more than this model's" in capsys.readouterr().err
    assert not (tmp_path / "d").exists()  # it failed at the first long window, leaving a run folder a rerun refused


def test_a_training_question_without_answers_is_refused_by_id(
    tiny_base: Path, squad_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Its windows were all labelled [CLS], which trains the reader that the answer is absent, without a word."""
    document = json.loads(squad_file.read_text(encoding="utf-8"))
    questions = [qa for article in document["data"] for paragraph in article["paragraphs"] for qa in paragraph["qas"]]
    questions[1]["answers"] = []
    unanswered = tmp_path / "unanswered.json"
    unanswered.write_text(json.dumps(document), encoding="utf-8")
    status = main(small_train_qa(tiny_base, unanswered, tmp_path / "run", "--layers", "1"))
    err = capsys.readouterr().err
    assert status == 2 and f"{unanswered}: question {questions[1]['id']!r} has no answer to train on (1 such)" in err
    assert not (tmp_path / "run" / "model.safetensors").exists()


def test_a_cpu_run_records_the_cpu_s_model_where_linux_names_it(tmp_path: Path) -> None:
    """"CPU x86_64" said nothing of the machine; the model name of /proc/cpuinfo does, and without one the
    architecture platform gives is still said."""
    import platform

    from dilstore.reader.training.loop import cpu_model, hardware_description

    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC 7B13\n\nprocessor\t: 1\n"
                       "model name\t: AMD EPYC 7B13\n", encoding="utf-8")  # fmt: skip
    assert cpu_model(cpuinfo) == "AMD EPYC 7B13"
    line = hardware_description(torch.device("cpu"), cpuinfo)
    assert line.startswith("CPU AMD EPYC 7B13 (") and line.endswith(f"{torch.get_num_threads()} torch thread(s)")
    cpuinfo.write_text("processor\t: 0\nmodel name\t: \n", encoding="utf-8")
    assert cpu_model(cpuinfo) == (platform.processor() or platform.machine())
    assert cpu_model(tmp_path / "absent") == (platform.processor() or platform.machine())


def test_without_a_model_name_the_cpu_is_named_by_platform_s_processor_else_its_architecture(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """(mut55) Where /proc/cpuinfo names no model (macOS, some ARM boards), `platform.processor()` says more than the
    architecture when it says anything ("arm" where Linux reports ""); the architecture is the last word."""
    import platform

    from dilstore.reader.training.hardware import cpu_model

    monkeypatch.setattr(platform, "machine", lambda: "arm64")
    monkeypatch.setattr(platform, "processor", lambda: "arm")
    assert cpu_model(tmp_path / "absent") == "arm"
    monkeypatch.setattr(platform, "processor", lambda: "")
    assert cpu_model(tmp_path / "absent") == "arm64"


def test_a_cpu_run_records_the_logical_cpus_it_may_run_on(monkeypatch: pytest.MonkeyPatch) -> None:
    """A run held to 1 of the machine's CPUs (taskset, a container's cpuset) was recorded, and its card described,
    as on all of them: "(2 logical CPUs)" under `taskset -c 0` (review52 F3). The count is of those it may use."""
    from dilstore.reader.training import loop

    monkeypatch.setattr(loop, "cgroup_cpu_quota", lambda: None)  # whatever the machine running the test has
    monkeypatch.setattr(loop.os, "cpu_count", lambda: 64)
    monkeypatch.setattr(loop.os, "sched_getaffinity", lambda pid: {0}, raising=False)
    assert "(1 logical CPU(s) of 64)" in loop.hardware_description(torch.device("cpu"))
    monkeypatch.setattr(loop.os, "sched_getaffinity", lambda pid: set(range(64)), raising=False)
    assert "(64 logical CPUs)" in loop.hardware_description(torch.device("cpu"))


@pytest.mark.parametrize(("quota", "said"), [(2, "(64 logical CPUs, held to 2 by a cgroup CPU quota)"),
                                             (64, "(64 logical CPUs)"), (128, "(64 logical CPUs)")])  # fmt: skip
def test_a_cpu_run_records_a_cgroup_cpu_quota_below_its_cpus(
    monkeypatch: pytest.MonkeyPatch, quota: int, said: str
) -> None:
    """(left58 F5) A run in a container held to 2 CPUs' time of a 64-core host (`docker run --cpus 2`) was recorded,
    and its model card described, as on "64 logical CPUs": the quota, which its torch threads follow (env57 F2), went
    unnamed. A quota at or above the CPUs it may run on changes nothing."""
    from dilstore.reader.training import loop

    monkeypatch.setattr(loop, "cgroup_cpu_quota", lambda: quota)
    monkeypatch.setattr(loop.os, "cpu_count", lambda: 64)
    monkeypatch.setattr(loop.os, "sched_getaffinity", lambda pid: set(range(64)), raising=False)
    assert said in loop.hardware_description(torch.device("cpu"))


def test_a_cpu_run_on_a_system_that_cannot_count_its_cpus_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the system gives neither the CPUs a process may use nor the machine's count, the line said
    "(None logical CPUs)"; it now says the count is not known."""
    from dilstore.reader.training import loop

    monkeypatch.setattr(loop.os, "cpu_count", lambda: None)
    monkeypatch.delattr(loop.os, "sched_getaffinity", raising=False)
    line = loop.hardware_description(torch.device("cpu"))
    assert "None" not in line and "(logical CPUs not known)" in line


def test_the_reader_card_names_the_hardware_the_run_recorded(overfit_run, tmp_path: Path, capsys) -> None:
    """Without --hardware the card said "CPU, 2 cores shared with other jobs, 1 torch thread" for any run, whatever
    its dilstore_training.json measured (train52 F2)."""
    recorded = json.loads((overfit_run.output / TRAINING_METADATA_FILE).read_text())["hardware"]
    evaluation = tmp_path / "eval.json"
    evaluation.write_text(json.dumps({"questions": 6, "em": 100.0, "f1": 100.0, "k": 1, "seconds": 1.0}))
    with benchmark_module("package_default_checkpoint") as script:
        assert script.main(["--checkpoint", str(overfit_run.output), "--eval", str(evaluation),
                            "--destination", str(tmp_path / "packaged")]) == 0  # fmt: skip
    assert f"- Hardware: {recorded}." in (tmp_path / "packaged" / "MODEL_CARD.md").read_text()


def test_the_reader_card_refuses_the_dev_evaluation_of_another_run(overfit_run, tmp_path: Path, capsys) -> None:
    """A `train qa --dev` evaluation records the run's steps and last loss: another run's eval-dev.json of the same
    k (or the final model's, given for a periodic checkpoint) put its EM/F1 on this checkpoint's card, and the
    packager's errors were tracebacks (train52 F3)."""
    record = json.loads((overfit_run.output / TRAINING_METADATA_FILE).read_text())
    evaluation = {"questions": 6, "em": 100.0, "f1": 100.0, "k": 1, "seconds": 1.0, "output": "/runs/other",
                  "train_steps": record["steps"], "final_loss": record["final_loss"]}  # fmt: skip
    assert "EM 100.00" in render_model_card(record, evaluation, hardware="CPU", baseline_f1=None)
    unscaled = {**json.loads(json.dumps({**record, "final_loss": float("nan")}))}  # an fp16 last step's loss
    assert "EM 100.00" in render_model_card(unscaled, {**evaluation, "final_loss": json.loads("NaN")},
                                            hardware="CPU", baseline_f1=None)  # fmt: skip
    other = {**evaluation, "train_steps": record["steps"] + 3, "final_loss": 0.25}
    with pytest.raises(DilstoreError, match=f"the evaluation is of /runs/other after {record['steps'] + 3} steps"):
        render_model_card(record, other, hardware="CPU", baseline_f1=None)
    path = tmp_path / "eval-dev.json"
    path.write_text(json.dumps(other))
    with benchmark_module("package_default_checkpoint") as script:
        status = script.main(["--checkpoint", str(overfit_run.output), "--eval", str(path),
                              "--destination", str(tmp_path / "packaged")])  # fmt: skip
    err = capsys.readouterr().err
    assert status == 2 and err.startswith("package_default_checkpoint: error: the evaluation is of /runs/other")
    assert len(err.splitlines()) == 1 and not (tmp_path / "packaged").exists()


def test_packaged_checkpoint_is_fp16_and_answers_like_the_original(
    overfit_run, squad_file: Path, tmp_path: Path
) -> None:
    evaluation = {"questions": 6, "em": 100.0, "f1": 100.0, "k": 1, "seconds": 1.0,
                  "data": {"file": "/data/dev-v1.1.json", "sha256": "ab" * 32},
                  "reading": {"max_seq_length": 48, "doc_stride": 16, "max_question_length": 24,
                              "max_answer_length": 30}}  # fmt: skip
    metadata = json.loads((overfit_run.output / TRAINING_METADATA_FILE).read_text())
    card = render_model_card(metadata, evaluation, hardware="CPU, test", baseline_f1=None)
    assert ("- Dev: SQuAD v1.1 dev, 6 questions, official EM/F1; `dev-v1.1.json` (SHA-256 abababababab…), read at "
            "max length 48, doc stride 16.") in card
    packaged = package_checkpoint(overfit_run.output, tmp_path / "packaged", card)
    weights = {}
    for path in packaged.glob("*.safetensors"):
        weights.update(load_file(path))
    assert weights and all(t.dtype == torch.float16 for t in weights.values() if t.is_floating_point())
    assert weights_megabytes(packaged) < weights_megabytes(overfit_run.output)
    assert not (packaged / "checkpoints").exists()
    assert "k=1" in (packaged / "MODEL_CARD.md").read_text() and "test overfit" in card
    result = evaluate_file(
        DilBertReader.from_pretrained(packaged), squad_file, settings=ReadingSettings(**SMALL_WINDOWS, batch_size=8)
    )
    assert result.em == 100.0


def test_packaging_again_keeps_the_online_variants_of_the_same_weights(
    overfit_run, tiny_base: Path, squad_file: Path, tmp_path: Path
) -> None:
    """A variant was removed by name whenever the source lacked one (packaging the same weights again for a new
    card deleted a variant that loaded), and one in the source was saved again without its metadata (refused)."""
    packaged = package_checkpoint(overfit_run.output, tmp_path / "packaged", "card")
    base = DilBertReader.from_pretrained(packaged)
    tuned = DilBertReader.from_pretrained(packaged)
    with torch.no_grad():
        tuned.model.qa_outputs.weight.add_(0.5)
    variant = write_online_variant(tuned, base, "2bit", packaged).read_bytes()
    package_checkpoint(overfit_run.output, packaged, "a new card")
    again = package_checkpoint(packaged, tmp_path / "again", "card")
    for folder in (packaged, again):
        assert (folder / "online-2bit.safetensors").read_bytes() == variant
        reader = DilBertReader.from_pretrained(folder)
        assert load_online_variant(reader, folder, "2bit") == folder / "online-2bit.safetensors"
    config = TrainingConfig(layers=1, max_steps=1, batch_size=2, **SMALL_WINDOWS)
    train_qa(tiny_base, squad_file, tmp_path / "other", config, command="t", progress=False)
    package_checkpoint(tmp_path / "other", packaged, "other weights")
    assert not (packaged / "online-2bit.safetensors").exists()


def test_missing_default_checkpoint_is_a_clear_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr("dilstore.reader.packaged.shipped.packaged_models_dir", lambda: tmp_path)
    with pytest.raises(DilstoreError, match="default reader checkpoint is missing"):
        default_checkpoint_dir()


def test_periodic_checkpoint_is_evaluable_and_packageable(tiny_base: Path, squad_file: Path, tmp_path: Path) -> None:
    """A run cut off after a periodic checkpoint leaves a reader, its training record, and a shippable package."""
    config = TrainingConfig(layers=1, epochs=1, max_steps=2, batch_size=2, save_every=1, **SMALL_WINDOWS)
    train_qa(tiny_base, squad_file, tmp_path / "run", config, command="dilstore train qa cut", progress=False)
    step = tmp_path / "run" / "checkpoints" / "step-0000001"
    assert load_training_metadata(step)["steps"] == 1
    (step / TRAINING_METADATA_FILE).unlink()  # as written by a run that predates the record in checkpoints
    rebuilt = load_training_metadata(step)
    assert rebuilt["steps"] == 1 and rebuilt["layers"] == 1 and rebuilt["total_steps"] == 2
    assert rebuilt["command"] == "dilstore train qa cut" and rebuilt["features_seen"] == 2
    (tmp_path / "packaged").mkdir()
    (tmp_path / "packaged" / "online-2bit.safetensors").write_bytes(b"the replaced weights' online layers")
    packaged = package_checkpoint(step, tmp_path / "packaged", "card")
    assert not (packaged / "online-2bit.safetensors").exists()  # kept, every 2bit store's reads were refused
    assert not list(packaged.glob("training_state*"))
    assert json.loads((packaged / TRAINING_METADATA_FILE).read_text())["steps"] == 1
    assert DilBertReader.from_pretrained(packaged).layers == 1
    with pytest.raises(DilstoreError, match="not a periodic training checkpoint"):
        load_training_metadata(tiny_base)


@pytest.fixture(scope="module")
def plot_k_sweep():
    """benchmarks/plot_k_sweep.py as a module."""
    with benchmark_module("plot_k_sweep") as module:
        yield module


def test_k_sweep_script_writes_table_and_png(
    plot_k_sweep, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    runs = []
    for k, em, f1 in [(4, 50.0, 61.5), (0, 55.0, 66.0)]:
        path = tmp_path / f"k{k}.json"
        path.write_text(json.dumps({"questions": 100, "em": em, "f1": f1, "k": k, "seconds": 60.0}))
        runs.append(str(path))
    png, table = tmp_path / "sweep.png", tmp_path / "sweep.md"
    assert plot_k_sweep.main([*runs, "--png", str(png), "--markdown", str(table)]) == 0
    assert png.read_bytes().startswith(b"\x89PNG")
    lines = table.read_text().splitlines()
    assert lines[2].startswith("| 0 | base | 55.00 | 66.00 | +0.00 |")
    assert lines[3].startswith("| 4 | base | 50.00 | 61.50 | -4.50 |")


def test_k_sweep_takes_the_budget_of_a_run_evaluated_apart_from_its_training_record(
    plot_k_sweep, tmp_path: Path
) -> None:
    """A sweep run whose own evaluation was cut off is evaluated by `evaluate-rc`, whose JSON has no budget."""
    run = tmp_path / "sweep-k2"
    run.mkdir()
    (run / "eval-dev.json").write_text(json.dumps({"questions": 100, "em": 50.0, "f1": 60.0, "k": 2, "seconds": 9.0}))
    training = {"steps": 5476, "train_seconds": 420.0, "features_seen": 175198, "base_model": str(tmp_path / "base")}
    (run / TRAINING_METADATA_FILE).write_text(json.dumps(training))
    (row,) = plot_k_sweep.load_rows([run], [])
    assert (row["train_steps"], row["train_seconds"], row["features_seen"]) == (5476, 420.0, 175198)
    assert row["run"] == "sweep-k2" and row["init"] == "base"


def test_k_sweep_names_the_checkpoint_a_run_was_warm_started_from(plot_k_sweep, tmp_path: Path) -> None:
    start = tmp_path / "minilm-k0"
    start.mkdir()
    (start / "dilstore.json").write_text("{}")
    assert plot_k_sweep.initialisation({"base_model": str(start)}) == "minilm-k0"
    assert plot_k_sweep.initialisation({"base_model": str(tmp_path / "plain-encoder")}) == "base"
    distilled = {"base_model": "/tmp/reader-runs/sweep-k0", "config": {"teacher": "/tmp/reader-runs/sweep-k0"}}
    assert plot_k_sweep.initialisation(distilled) == "sweep-k0", "a teacher's folder left on the GPU machine"
    assert plot_k_sweep.initialisation({**distilled, "config": {"teacher": None}}) == "base"


@pytest.mark.parametrize(
    ("k", "f1", "baseline", "expected"),
    [
        (0, 76.0, None, "k=0 target F1 >= 75: met"),
        (0, 60.0, None, "k=0 target F1 >= 75: NOT met"),
        (4, 73.5, 76.0, "within 3 F1 of k=0 (76.00): met (gap 2.50); k=0 target F1 >= 75: met"),
        (4, 50.0, 60.0, "within 3 F1 of k=0 (60.00): NOT met (gap 10.00); k=0 target F1 >= 75: NOT met"),
        (4, 50.0, None, "not assessed"),
    ],
)
def test_model_card_states_whether_targets_were_met(k: int, f1: float, baseline: float | None, expected: str) -> None:
    training = {
        "layers": k, "num_layers": 6, "train_file": "train.json", "base_model": "minilm",
        "command": "dilstore train qa",
        "steps": 10, "total_steps": 10, "features_seen": 160, "train_features": 1600, "train_questions": 1500,
        "train_seconds": 60.0,
        "config": {"batch_size": 16, "gradient_accumulation": 1, "learning_rate": 1e-4, "warmup_ratio": 0.1,
                   "max_seq_length": 256, "doc_stride": 128, "seed": 42},
    }  # fmt: skip
    evaluation = {"questions": 1000, "em": f1 - 10, "f1": f1, "k": k, "seconds": 30.0}
    card = render_model_card(training, evaluation, hardware="CPU", baseline_f1=baseline)
    assert expected in card
    assert "REDUCED: 0.10 epochs" in card
    with pytest.raises(DilstoreError, match=f"the evaluation is of a k={k + 1} reader, the checkpoint has k={k}"):
        render_model_card(training, {**evaluation, "k": k + 1}, hardware="CPU", baseline_f1=baseline)


@pytest.mark.parametrize(
    ("f1", "baseline", "features_seen", "expected"),
    [
        (73.0, 76.0, 3200, ["target within 3 F1 of k=0 (76.00): met (gap 3.00)", "full: 2.00 epochs"]),
        (72.5, 76.0, 3199, ["target within 3 F1 of k=0 (76.00): NOT met (gap 3.50)", "REDUCED: 2.00 epochs"]),
        (75.0, None, 3201, ["k=0 target F1 >= 75: met (F1 75.00)", "full: 2.00 epochs"]),
    ],
)
def test_a_model_card_s_targets_include_their_bounds(
    f1: float, baseline: float | None, features_seen: int, expected: list[str]
) -> None:
    """Within 3 F1 includes a gap of 3, F1 >= 75 includes 75, and the seed's 2 epochs are a full budget."""
    training = {
        "layers": 0 if baseline is None else 4, "num_layers": 6, "train_file": "train.json", "base_model": "minilm",
        "command": "dilstore train qa", "steps": 10, "total_steps": 10, "features_seen": features_seen,
        "train_features": 1600, "train_questions": 1500, "train_seconds": 60.0,
        "config": {"batch_size": 16, "gradient_accumulation": 1, "learning_rate": 1e-4, "warmup_ratio": 0.1,
                   "max_seq_length": 256, "doc_stride": 128, "seed": 42},
    }  # fmt: skip
    evaluation = {"questions": 1000, "em": f1 - 10, "f1": f1, "seconds": 30.0}
    card = render_model_card(training, evaluation, hardware="CPU", baseline_f1=baseline)
    for line in expected:
        assert line in card


def test_the_weights_size_of_a_checkpoint_leaves_out_its_training_state(tmp_path: Path) -> None:
    """A periodic checkpoint holds the optimizer's state beside the weights; the package size limit is on weights."""
    from dilstore.reader.training.checkpoint_files import STATE_TENSORS

    (tmp_path / "model.safetensors").write_bytes(b"w" * 1_500_000)
    (tmp_path / "online-2bit.safetensors").write_bytes(b"v" * 250_000)
    (tmp_path / STATE_TENSORS).write_bytes(b"s" * 3_000_000)
    (tmp_path / "config.json").write_bytes(b"c" * 1000)
    assert weights_megabytes(tmp_path) == 1.75


@pytest.mark.parametrize(
    ("windows_per_example", "seen", "budget"),
    [
        (1, "training windows seen: 160 (of 1600 per epoch", "REDUCED: 0.10 epochs of training windows"),
        (
            4,
            "training question groups seen: 160 (shared normalisation, 4 windows each: 640 windows) (of 1600 per epoch",
            "REDUCED: 0.10 epochs of training question groups",
        ),
    ],
)
def test_model_card_counts_shared_normalisation_groups_and_their_windows(
    windows_per_example: int, seen: str, budget: str
) -> None:
    training = {
        "layers": 4, "num_layers": 6, "train_file": "train.json", "base_model": "minilm",
        "command": "dilstore train qa",
        "steps": 20, "total_steps": 20, "features_seen": 160, "train_features": 1600, "train_questions": 1600,
        "windows_per_example": windows_per_example, "train_seconds": 60.0,
        "config": {"batch_size": 8, "gradient_accumulation": 1, "learning_rate": 5e-5, "warmup_ratio": 0.06,
                   "max_seq_length": 384, "doc_stride": 128, "seed": 42},
    }  # fmt: skip
    evaluation = {"questions": 10570, "em": 51.6, "f1": 63.9, "k": 4, "seconds": 230.0}
    card = render_model_card(training, evaluation, hardware="GPU", baseline_f1=76.7)
    assert seen in card
    assert budget in card


def test_bf16_autocast_on_a_cpu_when_asked_and_fp16_still_needs_cuda() -> None:
    from dilstore.reader.training.loop import autocast_dtype

    cpu = torch.device("cpu")
    assert autocast_dtype(TrainingConfig(layers=1, precision="bf16"), cpu) is torch.bfloat16
    assert autocast_dtype(TrainingConfig(layers=1, precision="auto"), cpu) is None
    assert autocast_dtype(TrainingConfig(layers=1, precision="fp32"), cpu) is None
    with pytest.raises(DilstoreError, match="precision fp16 needs a CUDA device"):
        autocast_dtype(TrainingConfig(layers=1, precision="fp16"), cpu)


def test_a_bf16_run_on_a_cpu_trains_close_to_the_fp32_one(tiny_base: Path, squad_file: Path, tmp_path: Path) -> None:
    settings = dict(layers=1, max_steps=3, batch_size=3, learning_rate=1e-3, save_every=0, save_every_minutes=0,
                    seed=9, **SMALL_WINDOWS)  # fmt: skip
    full = train_qa(tiny_base, squad_file, tmp_path / "fp32", TrainingConfig(**settings), command="a", progress=False)
    half = train_qa(tiny_base, squad_file, tmp_path / "bf16", TrainingConfig(**settings, precision="bf16"),
                    command="a", progress=False)  # fmt: skip
    assert half.losses == pytest.approx(full.losses, rel=0.05)
    assert half.losses != full.losses, "bf16 matrix products round differently from fp32 ones"
