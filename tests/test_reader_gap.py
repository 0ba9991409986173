"""benchmarks/reader_gap.py: two readers' predictions compared per question, in buckets, with clear errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dilstore.reader.modeling.checkpoints import base_model_dir
from dilstore.storage.errors import DilstoreError
from tests.fixtures.benchmarks import benchmark_module

CONTEXT = "Marie Curie won the Nobel Prize in Physics in 1903 and in Chemistry in 1911 in Paris."
QUESTIONS = [
    ("q1", "Who won the Nobel Prize in Physics in 1903?", "Marie Curie"),
    ("q2", "When did she win the prize in Chemistry?", "1911"),
    ("q3", "Where did she win it?", "Paris"),
    ("q4", "How many prizes did she win in 1903 and 1911?", "two"),  # not in the context: no answers
]


def write_squad(path: Path) -> Path:
    """A one-paragraph SQuAD v1.1 file with QUESTIONS; the last has no reference answers."""
    qas = [
        {"id": qid, "question": question,
         "answers": [{"text": text, "answer_start": CONTEXT.index(text)}] if text in CONTEXT else []}
        for qid, question, text in QUESTIONS
    ]  # fmt: skip
    path.write_text(json.dumps({"data": [{"title": "t", "paragraphs": [{"context": CONTEXT, "qas": qas}]}]}))
    return path


def write_predictions(path: Path, answers: dict[str, str]) -> Path:
    path.write_text(json.dumps(answers), encoding="utf-8")
    return path


def test_the_gap_is_split_into_buckets_whose_shares_add_up_to_one(tmp_path: Path, capsys) -> None:
    data = write_squad(tmp_path / "dev.json")
    a = write_predictions(tmp_path / "a.json", {"q1": "Marie Curie", "q2": "1911", "q3": "Paris", "q4": "two"})
    b = write_predictions(tmp_path / "b.json", {"q1": "Curie", "q2": "1911", "q3": "1903", "q4": "one"})
    with benchmark_module("reader_gap") as reader_gap:
        assert reader_gap.main([str(data), str(a), str(b), "--tokenizer", str(base_model_dir())]) == 0
    result = json.loads(capsys.readouterr().out.splitlines()[-1])
    # q4 has no references and is left out; q1: F1 100 against 66.67 (1 of 2 tokens), q2 equal, q3 100 against 0.
    summary = result["summary"]
    low, high = summary.pop("gap_ci95")
    assert summary == {"questions": 3, "f1_a": 100.0, "f1_b": 55.56, "gap": 44.44, "a_higher": 2, "b_higher": 0,
                       "same_answer_pct": 33.3}  # fmt: skip
    # The per-question gaps are 33.33, 0 and 100: every resampled mean lies between 0 and 100.
    assert 0.0 <= low < 44.44 < high <= 100.0
    words = {row["bucket"]: row for row in result["buckets"]["question word"]}
    assert set(words) == {"who", "when", "where"}
    assert words["where"]["gap"] == 100.0 and words["when"]["gap"] == 0.0
    assert words["where"]["share"] == pytest.approx(0.75, abs=1e-3) and words["who"]["share"] == pytest.approx(0.25)
    for rows in result["buckets"].values():
        assert sum(row["questions"] for row in rows) == 3
        assert sum(row["share"] for row in rows) == pytest.approx(1.0, abs=2e-3)
    assert [row["bucket"] for row in result["buckets"]["answer tokens"]] == ["<=1", "3"]  # "Marie Curie": 3 pieces


def test_range_buckets_keep_their_order_and_word_buckets_go_by_size() -> None:
    with benchmark_module("reader_gap") as reader_gap:
        def question(word: str, answer_tokens: int, f1_b: float) -> object:
            return reader_gap.ScoredQuestion(100.0, f1_b, False, word, answer_tokens, 0, 10)

        scored = [question("what", 1, 50.0), question("who", 7, 0.0), question("who", 8, 100.0)]
        by_length = reader_gap.bucket_rows(scored, lambda q: reader_gap.length_bucket(q.answer_tokens, (1, 5)),
                                           reader_gap.range_labels((1, 5)))  # fmt: skip
        assert [(row["bucket"], row["questions"]) for row in by_length] == [("<=1", 1), (">5", 2)]
        by_word = reader_gap.bucket_rows(scored, lambda q: q.question_word)
        rows = [(row["bucket"], row["questions"], row["gap"]) for row in by_word]
        assert rows == [("who", 2, 50.0), ("what", 1, 50.0)]
        assert [row["share"] for row in by_word] == [0.667, 0.333]


@pytest.mark.parametrize(
    ("value", "label"), [(0, "<=1"), (1, "<=1"), (2, "2"), (5, "5"), (6, ">5"), (400, ">5")]
)
def test_length_buckets_cover_every_count(value: int, label: str) -> None:
    with benchmark_module("reader_gap") as reader_gap:
        assert reader_gap.length_bucket(value, (1, 2, 3, 4, 5)) == label
        assert reader_gap.range_labels((63, 127)) == ["<=63", "64-127", ">127"]


@pytest.mark.parametrize(
    ("question", "word"),
    [("How many prizes?", "how many"), ("how did she win?", "how"), ("In which year?", "which"),
     ("Name the city.", "other"), ("Tell me: who wrote it?", "who"),
     # The first in the question, not in QUESTION_WORDS' order, and next to punctuation (129 of SQuAD dev's):
     ("How old was Peyton Manning when he played?", "how"), ("When John Fox left, who replaced him?", "when"),
     ("Who, with Jim Nantz, called the game?", "who"), ("What's the name?", "what")],
)  # fmt: skip
def test_question_words_prefer_the_two_word_ones(question: str, word: str) -> None:
    with benchmark_module("reader_gap") as reader_gap:
        assert reader_gap.question_word(question) == word


def test_prediction_files_for_other_questions_are_refused_by_id(tmp_path: Path) -> None:
    with benchmark_module("reader_gap") as reader_gap:
        from dilstore.reader.data.squad import load_squad

        examples = load_squad(write_squad(tmp_path / "dev.json"))
        with pytest.raises(DilstoreError, match="answer different questions, e.g. 'q2'"):
            reader_gap.per_question_f1(examples, {"q1": "x", "q2": "y"}, {"q1": "x"}, len)
        with pytest.raises(DilstoreError, match="question 'zz' is not in the dataset"):
            reader_gap.per_question_f1(examples, {"zz": "x"}, {"zz": "x"}, len)


def test_a_bad_prediction_file_ends_in_one_line_naming_it(tmp_path: Path) -> None:
    data = write_squad(tmp_path / "dev.json")
    good = write_predictions(tmp_path / "a.json", {"q1": "Marie Curie"})
    bad = tmp_path / "b.json"
    bad.write_text('["not", "an", "object"]', encoding="utf-8")
    with benchmark_module("reader_gap") as reader_gap, pytest.raises(SystemExit, match=f"reader_gap: {bad}"):
        reader_gap.main([str(data), str(good), str(bad), "--tokenizer", str(base_model_dir())])


def test_a_folder_without_a_tokenizer_is_refused_by_name(tmp_path: Path, capsys) -> None:
    data = write_squad(tmp_path / "dev.json")
    predictions = write_predictions(tmp_path / "a.json", {"q1": "Marie Curie"})
    with benchmark_module("reader_gap") as reader_gap, pytest.raises(SystemExit) as exit_info:
        reader_gap.main([str(data), str(predictions), str(predictions), "--tokenizer", str(tmp_path)])
    assert exit_info.value.code == 2 and f"--tokenizer {tmp_path}: no tokenizer.json" in capsys.readouterr().err


@settings(max_examples=40, deadline=None)
@given(
    pairs=st.lists(st.tuples(st.floats(0, 100), st.floats(0, 100)), min_size=1, max_size=60),
    seed=st.integers(0, 2**16),
)
def test_the_bootstrap_interval_lies_within_the_per_question_gaps(pairs: list[tuple[float, float]], seed: int) -> None:
    with benchmark_module("reader_gap") as reader_gap:
        scored = [reader_gap.ScoredQuestion(a, b, False, "what", 1, 0, 10) for a, b in pairs]
        low, high = reader_gap.gap_interval(scored, resamples=200, seed=seed)
        gaps = [a - b for a, b in pairs]
        assert min(gaps) - 1e-9 <= low <= high <= max(gaps) + 1e-9
        assert reader_gap.gap_interval(scored, resamples=200, seed=seed) == (low, high)  # seeded: the same again


def test_one_reader_better_on_every_question_gives_an_interval_above_zero_and_equal_readers_zero() -> None:
    with benchmark_module("reader_gap") as reader_gap:
        better = [reader_gap.ScoredQuestion(60.0 + i % 7, 50.0, False, "who", 1, 0, 10) for i in range(300)]
        low, high = reader_gap.gap_interval(better)
        assert 10.0 <= low < 13.0 < high <= 16.0  # the mean gap is 12.99; every question's gap is 10 to 16
        equal = [reader_gap.ScoredQuestion(f, f, True, "who", 1, 0, 10) for f in (0.0, 50.0, 100.0)]
        assert reader_gap.gap_interval(equal) == (0.0, 0.0)
        with pytest.raises(DilstoreError, match="resamples must be at least 1, not 0"):
            reader_gap.gap_interval(equal, resamples=0)


def test_no_resamples_is_refused_by_name(tmp_path: Path, capsys) -> None:
    data = write_squad(tmp_path / "dev.json")
    predictions = write_predictions(tmp_path / "a.json", {"q1": "Marie Curie"})
    with benchmark_module("reader_gap") as reader_gap, pytest.raises(SystemExit) as exit_info:
        reader_gap.main([str(data), str(predictions), str(predictions), "--tokenizer", str(base_model_dir()),
                         "--resamples", "0"])  # fmt: skip
    assert exit_info.value.code == 2 and "--resamples 0: give 1 or more" in capsys.readouterr().err
