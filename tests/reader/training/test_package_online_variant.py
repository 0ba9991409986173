"""benchmarks/package_online_variant.py: a `--store-encoding` run packaged as a checkpoint's online layers.

Checked on a tiny run: the variant goes into a copy of the base (the base is
left alone), loads back through the store path's loader, and the model card
gets one section for the encoding, replaced (not repeated) when packaged
again; a run without `--store-encoding` is refused.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from dilstore.reader.modeling.dilbert import DilBertReader
from dilstore.reader.training.qa import TrainingConfig, train_qa
from tests.fixtures.benchmarks import benchmark_module
from tests.fixtures.qa_training_fixtures import SMALL_WINDOWS, assert_holds_the_online_layers_of


def evaluation(encoding: str, f1: float, variant: str | None = None, seed: int = 0) -> dict:
    """A mini_opensquad.py result of 300 questions; `variant`: the online layers it was read with (None: own)."""
    row = {"top_p": 29, "f1_with_bm25": f1, "f1_without_bm25": f1 - 2, "recall": 90.0}
    return {"encoding": encoding, "questions": 300, "seed": seed, "rows": [row], "model": {"online_variant": variant}}


def test_a_run_becomes_a_variant_beside_a_copy_of_the_base_with_one_card_section(
    tiny_base: Path, squad_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = DilBertReader.from_pretrained(tiny_base, layers=1).save_pretrained(tmp_path / "base")
    (base / "MODEL_CARD.md").write_text("# tiny reader\n\n## Notes\n\nbase card\n")
    config = TrainingConfig(layers=1, max_steps=2, batch_size=2, learning_rate=1e-3, log_every=1000,
                            freeze_lower=True, store_encoding="2bit", **SMALL_WINDOWS)  # fmt: skip
    train_qa(base, squad_file, tmp_path / "run", config, command="dilstore train qa (test)", progress=False)
    files = {}
    for name, result in (("tuned", evaluation("2bit", 61.0, "online-2bit")), ("plain", evaluation("2bit", 58.0)),
                         ("fp16", evaluation("fp16", 62.0))):  # fmt: skip
        files[name] = tmp_path / f"{name}.json"
        files[name].write_text(json.dumps(result))
    arguments = ["--checkpoint", str(tmp_path / "run"), "--base", str(base), "--into", str(tmp_path / "into"),
                 "--eval", str(files["tuned"]), "--baseline", str(files["plain"]), "--reference", str(files["fp16"])]
    with benchmark_module("package_online_variant") as script:
        assert script.main(arguments) == 0
        assert not (base / "online-2bit.safetensors").exists(), "the base is left alone"
        assert_holds_the_online_layers_of(tmp_path / "into", "2bit", tmp_path / "run", base)
        card = (tmp_path / "into" / "MODEL_CARD.md").read_text()
        assert card.startswith("# tiny reader") and "base card" in card
        assert card.count("## Online layers for 2bit stores") == 1
        assert "| tuned | 2bit | 29 | 61.0 | 59.0 | 90.0 |" in card and "| own | fp16 | 29 | 62.0 |" in card
        assert "dilstore train qa (test)" in card and "the same 300 questions (seed 0)" in card
        assert "step 2 of a 2-step schedule" in card
        files["tuned"].write_text(json.dumps(evaluation("2bit", 63.5, "online-2bit")))
        assert script.main(["--checkpoint", str(tmp_path / "run"), "--base", str(tmp_path / "into"),
                            "--eval", str(files["tuned"])]) == 0  # fmt: skip
        card = (tmp_path / "into" / "MODEL_CARD.md").read_text()
        assert card.count("## Online layers for 2bit stores") == 1 and "| tuned | 2bit | 29 | 63.5 |" in card
        assert "| 61.0 |" not in card and "base card" in card
        assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["encoding"] == "2bit"
        plain = TrainingConfig(layers=1, max_steps=1, batch_size=2, log_every=1000, **SMALL_WINDOWS)
        train_qa(base, squad_file, tmp_path / "plain-run", plain, command="test", progress=False)
        assert script.main(["--checkpoint", str(tmp_path / "plain-run"), "--base", str(base)]) == 2
        assert "was not trained with --store-encoding" in capsys.readouterr().err
        # The card said "the same 300 questions (seed 0)" of files scored on others, and "tuned" of a store read
        # without the variant; both are refused before anything is written.
        for name, result, message in (("plain", evaluation("2bit", 58.0, seed=7), "scored other questions"),
                                      ("tuned", evaluation("fp16", 61.0), "scored a fp16 store without")):  # fmt: skip
            files[name].write_text(json.dumps(result))
            assert script.main([*arguments[:4], "--into", str(tmp_path / f"into-{name}"), *arguments[6:]]) == 2
            assert message in capsys.readouterr().err and not (tmp_path / f"into-{name}").exists()
        files["tuned"].write_text(json.dumps(evaluation("2bit", 61.0, "online-2bit")))
        files["plain"].write_text(json.dumps({**evaluation("2bit", 58.0), "questions": [1, 2]}))
        assert script.main([*arguments[:4], "--into", str(tmp_path / "into-list"), *arguments[6:]]) == 2
        assert "its questions and seed must be whole numbers, not [1, 2] and 0" in capsys.readouterr().err


def test_a_checkpoint_refused_at_the_variant_leaves_no_into_behind(
    tiny_base: Path, squad_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A run that did not start from --base (its offline weights differ) left --into as a copy of the base
    without a variant, and the corrected rerun was refused because --into existed."""
    base = DilBertReader.from_pretrained(tiny_base, layers=1).save_pretrained(tmp_path / "base")
    other = DilBertReader.from_pretrained(tiny_base, layers=1)
    with torch.no_grad():
        other.model.bert.embeddings.word_embeddings.weight.add_(0.1)
    other = other.save_pretrained(tmp_path / "other")
    config = TrainingConfig(layers=1, max_steps=1, batch_size=2, log_every=1000, freeze_lower=True,
                            store_encoding="2bit", **SMALL_WINDOWS)  # fmt: skip
    train_qa(other, squad_file, tmp_path / "run", config, command="test", progress=False)
    into = tmp_path / "into"
    with benchmark_module("package_online_variant") as script:
        assert script.main(["--checkpoint", str(tmp_path / "run"), "--base", str(base), "--into", str(into)]) == 2
        assert "the tuned reader changed offline weights" in capsys.readouterr().err
        assert sorted(path.name for path in tmp_path.iterdir()) == ["base", "other", "run"]
        train_qa(base, squad_file, tmp_path / "run-from-base", config, command="test", progress=False)
        assert script.main(["--checkpoint", str(tmp_path / "run-from-base"), "--base", str(base),
                            "--into", str(into)]) == 0  # fmt: skip
        assert sorted(path.name for path in into.iterdir() if path.name.startswith("online-")) == [
            "online-2bit.safetensors"
        ]
        mask = os.umask(0)
        os.umask(mask)
        assert into.stat().st_mode & 0o777 == 0o777 & ~mask, "a folder as mkdir makes it, not mkdtemp's 0700"
