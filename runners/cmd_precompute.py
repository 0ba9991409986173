"""`dilstore precompute`: corpus → passages → offline layers → shard store, on any Beam runner.

With no arguments it runs on the embedded default corpus (ten SQuAD dev
articles, CC BY-SA 4.0) with the default reader and writes ./dilstore-store.
Any option Beam knows (`--project`, `--region`, `--temp_location`,
`--setup_file`, `--flink_master`, `--environment_type`, ...) is passed on to
Beam; unknown ones are an error.

A run killed at any point can be re-run with the same command: committed
shards are kept, the rest are rewritten byte-identically, and the store is
finalized only when every shard is there.

--kind picks what is stored per token: dilbert (a DilBert reader's passage
states after layer k, d values), earl-s1 (an EARL ranker's document-module
output, d values), earl-s2 (its judger blocks' keys and values, M x 2 x d
values) or listformer (a delayed Listformer's document states after its
layers 1..k, d values, and with the prior each passage's vector). The EARL
kinds default to the packaged EARL ranker, listformer to the packaged
Listformer; --model takes another checkpoint of the kind (`dilstore train
earl|listformer`), or a plain encoder directory (e.g. package:base-model,
with --layers K for listformer), whose untrained ranker suits speed and size
tests only.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import logging
import os
import re
import shlex
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dilstore.runners.arg_types import option_words, positive_int, threads_beyond_cpus, worker_thread_count
from dilstore.runners.outputs import check_output_folder, check_store_path_length, refuse_store_inside_store
from dilstore.runners.precompute_run import run_pipeline
from dilstore.runners.quiet import add_verbose_argument, logging_restored, quiet_beam_logging, quiet_dask_logging
from dilstore.runners.scratch import scratch_dir
from dilstore.storage.cpus import usable_cpu_count
from dilstore.storage.errors import DilstoreError
from dilstore.storage.format import COMPRESSORS
from dilstore.storage.messages import path_text

if TYPE_CHECKING:  # imported lazily at run time, so that `dilstore --help` stays fast
    from dilstore.pipelines.corpora import ReadTask
    from dilstore.pipelines.job import BuildAttempt, PrecomputeJob
    from dilstore.reader.offline.kinds import OfflineModel

DEFAULT_OUTPUT = "dilstore-store"
# What precompute_store returns: the summary, why nothing was stored (else None), and a notice (else None).
Outcome = tuple[dict[str, Any], str | None, str | None]
# The choices the parser offers, written out so that `dilstore --help` starts without numpy, torch or the wikitext
# parser; tests/runners/test_cli_errors.py checks each equals its source (OFFLINE_KINDS, ENCODINGS, STRATEGIES,
# corpora.FORMATS), so a new kind or encoding cannot be refused as an "invalid choice".
KINDS = ("dilbert", "earl-s1", "earl-s2", "listformer")
ENCODINGS = ("fp32", "fp16", "int8", "2bit", "1bit")
COMPRESSIONS = ("none", *COMPRESSORS)
SPLITS = ("words", "paragraphs", "none")
FORMATS = ("jsonl", "msmarco", "squad", "wikipedia")
# k used with the base model when the trained default checkpoint is absent and no --layers is given.
FALLBACK_LAYERS = 3
# Parsed names that are not options of the command itself.
_NOT_IN_COMMAND = {"command", "run", "beam_args"}


# The shortest stored unit worth making: [CLS]/[SEP] and a few word pieces per window.
MIN_MAX_LENGTH = 8


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add `precompute`."""
    parser = subparsers.add_parser(
        "precompute",
        help="Beam job: corpus → passages → offline layers → store (no arguments: the embedded default)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,
    )
    parser.set_defaults(beam_args=[])  # cli.parse puts the options it does not know here
    inputs = parser.add_argument_group("input")
    inputs.add_argument("--input", action="append", metavar="PATH",
                        help="corpus file; repeat for several (default: the embedded corpus)")
    inputs.add_argument("--format", choices=FORMATS,
                        help="corpus format (default: from the file name: .jsonl, .tsv, .json, .xml, each maybe "
                             "with .gz or .bz2)")
    inputs.add_argument("--split", choices=SPLITS, default="words",
                        help="passages: 100-word windows with stride 50, paragraphs, or none (each document whole, "
                             "under its own id: for reranking runs that name documents) (default words)")
    model = parser.add_argument_group("model and store")
    model.add_argument("--output", default=DEFAULT_OUTPUT, metavar="STORE",
                       help=f"store directory to write (default ./{DEFAULT_OUTPUT})")
    model.add_argument("--model", metavar="DIR",
                       help="checkpoint directory: a DilBert reader (dilbert), an EARL ranker (earl-s1, earl-s2) or "
                            "a Listformer (listformer), or a plain encoder directory to start one from (default: "
                            "the packaged DilBert checkpoint for dilbert, the packaged EARL ranker for the EARL "
                            "kinds, the packaged Listformer for listformer)")
    model.add_argument("--kind", choices=KINDS, default="dilbert",
                       help="what is stored per token: dilbert (passage states after layer k, d values), "
                            "earl-s1 (EARL document-module output, d values), earl-s2 (EARL judger-block keys "
                            "and values, M x 2 x d values), listformer (Listformer document states after its "
                            "delayed layers k, d values) (default dilbert)")
    model.add_argument("--layers", type=int, metavar="K",
                       help="the split: k, the offline layers, for dilbert and listformer; N, the query layers, "
                            "for earl-s1 and earl-s2 (default: the checkpoint's own; with a plain encoder directory "
                            "k is required and N defaults to l-2; a ranker checkpoint's split cannot be changed)")
    model.add_argument("--encoding", choices=ENCODINGS, default="fp16", help="state encoding (default fp16)")
    model.add_argument("--codebook", metavar="DIR",
                       help="2bit/1bit only: use this codebook folder (e.g. another store's codebook/, to append "
                            "with the same codes) instead of training one on a seeded sample of the corpus")
    model.add_argument("--compression", choices=COMPRESSIONS, default="none",
                       help="optional, for cold storage; only ~1.1x on hidden states; compressed stores are read "
                            "through zarr-python instead of memory maps (default none)")
    model.add_argument("--max-length", type=positive_int, default=384, metavar="N",
                       help="longest stored window in tokens, special tokens included (p [SEP] for dilbert, "
                            "[CLS] d [SEP] for EARL); longer passages are split into windows (default 384)")
    model.add_argument("--shards", type=positive_int, metavar="N",
                       help="shard count, at most 16384 (default: from the input size, one per ~1 MiB, 4 to 16384)")
    model.add_argument("--overwrite", action="store_true",
                       help="replace an existing store made with other settings (default: refuse)")
    model.add_argument("--append", action="store_true",
                       help="add the inputs' passages to the finalized store --output as new shards, without "
                            "rewriting it; the run must match the store's model, kind, encoding, compression and "
                            "split, and uses its codebook")
    model.add_argument("--replace", action="store_true",
                       help="with --append: new passages whose id the store already holds win, and the old rows "
                            "become unreachable; an id repeated in the input keeps its first record, the others going "
                            "to the dead letters (default: refuse both)")
    run = parser.add_argument_group("running")
    run.add_argument("--runner", default="direct", metavar="NAME",
                     help="direct (default), dask, dataflow, flink, portable, fnapi, or one of these by "
                          "Beam's name (DirectRunner, ...)")
    run.add_argument("--workers", type=positive_int, default=usable_cpu_count(), metavar="N",
                     help="local worker processes: DirectRunner or FnApiRunner multi-processing, Dask LocalCluster "
                          "(default: the number of CPUs this process may use, as its affinity and cgroup CPU quota "
                          "allow)")
    run.add_argument("--threads", type=worker_thread_count, metavar="N",
                     help="torch threads per worker (default: those CPUs / workers, at least 1, and at most "
                          "$OMP_NUM_THREADS where set; at most 4 per CPU where the workers run on this machine)")
    run.add_argument("--batch-tokens", type=positive_int, default=8192, metavar="N",
                     help="padded tokens per encoder batch (default 8192)")
    run.add_argument("--no-progress", action="store_true", help="no progress bar")
    run.add_argument("--json", action="store_true", help="print the end-of-run summary as JSON")
    add_verbose_argument(run)
    parser.set_defaults(run=run_command)


def default_threads(workers: int) -> int:
    """Torch threads per worker without --threads: the CPUs this process may use shared among `workers`, at least 1,
    and no more than OMP_NUM_THREADS where that is a number. They were the host's CPUs (os.cpu_count) shared, and a
    run in a container held to 2 CPUs of 64 took 64 threads with --workers 1; OMP_NUM_THREADS, which torch follows
    elsewhere, was overridden (env57 F1)."""
    threads = max(1, usable_cpu_count() // workers)
    first = os.environ.get("OMP_NUM_THREADS", "").split(",")[0].strip()  # "4,2": nested levels; the outer one
    return min(threads, int(first)) if first.isdigit() and int(first) > 0 else threads


def resolve_inputs(paths: Sequence[str | Path] | None, format: str | None) -> tuple[ReadTask, ...]:
    """ReadTasks for the given files (absolute paths), or for the embedded corpus when none are given.

    Each input is checked up front, before anything is written: a URL, a
    missing file, a directory and an unreadable file are errors naming it.
    """
    from dilstore.pipelines.corpora import ReadTask, check_format, format_for_path
    from dilstore.pipelines.default_corpus import DEFAULT_CORPUS_FORMAT, default_corpus_path

    if not paths:
        return (ReadTask(str(default_corpus_path()), format or DEFAULT_CORPUS_FORMAT),)
    tasks, spellings = [], {}
    for given in paths:
        refuse_url("--input", given)
        if not str(given).strip():  # Path("") is ".", which was refused as "a directory"
            raise DilstoreError("--input is empty; give a corpus file")
        path = Path(given)
        refuse_undecodable("--input", path)
        if path.is_dir():
            raise DilstoreError(f"--input {path} is a directory; give the corpus files in it, one --input each")
        if not path.exists():
            wildcard = " (dilstore does not expand wildcards: leave the pattern unquoted for the shell)"
            raise DilstoreError(f"input file not found: {path}{wildcard if _WILDCARDS.search(str(given)) else ''}")
        if not path.is_file():  # a FIFO or a device such as /dev/null
            raise DilstoreError(f"--input {path} is not a regular file; give a corpus file")
        resolved = str(path.resolve())
        # The file itself, not its path: a hard link of a file given before was read twice (left58b F3).
        status = path.stat()
        identity = (status.st_dev, status.st_ino)
        if identity in spellings:
            first = spellings[identity]
            also = "" if first == str(given) else f" (as {first} before it: the same file)"
            raise DilstoreError(f"--input {given} is given twice{also}")
        spellings[identity] = str(given)
        if not os.access(path, os.R_OK):
            raise DilstoreError(f"--input {path}: permission denied (the file is not readable)")
        task = ReadTask(resolved, format or format_for_path(path))
        check_format(task.path, task.format)
        tasks.append(task)
    return tuple(tasks)


# The shell's wildcards: a pattern that reached dilstore unexpanded names no file.
_WILDCARDS = re.compile(r"[*?[]")
# A URL's `scheme:/` or `scheme://` (flags are taken as typed, before pathlib would fold `//` to `/`).
_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*:/")


def refuse_url(flag: str, path: str | Path) -> None:
    """Refuse URLs (https, object storage): the pipeline reads inputs and writes the store on a filesystem.

    Without this, `--output gs://bucket/x` would silently become the local folder `./gs:/bucket/x`.
    """
    if _URL.match(str(path)):
        raise DilstoreError(
            f"{flag} {path}: URLs are not supported by `dilstore precompute` yet; use a local path or "
            "a mounted filesystem (e.g. gcsfuse) visible to every worker (download an https file first)"
        )


def refuse_undecodable(flag: str, path: str | Path) -> None:
    """Refuse a path whose name, or a folder's above it, is not UTF-8 (bytes Python decodes to lone surrogates).

    The store records its inputs, model and folder in UTF-8 files (precompute.json, run-summary.json, the dead
    letters): an input so named was "text that is not valid UTF-8" naming no file, and an --output so named ran the
    whole encoding and failed as the store was finished, every rerun again (unicode56 F7).
    """
    for text in (str(path), str(Path(path).absolute())):
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            raise DilstoreError(f"{flag} {path_text(path)}: its path is not UTF-8 text, which the store's records (its "
                                "settings, summary and dead letters) hold: give it a UTF-8 name") from None  # fmt: skip


def resolve_model(model: str | None, layers: int | None, kind: str) -> tuple[str, int | None]:
    """(model reference, split) for the run, saying so when the default checkpoint must be stood in for.

    With no `--model`, dilbert stores come from the packaged DilBert reader,
    the EARL kinds from the packaged EARL ranker (whose N is fixed) and
    listformer from the packaged Listformer (whose k is fixed).
    """
    from dilstore.reader.modeling.checkpoints import BASE_MODEL_REF, read_metadata
    from dilstore.reader.offline.model_refs import (
        DEFAULT_CHECKPOINT_REF,
        DEFAULT_LISTFORMER_REF,
        DEFAULT_RANKER_REF,
        resolve_model_dir,
    )

    if model is not None:
        return model, layers
    if kind == "listformer":
        resolve_model_dir(DEFAULT_LISTFORMER_REF)
        return DEFAULT_LISTFORMER_REF, layers
    if kind != "dilbert":
        resolve_model_dir(DEFAULT_RANKER_REF)
        return DEFAULT_RANKER_REF, layers
    try:
        directory = resolve_model_dir(DEFAULT_CHECKPOINT_REF)
    except DilstoreError as error:
        chosen = FALLBACK_LAYERS if layers is None else layers
        print(
            f"dilstore precompute: note: {error}\n"
            f"dilstore precompute: note: using the base model all-MiniLM-L6-v2 ({resolve_model_dir(BASE_MODEL_REF)}) "
            f"with k={chosen} instead; its states only suit readers fine-tuned from that base with this k",
            file=sys.stderr,
        )
        return BASE_MODEL_REF, chosen
    metadata = read_metadata(directory)
    return DEFAULT_CHECKPOINT_REF, layers if layers is not None else (metadata.layers if metadata else None)


def print_summary(summary: dict[str, Any], as_json: bool, append: bool = False) -> None:
    """The end-of-run summary on stdout: JSON, or one aligned line per count.

    An append's counts are its own (its passages, its new shards); its table said so nowhere, and "passages 28,
    shards 1, store wiki-store" read as what the store now holds (obs57 F4). Its title says so now.
    """
    if as_json:
        print(json.dumps(summary, indent=1, sort_keys=True))
        return
    order = ("documents", "skipped", "rejected", "rejected_passages", "passages", "long_passages", "tokens",
             "superseded", "shards", "shards_resumed", "bytes", "seconds", "passages_per_second", "runner", "store")
    print("precompute summary" + (" of this append (`dilstore info STORE` counts the whole store)" if append else ""))
    for key in order:
        if key in summary:
            print(f"  {key:<20} {summary[key]}")


def note_untrained_ranker(model: str, reader: OfflineModel) -> None:
    """Say on stderr when an EARL or Listformer store is about to be made by a ranker started from a plain encoder."""
    from dilstore.reader.modeling.checkpoints import read_metadata
    from dilstore.reader.modeling.earl import EarlRanker
    from dilstore.reader.modeling.listformer import ListformerRanker
    from dilstore.reader.offline.encoding import resolve_model_dir

    directory = resolve_model_dir(model)
    if read_metadata(directory) is not None:
        return
    if isinstance(reader, EarlRanker):
        untrained = (
            f"an untrained EARL ranker (N={reader.query_layers}, M={reader.judger_blocks}, {reader.pooling} pooling)"
        )
    elif isinstance(reader, ListformerRanker):
        untrained = f"an untrained Listformer (k={reader.delayed_layers})"
    else:
        return
    print(
        f"dilstore precompute: note: {directory} is a plain encoder, so {untrained} is initialised from it; "
        "its states suit speed and size tests only",
        file=sys.stderr,
    )


def build_job(args: argparse.Namespace, started: float, runner: str, progress_dir: str | None,
              started_monotonic: float | None = None, inputs: tuple[ReadTask, ...] | None = None,
              checked: tuple[Path, Path | None] | None = None) -> PrecomputeJob:  # fmt: skip
    """The PrecomputeJob for parsed arguments (loads the model once here, for its fingerprint). `inputs`: what
    `resolve_inputs` gave for them where the caller checked them already, else they are resolved here; `checked`:
    what `check_output_and_codebook` gave for them so, else they are checked here."""
    from dilstore.pipelines.codebook import check_codebook_fits
    from dilstore.pipelines.job import PrecomputeJob, run_spec, this_machine
    from dilstore.pipelines.sharding import (
        MAX_DEFAULT_SHARDS,
        MIN_DEFAULT_APPEND_SHARDS,
        MIN_DEFAULT_SHARDS,
        default_shard_count,
    )
    from dilstore.pipelines.spec_file import spec_generation
    from dilstore.reader.batching import BatchPolicy
    from dilstore.reader.modeling.fingerprint import model_fingerprint
    from dilstore.reader.offline.encoding import keep_launched, load_reader
    from dilstore.reader.threads import start_thread_pool

    output, codebook = check_output_and_codebook(args) if checked is None else checked
    inputs = resolve_inputs(args.input, args.format) if inputs is None else inputs
    model, layers = resolve_model(args.model, args.layers, args.kind)
    start_thread_pool()  # torch's own count here: before the load, which may leave no room for their stacks
    reader = load_reader(model, args.kind, layers)
    note_untrained_ranker(model, reader)
    check_max_length(args.max_length, reader, args.append)
    if args.shards is not None and args.shards > MAX_DEFAULT_SHARDS:  # each shard costs files even when empty
        raise DilstoreError(f"--shards {args.shards} is more than {MAX_DEFAULT_SHARDS}, the most a store is split into")
    if codebook is not None:
        check_codebook_fits(codebook, args.encoding, args.kind, reader)
    fingerprint = model_fingerprint(reader, args.kind, args.encoding, args.max_length)
    keep_launched(reader, fingerprint)  # the run's loads in this process take it (reader/offline/encoding.py)
    threads = args.threads or default_threads(args.workers)
    job = PrecomputeJob(
        inputs=inputs,
        store=str(output.resolve()),
        strategy=args.split,
        num_shards=args.shards or default_shard_count(
            (task.path for task in inputs), MIN_DEFAULT_APPEND_SHARDS if args.append else MIN_DEFAULT_SHARDS
        ),
        max_length=args.max_length,
        model=model,
        fingerprint=fingerprint,
        policy=BatchPolicy(batch_tokens=args.batch_tokens),
        threads=threads,
        compressor=compressor_of(args.compression),
        codebook=None if codebook is None else str(codebook.resolve()),
        runner=runner,
        started_at=started,
        started_monotonic=started_monotonic,
        started_on=None if started_monotonic is None else this_machine(),
        progress_dir=progress_dir,
        creation={"command": canonical_command(args), "runner": runner},
    )
    return dataclasses.replace(job, generation=spec_generation(run_spec(job)))


def check_foreign_codebook(codebook: Path, job: PrecomputeJob, reader: OfflineModel) -> None:
    """Refuse a --codebook made for a store of another model or other settings that encodes this run's states far
    worse than a codebook of their own would; say how well it fits when it does (a frozen-lower reader's base's),
    and warn, as before, where the run's sample is too small to tell.

    A store of near-noise states passes `verify`, and through the shipped rankers' bi-encoder prior ranks as well
    as fp16, so nothing later would show it. Called where the codebook is copied into the store, so a re-run of a
    complete store or a resumed one does not measure it again.
    """
    measured = _fit_on_this_run(codebook, job, reader)
    if measured is None:
        print(f"dilstore precompute: warning: --codebook {codebook} was made for a store of another model or other "
              "settings, and this run's sample is too small to measure how well it fits; its codes fit this "
              "model's states only if they are that model's (a reader trained with frozen lower layers)",
              file=sys.stderr)  # fmt: skip
        return
    fit, too_poor = measured
    if too_poor:
        raise DilstoreError(f"--codebook {codebook} was made for a store of another model or other settings and "
                            f"encodes this model's states far worse: {fit}; leave --codebook out to train "
                            "one")  # fmt: skip
    print(f"dilstore precompute: note: --codebook {codebook} was made for a store of another model or other "
          f"settings; it fits this model's states: {fit}", file=sys.stderr)  # fmt: skip


def check_codebook_sample(codebook: Path, job: PrecomputeJob, reader: OfflineModel, refusal: str, remedy: str) -> None:
    """Refuse a codebook trained on few token states (or on a number it does not record: one written before the
    count was) that encodes this run's states far worse than a codebook trained on them would (codes51 F1).

    A codebook trained on fewer than SMALL_SAMPLE_TOKENS states codes the passages it saw and few others: one of
    72 tokens gave appended passages a relative error of 0.955 and F1 9.7 instead of 73.6, which `verify` does not
    see. One trained on fewer than MIN_REUSE_TOKENS (as it records, or as its distinct centroids show for one
    written before the count was) is refused without measuring (`refuse_few_states`): a run too small to measure
    it took it (review51 R1). One that records a sample of SMALL_SAMPLE_TOKENS or more is not measured (its
    held-out error is within 1.15x of a full sample's, where FOREIGN_CODEBOOK_SLACK allows 1.5x). `refusal` begins
    the error (what the run cannot do) and `remedy` ends it; a run too small to measure a codebook known to be
    small is told so.
    """
    from dilstore.pipelines.codebook import SMALL_SAMPLE_TOKENS
    from dilstore.storage.codebook import codebook_sample_tokens

    refuse_few_states(codebook, job, refusal, remedy)
    count = codebook_sample_tokens(codebook)
    if count is not None and count >= SMALL_SAMPLE_TOKENS:
        return
    trained = f"was trained on only {count:,} token states" if count is not None else (
        "does not record how many token states it was trained on")  # fmt: skip
    measured = _fit_on_this_run(codebook, job, reader)
    if measured is None:
        if count is not None:
            print(f"dilstore precompute: warning: {codebook} {trained}, and this run's sample is too small to "
                  "measure how well it codes this run's passages; a codebook trained on few states codes passages "
                  "it did not see poorly", file=sys.stderr)  # fmt: skip
        return
    fit, too_poor = measured
    if too_poor:
        raise DilstoreError(f"{refusal}: {codebook} {trained} and encodes this run's passages far worse: {fit}; "
                            f"{remedy}")  # fmt: skip
    if count is not None:
        print(f"dilstore precompute: note: {codebook} {trained}; it fits this run's states: {fit}", file=sys.stderr)


def _fit_on_this_run(codebook: Path, job: PrecomputeJob, reader: OfflineModel) -> tuple[str, bool] | None:
    """How the codebook at `codebook` codes held-out states of this run against one trained on the rest (in words),
    and whether that is past FOREIGN_CODEBOOK_SLACK; None when the run's sample is too small (codebook_fit)."""
    from dilstore.pipelines.codebook import FOREIGN_CODEBOOK_SLACK, codebook_fit

    measured = codebook_fit(codebook, job, reader)
    if measured is None:
        return None
    given, own = measured
    fit = f"relative error {given:.3f} on a sample of this run's states, against {own:.3f} for one trained on them"
    return fit, given > FOREIGN_CODEBOOK_SLACK * own


def refuse_few_states(codebook: Path, job: PrecomputeJob, refusal: str, remedy: str) -> None:
    """Refuse, without measuring it, a codebook trained on fewer than MIN_REUSE_TOKENS token states
    (pipelines.codebook `too_few_to_reuse`): `refusal` begins the error and `remedy` ends it (review51 R1)."""
    from dilstore.pipelines.codebook import too_few_to_reuse

    why = too_few_to_reuse(codebook, job.encoding)
    if why is not None:
        raise DilstoreError(f"{refusal}: {codebook} {why}; {remedy}")


def warn_small_sample(codebook: Path) -> None:
    """Say once, when a build trained its codebook on fewer than SMALL_SAMPLE_TOKENS token states, what an --append
    to the store or a --codebook run given it will do (refuse_few_states, check_codebook_sample) and what to do."""
    from dilstore.pipelines.codebook import (
        FIT_MIN_TOKENS,
        FOREIGN_CODEBOOK_SLACK,
        MIN_REUSE_TOKENS,
        SMALL_SAMPLE_TOKENS,
    )
    from dilstore.storage.codebook import codebook_sample_tokens

    count = codebook_sample_tokens(codebook)
    if count is None or count >= SMALL_SAMPLE_TOKENS:
        return
    reuse = "an --append to this store, or a run given this codebook with --codebook,"
    if count < MIN_REUSE_TOKENS:
        then = (f"fewer than {MIN_REUSE_TOKENS:,}): it codes these passages but unseen ones poorly, so {reuse} "
                "will be refused")
    else:
        then = (f"fewer than {SMALL_SAMPLE_TOKENS:,}): it codes these passages well but unseen ones worse, so {reuse} "
                f"first measures it on a sample of that run's states and is refused where it codes them more than "
                f"{FOREIGN_CODEBOOK_SLACK}x worse than a codebook trained on them; a run whose sample has fewer than "
                f"about {2 * FIT_MIN_TOKENS:,} token states cannot be measured and is only warned")
    print(f"dilstore precompute: warning: the codebook was trained on only {count:,} token states ({then}; to grow "
          "this store by appends, build it from more passages first", file=sys.stderr)  # fmt: skip


def check_output_and_codebook(args: argparse.Namespace) -> tuple[Path, Path | None]:
    """(--output, --codebook or None), once the checks of both that need no model are passed: no URL, UTF-8 names,
    the output's location (`check_output_location`), and a codebook only for the 2bit/1bit encodings, not edited
    since its store was finalized, and one of this encoding that reads (its fit to the model's states is checked
    once the model is loaded: `check_codebook_fits`).

    `precompute` calls it before Beam, torch and transformers load: --append to a mistyped store or a mistyped
    --codebook was named after 10-25 s of imports and the model's load (fast59 F3). `build_job` calls it for a
    caller that calls `build_job` alone; `precompute` hands it what this gave (it called it twice, and read the
    codebook once more: left60 F6).
    """
    from dilstore.storage.codebook import read_codebook, refuse_changed_codebook
    from dilstore.storage.encodings import needs_codebook

    refuse_url("--output", args.output)
    output = Path(args.output)
    refuse_undecodable("--output", output)
    if args.model is not None and not str(args.model).startswith("package:"):
        refuse_undecodable("--model", args.model)
    check_output_location(output, args.append)
    codebook = None if args.codebook is None else Path(args.codebook)
    if codebook is not None:
        refuse_url("--codebook", args.codebook)
        refuse_undecodable("--codebook", codebook)
        if not needs_codebook(args.encoding):
            raise DilstoreError(f"--codebook is for the 2bit and 1bit encodings, not {args.encoding}")
        refuse_changed_codebook(codebook, f"--codebook {codebook}")  # a store's codebook/, edited after finalize
        read_codebook(codebook, args.encoding)
    return output, codebook


def check_model_folder(model: str | None) -> None:
    """A DilstoreError naming --model's folder (a path, or the one a `package:` reference names) unless it holds a
    checkpoint: the check the model's load makes first (`load_offline_model`), made before Beam, torch and
    transformers load, which a mistyped --model waited some 10 s for (fast59 F6)."""
    from dilstore.reader.modeling.checkpoints import require_checkpoint_dir
    from dilstore.reader.offline.model_refs import resolve_model_dir

    if model is not None:
        require_checkpoint_dir(resolve_model_dir(model))


def check_output_location(output: Path, append: bool) -> None:
    """--output's refusals that need no model, made before the write lock, which would create the folder's parents
    for a run refused anyway: a file, a folder inside another store, and for --append a folder that is not there."""
    from dilstore.storage.replacement import replaced_dir

    check_output_folder(output, "--output")
    check_store_path_length(output, "--output")
    refuse_store_inside_store(output, "--output")
    if append and not output.is_dir() and not replaced_dir(output).is_dir():  # else a swap to finish, under the lock
        raise DilstoreError(f"no store at {output.resolve()}")


def compressor_of(compression: str) -> str | None:
    """The storage compressor for a `--compression` choice: None for "none", so the store stays memory-mappable."""
    return None if compression == "none" else compression


def canonical_command(args: argparse.Namespace) -> str:
    """The command with every option spelled out (defaults included), Beam options last."""
    options = {name: value for name, value in vars(args).items() if name not in _NOT_IN_COMMAND}
    return shlex.join(["dilstore", "precompute", *option_words(options), *args.beam_args])


def build_store(
    job: PrecomputeJob, runner: str, args: argparse.Namespace, attempt: BuildAttempt | None = None
) -> dict[str, Any]:
    """Build the store at `job.store` (the folder being written, under the write lock); the run summary.

    A 2bit/1bit run first puts its codebook in that folder (pipelines/codebook.py),
    so an --overwrite replacement gets its own, inside the folder it is built in;
    the model for its sample is loaded and checked against the run's fingerprint here.
    """
    from dilstore.pipelines.codebook import codebook_in_place, made_for_another_model, prepare_codebook
    from dilstore.reader.offline.encoding import load_checked_reader
    from dilstore.storage.encodings import needs_codebook

    if needs_codebook(job.encoding):
        reader = load_checked_reader(job.model, job.layers, job.fingerprint)
        given = None if job.codebook is None else Path(job.codebook)
        in_place = codebook_in_place(job)
        if given is not None and not in_place:
            refusal = f"--codebook {given} does not fit this run"
            remedy = "leave --codebook out to train one on this run's passages"
            if made_for_another_model(given, job.fingerprint):
                refuse_few_states(given, job, refusal, remedy)
                check_foreign_codebook(given, job, reader)
            else:
                check_codebook_sample(given, job, reader, refusal, remedy)
        made = prepare_codebook(job, reader)
        if given is None and not in_place:  # trained by this run: said once, not again when it resumes
            warn_small_sample(made)
    return run_pipeline(job, runner, args.beam_args, args.workers, not args.no_progress, attempt)


def check_append_flags(args: argparse.Namespace) -> None:
    """--replace needs --append; --append adds to a store, so it excludes --overwrite."""
    if args.replace and not args.append:
        raise DilstoreError("--replace only applies to --append")
    if args.append and args.overwrite:
        raise DilstoreError("--append adds to a store and --overwrite replaces it; give one of them")


def append_to_store(job: PrecomputeJob, runner: str, args: argparse.Namespace) -> Outcome:
    """Append the run's passages to the finalized store at `job.store` (pipelines/append.py): the run summary,
    why nothing was appended when no passage was stored (`nothing_stored`; the store is then unchanged), and a
    notice.

    Runs under the store's write lock. A run of an append the store already
    holds returns that append's summary and a notice that says so. An append refused for
    duplicate ids leaves no folder behind; one with --replace to a store whose passage tables do not describe
    their shards is refused before anything is written.
    """
    import shutil

    from dilstore.pipelines.append import check_store_settings, check_stored_tables, prepare_append, refuse_duplicates
    from dilstore.reader.offline.encoding import load_checked_reader
    from dilstore.storage.encodings import needs_codebook
    from dilstore.storage.format import CODEBOOK_DIR, SPEC_FILE

    store = Path(job.store)
    manifest = check_store_settings(store, job)
    job = dataclasses.replace(job, replace=args.replace)
    if job.replace:
        check_stored_tables(store)  # before prepare_append, which writes
    plan = prepare_append(store, job, manifest)
    if plan.committed is not None:
        later = len(manifest.appends) - 1 - manifest.appends.index(plan.committed)
        after = (f"; {later} later append(s) may have replaced some of its rows, and its inputs are known by path, "
                 "size and modification time: to apply them again, give them under another name") if later else ""
        # Where it is now, if it was moved; and that this run did nothing, which the old summary would not say.
        summary = {**plan.committed.get("summary", {}), "store": job.store, "already_complete": True}
        return summary, None, f"{job.store} already holds this append ({plan.generation}){after}"
    try:
        refuse_duplicates(store, job)
        if needs_codebook(job.encoding):
            reader = load_checked_reader(job.model, job.layers, job.fingerprint)
            check_codebook_sample(store / CODEBOOK_DIR, job, reader, f"cannot append to {store}",
                                  "build the store again from its inputs and these together (a codebook samples "
                                  "up to 512 documents), or store these passages in a store of their own "
                                  "(a new --output, with its own codebook), searched beside this one")  # fmt: skip
    except DilstoreError:
        if [path.name for path in plan.folder.iterdir()] == [SPEC_FILE]:  # made by this run, nothing else in it
            shutil.rmtree(plan.folder)
            with contextlib.suppress(OSError):  # appends/ too when this run made it: only an empty one goes
                plan.folder.parent.rmdir()
        raise
    appended = dataclasses.replace(job, store=str(plan.folder), destination=job.store, append_to=job.store,
                                   first_shard=plan.first_shard, generation=plan.generation)
    summary = run_pipeline(appended, runner, args.beam_args, args.workers, not args.no_progress)
    empty = nothing_stored(summary, str(plan.folder))
    return summary, None if empty is None else f"{empty}; nothing was appended, {job.store} is unchanged", None


def run_command(args: argparse.Namespace) -> int:
    """Run `dilstore precompute` and print its summary; 0 on success."""
    summary, empty, notice = precompute_store(args)
    if notice is not None:
        print(f"dilstore precompute: {notice}", file=sys.stderr)
    print_summary(summary, args.json, append=args.append)
    if empty is not None:
        print(f"dilstore precompute: error: {empty}", file=sys.stderr)
        return 1
    rejected = rejected_line(summary)
    if rejected is not None and not args.json:  # --json's summary says it
        print(rejected, file=sys.stderr)
    return 0


def rejected_line(summary: dict[str, Any]) -> str | None:
    """The line that says how many records a run rejected (and passages it left out) and where its dead letters
    say why; None when it left nothing out. The command prints it, the Python API warns with it (api54 F3)."""
    records, passages = summary.get("rejected", 0), summary.get("rejected_passages", 0)
    if not (records or passages) or "rejected_records" not in summary:
        return None
    where = Path(summary["store"]) / summary["rejected_records"]
    left_out = f" and {passages} passage(s) of documents left out" if passages else ""
    return f"dilstore precompute: {records} record(s) rejected{left_out}: {where}/ says why, one JSON line each"


def precompute_store(args: argparse.Namespace) -> Outcome:
    """Build, resume or append to the store the parsed arguments name, printing nothing but its progress bar.

    Returns the run's summary; for a build that stored no passage, why
    (`nothing_stored`), else None; and a notice for a run that found its work
    done (the store complete with these settings, or holding this append),
    else None. The command prints all three; the Python API raises on the
    second and prints none, and its caller's stdout and logging stay its own.
    """
    with logging_restored():
        return _precompute_store(args)


def check_max_length(max_length: int, reader: OfflineModel, append: bool) -> None:
    """A DilstoreError for a --max-length too short for a stored unit, or longer than a passage of `reader` may be
    (`max_positions`). An `append` takes the store's own --max-length: a prior Listformer's store built with all of
    its segment's positions, before spec61 F7 held a passage to one fewer, took no append at all ("exceeds the
    model's 511 positions", a store of short passages that has none that long), so an append is held only to the
    segment (`segment_limit`), as its store was; a passage of all of them stops it, as it would have stopped the
    store's build (read61 F2)."""
    from dilstore.reader.offline.kinds import max_positions, positions_note, segment_limit

    if max_length < MIN_MAX_LENGTH:
        raise DilstoreError(
            f"--max-length {max_length} is too short: a stored unit needs its special tokens and room for "
            f"word pieces; use at least {MIN_MAX_LENGTH}"
        )
    positions = max_positions(reader)
    if max_length > positions and not (append and max_length <= segment_limit(reader)):
        raise DilstoreError(
            f"--max-length {max_length} exceeds the model's {positions} positions{positions_note(reader)}"
        )


def _precompute_store(args: argparse.Namespace) -> Outcome:
    started, started_monotonic = time.time(), time.monotonic()  # the summary's seconds, by either (time58 F2)
    inputs, checked, runner, here = _checked_before_torch(args)
    # Torch and transformers (5-6 s) only now: a Beam option Beam refuses was named after them (ci59 F3).
    from dilstore.pipelines.job import run_spec
    from dilstore.reader.offline.encoding import launched_models
    from dilstore.storage.atomic_files import remove_dead_writers_temporaries
    from dilstore.storage.format import SPEC_FILE
    from dilstore.storage.replacement import finish_interrupted_swap
    from dilstore.storage.write_lock import write_lock

    with scratch_dir("dilstore-progress-") as progress_dir, launched_models():
        job = build_job(args, started, runner, str(progress_dir) if here else None, started_monotonic, inputs,
                        checked)  # fmt: skip
        store, spec = Path(job.store), run_spec(job)
        with write_lock(store):
            finish_interrupted_swap(store)
            if args.append:
                return append_to_store(job, runner, args)
            # A run killed while it wrote its spec left the spec's temporary, and the folder was then refused as "not
            # made by `dilstore precompute`" to every run of the same command (state56 F1).
            remove_dead_writers_temporaries(store / SPEC_FILE)
            summary, notice = _build_or_find(job, spec, runner, args)
    return summary, nothing_stored(summary, job.store), notice


def _checked_before_torch(
    args: argparse.Namespace,
) -> tuple[tuple[ReadTask, ...], tuple[Path, Path | None], str, bool]:
    """What can be checked of the run before torch and transformers load, checked, with Beam's and Dask's logging
    set for it: the inputs (`resolve_inputs`), the output and codebook (`check_output_and_codebook`), the Beam
    runner, and whether its workers run on this machine (`runs_here`)."""
    check_append_flags(args)
    # Before Beam, torch and transformers load: a mistyped --input was named after some 8 s of imports (ci59 F2),
    # a mistyped --codebook or --append store after 10-25 s (fast59 F3), a mistyped --model after 10 s (fast59 F6).
    inputs = resolve_inputs(args.input, args.format)
    checked = check_output_and_codebook(args)
    check_model_folder(args.model)
    if not args.verbose:
        quiet_beam_logging()  # before Beam's import logs its GCP notice
    from dilstore.pipelines.options import (
        DASK_RUNNER,
        LocalDefaults,
        assemble_beam_flags,
        canonical_runner,
        pipeline_options,
        refuse_too_many_workers,
        runs_here,
        starts_local_workers,
    )

    runner = canonical_runner(args.runner)
    if starts_local_workers(runner, args.beam_args):  # before anything is created (dask50 F2)
        refuse_too_many_workers("--workers", args.workers)
    if not args.verbose and runner == DASK_RUNNER:
        quiet_dask_logging()
    # Beam's flags are checked again with the real local defaults when the pipeline starts; checked here as well,
    # a bad one is refused before the output folder is created or its precompute.json written.
    here = runs_here(pipeline_options(assemble_beam_flags(runner, args.beam_args, LocalDefaults(workers=args.workers))))
    if not here:
        logging.getLogger("apache_beam").setLevel(logging.INFO)  # remote runners log the job's URL
    elif runner != DASK_RUNNER or starts_local_workers(runner, args.beam_args):  # not a Dask cluster's, maybe remote
        _refuse_threads_beyond_cpus(args.threads)
    return inputs, checked, runner, here


def _refuse_threads_beyond_cpus(threads: int | None) -> None:
    """A DilstoreError for a --threads past 4 per CPU this process may use, for workers that run on this machine,
    where more only wait for a core (complex61 F9). Not at parsing, where the runner is not known yet: a remote
    runner's workers have CPUs of their own, and `--runner dataflow --threads 16` was refused on a 2-CPU launcher
    (read61 F1)."""
    beyond = None if threads is None else threads_beyond_cpus(threads)
    if beyond is not None:
        raise DilstoreError(f"--threads: {beyond}: the workers run on this machine, where more only wait for a core")


def _build_or_find(job: PrecomputeJob, spec: dict[str, Any], runner: str, args: argparse.Namespace
                   ) -> tuple[dict[str, Any], str | None]:  # fmt: skip
    """Build the store at `job.store` (under its write lock), or build its replacement beside it and swap it in
    (--overwrite of a store of other settings), or find it complete with these settings already; the run summary,
    and a notice for the last."""
    from dilstore.pipelines.finish import read_summary
    from dilstore.pipelines.job import (
        changed_since_built,
        check_replaceable,
        discard_other_replacement,
        needs_replacement,
        prepare_store,
        replacement_dir,
        unmade_if_nothing_stored,
    )
    from dilstore.pipelines.spec_file import read_spec
    from dilstore.storage.replacement import swap_in

    store = Path(job.store)
    with unmade_if_nothing_stored(store) as attempt:
        if prepare_store(store, spec, args.overwrite):
            summary = {**read_summary(store), "store": job.store, "already_complete": True}  # where it is now
            notice = f"{job.store} is already complete with these settings"
            if changed_since_built(store, read_spec(store)):
                notice += (" and has changed since (appends, or a compaction): the summary is its first "
                           "build's, `dilstore info` counts what it holds, and --overwrite builds it again "
                           "from these inputs alone")  # fmt: skip
            return summary, notice
        if args.overwrite and needs_replacement(store, spec):
            check_replaceable(store, [task.path for task in job.inputs])
            # A replacement refused before its job started (a foreign --codebook) left its folder behind; one
            # of other settings goes first, so that the take-back sees the folder this run starts from.
            with unmade_if_nothing_stored(discard_other_replacement(store, spec), store) as replacing:
                building = replacement_dir(store, spec)
                built = dataclasses.replace(job, store=str(building), destination=job.store)
                summary = build_store(built, runner, args, replacing)
            swap_in(store, building)
            return summary, None
        return build_store(job, runner, args, attempt), None


def nothing_stored(summary: dict[str, Any], store: str) -> str | None:
    """Why a build that stored no passage failed the user (what it read, where the rejected records are), else None.

    Every record may be a dead letter (a JSONL file read with --format squad) or the input empty: the store is then
    finalized but holds nothing, which a script must not take for success. So must a summary that counts no
    passages at all (a run that ended without one counted as success, dask50 F1), unless it is that of a store
    found already complete, which an older dilstore or a hand may have left without its run-summary.json.
    """
    if "passages" not in summary:
        if summary.get("already_complete"):
            return None
        return f"the run ended without a summary of what it stored in {store}; nothing is known to be stored"
    if summary["passages"] != 0:
        return None
    documents, rejected = summary.get("documents", 0), summary.get("rejected", 0)
    skipped = summary.get("skipped", 0)
    left_out = f", {skipped} left out on purpose (Wikipedia redirects and non-article pages)" if skipped else ""
    where = f" (see {store}/rejected/ for why)" if rejected else ""
    return (f"no passage was stored: {documents} document(s) accepted{left_out}, {rejected} record(s) rejected{where}; "
            "check --input and --format")  # fmt: skip
