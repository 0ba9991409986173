"""The project installs as one `dilstore` package: a wheel holds `dilstore/` and its dist-info only.

Generic top-level names (`storage`, `reader`, `pipelines`, `runners`) would
collide with other packages in site-packages, so setup.py maps the layer
folders under `dilstore.`; this builds a real wheel and looks inside it.
"""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.fixtures.paths import ROOT


@pytest.mark.slow
def test_the_wheel_holds_only_dilstore_with_its_layers_and_shipped_models(tmp_path: Path) -> None:
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
         "--disable-pip-version-check", "--wheel-dir", str(tmp_path), str(ROOT)],
        check=True, capture_output=True, timeout=600,
    )  # fmt: skip
    (wheel,) = tmp_path.glob("dilstore-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    top_levels = {name.split("/")[0] for name in names}
    assert top_levels == {"dilstore", f"{wheel.name.split('-')[0]}-{wheel.name.split('-')[1]}.dist-info"}
    for module in ("api.py", "__main__.py", "storage/reader.py", "reader/serving/odqa.py",
                   "pipelines/precompute.py", "runners/cli.py", "reader/packaged/shipped.py"):  # fmt: skip
        assert f"dilstore/{module}" in names
    for model in ("dilbert-minilm-squad", "earl-minilm-squad", "listformer-minilm-squad"):
        assert f"dilstore/reader/models/{model}/model.safetensors" in names
        assert f"dilstore/reader/models/{model}/config.json" in names


def test_python_m_dilstore_is_the_dilstore_command() -> None:
    command = Path(sys.executable).with_name("dilstore")
    for arguments in (["--help"], ["precompute", "--help"], ["info", "--help"]):
        module = subprocess.run([sys.executable, "-m", "dilstore", *arguments], capture_output=True, text=True)
        script = subprocess.run([str(command), *arguments], capture_output=True, text=True)
        assert module.returncode == script.returncode == 0
        assert module.stdout == script.stdout
