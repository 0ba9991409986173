"""README names every key a command's `--json` prints where it documents that output (json61 F3).

A script reads those objects by their keys; `evaluate-rc --score --json`'s `unanswered`, `compact --json`'s
`bm25_index`, `generation` and the `_before` counts, and all of `train ranking-data --json` were printed but named
nowhere, and `evaluate-rc --help` promised `k`, `seconds`, `reading` and `data`, which `--score` does not print.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

from dilstore.reader.data.ranking_data import RankingDataSummary
from dilstore.runners.cli import build_parser, main
from tests.fixtures.paths import ROOT
from tests.fixtures.store_fixtures import build_store, passage

SQUAD = {"version": "1.1", "data": [{"title": "t", "paragraphs": [{"context": "Paris is in France.", "qas": [
    {"id": "q1", "question": "Where is Paris?", "answers": [{"text": "France", "answer_start": 12}]}]}]}]}


def section(title: str) -> str:
    """README's `### title` section, up to the next heading of its level."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    return readme.split(f"\n### {title}\n", 1)[1].split("\n### ", 1)[0]


def printed_keys(capsys: pytest.CaptureFixture[str], *arguments: str) -> list[str]:
    """The keys of the JSON object `dilstore ARGUMENTS` prints."""
    capsys.readouterr()
    assert main(list(arguments)) == 0
    return list(json.loads(capsys.readouterr().out))


def test_readme_names_every_key_of_score_compact_and_ranking_data_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (data := tmp_path / "squad.json").write_text(json.dumps(SQUAD), encoding="utf-8")
    (predictions := tmp_path / "predictions.json").write_text(json.dumps({"q1": "France"}), encoding="utf-8")
    scored = printed_keys(capsys, "evaluate-rc", "--data", str(data), "--score", str(predictions), "--json")
    rng = np.random.default_rng(0)
    store = build_store(tmp_path / "store", [[passage(f"p{i}", 3, (8,), rng) for i in range(3)]])
    compacted = printed_keys(capsys, "compact", str(store), "--json")
    documented = {"`evaluate-rc`": scored, "`compact`": compacted,
                  "`train ranking-data`, `train earl`, `train cross-encoder`, `train siamese`, `train listformer`":
                  [field.name for field in dataclasses.fields(RankingDataSummary)]}  # fmt: skip
    missing = {title: [key for key in keys if f'"{key}"' not in section(title)] for title, keys in documented.items()}
    assert missing == dict.fromkeys(documented, [])
    rc_help = build_parser()._subparsers._group_actions[0].choices["evaluate-rc"].format_help()
    assert all(f'"{key}"' in " ".join(rc_help.split()) for key in scored)
