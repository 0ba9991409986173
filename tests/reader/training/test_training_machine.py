"""The training path runs on a machine with only torch and transformers: the lent GPU has no zarr, Beam, pyserini
or pyarrow, and a module-level import of any of them there costs a whole call.

Each command runs in a fresh interpreter in which those packages cannot be imported (`sys.modules[name] = None`
makes `import name` raise ImportError): `train qa` with shared normalisation and periodic checkpoints, `evaluate-rc`
on its output, and benchmarks/reader_curve.py over its checkpoints, as benchmarks/gpu_reader_schedule.py runs them.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fixtures.paths import ROOT
from tests.reader.training.test_shared_norm import write_handful_triples

ABSENT_ON_THE_GPU = ("zarr", "numcodecs", "apache_beam", "pyserini", "pyarrow", "dask")
# Runs argv[2:] as `dilstore ...` (argv[1] == "dilstore") or as the script argv[1], without ABSENT_ON_THE_GPU.
DRIVER = """
import runpy, sys
for name in {absent!r}:
    sys.modules[name] = None
target, sys.argv = sys.argv[1], [sys.argv[1], *sys.argv[2:]]
if target == "dilstore":
    runpy.run_module("dilstore", run_name="__main__")
else:
    runpy.run_path(target, run_name="__main__")
"""


def _run_without_absent(*argv: str) -> subprocess.CompletedProcess[str]:
    driver = DRIVER.format(absent=ABSENT_ON_THE_GPU)
    command = [sys.executable, "-c", driver, *argv]
    return subprocess.run(command, check=False, capture_output=True, text=True, cwd=ROOT, timeout=600)


@pytest.mark.parametrize("name", ABSENT_ON_THE_GPU)
def test_the_driver_hides_each_absent_package(name: str, tmp_path: Path) -> None:
    script = tmp_path / "imports.py"
    script.write_text(f"import {name}\n", encoding="utf-8")
    imported = _run_without_absent(str(script))
    assert imported.returncode != 0 and f"import of {name} halted" in imported.stderr


def test_train_evaluate_and_curve_need_none_of_the_absent_packages(
    tiny_base: Path, squad_file: Path, tmp_path: Path
) -> None:
    triples = write_handful_triples(tmp_path / "ranking", negatives=2)
    run = tmp_path / "run"
    trained = _run_without_absent(
        "dilstore", "train", "qa", "--model", str(tiny_base), "--layers", "1", "--train", str(squad_file),
        "--dev", str(squad_file), "--output", str(run), "--shared-norm", str(triples), "--shared-norm-negatives", "2",
        "--batch-size", "2", "--epochs", "2", "--save-every", "2", "--keep-checkpoints", "4", "--max-seq-length", "48",
        "--doc-stride", "16", "--max-question-length", "24", "--no-progress", "--json",
    )  # fmt: skip
    assert trained.returncode == 0, trained.stderr[-2000:]
    assert json.loads(trained.stdout.strip().splitlines()[-1])["k"] == 1
    assert any((run / "checkpoints").iterdir()), "periodic checkpoints were written"

    evaluated = _run_without_absent("dilstore", "evaluate-rc", "--model", str(run), "--data", str(squad_file), "--json")
    assert evaluated.returncode == 0, evaluated.stderr[-2000:]
    assert json.loads(evaluated.stdout.strip().splitlines()[-1])["questions"] == 6

    curve = _run_without_absent(
        str(ROOT / "benchmarks" / "reader_curve.py"), str(run), "--dev", str(squad_file), "--limit", "6",
        "--cache", str(tmp_path / "cache.json"),
    )  # fmt: skip
    assert curve.returncode == 0, curve.stderr[-2000:]
    assert "step" in curve.stdout
