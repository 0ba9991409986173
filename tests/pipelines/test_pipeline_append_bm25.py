"""BM25 and the reader over an appended store: `dilstore index`, `ask` and `evaluate-qa` as over a one-run store.

`dilstore index` rebuilds STORE/bm25 over every part of an appended store,
leaving out rows a --replace superseded. Indexing, asking and evaluating run
as commands in a child process, one after another as users run them (the JVM
is started there and never forked); the stores are made in this process.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from dilstore.reader.serving.odqa import open_reader
from dilstore.runners import cli
from dilstore.storage.errors import DilstoreError
from dilstore.storage.verify import verify_store
from tests.fixtures.pipeline_fixtures import commands_in_one_process, save_tiny_reader, write_jsonl

pytestmark = pytest.mark.slow

DOCUMENTS = [
    {"id": "rhine", "title": "Rhine", "text": "The Rhine flows from the Swiss Alps to the North Sea through Germany."},
    {"id": "oxygen", "title": "Oxygen", "text": "Oxygen is a chemical element with symbol O and atomic number 8."},
    {"id": "normans", "title": "Normans", "text": "The Normans gave their name to Normandy, a region in France."},
    {"id": "tram", "title": "Zürich trams", "text": "The Zürich tram network opened in 1882 and is run by VBZ."},
    {"id": "curie", "title": "Marie Curie", "text": "Marie Curie won the Nobel Prize in Chemistry in 1911."},
    {"id": "kili", "title": "Kilimanjaro", "text": "Mount Kilimanjaro rises 5,895 metres above sea level in Tanzania."},
]
QUESTIONS = [
    {"question": "Where does the Rhine flow to?", "answer": ["the North Sea"]},
    {"question": "When did the Zürich tram network open?", "answer": ["1882"]},
    {"question": "Who won the Nobel Prize in Chemistry in 1911?", "answer": ["Marie Curie"]},
    {"question": "How high is Mount Kilimanjaro?", "answer": ["5,895 metres"]},
]
SEARCH = """
import json, sys
from pathlib import Path
from dilstore.reader.retrieval import Bm25Searcher
found = []
for index, query in json.loads(sys.argv[1]):
    found.append({hit.passage_id: hit.score for hit in Bm25Searcher(Path(index)).search(query, k=10)})
print(json.dumps(found))
"""


def precompute(model: Path, corpus: Path, store: Path, *extra: str) -> None:
    assert cli.main(["precompute", "--input", str(corpus), "--output", str(store), "--model", str(model),
                     "--workers", "1", "--threads", "1", "--shards", "2", "--max-length", "48",
                     "--encoding", "fp32", "--no-progress", *extra]) == 0


def index(store: Path) -> list[str]:
    """`dilstore index STORE --json`, as one command of `commands_in_one_process`."""
    return ["dilstore", "index", str(store), "--json"]


def search(folder: Path, *searches: tuple[Path, str]) -> list[str]:
    """The command, for `commands_in_one_process`, that prints the BM25 hits of each (store, query) as JSON, one
    {passage id: score} each (read them with `hits`). It runs in the process of the commands before it: one JVM."""
    script = folder / "search.py"
    script.write_text(SEARCH, encoding="utf-8")
    return [str(script), json.dumps([(str(store / "bm25"), query) for store, query in searches])]


def hits(found: subprocess.CompletedProcess) -> list[dict[str, float]]:
    assert found.returncode == 0, found.stderr
    return json.loads(found.stdout.strip().splitlines()[-1])


def index_and_read(
    stores: list[Path], model: Path, questions: Path, then: list[str]
) -> tuple[list[tuple[dict, dict, dict, dict]], subprocess.CompletedProcess]:
    """For each store: (index --json, evaluate-qa --json without its timing, its predictions, ask --json without
    timings); and what the command `then` did after them.

    The commands run in one process, one after another, as a user runs them (one torch import and one JVM for
    all the stores and `then`: a process per store took 10-13 s each, and one more for `then` about 4 s).
    """
    common = ["--model", str(model), "--top-p", "3", "--threads", "1"]
    commands = []
    for store in stores:
        predictions = store.with_name(store.name + "-predictions.json")
        commands += [
            index(store),
            ["dilstore", "evaluate-qa", str(store), "--questions", str(questions), "--json", "--predictions",
             str(predictions), *common],
            ["dilstore", "ask", str(store), QUESTIONS[1]["question"], "--json", *common],
        ]
    *done, after = commands_in_one_process(*commands, then)
    results = []
    for position, store in enumerate(stores):
        indexed, evaluated, asked = done[3 * position : 3 * position + 3]
        for command in (indexed, evaluated, asked):
            assert command.returncode == 0, command.stderr
        summary, answer = (json.loads(command.stdout.strip().splitlines()[-1]) for command in (evaluated, asked))
        for document in (summary, answer):
            document.pop("seconds", None)
            document.pop("timings", None)
        predictions = store.with_name(store.name + "-predictions.json")
        results.append((json.loads(indexed.stdout), summary, json.loads(predictions.read_text()), answer))
    return results, after


@pytest.fixture(scope="module")
def read(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, list, subprocess.CompletedProcess]:
    """(the model, the folder, `index_and_read` of the one-run store of every document and of A then an append of
    B, the BM25 search of each for one query). Its indexed one-run store is where
    test_bm25_no_longer_finds_the_text_of_a_replaced_row starts (a copy of it): an index a child process built
    before an append made in this process (that test's own build, model and index child took about 3 s here,
    ci62a F3)."""
    folder = tmp_path_factory.mktemp("append-bm25")
    model = save_tiny_reader(folder / "tiny")
    questions = write_jsonl(folder / "questions.jsonl", QUESTIONS)
    precompute(model, write_jsonl(folder / "all.jsonl", DOCUMENTS), folder / "union")
    precompute(model, write_jsonl(folder / "a.jsonl", DOCUMENTS[::2]), folder / "store")
    precompute(model, write_jsonl(folder / "b.jsonl", DOCUMENTS[1::2]), folder / "store", "--append")
    query = "atomic number of oxygen"
    results, searched = index_and_read([folder / "union", folder / "store"], model, questions,
                                       search(folder, (folder / "store", query), (folder / "union", query)))
    return model, folder, results, searched


def test_ask_and_evaluate_qa_over_a_then_b_equal_the_one_run_store(read) -> None:
    _, folder, results, searched = read
    (indexed_whole, *whole), (indexed, *appended) = results
    assert (indexed_whole["files"], indexed_whole["appended"]) == (2, False)
    assert (indexed["files"], indexed["appended"]) == (4, True)  # two parts of A, two of B
    assert indexed["passages"] == indexed_whole["passages"] == len(DOCUMENTS)  # A alone was named (odqa43 L4)
    found, found_whole = hits(searched)
    assert found == found_whole and "oxygen#0" in found
    assert appended[0] == whole[0]  # EM, F1, R
    assert appended[1] == whole[1]  # every answer
    assert appended[2] == whole[2]  # answer, scores, n-best
    assert verify_store(folder / "store").ok


def test_bm25_no_longer_finds_the_text_of_a_replaced_row(read, tmp_path: Path) -> None:
    """The store of every document, indexed by `dilstore index` (the `read` fixture's), then an append that
    replaces one of its rows."""
    model, folder, ((indexed, *_), _), _ = read
    assert indexed["passages"] == len(DOCUMENTS)
    store = Path(shutil.copytree(folder / "union", tmp_path / "store"))
    # U+2028 is no line end in JSON Lines (nor for Anserini), though str.splitlines() takes it for one.
    changed = {"id": "oxygen", "title": "Zeppelin\u2028LZ 1", "text": "A zeppelin hangar stood at Friedrichshafen."}
    precompute(model, write_jsonl(tmp_path / "b.jsonl", [changed]), store, "--append", "--replace")
    stale = re.escape(f"the BM25 index at {store / 'bm25'} covers ") + r"\d+ passages .* after 0 append\(s\), but"
    with pytest.raises(DilstoreError, match=stale + r" the store .* after 1: .* rebuild it with `dilstore index"):
        open_reader(store, model)  # the index predates the append: its hits would miss the new row
    old_query, new_query = (store, "chemical element symbol atomic number"), (store, "zeppelin hangar")
    indexed, searched = commands_in_one_process(index(store), search(tmp_path, old_query, new_query))  # one JVM
    assert indexed.returncode == 0 and json.loads(indexed.stdout)["passages"] == len(DOCUMENTS), indexed.stderr
    old_text, new_text = hits(searched)
    assert "oxygen#0" not in old_text
    assert list(new_text) == ["oxygen#0"]
    assert verify_store(store).ok
