"""The official SQuAD v1.1 metric, and the SQuAD / DPR / prediction file loaders with their error messages."""

from __future__ import annotations

import json
import re
import string
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dilstore.reader.data.squad import load_open_questions, load_predictions, load_squad, parse_squad
from dilstore.reader.evaluation.squad_metric import (
    evaluate,
    evaluate_examples,
    exact_match,
    f1,
    metric_max_over_ground_truths,
    normalize_answer,
)
from dilstore.reader.text.files import read_json
from dilstore.storage.errors import DilstoreError

WORDS = st.sampled_from(["cat", "Dog", "sat", "mat", "1911", "Zürich", "on", "the", "a", "an", "x", "thea"])
ANSWERS = st.lists(WORDS, max_size=8).map(" ".join)
NON_ARTICLE_WORDS = st.text(st.sampled_from(string.ascii_lowercase), min_size=1, max_size=8).filter(
    lambda word: word not in {"a", "an", "the"}
)
CONTENT_ANSWERS = st.lists(WORDS.filter(lambda w: w.lower() not in {"the", "a", "an"}), min_size=1, max_size=8).map(
    " ".join
)


@pytest.mark.shared_data
def test_bert_ensemble_predictions_score_the_published_numbers(shared_data: Path) -> None:
    """The leaderboard's BERT-ensemble dev predictions give EM 86.206 and F1 92.196 with the official script."""
    dataset = read_json(shared_data / "squad" / "dev-v1.1.json")
    predictions = load_predictions(shared_data / "squad" / "predictions.bert-ensemble.dev-v1.1.json")
    result = evaluate(dataset, predictions)
    assert round(result["exact_match"], 3) == 86.206
    assert round(result["f1"], 3) == 92.196
    assert result["questions"] == 10570 and result["unanswered"] == 0


@pytest.mark.parametrize(
    ("text", "normalised"),
    [
        ("The Cat!", "cat"),
        ("  an   apple,  a pear ", "apple pear"),
        ("Theatre", "theatre"),  # articles only as whole words
        ("Santa Clara", "santa clara"),  # ... at the end of a word too
        ("Megan", "megan"),
        ("bathe", "bathe"),
        ("the-end", "theend"),  # punctuation goes before articles are looked for
        ("Denver Broncos.", "denver broncos"),
        ("«Zürich»", "«zürich»"),  # only ASCII punctuation is removed, as in the official script
    ],
)
def test_normalize_answer(text: str, normalised: str) -> None:
    assert normalize_answer(text) == normalised


def test_an_answer_spelled_decomposed_matches_its_composed_reference() -> None:
    """(unicode56 F3) A reader's answer is the passage's own characters: from a corpus that writes `Zu\u0308rich`
    (u and a combining diaeresis) the right answer scored EM 0 and F1 0 against a question file's `Zürich`."""
    assert exact_match("Zu\u0308rich", "Zürich") == 1.0
    assert f1("the Zu\u0308rich tram", "Zürich tram") == 1.0
    assert exact_match("Zurich", "Zürich") == 0.0  # a missing accent is another answer, as in the official script


def test_a_word_that_ends_in_an_article_keeps_it() -> None:
    """The official article pattern is \\b(a|an|the)\\b: "Santa" and "Sant" are different answers."""
    assert exact_match("Santa", "Sant") == 0.0
    assert f1("Megan", "Meg") == 0.0
    assert exact_match("bathe", "ba") == 0.0


@given(words=st.lists(NON_ARTICLE_WORDS, min_size=1, max_size=4))
def test_lowercase_words_that_are_not_articles_are_left_as_they_are(words: list[str]) -> None:
    assert normalize_answer(" ".join(words)) == " ".join(words)


def test_f1_counts_shared_tokens_with_multiplicity() -> None:
    assert f1("cat sat", "the cat sat on the mat") == pytest.approx(2 * 1.0 * 0.5 / 1.5)
    assert f1("cat cat cat", "cat") == pytest.approx(2 * (1 / 3) * 1 / (1 / 3 + 1))
    assert f1("dog", "cat") == 0.0
    assert metric_max_over_ground_truths(f1, "cat sat", ["dog", "cat sat", "cat"]) == 1.0


def test_v11_quirk_empty_normalised_answers_have_f1_zero_but_match_exactly() -> None:
    assert exact_match("The", "a") == 1.0
    assert f1("The", "a") == 0.0


def test_evaluate_counts_missing_predictions_as_zero() -> None:
    document = _document([("q1", "Who?", ["Ingrid Solberg"]), ("q2", "When?", ["1911", "in 1911"])])
    result = evaluate(document, {"q1": "ingrid solberg", "q3": "stray"})
    assert result == {"exact_match": 50.0, "f1": 50.0, "questions": 2, "unanswered": 1}
    result = evaluate(document, {"q1": "Solberg", "q2": "in 1911."})
    assert result["exact_match"] == 50.0
    assert result["f1"] == pytest.approx(100 * (2 / 3 + 1) / 2)


def test_evaluate_refuses_a_question_without_references() -> None:
    document = _document([("q1", "Who?", [])])
    with pytest.raises(DilstoreError, match="q1.*reference answer"):
        evaluate(document, {"q1": "someone"})
    with pytest.raises(DilstoreError, match="no questions"):
        evaluate_examples([], {})


@given(prediction=ANSWERS, truth=ANSWERS)
@settings(max_examples=300, deadline=None)
def test_scores_are_in_unit_interval_and_f1_is_symmetric(prediction: str, truth: str) -> None:
    em, score = exact_match(prediction, truth), f1(prediction, truth)
    assert em in (0.0, 1.0) and 0.0 <= score <= 1.0
    assert f1(truth, prediction) == score


@given(prediction=CONTENT_ANSWERS, truth=CONTENT_ANSWERS)
@settings(max_examples=300, deadline=None)
def test_exact_match_never_exceeds_f1_when_answers_have_content(prediction: str, truth: str) -> None:
    """EM ≤ F1 for every pair whose normalised forms are non-empty (see the v1.1 quirk above)."""
    assert exact_match(prediction, truth) <= f1(prediction, truth)
    assert f1(prediction, prediction) == 1.0


@given(
    prediction=ANSWERS,
    truth=ANSWERS,
    article=st.sampled_from(["the", "A", "an", "THE"]),
    punctuation=st.text(st.sampled_from("!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~"), max_size=3),
    upper=st.booleans(),
)
@settings(max_examples=300, deadline=None)
def test_scores_ignore_case_punctuation_and_articles(
    prediction: str, truth: str, article: str, punctuation: str, upper: bool
) -> None:
    varied = f"{article} {punctuation}{prediction.upper() if upper else prediction}{punctuation}  "
    assert normalize_answer(varied) == normalize_answer(prediction)
    assert exact_match(varied, truth) == exact_match(prediction, truth)
    assert f1(varied, truth) == f1(prediction, truth)


# Loaders


@pytest.mark.shared_data
def test_load_squad_reads_typed_records(shared_data: Path) -> None:
    examples = load_squad(shared_data / "squad" / "dev-v1.1.json")
    assert len(examples) == 10570
    first = examples[0]
    assert first.title == "Super_Bowl_50" and first.question == "Which NFL team represented the AFC at Super Bowl 50?"
    assert [a.text for a in first.answers] == ["Denver Broncos"] * 3
    assert all(e.context[a.answer_start : a.answer_end] == a.text for e in examples[:200] for a in e.answers)
    assert examples[1].context is first.context  # a paragraph's questions share one string


@pytest.mark.shared_data
def test_load_open_questions_reads_the_dpr_file(shared_data: Path) -> None:
    questions = load_open_questions(shared_data / "opensquad" / "questions.dev-v1.1.jsonl")
    assert len(questions) == 10570
    assert questions[0].line == 1 and questions[0].answers == ("Denver Broncos",) * 3


def _document(questions: list[tuple[str, str, list[str]]], context: str = "Ingrid Solberg won in 1911.") -> dict:
    """A one-paragraph SQuAD document; answers that occur in the context get their first offset."""
    qas = [
        {"id": qid, "question": q, "answers": [{"text": a, "answer_start": context.find(a)} for a in answers]}
        for qid, q, answers in questions
    ]
    return {"version": "1.1", "data": [{"title": "T", "paragraphs": [{"context": context, "qas": qas}]}]}


def _broken(edit) -> dict:
    document = _document([("q1", "Who won?", ["Ingrid Solberg"]), ("q2", "When?", ["1911"])])
    edit(document)
    return document


def _qa(document: dict, index: int) -> dict:
    return document["data"][0]["paragraphs"][0]["qas"][index]


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda d: d.pop("data"), r"the document has no 'data' key"),
        (lambda d: d["data"][0]["paragraphs"][0].pop("context"), r"data\[0\]\.paragraphs\[0\] has no 'context' key"),
        (lambda d: _qa(d, 1).pop("answers"), r"qas\[1\] \(id 'q2'\) has no 'answers' key"),
        (
            lambda d: _qa(d, 1)["answers"][0].update(answer_start=400),
            r"'q2'\)\.answers\[0\]: answer_start 400 is out of range",
        ),
        (lambda d: _qa(d, 1)["answers"][0].update(answer_start=-1), r"answer_start -1 is out of range"),
        (lambda d: _qa(d, 1)["answers"][0].update(answer_start=3), r"'q2'\).*reads 'rid ', not the answer text '1911'"),
        (  # the same words a character off: its offsets would label the space before them
            lambda d: _qa(d, 1)["answers"][0].update(text="1911 ", answer_start=21),
            r"'q2'\).*reads ' 1911', not the answer text '1911 '",
        ),
        (lambda d: _qa(d, 1)["answers"][0].update(answer_start="22"), r"'answer_start' must be an integer, got \"22\""),
        (lambda d: _qa(d, 1)["answers"][0].update(answer_start=True), r"'answer_start' must be an integer, got true"),
        (
            lambda d: _qa(d, 1).update(id="q1"),
            r"qas\[1\]: question id 'q1' already used at data\[0\]\.paragraphs\[0\]\.qas\[0\]",
        ),
        (lambda d: _qa(d, 0).update(question="  "), r"'q1'\): the question is empty"),
        (
            lambda d: _qa(d, 0).update(question="Who \ud800?"),
            r"'q1'\): 'question' holds a lone surrogate U\+D800 at character 5, which is not Unicode text",
        ),
        (
            lambda d: d["data"][0]["paragraphs"][0].update(context="\udfff"),
            r"^file\.json: data\[0\]\.paragraphs\[0\]: 'context' holds a lone surrogate U\+DFFF at character 1",
        ),
        (lambda d: _qa(d, 1)["answers"][0].update(text="19\udc00"), r"'q2'\)\.answers\[0\]: 'text' holds a lone"),
        (lambda d: d["data"].append([]), r"data\[1\] must be a JSON object, got a list"),
        (
            lambda d: _qa(d, 1).update(id=""),
            r"^file\.json: data\[0\]\.paragraphs\[0\]\.qas\[1\]: the question id is empty$",
        ),
        (
            lambda d: d["data"][0]["paragraphs"].append({"context": " \n ", "qas": []}),
            r"^file\.json: data\[0\]\.paragraphs\[1\]: the context is empty$",
        ),
    ],
)
def test_parse_squad_names_the_offending_item(edit, message: str) -> None:
    with pytest.raises(DilstoreError, match=message):
        parse_squad(_broken(edit), "file.json")


@pytest.mark.parametrize(("context", "answer", "start", "forms"), [
    ("Zu\u0308rich won in 1911.", "Zürich", 0, "NFD and the answer text in NFC"),  # reads 'Zu\u0308ric'
    ("Zürich won in 1911.", "Zu\u0308rich", 0, "NFC and the answer text in NFD"),  # out of range: 7 of 19 characters
    ("Zu\u0308rich won in 1911.", "1911", 14, "NFD and the answer text in NFC"),  # counted in the composed context
    ("Zürich", "Zu\u0308rich", 0, "NFC and the answer text in NFD"),  # out of range: 7 characters in 6 (mut57c)
])
def test_a_context_and_answer_in_other_unicode_forms_are_refused_naming_the_forms(
    context: str, answer: str, start: int, forms: str
) -> None:
    """(left57 F4) A context written decomposed (macOS tools) and its answers composed, or answer_start counted in
    the composed context, was refused as "the context at answer_start 0 reads 'Züric', not the answer text 'Zürich'":
    two texts that print alike, the cause unnamed. The refusal now names both forms; a plain miss gets no hint."""
    document = _document([("q1", "Where?", [])], context=context)
    _qa(document, 0)["answers"] = [{"text": answer, "answer_start": start}]
    with pytest.raises(DilstoreError, match=re.escape(f"; the context is in Unicode form {forms}, which print alike: "
                                                      "write both in one form (NFC, say), with answer_start counted "
                                                      "in it")):  # fmt: skip
        parse_squad(document, "file.json")
    _qa(document, 0)["answers"] = [{"text": "1912", "answer_start": start}]
    with pytest.raises(DilstoreError, match=r"not the answer text '1912'$"):
        parse_squad(document, "file.json")
    _qa(document, 0)["answers"] = [{"text": "Genève", "answer_start": 0}]  # in no form in the context (mut57c)
    with pytest.raises(DilstoreError, match=r"not the answer text 'Genève'$"):
        parse_squad(document, "file.json")


def test_a_plain_miss_in_a_context_of_mixed_unicode_forms_gets_no_forms_hint() -> None:
    """(read57 F1) A context written in neither form (one letter composed, one decomposed) and an ASCII answer at a
    wrong answer_start was refused as written "in Unicode form neither NFC nor NFD and the answer text in NFC, which
    print alike": the answer is in the context as it is written, at another place; the cause was the offset."""
    context = "Caf\u00e9 Zu\u0308rich won in 1911."
    document = _document([("q1", "Where?", [])], context=context)
    _qa(document, 0)["answers"] = [{"text": "1911", "answer_start": 3}]
    with pytest.raises(DilstoreError, match=r"not the answer text '1911'$"):
        parse_squad(document, "file.json")
    _qa(document, 0)["answers"] = [{"text": "Z\u00fcrich", "answer_start": 5}]  # in the context only once composed
    with pytest.raises(DilstoreError, match="in Unicode form neither NFC nor NFD and the answer text in NFC"):
        parse_squad(document, "file.json")


def test_load_squad_names_the_file_for_unreadable_input(tmp_path: Path) -> None:
    not_json = tmp_path / "not.json"
    not_json.write_text('{"data": [\n  oops\n]}', encoding="utf-8")
    with pytest.raises(DilstoreError, match=r"not\.json: not valid JSON \(line 2"):
        load_squad(not_json)
    latin1 = tmp_path / "latin1.json"
    latin1.write_bytes('{"data": "Zürich"}'.encode("latin-1"))
    with pytest.raises(DilstoreError, match="latin1.json: not UTF-8"):
        load_squad(latin1)
    with pytest.raises(DilstoreError, match="missing.json: no such file"):
        load_squad(tmp_path / "missing.json")
    valid = tmp_path / "valid.json"
    valid.write_text(json.dumps(_document([("q1", "Who won?", ["Ingrid Solberg"])])), encoding="utf-8")
    assert [e.id for e in load_squad(valid)] == ["q1"]


@pytest.mark.parametrize(
    ("lines", "message"),
    [
        (['{"question": "Who?", "answer": ["me"]}', "{oops"], r"q\.jsonl:2: not valid JSON"),
        (['{"question": "Who won the'], r"q\.jsonl:1: not valid JSON \(column 14: Unterminated string starting at\)$"),
        (['{"question": "Who?"}'], r"q\.jsonl:1: the line has no 'answer' key"),
        (['{"question": "Who?", "answer": "me"}'], r"q\.jsonl:1: the line: 'answer' must be a list"),
        (['{"question": "Who?", "answer": []}'], r"q\.jsonl:1: \"answer\" must be a non-empty list of strings"),
        (['{"question": "Who?", "answer": [3]}'], r"q\.jsonl:1: \"answer\" must be a non-empty list .*, got \[3\]"),
        (['{"question": "Who?", "answer": ["me", " "]}'], r'q\.jsonl:1: "answer"\[1\] is empty$'),  # scored EM 100
        (["", '{"question": " ", "answer": ["x"]}'], r"q\.jsonl:2: the question is empty"),
        (['{"question": "Who\\ud800?", "answer": ["x"]}'], r"q\.jsonl:1: the line: 'question' holds a lone surrogate"),
        (['{"question": "Who?", "answer": ["x", "\\udbff"]}'], r'q\.jsonl:1: "answer"\[1\] holds a lone surrogate'),
        (['["Who?", ["me"]]'], r"q\.jsonl:1: the line must be a JSON object, got a list"),
    ],
)
def test_load_open_questions_names_file_and_line(tmp_path: Path, lines: list[str], message: str) -> None:
    path = tmp_path / "q.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    with pytest.raises(DilstoreError, match=message):
        load_open_questions(path)


def test_a_question_line_nested_too_deep_is_named_not_a_recursion_error(tmp_path: Path) -> None:
    """(fuzz60 F1) A JSONL line nested 100 000 levels deep ended `evaluate-qa --questions` (and the ranking
    training files' reader) with a RecursionError traceback; it is now one line naming file and line."""
    path = tmp_path / "q.jsonl"
    path.write_text('{"question": "Who?", "answer": ["me"]}\n' + "[" * 100_000 + "]" * 100_000 + "\n")
    with pytest.raises(DilstoreError, match=r"q\.jsonl:2: its JSON is nested too deep to read$"):
        load_open_questions(path)


def test_a_number_too_long_for_python_is_named_not_a_value_error(tmp_path: Path) -> None:
    """(fuzz60 F3) JSON allows a number of any length; Python's int() refuses one of over 4,300 digits with a
    ValueError, no JSONDecodeError, and a SQuAD file or a question line holding one ended `evaluate-qa` with a
    traceback."""
    squad, questions = tmp_path / "dev.json", tmp_path / "q.jsonl"
    squad.write_text('{"data": [], "version": ' + "1" * 5000 + "}")
    questions.write_text('{"question": "Who?", "answer": ["me"], "n": ' + "9" * 5000 + "}\n")
    with pytest.raises(DilstoreError, match=r"dev\.json: not JSON this reads \(Exceeds the limit .*5000 digits\)$"):
        load_squad(squad)
    with pytest.raises(DilstoreError, match=r"q\.jsonl:1: not JSON this reads \(Exceeds the limit \(4300 digits\)"):
        load_open_questions(questions)


def test_load_open_questions_skips_blank_lines_and_reports_bad_bytes(tmp_path: Path) -> None:
    path = tmp_path / "q.jsonl"
    path.write_bytes(b'{"question": "Who?", "answer": ["me"]}\n\n{"question": "Why?", "answer": ["because"]}\n')
    assert [(q.line, q.question) for q in load_open_questions(path)] == [(1, "Who?"), (3, "Why?")]
    path.write_bytes(b'{"question": "Who?", "answer": ["me"]}\n{"question": "Z\xfcrich?", "answer": ["x"]}\n')
    with pytest.raises(DilstoreError, match=r"q\.jsonl:2: not UTF-8"):
        load_open_questions(path)


def test_load_predictions_checks_the_mapping(tmp_path: Path) -> None:
    path = tmp_path / "predictions.json"
    path.write_text('{"q1": "Solberg", "q2": 1911}', encoding="utf-8")
    with pytest.raises(DilstoreError, match=r"predictions\.json: the prediction for 'q2' must be a string, got 1911"):
        load_predictions(path)
    path.write_text('["Solberg"]', encoding="utf-8")
    with pytest.raises(DilstoreError, match="must hold a JSON object"):
        load_predictions(path)


def test_compatibility_forms_stay_other_answers_as_in_the_official_script() -> None:
    """(mut56 M49) The added step composes (NFC), it does not fold (NFKC): `km²` against `km2`, a ligature or full-width
    digits are scored as the official script scores them, so that no published number moves. A fold there went
    unnoticed by every test, the official dev set's included."""
    assert exact_match("km²", "km2") == 0.0
    assert exact_match("\ufb01nance", "finance") == 0.0
    assert f1("\uff11\uff19\uff19\uff18 census", "1998 census") == 0.5


def test_case_is_lowered_as_the_official_script_lowers_it_not_case_folded() -> None:
    """(mut56 M96) The official script lowercases (`str.lower`); a case fold (`str.casefold`) would also make `ß`
    and `ss` one answer, and move scores that published numbers depend on."""
    assert exact_match("Straße", "Strasse") == 0.0 and exact_match("STRASSE", "strasse") == 1.0
