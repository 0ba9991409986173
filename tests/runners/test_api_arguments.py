"""The Python API refuses arguments of the wrong type by name, before any layer trips on them.

Each call below was a bare TypeError or AttributeError from deep inside
(`mu='x'` a ValueError from float()), far from the argument that caused it.
"""

from __future__ import annotations

import argparse
import sys
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import dilstore
from dilstore.reader.serving.odqa import OpenDomainReader
from dilstore.runners.arg_types import (
    MAX_SEED,
    integer_at_least,
    non_negative_int,
    numpy_seed,
    option_words,
    positive_int,
    sample_seed,
    torch_device,
)
from tests.fixtures.store_fixtures import build_store, random_shards


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda root: dilstore.open_store(None), "path must be a folder path or URL, got NoneType None"),
        (lambda root: dilstore.open_store(root, storage_options=5), "storage_options must be a dict"),
        (lambda root: dilstore.open_store(root, check_files=1), "check_files must be True or False, got int 1"),
        (lambda root: dilstore.open_reader(root, mu="x"), "mu must be a number from 0 to 1 or None, got str 'x'"),
        (lambda root: dilstore.open_reader(root, top_p=2.5), "top_p must be a positive integer or None"),
        (lambda root: dilstore.open_reader(root, top_p=True), "top_p must be a positive integer or None, got bool"),
        (lambda root: dilstore.open_reader(root, model=3), "model must be a model folder or None, got int 3"),
        (lambda root: dilstore.open_reader(root, index=[root]), "index must be an index folder or None, got list"),
        (lambda root: dilstore.open_reader(root, device=0), "device must be a torch device name or None"),
        (lambda root: dilstore.open_reader(root, device="bogus"), "device: not a torch device: 'bogus' (expected"),
        (lambda root: dilstore.open_reranker(root, device="meta"), "device: meta: dilstore runs on cpu, cuda or mps"),
        (lambda root: dilstore.open_reranker(b"store"), "store must be a store path or URL, got bytes"),
        (lambda root: dilstore.build_index(root, threads="2"), "threads must be a positive integer, got str '2'"),
        (lambda root: dilstore.build_index(root, no_progress="yes"), "no_progress must be True or False, got str"),
        (lambda root: dilstore.evaluate_qa(None, root), "reader must be a reader from open_reader, got NoneType"),
        # It said "--limit must be at least 1", the command's flag (readme37 L1).
        (lambda root: dilstore.evaluate_qa(object.__new__(OpenDomainReader), root, limit=0),
         "limit must be at least 1, got 0"),
        # random.Random takes -1 as 1: the subset of seed 1, without a word (left55b F1); refused before the file loads.
        (lambda root: dilstore.evaluate_qa(object.__new__(OpenDomainReader), root, limit=2, seed=-1),
         "seed must be at least 0, got -1: Python's random seeds with its absolute value"),
        # Read as one flag per item or character: ./98 got a store, input=[] the embedded corpus (readme37 M1, M2).
        (lambda root: dilstore.precompute(output=b"ab"), "output must be a path, got bytes b'ab'"),
        (lambda root: dilstore.precompute(output=["a", "b"]), "output must be a path, got list"),
        (lambda root: dilstore.precompute(input=[]), "input is an empty list: give one file or more"),
        (lambda root: dilstore.precompute(input=5), "input must be a file path or a list of them, got int 5"),
        (lambda root: dilstore.precompute(input=["a.jsonl", b"b"]), "input must be a file path or a list of them"),
        (lambda root: dilstore.precompute(workers=True), "workers must be an integer, got bool True"),
        (lambda root: dilstore.precompute(overwrite="yes"), "overwrite must be True or False, got str 'yes'"),
        (lambda root: dilstore.precompute(beam_options={"temp_location": {}}),
         "temp_location must be a Beam option value"),
        (lambda root: dilstore.precompute(beam_options={5: "x"}), "a Beam option's name must be a string, got int 5"),
        # Taken, it did nothing: the function prints no summary (left55 F7).
        (lambda root: dilstore.precompute(input="c.jsonl", json=True),
         "json=True asks for the summary `dilstore precompute --json` prints on stdout, which precompute() never "
         "prints: read STORE/run-summary.json instead"),
        # (mut55) json=False, the default said out loud, is taken: the call goes on to its (missing) input.
        (lambda root: dilstore.precompute(input="c.jsonl", json=False), "input file not found: c.jsonl"),
        (lambda root: dilstore.precompute(output="a", beam_options={"overwrite": True, "output": "b"}),
         "beam_options holds 'overwrite', which is a flag of `dilstore precompute`, not a Beam option: give it as a "
         "keyword"),
    ],
)
def test_wrong_argument_types_raise_dilstore_error_naming_the_argument(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, call, message: str
) -> None:
    monkeypatch.chdir(tmp_path)  # where a precompute that took its arguments would write
    with pytest.raises(dilstore.DilstoreError) as raised:
        call(tmp_path)
    assert message in str(raised.value)


def test_open_reader_takes_every_reader_option_of_ask(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`n_best=3` was a TypeError: ask's --n-best, --max-answer-length, ... had no keyword (odqa43 L5)."""
    from dilstore.reader.serving import odqa

    seen = []
    monkeypatch.setattr(odqa, "open_reader", lambda *args, settings, **kwargs: seen.append(settings))
    options = {"top_p": 7, "mu": 0.25, "n_best": 3, "max_answer_length": np.int64(5), "max_question_length": 20,
               "pair_batch_tokens": 4096, "max_pairs_per_batch": 8}  # fmt: skip
    dilstore.open_reader(tmp_path, **options)
    assert seen == [odqa.OdqaSettings(**{name: int(value) if name != "mu" else value
                                         for name, value in options.items()})]  # fmt: skip
    assert type(seen[0].max_answer_length) is int
    dilstore.open_reader(tmp_path, mu=np.float32(0.5))  # refused: "mu must be a number ..., got float32" (qa48 L5)
    assert seen[-1].mu == 0.5 and type(seen[-1].mu) is float
    for bm25_only in (0, 0.0):  # μ = 0 is BM25 alone (`ask --mu 0`), a value like any other, not "no mu given"
        dilstore.open_reader(tmp_path, mu=bm25_only)
        assert seen[-1].mu == 0.0 and seen[-1].mu != odqa.OdqaSettings().mu
    with pytest.raises(dilstore.DilstoreError, match="^n_best must be a positive integer or None, got str '3'$"):
        dilstore.open_reader(tmp_path, n_best="3")
    with pytest.raises(dilstore.DilstoreError, match="n_best"):
        dilstore.open_reader(tmp_path, n_best=0)


def test_open_reranker_takes_rerank_s_query_and_batch_options_checked_as_the_command_checks_them(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """(left55 F4) `max_query_length=16` was a TypeError: `rerank`'s --max-query-length, --pair-batch-tokens and
    --max-pairs-per-batch had no keyword (a program had to build RerankSettings from the serving layer)."""
    from dilstore.reader.serving import rerank

    seen = []
    monkeypatch.setattr(rerank, "open_reranker", lambda *args, settings, **kwargs: seen.append(settings))
    dilstore.open_reranker(tmp_path, max_query_length=np.int64(16), pair_batch_tokens=4096, max_pairs_per_batch=8)
    assert seen == [rerank.RerankSettings(max_query_length=16, pair_batch_tokens=4096, max_pairs_per_batch=8)]
    assert type(seen[0].max_query_length) is int
    dilstore.open_reranker(tmp_path)
    assert seen[-1] == rerank.RerankSettings()
    for keyword, value, message in [("max_query_length", 2, "max_query_length must be at least 3, got 2"),
                                    ("pair_batch_tokens", 0, "pair_batch_tokens must be at least 1, got 0"),
                                    ("max_pairs_per_batch", -1, "max_pairs_per_batch must be at least 1, got -1"),
                                    ("max_query_length", "16", "max_query_length must be an integer of at least 3 "
                                                               "or None, got str '16'"),
                                    ("max_pairs_per_batch", 8.0, "max_pairs_per_batch must be a positive integer or "
                                                                 "None, got float 8.0")]:  # fmt: skip
        with pytest.raises(dilstore.DilstoreError) as raised:
            dilstore.open_reranker(tmp_path, **{keyword: value})
        assert str(raised.value) == message
    assert len(seen) == 2


@given(value=st.integers(-3, 6))
def test_open_reranker_takes_exactly_the_query_lengths_and_batch_limits_rerank_takes(value: int) -> None:
    """(left55 F4) The keywords' bounds are the flags' (`integer_at_least(3)`, `positive_int`)."""
    from dilstore.reader.serving.rerank import RerankSettings

    for keyword, parse in (("max_query_length", integer_at_least(3)), ("pair_batch_tokens", positive_int),
                           ("max_pairs_per_batch", positive_int)):  # fmt: skip
        try:
            parse(str(value))
            taken = True
        except argparse.ArgumentTypeError:
            taken = False
        try:
            RerankSettings(**{keyword: value})
            settled = True
        except dilstore.DilstoreError:
            settled = False
        assert settled == taken, keyword


def test_a_long_wrong_value_is_cut_in_the_message(tmp_path: Path) -> None:
    with pytest.raises(dilstore.DilstoreError) as raised:
        dilstore.open_reader(tmp_path, mu="μ" * 1000)
    assert len(str(raised.value)) < 200


def test_precompute_hands_beam_options_to_beam_under_beam_s_own_names(tmp_path: Path, monkeypatch) -> None:
    """Every underscore became a dash: `dask_client_address=` was refused as unknown by its right name, and a
    given `temp_location=` was reported missing (readme37 M3). They go in `beam_options`, apart from the typed
    flags (style49 M1)."""
    from dilstore.runners import cmd_precompute

    seen: list[argparse.Namespace] = []
    monkeypatch.setattr(cmd_precompute, "precompute_store", lambda args: (seen.append(args), ({}, None, None))[1])
    dilstore.precompute(input=str(tmp_path / "c.jsonl"), output=str(tmp_path / "s"),
                        beam_options={"temp_location": "/tmp/t", "experiments": ["a", "b"],
                                      "save_main_session": True, "dask_client_address": None})  # fmt: skip
    assert seen[0].beam_args == ["--temp_location=/tmp/t", "--experiments=a", "--experiments=b",
                                 "--save_main_session"]  # fmt: skip
    assert seen[0].output == str(tmp_path / "s")


def test_a_stopped_precompute_raises_keyboard_interrupt_not_an_input_error(tmp_path: Path, monkeypatch) -> None:
    """Ctrl-C arrived as StoppedBySignal, a DilstoreError: a caller's `except DilstoreError` loop over corpora took
    the user's stop for a bad corpus and went on to the next (api39 M1)."""
    from dilstore.runners import cmd_precompute
    from dilstore.storage.errors import StoppedBySignal

    def stopped(args: argparse.Namespace) -> None:
        raise StoppedBySignal("interrupted; run the same command again to go on (the shards it finished are kept)", 2)

    monkeypatch.setattr(cmd_precompute, "precompute_store", stopped)
    with pytest.raises(KeyboardInterrupt, match="the shards it finished are kept") as raised:
        dilstore.precompute(input=str(tmp_path / "c.jsonl"), output=str(tmp_path / "s"))
    assert not isinstance(raised.value, dilstore.DilstoreError) and raised.value.__cause__.signal_number == 2


def test_open_store_takes_check_files_as_the_readme_says(tmp_path: Path) -> None:
    """The README's Python API section tells long-running programs to pass it; it was a TypeError."""
    root = build_store(tmp_path / "store", random_shards([2], state_shape=(4,), seed=1), encoding="fp16")
    with dilstore.open_store(root, check_files=True) as checked, dilstore.open_store(root) as plain:
        assert (checked.check_files, plain.check_files) == (True, False)


def test_precompute_options_name_every_flag_of_the_command() -> None:
    """`dilstore.precompute(**options)` was typed `Any`: its TypedDict lists the command's flags, and a flag added to
    the command without it (or an option left after the flag went) fails here."""
    import argparse
    import typing

    from dilstore.api import PrecomputeOptions
    from dilstore.runners.cli import build_parser

    commands = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)).choices
    flags = {action.dest for action in commands["precompute"]._actions} - {"help"}
    assert set(typing.get_type_hints(PrecomputeOptions)) == flags


def test_precompute_takes_a_list_of_str_or_of_path_as_a_type_checker_reads_its_hints() -> None:
    """`files = ["a.jsonl", "b.jsonl"]; precompute(input=files)` failed type checking: `input` was typed
    `list[str | Path]`, which a list[str] (or `sorted(folder.glob(...))`, a list[Path]) is not, list being invariant;
    so did a list[str] Beam option value such as `{"experiments": ["use_runner_v2"]}` (types58 F6)."""
    import typing

    from dilstore.api import BeamValue, PrecomputeOptions

    inputs = typing.get_args(typing.get_type_hints(PrecomputeOptions)["input"])
    assert {list[str], list[Path], tuple[str | Path, ...]} <= set(inputs)
    assert {list[str], list[int], tuple[str | Path | int | float | bool, ...]} <= set(typing.get_args(BeamValue))


# A value of exactly "--" is argparse's own (Python 3.11 drops it from an option's values, even after "=").
WORDS = st.text(alphabet="-ab.1 ", min_size=1, max_size=8).filter(lambda word: word != "--")


@given(value=WORDS, values=st.lists(WORDS, min_size=1, max_size=3))
def test_option_words_parse_back_even_when_a_value_begins_with_a_dash(value: str, values: list[str]) -> None:
    """`dilstore.precompute(input="-data.jsonl")` gave argparse `--input -data.jsonl`, which it read as two options."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--input")
    parser.add_argument("--index", action="append")
    parser.add_argument("--json", action="store_true")
    words = option_words({"input": value, "index": values, "json": True, "unset": None})
    assert vars(parser.parse_args(words)) == {"input": value, "index": values, "json": True}


def test_build_index_reads_a_store_named_like_an_option_as_the_store(tmp_path: Path, monkeypatch) -> None:
    """`dilstore.build_index("-x")` was refused as if "-x" were an option."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(dilstore.DilstoreError, match="-x"):
        dilstore.build_index("-x")


def test_refused_options_leave_the_process_streams_alone_even_from_two_threads(capsys) -> None:
    """Parsing swapped sys.stdout and sys.stderr for an in-memory buffer, for every thread: two calls at once could
    leave them swapped for good, and other threads' prints went into the buffer meanwhile (api39 H1)."""
    streams = (sys.stdout, sys.stderr)
    seen, errors = [], []

    def refused() -> None:
        for _ in range(40):
            try:
                dilstore.precompute(input="corpus.jsonl", split="bogus")
            except dilstore.DilstoreError as error:
                errors.append(str(error))

    threads = [threading.Thread(target=refused) for _ in range(2)]
    for thread in threads:
        thread.start()
    while any(thread.is_alive() for thread in threads):
        seen.append((sys.stdout, sys.stderr) == streams)
    for thread in threads:
        thread.join()
    assert all(seen) and (sys.stdout, sys.stderr) == streams
    assert len(errors) == 80 and errors[0].startswith("dilstore precompute: error: argument --split: invalid choice")
    assert capsys.readouterr() == ("", "")  # nothing printed: no usage block either


def test_numpy_integers_are_taken_as_integers(tmp_path: Path, monkeypatch) -> None:
    """`top_p=np.int64(3)` was refused as "must be a positive integer or None, got int64 3" (api39 L1)."""
    from dilstore.reader.serving import odqa
    from dilstore.runners import cmd_precompute

    seen: list[Any] = []
    monkeypatch.setattr(cmd_precompute, "precompute_store", lambda args: (seen.append(args), ({}, None, None))[1])
    dilstore.precompute(input=str(tmp_path / "c.jsonl"), workers=np.int64(2), shards=np.int32(3))
    assert (seen[0].workers, seen[0].shards) == (2, 3)
    monkeypatch.setattr(odqa, "open_reader", lambda *args, **kwargs: seen.append(kwargs["settings"]))
    dilstore.open_reader("STORE", top_p=np.int64(3))
    assert seen[1].top_p == 3 and type(seen[1].top_p) is int
    with pytest.raises(dilstore.DilstoreError, match="top_p must be a positive integer or None, got float64"):
        dilstore.open_reader("STORE", top_p=np.float64(3))


@pytest.mark.parametrize(
    ("parse", "low", "high"),
    [(positive_int, 1, None), (non_negative_int, 0, None), (integer_at_least(3), 3, None), (numpy_seed, 0, MAX_SEED),
     (sample_seed, 0, None)],
)
@given(offset=st.integers(-3, 3))
def test_an_integer_option_takes_its_bounds_and_refuses_what_lies_past_them(parse, low: int, high, offset: int) -> None:
    """Each bound is a value the option takes (`--seed 4294967295` is numpy's largest seed); one past it is a usage
    error."""
    for value in [low + offset] + ([] if high is None else [high + offset]):
        inside = low <= value and (high is None or value <= high)
        if inside:
            assert parse(str(value)) == value
        else:
            with pytest.raises(argparse.ArgumentTypeError, match=f"got {value}$"):
                parse(str(value))


@given(seed=st.integers(-2, 3) | st.integers(2**32 - 3, 2**32 + 2))
def test_a_seed_option_takes_exactly_the_seeds_numpy_takes(seed: int) -> None:
    try:
        np.random.RandomState(seed)
        numpy_takes = True
    except ValueError:
        numpy_takes = False
    try:
        numpy_seed(str(seed))
        taken = True
    except argparse.ArgumentTypeError:
        taken = False
    assert taken == numpy_takes


@pytest.mark.parametrize(
    ("count", "device", "taken"),
    [(1, "cuda", True), (1, "cuda:0", True), (1, "cuda:1", False), (2, "cuda:1", True), (2, "cuda:2", False),
     (0, "cuda", False)],
)  # fmt: skip
def test_a_cuda_device_is_taken_only_when_the_machine_has_it(monkeypatch, count: int, device: str, taken: bool) -> None:
    """A machine with one GPU has cuda:0 only: cuda:1 is a usage error now, not torch's error at the first tensor."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: count > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
    if taken:
        assert torch_device(device) == device
    else:
        with pytest.raises(argparse.ArgumentTypeError, match=f"this machine has {count} CUDA device"):
            torch_device(device)


def test_a_precompute_that_rejected_records_warns_as_the_command_says_it(tmp_path: Path, monkeypatch) -> None:
    """The command says "3 record(s) rejected ...: STORE/rejected/ says why" on stderr; `dilstore.precompute`
    returned the store's path and nothing else, so a program learnt of the records left out only by reading
    run-summary.json (api54 F3). A clean run warns of nothing."""
    import warnings

    from dilstore.runners import cmd_precompute

    store = tmp_path / "s"
    where = {"store": str(store), "rejected_records": "rejected"}
    summaries = [{**where, "rejected": 3, "rejected_passages": 2}, {**where, "rejected": 0, "rejected_passages": 0}]
    monkeypatch.setattr(cmd_precompute, "precompute_store", lambda args: (summaries.pop(0), None, None))
    with pytest.warns(UserWarning) as warned:
        assert dilstore.precompute(input=str(tmp_path / "c.jsonl"), output=str(store)) == store
    assert [str(warning.message) for warning in warned] == [
        f"dilstore precompute: 3 record(s) rejected and 2 passage(s) of documents left out: {store / 'rejected'}/ "
        "says why, one JSON line each"
    ]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        dilstore.precompute(input=str(tmp_path / "c.jsonl"), output=str(store))
