"""A store's life with stopped commands, other encodings and the EARL kinds, as a stateful property test (state56).

`StoreLife` (test_store_life.py) with more in it:

- rules that stop an append (new documents, or `--replace` of stored ones) or a compaction (in place, or into a
  copy) part-way, and then runs the same command again, which must leave the store as one uninterrupted run does
  (the model applies the command once). The command runs in a forked child that, at its N-th file operation
  (a rename, replace, unlink, rmdir or mkdir of the store's own files, those inside a folder being built left out),
  either ends at once without a handler running (`os._exit`, as SIGKILL), ends just after it, or is sent SIGINT
  (Ctrl-C); after the run again nothing may be left beside the store (no lock, building folder or old copy). A
  compaction into a copy stopped after its commit point (the copy's manifest) has made the copy, which the same
  command then refuses as "not an empty folder" (left alone, state56's report): the life goes on in the copy,
  indexed again where the model had a fresh index (the stop may have come before the index was carried along);
- a first build in fp16, int8, 2bit or 1bit, and of the `dilbert`, `earl-s1` or `earl-s2` kind (a tiny random
  EARL ranker). int8 is refused by `compact` (its scales are per shard), which the model expects, store unchanged
  (or, in place, found compact already). A 2bit/1bit store is first built from enough passages for its codebook to
  code appends (512 token states or more: they go on, with a warning) or from a few (every append is refused, "was
  trained on only N token states", the store unchanged). A passage's decoded states must be within the encoding's
  error (TOLERANCES) of the float32 states the model gives its token ids when it is written, and later give back
  what they gave then: bit for bit, but 2bit/1bit within 1e-5 (README, `compact`: rotated codes are decoded
  through a matrix product whose last bits may round otherwise).

12 examples of at most 6 steps take about 45 s on one core under CI=true (hypothesis's derandomized ci profile).
"""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import initialize, invariant, precondition, rule, run_state_machine_as_test

import dilstore
from tests.fixtures.pipeline_fixtures import save_tiny_reader
from tests.pipelines.test_store_life import IDS, SPLITS, JvmChild, StoreLife, states_hash

pytestmark = pytest.mark.slow

KINDS = ["dilbert", "earl-s1", "earl-s2"]
ENCODINGS = ["fp16", "int8", "2bit", "1bit"]
# The largest relative error ||x̂ - x|| / ||x|| of a passage's decoded states against the model's float32 states, one
# passage encoded alone: fp16 rounding, int8 (README: 0.87-0.96% on MiniLM states), 2bit/1bit (README: a codebook
# trained on 72 token states coded others at 0.56; this test measured at most 2.2e-4, 0.6%, 0.37 and 0.36).
TOLERANCES = {"fp16": 1e-3, "int8": 0.02, "2bit": 0.6, "1bit": 0.6}
# File operations of a command that a stop may land on; those inside a folder still being built are all alike.
OPERATIONS = ("rename", "replace", "unlink", "rmdir", "mkdir")
INSIDE_A_BUILDING_FOLDER = ("/.tmp-shard-", "/.tmp-index-", "/.tmp-codebook-", "dilstore-progress-")
LOCKS = (".dilstore-lock", ".dilstore-index-lock")
POINTS = st.integers(1, 28)  # an append makes about 28 such operations, a compaction about 20
STOPS = st.sampled_from(["kill", "kill-after", "ctrl-c"])
FILLER = [f"filler {number}" for number in range(24)]  # documents that give a codebook 512 token states and more


def stopped_in_a_child(command: Callable[[], object], point: int, how: str) -> bool:
    """Run `command` in a forked child, stopped at its `point`-th file operation: `kill` ends the child before it
    (no handler runs, as SIGKILL), `kill-after` just after it, `ctrl-c` sends it SIGINT there; whether the stop came
    (a command of fewer operations ends first). The child's temporary files go to a folder of its own, removed once
    it ends: Beam's `beam-pipeline-temp*` of a pipeline killed mid-run was left in /tmp on every run of this test."""
    private = tempfile.mkdtemp(prefix="store-stops-")
    try:
        return _stopped_child_exited(command, point, how, private)
    finally:
        shutil.rmtree(private, ignore_errors=True)


def _stopped_child_exited(command: Callable[[], object], point: int, how: str, private: str) -> bool:
    """stopped_in_a_child's fork and wait, the child's temporary folder `private`."""
    child = os.fork()
    if child == 0:
        tempfile.tempdir = private
        try:
            count = 0
            real = {name: getattr(os, name) for name in OPERATIONS}

            def stopping(name: str) -> Callable[..., object]:
                def operation(*args: Any, **kwargs: Any) -> object:
                    nonlocal count
                    inside = any(part in str(args[0]) for part in INSIDE_A_BUILDING_FOLDER)
                    counted = "dir_fd" not in kwargs and not inside
                    count += counted
                    here = counted and count == point
                    if here and how == "kill":
                        os._exit(137)
                    if here and how == "ctrl-c":
                        os.kill(os.getpid(), signal.SIGINT)
                    result = real[name](*args, **kwargs)
                    if here and how == "kill-after":
                        os._exit(137)
                    return result

                return operation

            for name in OPERATIONS:
                setattr(os, name, stopping(name))
            command()
        except BaseException:  # noqa: BLE001 - a stopped command's error is what its run again must mend
            pass
        finally:
            os._exit(0 if count < point else 1)
    deadline = time.monotonic() + 120
    while (ended := os.waitpid(child, os.WNOHANG)) == (0, 0):
        if time.monotonic() > deadline:
            os.kill(child, signal.SIGKILL)
            os.waitpid(child, 0)
            raise AssertionError("the stopped command hung")
        time.sleep(0.01)
    return os.waitstatus_to_exitcode(ended[1]) != 0


class StoppedStoreLife(StoreLife):
    """StoreLife with stops, int8, 2bit and 1bit, and the EARL kinds (see the module's docstring)."""

    models: dict[str, Path]
    references: dict[str, Any] = {}  # kind -> the float32 model that makes its states, loaded once

    def __init__(self) -> None:
        super().__init__()
        self.stop: tuple[int, str] | None = None  # the stop the next command gets
        self.appends_refused = False  # a 2bit/1bit store whose codebook is too small for appends

    # -- hooks of StoreLife ----------------------------------------------------------------------------------------

    def execute(self, command: Any) -> Any:
        if self.stop is not None:
            point, how = self.stop
            self.stop = None
            event(f"{how} {'came' if stopped_in_a_child(command, point, how) else 'came after the end'}")
        return command()

    def record(self, passage: Any) -> Any:
        self.check_error(passage)
        if self.encoding not in ("2bit", "1bit"):
            return states_hash(passage)
        return passage.token_ids.copy(), passage.char_spans.copy(), np.array(passage.states, dtype=np.float32)

    def same_states(self, passage: Any, recorded: Any) -> bool:
        if self.encoding not in ("2bit", "1bit"):
            return states_hash(passage) == recorded
        token_ids, spans, states = recorded
        return (np.array_equal(passage.token_ids, token_ids) and np.array_equal(passage.char_spans, spans)
                and np.allclose(passage.states, states, rtol=0, atol=1e-5))  # fmt: skip

    def check_error(self, passage: Any) -> None:
        from dilstore.reader.offline.encoding import encode_batch, load_reader

        if self.kind not in self.references:
            self.references[self.kind] = load_reader(str(self.model_dir), self.kind, None)
        (truth,), _ = encode_batch(self.references[self.kind], self.kind, [passage.token_ids])  # (n, *S) float32
        error = float(np.linalg.norm(np.asarray(passage.states, np.float32) - truth) / np.linalg.norm(truth))
        assert error < TOLERANCES[self.encoding], f"{passage.id}: relative error {error:.3g} in {self.encoding}"

    def run_precompute(self, documents: list[dict[str, Any]], corpus: Path | None = None, **flags: Any) -> None:
        if flags.get("append") and self.appends_refused:
            with pytest.raises(dilstore.DilstoreError, match="was trained on only [0-9,]+ token states"):
                super().run_precompute(documents, corpus, **flags)
            if corpus is None:
                self.runs.pop()
            raise Refused
        super().run_precompute(documents, corpus, **flags)

    # -- rules -----------------------------------------------------------------------------------------------------

    @initialize(data=st.data(), encoding=st.sampled_from(ENCODINGS), split=st.sampled_from(SPLITS),
                kind=st.sampled_from(KINDS), filler=st.booleans())  # fmt: skip
    def build(self, data: st.DataObject, encoding: str, split: str, kind: str, filler: bool) -> None:
        event(f"build: {kind} {encoding}{' with filler' if filler and encoding in ('2bit', '1bit') else ''}")
        self.encoding, self.split, self.kind = encoding, split, kind
        self.model_dir = self.models["dilbert" if kind == "dilbert" else "earl"]
        self.options = {} if kind == "dilbert" else {"kind": kind}
        documents = self.draw_documents(data, self.new_ids(data, at_least=1))
        if encoding in ("2bit", "1bit"):
            self.appends_refused = not filler
            if filler:
                documents += [{"id": doc_id, "title": "", "text": text,
                               "passages": [(doc_id if split == "none" else f"{doc_id}#0", text, mark)]}
                              for doc_id in FILLER for text, mark in [self.filler_text()]]  # fmt: skip
        self.run_precompute(documents)
        self.written_now(documents)

    def filler_text(self) -> tuple[str, str]:
        self.written += 1
        mark = f"mark{self.written}q"
        return " ".join(["a long paragraph about the river and its valley, the city on its banks and the bridge",
                         "across the water near the railway station in the north", mark]), mark  # fmt: skip

    # A command stopped part-way, then the same command again: the model applies it once. One rule per command, so
    # that stops are a good part of the steps.

    @precondition(lambda self: len(self.documents) < len(IDS))
    @rule(data=st.data(), point=POINTS, how=STOPS)
    def stopped_append_then_run_again(self, data: st.DataObject, point: int, how: str) -> None:
        self.stopped("append", point, how, lambda: self.append_new(data))

    @rule(data=st.data(), point=POINTS, how=STOPS)
    def stopped_replacement_then_run_again(self, data: st.DataObject, point: int, how: str) -> None:
        self.stopped("replace", point, how, lambda: self.append_replace(data, twice=False))

    @rule(point=POINTS, how=STOPS)
    def stopped_compaction_then_run_again(self, point: int, how: str) -> None:
        self.stopped("compact", point, how, lambda: self.compact_in_place(None))

    @rule(point=POINTS, how=STOPS)
    def stopped_compaction_into_a_copy_then_run_again(self, point: int, how: str) -> None:
        self.stopped("compact into a copy", point, how, lambda: self.compact_into_a_copy(None))

    def stopped(self, what: str, point: int, how: str, command: Callable[[], None]) -> None:
        self.stop = (point, how)
        event(f"stopped: {what}")
        try:
            command()
        finally:
            self.stop = None

    # StoreLife's rules that meet a refusal here: an append to a 2bit store with a small codebook, `compact` of int8.

    @precondition(lambda self: len(self.documents) < len(IDS))
    @rule(data=st.data())
    def append_new(self, data: st.DataObject) -> None:
        refused_or(lambda: StoreLife.append_new(self, data))

    @rule(data=st.data(), twice=st.booleans())
    def append_replace(self, data: st.DataObject, twice: bool) -> None:
        refused_or(lambda: StoreLife.append_replace(self, data, twice))

    @rule(data=st.data())
    def append_replace_with_a_document_that_gives_no_passage(self, data: st.DataObject) -> None:
        refused_or(lambda: StoreLife.append_replace_with_a_document_that_gives_no_passage(self, data))

    @precondition(lambda self: not self.appends_refused)
    @rule(data=st.data(), replace=st.booleans())
    def an_append_that_stores_nothing_changes_nothing(self, data: st.DataObject, replace: bool) -> None:
        StoreLife.an_append_that_stores_nothing_changes_nothing(self, data, replace)

    @precondition(lambda self: not self.appends_refused)
    @rule(data=st.data())
    def append_duplicate_is_refused(self, data: st.DataObject) -> None:
        StoreLife.append_duplicate_is_refused(self, data)

    @rule(data=st.data())
    def rerun(self, data: st.DataObject) -> None:
        refused_or(lambda: StoreLife.rerun(self, data))

    @rule(shards=st.none() | st.integers(1, 3))
    def compact_in_place(self, shards: int | None) -> None:
        if self.encoding == "int8":
            self.compaction_refused(lambda: dilstore.compact(self.store, shards=shards, no_progress=True), True)
        else:
            StoreLife.compact_in_place(self, shards)

    @rule(shards=st.none() | st.integers(1, 3))
    def compact_into_a_copy(self, shards: int | None) -> None:
        if self.encoding == "int8":
            copy = self.folder / f"copy-{self.copies + 1}"
            self.compaction_refused(lambda: dilstore.compact(self.store, output=copy, shards=shards, no_progress=True))
            assert not copy.exists()
            return
        stopped = self.stop is not None
        try:
            StoreLife.compact_into_a_copy(self, shards)
        except dilstore.DilstoreError as error:
            # Stopped after its commit point (the copy's manifest), the compaction had made the copy, which the same
            # command then refuses as "not an empty folder", and a stop before it carried the BM25 index along left
            # none, or part of one: the user indexes the copy (left alone, state56's report).
            assert stopped and "exists and is not an empty folder" in str(error), error
            assert (self.store / "manifest.json").is_file(), error
            event("a compaction into a copy stopped after its commit point")
            self.epoch += 1
            if self.index == "stale":
                self.index = None
            elif self.index == "fresh":
                self.jvm.ask(op="index", store=str(self.store))

    def compaction_refused(self, command: Callable[[], Any], in_place: bool = False) -> None:
        """An int8 store's compaction is refused, and one in place of a store compact already (no appends, no
        superseded rows, the shard count asked for) finds nothing to do: either way the store is unchanged."""
        self.stop = None  # nothing is written: nothing to stop
        before = sorted(path.relative_to(self.store).as_posix() for path in self.store.rglob("*"))
        try:
            summary = command()
        except dilstore.DilstoreError as error:
            assert "int8 codes are scaled per shard" in str(error), error
        else:
            assert in_place and summary["already_compact"] is True, summary
        assert sorted(path.relative_to(self.store).as_posix() for path in self.store.rglob("*")) == before

    # -- invariants ------------------------------------------------------------------------------------------------

    @invariant()
    def nothing_is_left_beside_the_store(self) -> None:
        """No lock, building folder or old copy of a stopped command, once the command ran again."""
        left = [path.name for path in self.folder.iterdir() if path.name.startswith(".")]
        # But the lock files a killed compaction into a copy left beside the store it copied, which its run again,
        # refused, did not take over: the life went on in the copy (the module's docstring).
        others = [name for name in left if not name.startswith(f".{self.store.name}.")]
        assert [name for name in left if name not in others or not name.endswith(LOCKS)] == []


class Refused(Exception):
    """An append that the store's small 2bit codebook refused, as the model expected: the rule changes nothing."""


def refused_or(rule_body: Callable[[], None]) -> None:
    try:
        rule_body()
    except Refused:
        pass


def test_a_store_serves_its_model_through_stopped_commands_encodings_and_kinds(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    from dilstore.reader.modeling.earl import EarlConfig, EarlRanker
    from tests.fixtures.earl_tiny import text_encoder, tokenizer

    folder = tmp_path_factory.mktemp("stops-models")
    StoppedStoreLife.models = {
        "dilbert": save_tiny_reader(folder / "tiny"),
        "earl": EarlRanker.from_encoder(text_encoder(), tokenizer(), EarlConfig()).save_pretrained(folder / "earl"),
    }
    StoppedStoreLife.jvm = JvmChild()
    StoppedStoreLife.base = tmp_path_factory.mktemp("stops")
    try:
        run_state_machine_as_test(StoppedStoreLife, settings=settings(
            max_examples=12, stateful_step_count=6, deadline=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much]))  # fmt: skip
    finally:
        StoppedStoreLife.jvm.close()
