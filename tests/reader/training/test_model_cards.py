"""The default EARL ranker and Listformer: where they ship, its packaging as fp16 with a model card, and the card's
target line.

A tiny random 2-layer EARL ranker (and Listformer) is trained for two steps on four triples
(tests/fixtures/ranking_fixtures.py), so the card is rendered from a real
dilstore_training.json; the quality reports are written in rank_quality.py's
layout with made-up metrics, which only the card's arithmetic reads.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType

import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st
from safetensors import safe_open

from dilstore.reader.modeling.checkpoints import TRAINING_METADATA_FILE
from dilstore.reader.modeling.rankers import load_ranker
from dilstore.reader.packaged.shipped import (
    DEFAULT_LISTFORMER_NAME,
    DEFAULT_RANKER_NAME,
    default_listformer_dir,
    default_ranker_dir,
    packaged_models_dir,
)
from dilstore.reader.training.model_cards import (
    UNRECORDED_HARDWARE,
    card_hardware,
    listformer_target,
    render_ranker_card,
    require_this_run,
    target_statement,
)
from dilstore.reader.training.ranking import RankingTrainingConfig, train_ranker
from dilstore.reader.training.release import MODEL_CARD_FILE
from dilstore.storage.errors import DilstoreError
from tests.fixtures.benchmarks import benchmark_module
from tests.fixtures.qa_training_fixtures import write_tiny_checkpoint
from tests.fixtures.ranking_fixtures import write_overfit_files


def tiny_run(root: Path, kind: str, **settings: object) -> Path:
    """A two-step run of `kind` over a tiny random base, as `dilstore train KIND` leaves it."""
    triples, paragraphs = write_overfit_files(root / "data")
    config = RankingTrainingConfig(kind=kind, max_steps=2, batch_size=2, negatives=2, max_query_length=16,
                                   max_doc_length=24, log_every=1000, **settings)  # fmt: skip
    train_ranker(write_tiny_checkpoint(root / "base"), triples, paragraphs, root / "run", config,
                 command=f"dilstore train {kind} tiny", progress=False)  # fmt: skip
    return root / "run"


@pytest.fixture(scope="module")
def earl_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_run(tmp_path_factory.mktemp("earl-run"), "earl", query_layers=1)


def row(task: str, model: str, kind: str, ndcg: float, path: str = "", trained: bool | None = True) -> dict:
    return {"task": task, "model": model, "kind": kind, "path": path, "trained": trained,
            "RR@10": 0.5, "nDCG@10": ndcg, "R@100": 0.9, "seconds": 1.0}  # fmt: skip


def write_report(path: Path, rows: list[dict], queries: dict[str, int]) -> Path:
    tasks = {task: {"queries": count, "depth": 100} for task, count in queries.items()}
    path.write_text(json.dumps({"tasks": tasks, "device": "cpu", "results": rows}))
    return path


def package_script() -> ModuleType:
    """benchmarks/package_default_ranker.py, imported with its neighbour package_size."""
    with benchmark_module("package_default_ranker") as module:
        return module


def test_missing_default_ranker_is_a_clear_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr("dilstore.reader.packaged.shipped.packaged_models_dir", lambda: tmp_path)
    with pytest.raises(DilstoreError, match="default EARL ranker checkpoint is missing.*train earl"):
        default_ranker_dir()


def test_the_shipped_default_ranker_is_an_fp16_earl_checkpoint_with_a_card() -> None:
    directory = packaged_models_dir() / DEFAULT_RANKER_NAME
    assert default_ranker_dir() == directory
    with safe_open(directory / "model.safetensors", "pt") as weights:
        dtypes = {weights.get_slice(name).get_dtype() for name in weights.keys()}
    assert dtypes == {"F16"}
    assert (directory / "model.safetensors").stat().st_size < 60e6, "a committed file stays under 60 MB"
    training = json.loads((directory / TRAINING_METADATA_FILE).read_text())
    assert training["kind"] == "earl" and training["steps"] > 0
    card = (directory / MODEL_CARD_FILE).read_text()
    assert "## Results" in card and "DL19" in card and "SQuAD dev" in card and training["command"] in card


def test_the_shipped_default_listformer_is_an_fp16_delayed_prior_listformer_with_a_card() -> None:
    directory = packaged_models_dir() / DEFAULT_LISTFORMER_NAME
    assert default_listformer_dir() == directory
    with safe_open(directory / "model.safetensors", "pt") as weights:
        names = list(weights.keys())
        dtypes = {weights.get_slice(name).get_dtype() for name in names}
    assert dtypes == {"F16"} and "prior_scale" in names
    assert not any(name.startswith("prior_encoder.") for name in names), "the frozen base is named, not shipped"
    assert (directory / "model.safetensors").stat().st_size < 60e6, "a committed file stays under 60 MB"
    training = json.loads((directory / TRAINING_METADATA_FILE).read_text())
    assert training["kind"] == "listformer" and training["steps"] > 0 and training["config"]["prior"] is True
    ranker = load_ranker(directory)
    assert ranker.kind == "listformer" and ranker.delayed_layers == 4 and ranker.prior
    card = (directory / MODEL_CARD_FILE).read_text()
    assert "## Results" in card and "DL19" in card and training["command"] in card and ": met (" in card


def test_package_writes_fp16_weights_and_a_card_with_every_row(earl_run: Path, tmp_path: Path, capsys) -> None:
    checkpoint = str(earl_run)
    dl19 = write_report(tmp_path / "dl19.json", [
        row("DL19", "BM25", "bm25", 0.5058, trained=None),
        row("DL19", "cross-encoder ce (9 steps)", "cross-encoder", 0.6400, "runs/ce"),
        row("DL19", "earl run (2 steps)", "earl", 0.6350, checkpoint),
    ], {"DL19": 43})  # fmt: skip
    squad = write_report(tmp_path / "squad.json", [
        row("SQuAD dev", "BM25", "bm25", 0.86, trained=None),
        row("SQuAD dev", "earl run (2 steps)", "earl", 0.8, checkpoint),
    ], {"SQuAD dev": 500})  # fmt: skip
    again = write_report(tmp_path / "again.json", [row("SQuAD dev", "BM25", "bm25", 0.86, trained=None)],
                         {"SQuAD dev": 500})  # fmt: skip
    destination = tmp_path / "packaged"
    stray = earl_run / ".tmp-dilstore.json.k1.tmp"  # what a write killed midway leaves (review38 M5)
    stray.write_text("{")
    try:
        status = package_script().main(["--checkpoint", checkpoint, "--quality", str(dl19), "--quality", str(squad),
                                        "--quality", str(again), "--destination", str(destination)])  # fmt: skip
    finally:
        stray.unlink()
    assert status == 0
    assert not list(destination.glob(".tmp-*")), "a killed write's temporary is not shipped"
    assert json.loads(capsys.readouterr().out)["destination"] == str(destination)
    with safe_open(destination / "model.safetensors", "pt") as weights:
        assert {weights.get_slice(name).get_dtype() for name in weights.keys()} == {"F16"}
    card = (destination / MODEL_CARD_FILE).read_text()
    assert "| DL19 | **earl run (2 steps)** | 0.5000 | 0.6350 | 0.9000 | 43 |" in card
    assert "| SQuAD dev | **earl run (2 steps)** |" in card and "| DL19 | BM25 |" in card
    assert card.count("| SQuAD dev | BM25 |") == 1, "a row repeated by another report is listed once"
    assert "Command: `dilstore train earl tiny`" in card and "2 of a 2-step schedule" in card
    assert "cross-encoder on DL19: met (cross-encoder 0.6400, this ranker 0.6350, gap +0.0050)" in card
    original, packaged = load_ranker(earl_run), load_ranker(destination)
    with torch.no_grad():
        texts = (["who wrote it?"] * 2, ["It was written by a poet.", "Rain fell all day."])
        want, got = original.score_texts(*texts), packaged.score_texts(*texts)
    torch.testing.assert_close(got, want, atol=1e-2, rtol=0)  # fp16 weights, fp32 compute


def test_a_listformer_run_is_packaged_as_the_default_listformer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    run = tiny_run(tmp_path, "listformer", delayed_layers=1, prior=True, loss="approx-ndcg")
    monkeypatch.setattr("dilstore.reader.packaged.shipped.packaged_models_dir", lambda: tmp_path / "models")
    dl19 = write_report(tmp_path / "dl19.json", [
        row("DL19", "BM25", "bm25", 0.5058, trained=None),
        row("DL19", "cross-encoder ce (200 steps)", "cross-encoder", 0.1806, "runs/ce"),
        row("DL19", "listformer run (2 steps)", "listformer", 0.6300, str(run)),
    ], {"DL19": 43})  # fmt: skip
    script = package_script()
    script.packaged_models_dir = lambda: tmp_path / "models"  # the script's own import of it
    capsys.readouterr()
    assert script.main(["--checkpoint", str(run), "--quality", str(dl19)]) == 0
    destination = tmp_path / "models" / DEFAULT_LISTFORMER_NAME
    assert json.loads(capsys.readouterr().out)["destination"] == str(destination)
    assert default_listformer_dir() == destination
    card = (destination / MODEL_CARD_FILE).read_text()
    assert card.startswith(f"# {DEFAULT_LISTFORMER_NAME}: Listformer ranker, all-MiniLM-L6-v2, k=1 delayed layers, bi")
    assert "approx-ndcg loss (T = 1.0) over lists of 1 positive and 2 negatives" in card
    assert "above BM25's: met (this ranker 0.6300, cross-encoder 0.1806, BM25 0.5058)" in card
    assert "prior_encoder.encoder.layer.0.output.dense.weight" not in safe_open(
        destination / "model.safetensors", "pt"
    ).keys(), "the prior's frozen base is named, not shipped"  # fmt: skip


@pytest.mark.parametrize("given", [[], ["--hardware", "one NVIDIA H200"]])
def test_the_card_names_the_hardware_the_run_recorded_unless_told_otherwise(
    given: list[str], earl_run: Path, tmp_path: Path, capsys
) -> None:
    """The card said "CPU only (2-vCPU shared development VM), 2 torch threads, no GPU" for any run, a GPU's too,
    whatever its dilstore_training.json measured (train52 F2)."""
    recorded = json.loads((earl_run / TRAINING_METADATA_FILE).read_text())["hardware"]
    report = write_report(tmp_path / "r.json", [row("DL19", "earl", "earl", 0.6, str(earl_run))], {"DL19": 43})
    destination = tmp_path / "packaged"
    assert package_script().main(["--checkpoint", str(earl_run), "--quality", str(report),
                                  "--destination", str(destination), *given]) == 0  # fmt: skip
    card = (destination / MODEL_CARD_FILE).read_text()
    assert f"- Hardware: {given[1] if given else recorded}." in card


def test_the_card_finds_the_checkpoint_s_rows_however_its_path_is_spelled(
    earl_run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    """rank_quality.py records the path it was given; a --checkpoint spelled otherwise (relative here, absolute
    there) matched no row, and the card then said "no trained cross-encoder on DL19 was given" beside the
    cross-encoder's row, hiding a target NOT met (train52 F5). A checkpoint no report scored is refused."""
    report = write_report(tmp_path / "r.json", [
        row("DL19", "cross-encoder ce", "cross-encoder", 0.90, "runs/ce"),
        row("DL19", "earl run", "earl", 0.40, str(earl_run)),
    ], {"DL19": 43})  # fmt: skip
    monkeypatch.chdir(earl_run.parent)
    assert package_script().main(["--checkpoint", earl_run.name, "--quality", str(report),
                                  "--destination", str(tmp_path / "packaged")]) == 0  # fmt: skip
    card = (tmp_path / "packaged" / MODEL_CARD_FILE).read_text()
    assert "| DL19 | **earl run** |" in card
    assert "cross-encoder on DL19: NOT met (cross-encoder 0.9000, this ranker 0.4000, gap +0.5000)" in card
    other = write_report(tmp_path / "other.json", [row("DL19", "earl elsewhere", "earl", 0.4, "runs/other")],
                         {"DL19": 43})  # fmt: skip
    capsys.readouterr()
    assert package_script().main(["--checkpoint", earl_run.name, "--quality", str(other),
                                  "--destination", str(tmp_path / "refused")]) == 2  # fmt: skip
    err = capsys.readouterr().err
    assert err.startswith(f"package_default_ranker: error: no row of the --quality reports scored {earl_run.name}")
    assert len(err.splitlines()) == 1 and not (tmp_path / "refused").exists()


@pytest.mark.parametrize(("loss", "said"), [("approx-ndcg", "approx-ndcg loss (T = 0.5) over"),
                                           ("listnet", "listnet loss over"), ("softmax", "softmax loss over"),
                                           ("hinge", "hinge loss over")])  # fmt: skip
def test_a_listformer_card_gives_a_temperature_only_to_the_loss_that_has_one(loss: str, said: str) -> None:
    """ListNet has no temperature; its card said "listnet loss (T = 1.0)" (train52 F6). Nor have the softmax and
    hinge losses, which a Listformer trained through the Python API (RankingTrainingConfig) may use."""
    RankingTrainingConfig(kind="listformer", loss=loss, delayed_layers=1)  # a run the API accepts
    config = {"loss": loss, "temperature": 0.5 if loss == "approx-ndcg" else 1.0, "negatives": 3, "delayed_layers": 1,
              "prior": False, "batch_size": 8, "gradient_accumulation": 1, "learning_rate": 3e-5, "warmup_ratio": 0.1,
              "max_query_length": 32, "max_doc_length": 128, "seed": 42}  # fmt: skip
    training = {"kind": "listformer", "config": config, "triples": "t.jsonl.gz", "base_model": "b", "command": "c",
                "steps": 2, "total_steps": 2, "triples_seen": 16, "train_triples": 16, "pairs_seen": 64,
                "train_seconds": 6.0, "final_loss": -0.5}  # fmt: skip
    results = [{**row("DL19", "lf", "listformer", 0.5, "me"), "queries": 43}]
    card = render_ranker_card(training, results, checkpoint="me", hardware="CPU")
    assert f"- {said} lists of 1 positive and 3 negatives" in card
    assert "T = " not in card or loss == "approx-ndcg"


def test_a_last_loss_that_is_not_finite_is_null_in_the_training_record_the_json_and_the_card(
    tmp_path: Path,
) -> None:
    """(left61 F4) A last step fp16's gradient scaler skipped (or a call that ran no step) has a NaN loss, which
    json.dumps wrote as NaN into dilstore_training.json and `train ... --json`: no JSON, refused by other languages'
    parsers. It is null now, and the card that reads the record says it was not finite."""
    from types import SimpleNamespace

    from dilstore.reader.training.loop import write_training_record
    from dilstore.reader.training.state import LoopPosition
    from dilstore.runners.cmd_train import qa_summary
    from dilstore.runners.cmd_train_ranking import ranker_summary

    write_training_record(tmp_path, {}, LoopPosition(step=1, features_seen=2, train_seconds=1.0), float("nan"),
                          torch.device("cpu"))  # fmt: skip
    result = SimpleNamespace(layers=1, kind="earl", steps=1, features_seen=2, triples_seen=2, train_seconds=1.0,
                             final_loss=float("inf"), output=tmp_path)  # fmt: skip
    record = json.loads((tmp_path / TRAINING_METADATA_FILE).read_text(encoding="utf-8"))
    for document in (record, qa_summary(result), ranker_summary(result)):  # type: ignore[arg-type]
        assert document["final_loss"] is None
        json.dumps(document, allow_nan=False)
    config = {"loss": "softmax", "temperature": 1.0, "negatives": 3, "delayed_layers": 1, "prior": False,
              "batch_size": 8, "gradient_accumulation": 1, "learning_rate": 3e-5, "warmup_ratio": 0.1,
              "max_query_length": 32, "max_doc_length": 128, "seed": 42}  # fmt: skip
    training = {"kind": "listformer", "config": config, "triples": "t.jsonl.gz", "base_model": "b", "command": "c",
                "steps": 2, "total_steps": 2, "triples_seen": 16, "train_triples": 16, "pairs_seen": 64,
                "train_seconds": 6.0, "final_loss": None}  # fmt: skip
    results = [{**row("DL19", "lf", "listformer", 0.5, "me"), "queries": 43}]
    card = render_ranker_card(training, results, checkpoint="me", hardware="CPU")
    assert "loss of the last step not finite." in card


def test_packaging_into_the_run_itself_is_refused_in_one_line(earl_run: Path, tmp_path: Path, capsys) -> None:
    """--destination equal to --checkpoint ended in shutil's SameFileError traceback, exit 1 (train52 F7)."""
    report = write_report(tmp_path / "r.json", [row("DL19", "earl", "earl", 0.6, str(earl_run))], {"DL19": 43})
    before = (earl_run / "model.safetensors").read_bytes()
    assert package_script().main(["--checkpoint", str(earl_run), "--quality", str(report),
                                  "--destination", str(earl_run / ".." / earl_run.name)]) == 2  # fmt: skip
    err = capsys.readouterr().err
    assert err.startswith("package_default_ranker: error: --destination ") and "is the checkpoint itself" in err
    assert len(err.splitlines()) == 1 and (earl_run / "model.safetensors").read_bytes() == before


def test_package_size_report_fails_over_the_limit(earl_run: Path, capsys) -> None:
    with benchmark_module("package_size") as script:
        assert script.report_package_size(earl_run, limit_mb=1000.0) == 0
        assert json.loads(capsys.readouterr().out)["destination"] == str(earl_run)
        assert script.report_package_size(earl_run, limit_mb=1e-6) == 1
    assert "over the 0 MB limit" in capsys.readouterr().err


def test_package_refuses_a_run_of_another_kind(tmp_path: Path, capsys) -> None:
    run = tmp_path / "ce"
    run.mkdir()
    (run / TRAINING_METADATA_FILE).write_text(json.dumps({"kind": "cross-encoder"}))
    report = write_report(tmp_path / "r.json", [], {})
    assert package_script().main(["--checkpoint", str(run), "--quality", str(report),
                                  "--destination", str(tmp_path / "out")]) == 2  # fmt: skip
    assert "holds a 'cross-encoder' run, not an EARL ranker or a Listformer" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("rows", "expected"),
    [
        ([row("DL19", "ce", "cross-encoder", 0.70), row("DL19", "e", "earl", 0.68, "me")], "NOT met"),
        ([row("DL19", "ce", "cross-encoder", 0.70), row("DL19", "e", "earl", 0.72, "me")], "met (cross"),
        # A gap of exactly the target is within it (0.02 - 0.01 is 0.01 in floats too).
        ([row("DL19", "ce", "cross-encoder", 0.02), row("DL19", "e", "earl", 0.01, "me")], ": met (cross"),
        ([row("DL19", "ce", "cross-encoder", 0.02), row("DL19", "e", "earl", 0.0, "me")], "NOT met"),
        ([row("DL19", "ce", "cross-encoder", 0.7, trained=False), row("DL19", "e", "earl", 0.7, "me")], "not assessed"),
        ([row("SQuAD dev", "ce", "cross-encoder", 0.70), row("DL19", "e", "earl", 0.7, "me")], "not assessed"),
    ],
)
def test_target_statement(rows: list[dict], expected: str) -> None:
    assert expected in target_statement(rows, "me")


@pytest.mark.parametrize(
    ("rows", "expected"),
    [
        ([row("DL19", "ce", "cross-encoder", 0.18), row("DL19", "b", "bm25", 0.5),
          row("DL19", "l", "listformer", 0.6, "me")],
         ": met"),
        ([row("DL19", "ce", "cross-encoder", 0.18), row("DL19", "b", "bm25", 0.5),
          row("DL19", "l", "listformer", 0.4, "me")],
         "NOT met"),
        ([row("DL19", "ce", "cross-encoder", 0.7), row("DL19", "b", "bm25", 0.5),
          row("DL19", "l", "listformer", 0.6, "me")],
         "NOT met"),
        # At least the cross-encoder's: an equal score meets it; above BM25's: an equal one does not.
        ([row("DL19", "ce", "cross-encoder", 0.6), row("DL19", "b", "bm25", 0.5),
          row("DL19", "l", "listformer", 0.6, "me")],
         ": met"),
        ([row("DL19", "ce", "cross-encoder", 0.4), row("DL19", "b", "bm25", 0.6),
          row("DL19", "l", "listformer", 0.6, "me")],
         "NOT met"),
        ([row("DL19", "ce", "cross-encoder", 0.18), row("DL19", "l", "listformer", 0.6, "me")], "not assessed"),
    ],
)  # fmt: skip
def test_listformer_target(rows: list[dict], expected: str) -> None:
    assert expected in listformer_target(rows, "me")


@settings(max_examples=60, deadline=None)
@given(recorded=st.one_of(st.none(), st.text(max_size=8), st.integers(), st.booleans()), present=st.booleans(),
       given_line=st.one_of(st.none(), st.text(max_size=8)))  # fmt: skip
@example(recorded="", present=True, given_line=None)  # an empty recorded line is not a hardware
def test_the_card_s_hardware_is_the_given_line_else_a_recorded_text_else_not_recorded(
    recorded, present: bool, given_line
) -> None:
    """--hardware wins when it says something; else the record's hardware when it is a text that says something; an
    empty or missing one (or one of another type) is "not recorded", never an empty "- Hardware: ." line."""
    training = {"hardware": recorded} if present else {}
    if given_line:
        expected = given_line
    elif present and isinstance(recorded, str) and len(recorded) > 0:
        expected = recorded
    else:
        expected = UNRECORDED_HARDWARE
    assert card_hardware(training, given_line) == expected


@pytest.mark.parametrize(
    ("training", "evaluation", "refused"),
    [
        ({"steps": 5, "final_loss": 0.5}, {"train_steps": 5, "final_loss": 0.5}, False),
        ({"steps": 5, "final_loss": 0.5}, {"train_steps": 6, "final_loss": 0.5}, True),
        ({"steps": 5, "final_loss": 0.5}, {"train_steps": 5, "final_loss": 0.25}, True),
        ({"steps": 5, "final_loss": 0.5}, {"train_steps": 5}, False),  # an evaluation that recorded no last loss
        ({"final_loss": 0.5}, {"train_steps": 5, "final_loss": 0.5}, False),  # a record without its steps
        ({"steps": 5, "final_loss": 0.5}, {"em": 1.0, "f1": 1.0}, False),  # evaluate-rc --json: no run recorded
        ({"steps": 5, "final_loss": float("nan")}, {"train_steps": 5, "final_loss": float("nan")}, False),  # fp16
        ({"steps": 5, "final_loss": float("nan")}, {"train_steps": 5, "final_loss": None}, False),  # left61 F4
        ({"steps": 5, "final_loss": None}, {"train_steps": 5, "final_loss": 0.5}, True),
    ],
)
def test_an_evaluation_is_refused_only_when_its_recorded_steps_or_loss_tell_another_run(
    training: dict, evaluation: dict, refused: bool
) -> None:
    """What either side did not record cannot tell the runs apart, so it passes; a differing step count or last loss
    is another run's evaluation."""
    if refused:
        with pytest.raises(DilstoreError, match="give the evaluation of this checkpoint"):
            require_this_run(training, evaluation)
    else:
        require_this_run(training, evaluation)
