"""The training path runs on a machine with only torch and transformers: the lent GPU has no zarr, Beam, pyserini
or pyarrow, and a module-level import of any of them there costs a whole call.

The commands run one after another in a fresh interpreter in which those packages cannot be imported
(`sys.modules[name] = None` makes `import name` raise ImportError): `train qa` with shared normalisation and periodic
checkpoints, `evaluate-rc` on its output, and benchmarks/reader_curve.py over its checkpoints, as
benchmarks/gpu_reader_schedule.py runs them.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.fixtures.paths import ROOT
from tests.fixtures.pipeline_fixtures import commands_in_one_process
from tests.reader.training.test_shared_norm import write_handful_triples

ABSENT_ON_THE_GPU = ("zarr", "numcodecs", "apache_beam", "pyserini", "pyarrow", "dask")


def _run_without_absent(*commands: list[str]) -> list[subprocess.CompletedProcess[str]]:
    """Each command's exit status and output, all run in one interpreter that cannot import ABSENT_ON_THE_GPU."""
    return commands_in_one_process(*commands, blocked=ABSENT_ON_THE_GPU)


@pytest.mark.parametrize("name", ABSENT_ON_THE_GPU)
def test_the_driver_hides_each_absent_package(name: str, tmp_path: Path) -> None:
    script = tmp_path / "imports.py"
    script.write_text(f"import {name}\n", encoding="utf-8")
    (imported,) = _run_without_absent([str(script)])
    assert imported.returncode != 0 and f"import of {name} halted" in imported.stderr


def test_train_evaluate_and_curve_need_none_of_the_absent_packages(
    tiny_base: Path, squad_file: Path, tmp_path: Path
) -> None:
    triples = write_handful_triples(tmp_path / "ranking", negatives=2)
    run = tmp_path / "run"
    trained, evaluated, curve = _run_without_absent(
        ["dilstore", "train", "qa", "--model", str(tiny_base), "--layers", "1", "--train", str(squad_file),
         "--dev", str(squad_file), "--output", str(run), "--shared-norm", str(triples), "--shared-norm-negatives", "2",
         "--batch-size", "2", "--epochs", "2", "--save-every", "2", "--keep-checkpoints", "4", "--max-seq-length",
         "48", "--doc-stride", "16", "--max-question-length", "24", "--no-progress", "--json"],
        ["dilstore", "evaluate-rc", "--model", str(run), "--data", str(squad_file), "--json"],
        [str(ROOT / "benchmarks" / "reader_curve.py"), str(run), "--dev", str(squad_file), "--limit", "6",
         "--cache", str(tmp_path / "cache.json")],
    )  # fmt: skip
    assert trained.returncode == 0, trained.stderr[-2000:]
    assert json.loads(trained.stdout.strip().splitlines()[-1])["k"] == 1
    assert any((run / "checkpoints").iterdir()), "periodic checkpoints were written"
    assert evaluated.returncode == 0, evaluated.stderr[-2000:]
    assert json.loads(evaluated.stdout.strip().splitlines()[-1])["questions"] == 6
    assert curve.returncode == 0, curve.stderr[-2000:]
    assert "step" in curve.stdout
