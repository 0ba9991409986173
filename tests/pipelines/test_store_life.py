"""A store's life as a stateful property test (state55): a first build (fp16 or fp32, split none or paragraphs),
appends of new documents, `--append --replace` of stored ones (alone, mixed with new ones, with more or fewer
paragraphs than before, one of them given twice, one whose new text yields no passage and so keeps its old ones),
an append refused for duplicate ids, an append that stores nothing (not committed), `compact` in place and into
`--output` (the life goes on in the copy, the old store left as it was), `index`, an earlier run's command again,
and a store kept open across steps, in the orders hypothesis picks.

The model is a plain dict, passage id -> text (each text holds a word no other text holds), the passage ids of each
document, and the hash of each passage's token ids, spans and states as they were when it was written. After every
step the store, read through the public Python API (`dilstore.open_store`), must serve exactly the model's ids and
texts, `len(store)` must be their count, verify (as `dilstore verify` runs it) must find nothing and list no
untracked file (but a BM25 index made stale by an append, which it must name), a passage not replaced since it was
written must give back its states bit for bit (after compactions too: they copy the codes), and, while the index is
fresh, a BM25 search of a passage's own word must find that passage alone, and the word of a replaced text (or of the
second copy of a document given twice) nothing. A store opened at an earlier step serves what it served then, or says
that the store changed; never other rows.

Stores are made in this process through `dilstore.precompute` and `dilstore.compact` (DirectRunner, one worker,
the tiny random reader). `dilstore.build_index`, the verify of an indexed store and the BM25 searches run in one
child process, started at the first index, since the JVM they start must never see a fork (README, runtime facts).
10 examples of at most 6 steps take 35-45 s on one core under CI=true (hypothesis's derandomized ci profile).
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

import dilstore
from dilstore.storage.verify import verify_store
from tests.fixtures.pipeline_fixtures import ROOT, save_tiny_reader, write_jsonl

pytestmark = pytest.mark.slow

# Odd ids on purpose: a space, non-ASCII letters, a '#' as in window ids, a '/' as in a path.
IDS = ["p0", "p1", "p2", "p3", "p4", "p5", "Zürich tram", "a#1", "x/y", "日本"]
WORDS = "the river valley city bridge across water railway station Zürich naïve café 1882 north south".split()
ENCODINGS = ["fp16", "fp32"]
TITLES = ["", "Rivers", "Zürich – trams", "日本"]
SPLITS = ["none", "paragraphs"]

# The child that owns the JVM: one JSON request a line on stdin, one "REPLY <json>" line on stdout for each.
CHILD = r"""
import json, sys
from pathlib import Path
import dilstore
from dilstore.reader.retrieval import Bm25Searcher
from dilstore.runners.cmd_store import bm25_problems
from dilstore.storage.verify import verify_store
for line in sys.stdin:
    request = json.loads(line)
    try:
        if request["op"] == "index":
            dilstore.build_index(request["store"], no_progress=True)
            reply = {"ok": True}
        elif request["op"] == "verify":  # as `dilstore verify` does it (runners/cmd_store.py, run_verify)
            report = verify_store(request["store"])
            untracked = [path for path in report.untracked if not path.startswith("bm25/")]
            reply = {"ok": True, "problems": report.problems + (bm25_problems(request["store"]) or []),
                     "untracked": untracked}
        else:
            searcher = Bm25Searcher(Path(request["store"]) / "bm25")
            try:
                reply = {"ok": True, "hits": [[hit.passage_id for hit in searcher.search(query, k=10)]
                                              for query in request["queries"]]}
            finally:
                searcher.close()
    except Exception as error:
        import traceback
        reply = {"ok": False, "error": traceback.format_exc()}
    sys.stdout.write("REPLY " + json.dumps(reply) + "\n")
    sys.stdout.flush()
"""


class JvmChild:
    """The child process that builds indexes, verifies indexed stores and searches them (started on first use)."""

    def __init__(self) -> None:
        self._process: subprocess.Popen[str] | None = None

    def ask(self, **request: Any) -> dict[str, Any]:
        if self._process is None:
            self._process = subprocess.Popen([sys.executable, "-c", CHILD], cwd=ROOT, stdin=subprocess.PIPE,
                                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                                             encoding="utf-8")  # fmt: skip
        assert self._process.stdin is not None and self._process.stdout is not None
        self._process.stdin.write(json.dumps(request) + "\n")
        self._process.stdin.flush()
        for line in self._process.stdout:
            if line.startswith("REPLY "):
                reply = json.loads(line[len("REPLY "):])
                assert reply["ok"], reply["error"]
                return reply
        raise AssertionError(f"the JVM child ended (exit {self._process.wait()})")

    def close(self) -> None:
        if self._process is not None:
            assert self._process.stdin is not None
            self._process.stdin.close()
            self._process.wait(timeout=60)
            self._process = None


def states_hash(passage: Any) -> str:
    """A passage's token ids, spans and states (dtype and shape included), hashed."""
    digest = hashlib.sha256()
    for array in (passage.token_ids, passage.char_spans, passage.states):
        array = np.ascontiguousarray(array)
        digest.update(f"{array.dtype.str}{array.shape}".encode())
        digest.update(array.tobytes())
    return digest.hexdigest()


class StoreLife(RuleBasedStateMachine):
    """A store and its model (see the module's docstring). `model_dir` and `jvm` are set by the test."""

    model_dir: Path
    jvm: JvmChild
    base: Path

    def __init__(self) -> None:
        super().__init__()
        self.folder = Path(tempfile.mkdtemp(prefix="store-life-", dir=self.base))
        self.store = self.folder / "store"
        self.documents: dict[str, list[str]] = {}  # document id -> the passage ids it gave
        self.texts: dict[str, tuple[str, str]] = {}  # passage id -> (title, text)
        self.marks: dict[str, str] = {}  # passage id -> the word only its text holds
        self.hashes: dict[str, str] = {}  # passage id -> states_hash when written
        self.old_marks: list[str] = []  # words of texts replaced since (no search may find them)
        self.index: str | None = None  # None (no bm25/), "fresh" or "stale" (appended to since)
        self.written = 0  # texts written, for unique marks
        self.copies = 0  # compactions into a copy, for its name
        self.opened: Any = None  # a store opened at some step, and what it served then
        self.opened_texts: dict[str, tuple[str, str]] = {}
        self.runs: list[dict[str, Any]] = []  # every precompute run: documents, flags, input file, epoch
        self.dead_letters = False  # an append that stored nothing left its folder (appends/G/: dead letters, untracked)
        self.epoch = 0  # compactions so far: an append before the last one is no longer the store's
        self.opened_hashes: dict[str, str] = {}
        self.options: dict[str, Any] = {}  # more flags of every precompute run (test_store_stops.py: --kind)

    # -- helpers ---------------------------------------------------------------------------------------------------

    def execute(self, command: Any) -> Any:
        """Run a command (a precompute or a compaction; test_store_stops.py stops one part-way first)."""
        return command()

    def record(self, passage: Any) -> Any:
        """What the model keeps of a passage's states as written."""
        return states_hash(passage)

    def same_states(self, passage: Any, recorded: Any) -> bool:
        """Whether the passage as read now holds the states recorded when it was written."""
        return states_hash(passage) == recorded

    def precompute(self, corpus: Path, **flags: Any) -> None:
        self.execute(lambda: dilstore.precompute(
            input=str(corpus), output=str(self.store), model=str(self.model_dir), split=self.split, workers=1,
            threads=1, max_length=48, shards=2, encoding=self.encoding, no_progress=True, **self.options, **flags))

    def draw_documents(self, data: st.DataObject, ids: list[str]) -> list[dict[str, Any]]:
        """A document of each id: `{"id", "title", "text"}` and its passages' `"passages"`, [(id, text, mark)]
        (one under split none, one per paragraph under split paragraphs)."""
        documents = []
        for doc_id in ids:
            title = data.draw(st.sampled_from(TITLES), label=f"{doc_id} title")
            count = 1 if self.split == "none" else data.draw(st.integers(1, 3), label=f"{doc_id} paragraphs")
            passages = []
            for number in range(count):
                self.written += 1
                mark = f"mark{self.written}q"
                words = data.draw(st.lists(st.sampled_from(WORDS), max_size=8), label=f"{doc_id} words")
                text = " ".join(["a paragraph about the long river", *words, mark])  # 30 characters or more: kept
                passages.append((doc_id if self.split == "none" else f"{doc_id}#{number}", text, mark))
            documents.append({"id": doc_id, "title": title, "text": "\n\n".join(text for _, text, _ in passages),
                              "passages": passages})  # fmt: skip
        return documents

    def run_precompute(self, documents: list[dict[str, Any]], corpus: Path | None = None, **flags: Any) -> None:
        """`dilstore.precompute` of the documents (written to a new input file unless `corpus` is an earlier run's);
        a document given twice is the one record it rejects (its first copy is stored), and it warns so."""
        rows = [{key: document[key] for key in ("id", "title", "text")} for document in documents]
        if corpus is None:
            corpus = write_jsonl(self.folder / f"input-{len(list(self.folder.glob('input-*')))}.jsonl", rows)
            self.runs.append({"documents": documents, "flags": flags, "corpus": corpus, "epoch": self.epoch})
        with warnings.catch_warnings(record=True) as warned:
            warnings.simplefilter("always")
            self.precompute(corpus, **flags)
        empty = sum(not document["passages"] for document in documents)
        rejected = len(rows) - len({row["id"] for row in rows}) + empty
        said = [str(warning.message) for warning in warned if issubclass(warning.category, UserWarning)]
        if rejected:
            assert len(said) == 1 and said[0].startswith(f"dilstore precompute: {rejected} record(s) rejected: "), said
        else:
            assert said == []

    def written_now(self, documents: list[dict[str, Any]]) -> None:
        """The documents just stored (the first copy of each) replace their earlier passages in the model, and the
        model takes the hashes of their new states."""
        stored: list[str] = []
        for document in documents:
            if document["id"] in stored:  # a document given twice keeps its first copy: no search finds the second
                self.old_marks += [mark for _, _, mark in document["passages"]]
                continue
            if not document["passages"]:
                continue  # a dead letter: its stored passages stay
            for passage_id in self.documents.pop(document["id"], []):
                self.old_marks.append(self.marks.pop(passage_id))
                del self.texts[passage_id], self.hashes[passage_id]
            self.documents[document["id"]] = [passage_id for passage_id, _, _ in document["passages"]]
            for passage_id, text, mark in document["passages"]:
                self.texts[passage_id], self.marks[passage_id] = (document["title"], text), mark
            stored.append(document["id"])
        with dilstore.open_store(self.store) as store:
            for passage in store.fetch([passage_id for doc_id in stored for passage_id in self.documents[doc_id]]):
                self.hashes[passage.id] = self.record(passage)

    def new_ids(self, data: st.DataObject, at_least: int) -> list[str]:
        unused = [doc_id for doc_id in IDS if doc_id not in self.documents]
        return data.draw(st.lists(st.sampled_from(unused), min_size=at_least, max_size=3, unique=True), label="new")

    def stored_ids(self, data: st.DataObject) -> list[str]:
        return data.draw(st.lists(st.sampled_from(sorted(self.documents)), min_size=1, max_size=3, unique=True),
                         label="replaced")  # fmt: skip

    def appended(self) -> None:
        if self.index == "fresh":
            self.index = "stale"

    # -- rules -----------------------------------------------------------------------------------------------------

    @initialize(data=st.data(), encoding=st.sampled_from(ENCODINGS), split=st.sampled_from(SPLITS))
    def build(self, data: st.DataObject, encoding: str, split: str) -> None:
        self.encoding, self.split = encoding, split
        documents = self.draw_documents(data, self.new_ids(data, at_least=1))
        self.run_precompute(documents)
        self.written_now(documents)

    @precondition(lambda self: len(self.documents) < len(IDS))
    @rule(data=st.data())
    def append_new(self, data: st.DataObject) -> None:
        documents = self.draw_documents(data, self.new_ids(data, at_least=1))
        self.run_precompute(documents, append=True)
        self.written_now(documents)
        self.appended()

    @rule(data=st.data(), twice=st.booleans())
    def append_replace(self, data: st.DataObject, twice: bool) -> None:
        """Stored documents given again with --replace (under split paragraphs, with more or fewer paragraphs than
        before), with or without new ones beside them, and maybe one of them twice (its first copy is kept)."""
        ids = self.stored_ids(data)
        if len(self.documents) < len(IDS):
            ids += self.new_ids(data, at_least=0)
        ids = data.draw(st.permutations(ids), label="order")
        if twice:
            ids.append(data.draw(st.sampled_from(ids), label="twice"))
        documents = self.draw_documents(data, ids)
        self.run_precompute(documents, append=True, replace=True)
        self.written_now(documents)
        self.appended()

    @rule(data=st.data())
    def append_replace_with_a_document_that_gives_no_passage(self, data: st.DataObject) -> None:
        """A stored document given again with --replace whose new text yields no passage (blank, or only paragraphs
        too short to keep) is a dead letter and keeps its old passages; a stored or new document beside it is
        stored."""
        empty = self.stored_ids(data)[0]
        other = data.draw(st.sampled_from([doc_id for doc_id in IDS if doc_id != empty]), label="other")
        text = "   " if self.split == "none" else "too short\n\nshort as well"
        documents = [{"id": empty, "title": "", "text": text, "passages": []}, *self.draw_documents(data, [other])]
        documents = data.draw(st.permutations(documents), label="order")
        self.run_precompute(documents, append=True, replace=True)
        self.written_now(documents)
        self.appended()

    @rule(data=st.data(), replace=st.booleans())
    def an_append_that_stores_nothing_changes_nothing(self, data: st.DataObject, replace: bool) -> None:
        """An append of documents that all yield no passage stores nothing and is not committed; its folder
        (`appends/G/`, where its dead letters say why) stays, outside the manifest (README, "Appending")."""
        ids = data.draw(st.lists(st.sampled_from(IDS), min_size=1, max_size=2, unique=True), label="empty")
        text = "   " if self.split == "none" else "too short"
        documents = [{"id": doc_id, "title": "", "text": text, "passages": []} for doc_id in ids]
        with pytest.raises(dilstore.DilstoreError, match="no passage was stored"):
            self.run_precompute(documents, append=True, replace=replace)
        self.runs.pop()
        self.dead_letters = True

    @rule(data=st.data())
    def append_duplicate_is_refused(self, data: st.DataObject) -> None:
        """A stored id appended without --replace is refused, and nothing changes."""
        documents = self.draw_documents(data, self.stored_ids(data))
        with pytest.raises(dilstore.DilstoreError, match="already"):
            self.run_precompute(documents, append=True)
        self.runs.pop()  # a refused run is no run to repeat

    @rule(shards=st.none() | st.integers(1, 3))
    def compact_in_place(self, shards: int | None) -> None:
        summary = self.execute(lambda: dilstore.compact(self.store, shards=shards, no_progress=True))
        self.epoch += 1
        assert summary["passages"] == len(self.texts), summary
        if self.index == "stale":
            self.index = None  # a stale index does not come along

    @rule(shards=st.none() | st.integers(1, 3))
    def compact_into_a_copy(self, shards: int | None) -> None:
        """`compact --output`: the old store stays as it was, and the life goes on in the copy."""
        self.copies += 1
        old, self.store = self.store, self.folder / f"copy-{self.copies}"
        before = sorted(path.relative_to(old).as_posix() for path in old.rglob("*"))
        summary = self.execute(lambda: dilstore.compact(old, output=self.store, shards=shards, no_progress=True))
        self.epoch += 1
        assert summary["passages"] == len(self.texts), summary
        assert sorted(path.relative_to(old).as_posix() for path in old.rglob("*")) == before
        if self.index == "stale":
            self.index = None

    @rule(data=st.data())
    def rerun(self, data: st.DataObject) -> None:
        """An earlier run's command again, its input file untouched. The first build, and an append the store still
        lists (none before the last compaction), change nothing; an append from before the last compaction is
        applied again: with --replace its texts win once more, without it its ids are refused."""
        run = self.runs[data.draw(st.integers(0, len(self.runs) - 1), label="run")]
        appended = bool(run["flags"].get("append"))
        if not appended or run["epoch"] == self.epoch:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # what it says is not the point here
                self.precompute(run["corpus"], **run["flags"])
        elif run["flags"].get("replace"):
            self.run_precompute(run["documents"], corpus=run["corpus"], **run["flags"])
            self.written_now(run["documents"])
            self.appended()
        else:
            with pytest.raises(dilstore.DilstoreError, match="already"):
                self.run_precompute(run["documents"], corpus=run["corpus"], **run["flags"])

    @rule()
    def index(self) -> None:
        self.jvm.ask(op="index", store=str(self.store))
        self.index = "fresh"

    @rule(check_files=st.booleans())
    def reopen(self, check_files: bool) -> None:
        """Keep a store open from now on (checking its files before each lookup, or not); the one held before is
        closed."""
        if self.opened is not None:
            self.opened.close()
        self.opened = dilstore.open_store(self.store, check_files=check_files)
        self.opened_texts, self.opened_hashes = dict(self.texts), dict(self.hashes)

    # -- invariants ------------------------------------------------------------------------------------------------

    @invariant()
    def store_serves_the_model(self) -> None:
        with dilstore.open_store(self.store) as store:
            assert len(store) == len(self.texts)
            absent = [f"{doc_id}#{number}" for doc_id in IDS for number in range(4)] + IDS
            assert store.missing(absent) == [passage_id for passage_id in absent if passage_id not in self.texts]
            fetched = {passage.id: passage for passage in store.fetch(sorted(self.texts))}
            assert {passage_id: (passage.title, passage.text) for passage_id, passage in fetched.items()} == self.texts
            for passage_id, passage in fetched.items():
                assert self.same_states(passage, self.hashes[passage_id]), f"{passage_id}: other states"

    @invariant()
    def verify_finds_nothing_wrong(self) -> None:
        if (self.store / "bm25").exists():
            assert self.index is not None, "an index that should not be there"
            report = self.jvm.ask(op="verify", store=str(self.store))
            problems, untracked = report["problems"], report["untracked"]
        else:
            assert self.index is None, "the index is gone"
            checked = verify_store(self.store)
            problems, untracked = checked.problems, checked.untracked
        assert [path for path in untracked if not (self.dead_letters and path.startswith("appends/"))] == []
        if self.index == "stale":
            assert problems and all("BM25 index" in problem for problem in problems), problems
        else:
            assert problems == []

    @invariant()
    def bm25_finds_each_passage_by_its_word(self) -> None:
        if self.index != "fresh":
            return
        ids = sorted(self.texts)
        gone = sorted(set(self.old_marks) - set(self.marks.values()))  # a rerun may bring an old text back
        queries = [self.marks[passage_id] for passage_id in ids] + gone
        hits = self.jvm.ask(op="search", store=str(self.store), queries=queries)["hits"]
        assert hits[: len(ids)] == [[passage_id] for passage_id in ids]
        assert hits[len(ids):] == [[] for _ in gone], "a replaced text is still found"

    @invariant()
    def a_store_opened_before_serves_what_it_served(self) -> None:
        if self.opened is None:
            return
        try:
            assert len(self.opened) == len(self.opened_texts)
            passages = self.opened.fetch(sorted(self.opened_texts))
        except dilstore.StoreChangedError:
            return  # a compaction deleted shards it had not read yet: it says so
        assert {passage.id: (passage.title, passage.text) for passage in passages} == self.opened_texts
        for passage in passages:
            assert self.same_states(passage, self.opened_hashes[passage.id]), f"{passage.id}: other states"

    def teardown(self) -> None:
        if self.opened is not None:
            self.opened.close()
        shutil.rmtree(self.folder, ignore_errors=True)


def test_a_store_serves_its_model_through_appends_replacements_compactions_and_indexes(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    StoreLife.model_dir = save_tiny_reader(tmp_path_factory.mktemp("life-model") / "tiny")
    StoreLife.jvm = JvmChild()
    StoreLife.base = tmp_path_factory.mktemp("life")
    try:
        run_state_machine_as_test(StoreLife, settings=settings(
            max_examples=10, stateful_step_count=6, deadline=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much]))  # fmt: skip
    finally:
        StoreLife.jvm.close()
