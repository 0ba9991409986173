"""The public Python API: open a store, answer or rerank over it, run precompute, build its index, evaluate.

Each function is a thin, documented door onto the layers (`dilstore.storage`,
`dilstore.reader`, `dilstore.pipelines`, `dilstore.runners`), the way
pyserini's `LuceneSearcher` or ColBERT's `Indexer`/`Searcher` front theirs;
the command line and these functions run the same code. Model arguments
default to the checkpoints shipped in the package.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import numbers
import os
import random
import typing
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict, Unpack

from dilstore.storage.checks import is_integer, require_at_least_one
from dilstore.storage.errors import DilstoreError, StoppedBySignal

if TYPE_CHECKING:  # the heavy layers load on first use, so `import dilstore` stays light
    from dilstore.reader.evaluation.open_domain import QAEvaluation
    from dilstore.reader.evaluation.rank_metrics import RankEvaluation
    from dilstore.reader.serving.odqa import OpenDomainReader
    from dilstore.reader.serving.rerank import StoreReranker
    from dilstore.storage.reader import Store
    from dilstore.storage.verify import VerifyReport

PathLike = str | Path
# Lists as a program builds them: `files = ["a.jsonl", "b.jsonl"]` is a list[str], `sorted(folder.glob("*.jsonl"))` a
# list[Path], neither a list[str | Path] (list is invariant), so `input=files` failed type checking (types58 F6).
PathList = list[str] | list[Path] | list[PathLike] | tuple[PathLike, ...]
BeamItem = str | Path | int | float | bool
BeamValue = BeamItem | list[str] | list[Path] | list[int] | list[float] | list[BeamItem] | tuple[BeamItem, ...]
_PATH = (str, Path)
_OPTIONAL_PATH = (str, Path, type(None))


def open_store(
    path: PathLike, *, storage_options: dict[str, Any] | None = None, check_files: bool = False
) -> Store:
    """A finalized store, read-only: `store.fetch(ids)`, `store.missing(ids)` (those it lacks, in one lookup),
    `id in store`, `len(store)`, `store.fingerprint`, `store.manifest`.

    `path` is a local folder (memory-mapped) or an fsspec URL such as
    https://host/store or s3://bucket/store; `storage_options` go to that
    URL's fsspec filesystem (credentials, endpoint). `check_files`: for a
    program that keeps a local store open, each lookup first checks that the
    store's files it reads are as they were (README, Python API).
    """
    from dilstore.storage.reader import open_store as open_shard_store

    _check("path", path, _PATH, "a folder path or URL")
    _check("storage_options", storage_options, (dict, type(None)), "a dict of fsspec options or None")
    _check("check_files", check_files, (bool,), "True or False")
    return open_shard_store(path, storage_options=storage_options, check_files=check_files)


def open_reader(
    store: PathLike,
    model: PathLike | None = None,
    *,
    index: PathLike | None = None,
    top_p: int | None = None,
    mu: float | None = None,
    device: str | None = None,
    online_variant: bool = True,
    n_best: int | None = None,
    max_answer_length: int | None = None,
    max_question_length: int | None = None,
    pair_batch_tokens: int | None = None,
    max_pairs_per_batch: int | None = None,
) -> OpenDomainReader:
    """An open-domain reader over a dilbert store and its BM25 index: `reader.answer(question).text`.

    `model` defaults to the shipped reader and must be the one that made the
    store; `index` defaults to STORE/bm25 (see `build_index`). `top_p` and
    `mu` override the passages read per question and the reader/BM25 score mix; `n_best`,
    `max_answer_length`, `max_question_length`, `pair_batch_tokens` and `max_pairs_per_batch` are `ask`'s flags
    of those names (None: the command's default).
    `online_variant`: over a store of an encoding the model ships online layers for (`online-ENC.safetensors`,
    trained on that encoding's decoded states; the shipped reader has `online-2bit`), read with those, as `ask`
    does; False reads with its own (`ask --no-online-variant`). `reader.read_with` names the store's encoding and
    the online layers file used (or None), as `ask --json` prints them.
    """
    from dilstore.reader.serving.odqa import OdqaSettings
    from dilstore.reader.serving.odqa import open_reader as open_odqa_reader

    _check("store", store, _PATH, "a store path or URL")
    _check("model", model, _OPTIONAL_PATH, "a model folder or None")
    _check("index", index, _OPTIONAL_PATH, "an index folder or None")
    _check("mu", mu, (int, float, type(None)), "a number from 0 to 1 or None")
    _check_device(device)
    _check("online_variant", online_variant, (bool,), "True or False")
    counts = {"top_p": top_p, "n_best": n_best, "max_answer_length": max_answer_length,
              "max_question_length": max_question_length, "pair_batch_tokens": pair_batch_tokens,
              "max_pairs_per_batch": max_pairs_per_batch}  # fmt: skip
    for name, value in counts.items():
        _check(name, value, (int, type(None)), "a positive integer or None")
    chosen = {name: _int(value) for name, value in counts.items() if value is not None}
    if mu is not None:
        chosen["mu"] = float(mu)  # a numpy float too (qa48 L5)
    return open_odqa_reader(store, model, index_dir=index, settings=OdqaSettings(**chosen), device=device,
                            online_variant=online_variant)  # fmt: skip


def open_reranker(
    store: PathLike,
    model: PathLike | None = None,
    *,
    device: str | None = None,
    max_query_length: int | None = None,
    pair_batch_tokens: int | None = None,
    max_pairs_per_batch: int | None = None,
) -> StoreReranker[Any]:
    """A reranker over an earl-s1, earl-s2 or listformer store: `reranker.rerank(query, doc_ids)` → {doc_id: score}.

    `model` must be the one that made the store; it defaults to the shipped
    EARL ranker for EARL stores and to the shipped Listformer for Listformer stores.
    `max_query_length`, `pair_batch_tokens` and `max_pairs_per_batch` are `rerank`'s flags of those names (None:
    the command's default), checked as it checks them; a Listformer checks but does not use the batch limits.
    """
    from dilstore.reader.serving.rerank import RerankSettings
    from dilstore.reader.serving.rerank import open_reranker as open_store_reranker

    _check("store", store, _PATH, "a store path or URL")
    _check("model", model, _OPTIONAL_PATH, "a model folder or None")
    _check_device(device)
    limits = {"max_query_length": max_query_length, "pair_batch_tokens": pair_batch_tokens,
              "max_pairs_per_batch": max_pairs_per_batch}  # fmt: skip
    for name, value in limits.items():
        least = "an integer of at least 3" if name == "max_query_length" else "a positive integer"
        _check(name, value, (int, type(None)), f"{least} or None")
    # The settings refuse a value out of range, as the command's flags do, before the store and the ranker load.
    settings = RerankSettings(**{name: _int(value) for name, value in limits.items() if value is not None})
    return open_store_reranker(store, model, settings=settings, device=device)


class PrecomputeOptions(TypedDict, total=False):
    """`precompute`'s keywords: the flags of `dilstore precompute` by their Python names (see its --help for what
    each does and its default; a test keeps the two lists equal)."""

    input: PathLike | PathList
    format: str
    split: str
    output: PathLike
    model: PathLike
    kind: str
    layers: int
    encoding: str
    codebook: PathLike
    compression: str
    max_length: int
    shards: int
    overwrite: bool
    append: bool
    replace: bool
    runner: str
    workers: int
    threads: int
    batch_tokens: int
    no_progress: bool
    json: bool
    verbose: bool


def precompute(*, beam_options: Mapping[str, BeamValue] | None = None, **options: Unpack[PrecomputeOptions]) -> Path:
    """Run `dilstore precompute` from Python and return the store's path.

    Options are the command's flags as keywords (`PrecomputeOptions`), parsed
    by the command's own parser: `input=["a.jsonl", "b.jsonl"]` repeats
    `--input`, `workers=1` is `--workers 1`, `overwrite=True` is the bare
    `--overwrite` (False and None leave a flag out); another keyword is an
    error naming it. `beam_options` are Beam pipeline options under Beam's
    own names (`{"temp_location": "gs://b/tmp", "dask_client_address":
    "tcp://host:8786"}`), as the command hands its other flags to Beam: apart
    from the flags, so that a type checker sees each keyword's type
    (style49 M1). No options run the embedded default corpus, as the command
    does; an empty `input` is refused. An invalid option or a value of the
    wrong type raises DilstoreError. Ctrl-C (SIGINT) during the run raises
    KeyboardInterrupt, whose message says what was kept (the shards
    finished: the same call again goes on), as a stop is no input error.
    SIGTERM and SIGHUP keep the caller's own handlers (by default they end
    the process; the command line turns them into the same stop). Nothing
    is printed on stdout, which may be the caller's own channel: the
    command's summary is in STORE/run-summary.json (`json=True`, which asks for it on stdout, is refused).
    A run that rejected records (or left passages out) warns (UserWarning) with the line the command prints on
    stderr, naming how many and where the dead letters say why. A store already complete
    with these settings is left as it is, without a word on stderr (the
    command says so): its run-summary.json is then the earlier build's.
    """
    from dilstore.runners.arg_types import option_words
    from dilstore.runners.cli import parse
    from dilstore.runners.cmd_precompute import DEFAULT_OUTPUT, precompute_store, rejected_line

    own = typing.get_type_hints(PrecomputeOptions)
    _check("beam_options", beam_options, (Mapping, type(None)), "a mapping of Beam option names to values, or None")
    for name, value in options.items():
        if name not in own:
            raise DilstoreError(f"precompute has no option {name!r}: its keywords are the flags of `dilstore "
                                "precompute` (PrecomputeOptions); Beam's options go in beam_options")  # fmt: skip
        _check_precompute_option(name, value, own[name])
    if options.get("json"):  # taken, it did nothing: the function prints no summary (left55 F7)
        raise DilstoreError("json=True asks for the summary `dilstore precompute --json` prints on stdout, which "
                            "precompute() never prints: read STORE/run-summary.json instead, and leave json out")
    for name, value in (beam_options or {}).items():
        _check("a Beam option's name", name, (str,), "a string")
        if name in own:  # parsed as the flag: set unchecked, over the keyword (review49 F2)
            raise DilstoreError(f"beam_options holds {name!r}, which is a flag of `dilstore precompute`, not a Beam "
                                "option: give it as a keyword")  # fmt: skip
        if name == "help":
            raise DilstoreError("beam_options holds 'help', which asks for the usage `dilstore precompute --help` "
                                "prints; nothing was run")  # fmt: skip
        _check_precompute_option(name, value, None)
    words = option_words(dict(options))
    beam = option_words(dict(beam_options or {}), beam=True)
    args = _parsed("precompute", lambda parser: parse(parser, ["precompute", *words, *beam]))
    held = random.getstate()  # Beam runs in this process and draws from the caller's `random` stream
    try:
        with _loops_as_os_errors():
            summary, empty, _ = precompute_store(args)
    except StoppedBySignal as stop:  # the user's stop, not bad input: `except DilstoreError` must not swallow it
        raise KeyboardInterrupt(str(stop)) from stop
    finally:
        random.setstate(held)
    if empty is not None:
        raise DilstoreError(empty)
    rejected = rejected_line(summary)
    if rejected is not None:  # the command's line; unsaid, a program learnt of it from run-summary.json (api54 F3)
        warnings.warn(rejected, UserWarning, stacklevel=2)
    return Path(args.output if args.output is not None else DEFAULT_OUTPUT)


def _check_precompute_option(name: str, value: object, hint: object) -> None:
    """Raise DilstoreError naming `name` unless `value` suits its flag (`hint`, None for a Beam option).

    A wrong type was read as something else: bytes and other iterables as one flag per item (`output=b"ab"`
    wrote a store to ./98), `input=[]` as no input (the embedded default corpus).
    """
    if value is None:
        return
    if hint is None:
        items = value if isinstance(value, list | tuple) else [value]
        for item in items:
            _check(name, item, (str, Path, int, float, bool), "a Beam option value (a string, number or bool)")
        return
    if name == "input" and not isinstance(value, _PATH):
        _check(name, value, (list, tuple), "a file path or a list of them")
        if not value:
            raise DilstoreError("input is an empty list: give one file or more (leave input out to run the "
                                "embedded default corpus)")  # fmt: skip
        for item in value:
            _check(name, item, _PATH, "a file path or a list of them")
        return
    kinds = typing.get_args(hint) or (hint,)
    _check(name, value, kinds, _EXPECTED.get(kinds, " or ".join(kind.__name__ for kind in kinds)))


_EXPECTED = {(bool,): "True or False", (int,): "an integer", (str,): "a string", _PATH: "a path"}


def _parsed(command: str, parse: Callable[[argparse.ArgumentParser], argparse.Namespace]) -> argparse.Namespace:
    """The command's arguments as `parse` reads them with the command line's parser, whose every (sub)parser
    raises a DilstoreError where argparse would print and exit (`_raising`).

    argparse prints a usage block and `dilstore CMD: error: ...` to stderr, then exits 2, which would end the
    caller's process: the error line is the exception's message, and nothing is printed (a help option, which
    would print the usage on the caller's stdout and exit 0, is refused too). `sys.stdout` and `sys.stderr` are
    not swapped for the parse: that swaps them for every thread, and two calls at once could leave them swapped.
    """
    from dilstore.runners.cli import build_parser

    parser = build_parser()
    for each in _every_parser(parser):
        _raising(each, command)
    return parse(parser)


def _every_parser(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    """`parser` and the parsers of all its subcommands, at every depth (`train earl`'s too)."""
    found = [parser]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in dict.fromkeys(action.choices.values()):  # an alias maps to its command's parser again
                found += _every_parser(child)
    return found


def _raising(parser: argparse.ArgumentParser, command: str) -> None:
    """Make `parser` raise DilstoreError where it would print and exit: its error line, or the usage refused."""

    def error(message: str) -> typing.NoReturn:
        raise DilstoreError(f"{parser.prog}: error: {message}")

    def usage(*_: object) -> typing.NoReturn:
        raise DilstoreError(f"the options ask for {command}'s usage, which `dilstore {command} --help` prints; "
                            "nothing was run")  # fmt: skip

    parser.error = error  # type: ignore[method-assign]
    parser.print_help = parser.print_usage = parser.exit = usage  # type: ignore[method-assign]


@contextlib.contextmanager
def _loops_as_os_errors() -> Iterator[None]:
    """Python 3.11's and 3.12's `Path.resolve()` error for a loop of symbolic links as the OSError (ELOOP) naming the
    path that Python 3.13 raises: `precompute(output=LOOP)` and `compact(LOOP)` raised pathlib's RuntimeError, which
    a program's `except OSError` missed, where the command line says one line (left58b F5)."""
    try:
        yield
    except RuntimeError as error:
        from dilstore.runners.cli import symlink_loop

        if (loop := symlink_loop(error)) is None:
            raise
        raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), loop) from None


def build_index(store: PathLike, *, threads: int = 1, no_progress: bool = False) -> Path:
    """Build STORE/bm25, the Lucene BM25 index over the store's passages (as `dilstore index`); returns its path.

    A progress bar over the passages goes to stderr unless `no_progress`.
    """
    from dilstore.reader.retrieval import bm25_index_dir
    from dilstore.runners.arg_types import option_words
    from dilstore.runners.cmd_index import index_store

    _check("store", store, _PATH, "a store folder")
    _check("threads", threads, (int,), "a positive integer")
    _check("no_progress", no_progress, (bool,), "True or False")
    argv = ["index", *option_words({"threads": threads, "no_progress": no_progress}), "--", str(store)]
    args = _parsed("index", lambda parser: parser.parse_args(argv))
    index_store(args)
    return bm25_index_dir(store)


def compact(store: PathLike, *, output: PathLike | None = None, shards: int | None = None,
            no_progress: bool = False) -> dict[str, Any]:
    """Compact the store as `dilstore compact` does (README "compact"): its live passages rewritten into fewer
    shards, their states copied exactly; in place, or into `output` leaving `store` as it is. Returns the summary
    `--json` prints (`already_compact`, `passages`, `shards`, `shards_before`, `superseded_rows_dropped`, `files`,
    `bytes`, ..., and `finished`: what it finished of a stopped compaction's work first, in words; the same keys for
    a store compact already, with `already_compact` True and why in `reason`). A
    progress bar goes to stderr unless `no_progress`. Ctrl-C raises KeyboardInterrupt saying whether the compacted
    store is in place, as `precompute`'s does.
    """
    from dilstore.runners.arg_types import option_words
    from dilstore.runners.cmd_compact import compact_command

    _check("store", store, _PATH, "a store folder")
    _check("output", output, _OPTIONAL_PATH, "a folder path or None")
    _check("shards", shards, (int, type(None)), "a positive integer or None")
    _check("no_progress", no_progress, (bool,), "True or False")
    options = option_words({"output": output, "shards": shards, "no_progress": no_progress})
    args = _parsed("compact", lambda parser: parser.parse_args(["compact", *options, "--", str(store)]))
    try:
        with _loops_as_os_errors():
            return compact_command(args)
    except StoppedBySignal as stop:  # the user's stop, not bad input: `except DilstoreError` must not swallow it
        raise KeyboardInterrupt(str(stop)) from stop


def verify(store: PathLike, *, storage_options: dict[str, Any] | None = None,
           no_progress: bool = False) -> VerifyReport:
    """Check the store as `dilstore verify` does (README "verify"): every file against the manifest's SHA-256, the
    arrays, offsets, strings, spans, encodings and id index, and a local store's BM25 index (STORE/bm25), which an
    append makes stale until `build_index` rebuilds it. Returns the report the command prints: `report.ok`,
    `report.problems` (one line each), `report.to_dict()` (what `--json` prints); damage is a problem in it, not
    an exception. `storage_options` go to a URL's fsspec filesystem, as in `open_store`. A progress bar goes to
    stderr unless `no_progress`.

    `dilstore.storage.verify.verify_store`, the only verify a program found before, checks the store only: after
    an append it said a store was sound whose index was stale (left56 F1).
    """
    from dilstore.runners.cmd_store import BarProgress, verify_with_index

    _check("store", store, _PATH, "a store folder or URL")
    _check("storage_options", storage_options, (dict, type(None)), "a dict of fsspec options or None")
    _check("no_progress", no_progress, (bool,), "True or False")
    with BarProgress("verify", disabled=no_progress) as progress:
        return verify_with_index(str(store), storage_options, progress=progress)


def evaluate_qa(
    reader: OpenDomainReader[Any], questions: PathLike, *, limit: int | None = None, seed: int = 0
) -> QAEvaluation:
    """EM, F1 and R of an open reader (`open_reader`) over a question file (DPR JSONL or SQuAD JSON).

    Scored with the reader's own top_p and mu; `.em`, `.f1`, `.recall` and
    `.summary()` give the scores. `limit` questions are drawn with `seed` when
    given, as `dilstore evaluate-qa` does.
    """
    from dilstore.reader.evaluation.open_domain import evaluate_questions
    from dilstore.reader.evaluation.questions import load_questions
    from dilstore.reader.evaluation.subsets import require_subset_seed, seeded_subset
    from dilstore.reader.serving.odqa import OpenDomainReader

    _check("reader", reader, (OpenDomainReader,), "a reader from open_reader")
    _check("questions", questions, _PATH, "a question file")
    _check("limit", limit, (int, type(None)), "a positive integer or None")
    require_at_least_one({"limit": limit}, dashed=False)  # before the questions load
    _check("seed", seed, (int,), "an integer of at least 0")
    require_subset_seed(int(seed))  # before the questions load
    chosen = seeded_subset(load_questions(questions), _int(limit), int(seed))
    return evaluate_questions(reader, chosen, top_p=reader.settings.top_p, mu=reader.settings.mu)


def evaluate_rank(
    qrels: PathLike | Mapping[str, Mapping[str, int]],
    run: PathLike | Mapping[str, Mapping[str, float]],
    relevance_level: int | None = None,
    recall_at: Iterable[int] = (100,),
) -> RankEvaluation:
    """RR@10, nDCG@10, R@k and Judged@10 of a run against qrels (TREC files, or {qid: {docid: grade or score}}).

    relevance_level: the lowest grade RR and R count as relevant (`evaluate-rank --relevance-level`).
    recall_at: the k of each R@k (`evaluate-rank --recall-at`), any iterable of integers.

    Warns (UserWarning) of what the command warns of on stderr: a run file whose rank column orders some query's
    documents otherwise than their scores (a run of constant scores keeping its order in the ranks is scored by
    docid), and ids the qrels hold only in another Unicode form. It said nothing of either (num58 F5).
    """
    from dilstore.reader.data.trec import (
        qrels_from_mapping,
        rank_order_warning,
        read_qrels,
        read_ranked_run,
        run_from_mapping,
        unicode_form_warning,
    )
    from dilstore.reader.evaluation.rank_metrics import evaluate_run

    judged = read_qrels(qrels) if isinstance(qrels, str | Path) else qrels_from_mapping(qrels)
    order = None
    if isinstance(run, str | Path):
        ranked, disagreeing = read_ranked_run(run)
        order = rank_order_warning(run, disagreeing, len(ranked))
    else:
        ranked = run_from_mapping(run)
    for warning in (order, unicode_form_warning(judged, ranked)):
        if warning is not None:
            warnings.warn(warning.removeprefix("warning: "), UserWarning, stacklevel=2)
    return evaluate_run(judged, ranked, relevance_level, recall_at)


def _check_device(device: str | None) -> None:
    """Raise DilstoreError unless `device` is None or a torch device this machine has, as `--device` is checked
    (a bad one surfaced as torch's RuntimeError or AssertionError, after the model and the JVM had loaded)."""
    from dilstore.runners.arg_types import torch_device

    _check("device", device, (str, type(None)), "a torch device name or None")
    if device is not None:
        try:
            torch_device(device)
        except argparse.ArgumentTypeError as error:
            raise DilstoreError(f"device: {error}") from None


def _int(value: Any) -> Any:
    """An integer `_check` took (a numpy one too) as a Python int; anything else (None) as it is."""
    return int(value) if is_integer(value) else value


def _check(name: str, value: Any, kinds: tuple[type, ...], expected: str) -> None:
    """Raise DilstoreError naming the argument when `value` is none of `kinds` (a bool is never a number; where
    `int` is one, any integer is, a numpy one too: the function turns it into an int, `_int`).

    A wrong type deep in a layer surfaced as a bare TypeError or AttributeError
    far from the call that caused it; a numpy integer was refused as "must be a positive integer, got int64 3".
    """
    if int in kinds and is_integer(value):
        return
    if float in kinds and isinstance(value, numbers.Real) and not isinstance(value, bool):
        return  # a numpy float too (numpy registers its floats as numbers.Real)
    if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
        raise DilstoreError(f"{name} must be {expected}, got {type(value).__name__} {value!r:.80}")
