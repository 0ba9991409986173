"""Imports point only downward, between the layers and between the reader's sub-packages.

Parsed from the source with `ast`, so a lazy import inside a function counts
as much as one at the top of a module. The graphs below are ARCHITECTURE.md's
layers written down:

- layers: the public API (`dilstore/`: `import dilstore`, `dilstore.api`) → runners → pipelines → reader → storage,
  all under `dilstore.`;
  storage imports no torch or Beam, reader no Beam;
- the reader by role: text, batching, packaged, quiet_mode, threads and retrieval at the bottom;
  modeling over them; offline and data beside it; serving over modeling and
  offline; training and evaluation on top. Serving never imports training,
  and nothing imports serving but evaluation and the runners;
- pipelines use only the reader's offline half (and what it stands on);
- and along whole chains of imports, module by module: training never reaches serving, nor serving
  training, nor pipelines and the offline half serving, training, evaluation or data.
"""

from __future__ import annotations

import ast
import functools
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fixtures.paths import ROOT

LAYERS = ("storage", "reader", "pipelines", "runners", "api")
# The public API is the package's own folder: `dilstore/__init__.py` and `dilstore/api.py` (a checkout may link the
# other layers into it, so only its own files count).
API_FOLDER = "dilstore"
# The only libraries storage/ may import besides the standard library (ARCHITECTURE.md: numpy/zarr/pyarrow), so a
# new one is a decision and not a drift: pyarrow writes the passage tables, scipy trains codebooks, fsspec and
# aiohttp read stores at URLs.
STORAGE_LIBRARIES = {"numpy", "zarr", "numcodecs", "pyarrow", "scipy", "fsspec", "aiohttp"}
FORBIDDEN_THIRD_PARTY = {
    "storage": {"torch", "transformers", "apache_beam", "tokenizers", "safetensors"},
    "reader": {"apache_beam"},
    "pipelines": set(),
    "runners": set(),
    "api": set(),
}
# Which reader sub-packages (or top modules) each may import, besides itself.
READER_GRAPH: dict[str, set[str]] = {
    "text": set(),
    "batching": set(),
    "packaged": set(),
    "quiet_mode": set(),
    "progress_lines": set(),
    "threads": set(),
    "retrieval": {"quiet_mode"},
    "modeling": {"text", "batching"},
    "data": {"text", "batching", "retrieval"},
    "offline": {"modeling", "packaged", "text", "batching", "threads"},
    "serving": {"modeling", "offline", "packaged", "data", "retrieval", "text", "batching"},
    "training": {"modeling", "packaged", "data", "evaluation", "text", "batching", "progress_lines"},
    "evaluation": {"serving", "modeling", "packaged", "data", "retrieval", "text", "batching", "progress_lines"},
}
# What pipelines may use of the reader: the offline half and what it stands on.
PIPELINES_MAY_USE = {"offline", "packaged", "text", "batching"}


def imported_modules(path: Path, root: Path = ROOT) -> set[str]:
    """Absolute module names a Python file under `root` (the dilstore namespace's folder) imports.

    `from a.b import c` gives a.b and a.b.c (c may be a module: `from dilstore import runners`, which gives only
    dilstore.runners, so that the package's name alone stands for `import dilstore`, the public API); a relative
    import is resolved against the file's own package (`from ..pipelines import job` in storage/ gives
    dilstore.pipelines and dilstore.pipelines.job).
    """
    return set(_modules_imported_by(path.read_text(encoding="utf-8"), str(path), path.relative_to(root).parent.parts))


@functools.cache
def _modules_imported_by(text: str, filename: str, folders: tuple[str, ...]) -> frozenset[str]:
    """`imported_modules` of a file's text in the package of `folders` under dilstore: parsed once per text (the
    tests ask again for the same files, layer by layer and part by part)."""
    tree = ast.parse(text, filename=filename)
    package = ["dilstore", *folders]
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join([*base, *(node.module.split(".") if node.module else [])])
            names.update({module} if node.module and module != "dilstore" else set())
            names.update(f"{module}.{alias.name}" for alias in node.names)
    return frozenset(names)


def imported_top_levels(path: Path, root: Path = ROOT) -> set[str]:
    """Top-level module names a Python file imports (`dilstore` for a relative import)."""
    return {name.split(".")[0] for name in imported_modules(path, root)}


def imported_layers(path: Path, root: Path = ROOT) -> set[str]:
    """The dilstore layers (`dilstore.storage` → storage) a file imports; `dilstore` itself, `dilstore.api` and any
    other name under the package (`from dilstore import precompute`) are the public API, the top layer."""
    return {layer_of(name) for name in imported_modules(path, root) if name.split(".")[0] == "dilstore"}


def layer_of(module: str) -> str:
    """The layer a `dilstore…` module name belongs to."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in LAYERS[:-1] else "api"


def reader_part(module: str) -> str | None:
    """The reader sub-package (or top module) of `dilstore.reader.X…`, None for other modules."""
    parts = module.split(".")
    return parts[2] if len(parts) > 2 and parts[:2] == ["dilstore", "reader"] else None


def layer_files(layer: str) -> list[Path]:
    if layer == "api":
        return sorted((ROOT / API_FOLDER).glob("*.py"))
    return sorted((ROOT / layer).rglob("*.py"))


def test_every_layer_is_a_package() -> None:
    for layer in LAYERS:
        folder = API_FOLDER if layer == "api" else layer
        assert (ROOT / folder / "__init__.py").is_file(), f"{folder}/ is not a package"
    assert {path.name for path in layer_files("api")} >= {"__init__.py", "api.py"}


@pytest.mark.parametrize("layer", LAYERS)
def test_imports_point_downward(layer: str) -> None:
    allowed_project = set(LAYERS[: LAYERS.index(layer) + 1])
    upward = set(LAYERS) - allowed_project
    problems = []
    for path in layer_files(layer):
        top_levels = imported_top_levels(path)
        for name in sorted(top_levels & set(LAYERS)):
            problems.append(f"{path.relative_to(ROOT)} imports {name} outside the dilstore namespace")
        for name in sorted(imported_layers(path) & upward):
            problems.append(f"{path.relative_to(ROOT)} imports dilstore.{name} (upward)")
        for name in sorted(top_levels & FORBIDDEN_THIRD_PARTY[layer]):
            problems.append(f"{path.relative_to(ROOT)} imports {name} (forbidden in {layer}/)")
    assert not problems, "\n".join(problems)


def test_storage_imports_only_its_listed_libraries() -> None:
    problems = []
    for path in layer_files("storage"):
        for name in sorted(imported_top_levels(path) - sys.stdlib_module_names - STORAGE_LIBRARIES - {"dilstore"}):
            problems.append(f"{path.relative_to(ROOT)} imports {name}, not in STORAGE_LIBRARIES")
    assert not problems, "\n".join(problems)


def test_reading_a_store_imports_no_scipy_nor_aiohttp() -> None:
    """k-means is for training a codebook; every command that only reads a store paid scipy's import for it. aiohttp
    is for stores at a URL: the checked HTTP reads (stale54 F1) imported it, 0.2 s, at every local store's open."""
    code = ("import sys, dilstore.storage.reader, dilstore.storage.verify; "
            "print([name for name in ('scipy', 'aiohttp') if name in sys.modules])")  # fmt: skip
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert done.stdout.strip() == "[]"


def test_describing_a_store_imports_no_zarr(tmp_path: Path) -> None:
    """`dilstore info` reads the manifest only; importing zarr for it was a third of its time (perf49 F4)."""
    from tests.fixtures.store_fixtures import build_store, random_shards

    store = build_store(tmp_path / "store", random_shards([2, 1]))
    code = ("import sys; from dilstore.runners import cli; status = cli.main(['info', sys.argv[1], '--json']); "
            "print(status, 'zarr' in sys.modules)")  # fmt: skip
    done = subprocess.run([sys.executable, "-c", code, str(store)], capture_output=True, text=True, check=True,
                          cwd=ROOT)  # fmt: skip
    assert done.stdout.splitlines()[-1] == "0 False", done.stdout + done.stderr


def test_every_reader_part_is_in_the_graph() -> None:
    parts = {path.stem if path.is_file() else path.name for path in (ROOT / "reader").iterdir()}
    parts = {part for part in parts if not part.startswith("__") and part != "models"}
    assert parts == set(READER_GRAPH)


def test_reader_sub_packages_import_only_what_the_graph_allows() -> None:
    problems = []
    for path in layer_files("reader"):
        relative = path.relative_to(ROOT / "reader")
        if len(relative.parts) == 1 and relative.name == "__init__.py":
            continue
        part = relative.parts[0] if len(relative.parts) > 1 else relative.stem
        for module in sorted(imported_modules(path)):
            target = reader_part(module)
            if target is not None and target != part and target not in READER_GRAPH[part]:
                problems.append(f"{path.relative_to(ROOT)} ({part}) imports {module}")
    assert not problems, "\n".join(problems)


def test_reader_graph_has_no_cycles() -> None:
    state: dict[str, str] = {}

    def visit(node: str, trail: tuple[str, ...]) -> None:
        assert state.get(node) != "open", f"cycle: {' → '.join((*trail, node))}"
        if state.get(node) == "done":
            return
        state[node] = "open"
        for child in sorted(READER_GRAPH[node]):
            visit(child, (*trail, node))
        state[node] = "done"

    for node in sorted(READER_GRAPH):
        visit(node, ())


def test_serving_is_imported_only_by_evaluation_and_the_runners() -> None:
    importers = {part for part, allowed in READER_GRAPH.items() if "serving" in allowed}
    assert importers == {"evaluation"}
    assert "training" not in READER_GRAPH["serving"]


_imported_modules = functools.cache(imported_modules)  # each file parsed once for all the chains


def module_file(module: str, root: Path = ROOT) -> Path | None:
    """The source file of a `dilstore.…` module name, None for a name that is not a module (an imported function)."""
    parts = module.split(".")
    if parts[0] != "dilstore" or len(parts) < 2:
        return None
    base = root.joinpath(*parts[1:])
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def reached_reader_parts(start: Path, root: Path = ROOT) -> set[str]:
    """The reader parts a file reaches through its imports and theirs, module by module (not part by part: training
    may import evaluation.rank_metrics without reaching the serving that other evaluation modules import)."""
    seen: set[Path] = set()
    pending = [start]
    while pending:
        path = pending.pop()
        if path in seen:
            continue
        seen.add(path)
        pending.extend(found for module in _imported_modules(path, root) if (found := module_file(module, root)))
    parts = {path.relative_to(root / "reader").parts for path in seen if path.is_relative_to(root / "reader")}
    return {part[0] if len(part) > 1 else Path(part[0]).stem for part in parts}


@pytest.mark.parametrize(
    ("layer_or_part", "never"),
    [("reader/training", {"serving"}), ("reader/serving", {"training"}),
     ("reader/offline", {"serving", "training", "evaluation", "data"}),
     ("pipelines", {"serving", "training", "evaluation", "data"})],
)  # fmt: skip
def test_nothing_reaches_what_it_must_not_through_other_modules(layer_or_part: str, never: set[str]) -> None:
    """One edge at a time, training may import evaluation and evaluation serving: only the whole chain shows that
    serving would be pulled into training."""
    problems = []
    for path in sorted((ROOT / layer_or_part).rglob("*.py")):
        reached = reached_reader_parts(path) & never
        if reached:
            problems.append(f"{path.relative_to(ROOT)} reaches reader/{', reader/'.join(sorted(reached))}")
    assert not problems, "\n".join(problems)


def test_the_chain_check_follows_imports_through_other_modules(tmp_path: Path) -> None:
    for name, text in {"training/loop.py": "from dilstore.reader.evaluation import metrics\n",
                       "evaluation/metrics.py": "from dilstore.reader.serving.odqa import OpenDomainReader\n",
                       "serving/odqa.py": ""}.items():  # fmt: skip
        path = tmp_path / "reader" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    reached = reached_reader_parts(tmp_path / "reader" / "training" / "loop.py", tmp_path)
    assert reached == {"training", "evaluation", "serving"}


def test_pipelines_use_only_the_offline_half_of_the_reader() -> None:
    problems = []
    for path in layer_files("pipelines"):
        for module in sorted(imported_modules(path)):
            target = reader_part(module)
            if target is not None and target not in PIPELINES_MAY_USE:
                problems.append(f"{path.relative_to(ROOT)} imports {module}")
    assert not problems, "\n".join(problems)


def test_checker_sees_lazy_imports(tmp_path: Path) -> None:
    """The checker must catch an import hidden inside a function body."""
    module = tmp_path / "m.py"
    module.write_text("def f():\n    import torch\n    from apache_beam import io\n")
    assert imported_top_levels(module, tmp_path) == {"torch", "apache_beam"}


def test_checker_sees_relative_imports_and_layers_imported_by_name(tmp_path: Path) -> None:
    """`from ..pipelines import job` and `from dilstore import runners` in storage/ went unseen (tests36 1.3)."""
    module = tmp_path / "storage" / "codecs" / "m.py"
    module.parent.mkdir(parents=True)
    module.write_text("from dilstore import runners\nfrom ...pipelines import job\nfrom . import sibling\n")
    assert imported_layers(module, tmp_path) == {"runners", "pipelines", "storage"}
    assert {"dilstore.pipelines.job", "dilstore.storage.codecs.sibling"} <= imported_modules(module, tmp_path)


@pytest.mark.parametrize(
    "line", ["import dilstore\n", "from dilstore.api import precompute\n", "from dilstore import api\n",
             "from dilstore import DilstoreError\n", "from ... import api\n"],
)  # fmt: skip
def test_checker_sees_the_public_api_as_the_top_layer(tmp_path: Path, line: str) -> None:
    """An import of `dilstore` or `dilstore.api` from a layer was not counted at all (style49 L1): the API imports
    the runners, so storage → dilstore.api → runners was an upward cycle nothing flagged."""
    module = tmp_path / "storage" / "codecs" / "m.py"
    module.parent.mkdir(parents=True)
    module.write_text(line)
    assert imported_layers(module, tmp_path) == {"api"}
