"""`dilstore ask`: answer questions from a store (BM25 → stored states → online layers), one-shot or interactive."""

from __future__ import annotations

import argparse
import json
import sys
import unicodedata
from typing import TYPE_CHECKING, TextIO

from dilstore.runners.collector import loading_for_good
from dilstore.runners.odqa_options import add_odqa_arguments, open_odqa_reader
from dilstore.runners.quiet import add_verbose_argument
from dilstore.runners.terminal import json_text
from dilstore.storage.errors import DilstoreError
from dilstore.storage.format import StoreChangedError

if TYPE_CHECKING:  # imported lazily at run time, so that `dilstore --help` stays fast
    from dilstore.reader.serving.answers import Answer
    from dilstore.reader.serving.odqa import OpenDomainReader

HIGHLIGHT = ("[[", "]]")
_STAGE_LABELS = {
    "retrieval": "retrieval",
    "store_read": "store read",
    "question_layers": "question layers",
    "interaction_layers": "interaction layers",
    "decode": "decode",
    "total": "total",
}


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `ask` subcommand."""
    parser = subparsers.add_parser(
        "ask",
        help="answer a question from a store (interactive when no question is given)",
        description=(
            "Retrieve the top-p passages with BM25, read their stored layer-k states, run the question's "
            "layers 1..k and the interaction layers k+1..l, and print the best answer with its score, its "
            "passage (span in [[ ]]), what it was read from (the store's encoding and online layers) and the time "
            "per stage. Without a question, questions are read from "
            "standard input, one per line, until end of input (blank lines are passed over); a bad question "
            "prints an error and the session goes on, and the exit status is then 2 at the end of the input. A "
            "store rebuilt under the session ends it (exit 2): start ask again to read the store as it is now."
        ),
    )
    add_odqa_arguments(parser)
    parser.add_argument("question", nargs="?", help="the question (omit it to read questions from stdin)")
    parser.add_argument("--json", action="store_true", help="print one JSON object per answer")
    add_verbose_argument(parser)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Open the store, model and index once, then answer one question or every line of stdin."""
    if args.question is not None and (bad := _undecoded_byte(args.question)) is not None:
        raise DilstoreError(f"the question is not UTF-8 text (byte at character {bad + 1})")
    if args.question is not None and not args.question.strip():  # before the model, maps and JVM load (9 s)
        raise DilstoreError("the question is empty")
    if args.question is None and sys.stdin is None:  # started with stdin closed (`<&-`): nothing to read questions from
        raise DilstoreError("no question given and standard input is closed: give a QUESTION or questions on stdin")
    with loading_for_good():  # torch, transformers, the model, the store and the JVM
        odqa = open_odqa_reader(args)
    if args.question is not None:
        print_answer(odqa.answer(args.question), args.json, sys.stdout, odqa.read_with)
        return 0
    return interactive(odqa, question_input(sys.stdin), sys.stdout, sys.stderr, as_json=args.json)


def question_input(stdin: TextIO) -> TextIO:
    """`stdin` set up for reading questions: from a file or pipe as UTF-8, as every other file dilstore reads; at a
    terminal in the locale's encoding, which is what the terminal sends. Either way a byte the encoding cannot read
    becomes a lone surrogate (`_undecoded_byte` reports it) instead of ending the session with a decode error.

    A question file piped in under a Latin-1 locale was read in Latin-1: `Zürich` became `ZÃ¼rich`, answered
    without a word; under an ASCII locale it was refused as "not UTF-8 text", which it was (left57 F5).
    """
    if stdin.isatty():
        stdin.reconfigure(errors="surrogateescape")
    else:
        stdin.reconfigure(encoding="utf-8", errors="surrogateescape")
    return stdin


def _undecoded_byte(text: str) -> int | None:
    """Where the first byte that was not UTF-8 sits in `text` (0-based), else None.

    Python decodes such bytes, in argv and in stdin read with surrogateescape, to U+DC80..U+DCFF.
    """
    return next((index for index, character in enumerate(text) if "\udc80" <= character <= "\udcff"), None)


def interactive(odqa: OpenDomainReader, lines: TextIO, out: TextIO, err: TextIO, *, as_json: bool) -> int:
    """Answer each line of `lines`; a bad question is reported on `err` and the loop goes on.

    A line that is not UTF-8 (read with surrogateescape) is reported by the
    position of its first bad byte; any DilstoreError for one question is
    printed as one line. Neither ends the session, but either makes its exit
    status 2, as a reported error does everywhere else: a script that pipes a
    question file in learns that some were not answered. Blank lines are
    passed over, and a byte-order mark opening the input is not part of the
    first question. Read from a file or pipe, each error names its input
    line, so that a script can tell which questions were not answered (qa48 L3),
    and with `as_json` each of those lines gives one JSON object on `out`, its
    answer or its error, with the line's number (ask50 F2). Input that ends
    without a newline ends the session after that question: a terminal's
    Ctrl-D mid-line took two more presses to end it (ask50 F3).
    """
    prompt = lines.isatty()
    number, status = 0, 0
    while True:
        if prompt:
            err.write("question> ")
            err.flush()
        try:
            line = lines.readline()
        except KeyboardInterrupt:
            if prompt:  # the interruption's message starts a line of its own, not after the prompt
                err.write("\n")
            raise
        if not line:
            return status
        number += 1
        if number == 1 and not prompt:
            _refuse_utf16(line)
        question = line.rstrip("\r\n").removeprefix("\ufeff" if number == 1 else "")
        if question.strip():
            try:
                status = max(status, _answer_line(odqa, question, None if prompt else number, out, err, as_json))
            except StoreChangedError:  # no later question can be read either
                return 2
        if not line.endswith("\n"):
            return status


def _refuse_utf16(first: str) -> None:
    """A DilstoreError when the first line of questions from a file or pipe (read as UTF-8, bad bytes as lone
    surrogates) is UTF-16 text, as for every input file (reader.text.files.wide_text_refusal). A UTF-16 question file
    piped in was one "not UTF-8 text" line, then questions of NULs between the letters, answered with nothing found
    (left57 F8)."""
    from dilstore.reader.text.files import wide_encoding, wide_text_refusal

    try:
        head = first.encode("utf-8", "surrogateescape")  # the bytes read, where `first` came from a stream
    except UnicodeEncodeError:  # a lone surrogate no decoder gives: not read from bytes
        return
    if (encoding := wide_encoding(head)) is not None:
        raise wide_text_refusal("standard input", encoding, "questions from a file or pipe are read as UTF-8")


def _answer_line(
    odqa: OpenDomainReader, question: str, number: int | None, out: TextIO, err: TextIO, as_json: bool
) -> int:
    """Answer the question of input line `number` (None at a terminal): 0, or 2 once the error is reported on
    `err` (and, with `as_json` and a line number, as a JSON object on `out`). A StoreChangedError is reported and
    raised again: the session ends."""
    where = "" if number is None else f"line {number}: "
    try:
        if (bad := _undecoded_byte(question)) is not None:
            raise DilstoreError(f"the question is not UTF-8 text (byte at character {bad + 1}); skipped")
        answer = odqa.answer(question)
    except DilstoreError as error:
        ends = isinstance(error, StoreChangedError)
        message = f"{where}{error}" + ("; the session ends: start `dilstore ask` again to read the store as it is now"
                                       if ends else "")  # fmt: skip
        print(f"dilstore ask: error: {message}", file=err, flush=True)
        if as_json and number is not None:
            print(json.dumps({"line": number, "error": message.removeprefix(where)}), file=out, flush=True)
        if ends:
            raise
        return 2
    print_answer(answer, as_json, out, odqa.read_with, line=number)
    out.flush()
    return 0


def print_answer(
    answer: Answer, as_json: bool, out: TextIO, read_with: dict[str, str | None], line: int | None = None
) -> None:
    """The answer as one JSON line (with its input `line` when given), or as text: answer, scores, highlighted
    passage, what it was read from (the store's encoding and online layers, `OpenDomainReader.read_with`),
    timings."""
    if as_json:
        numbered = {} if line is None else {"line": line}
        print(json_text({**numbered, **answer.to_dict(), **read_with}, out), file=out)
        return
    print(f"question: {printable(answer.question)}", file=out)
    best = answer.best
    if best is None:
        why = "no retrieved passage gave a valid span" if answer.passages else "BM25 retrieved no passage for it"
        print(f"answer: (none: {why})", file=out)
    else:
        print(f"answer: {printable(best.text)}", file=out)
        print(
            f"score: {best.score(answer.mu):.4f} = {answer.mu:g} * reader {best.reader_score:.4f}"
            f" + {1 - answer.mu:g} * bm25 {best.bm25_score:.4f}",
            file=out,
        )
        passage = answer.passages[best.passage_id]
        title = f" ({passage.title})" if passage.title else ""
        print(f"passage: {printable(best.passage_id + title)}", file=out)
        print(f"  {printable(highlight(passage.text, best.char_start, best.char_end))}", file=out)
    layers = f", online layers {read_with['online_variant']}" if read_with["online_variant"] else ""
    print(f"read from: {read_with['encoding']} store{layers}", file=out)
    timings = answer.timings.to_dict()
    parts = [f"{label} {1000 * timings[stage]:.1f} ms" for stage, label in _STAGE_LABELS.items()]
    print("timings: " + " | ".join(parts), file=out)


def printable(text: str) -> str:
    """`text` with control characters (ESC, BEL, CR, ... any Unicode "Cc") written as escapes, safe for a terminal.

    Corpus text, ids and questions come from anywhere; printed raw, an escape
    sequence in them would drive the user's terminal.
    """
    return "".join(
        repr(character)[1:-1] if unicodedata.category(character) == "Cc" else character for character in text
    )


def highlight(text: str, start: int, end: int) -> str:
    """`text` with [start, end) wrapped in the highlight markers."""
    opening, closing = HIGHLIGHT
    return f"{text[:start]}{opening}{text[start:end]}{closing}{text[end:]}"
