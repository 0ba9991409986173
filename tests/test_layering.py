"""Imports point only downward: runners → pipelines → reader → storage.

Parsed from the source with `ast`, so a lazy import inside a function counts
as much as one at the top of a module.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LAYERS = ("storage", "reader", "pipelines", "runners")
FORBIDDEN_THIRD_PARTY = {
    "storage": {"torch", "transformers", "apache_beam", "tokenizers", "safetensors"},
    "reader": {"apache_beam"},
    "pipelines": set(),
    "runners": set(),
}


def imported_top_levels(path: Path) -> set[str]:
    """Top-level module names a Python file imports (absolute imports only)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def layer_files(layer: str) -> list[Path]:
    return sorted((ROOT / layer).rglob("*.py"))


def test_every_layer_is_a_package() -> None:
    for layer in LAYERS:
        assert (ROOT / layer / "__init__.py").is_file(), f"{layer}/ is not a package"


@pytest.mark.parametrize("layer", LAYERS)
def test_imports_point_downward(layer: str) -> None:
    allowed_project = set(LAYERS[: LAYERS.index(layer) + 1])
    upward = set(LAYERS) - allowed_project
    problems = []
    for path in layer_files(layer):
        imported = imported_top_levels(path)
        for name in sorted(imported & upward):
            problems.append(f"{path.relative_to(ROOT)} imports {name} (upward)")
        for name in sorted(imported & FORBIDDEN_THIRD_PARTY[layer]):
            problems.append(f"{path.relative_to(ROOT)} imports {name} (forbidden in {layer}/)")
    assert not problems, "\n".join(problems)


def test_checker_sees_lazy_imports(tmp_path: Path) -> None:
    """The checker must catch an import hidden inside a function body."""
    module = tmp_path / "m.py"
    module.write_text("def f():\n    import torch\n    from apache_beam import io\n")
    assert imported_top_levels(module) == {"torch", "apache_beam"}
