"""The open-domain reader over a tiny store, without the JVM: logits, batching, decoding, aggregation, bad input.

Retrieval goes through a stub searcher here; tests/test_odqa_retrieval.py
runs the real Lucene index.
"""

from __future__ import annotations

import copy
import dataclasses
import os
import pickle
import shutil
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import zarr
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dilstore.reader.evaluation.open_domain import QAQuestion, evaluate_questions
from dilstore.reader.modeling.dilbert import DilBertReader
from dilstore.reader.retrieval import Hit
from dilstore.reader.serving.answers import Reading, Span, Timings, aggregate
from dilstore.reader.serving.odqa import OdqaSettings, OpenDomainReader, load_store_model, open_reader
from dilstore.reader.text.tokenization import encode_passage, encode_question
from dilstore.storage.errors import DilstoreError
from dilstore.storage.fingerprint import FingerprintMismatchError
from dilstore.storage.format import SHARDS_DIR
from dilstore.storage.reader import MissingPassagesError, open_store
from dilstore.storage.records import StoredPassage
from tests.fixtures.odqa_fixtures import MAX_LENGTH, PASSAGES, write_reader_checkpoint, write_store
from tests.fixtures.store_fixtures import build_store, random_shards
from tests.fixtures.text_forms import full_width

QUESTION = "When did the Zürich tram network open?"
QUESTIONS = [QUESTION, "Who was the lighthouse keeper?", "How high is Kilimanjaro?"]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """A tiny reader checkpoint, fp32/fp16/int8 stores of PASSAGES, and a second model's checkpoint."""
    root = tmp_path_factory.mktemp("odqa")
    model_dir = write_reader_checkpoint(root / "model")
    stores = {encoding: root / f"store-{encoding}" for encoding in ("fp32", "fp16", "int8")}
    ids = [write_store(path, model_dir, encoding) for encoding, path in stores.items()][0]
    return {
        "model_dir": model_dir,
        "other_model_dir": write_reader_checkpoint(root / "other-model", seed=1),
        "stores": stores,
        "ids": ids,
        "model": DilBertReader.from_pretrained(model_dir),
    }


class StubSearcher:
    """Returns fixed hits for every query: what the reader needs of Bm25Searcher."""

    def __init__(self, hits: list[Hit]) -> None:
        self.hits = hits

    def search(self, query: str, k: int) -> list[Hit]:
        return self.hits[:k]


def odqa_for(tiny: dict, encoding: str = "fp32", **options) -> OpenDomainReader:
    store = open_store(tiny["stores"][encoding])
    hits = [Hit(passage_id, float(len(tiny["ids"]) - rank)) for rank, passage_id in enumerate(tiny["ids"])]
    return OpenDomainReader(tiny["model"], store, StubSearcher(hits), OdqaSettings(**options))


def direct_passage_logits(model: DilBertReader, question: str, token_ids: np.ndarray) -> tuple[np.ndarray, ...]:
    """The model core's composition on one (question, passage window) pair; logits over the passage part."""
    q = encode_question(model.tokenizer, question, 64).token_ids
    q_ids = torch.from_numpy(q.astype(np.int64))[None]  # (1, nq)
    p_ids = torch.from_numpy(token_ids.astype(np.int64))[None]  # (1, np)
    with torch.inference_mode():
        start, end = model(q_ids, torch.ones_like(q_ids), p_ids, torch.ones_like(p_ids))  # each (1, nq + np)
    return start[0, len(q) :].numpy(), end[0, len(q) :].numpy()


def test_a_reader_handed_to_another_process_says_to_open_one_there(tiny: dict) -> None:
    """(port58 F6) Pickled for a spawn or forkserver process (a pool's arguments; macOS, Linux's default from Python
    3.14), a reader failed with "Can't pickle <function <lambda>>" naming nothing of the reader."""
    with pytest.raises(TypeError, match=r"OpenDomainReader cannot be handed to another process .*open_reader"):
        pickle.dumps(odqa_for(tiny))


def test_fp32_store_logits_match_the_model_core_on_the_text(tiny: dict) -> None:
    # Small batches force several length buckets with padding on both sides.
    odqa = odqa_for(tiny, pair_batch_tokens=80, max_pairs_per_batch=3)
    for question in QUESTIONS:
        got = {logits.passage_id: logits for logits in odqa.passage_logits(question, tiny["ids"])}
        compared = 0
        for passage in PASSAGES:
            windows = encode_passage(tiny["model"].tokenizer, passage.text, MAX_LENGTH)
            for number, window in enumerate(windows):
                stored_id = passage.id if number == 0 else f"{passage.id}~{number}"
                start, end = direct_passage_logits(tiny["model"], question, window.token_ids)
                np.testing.assert_allclose(got[stored_id].start, start, atol=1e-4, rtol=0)
                np.testing.assert_allclose(got[stored_id].end, end, atol=1e-4, rtol=0)
                compared += 1
        assert compared == len(tiny["ids"]) > len(PASSAGES)  # the long passage really was windowed


@pytest.mark.parametrize("encoding, tolerance", [("fp16", 0.02), ("int8", 0.2)])
def test_reduced_precision_stores_give_nearby_logits(tiny: dict, encoding: str, tolerance: float) -> None:
    exact = odqa_for(tiny).passage_logits(QUESTION, tiny["ids"])
    reduced = odqa_for(tiny, encoding).passage_logits(QUESTION, tiny["ids"])
    for a, b in zip(exact, reduced, strict=True):
        assert a.passage_id == b.passage_id
        assert np.abs(a.start - b.start).max() < tolerance
        assert np.abs(a.end - b.end).max() < tolerance


def test_many_questions_at_once_equal_one_at_a_time(tiny: dict) -> None:
    odqa = odqa_for(tiny, pair_batch_tokens=128)
    candidates = [tiny["ids"], tiny["ids"][:2], list(reversed(tiny["ids"]))]
    together = odqa.read(QUESTIONS, candidates)
    for question, ids, reading in zip(QUESTIONS, candidates, together, strict=True):
        alone = odqa.read([question], [ids])[0]
        assert [(s.passage_id, s.start_token, s.end_token) for s in reading.spans] == [
            (s.passage_id, s.start_token, s.end_token) for s in alone.spans
        ]
        np.testing.assert_allclose(
            [s.reader_score for s in reading.spans], [s.reader_score for s in alone.spans], atol=1e-4
        )
        assert [hit.passage_id for hit in reading.hits] == list(ids)



def test_each_pair_reads_its_own_questions_states(tiny: dict) -> None:
    """The tiny reader's logits hardly depend on the question (its online attention output and QA head are small:
    scores move about 1e-4 between two questions), so the test above, at atol 1e-4, passed with every pair of a
    batch given the first question's states (mut57a). Here a copy of the model has both scaled up, so the question
    moves the logits, and several questions read at once must still each read as alone."""
    model = copy.deepcopy(tiny["model"])
    with torch.no_grad():
        model.model.bert.encoder.layer[model.layers].attention.output.dense.weight.mul_(50)
        model.model.qa_outputs.weight.mul_(100)  # logits of a few units, not of a few hundredths
    odqa = OpenDomainReader(model, open_store(tiny["stores"]["fp32"]), settings=OdqaSettings(pair_batch_tokens=128))
    alone = [odqa.read([question], [tiny["ids"]])[0] for question in QUESTIONS]
    scores = [np.array([s.reader_score for s in reading.spans]) for reading in alone]
    assert np.abs(scores[0] - scores[1]).max() > 0.1, "the questions must give other scores for this to check"
    for reading, one in zip(odqa.read(QUESTIONS, [tiny["ids"]] * len(QUESTIONS)), alone, strict=True):
        assert [(s.passage_id, s.start_token, s.end_token) for s in reading.spans] == [
            (s.passage_id, s.start_token, s.end_token) for s in one.spans
        ]
        np.testing.assert_allclose([s.reader_score for s in reading.spans], [s.reader_score for s in one.spans],
                                   atol=1e-4)  # fmt: skip

def test_pairs_of_short_and_long_questions_share_batches_no_wider_than_the_token_budget(tiny: dict) -> None:
    """ask50 F1: the question part and the passage part were padded apart, so a batch mixing a short and a long
    question ran max(question) + max(passage) wide, past --pair-batch-tokens. Each row now holds its question
    then its passage side by side, and each question reads as it does alone."""
    long_question = "In which year, after many long debates in the city council about the cost of the new lines, " \
        "did the Zürich tram network finally open to the public?"  # fmt: skip
    questions = ["Kilimanjaro?", long_question]
    model = tiny["model"]
    lengths = [len(encode_question(model.tokenizer, question, 64).token_ids) for question in questions]
    assert lengths[1] > 4 * lengths[0]
    widths: list[tuple[int, ...]] = []  # (rows, width) of each batch entering the first online layer
    first_online = model.model.bert.encoder.layer[model.layers]
    hook = first_online.register_forward_pre_hook(lambda module, args: widths.append(tuple(args[0].shape[:2])))
    budget = 160
    odqa = odqa_for(tiny, pair_batch_tokens=budget, max_pairs_per_batch=64)
    try:
        together = odqa.read(questions, [tiny["ids"]] * 2)
    finally:
        hook.remove()
    assert any(rows > 1 for rows, _ in widths), "some batch holds pairs of both questions"
    assert all(rows * width <= budget for rows, width in widths if rows > 1)
    for question, reading in zip(questions, together, strict=True):
        alone = odqa.read([question], [tiny["ids"]])[0]
        assert [(s.passage_id, s.start_token, s.end_token) for s in reading.spans] == [
            (s.passage_id, s.start_token, s.end_token) for s in alone.spans
        ]
        np.testing.assert_allclose(
            [s.reader_score for s in reading.spans], [s.reader_score for s in alone.spans], atol=1e-4
        )


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(n_best=st.integers(1, 6), max_answer_length=st.integers(1, 8), question=st.sampled_from(QUESTIONS))
def test_spans_are_valid_and_map_to_stored_text(tiny: dict, n_best: int, max_answer_length: int, question: str) -> None:
    odqa = odqa_for(tiny, n_best=n_best, max_answer_length=max_answer_length)
    reading = odqa.read([question], [tiny["ids"]])[0]
    per_passage: dict[str, list[Span]] = {}
    for span in reading.spans:
        per_passage.setdefault(span.passage_id, []).append(span)
        passage = reading.passages[span.passage_id]
        n = len(passage.token_ids)
        assert 0 <= span.start_token <= span.end_token < n - 1  # the trailing [SEP] is never part of an answer
        assert span.end_token - span.start_token + 1 <= max_answer_length
        assert span.text == passage.text[span.char_start : span.char_end] == passage.answer_text(
            span.start_token, span.end_token
        )
        assert span.text
    assert set(per_passage) == set(tiny["ids"])
    for spans in per_passage.values():
        assert len(spans) <= n_best
        scores = [span.reader_score for span in spans]
        assert scores == sorted(scores, reverse=True)


def test_reader_score_is_the_mean_of_start_and_end_logits(tiny: dict) -> None:
    odqa = odqa_for(tiny)
    logits = {item.passage_id: item for item in odqa.passage_logits(QUESTION, tiny["ids"])}
    for span in odqa.read([QUESTION], [tiny["ids"]])[0].spans:
        item = logits[span.passage_id]
        expected = (item.start[span.start_token] + item.end[span.end_token]) / 2
        assert span.reader_score == pytest.approx(expected, abs=1e-5)


def make_reading(scores: list[tuple[float, float]]) -> Reading:
    spans = tuple(
        Span(f"p{i}", f"answer {i}", 0, 0, 0, 8, reader_score=reader, bm25_score=bm25)
        for i, (reader, bm25) in enumerate(scores)
    )
    passages = {span.passage_id: StoredPassage(span.passage_id, f"Title {span.passage_id}", span.text,
                                               np.zeros(1, np.int32), np.zeros((1, 2), np.int32),
                                               np.zeros((1, 4), np.float32)) for span in spans}  # fmt: skip
    return Reading("q", (), passages, spans, Timings())


@given(
    scores=st.lists(
        st.tuples(st.floats(-50, 50, allow_nan=False), st.floats(0, 40, allow_nan=False)), min_size=1, max_size=30
    ),
    mu=st.floats(0, 1),
    n_best=st.integers(1, 10),
)
def test_aggregation_is_the_seeds_formula(scores: list[tuple[float, float]], mu: float, n_best: int) -> None:
    answer = aggregate(make_reading(scores), mu, n_best)
    final = [mu * reader + (1 - mu) * bm25 for reader, bm25 in scores]
    assert len(answer.nbest) == min(n_best, len(scores))
    assert answer.best.score(mu) == pytest.approx(max(final))
    listed = [span.score(mu) for span in answer.nbest]
    assert listed == sorted(listed, reverse=True)
    document = answer.to_dict()
    assert document["score"] == pytest.approx(mu * document["reader_score"] + (1 - mu) * document["bm25_score"])


@given(
    scores=st.lists(st.tuples(st.sampled_from([-1.0, 0.0, 2.5]), st.sampled_from([0.0, 4.0])), min_size=1, max_size=12),
    mu=st.sampled_from([0.0, 0.5, 1.0]),
    n_best=st.integers(1, 12),
)
def test_spans_of_equal_score_keep_their_reading_order(
    scores: list[tuple[float, float]], mu: float, n_best: int
) -> None:
    """Ties under μ go to the earlier span of the reading (retrieval order, then reader order: the docstring), so the
    n-best is the reading's spans stably sorted by score, whatever the ties."""
    reading = make_reading(scores)
    expected = sorted(reading.spans, key=lambda span: -span.score(mu))[:n_best]  # sorted() is stable
    assert [span.passage_id for span in aggregate(reading, mu, n_best).nbest] == [span.passage_id for span in expected]
    assert aggregate(make_reading([(1.0, 0.0), (1.0, 0.0)]), 1.0, 1).best.passage_id == "p0"


def test_each_nbest_span_of_the_json_carries_its_own_passages_title() -> None:
    """`nbest[i].title` is the title of that span's passage, not the best span's (the spans come from 3 passages)."""
    document = aggregate(make_reading([(1.0, 0.0), (3.0, 0.0), (2.0, 0.0)]), 1.0, 3).to_dict()
    assert [(span["passage_id"], span["title"]) for span in document["nbest"]] == [
        ("p1", "Title p1"), ("p2", "Title p2"), ("p0", "Title p0")]
    assert document["title"] == "Title p1"


def test_an_answer_keeps_its_passages_text_not_their_states() -> None:
    """An Answer held every read passage's states: over a 2bit store (decoded copies) 29 MS MARCO passages came to
    3.3 MB an answer, so a program that kept 10,000 answers held 33 GB; over a mapped store the views kept the
    shard files mapped and open after `reader.close()` (api54 F4). The titles, texts, token ids and offsets stay."""
    reading = make_reading([(1.0, 0.0), (3.0, 0.0)])
    whole = {key: dataclasses.replace(passage, states=np.ones((64, 48), np.float32), vector=np.ones(48, np.float32))
             for key, passage in reading.passages.items()}  # fmt: skip
    answer = aggregate(dataclasses.replace(reading, passages=whole), 1.0, 2)
    assert set(answer.passages) == set(whole)
    for key, passage in answer.passages.items():
        assert passage.states.shape == (0, 48) and passage.states.dtype == np.float32 and passage.vector is None
        assert (passage.id, passage.title, passage.text) == (whole[key].id, whole[key].title, whole[key].text)
        np.testing.assert_array_equal(passage.token_ids, whole[key].token_ids)
        np.testing.assert_array_equal(passage.char_spans, whole[key].char_spans)
        assert not any(np.shares_memory(mine, theirs) for mine, theirs in
                       ((passage.token_ids, whole[key].token_ids), (passage.char_spans, whole[key].char_spans)))
    assert answer.to_dict() == aggregate(reading, 1.0, 2).to_dict() | {"timings": answer.timings.to_dict()}


def test_mu_one_leaves_bm25_out_and_fusion_can_change_the_answer() -> None:
    reading = make_reading([(5.0, 0.0), (4.0, 30.0)])
    assert aggregate(reading, 1.0, 5).best.passage_id == "p0"
    assert aggregate(reading, 0.5, 5).best.passage_id == "p1"
    assert aggregate(reading, 0.5, 5).best.score(0.5) == pytest.approx(17.0)


def test_mu_zero_given_to_answer_ranks_by_bm25_alone(tiny: dict) -> None:
    """μ = 0 (BM25 alone) passed to `answer` or `answer_many` is used, not taken for "no μ" and replaced by the
    settings' μ: the answer says μ 0, scores each span by its passage's BM25 score, and ranks as aggregate does."""
    odqa = odqa_for(tiny, top_p=3, mu=0.5)
    reading = odqa.retrieve_and_read([QUESTION])[0]
    for answer in (odqa.answer(QUESTION, mu=0.0), odqa.answer_many([QUESTION], mu=0)[0]):
        assert answer.mu == 0.0
        assert all(span.score(answer.mu) == span.bm25_score for span in answer.nbest)
        assert answer.nbest == aggregate(reading, 0.0, odqa.settings.n_best).nbest
        assert answer.to_dict()["score"] == answer.best.bm25_score


def test_answer_json_has_the_issue_keys(tiny: dict) -> None:
    document = odqa_for(tiny, top_p=3).answer(QUESTION).to_dict()
    for key in ("question", "answer", "score", "passage_id", "reader_score", "bm25_score", "nbest", "timings"):
        assert key in document
    assert document["passage_id"] in tiny["ids"][:3]  # only the top-p passages are read
    assert set(document["timings"]) >= {"retrieval", "store_read", "question_layers", "interaction_layers"}
    assert document["answer"] == document["nbest"][0]["text"]
    # The passages of the n-best, so that a client can check the offsets and show context (odqa43 M2).
    stored = {passage.id: passage for passage in odqa_for(tiny).store.fetch(list(document["passages"]))}
    assert set(document["passages"]) == {span["passage_id"] for span in document["nbest"]}
    for span in document["nbest"]:
        passage = document["passages"][span["passage_id"]]
        assert passage == {"title": stored[span["passage_id"]].title, "text": stored[span["passage_id"]].text}
        assert passage["text"][span["char_start"] : span["char_end"]] == span["text"]
        assert span["title"] == passage["title"]
    assert document["title"] == document["nbest"][0]["title"]


def test_bare_passage_ids_get_a_zero_bm25_score(tiny: dict) -> None:
    reading = odqa_for(tiny).read([QUESTION], [tiny["ids"][:2]])[0]
    assert {span.bm25_score for span in reading.spans} == {0.0}


class NamedLikeAPassage:
    """Not an id, but its str() is one."""

    def __init__(self, passage_id: str) -> None:
        self.passage_id = passage_id

    def __str__(self) -> str:
        return self.passage_id


def test_a_candidate_that_is_not_a_string_or_a_hit_is_refused_by_name(tiny: dict) -> None:
    """(left55 F5) `read(questions, [[421]])` looked up str(421), "421", and any object whose str() was an id was
    read as that passage, where `rerank` and `store.fetch` refuse ids that are not strings."""
    odqa = odqa_for(tiny)
    for wrong, shown in [(421, "int 421"), (NamedLikeAPassage(tiny["ids"][0]), "NamedLikeAPassage <"),
                         (b"tram#0", "bytes b'tram#0'")]:  # fmt: skip
        with pytest.raises(DilstoreError) as raised:
            odqa.read([QUESTION], [[tiny["ids"][1], wrong]])
        assert type(raised.value) is DilstoreError, raised.value  # not a missing id
        assert str(raised.value).startswith(f"candidates must hold passage ids (strings) or hits, got {shown}")
    assert odqa.read([QUESTION], [[np.str_(tiny["ids"][0])]])[0].spans  # a str subclass is a string


def test_a_passage_given_twice_is_read_once(tiny: dict) -> None:
    """Each of its spans was found twice, so the n-best listed every answer twice (readme37 L3)."""
    odqa = odqa_for(tiny)
    first, second = tiny["ids"][:2]
    once = odqa.read([QUESTION], [[first, second]])[0]
    twice = odqa.read([QUESTION], [[first, Hit(second, 3.0), second, first]])[0]
    assert [span.passage_id for span in twice.spans] == [span.passage_id for span in once.spans]
    assert [span.text for span in twice.spans] == [span.text for span in once.spans]
    assert {span.bm25_score for span in twice.spans if span.passage_id == second} == {3.0}, "the first hit counts"



def test_questions_sharing_passages_fetch_each_passage_once(tiny: dict) -> None:
    """A reading call fetches every distinct passage once, however many questions share it: fetching each (question,
    passage) pair's read the same states from the store again with the same answers (mut57a)."""
    store, asked = open_store(tiny["stores"]["fp32"]), []

    class Counting:
        def fetch(self, passage_ids: list[str]) -> list[StoredPassage]:
            asked.extend(passage_ids)
            return store.fetch(passage_ids)

    odqa = OpenDomainReader(tiny["model"], Counting())
    odqa.read(QUESTIONS, [tiny["ids"], tiny["ids"][:2], list(reversed(tiny["ids"]))])
    assert asked == tiny["ids"]


def test_a_stand_in_store_without_a_fingerprint_is_evaluated_with_an_unknown_encoding(tiny: dict) -> None:
    """A store given as a PassageSource needs only `fetch`; evaluating a reader over one raised AttributeError (no
    `fingerprint`) from `read_with` after every question was read, the scores lost (types58 F1)."""
    store = open_store(tiny["stores"]["fp32"])

    class StandIn:
        def fetch(self, passage_ids: list[str]) -> list[StoredPassage]:
            return store.fetch(passage_ids)

    hits = [Hit(passage_id, 1.0) for passage_id in tiny["ids"]]
    odqa = OpenDomainReader(tiny["model"], StandIn(), StubSearcher(hits), OdqaSettings(top_p=2))
    assert odqa.read_with == {"encoding": "", "online_variant": None}
    evaluation = evaluate_questions(odqa, [QAQuestion("q1", QUESTION, ("1897",))], top_p=2, mu=0.5)
    assert evaluation.questions == 1 and evaluation.encoding == ""

def test_a_question_without_candidates_has_no_answer(tiny: dict) -> None:
    odqa = odqa_for(tiny)
    reading = odqa.read([QUESTION, QUESTION], [[], tiny["ids"][:1]])
    assert reading[0].spans == () and reading[1].spans
    document = aggregate(reading[0], 0.5, 5).to_dict()
    assert (document["answer"], document["score"], document["passage_id"], document["nbest"]) == ("", None, None, [])
    assert (document["title"], document["passages"]) == (None, {})


@pytest.mark.parametrize("question", ["", "   \n", "word " * 10_000, "x" * 100_000])
def test_bad_questions_get_clear_errors_and_the_reader_survives(tiny: dict, question: str) -> None:
    odqa = odqa_for(tiny)
    with pytest.raises(DilstoreError, match="empty|longer than|characters long"):
        odqa.answer(question)
    assert odqa.answer(QUESTION).text


def test_states_that_are_not_finite_are_named_not_answered_with_nothing(tiny: dict, tmp_path: Path) -> None:
    """NaN states gave every passage NaN logits, whose spans were dropped: an empty answer, EM 0, exit 0
    (hostile46 F7)."""
    damaged = Path(shutil.copytree(tiny["stores"]["fp32"], tmp_path / "nan"))
    for values in damaged.glob(f"{SHARDS_DIR}/*/states/values"):
        array = zarr.open_array(values, mode="r+")
        array[...] = np.full(array.shape, np.nan, dtype=array.dtype)
    hits = [Hit(passage_id, 1.0) for passage_id in tiny["ids"]]
    odqa = OpenDomainReader(tiny["model"], open_store(damaged), StubSearcher(hits), OdqaSettings())
    with pytest.raises(DilstoreError, match=r"^passage '.*': its score is not finite, as its stored states hold NaN "
                                            r"or infinite values; `dilstore verify` checks the store$"):  # fmt: skip
        odqa.answer(QUESTION)


@pytest.mark.parametrize("head", [0, 1], ids=["start", "end"])
def test_logits_of_which_either_head_has_none_finite_are_named_not_answered_with_nothing(tiny: dict, head: int) -> None:
    """Finite start logits with no finite end logit (or the reverse) leave no span to score: an error naming the
    passage, as when both are NaN, not an empty answer; the stored states are finite, so it names the model's
    weights, not the store (mut51d)."""
    model = copy.deepcopy(tiny["model"])
    with torch.no_grad():
        model.model.qa_outputs.bias[head] = float("nan")
    hits = [Hit(passage_id, 1.0) for passage_id in tiny["ids"]]
    odqa = OpenDomainReader(model, open_store(tiny["stores"]["fp32"]), StubSearcher(hits), OdqaSettings())
    with pytest.raises(DilstoreError, match=r"^passage '.*': its score is not finite, though its stored states are "
                                            r"finite: the model's weights hold NaN or infinite values"):  # fmt: skip
        odqa.answer(QUESTION)


def test_a_question_typed_in_full_width_is_read_and_searched_as_the_plain_one(tiny: dict) -> None:
    """A question typed with a CJK input method (full-width letters, digits, punctuation and spaces) was all [UNK]
    word pieces and found no BM25 hit: no answer. It is folded (NFKC) before both; the answer names it as asked."""
    searched: list[str] = []

    class RecordingSearcher(StubSearcher):
        def search(self, query: str, k: int) -> list[Hit]:
            searched.append(query)
            return super().search(query, k)

    hits = [Hit(passage_id, float(len(tiny["ids"]) - rank)) for rank, passage_id in enumerate(tiny["ids"])]
    odqa = OpenDomainReader(tiny["model"], open_store(tiny["stores"]["fp32"]), RecordingSearcher(hits), OdqaSettings())
    wide = full_width(QUESTION)
    assert wide != QUESTION and "[UNK]" in tiny["model"].tokenizer.tokenize(wide)
    assert odqa.tokenize_question(wide).token_ids.tolist() == odqa.tokenize_question(QUESTION).token_ids.tolist()
    answered, plain = odqa.answer(wide), odqa.answer(QUESTION)
    assert searched == [QUESTION, QUESTION]
    assert answered.question == wide and answered.text == plain.text
    assert [(s.passage_id, s.reader_score) for s in answered.nbest] == [
        (s.passage_id, s.reader_score) for s in plain.nbest]


def test_whitespace_padding_does_not_make_a_question_long(tiny: dict) -> None:
    """A form that padded a nine-word question with 1,300 spaces had it refused as "at most 64 tokens" (serve46 F3)."""
    odqa = odqa_for(tiny)
    assert odqa.answer(QUESTION + " " * 1300 + "\n" * 200).text == odqa.answer(QUESTION).text
    # Read without the padding: 1 MB of spaces was tokenized whole, 13x the time of the question alone (review46 L3).
    padded = odqa.tokenize_question(" " * 10 + QUESTION + " " * 1_000_000)
    alone = odqa.tokenize_question(QUESTION)
    assert padded.token_ids.tolist() == alone.token_ids.tolist()
    assert padded.char_spans.tolist() == alone.char_spans.tolist(), "the question read is the one without padding"
    with pytest.raises(DilstoreError, match="characters long"):
        odqa.answer("x" * 1281 + " " * 10)


@pytest.mark.parametrize("question", [b"Who won?", None, 7])
def test_a_question_that_is_not_a_string_is_named_as_such(tiny: dict, question: object) -> None:
    """It was "the question is empty", which b"Who won?" is not."""
    with pytest.raises(DilstoreError, match=f"a question must be a string, got {type(question).__name__}$"):
        odqa_for(tiny).answer(question)  # type: ignore[arg-type]


def test_one_string_where_a_list_belongs_is_refused(tiny: dict) -> None:
    """answer_many("museum") answered six one-letter questions; read() listed letters as missing passage ids."""
    odqa = odqa_for(tiny)
    single = r"^questions must be a list of strings \(answer\(\) takes a single one\), got str"
    with pytest.raises(DilstoreError, match=single):
        odqa.answer_many(QUESTION)  # type: ignore[arg-type]
    with pytest.raises(DilstoreError, match="one list of passage ids .* per question, got str"):
        odqa.read([QUESTION], [tiny["ids"][0]])
    assert odqa.read([QUESTION], [[tiny["ids"][0]]])[0].spans


def test_any_iterable_is_a_list_and_none_is_named(tiny: dict) -> None:
    """answer_many(a generator) and answer_many(None) were TypeErrors from len(); read(questions, None) and
    passage_logits(question, "id") were a TypeError and one id per character."""
    odqa = odqa_for(tiny)
    generated = odqa.answer_many(question for question in [QUESTION])
    assert [answer.nbest for answer in generated] == [odqa.answer(QUESTION).nbest]
    read = odqa.read(iter([QUESTION]), (row for row in [[tiny["ids"][0]]]))
    assert read[0].spans == odqa.read([QUESTION], [[tiny["ids"][0]]])[0].spans
    for call, message in (
        (lambda: odqa.answer_many(None), "questions must be a list of strings .*, got NoneType None"),
        (lambda: odqa.read([QUESTION], None), "one list of passage ids .* per question, got NoneType None"),
        (lambda: odqa.read([QUESTION], [None]), "one list of passage ids .* per question, got NoneType None"),
        (lambda: odqa.passage_logits(QUESTION, tiny["ids"][0]), "passage_ids must be a list of passage ids, got str"),
    ):
        with pytest.raises(DilstoreError, match=message):
            call()


def test_missing_ids_raise_and_the_reader_survives(tiny: dict) -> None:
    odqa = odqa_for(tiny)
    with pytest.raises(MissingPassagesError, match="no-such-passage"):
        odqa.read([QUESTION], [[tiny["ids"][0], "no-such-passage"]])
    assert odqa.read([QUESTION], [[tiny["ids"][0]]])[0].spans


def test_a_store_made_by_another_model_is_refused(tiny: dict) -> None:
    store = open_store(tiny["stores"]["fp32"])
    with pytest.raises(FingerprintMismatchError, match="weights_sha256"):
        load_store_model(store, tiny["other_model_dir"])
    assert load_store_model(store, tiny["model_dir"]).layers == 1


def test_a_store_the_previously_shipped_reader_made_says_to_build_it_again(
    tiny: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    """(upgrade58 F2) The shipped reader was retrained between versions (its weights changed on 2026-11-26 and 27),
    so a store a user built with an older dilstore's default reader met, after the upgrade, only a fingerprint table
    of "a different model" in `ask`, `serve` and `evaluate-qa`, with nothing of why or what to do. A store whose
    command gave no --model, read with no --model, now says to build it again (its command with --overwrite) or to
    give --model the checkpoint that made it; with a --model given, the table is as it was."""
    from dilstore.reader.serving import store_checks

    store = open_store(tiny["stores"]["fp32"])
    command = "dilstore precompute --input corpus.jsonl --output store"
    store.manifest = dataclasses.replace(store.manifest, creation={**store.manifest.creation, "command": command,
                                                                   "finalized_at": "2026-11-25T10:00:00+00:00"})
    monkeypatch.setattr(store_checks, "default_checkpoint_dir", lambda: tiny["other_model_dir"])  # this version's
    with pytest.raises(FingerprintMismatchError, match="weights_sha256") as refused:
        load_store_model(store)
    assert str(refused.value).splitlines()[-1] == (
        "The store was built (2026-11-25T10:00:00+00:00) with the model its dilstore shipped, and this dilstore ships "
        f"another: build the store again with this one (`{command} --overwrite`), or give --model the checkpoint "
        "that made it")  # fmt: skip
    with pytest.raises(FingerprintMismatchError) as refused:
        load_store_model(store, tiny["other_model_dir"])  # a model the user chose: no advice about shipped ones
    assert "build the store again" not in str(refused.value)


@pytest.mark.parametrize(("command", "advised"), [
    ("dilstore precompute --input c.jsonl --output s", True),
    ("dilstore precompute --input c.jsonl --model ck --output s", False),
    ("dilstore precompute --input c.jsonl --model=-ck --output s", False),  # how a value opening with '-' is recorded
    ("dilstore precompute --input 'c d.jsonl --output s", True),  # a record shlex cannot split
])
def test_the_advice_about_shipped_models_follows_only_commands_without_a_model(command: str, advised: bool) -> None:
    """upgrade58 F2's advice ("build the store again ... or give --model") is for a store its dilstore's shipped
    model made; a recorded `--model=PATH` was taken for no --model, and a user's own model was called the shipped
    one."""
    from dilstore.reader.packaged.shipped import shipped_model_advice

    assert bool(shipped_model_advice({"command": command}, default_model=True)) is advised


def test_the_advice_about_shipped_models_names_the_commands_that_build_an_appended_or_compacted_store() -> None:
    """(read58b F1) A compacted store was told to run its compaction's command with --overwrite (`dilstore compact
    STORE --shards N --overwrite`: compact has no --overwrite, and a compaction copies the states it has), even when
    its precompute named --model; an appended store its first precompute alone, which dropped every appended
    passage; a recorded --overwrite was given twice. The advice now names the precompute under the compaction's
    record, with --overwrite once, and the appends' commands after it."""
    from dilstore.reader.packaged.shipped import shipped_model_advice

    first = "dilstore precompute --input a.jsonl --output s --overwrite"
    append = "dilstore precompute --input b.jsonl --output s --append"
    later = "dilstore precompute --input c.jsonl --output s --append"
    compacted = {"command": "dilstore compact s --shards 4",
                 "compacted_from": {"creation": {"command": first}, "appends": [{"command": append}]}}
    advice = shipped_model_advice(compacted, default_model=True, appends=[{"command": later}])
    assert f"build the store again with this one (`{first}`, then append as before: `{append}`; `{later}`)" in advice
    chosen = {**compacted, "compacted_from": {"creation": {"command": f"{first} --model ck"}, "appends": []}}
    assert shipped_model_advice(chosen, default_model=True) == ""


def test_a_pipe_in_the_index_folder_is_refused_before_the_jvm_starts(
    tiny: dict, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pipe in STORE/bm25 hung `ask`, `evaluate-qa` and `serve` for good, deaf to Ctrl-C and SIGTERM inside the
    Java call that opened it (hostile47 F1). It is refused before any Java runs: here the JVM may not start, so a
    lost check fails this test instead of hanging it."""
    from dilstore.reader import retrieval

    def jvm_started() -> None:
        raise AssertionError("the JVM started: Lucene would open the pipe and wait for a writer forever")

    monkeypatch.setattr(retrieval, "start_jvm", jvm_started)
    index = tmp_path / "bm25"
    index.mkdir()
    (index / "segments_1").write_bytes(b"")
    os.mkfifo(index / "_0.si")
    expected = rf"^the BM25 index {index} holds _0.si, which is not a file \(a pipe, socket or device\)"
    with pytest.raises(DilstoreError, match=expected):
        retrieval.Bm25Searcher(index)
    with pytest.raises(DilstoreError, match=expected):  # before the model loads
        open_reader(tiny["stores"]["fp32"], tiny["model_dir"], index_dir=index)


@pytest.mark.parametrize(("message", "expected"), [
    ('checksum failed (hardware problem?) : expected=b860e837 actual=e7f86ba8 (resource=BufferedChecksumIndexInput('
     'ByteBufferIndexInput(path="/s/bm25/_0_Lucene99_0.doc")))',
     "_0_Lucene99_0.doc: checksum failed (hardware problem?) : expected=b860e837 actual=e7f86ba8"),
    ("Problem reading index from MMapDirectory@/s/bm25 lockFactory=org.apache.lucene.store.NativeFSLockFactory@1698ee8 "
     "(resource=MMapDirectory@/s/bm25 lockFactory=org.apache.lucene.store.NativeFSLockFactory@1698ee8)",
     "Problem reading index from /s/bm25"),
    (None, "IndexOutOfBoundsException"),
])  # fmt: skip
def test_lucene_errors_read_as_the_file_and_what_is_wrong(message: str | None, expected: str) -> None:
    """Lucene's messages carried Java object dumps and no file name one could act on (hostile47 F10)."""
    from dilstore.reader.retrieval import lucene_reason

    assert lucene_reason("org.apache.lucene.index.CorruptIndexException" if message else
                         "java.lang.IndexOutOfBoundsException", message) == expected  # fmt: skip


def test_a_missing_index_is_a_clear_error(tiny: dict, tmp_path) -> None:
    with pytest.raises(DilstoreError, match="dilstore index"):
        open_reader(tiny["stores"]["fp32"], tiny["model_dir"], index_dir=tmp_path / "no-index")
    odqa = open_reader(tiny["stores"]["fp32"], tiny["model_dir"], with_index=False)
    with pytest.raises(DilstoreError, match="no BM25 index"):
        odqa.answer(QUESTION)


def test_a_reader_opened_again_keeps_the_model_of_an_equal_fingerprint_only(tiny: dict, tmp_path) -> None:
    """`serve` reopening a changed store loaded its model a second time; with `reuse`, an unchanged fingerprint
    keeps the loaded model, and another fingerprint (here another encoding) loads the one the store needs."""
    first = open_reader(tiny["stores"]["fp32"], tiny["model_dir"], with_index=False)
    again = open_reader(shutil.copytree(tiny["stores"]["fp32"], tmp_path / "copy"), tiny["model_dir"],
                        with_index=False, reuse=first)  # fmt: skip
    other = open_reader(tiny["stores"]["int8"], tiny["model_dir"], with_index=False, reuse=first)
    assert again.model is first.model
    assert other.model is not first.model
    ids = tiny["ids"][:2]
    fresh = open_reader(tiny["stores"]["fp32"], tiny["model_dir"], with_index=False)
    assert again.read([QUESTION], [ids])[0].spans == fresh.read([QUESTION], [ids])[0].spans


def test_a_question_limit_past_the_model_s_positions_is_refused_when_the_reader_opens(tiny: dict) -> None:
    """It was accepted, and the first long question, maybe late in an evaluation, stopped the run."""
    model = DilBertReader.from_pretrained(tiny["model_dir"])
    positions = model.fingerprinted_network()[0].max_position_embeddings
    settings = OdqaSettings(max_question_length=positions + 1)
    with pytest.raises(DilstoreError, match=f"question limit {positions + 1} .--max-question-length. is more than"):
        OpenDomainReader(model, open_store(tiny["stores"]["fp32"]), None, settings)
    settings = OdqaSettings(max_question_length=10**5000)  # a ValueError writing the message (num58 F1)
    with pytest.raises(DilstoreError, match="question limit int value too long to write out .--max-question-length."):
        OpenDomainReader(model, open_store(tiny["stores"]["fp32"]), None, settings)


def test_a_store_of_another_kind_is_named_before_its_missing_index(tmp_path) -> None:
    """`ask` on an EARL store said to build its BM25 index first, and only then that it is the wrong kind. (mut60
    M3) So do the checks `ask` and `evaluate-qa` run before torch loads (`check_reader_inputs`): without their kind
    check the command sent the user to `dilstore index` an EARL store, and no test noticed."""
    from dilstore.reader.serving.store_checks import check_reader_inputs

    earl = build_store(tmp_path / "earl", random_shards([2]), kind="earl-s1")
    with pytest.raises(DilstoreError, match="holds 'earl-s1' states; the QA reader needs a 'dilbert' store$"):
        open_reader(earl)
    with pytest.raises(DilstoreError, match="holds 'earl-s1' states; the QA reader needs a 'dilbert' store$"):
        check_reader_inputs(str(earl), None, None)


@pytest.mark.parametrize("options", [{"mu": 1.5}, {"mu": -0.1}, {"top_p": 0}, {"n_best": 0}, {"mu": 10**400},
                                     {"top_p": -(10**5000)}])
def test_bad_settings_are_refused(options: dict) -> None:
    """A mu past float's range raised OverflowError, and a top_p too long to write out ValueError, where each is
    refused by name (num58 F1)."""
    with pytest.raises(DilstoreError, match=f"{next(iter(options))} must be"):
        OdqaSettings(**options)


def test_every_stage_a_read_passes_through_is_timed_within_the_call(tiny: dict) -> None:
    """`total` is the stages' sum by definition; that the stages add up said nothing, and the decode, store_read
    and question_layers timers could be dropped with every test passing (tests36 1.2)."""
    odqa = odqa_for(tiny)
    started = time.perf_counter()
    timings = odqa.answer(QUESTION).timings.to_dict()
    wall = time.perf_counter() - started
    stages = {stage: seconds for stage, seconds in timings.items() if stage != "total"}
    assert set(stages) == {"retrieval", "store_read", "question_layers", "interaction_layers", "decode"}
    assert all(seconds > 0 for seconds in stages.values()), stages
    assert timings["total"] <= wall


@pytest.mark.parametrize("length", [0, 1, 2])
def test_a_question_limit_with_no_room_for_a_word_piece_is_refused(length: int) -> None:
    """[CLS] q [SEP] needs three tokens: a limit under that would read every question as no question at all."""
    with pytest.raises(DilstoreError, match=f"max_question_length must be at least 3, got {length}"):
        OdqaSettings(max_question_length=length)
    assert OdqaSettings(max_question_length=3).max_question_length == 3


def test_a_question_of_exactly_the_character_bound_goes_on_to_the_tokenizer(tiny: dict) -> None:
    """The cheap pre-check refuses only what is over limit × 20 characters: a question of exactly that many is read
    (one word over the tokenizer's word length is one unknown piece), and one character more is refused."""
    odqa = odqa_for(tiny)
    bound = odqa.settings.max_question_length * 20
    read = odqa.tokenize_question("x" * bound)
    assert read.token_ids.tolist() == odqa.tokenize_question("y" * 200).token_ids.tolist()
    with pytest.raises(DilstoreError, match=f"the question is {bound + 1} characters long"):
        odqa.tokenize_question("x" * (bound + 1))


@pytest.mark.parametrize("top_p", [[2], [2, 2, 2]])
def test_a_top_p_list_of_another_length_than_the_questions_is_refused(tiny: dict, top_p: list[int]) -> None:
    """One top_p per question: a list one short (or one long) is named, not zipped into fewer readings."""
    odqa = odqa_for(tiny)
    with pytest.raises(DilstoreError, match=f"got 2 questions but {len(top_p)} top_p values"):
        odqa.retrieve_and_read([QUESTION, QUESTION], top_p)
    assert len(odqa.retrieve_and_read([QUESTION, QUESTION], [2, 1])) == 2
