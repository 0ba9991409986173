"""The project installs as one `dilstore` package: a wheel holds `dilstore/` and its dist-info only.

Generic top-level names (`storage`, `reader`, `pipelines`, `runners`) would
collide with other packages in site-packages, so setup.py maps the layer
folders under `dilstore.`; this builds a real wheel and looks inside it.
"""

from __future__ import annotations

import importlib.metadata
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.fixtures.paths import ROOT

# What a wheel build must not see (or write into): the checkout's environment, caches and build outputs.
_NOT_SOURCE = (".venv", ".git", "build", "dist", "*.egg-info", ".pytest_cache", ".hypothesis", "__pycache__",
               "dilstore-store")  # fmt: skip


def _copy_with_stand_in_weights(source: str, target: str) -> str:
    """shutil.copytree's copy of one file, a few bytes in place of a checkpoint's weights."""
    if source.endswith(".safetensors"):
        Path(target).write_bytes(b"weights stand-in")
        return target
    return shutil.copy2(source, target)


@pytest.mark.slow
def test_the_wheel_holds_only_dilstore_with_its_layers_and_shipped_models(tmp_path: Path) -> None:
    """Built from a copy of the sources: a build in the checkout itself writes dilstore.egg-info there, which
    tests running beside it would read as the installed package's metadata while it is half written. The copy's
    `.safetensors` files are a few bytes each: packaging picks files by name (pyproject.toml's package-data), and
    zipping the real 105 MB of weights took two thirds of the build."""
    source = tmp_path / "source"
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(*_NOT_SOURCE),
                    copy_function=_copy_with_stand_in_weights)  # fmt: skip
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
         "--disable-pip-version-check", "--wheel-dir", str(tmp_path / "wheels"), str(source)],
        check=True, capture_output=True, timeout=600,
    )  # fmt: skip
    (wheel,) = (tmp_path / "wheels").glob("dilstore-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    top_levels = {name.split("/")[0] for name in names}
    assert top_levels == {"dilstore", f"{wheel.name.split('-')[0]}-{wheel.name.split('-')[1]}.dist-info"}
    for module in ("api.py", "__main__.py", "storage/reader.py", "reader/serving/odqa.py",
                   "pipelines/precompute.py", "runners/cli.py", "reader/packaged/shipped.py", "py.typed"):  # fmt: skip
        assert f"dilstore/{module}" in names
    for model in ("dilbert-minilm-squad", "earl-minilm-squad", "listformer-minilm-squad"):
        assert f"dilstore/reader/models/{model}/model.safetensors" in names
        assert f"dilstore/reader/models/{model}/config.json" in names


def test_python_m_dilstore_is_the_dilstore_command() -> None:
    command = Path(sys.executable).with_name("dilstore")
    for arguments in (["--help"], ["precompute", "--help"], ["info", "--help"], ["--version"]):
        module = subprocess.run([sys.executable, "-m", "dilstore", *arguments], capture_output=True, text=True)
        script = subprocess.run([str(command), *arguments], capture_output=True, text=True)
        assert module.returncode == script.returncode == 0
        assert module.stdout == script.stdout
    # A bug report can say which build it ran (cli43 L6): the installed package's version.
    assert script.stdout == f"dilstore {importlib.metadata.version('dilstore')}\n"
    import dilstore

    assert dilstore.__version__ == importlib.metadata.version("dilstore")
