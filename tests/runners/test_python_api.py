"""The README's "Python API" script runs as written and prints what its comments say.

It precomputes two passages with the shipped reader and the shipped EARL
ranker, builds the BM25 index, answers, reranks and evaluates, in a fresh
process whose working folder is a temporary one.
"""

from __future__ import annotations

import importlib
import random
import subprocess
import sys
import typing
from pathlib import Path

import pytest

from tests.fixtures.paths import ROOT

pytestmark = pytest.mark.slow


def readme_script() -> str:
    """The ```python block of the README's "Python API" section."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme[readme.index("## Python API") :]
    start = section.index("```python\n") + len("```python\n")
    return section[start : section.index("```", start)]


def test_the_readme_python_api_script_runs(tmp_path: Path) -> None:
    (tmp_path / "script.py").write_text(readme_script(), encoding="utf-8")
    done = subprocess.run(
        [sys.executable, "script.py"], cwd=tmp_path, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert len(lines) == 3, done.stdout  # what the script prints, and nothing of the library's (a summary table)
    assert lines[0] == "Denver Broncos"
    assert lines[1].startswith("{'RR@10': ") and "'queries': 1" in lines[1]
    assert lines[2].startswith("{'questions': 1, 'em': 100.0")
    assert "passage/s]" not in done.stderr  # no_progress=True: neither precompute's bar nor build_index's
    assert "BM25 index of" not in done.stderr  # the command's summary line is the command's (api45 L5)


def test_import_dilstore_is_light_and_lists_the_api() -> None:
    code = "import sys, dilstore; print(sorted(dilstore.__all__)); print('torch' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    names, torch_loaded = done.stdout.splitlines()
    assert names == str(
        ["Answer", "DilstoreError", "FingerprintMismatchError", "MissingPassagesError", "OpenDomainReader",
         "QAEvaluation", "RankEvaluation", "RerankStats", "Span", "Store", "StoreChangedError", "StoreFormatError",
         "StoreReadError", "StoreReranker", "StoredPassage", "VerifyReport", "build_index", "compact", "evaluate_qa",
         "evaluate_rank", "open_reader", "open_reranker", "open_store", "precompute", "verify"]
    )  # fmt: skip
    assert torch_loaded == "False"


def test_the_classes_the_api_returns_are_named_by_dilstore() -> None:
    """`def f(reader: dilstore.OpenDomainReader)` was impossible, and the functions' hints named classes no program
    could reach, so runtime-annotation tools could not read them (api42 L3)."""
    import dilstore
    from dilstore import api

    results = {name: getattr(dilstore, name) for name in dilstore.RESULTS}
    assert all(isinstance(result, type) and name in dilstore.__all__ for name, result in results.items())
    returned = set()
    for name in dilstore.__all__:
        function = getattr(api, name, None)
        if callable(function) and not isinstance(function, type):
            hint = typing.get_type_hints(function, localns=results)["return"]
            returned.add(typing.get_origin(hint) or hint)  # StoreReranker[Any]: the class
    assert {dilstore.Store, dilstore.OpenDomainReader, dilstore.StoreReranker, dilstore.QAEvaluation,
            dilstore.RankEvaluation, dilstore.VerifyReport} <= returned  # fmt: skip
    assert typing.get_type_hints(dilstore.OpenDomainReader.answer)["return"] is dilstore.Answer
    assert typing.get_type_hints(dilstore.StoreReranker.rerank)["stats"] == dilstore.RerankStats | None


def test_a_reader_s_store_is_typed_as_the_store_it_was_given() -> None:
    """`reader.store.check_files = True`, as the README tells a long-running program, failed type checking: the
    reader's `store` was a PassageSource, which has only `fetch` (types58 F2). A reader is generic in its store (a
    Store for type checkers unless given a stand-in), and evaluate_qa takes a reader of any store."""
    import dilstore
    from dilstore import api
    from dilstore.reader.serving import odqa

    (store,) = dilstore.OpenDomainReader.__parameters__
    assert store is odqa.StoreT and store.__bound__ is odqa.PassageSource and store.__covariant__
    assert typing.get_type_hints(dilstore.OpenDomainReader.__init__)["store"] is store
    assert typing.get_type_hints(dilstore.OpenDomainReader.__enter__)["return"] is typing.Self
    assert "default=Store" in Path(odqa.__file__).read_text(encoding="utf-8")  # what a type checker reads
    results = {name: getattr(dilstore, name) for name in dilstore.RESULTS}
    assert typing.get_type_hints(api.evaluate_qa, localns=results)["reader"] == dilstore.OpenDomainReader[typing.Any]


def test_the_errors_the_readme_names_are_the_ones_raised() -> None:
    """A program could not catch StoreChangedError or MissingPassagesError by the names the README gives (readme37
    L2)."""
    import dilstore
    from dilstore.storage.format import StoreChangedError
    from dilstore.storage.reader import MissingPassagesError

    assert dilstore.StoreChangedError is StoreChangedError and dilstore.MissingPassagesError is MissingPassagesError
    for name in dilstore.ERRORS:
        assert issubclass(getattr(dilstore, name), dilstore.DilstoreError), name
        assert name in dilstore.__all__, name


def test_bad_api_options_raise_dilstore_error_not_system_exit(tmp_path: Path, capsys) -> None:
    """build_index and precompute go through the command's parser, whose usage error would end the caller's
    process; the message is the command's error line (precompute's said only "see the message above", and the
    line and a usage block went to the caller's stderr)."""
    import dilstore

    with pytest.raises(dilstore.DilstoreError,
                       match=r"^dilstore index: error: argument --threads: expected a positive integer, got 0$"):
        dilstore.build_index(tmp_path, threads=0)  # fmt: skip
    with pytest.raises(dilstore.DilstoreError,
                       match=r"^dilstore precompute: error: argument --workers: expected a positive integer, got 0$"):
        dilstore.precompute(workers=0, output=str(tmp_path / "store"))  # fmt: skip
    with pytest.raises(dilstore.DilstoreError, match=r"^beam_options holds 'help', which asks for the usage "
                                                     r"`dilstore precompute --help` prints; nothing was run$"):
        dilstore.precompute(beam_options={"help": True}, output=str(tmp_path / "store"))
    with pytest.raises(dilstore.DilstoreError, match=r"^precompute has no option 'temp_location': its keywords are "
                                                     r"the flags .*; Beam's options go in beam_options$"):  # fmt: skip
        dilstore.precompute(temp_location="/tmp/x", output=str(tmp_path / "store"))  # type: ignore[call-arg]
    with pytest.raises(dilstore.DilstoreError, match=r"^temp_location must be a Beam option value .*, got object"):
        dilstore.precompute(beam_options={"temp_location": object()}, output=str(tmp_path / "store"))
    with pytest.raises(dilstore.DilstoreError, match=r"^beam_options must be a mapping .*, got list"):
        dilstore.precompute(beam_options=["--temp_location=/tmp/x"], output=str(tmp_path / "store"))
    assert capsys.readouterr() == ("", "")
    assert not (tmp_path / "store").exists()


def test_a_precompute_that_stores_nothing_raises_why_and_prints_nothing(tmp_path: Path, capsys) -> None:
    """It raised "precompute failed with status 1"; the reason went to stderr and the summary table to stdout."""
    import dilstore

    corpus = tmp_path / "bad.jsonl"
    corpus.write_text('{"id": "a"}\n{"text": "no id"}\n', encoding="utf-8")
    random.seed(7)
    with pytest.raises(dilstore.DilstoreError, match=r"no passage was stored: 0 document\(s\) accepted, 2 record\(s\) "
                                                     r"rejected \(see .*/rejected/ for why\)"):  # fmt: skip
        dilstore.precompute(input=str(corpus), output=str(tmp_path / "store"), split="none", workers=1,
                            no_progress=True)  # fmt: skip
    assert capsys.readouterr().out == ""
    assert random.random() == random.Random(7).random(), "Beam drew from the caller's random stream (api42 L1)"


def test_a_store_already_complete_is_left_without_a_word_from_python(tmp_path: Path, capsys) -> None:
    """The command's "already complete" and "already holds this append" lines went to the caller's stderr, which
    no_progress did not cover (api45 L6); the command still says them."""
    import dilstore
    from dilstore.runners.cli import main

    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text('{"id": "a", "title": "A", "text": "Denver won the game."}\n', encoding="utf-8")
    options = dict(input=str(corpus), output=str(tmp_path / "store"), split="none", workers=1, no_progress=True)
    store = dilstore.precompute(**options)
    manifest = (store / "manifest.json").read_bytes()
    capsys.readouterr()
    assert dilstore.precompute(**options) == store
    out, err = capsys.readouterr()  # err may hold transformers' loading bar (README: the Python API)
    assert out == "" and "already complete" not in err and (store / "manifest.json").read_bytes() == manifest
    assert main(["precompute", "--input", str(corpus), "--output", str(store), "--split", "none", "--workers", "1",
                 "--no-progress", "--json"]) == 0  # fmt: skip
    assert capsys.readouterr().err.endswith(f"dilstore precompute: {store} is already complete with these settings\n")
    more = tmp_path / "more.jsonl"
    more.write_text('{"id": "b", "title": "B", "text": "Carolina lost the game."}\n', encoding="utf-8")
    dilstore.precompute(**{**options, "input": str(more), "append": True})
    capsys.readouterr()
    dilstore.precompute(**{**options, "input": str(more), "append": True})
    assert "already holds this append" not in capsys.readouterr().err


def test_type_checkers_see_each_name_from_the_module_that_defines_it() -> None:
    """Every name came from the module `__getattr__`, so a type checker saw all of the API as Any (review43 L1):
    the TYPE_CHECKING imports name every public name, each from the module `__getattr__` loads it from."""
    import ast

    import dilstore

    tree = ast.parse(Path(dilstore.__file__).read_text(encoding="utf-8"))
    guarded = next(node for node in tree.body if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING")
    imported = {alias.name: statement.module for statement in guarded.body if isinstance(statement, ast.ImportFrom)
                for alias in statement.names}  # fmt: skip
    assert set(imported) == set(dilstore.__all__) - {"DilstoreError"}
    for name, module in imported.items():
        assert getattr(importlib.import_module(module), name) is getattr(dilstore, name), name


def test_type_checkers_do_not_see_the_module_getattr() -> None:
    """A module `__getattr__` a checker sees makes every other name Any: `dilstore.open_sotre(...)` and `except
    dilstore.MissingPassageError` passed `mypy --strict` (api45 M1). It is defined only where checkers do not look,
    and `__version__` is declared for them."""
    import ast

    import dilstore

    tree = ast.parse(Path(dilstore.__file__).read_text(encoding="utf-8"))
    assert "__getattr__" not in {node.name for node in tree.body if isinstance(node, ast.FunctionDef)}
    hidden = next(node for node in tree.body
                  if isinstance(node, ast.If) and ast.unparse(node.test) == "not TYPE_CHECKING")  # fmt: skip
    assert [node.name for node in hidden.body if isinstance(node, ast.FunctionDef)] == ["__getattr__"]
    guarded = next(node for node in tree.body if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING")
    assert "__version__: str" in [ast.unparse(node) for node in guarded.body]
    assert isinstance(dilstore.__version__, str) and dilstore.StoredPassage.__name__ == "StoredPassage"
    with pytest.raises(AttributeError, match="no attribute 'open_sotre'"):
        dilstore.open_sotre  # noqa: B018


def test_compact_returns_the_commands_summary_and_refuses_bad_options(tmp_path: Path) -> None:
    """`dilstore.compact` runs the command's code, returns what `--json` prints, and raises DilstoreError for a bad
    option rather than ending the caller's process."""
    import dilstore
    from dilstore.storage.append import commit_append, first_free_shard
    from dilstore.storage.format import append_dir
    from dilstore.storage.location import StoreLocation
    from dilstore.storage.manifest import read_manifest
    from dilstore.storage.writer import write_shard
    from tests.fixtures.store_fixtures import build_store, fingerprint_for, random_shards

    shards = random_shards([3, 3, 2], state_shape=(8,), seed=4, max_words=6)
    store = build_store(tmp_path / "store", shards[:2])
    folder = store / append_dir("a1b2c3d4e5f60718")
    write_shard(folder, first_free_shard(read_manifest(StoreLocation.parse(store))), shards[2], kind="dilbert",
                encoding="fp32", durable=False, generation="a1b2c3d4e5f60718")  # fmt: skip
    commit_append(store, "a1b2c3d4e5f60718", fingerprint_for())
    summary = dilstore.compact(store, output=tmp_path / "copy", shards=1, no_progress=True)
    assert (summary["passages"], summary["shards"], summary["shards_before"]) == (8, 1, 3)
    assert dilstore.open_store(tmp_path / "copy").manifest.passages == 8
    assert dilstore.compact(tmp_path / "copy", shards=1)["already_compact"] is True
    with pytest.raises(dilstore.DilstoreError, match="^dilstore compact: error: argument --shards: expected a "
                                                     "positive integer, got 0$"):  # fmt: skip
        dilstore.compact(store, shards=0)
    with pytest.raises(dilstore.DilstoreError, match="^shards must be a positive integer or None"):
        dilstore.compact(store, shards="2")


def test_a_stop_of_compact_is_a_keyboard_interrupt_saying_what_is_kept(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    import dilstore
    from dilstore.storage.append import commit_append, first_free_shard
    from dilstore.storage.format import append_dir
    from dilstore.storage.location import StoreLocation
    from dilstore.storage.manifest import read_manifest
    from dilstore.storage.writer import write_shard
    from tests.fixtures.store_fixtures import build_store, fingerprint_for, random_shards

    shards = random_shards([3, 2], state_shape=(8,), seed=4, max_words=6)
    store = build_store(tmp_path / "store", shards[:1])
    write_shard(store / append_dir("a1b2c3d4e5f60718"), first_free_shard(read_manifest(StoreLocation.parse(store))),
                shards[1], kind="dilbert", encoding="fp32", durable=False, generation="a1b2c3d4e5f60718")  # fmt: skip
    commit_append(store, "a1b2c3d4e5f60718", fingerprint_for())

    def interrupt(*_: object, **__: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr("dilstore.storage.compact.finalize", interrupt)
    with pytest.raises(KeyboardInterrupt, match=f"^interrupted; {store} is as it was"):
        dilstore.compact(store, no_progress=True)


def test_verify_is_the_command_s_check_the_bm25_index_included(tmp_path: Path, capsys) -> None:
    """`dilstore.verify` did not exist, and `verify_store`, the storage function a program found, checks the store
    only: after an append it said a store was sound whose BM25 index was stale, which `dilstore verify` calls a
    problem (left56 F1). The command and the function now build the report with one function."""
    import json

    import dilstore
    from dilstore.reader.retrieval import INDEX_RECORD, indexed_state
    from dilstore.runners.cli import main
    from dilstore.storage.append import commit_append, first_free_shard
    from dilstore.storage.format import append_dir
    from dilstore.storage.location import StoreLocation
    from dilstore.storage.manifest import read_manifest
    from dilstore.storage.verify import verify_store
    from dilstore.storage.writer import write_shard
    from tests.fixtures.store_fixtures import build_store, fingerprint_for, random_shards

    shards = random_shards([3, 2], state_shape=(8,), seed=5, max_words=6)
    store = build_store(tmp_path / "store", shards[:1])
    (store / "bm25").mkdir()
    (store / "bm25" / "segments_1").write_bytes(b"")  # an index `dilstore index` built before the append
    (store / "bm25" / INDEX_RECORD).write_text(json.dumps(indexed_state(read_manifest(StoreLocation.parse(store)))))
    write_shard(store / append_dir("a1b2c3d4e5f60718"), first_free_shard(read_manifest(StoreLocation.parse(store))),
                shards[1], kind="dilbert", encoding="fp32", durable=False, generation="a1b2c3d4e5f60718")  # fmt: skip
    commit_append(store, "a1b2c3d4e5f60718", fingerprint_for())
    assert verify_store(store).ok, "the storage layer's check, of the store only (its docstring says so)"
    report = dilstore.verify(store, no_progress=True)
    assert isinstance(report, dilstore.VerifyReport) and not report.ok
    assert len(report.problems) == 1 and f"rebuild it with `dilstore index {store}`" in report.problems[0]
    assert report.untracked == [], "the index's files are checked, not listed as unchecked"
    assert capsys.readouterr() == ("", "")
    assert main(["verify", str(store), "--json"]) == 1
    assert json.loads(capsys.readouterr().out) == report.to_dict()
    with pytest.raises(dilstore.DilstoreError, match="^no_progress must be True or False, got str 'yes'$"):
        dilstore.verify(store, no_progress="yes")  # type: ignore[arg-type]


def test_verify_hands_its_storage_options_and_progress_to_the_store_check(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    """(mut56 M22, M25, M23) `dilstore.verify(url, storage_options=...)` is for a store behind fsspec (credentials,
    an endpoint): the options reach `verify_store`, or a store that needs them could not be read at all; and its
    progress bar is on stderr unless `no_progress`. Neither was held by a test."""
    import dilstore
    from dilstore.storage import verify as storage_verify

    seen: list[tuple[str, object]] = []

    def checked(store: str, storage_options: object = None, progress: object = None) -> None:
        seen.append((store, storage_options))
        progress.phase("files", 1, "file")  # type: ignore[attr-defined]
        progress.advance(1)  # type: ignore[attr-defined]
        raise RuntimeError("stop here")

    monkeypatch.setattr(storage_verify, "verify_store", checked)
    options = {"anon": True, "endpoint_url": "http://127.0.0.1:9"}
    with pytest.raises(RuntimeError, match="stop here"):
        dilstore.verify("s3://bucket/store", storage_options=options, no_progress=True)
    assert seen == [("s3://bucket/store", options)] and capsys.readouterr().err == ""
    with pytest.raises(RuntimeError, match="stop here"):
        dilstore.verify(tmp_path / "store")
    assert seen[-1] == (str(tmp_path / "store"), None) and "verify" in capsys.readouterr().err


def test_a_loop_of_symbolic_links_given_to_the_api_is_an_os_error(tmp_path: Path) -> None:
    """(left58b F5) `dilstore.precompute(output=LOOP)` and `dilstore.compact(LOOP)` raised Python 3.11's and 3.12's
    RuntimeError("Symlink loop from ..."), which a program's `except OSError` missed, where the command line says
    one line. It is the OSError (ELOOP) naming the path that Python 3.13 raises."""
    import errno

    import dilstore

    (tmp_path / "c.jsonl").write_text('{"id": "d", "title": "t", "text": "words"}\n')
    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    for call in (lambda: dilstore.precompute(input=[str(tmp_path / "c.jsonl")], output=str(loop)),
                 lambda: dilstore.compact(loop)):  # fmt: skip
        with pytest.raises(OSError) as raised:
            call()
        assert raised.value.errno == errno.ELOOP and raised.value.filename == str(loop)
