"""`dilstore evaluate-rc`: windows → reader logits → best span across windows → answer text → EM/F1.

An oracle scorer (logits that peak at each window's gold labels) drives the
same prediction path as a real reader, so the mapping from windows back to
answer text is checked on the hard cases — answers at window edges, cut by
a window, present in several overlapping windows, and unicode — independent
of any model's quality.
"""

from __future__ import annotations

import errno
import hashlib
import json
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dilstore.reader.data.qa_batches import QABatch, collate_features
from dilstore.reader.data.qa_features import answer_token_range, build_features, window_features
from dilstore.reader.data.squad import load_squad
from dilstore.reader.evaluation.reading_comprehension import (
    ReadingSettings,
    evaluate_file,
    evaluate_reader,
    predict_answers,
    reader_scorer,
)
from dilstore.reader.modeling.checkpoints import base_model_dir
from dilstore.reader.modeling.dilbert import DilBertReader
from dilstore.reader.text.tokenization import passage_pieces
from dilstore.runners.cli import main
from dilstore.storage.errors import DilstoreError
from tests.fixtures.pipes import empty_pipe
from tests.fixtures.qa_training_fixtures import HANDFUL


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(base_model_dir(), local_files_only=True)


def oracle_scorer(batch: QABatch) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits that are 10 at each window's gold start/end (0 = [CLS] without the answer) and 0 elsewhere."""
    width = batch.question_ids.shape[1] + batch.passage_ids.shape[1]
    rows = torch.arange(len(batch.start_targets))
    start = torch.zeros(len(rows), width)  # (b, nq + np)
    end = torch.zeros(len(rows), width)  # (b, nq + np)
    start[rows, batch.start_targets] = 10.0
    end[rows, batch.end_targets] = 10.0
    return start, end


def oracle_predictions(tokenizer, examples, reading: ReadingSettings) -> dict[str, str]:
    return predict_answers(
        window_features(tokenizer, examples, reading), oracle_scorer, reading, tokenizer.pad_token_id
    )


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(window=st.integers(8, 40), stride=st.integers(1, 40), batch_size=st.integers(1, 9))
def test_gold_labels_map_back_to_the_exact_answer_text(
    tokenizer, squad_file: Path, window: int, stride: int, batch_size: int
) -> None:
    """Whatever the windowing, the labelled span of the best window reads back as the exact gold string.

    Only questions whose answer lies wholly inside some window can be
    labelled (a stride as long as the window can cut every copy of it).
    """
    examples = load_squad(squad_file)
    windowing = dict(max_seq_length=24 + window, doc_stride=stride, max_question_length=24)
    reading = ReadingSettings(batch_size=batch_size, **windowing)
    features = list(build_features(tokenizer, examples, **windowing))
    labelled = {feature.example_id for feature in features if feature.has_answer}
    assert labelled, "no answer fits in any window"
    predictions = predict_answers(features, oracle_scorer, reading, tokenizer.pad_token_id)
    assert set(predictions) == {example.id for example in examples}
    for example in examples:
        if example.id in labelled:
            assert predictions[example.id] == example.answers[0].text


def test_hard_cases_are_really_exercised(tokenizer, squad_file: Path) -> None:
    """At stride 1 the long paragraph's answer is cut by some windows and whole in several others."""
    examples = {example.id: example for example in load_squad(squad_file)}
    keeper = examples["q-keeper"]
    reading = ReadingSettings(max_seq_length=36, doc_stride=1, max_question_length=24)
    features = list(build_features(tokenizer, [keeper], max_seq_length=36, doc_stride=1, max_question_length=24))
    pieces = passage_pieces(tokenizer, keeper.context)
    first, last = answer_token_range(pieces, keeper.answers[0].answer_start, keeper.answers[0].answer_end)
    holding = [feature for feature in features if feature.has_answer]
    assert len(features) > 3 and len(holding) >= 2
    cut = [
        feature
        for feature in features
        if not feature.has_answer and any(first <= i <= last for i in _window_piece_range(feature, pieces))
    ]
    assert cut, "no window cuts the answer at this windowing"
    assert oracle_predictions(tokenizer, [keeper], reading) == {"q-keeper": "Ingrid Solberg"}
    unicode = [examples["q-cafe-price"], examples["q-zurich-year"]]
    assert oracle_predictions(tokenizer, unicode, reading) == {"q-cafe-price": "€4.50", "q-zurich-year": "1882"}


def _window_piece_range(feature, pieces) -> range:
    """The passage piece indices a window holds, found from its character spans."""
    spans = feature.passage.char_spans[:-1]  # drop the trailing [SEP]
    first = int((pieces.char_spans[:, 0] == spans[0, 0]).nonzero()[0][0])
    return range(first, first + len(spans))


def test_answers_do_not_depend_on_batching(tiny_base: Path, squad_file: Path) -> None:
    """A real (random) reader gives the same answers one window at a time and in mixed-length batches."""
    reader = DilBertReader.from_pretrained(tiny_base, layers=1)
    examples = load_squad(squad_file)
    windowing = dict(max_seq_length=40, doc_stride=8, max_question_length=16)
    one = evaluate_reader(reader, examples, ReadingSettings(batch_size=1, **windowing))
    many = evaluate_reader(reader, examples, ReadingSettings(batch_size=7, **windowing))
    assert one.predictions == many.predictions
    assert set(one.predictions) == {example.id for example in examples}
    assert one.k == 1 and one.questions == len(examples)


def test_reader_scorer_runs_the_training_forward_pass(tiny_base: Path, tokenizer) -> None:
    """Evaluation scores windows with the reader's forward, the code path training uses."""
    reader = DilBertReader.from_pretrained(tiny_base, layers=2)
    example_features = list(
        build_features(
            tokenizer,
            [_example(HANDFUL[0][0], "Who runs it?", "VBZ")],
            max_seq_length=40,
            doc_stride=8,
            max_question_length=16,
        )
    )
    batch = collate_features(example_features, tokenizer.pad_token_id)
    start, end = reader_scorer(reader, torch.device("cpu"))(batch)
    with torch.no_grad():
        want_start, want_end = reader(batch.question_ids, batch.question_mask, batch.passage_ids, batch.passage_mask)
    assert torch.equal(start, want_start) and torch.equal(end, want_end)


def _example(context: str, question: str, answer: str):
    from dilstore.reader.data.squad import SquadAnswer, SquadExample

    return SquadExample(
        title="t", context=context, id="x", question=question,
        answers=(SquadAnswer(text=answer, answer_start=context.index(answer)),),
    )  # fmt: skip


def test_questions_without_references_are_refused(tiny_base: Path, tmp_path: Path) -> None:
    document = {"version": "1.1", "data": [{"title": "t", "paragraphs": [
        {"context": "Some text.", "qas": [{"id": "q1", "question": "What?", "answers": []}]}
    ]}]}  # fmt: skip
    path = tmp_path / "no-answers.json"
    path.write_text(json.dumps(document))
    reader = DilBertReader.from_pretrained(tiny_base, layers=0)
    with pytest.raises(DilstoreError, match="^question 'q1' has no reference answer"):
        evaluate_reader(reader, load_squad(path))
    with pytest.raises(DilstoreError, match=rf"^{path}: question 'q1' has no reference answer .*\(1 such\)$"):
        evaluate_file(reader, path)  # the command names the file (longrun45 F7)


def test_a_file_without_questions_is_named(tiny_base: Path, tmp_path: Path) -> None:
    """It said "no questions to evaluate" without naming the file (trainqa36 L4; `train qa` names it)."""
    document = {"version": "1.1", "data": [{"title": "t", "paragraphs": [{"context": "Some text.", "qas": []}]}]}
    path = tmp_path / "no-questions.json"
    path.write_text(json.dumps(document))
    reader = DilBertReader.from_pretrained(tiny_base, layers=0)
    with pytest.raises(DilstoreError, match=f"^{path}: no questions to evaluate"):
        evaluate_file(reader, path)


def test_cli_json_prints_the_documented_keys(
    tiny_base: Path, squad_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    reader_dir = DilBertReader.from_pretrained(tiny_base, layers=1).save_pretrained(tmp_path / "reader")
    predictions = tmp_path / "predictions.json"
    status = main(
        ["evaluate-rc", "--model", str(reader_dir), "--data", str(squad_file), "--limit", "4", "--json",
         "--max-seq-length", "48", "--doc-stride", "16", "--max-question-length", "24",
         "--predictions", str(predictions)]
    )  # fmt: skip
    assert status == 0
    printed = json.loads(capsys.readouterr().out)
    assert set(printed) == {"questions", "em", "f1", "k", "seconds", "reading", "data", "resumed_questions"}
    assert printed["questions"] == 4 and printed["k"] == 1
    # What was measured, which the JSON did not say: evaluate-rc reads at 384 by default, train qa --dev at its own
    # windows (train41 M2).
    assert printed["reading"] == {"max_seq_length": 48, "doc_stride": 16, "max_question_length": 24,
                                  "max_answer_length": 30}  # fmt: skip
    assert printed["data"] == {"file": str(squad_file), "sha256": hashlib.sha256(squad_file.read_bytes()).hexdigest()}
    assert 0 <= printed["em"] <= printed["f1"] <= 100
    assert len(json.loads(predictions.read_text())) == 4
    # Only --json turned the bar off (cli43 L4).
    text_run = ["evaluate-rc", "--model", str(reader_dir), "--data", str(squad_file), "--limit", "2",
                "--max-seq-length", "48", "--doc-stride", "16", "--max-question-length", "24"]  # fmt: skip
    assert main(text_run) == 0 and "reading: 100%" in (bar := capsys.readouterr().err)
    assert "token/s]" in bar and "batch" not in bar  # padded tokens, whose time left holds (longrun45 F3)
    assert main([*text_run, "--no-progress"]) == 0 and "reading" not in capsys.readouterr().err
    # The file written scores the same with --score, the same subset and no model (eval40 L1: no command scored one).
    assert main(["evaluate-rc", "--data", str(squad_file), "--limit", "4", "--score", str(predictions), "--json"]) == 0
    scored = json.loads(capsys.readouterr().out)
    assert scored == {"questions": 4, "em": printed["em"], "f1": printed["f1"], "unanswered": 0}
    assert main(["evaluate-rc", "--data", str(squad_file), "--score", str(predictions), "--json"]) == 0
    everything = json.loads(capsys.readouterr().out)  # every question of the file, those not predicted scored 0
    assert everything["unanswered"] == everything["questions"] - 4 > 0
    (tmp_path / "other.json").write_text(json.dumps({"not-a-question-here": "x"}))
    assert main(["evaluate-rc", "--data", str(squad_file), "--score", str(tmp_path / "other.json")]) == 2
    assert "none of its predictions is for a question of" in capsys.readouterr().err  # not EM 0 and exit 0
    both = ["evaluate-rc", "--data", str(squad_file), "--score", str(predictions), "--model", str(reader_dir)]
    assert main(both) == 2
    assert "--score scores a prediction file and runs no reader: leave out --model" in capsys.readouterr().err
    # A predictions file that cannot be written no longer takes the scores with it (longrun45 F9).
    from dilstore.runners import cmd_evaluate_rc

    def full(path: Path, text: str, **_: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(cmd_evaluate_rc, "atomic_write_text", full)
        assert main([*text_run, "--no-progress", "--json", "--predictions", str(tmp_path / "p.json")]) == 2
    out, err = capsys.readouterr()
    kept = tmp_path / ".p.json.dilstore-partial"  # (left56b F3) it named the file alone, not that the answers are kept
    assert json.loads(out)["questions"] == 2 and err == (
        f"dilstore evaluate-rc: error: cannot write {tmp_path / 'p.json'}: No space left on device; the answers of all "
        f"2 questions are kept in {kept}: run the same command again once {tmp_path / 'p.json'} can be written, and it "
        "writes the file from them at once\n")  # fmt: skip
    assert main([*text_run, "--no-progress", "--json", "--predictions", str(tmp_path / "p.json")]) == 0
    assert (tmp_path / "p.json").is_file() and not kept.exists()


@pytest.mark.shared_data
def test_cli_scores_the_leaderboard_predictions_as_the_official_script(shared_data: Path, capsys) -> None:
    squad = shared_data / "squad"
    assert main(["evaluate-rc", "--data", str(squad / "dev-v1.1.json"), "--score",
                 str(squad / "predictions.bert-ensemble.dev-v1.1.json")]) == 0  # fmt: skip
    assert "questions 10570  EM 86.206  F1 92.196  (unanswered 0" in capsys.readouterr().out


def test_cli_without_model_and_without_default_says_so(
    squad_file: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr("dilstore.reader.packaged.shipped.packaged_models_dir", lambda: tmp_path)
    assert main(["evaluate-rc", "--data", str(squad_file), "--json"]) == 2
    assert "default reader checkpoint is missing" in capsys.readouterr().err


def test_cli_reports_a_broken_data_file(tiny_base: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    reader_dir = DilBertReader.from_pretrained(tiny_base, layers=1).save_pretrained(tmp_path / "reader")
    broken = tmp_path / "broken.json"
    broken.write_text('{"data": [')
    assert main(["evaluate-rc", "--model", str(reader_dir), "--data", str(broken)]) == 2
    assert f"{broken}: not valid JSON" in capsys.readouterr().err


@pytest.mark.shared_data
def test_real_squad_dev_subset(tiny_base: Path, shared_data: Path, tmp_path: Path, capsys) -> None:
    """The real dev file loads and a seeded subset is scored end to end (random weights: score not asserted)."""
    reader_dir = DilBertReader.from_pretrained(tiny_base, layers=1).save_pretrained(tmp_path / "reader")
    dev = shared_data / "squad" / "dev-v1.1.json"
    assert main(["evaluate-rc", "--model", str(reader_dir), "--data", str(dev), "--limit", "5", "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["questions"] == 5 and printed["k"] == 1


def test_a_stopped_evaluate_rc_keeps_its_answers_and_the_same_command_goes_on_from_them(
    tiny_base: Path, squad_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """A stop at 90% of a full dev run (10-20 minutes here) kept nothing (longrun45 F1). Parts of 2 questions: the
    run stopped in its third part goes on from the two kept, and gives the answers and scores an unstopped run does.
    The reading's clock moves only while a part is read, 0.4 s a part, so its seconds are exact."""
    from dilstore.reader.evaluation import reading_comprehension
    from dilstore.runners import cmd_evaluate_rc

    reader_dir = DilBertReader.from_pretrained(tiny_base, layers=1).save_pretrained(tmp_path / "reader")
    monkeypatch.setattr(cmd_evaluate_rc, "PART_QUESTIONS", 2)
    real, calls, clock = reading_comprehension.predict_answers, [], [0.0]

    def counted(*args: object, **kwargs: object) -> dict[str, str]:
        calls.append(1)
        if len(calls) == stop_at:
            raise KeyboardInterrupt
        clock[0] += 0.4  # a part's reading is the whole of the run's time
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(reading_comprehension, "predict_answers", counted)
    monkeypatch.setattr(reading_comprehension, "time", SimpleNamespace(perf_counter=lambda: clock[0]))

    def evaluate(predictions: Path) -> tuple[int, str, str]:
        status = main(["evaluate-rc", "--model", str(reader_dir), "--data", str(squad_file), "--limit", "6", "--json",
                       "--max-seq-length", "48", "--doc-stride", "16", "--max-question-length", "24",
                       "--predictions", str(predictions)])  # fmt: skip
        out, err = capsys.readouterr()
        return status, out, err

    stop_at = 0
    status, whole, err = evaluate(tmp_path / "whole.json")
    assert status == 0 and calls == [1, 1, 1], err
    assert json.loads(whole)["seconds"] == 1.2  # its own time, each part once: 2.4 when each was counted twice
    stop_at, calls[:] = 3, []
    status, _, err = evaluate(tmp_path / "stopped.json")
    journal = tmp_path / ".stopped.json.dilstore-partial"
    assert status == 130 and not (tmp_path / "stopped.json").exists()
    assert err == (f"dilstore evaluate-rc: interrupted; the answers of 4 questions are kept in {journal}: run the same "
                   "command again to go on from them\n")  # fmt: skip
    stop_at, calls[:] = 0, []
    status, resumed, err = evaluate(tmp_path / "stopped.json")
    assert status == 0 and calls == [1] and not journal.exists(), err
    assert (tmp_path / "stopped.json").read_text() == (tmp_path / "whole.json").read_text()
    assert {key: json.loads(resumed)[key] for key in ("questions", "em", "f1", "seconds")} == {
        key: json.loads(whole)[key] for key in ("questions", "em", "f1", "seconds")}  # 0.8 s kept + 0.4 s read
    # (tail61b F5) --json said nothing of the questions taken from the journal, as evaluate-qa's and rerank's do
    assert (json.loads(resumed)["resumed_questions"], json.loads(whole)["resumed_questions"]) == (4, 0)
    stop_at, calls[:] = 3, []
    evaluate(tmp_path / "edited.json")
    edited = tmp_path / ".edited.json.dilstore-partial"
    header, first, second = edited.read_text().splitlines()
    edited.write_text("\n".join([header, first, json.dumps({"part": 1, "record": {"seconds": 1.0}})]) + "\n")
    stop_at, calls[:] = 0, []
    status, out, err = evaluate(tmp_path / "edited.json")  # a KeyError traceback (qa48 L1): the part is read again
    assert status == 0 and calls == [1, 1] and json.loads(out)["resumed_questions"] == 2, err
    assert (tmp_path / "edited.json").read_text() == (tmp_path / "whole.json").read_text()
    stop_at, calls[:] = 3, []
    evaluate(tmp_path / "gap.json")
    gap = tmp_path / ".gap.json.dilstore-partial"
    header, first, second = gap.read_text().splitlines()
    gap.write_text("\n".join([header, first, json.dumps({**json.loads(second), "part": 2})]) + "\n")
    stop_at, calls[:] = 0, []
    status, out, err = evaluate(tmp_path / "gap.json")  # part 1 missing: part 2 after it is not trusted either
    assert status == 0 and calls == [1, 1] and json.loads(out)["resumed_questions"] == 2, err
    assert (tmp_path / "gap.json").read_text() == (tmp_path / "whole.json").read_text()


def test_a_stopped_evaluate_rc_does_not_go_on_from_the_answers_of_other_weights_saved_in_the_same_folder(
    tiny_base: Path, squad_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """The same command, the same k, but a reader retrained into the same --model folder: every part is read again,
    and the answers are the new reader's alone, as a fresh run of it gives."""
    from dilstore.reader.evaluation import reading_comprehension
    from dilstore.runners import cmd_evaluate_rc

    reader_dir = DilBertReader.from_pretrained(tiny_base, layers=1).save_pretrained(tmp_path / "reader")
    monkeypatch.setattr(cmd_evaluate_rc, "PART_QUESTIONS", 2)
    real, calls = reading_comprehension.predict_answers, []

    def counted(*args: object, **kwargs: object) -> dict[str, str]:
        calls.append(1)
        if len(calls) == stop_at:
            raise KeyboardInterrupt
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(reading_comprehension, "predict_answers", counted)

    def evaluate(predictions: Path) -> int:
        return main(["evaluate-rc", "--model", str(reader_dir), "--data", str(squad_file), "--limit", "6", "--json",
                     "--max-seq-length", "48", "--doc-stride", "16", "--max-question-length", "24",
                     "--predictions", str(predictions)])  # fmt: skip

    stop_at = 3
    assert evaluate(tmp_path / "stopped.json") == 130 and (tmp_path / ".stopped.json.dilstore-partial").exists()
    retrained = DilBertReader.from_pretrained(reader_dir)
    torch.manual_seed(0)
    with torch.no_grad():
        for parameter in retrained.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.5)
    retrained.save_pretrained(reader_dir)
    stop_at, calls[:] = 0, []
    assert evaluate(tmp_path / "stopped.json") == 0, capsys.readouterr().err
    assert calls == [1, 1, 1]
    assert evaluate(tmp_path / "fresh.json") == 0
    assert json.loads((tmp_path / "stopped.json").read_text()) == json.loads((tmp_path / "fresh.json").read_text())


def test_a_pipe_is_refused_as_the_file_is_read_again_for_its_checksum(tmp_path: Path) -> None:
    """The second read of a pipe found nothing: the result's data_sha256 was that of zero bytes (qa48 H1)."""
    with empty_pipe(tmp_path / "piped.json") as fifo, pytest.raises(
        DilstoreError, match=f"^{re.escape(str(fifo))}: not a regular file \\(a folder, or a pipe, which can be read"
    ):
        evaluate_file(None, fifo)  # type: ignore[arg-type]  # refused before the reader is used


def test_scoring_names_the_data_file_of_a_question_without_answers_or_of_none(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--score said "question 'q2': a question needs at least one reference answer" and "the dataset holds no
    questions" without naming the file, where reading named it (qa48 L2)."""
    predictions = tmp_path / "p.json"
    predictions.write_text('{"q1": "x"}', encoding="utf-8")
    context = "Tram lines opened in 1882."
    qas = [{"id": "q1", "question": "When?", "answers": [{"text": "1882", "answer_start": 21}]},
           {"id": "q2", "question": "Who?", "answers": []}]  # fmt: skip
    for name, paragraphs, message in (("answerless.json", [{"context": context, "qas": qas}],
                                       "question 'q2' has no reference answer to score against (1 such)"),
                                      ("empty.json", [{"context": context, "qas": []}],
                                       "no questions to evaluate (every paragraph's qas is empty)")):  # fmt: skip
        data = tmp_path / name
        data.write_text(json.dumps({"version": "1.1", "data": [{"title": "T", "paragraphs": paragraphs}]}))
        assert main(["evaluate-rc", "--data", str(data), "--score", str(predictions)]) == 2
        assert capsys.readouterr().err == f"dilstore evaluate-rc: error: {data}: {message}\n"


def test_scoring_reads_answer_texts_only_as_the_official_script_does(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A converted SQuAD-style file with a missing or missed answer_start was refused by --score, which the official
    script scores from ids and answer texts alone (qa48 L4); reading it still checks the offsets."""
    qas = [{"id": "q1", "question": "When?", "answers": [{"text": "1882"}]},
           {"id": "q2", "question": "Which?", "answers": [{"text": "Tram lines", "answer_start": 3}]}]  # fmt: skip
    data = tmp_path / "converted.json"
    data.write_text(json.dumps({"data": [{"paragraphs": [{"context": "Tram lines opened in 1882.", "qas": qas}]}]}))
    predictions = tmp_path / "p.json"
    predictions.write_text('{"q1": "1882", "q2": "tram lines"}', encoding="utf-8")
    assert main(["evaluate-rc", "--data", str(data), "--score", str(predictions), "--json"]) == 0
    scored = json.loads(capsys.readouterr().out)
    assert (scored["questions"], scored["em"], scored["f1"]) == (2, 100.0, 100.0)
    with pytest.raises(DilstoreError, match=r"qas\[0\] \(id 'q1'\)\.answers\[0\] has no 'answer_start' key"):
        load_squad(data)
