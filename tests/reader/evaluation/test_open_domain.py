"""evaluate-qa's logic over a tiny store with a stub searcher (no JVM): question files, EM/F1 for both μ, R."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path
from types import SimpleNamespace

import pytest
from hypothesis import example, given
from hypothesis import strategies as st
from pyserini.eval.evaluate_dpr_retrieval import SimpleTokenizer, has_answers

from dilstore.reader.evaluation import squad_metric
from dilstore.reader.evaluation.open_domain import (
    QAEvaluation,
    QAQuestion,
    answer_in_text,
    evaluate_questions,
    evaluate_top_ps,
    merged_evaluation,
    recall_tokens,
    write_predictions,
)
from dilstore.reader.evaluation.questions import load_questions
from dilstore.reader.evaluation.squad_metric import exact_match, f1, metric_max_over_ground_truths
from dilstore.reader.modeling.dilbert import DilBertReader
from dilstore.reader.retrieval import Hit
from dilstore.reader.serving.answers import Timings, aggregate
from dilstore.reader.serving.odqa import OdqaSettings, OpenDomainReader
from dilstore.storage.errors import DilstoreError
from dilstore.storage.reader import open_store
from tests.fixtures.odqa_fixtures import write_reader_checkpoint, write_store
from tests.fixtures.qa_training_fixtures import write_squad


class QueryKeyedSearcher:
    """Hits chosen by a word of the query, with BM25-like scores; every other query gets `default`."""

    def __init__(self, routes: dict[str, list[Hit]], default: list[Hit]) -> None:
        self.routes, self.default = routes, default

    def search(self, query: str, k: int) -> list[Hit]:
        for word, hits in self.routes.items():
            if word in query:
                return hits[:k]
        return self.default[:k]


@pytest.fixture(scope="module")
def odqa(tmp_path_factory: pytest.TempPathFactory) -> OpenDomainReader:
    root = tmp_path_factory.mktemp("odqa-eval")
    model_dir = write_reader_checkpoint(root / "model")
    write_store(root / "store", model_dir)
    searcher = QueryKeyedSearcher(
        {"tram": [Hit("tram#0", 9.0), Hit("curie#0", 1.0)], "Curie": [Hit("cafe#0", 3.0), Hit("kili#0", 2.5)]},
        default=[Hit("kili#0", 4.0)],
    )
    model = DilBertReader.from_pretrained(model_dir)
    return OpenDomainReader(model, open_store(root / "store"), searcher, OdqaSettings())


QUESTIONS = [
    QAQuestion("q1", "When did the tram network open?", ("1882",)),  # retrieved passages hold the answer
    QAQuestion("q2", "When did Curie win the prize?", ("1911",)),  # retrieved passages do not
    QAQuestion("q3", "How high is the mountain?", ("5,895 metres", "5895 metres")),  # recalled by its first answer
]


def test_the_summary_names_the_online_layers_the_reader_used(
    odqa: OpenDomainReader, monkeypatch: pytest.MonkeyPatch
) -> None:
    """It is `evaluate-qa --json`'s document; from Python it lacked `online_variant` (readme37 L5), and nothing
    said which encoding the scores were read from (lowbit39 L1)."""
    summary = evaluate_questions(odqa, QUESTIONS[:1], top_p=1, mu=0.5).summary()
    assert summary["online_variant"] is None and summary["encoding"] == odqa.store.fingerprint.encoding != ""
    monkeypatch.setattr(odqa.model, "online_variant", "online-2bit.safetensors")
    assert evaluate_questions(odqa, QUESTIONS[:1], top_p=1, mu=0.5).summary()["online_variant"] == (
        "online-2bit.safetensors"
    )


def test_scores_both_mu_from_one_pass_and_match_the_official_metric(odqa: OpenDomainReader) -> None:
    evaluation = evaluate_questions(odqa, QUESTIONS, top_p=2, mu=0.5, question_batch=2)
    assert sorted(evaluation.scores) == [0.5, 1.0]
    assert evaluation.recall == pytest.approx(100 * 2 / 3)
    for mu, (em, f1_) in evaluation.scores.items():
        expected_em = expected_f1 = 0.0
        for question in QUESTIONS:
            reading = odqa.retrieve_and_read([question.question], 2)[0]
            prediction = aggregate(reading, mu, 1).text
            assert evaluation.predictions[question.id][str(mu)] == prediction
            expected_em += metric_max_over_ground_truths(exact_match, prediction, question.answers)
            expected_f1 += metric_max_over_ground_truths(f1, prediction, question.answers)
        assert em == pytest.approx(100 * expected_em / 3)
        assert f1_ == pytest.approx(100 * expected_f1 / 3)
    summary = evaluation.summary()
    assert {"questions", "em", "f1", "recall", "top_p", "mu", "seconds"} <= set(summary)
    # The random reader's answers match none of QUESTIONS' (both totals are 0), so the loop above could not tell
    # EM from F1: gold answers built from its own predictions give an exact match, a partial one and a miss,
    # scored against the official script's totals (squad_metric.evaluate, checked on the leaderboard's file).
    first = evaluation.predictions
    golds = {"q1": (first["q1"]["0.5"],), "q2": (first["q2"]["0.5"] + " and more words",), "q3": QUESTIONS[2].answers}
    graded = [QAQuestion(q.id, q.question, golds[q.id]) for q in QUESTIONS]
    regraded = evaluate_questions(odqa, graded, top_p=2, mu=0.5, question_batch=2)
    context = " ".join(answer for answers in golds.values() for answer in answers)
    qas = [{"id": q.id, "question": q.question,
            "answers": [{"text": a, "answer_start": context.index(a)} for a in q.answers]} for q in graded]
    dataset = {"data": [{"title": "t", "paragraphs": [{"context": context, "qas": qas}]}]}  # fmt: skip
    for mu, (em, f1_) in regraded.scores.items():
        official = squad_metric.evaluate(dataset, {qid: row[str(mu)] for qid, row in regraded.predictions.items()})
        assert (em, f1_) == (pytest.approx(official["exact_match"]), pytest.approx(official["f1"]))
    em, f1_ = regraded.scores[0.5]
    assert em == pytest.approx(100 / 3) and 100 / 3 < f1_ < 200 / 3
    assert (summary["questions"], summary["top_p"], summary["mu"]) == (3, 2, 0.5)
    assert [row["mu"] for row in summary["by_mu"]] == [1.0, 0.5]
    json.dumps(summary)


def test_recall_depends_on_top_p(odqa: OpenDomainReader) -> None:
    only_first = [QAQuestion("q", "Which tram?", ("Chemistry",))]  # in curie#0, the tram query's 2nd hit
    assert evaluate_questions(odqa, only_first, top_p=1, mu=0.5).recall == 0.0
    assert evaluate_questions(odqa, only_first, top_p=2, mu=0.5).recall == 100.0


def test_several_top_p_from_one_reading_equal_separate_runs(odqa: OpenDomainReader) -> None:
    together = evaluate_top_ps(odqa, QUESTIONS, top_ps=[1, 2], mu=0.5)
    for top_p in (1, 2):
        alone = evaluate_questions(odqa, QUESTIONS, top_p=top_p, mu=0.5)
        assert together[top_p].predictions == alone.predictions
        assert together[top_p].recall == alone.recall
        for mu, scores in alone.scores.items():
            assert together[top_p].scores[mu] == pytest.approx(scores)


def test_a_refused_question_scores_zero_and_is_counted(odqa: OpenDomainReader) -> None:
    questions = [QUESTIONS[0], QAQuestion("long", "tram " * 500, ("1882",)), QAQuestion("zw", "\u200b", ("x",))]
    evaluation = evaluate_questions(odqa, questions, top_p=2, mu=0.5)
    assert evaluation.refused == 2
    assert evaluation.predictions["long"] == evaluation.predictions["zw"] == {"1.0": "", "0.5": ""}
    assert evaluation.recall == pytest.approx(100 / 3)
    assert list(evaluation.predictions) == [question.id for question in questions]  # refused ones came first (odqa43)
    dotted = [QAQuestion("dot", "\u200b", (".",)), *questions[1:]]  # "." normalises to the refused one's ""
    alone = evaluate_questions(odqa, dotted, top_p=2, mu=0.5)
    parts = [QAEvaluation.from_record(json.loads(json.dumps(evaluate_questions(odqa, [question], top_p=2,
                                                                                mu=0.5).to_record())))
             for question in dotted]  # as a resumed run reads its kept parts  # fmt: skip
    merged = merged_evaluation(parts, dotted)
    assert alone.scores == merged.scores == {1.0: (0.0, 0.0), 0.5: (0.0, 0.0)}, "merged scored '.' EM 100 (B5)"
    assert merged.refused == 3 and alone.refused_ids == merged.refused_ids == ["dot", "long", "zw"]


@given(counts=st.lists(st.integers(1, 300).flatmap(lambda n: st.tuples(st.just(n), st.integers(0, n))),
                       min_size=1, max_size=4))  # fmt: skip
@example(counts=[(19, 5)])  # int(100 * 5 / 19 * 19 / 100) is 4
def test_recall_merged_from_kept_parts_is_the_recalled_count_over_all_questions(counts: list[tuple[int, int]]) -> None:
    """R of parts kept as records (percentages) equals R of one run over their questions: recalled / questions."""
    questions, parts = [], []
    for part, (asked, recalled) in enumerate(counts):
        these = [QAQuestion(f"p{part}q{index}", "Who?", ("x",)) for index in range(asked)]
        evaluation = QAEvaluation(questions=asked, top_p=1, mu=0.5, scores={0.5: (0.0, 0.0)},
                                  recall=100.0 * recalled / asked, refused=0, seconds=0.0, timings=Timings(),
                                  predictions={question.id: {"0.5": ""} for question in these})  # fmt: skip
        parts.append(QAEvaluation.from_record(json.loads(json.dumps(evaluation.to_record()))))
        questions += these
    merged = merged_evaluation(parts, questions)
    assert merged.recall == 100.0 * sum(recalled for _, recalled in counts) / len(questions)


def test_a_question_file_without_questions_is_named(tmp_path: Path) -> None:
    """An empty file was refused as "there are no questions to evaluate" after the model and the JVM had loaded,
    the file not named (odqa43 L1)."""
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    squad = tmp_path / "squad.json"
    squad.write_text(json.dumps({"version": "1.1", "data": []}))
    for path in (empty, squad):
        with pytest.raises(DilstoreError, match=rf"^{path}: holds no questions$"):
            load_questions(path)


def test_jsonl_questions_in_a_json_file_are_named_as_such(tmp_path: Path) -> None:
    """The format goes by the suffix: a DPR JSONL file named .json got a bare "Extra data" (odqa43 L3)."""
    lines = [{"question": "When did the tram open?", "answer": ["1882"]}, {"question": "Who?", "answer": ["Curie"]}]
    path = tmp_path / "questions.json"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    with pytest.raises(DilstoreError, match=r"Extra data\); its first line is one question object, as in DPR-style "
                                            r"JSONL: name the file \.jsonl to read it as such$"):  # fmt: skip
        load_questions(path)
    path.write_text("{not json")  # no question object: the parser's error alone
    with pytest.raises(DilstoreError, match=r"not valid JSON \(line 1, column 2: [^)]*\)$"):
        load_questions(path)


def test_a_json_file_that_opens_with_an_object_of_no_question_gets_no_jsonl_hint(tmp_path: Path) -> None:
    """(mut61 M3) The DPR hint was seen only for an object with a "question": a one-line SQuAD document without its
    "data" could be told to rename itself .jsonl, as if it held question lines."""
    path = tmp_path / "squad.json"
    path.write_text(json.dumps({"version": "1.1", "dataset": []}) + "\n")
    with pytest.raises(DilstoreError) as refused:
        load_questions(path)
    assert "'data'" in str(refused.value) and "DPR-style" not in str(refused.value)


def test_a_question_file_nested_past_the_stack_is_named_not_a_traceback(tmp_path: Path) -> None:
    """A .json question file nested ~100,000 deep is refused in load_squad's one line; the look at its first line
    for a DPR question object then met the same RecursionError and ended `evaluate-qa` in a traceback (complex61,
    handed over)."""
    path = tmp_path / "questions.json"
    path.write_text('{"question": ' + "[" * 100_000 + "]" * 100_000 + "}\n")
    with pytest.raises(DilstoreError, match=r"nested too deep to read"):
        load_questions(path)


def test_jsonl_questions_through_a_pipe_say_why_they_were_read_as_squad_json(tmp_path: Path) -> None:
    """`--questions <(zcat q.jsonl.gz)` is /dev/fd/N, read as SQuAD JSON: it got only "the document has no 'data'
    key" (docs50 L3)."""
    read, write = os.pipe()
    with os.fdopen(write, "w") as writer:
        writer.write(json.dumps({"question": "When did the tram open?", "answer": ["1882"]}) + "\n")
    try:
        with pytest.raises(DilstoreError, match=r"no 'data' key; read as SQuAD JSON, as its name does not end in "
                                                r"\.jsonl: to read DPR-style JSONL from a pipe, save it to a file "
                                                r"named \.jsonl$"):  # fmt: skip
            load_questions(f"/dev/fd/{read}")
    finally:
        os.close(read)
    for path in (tmp_path / "questons-typo.json", tmp_path):  # not pipes: their own reason alone (review50 L1)
        with pytest.raises(DilstoreError) as refused:
            load_questions(path)
        assert str(refused.value).startswith(f"{path}: ") and "pipe" not in str(refused.value)


def test_reader_only_evaluation_scores_one_mu(odqa: OpenDomainReader) -> None:
    evaluation = evaluate_questions(odqa, QUESTIONS[:1], top_p=2, mu=1.0)
    assert list(evaluation.scores) == [1.0]
    assert evaluation.em == evaluation.scores[1.0][0]


TOKENIZER = SimpleTokenizer()


def recalled(answer: str, text: str) -> bool:
    return answer_in_text(recall_tokens(answer, TOKENIZER), recall_tokens(text, TOKENIZER))


@pytest.mark.parametrize(
    "answer, text, found",
    [
        ("1882", "It opened in 1882.", True),
        ("1", "It opened in 1882.", False),
        ("The Nobel Prize", "won the nobel prize in 1911", True),
        ("11", "an 11-year-old boy", True),  # SQuAD normalisation made "11year", and missed it
        ("Manning", "Manning's pass", True),
        ("Zürich", "trams of ZU\u0308RICH", True),  # NFD: a composed ü matches a decomposed one
        ("5,895 metres", "rises 5895 metres above", False),  # tokens: 5 , 895 metres
        ("60%", "about 60 of them", False),
        ("", "the tram", False),
    ],
)
def test_recall_matches_answer_tokens_as_pyserini_does(answer: str, text: str, found: bool) -> None:
    assert recalled(answer, text) is found
    assert has_answers(text, [answer], TOKENIZER) is found or not answer  # pyserini finds an empty answer anywhere


@given(
    answer=st.lists(st.sampled_from(["tram", "11", "-", "year", "'s", "The", ",", "Zürich", "."]), max_size=3),
    text=st.lists(st.sampled_from(["tram", "11", "-", "year", "'s", "the", ",", "zürich", " ", "a", "!"]), max_size=9),
)
def test_recall_agrees_with_pyserini_has_answers(answer: list[str], text: list[str]) -> None:
    answer_text, passage = "".join(answer), "".join(text)
    if recall_tokens(answer_text, TOKENIZER):
        assert recalled(answer_text, passage) is has_answers(passage, [answer_text], TOKENIZER)
    else:
        assert not recalled(answer_text, passage)


def test_loads_dpr_jsonl_and_squad_json(tmp_path) -> None:
    jsonl = tmp_path / "questions.jsonl"
    jsonl.write_text('{"question": "Who?", "answer": ["Ann", "Anne"]}\n\n{"question": "Where?", "answer": ["Bern"]}\n')
    loaded = load_questions(jsonl)
    assert [(q.question, q.answers) for q in loaded] == [("Who?", ("Ann", "Anne")), ("Where?", ("Bern",))]
    assert loaded[1].id == "questions.jsonl:3"
    upper = jsonl.rename(tmp_path / "QUESTIONS.JSONL")  # was parsed as SQuAD JSON: "Extra data"
    assert [(q.question, q.answers) for q in load_questions(upper)] == [(q.question, q.answers) for q in loaded]
    squad = load_questions(write_squad(tmp_path / "dev.json"))
    assert squad[0].id == "q-zurich-year" and squad[0].answers == ("1882",)


def test_bad_question_files_name_the_line(tmp_path) -> None:
    jsonl = tmp_path / "bad.jsonl"
    jsonl.write_text('{"question": "Who?", "answer": ["Ann"]}\n{"question": "", "answer": ["x"]}\n')
    with pytest.raises(DilstoreError, match="bad.jsonl:2"):
        load_questions(jsonl)
    with pytest.raises(DilstoreError, match="no such file"):
        load_questions(tmp_path / "absent.json")


def test_predictions_are_written_whole_or_not_at_all(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """They were written in place: a kill mid-write left a cut file under the name, an older one emptied first
    (crash38 M3). A write that fails before its end leaves the older file as it was, and no temporary."""
    import os

    path = tmp_path / "predictions.json"
    write_predictions(path, SimpleNamespace(predictions={"q1": {"0.5": "Paris"}}))
    assert json.loads(path.read_text(encoding="utf-8")) == {"q1": {"0.5": "Paris"}}

    def cut(descriptor: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", cut)
    with pytest.raises(DilstoreError, match=f"cannot write predictions to {path}: .*No space left on device"):
        write_predictions(path, SimpleNamespace(predictions={"q1": {"0.5": "Lyon"}, "q2": {"0.5": "Rome"}}))
    assert json.loads(path.read_text(encoding="utf-8")) == {"q1": {"0.5": "Paris"}}
    assert [entry.name for entry in tmp_path.iterdir()] == ["predictions.json"]
    elsewhere = tmp_path / "absent" / "p.json"  # the error named the write's temporary file (review38 L8)
    expected = f"^cannot write predictions to {elsewhere}: .*no such folder: '{elsewhere.parent}'$"
    with pytest.raises(DilstoreError, match=expected):
        write_predictions(elsewhere, SimpleNamespace(predictions={}))


def stoppable_evaluate_qa(odqa: OpenDomainReader, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> SimpleNamespace:
    """evaluate-qa, reading with `odqa`, of 7 questions (QUESTIONS, then its first two twice) in parts of 2:
    `.questions` is their file, `.calls` gets the question count of each evaluate_questions call, and the call
    numbered `.stop_at` (0: none) is stopped with a KeyboardInterrupt."""
    from dilstore.reader.evaluation import open_domain
    from dilstore.runners import cmd_evaluate_qa

    questions = tmp_path / "questions.jsonl"
    asked = [{"question": q.question, "answer": list(q.answers)} for q in QUESTIONS + QUESTIONS[:2] + QUESTIONS[:2]]
    questions.write_text("".join(json.dumps(line) + "\n" for line in asked), encoding="utf-8")
    monkeypatch.setattr(cmd_evaluate_qa, "open_odqa_reader", lambda args: odqa)
    monkeypatch.setattr(cmd_evaluate_qa, "PART_QUESTIONS", 2)
    run = SimpleNamespace(questions=questions, calls=[], stop_at=0)
    real = open_domain.evaluate_questions

    def counted(*args: object, **kwargs: object) -> object:
        run.calls.append(len(args[1]))  # type: ignore[arg-type]
        if len(run.calls) == run.stop_at:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(open_domain, "evaluate_questions", counted)  # the command imports it when it runs
    return run


def test_a_question_file_whose_name_is_not_utf8_is_evaluated_and_its_predictions_written(
    odqa: OpenDomainReader, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """(unicode56 F6) The file's name (bytes Python decodes to lone surrogates) was in the journal's settings and in
    each JSONL question's id: the journal's first part, then the predictions file, written as UTF-8, failed with
    "text that is not valid UTF-8", naming neither, after the part's questions had been read. The ids now show the
    name's bytes as escapes; a stop keeps its parts and the same command goes on from them."""
    from dilstore.runners import cli

    run = stoppable_evaluate_qa(odqa, tmp_path, monkeypatch)
    questions = run.questions.rename(tmp_path / os.fsdecode(b"q\xff.jsonl"))
    command = ["evaluate-qa", "store", "--questions", str(questions), "--question-batch", "1", "--json",
               "--predictions", str(tmp_path / "p.json"), "--top-p", "2"]  # fmt: skip
    run.stop_at = 3
    assert cli.main(command) == 130, capsys.readouterr().err
    assert "4 of 7 questions done are kept" in capsys.readouterr().err
    run.stop_at, run.calls[:] = 0, []
    assert cli.main(command) == 0, capsys.readouterr().err
    assert json.loads(capsys.readouterr().out)["resumed_questions"] == 4 and run.calls == [2, 1]
    predictions = json.loads((tmp_path / "p.json").read_text(encoding="utf-8"))
    assert list(predictions)[:2] == ["q\\xff.jsonl:1", "q\\xff.jsonl:2"]


def test_evaluate_qa_s_seed_picks_the_subset_of_that_seed(
    odqa: OpenDomainReader, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """(mut55) `evaluate-qa --limit N --seed S` reads the seeded subset of seed S (`seeded_subset`), the one
    `dilstore.evaluate_qa(limit=N, seed=S)` reads: a seed lost on the way drew seed 0's subset for every seed."""
    from dilstore.reader.evaluation import open_domain
    from dilstore.reader.evaluation.subsets import seeded_subset
    from dilstore.runners import cli

    run = stoppable_evaluate_qa(odqa, tmp_path, monkeypatch)
    counted, read = open_domain.evaluate_questions, []

    def recorded(*args: object, **kwargs: object) -> object:
        read.extend(question.id for question in args[1])  # type: ignore[attr-defined]
        return counted(*args, **kwargs)

    monkeypatch.setattr(open_domain, "evaluate_questions", recorded)
    every = load_questions(run.questions)
    for seed in (0, 3):
        read.clear()
        assert cli.main(["evaluate-qa", "store", "--questions", str(run.questions), "--limit", "3", "--seed",
                         str(seed), "--json", "--top-p", "2"]) == 0  # fmt: skip
        assert json.loads(capsys.readouterr().out)["questions"] == 3
        assert read == [question.id for question in seeded_subset(every, 3, seed)], seed
    assert seeded_subset(every, 3, 0) != seeded_subset(every, 3, 3)  # the seeds name other subsets


def test_a_stopped_evaluate_qa_keeps_its_finished_parts_and_the_same_command_goes_on_from_them(
    odqa: OpenDomainReader, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A stop at 90% of a run of hours kept nothing (longrun45 F1). Parts of 2 questions here; the run stopped in its
    third part goes on from the two kept, and ends as an unstopped run does."""
    from dilstore.reader.evaluation import open_domain
    from dilstore.runners import cli

    run = stoppable_evaluate_qa(odqa, tmp_path, monkeypatch)
    questions, calls = run.questions, run.calls

    def evaluate(predictions: Path, *extra: str) -> tuple[int, str, str]:
        status = cli.main(["evaluate-qa", "store", "--questions", str(questions), "--question-batch", "1", "--json",
                           "--predictions", str(predictions), "--top-p", "2", *extra])  # fmt: skip
        out, err = capsys.readouterr()
        return status, out, err

    run.stop_at = 0
    status, whole, _ = evaluate(tmp_path / "whole.json")
    assert status == 0 and calls == [2, 2, 2, 1] and not list(tmp_path.glob(".*partial"))
    run.stop_at, calls[:] = 3, []
    status, _, err = evaluate(tmp_path / "stopped.json")
    journal = tmp_path / ".stopped.json.dilstore-partial"
    assert status == 130 and not (tmp_path / "stopped.json").exists()
    assert err == (f"dilstore evaluate-qa: interrupted; 4 of 7 questions done are kept in {journal}: run the same "
                   "command again to go on from them\n")  # fmt: skip
    kept = journal.read_bytes()
    calls[:] = []  # without --predictions nothing is kept, and the stop says how to keep it
    assert cli.main(["evaluate-qa", "store", "--questions", str(questions), "--question-batch", "1", "--json",
                     "--top-p", "2"]) == 130  # fmt: skip
    assert capsys.readouterr().err == ("dilstore evaluate-qa: interrupted; the 4 of 7 questions done are not kept "
                                       "(with --predictions FILE they are, and the same command goes on from them)\n")
    run.stop_at, calls[:] = 1, []  # a run of other settings, stopped before its first part: the kept parts stay
    assert evaluate(tmp_path / "stopped.json", "--limit", "5")[0] == 130 and journal.read_bytes() == kept
    run.stop_at, calls[:] = 0, []
    status, resumed, _ = evaluate(tmp_path / "stopped.json")
    assert status == 0 and calls == [2, 1] and not journal.exists()
    assert json.loads(resumed)["resumed_questions"] == 4 and json.loads(whole)["resumed_questions"] == 0
    for key in ("questions", "em", "f1", "recall", "refused", "by_mu"):  # exactly: scored again in order (review45 L2)
        assert json.loads(resumed)[key] == json.loads(whole)[key], key
    assert (tmp_path / "stopped.json").read_text(encoding="utf-8") == (tmp_path / "whole.json").read_text("utf-8")
    run.stop_at, calls[:] = 2, []
    assert evaluate(tmp_path / "other.json")[0] == 130
    lines = journal.with_name(".other.json.dilstore-partial").read_text(encoding="utf-8").splitlines()
    journal.with_name(".other.json.dilstore-partial").write_text(lines[0] + "\n" + lines[1][:40], encoding="utf-8")
    run.stop_at, calls[:] = 0, []
    assert json.loads(evaluate(tmp_path / "other.json")[1])["resumed_questions"] == 0  # a cut line is not taken
    assert calls == [2, 2, 2, 1]
    run.stop_at, calls[:] = 2, []
    assert evaluate(tmp_path / "mu.json")[0] == 130
    run.stop_at, calls[:] = 0, []
    status, out, err = evaluate(tmp_path / "mu.json", "--limit", "6")
    assert status == 0, err
    assert (json.loads(out)["resumed_questions"], json.loads(out)["questions"]) == (0, 6)  # other settings
    from dilstore.storage.write_lock import write_lock

    with write_lock(tmp_path / "busy.json", doing="written"):  # another run writing the same output (review45 H1)
        status, _, err = evaluate(tmp_path / "busy.json")
    assert status == 2 and f"{tmp_path / 'busy.json'} is being written by pid" in err
    assert not list(tmp_path.glob(".busy.json.dilstore-partial"))

    def unwritable(path: Path, text: str, **_: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    full = tmp_path / "full.json"
    with monkeypatch.context() as patch:
        patch.setattr(open_domain, "atomic_write_text", unwritable)
        status, out, err = evaluate(full)  # the scores come first, and the journal stays (longrun45 F9)
    assert status == 2 and json.loads(out)["questions"] == 7
    kept = journal.with_name(".full.json.dilstore-partial")
    # (left56b F3) The line named the file alone, not that the answers were kept and the same command writes it.
    assert err == (f"dilstore evaluate-qa: error: cannot write predictions to {full}: [Errno 28] No space left on "
                   f"device: '{full}'; the answers of all 7 questions are kept in {kept}: run the same command again "
                   f"once {full} can be written, and it writes the file from them at once\n")  # fmt: skip
    calls[:] = []
    status, out, err = evaluate(full)
    assert status == 0 and json.loads(out)["resumed_questions"] == 7 and calls == [], err
    assert full.read_text(encoding="utf-8") == (tmp_path / "whole.json").read_text("utf-8") and not kept.exists()


def test_a_stopped_evaluate_qa_does_not_go_on_from_parts_read_before_the_store_changed(
    odqa: OpenDomainReader, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The same command after an append to the store (another generation in its appends): the parts kept were read
    from the store as it was, so every part is read again and none is taken."""
    import dataclasses

    from dilstore.runners import cli

    run = stoppable_evaluate_qa(odqa, tmp_path, monkeypatch)
    questions, calls = run.questions, run.calls
    command = ["evaluate-qa", "store", "--questions", str(questions), "--question-batch", "1", "--json",
               "--predictions", str(tmp_path / "stopped.json"), "--top-p", "2"]  # fmt: skip
    run.stop_at = 3
    assert cli.main(command) == 130 and (tmp_path / ".stopped.json.dilstore-partial").exists()
    manifest = odqa.store.manifest
    appended = dataclasses.replace(manifest, appends=(*manifest.appends, {"generation": "0123456789abcdef"}))
    monkeypatch.setattr(odqa.store, "manifest", appended)
    run.stop_at, calls[:] = 0, []
    capsys.readouterr()
    status = cli.main(command)
    out, err = capsys.readouterr()
    assert status == 0, err
    assert json.loads(out)["resumed_questions"] == 0 and calls == [2, 2, 2, 1]


def test_an_evaluate_qa_ended_by_a_failed_read_says_which_questions_it_kept(
    odqa: OpenDomainReader, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A store at a URL whose server went away mid-run ended it with "...; try again", not a word of the questions
    kept for the same command to go on from, as a stop by a signal says (multi53 F6)."""
    from dilstore.reader.evaluation import open_domain
    from dilstore.runners import cli
    from dilstore.storage.format import StoreReadError

    run = stoppable_evaluate_qa(odqa, tmp_path, monkeypatch)
    counted = open_domain.evaluate_questions

    def failing(*args: object, **kwargs: object) -> object:
        if len(run.calls) == 2:
            raise StoreReadError("reading http://h/s/shards/x failed: reset; try again")
        return counted(*args, **kwargs)

    monkeypatch.setattr(open_domain, "evaluate_questions", failing)
    predictions = tmp_path / "p.json"
    status = cli.main(["evaluate-qa", "store", "--questions", str(run.questions), "--question-batch", "1", "--json",
                       "--predictions", str(predictions), "--top-p", "2"])  # fmt: skip
    journal = tmp_path / ".p.json.dilstore-partial"
    assert status == 2 and journal.exists()
    assert capsys.readouterr().err == (
        "dilstore evaluate-qa: error: reading http://h/s/shards/x failed: reset; try again; 4 of 7 questions done "
        f"are kept in {journal}: run the same command again to go on from them\n"
    )


def test_an_evaluate_qa_ended_by_a_compaction_goes_on_from_its_parts_over_the_compacted_store(
    odqa: OpenDomainReader, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """(conc54 F4) `dilstore compact` under a running evaluate-qa --predictions ended it with "open it again", not a
    word of the questions kept, and the same command then read every question anew: the journal named the old
    build, though the compacted store serves the same states. It now says what is kept and goes on from it."""
    import shutil

    import dilstore
    from dilstore.reader.evaluation import open_domain
    from dilstore.runners import cli, cmd_evaluate_qa

    local = shutil.copytree(odqa.store.url, tmp_path / "store")
    # A build of its own: the store was written by hand, with none.
    assert not dilstore.compact(local, shards=2, no_progress=True)["already_compact"]
    reader = OpenDomainReader(odqa.model, open_store(local), odqa.searcher, OdqaSettings())
    reader.store.check_files = True  # as the command opens it
    run = stoppable_evaluate_qa(reader, tmp_path, monkeypatch)
    counted = open_domain.evaluate_questions

    def compacted_in_the_third(*args: object, **kwargs: object) -> object:
        if len(run.calls) == 2:
            assert not dilstore.compact(local, shards=1, no_progress=True)["already_compact"]
        return counted(*args, **kwargs)

    monkeypatch.setattr(open_domain, "evaluate_questions", compacted_in_the_third)
    command = ["evaluate-qa", str(local), "--questions", str(run.questions), "--question-batch", "1", "--json",
               "--predictions", str(tmp_path / "p.json"), "--top-p", "2"]  # fmt: skip
    capsys.readouterr()
    assert cli.main(command) == 2
    journal = tmp_path / ".p.json.dilstore-partial"
    assert capsys.readouterr().err.endswith(
        f"; the store was compacted, which serves the same passages: 4 of 7 questions done are kept in {journal}: run "
        "the same command again to go on from them\n")  # fmt: skip
    compacted = OpenDomainReader(odqa.model, open_store(local), odqa.searcher, OdqaSettings())
    monkeypatch.setattr(cmd_evaluate_qa, "open_odqa_reader", lambda args: compacted)
    run.calls[:] = []
    assert cli.main(command) == 0
    assert json.loads(capsys.readouterr().out)["resumed_questions"] == 4 and run.calls == [2, 1]
