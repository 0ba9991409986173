"""Command-line options shared by `ask` and `evaluate-qa`: the store, model, index, retrieval and decoding.

Options left out keep OdqaSettings' defaults (reader/serving/odqa.py), so the
defaults live in one place and `--help` needs no torch import.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from dilstore.runners.arg_types import integer_at_least, positive_int
from dilstore.runners.reading_options import add_runtime_arguments, apply_threads
from dilstore.storage.errors import DilstoreError
from dilstore.storage.messages import path_text

if TYPE_CHECKING:  # imported lazily at run time, so that `dilstore --help` stays fast
    from dilstore.reader.serving.odqa import OpenDomainReader

# Options that are OdqaSettings fields of the same name.
_SETTINGS = (
    "top_p",
    "mu",
    "n_best",
    "max_answer_length",
    "max_question_length",
    "pair_batch_tokens",
    "max_pairs_per_batch",
)


def add_odqa_arguments(parser: argparse.ArgumentParser) -> None:
    """STORE plus --model, --index, --top-p, --mu and the decoding and batching limits."""
    parser.add_argument(
        "store", type=str,
        help="store made by `dilstore precompute` (kind dilbert): a directory or an fsspec URL (http://, s3://, ...)",
    )  # fmt: skip
    parser.add_argument(
        "--model", type=Path, help="reader checkpoint that made the store (default: the shipped reader)"
    )
    parser.add_argument(
        "--no-online-variant", action="store_true",
        help="read a 2bit/1bit store with the checkpoint's own online layers, not those it tuned for that "
        "encoding (online-ENC.safetensors)",
    )  # fmt: skip
    parser.add_argument(
        "--index",
        help="Lucene BM25 index, a local folder (default: STORE/bm25, from `dilstore index`; a STORE given as a "
             "URL needs it)",
    )  # fmt: skip
    parser.add_argument(
        "--top-p", type=positive_int, help="passages retrieved per question (default 29; the seed uses 29 and 100)"
    )
    parser.add_argument(
        "--mu", type=float,
        help="final score = mu * reader score + (1 - mu) * BM25 score, raw scores as in the seed; "
        "1 = reader only (default 0.5)",
    )
    parser.add_argument("--n-best", type=positive_int, help="spans kept per passage and listed (default 20)")
    parser.add_argument("--max-answer-length", type=positive_int, help="longest answer in word pieces (default 30)")
    parser.add_argument(
        "--max-question-length", type=integer_at_least(3),
        help="longest question in tokens, [CLS] and [SEP] included; longer ones are refused (default 64)",
    )  # fmt: skip
    parser.add_argument(
        "--pair-batch-tokens", type=positive_int,
        help="padded question+passage tokens per interaction batch (default 8192)",
    )  # fmt: skip
    parser.add_argument(
        "--max-pairs-per-batch", type=positive_int, help="question-passage pairs per interaction batch (default 64)"
    )
    add_runtime_arguments(parser)


def open_odqa_reader(args: argparse.Namespace) -> OpenDomainReader:
    """The OpenDomainReader the options describe (store, checked model, BM25 index), with torch's threads set.

    Its store checks its files before each lookup, as `serve`'s do: a store rebuilt under an `ask` session or a
    long `evaluate-qa` is an error at the next question, not answers read from the deleted build's maps.
    """
    from dilstore.reader.serving.store_checks import check_reader_inputs

    index = local_index(args.index)
    check_reader_inputs(args.store, args.model, index)
    apply_threads(args.threads)  # imports torch: after the store, its index and the model folder are found
    from dilstore.reader.serving.odqa import OdqaSettings, open_reader

    chosen = {name: getattr(args, name) for name in _SETTINGS if getattr(args, name) is not None}
    settings = OdqaSettings(**chosen)
    reader = open_reader(
        args.store, args.model, index_dir=index, settings=settings, device=args.device,
        online_variant=not args.no_online_variant,
    )  # fmt: skip
    reader.store.check_files = True
    return reader


def local_index(given: str | None) -> Path | None:
    """The folder `--index` gave (None without one), which must be local (`local_index_folder`)."""
    return None if given is None else local_index_folder(given, "--index ")


def local_index_folder(given: str, named_as: str) -> Path:
    """`given` as a local folder of a BM25 index; a DilstoreError for a URL (Lucene reads only local files) that
    names it as `named_as` + the URL: as a Path, a URL lost a slash of its `//`, and the error was "no Lucene index
    at http:/host/..." (multi53 F5). A `file:` URL is refused naming its folder: `file:/abs/bm25` was taken as
    ./file:/abs/bm25 ("no Lucene index at file:/abs/bm25"), and `file:///abs/bm25` was told to be copied to a
    local folder, though it is one (url59 F2)."""
    from dilstore.storage.location import file_url_folder, is_url, redacted

    if not is_url(given):
        return Path(given)
    folder = file_url_folder(given)
    if folder is not None:
        raise DilstoreError(f"{named_as}{redacted(given)} is a URL: give its folder, {path_text(folder)}")
    raise DilstoreError(f"{named_as}{redacted(given)} is a URL, and Lucene reads only local files: give a local "
                        "copy of the store's bm25/ folder")  # fmt: skip
