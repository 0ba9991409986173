"""Shared normalisation for `train qa --shared-norm`: the question groups, the loss, and what training gives.

The tiny random reader and the handful of SQuAD questions (tests/fixtures/qa_training_fixtures.py);
each question's negatives are other paragraphs of the handful, written as `train ranking-data` triples.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dilstore.reader.data.qa_batches import QABatch, collate_features
from dilstore.reader.data.qa_features import question_features
from dilstore.reader.data.ranking_data import SUMMARY_FILE
from dilstore.reader.data.ranking_files import PARAGRAPHS_FILE, TRIPLES_FILE, Triple, write_paragraphs, write_triples
from dilstore.reader.data.shared_norm import shared_norm_groups
from dilstore.reader.data.squad import load_squad
from dilstore.reader.modeling.dilbert import DilBertReader
from dilstore.reader.training.qa import TrainingConfig, TrainingData, load_training_data, shared_norm_loss, train_qa
from dilstore.runners.cli import main
from dilstore.storage.errors import DilstoreError
from tests.fixtures.earl_tiny import tokenizer as minilm_tokenizer
from tests.fixtures.qa_training_fixtures import HANDFUL, SMALL_WINDOWS
from tests.fixtures.training_runs import cut_after_last_checkpoint

NEGATIVES = 2


def write_handful_triples(directory: Path, negatives: int = NEGATIVES, skip: str | None = None) -> Path:
    """Triples whose negatives are the next `negatives` paragraphs of the handful (`skip`: a question left out)."""
    directory.mkdir(parents=True, exist_ok=True)
    paragraphs = {f"p{index}": context for index, (context, _) in enumerate(HANDFUL)}
    triples = [
        Triple(qid, question, f"p{index}", tuple(f"p{(index + j) % len(HANDFUL)}" for j in range(1, negatives + 1)))
        for index, (_, questions) in enumerate(HANDFUL)
        for qid, question, _ in questions
        if qid != skip
    ]
    write_paragraphs(directory / PARAGRAPHS_FILE, paragraphs)
    write_triples(directory / TRIPLES_FILE, triples)
    return directory / TRIPLES_FILE


def reference_loss(start: torch.Tensor, end: torch.Tensor, batch: QABatch, group_size: int) -> torch.Tensor:
    """Group by group: the passage-token logits of all its windows in one list, −log softmax at the answer."""
    width = batch.question_ids.shape[1]
    losses = []
    for group in range(start.shape[0] // group_size):
        rows = range(group * group_size, (group + 1) * group_size)
        for logits, targets in ((start, batch.start_targets), (end, batch.end_targets)):
            pieces = [logits[row, width:][batch.passage_mask[row].bool()] for row in rows]
            gold = int(targets[rows[0]]) - width  # the answer sits in the group's first window
            losses.append(-torch.log_softmax(torch.cat(pieces), dim=0)[gold])
    return torch.stack(losses).mean()


@settings(max_examples=25, deadline=None)
@given(
    groups=st.integers(1, 3),
    group_size=st.integers(2, 4),
    question_width=st.integers(2, 5),
    passage_lengths=st.lists(st.integers(2, 9), min_size=12, max_size=12),
    seed=st.integers(0, 1000),
)
def test_the_loss_is_one_softmax_over_the_passage_tokens_of_each_group(
    groups: int, group_size: int, question_width: int, passage_lengths: list[int], seed: int
) -> None:
    rows = groups * group_size
    lengths = torch.tensor(passage_lengths[:rows])
    generator = torch.Generator().manual_seed(seed)
    width = int(lengths.max())
    passage_mask = (torch.arange(width) < lengths[:, None]).long()  # (rows, np)
    starts = torch.tensor([question_width + int(torch.randint(0, int(n), (1,), generator=generator)) for n in lengths])
    batch = QABatch(
        question_ids=torch.zeros(rows, question_width, dtype=torch.long),
        question_mask=torch.ones(rows, question_width, dtype=torch.long),
        passage_ids=torch.zeros(rows, width, dtype=torch.long),
        passage_mask=passage_mask,
        start_targets=starts,
        end_targets=starts,
    )
    start = torch.randn(rows, question_width + width, generator=generator) * 3
    end = torch.randn(rows, question_width + width, generator=generator) * 3
    got = shared_norm_loss(start, end, batch, group_size)
    torch.testing.assert_close(got, reference_loss(start, end, batch, group_size), atol=1e-5, rtol=1e-5)


def _handful_groups(squad_file: Path, tmp_path: Path):
    """The handful's shared-norm groups (NEGATIVES each), with the tokenizer, examples and windowing that made them."""
    triples = write_handful_triples(tmp_path)
    tokenizer = minilm_tokenizer()
    examples = load_squad(squad_file)
    windows = TrainingConfig(layers=1, **SMALL_WINDOWS)
    groups = shared_norm_groups(tokenizer, examples, triples, triples.parent / PARAGRAPHS_FILE, NEGATIVES, windows)
    return tokenizer, examples, windows, groups


def test_a_group_is_the_answer_window_then_each_negatives_first_window(squad_file: Path, tmp_path: Path) -> None:
    _, examples, _, groups = _handful_groups(squad_file, tmp_path)
    assert len(groups) == len(examples) == 6
    by_context = {context: index for index, (context, _) in enumerate(HANDFUL)}
    for example, group in zip(examples, groups, strict=True):
        assert len(group) == 1 + NEGATIVES
        assert group[0].has_answer and group[0].context == example.context
        own = by_context[example.context]
        assert [by_context[window.context] for window in group[1:]] == [(own + j) % len(HANDFUL) for j in (1, 2)]
        assert all(not window.has_answer and window.window_index == 0 for window in group[1:])
        assert all(window.question.token_ids.tolist() == group[0].question.token_ids.tolist() for window in group)
    keeper = next(group for group in groups if group[0].example_id == "q-keeper")
    assert keeper[0].window_index > 0, "the answer window, not the paragraph's first"


def test_training_data_refuses_a_group_whose_first_window_has_no_answer(squad_file: Path, tmp_path: Path) -> None:
    """The loss takes its target from a group's first window, so the data are checked once, not at every step."""
    _, _, _, groups = _handful_groups(squad_file, tmp_path)
    flipped = [groups[0], [*groups[1][1:], groups[1][0]], *groups[2:]]
    TrainingData([window for group in groups for window in group], len(groups), 0, group_size=1 + NEGATIVES)
    with pytest.raises(DilstoreError, match=rf"group 1 \(question {groups[1][0].example_id!r}\).*must hold the answer"):
        TrainingData([window for group in flipped for window in group], len(groups), 0, group_size=1 + NEGATIVES)


def test_groups_hold_the_windows_that_one_call_per_text_gives(squad_file: Path, tmp_path: Path) -> None:
    """The batched tokenization of shared_norm_groups changes no window: each equals question_features' own."""
    tokenizer, examples, windows, groups = _handful_groups(squad_file, tmp_path)
    sizes = {key: getattr(windows, key) for key in ("max_seq_length", "doc_stride", "max_question_length")}
    for example, group in zip(examples, groups, strict=True):
        own = question_features(tokenizer, example.id, example.question, example.context, example.answers[0], **sizes)
        expected = [next(window for window in own if window.has_answer)]
        expected += [
            question_features(tokenizer, example.id, example.question, window.context, None, **sizes)[0]
            for window in group[1:]
        ]
        for got, want in zip(group, expected, strict=True):
            assert (got.example_id, got.window_index, got.context) == (want.example_id, want.window_index, want.context)
            assert (got.start_position, got.end_position) == (want.start_position, want.end_position)
            for part in ("question", "passage"):
                assert getattr(got, part).token_ids.tolist() == getattr(want, part).token_ids.tolist()
                assert getattr(got, part).char_spans.tolist() == getattr(want, part).char_spans.tolist()


def test_a_question_without_a_triple_is_named(squad_file: Path, tmp_path: Path) -> None:
    triples = write_handful_triples(tmp_path, skip="q-cafe-price")
    config = TrainingConfig(layers=1, shared_norm=str(triples), shared_norm_negatives=NEGATIVES, **SMALL_WINDOWS)
    with pytest.raises(DilstoreError, match="question 'q-cafe-price' has no triple in"):
        load_training_data(minilm_tokenizer(), squad_file, config)
    with pytest.raises(DilstoreError, match="shared-norm-negatives must be at least 1"):
        TrainingConfig(layers=1, shared_norm=str(triples), shared_norm_negatives=0)


def test_triples_of_another_ranking_data_run_than_their_paragraphs_are_refused(
    squad_file: Path, tmp_path: Path
) -> None:
    """The rankers refused a pair that the ranking_data.json beside it does not describe; --shared-norm read it
    (review46 L1)."""
    triples = write_handful_triples(tmp_path)
    (tmp_path / SUMMARY_FILE).write_text(json.dumps({"triples_sha256": "0" * 64}), encoding="utf-8")
    config = TrainingConfig(layers=1, shared_norm=str(triples), shared_norm_negatives=NEGATIVES, **SMALL_WINDOWS)
    with pytest.raises(DilstoreError, match=f"^{triples} is not the file {tmp_path / SUMMARY_FILE} describes"):
        load_training_data(minilm_tokenizer(), squad_file, config)


def test_training_with_shared_norm_ranks_the_answer_paragraph_first(
    tiny_base: Path, squad_file: Path, tmp_path: Path
) -> None:
    """After training, each question's best span score is in its own paragraph, not in a negative one.

    60 epochs end at a loss ratio of 0.006 and the answer paragraph ahead by 6.8 to 21 (120 took twice as long for
    margins of 12.8 to 19); trained without shared norm, either count leaves some question's best span in a negative
    paragraph, so the check still tells them apart."""
    triples = write_handful_triples(tmp_path / "triples")
    config = TrainingConfig(layers=1, epochs=60, batch_size=6, learning_rate=1e-2, warmup_ratio=0.05, seed=3,
                            log_every=1000, shared_norm=str(triples), shared_norm_negatives=NEGATIVES,
                            **SMALL_WINDOWS)  # fmt: skip
    result = train_qa(tiny_base, squad_file, tmp_path / "run", config, command="test", progress=False)
    assert sum(result.losses[-5:]) < 0.2 * sum(result.losses[:5])
    assert result.train_features == 6 and result.features_seen == 6 * 60
    data = load_training_data(result.reader.tokenizer, squad_file, config)
    reader = DilBertReader.from_pretrained(tmp_path / "run")
    for index in range(data.examples):
        batch = collate_features(data.windows(index), data.pad_token_id)
        with torch.no_grad():
            start, end = reader(batch.question_ids, batch.question_mask, batch.passage_ids, batch.passage_mask)
        width = batch.question_ids.shape[1]
        passage = batch.passage_mask.bool()
        best = [float((start[row, width:][passage[row]]).max() + (end[row, width:][passage[row]]).max())
                for row in range(len(passage))]  # fmt: skip
        assert best[0] > max(best[1:]), data.windows(index)[0].example_id


def test_cli_reports_a_missing_triples_file(tmp_path: Path, squad_file: Path, capsys) -> None:
    missing = tmp_path / "nope.jsonl.gz"
    status = main(["train", "qa", "--layers", "1", "--train", str(squad_file), "--shared-norm", str(missing),
                   "--output", str(tmp_path / "o")])  # fmt: skip
    assert status == 2
    assert f"--shared-norm {missing}: no such file" in capsys.readouterr().err


def test_a_group_is_as_long_as_its_longest_window_or_with_sum_all_of_them(squad_file: Path, tmp_path: Path) -> None:
    triples = write_handful_triples(tmp_path)
    tokenizer = minilm_tokenizer()
    grouped = load_training_data(tokenizer, squad_file, TrainingConfig(
        layers=1, shared_norm=str(triples), shared_norm_negatives=NEGATIVES, **SMALL_WINDOWS))  # fmt: skip
    tokens = [[len(window.question) + len(window.passage) for window in grouped.windows(index)]
              for index in range(grouped.examples)]  # fmt: skip
    assert grouped.lengths() == grouped.lengths("longest") == [max(group) for group in tokens]
    assert grouped.lengths("sum") == [sum(group) for group in tokens]
    assert grouped.lengths("longest") != grouped.lengths("sum")
    plain = load_training_data(tokenizer, squad_file, TrainingConfig(layers=1, **SMALL_WINDOWS))
    assert plain.lengths("longest") == plain.lengths("sum"), "one window per example: the same order as before"
    with pytest.raises(DilstoreError, match="group-length must be one of longest, sum"):
        TrainingConfig(layers=1, group_length="median")


def test_a_run_from_before_group_length_resumes_only_with_the_sum(
    tiny_base: Path, squad_file: Path, tmp_path: Path
) -> None:
    """Its run_config.json has no group_length: it grouped by the sum, and resuming with another order would see
    some groups twice and others never in that epoch, so --resume refuses until told --group-length sum."""
    triples = write_handful_triples(tmp_path / "triples")
    config = TrainingConfig(layers=1, epochs=1, max_steps=3, batch_size=2, save_every=1, log_every=1000,
                            shared_norm=str(triples), shared_norm_negatives=NEGATIVES, group_length="sum",
                            **SMALL_WINDOWS)  # fmt: skip
    run = tmp_path / "run"
    train_qa(tiny_base, squad_file, run, config, command="c", progress=False)  # checkpoints at steps 1 and 2
    cut_after_last_checkpoint(run)
    record = json.loads((run / "run_config.json").read_text())
    del record["config"]["group_length"]
    (run / "run_config.json").write_text(json.dumps(record))
    with pytest.raises(DilstoreError, match=r"settings differ .*: --group-length longest \(the run had sum\)$"):
        train_qa(tiny_base, squad_file, run, replace(config, group_length="longest"), command="c", resume=True,
                 progress=False)  # fmt: skip
    resumed = train_qa(tiny_base, squad_file, run, config, command="c", resume=True, progress=False)
    assert resumed.steps == 3


def test_a_plain_run_from_before_group_length_resumes_as_it_is(
    tiny_base: Path, squad_file: Path, tmp_path: Path
) -> None:
    """One window per example measures the same by either length, so an older plain run resumes unchanged."""
    config = TrainingConfig(layers=1, epochs=1, max_steps=3, batch_size=2, save_every=1, log_every=1000,
                            **SMALL_WINDOWS)  # fmt: skip
    train_qa(tiny_base, squad_file, tmp_path, config, command="c", progress=False)
    cut_after_last_checkpoint(tmp_path)
    record = json.loads((tmp_path / "run_config.json").read_text())
    del record["config"]["group_length"]
    (tmp_path / "run_config.json").write_text(json.dumps(record))
    assert train_qa(tiny_base, squad_file, tmp_path, config, command="c", resume=True, progress=False).steps == 3


def test_cli_group_length_reaches_the_run(tiny_base: Path, squad_file: Path, tmp_path: Path) -> None:
    triples = write_handful_triples(tmp_path / "triples")
    for measure in ("sum", None):
        output = tmp_path / f"run-{measure}"
        argv = ["train", "qa", "--model", str(tiny_base), "--layers", "1", "--train", str(squad_file),
                "--shared-norm", str(triples), "--shared-norm-negatives", str(NEGATIVES), "--max-steps", "1",
                "--batch-size", "2", "--max-seq-length", "48", "--doc-stride", "16", "--max-question-length", "24",
                "--output", str(output), "--no-progress", "--json"]  # fmt: skip
        assert main(argv + (["--group-length", measure] if measure else [])) == 0
        recorded = json.loads((output / "run_config.json").read_text())["config"]["group_length"]
        assert recorded == (measure or "longest")
