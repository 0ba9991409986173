"""Stored passage states in fp16: how much the final logits move, on the real MiniLM with k=4.

The passages and questions are the first paragraph and question of three
SQuAD v1.1 dev articles (Wikipedia text, CC BY-SA 4.0). The packaged
all-MiniLM-L6-v2 has no QA head, so the head is DilBertReader's seeded
initialisation; a linear head scales logits and their change alike, so the
tolerance is stated relative to the spread of the logits as well as in
absolute terms.

Measured here (torch 2.13 CPU): max |Δ logit| = 1.1e-4 with a logit standard
deviation of 0.12, i.e. 9.2e-4 of the spread (recorded as test properties).
"""

from __future__ import annotations

import pytest
import torch

from dilstore.reader.modeling.checkpoints import base_model_dir
from dilstore.reader.modeling.dilbert import DilBertReader

PASSAGES = [
    "Super Bowl 50 was an American football game to determine the champion of the National Football League (NFL) "
    "for the 2015 season. The American Football Conference (AFC) champion Denver Broncos defeated the National "
    "Football Conference (NFC) champion Carolina Panthers 24–10 to earn their third Super Bowl title. The game was "
    "played on February 7, 2016, at Levi's Stadium in the San Francisco Bay Area at Santa Clara, California.",
    "One of the most famous people born in Warsaw was Maria Skłodowska-Curie, who achieved international "
    "recognition for her research on radioactivity and was the first female recipient of the Nobel Prize. Famous "
    "musicians include Władysław Szpilman and Frédéric Chopin.",
    "The Normans (Norman: Nourmands; French: Normands; Latin: Normanni) were the people who in the 10th and 11th "
    "centuries gave their name to Normandy, a region in France. They were descended from Norse (\"Norman\" comes "
    'from "Norseman") raiders and pirates from Denmark, Iceland and Norway who, under their leader Rollo, agreed '
    "to swear fealty to King Charles III of West Francia.",
]
QUESTIONS = [
    "Which NFL team represented the AFC at Super Bowl 50?",
    "What was Maria Curie the first female recipient of?",
    "In what country is Normandy located?",
]
# fp16 keeps 11 significant bits: states of magnitude up to ~10 move by up to ~3e-3 after rounding.
RELATIVE_TOLERANCE = 1e-2  # max |Δ logit| / std(logits)
ABSOLUTE_TOLERANCE = 1e-3  # max |Δ logit| with this head


def padded(sequences: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Ragged id lists → right-padded ids (b, n) and their 1/0 mask (b, n)."""
    length = max(len(sequence) for sequence in sequences)
    ids = torch.zeros((len(sequences), length), dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, sequence in enumerate(sequences):
        ids[row, : len(sequence)] = torch.tensor(sequence)
        mask[row, : len(sequence)] = 1
    return ids, mask


@pytest.mark.slow
def test_fp16_passage_states_barely_move_the_logits(record_property) -> None:
    reader = DilBertReader.from_pretrained(base_model_dir(), layers=4)
    tokenizer = reader.tokenizer
    question_ids, question_mask = padded([tokenizer(question)["input_ids"] for question in QUESTIONS])
    passage_ids, passage_mask = padded(
        [tokenizer(passage, add_special_tokens=False)["input_ids"] + [tokenizer.sep_token_id] for passage in PASSAGES]
    )
    with torch.no_grad():
        question_states = reader.encode_questions(question_ids, question_mask)  # (3, nq, 384)
        passage_states = reader.encode_passages(passage_ids, passage_mask)  # (3, np, 384)
        exact = reader.interact(question_states, question_mask, passage_states, passage_mask)
        stored = passage_states.to(torch.float16).to(torch.float32)  # (3, np, 384), the fp16 store round trip
        rounded = reader.interact(question_states, question_mask, stored, passage_mask)
    valid = torch.cat([question_mask, passage_mask], dim=1).bool()  # (3, nq + np)
    change = max(float((before - after).abs()[valid].max()) for before, after in zip(exact, rounded))
    spread = float(torch.cat([logits[valid] for logits in exact]).std())
    record_property("fp16_max_abs_logit_change", change)
    record_property("logit_std", spread)
    assert float((stored - passage_states).abs().max()) > 0, "fp16 rounding must actually change the states"
    assert change < ABSOLUTE_TOLERANCE, f"max |Δ logit| = {change:.2e} ≥ {ABSOLUTE_TOLERANCE:.0e}"
    assert change / spread < RELATIVE_TOLERANCE, (
        f"max |Δ logit| / std(logits) = {change:.2e} / {spread:.3f} = {change / spread:.2e} ≥ {RELATIVE_TOLERANCE:.0e}"
    )
