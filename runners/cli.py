"""The `dilstore` command: one subcommand per module, registered in COMMANDS.

Each command module exposes `register(subparsers)`, which adds its parser and
sets `run=callable(args) -> int`. Heavy imports (torch, Beam, pyserini) happen
inside `run`, so `dilstore --help` stays fast.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import errno
import importlib
import itertools
import os
import sys
from collections.abc import Iterator, Sequence
from typing import Any, TextIO

from dilstore.runners.collector import thaw
from dilstore.runners.exception_chain import exception_chain
from dilstore.runners.fatal_signals import dump_fatal_signals
from dilstore.runners.open_files import raise_open_file_limit
from dilstore.runners.out_of_memory import (
    is_out_of_memory,
    library_not_mapped_line,
    model_load_line,
    out_of_memory_line,
    wraps_out_of_memory,
)
from dilstore.runners.quiet import configure as configure_output
from dilstore.runners.quiet import diagnostics_kept_going, to_null_device
from dilstore.runners.stop_signals import (
    drop_interrupted_work,
    interrupt_number,
    interrupt_words,
    signals_interrupt,
    stops_ignored,
)
from dilstore.runners.terminal import escape_what_stdout_cannot_write
from dilstore.storage.errors import DilstoreError, StoppedBySignal
from dilstore.storage.read_failures import process_shortage, thread_refused
from dilstore.storage.secrets import scrubbed

_SYMLINK_LOOP = "Symlink loop from "  # pathlib's words (Python 3.11, 3.12) for a loop of symbolic links

# Order is the order `dilstore --help` lists them in.
COMMANDS: tuple[str, ...] = (
    "dilstore.runners.cmd_precompute",
    "dilstore.runners.cmd_index",
    "dilstore.runners.cmd_train",
    "dilstore.runners.cmd_evaluate_rc",
    "dilstore.runners.cmd_ask",
    "dilstore.runners.cmd_evaluate_qa",
    "dilstore.runners.cmd_evaluate_rank",
    "dilstore.runners.cmd_rerank",
    "dilstore.runners.cmd_store",
    "dilstore.runners.cmd_compact",
    "dilstore.runners.cmd_serve",
)


def build_parser() -> argparse.ArgumentParser:
    """The top-level parser with every registered subcommand."""
    parser = argparse.ArgumentParser(
        prog="dilstore",
        description="Precompute transformer reader/ranker states into a shard store and serve them.",
    )
    parser.add_argument("--version", action=_PrintVersion, nargs=0, help="print the installed version and exit")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module_name in COMMANDS:
        importlib.import_module(module_name).register(subparsers)
    return parser


class _PrintVersion(argparse.Action):
    """`--version`: the installed package's version, looked up only when asked (importlib.metadata costs every
    command's start 15-20 ms)."""

    def __call__(self, parser: argparse.ArgumentParser, *_: object) -> None:
        from dilstore.storage.versions import dilstore_version

        print(f"dilstore {dilstore_version()}")
        parser.exit()


def parse(parser: argparse.ArgumentParser, argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Parse `argv`; options a command does not know go to its `beam_args` where it has one, else exit 2.

    Only `precompute` sets `beam_args`: what it does not know are Beam's
    pipeline options, handed on to Beam (which refuses misspelt ones), as
    Beam's own examples do with `parse_known_args`. Words before the command
    are `dilstore`'s own, and it knows none but --help and --version.
    """
    words = list(sys.argv[1:] if argv is None else argv)
    args, unknown = parser.parse_known_args(words)
    before_command = words[: words.index(args.command)] if args.command in words else []
    if before_command:
        parser.error(f"unrecognized arguments: {' '.join(before_command)} (a command's options go after it)")
    if unknown and not hasattr(args, "beam_args"):
        args, unknown = _positionals_between_options(parser, args, words, unknown)
    if unknown and not hasattr(args, "beam_args"):
        chosen_parser(parser, args).error(f"unrecognized arguments: {' '.join(unknown)}")
    if hasattr(args, "beam_args"):
        args.beam_args = list(unknown)
    return args


def _positionals_between_options(parser: argparse.ArgumentParser, args: argparse.Namespace, words: list[str],
                                 unknown: list[str]) -> tuple[argparse.Namespace, list[str]]:
    """The command's words parsed again with its positionals gathered from between its options; what is left over.

    argparse fills every positional from the first run of them, so `ask STORE --json QUESTION` left an optional
    QUESTION empty and the question over, as an unrecognized argument. Only a command without subcommands of its
    own is parsed so (argparse's intermixed parsing takes none).
    """
    command = chosen_parser(parser, args)
    if args.command not in words or command.prog.split()[1:] != [args.command]:
        return args, unknown
    again, unknown = command.parse_known_intermixed_args(words[words.index(args.command) + 1:])
    return argparse.Namespace(**{**vars(args), **vars(again)}), unknown


def chosen_parser(parser: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.ArgumentParser:
    """The parser of the (sub)command `args` were parsed for (`dilstore train earl`'s for its options), so that its
    errors name it and show its usage, as argparse's own errors of that command do."""
    while True:
        commands = [action for action in parser._actions if isinstance(action, argparse._SubParsersAction)]
        chosen = next((action.choices[name] for action in commands
                       if (name := getattr(args, action.dest, None)) in action.choices), None)  # fmt: skip
        if chosen is None:
            return parser
        parser = chosen


def command() -> int:
    """The `dilstore` script and `python -m dilstore`: `main`, in a process that ends when the command does, with
    faulthandler on (`dump_fatal_signals`: before any JVM starts)."""
    dump_fatal_signals()
    return main(exits=True)


def main(argv: Sequence[str] | None = None, *, exits: bool = False) -> int:
    """Run one subcommand and return its exit status (the README's promise).

    0 on success; 2 with one `dilstore CMD: error: ...` line for a user error,
    and for the operating-system and decoding errors a user causes (a path
    that cannot be written or read, bytes that are not UTF-8); 130 on Ctrl-C,
    143 on SIGTERM and 129 on SIGHUP, each with one line (`stop_signals`);
    141 when the reader of the output went away. A command's own status
    (verify's 1) is passed through.

    What a command froze as it loaded (runners/collector.py) is given back to
    the collector when it ends, unless the process `exits` with it: the
    interpreter's last collection, at exit, then skips it too (a one-question
    `ask` ended 1.4 s later after giving it back, measured 2026-11-30).
    """
    parser = build_parser()
    args = parse(parser, argv)
    if not getattr(args, "run", None):
        parser.print_help()
        return 2
    verbose = getattr(args, "verbose", False)
    configure_output(verbose=verbose)
    escape_what_stdout_cannot_write()  # a Latin-1 or ASCII terminal is shown escapes, not a failure halfway
    raise_open_file_limit()  # a store keeps one descriptor per mapped file open (runners/open_files.py)
    with diagnostics_kept_going(), _output_marked():  # a stderr that cannot be written ends no command (disk56 F10)
        return _run(args, exits=exits)


class _StandardOutput:
    """`sys.stdout` while a command runs, whose write and flush errors say that they are its own: an OSError raised
    through it has `standard_output` set. Every other attribute is the stream's.

    `output_lost` finds a buffered output's failure by flushing again; an unbuffered one (PYTHONUNBUFFERED=1, as
    container images set it) kept nothing to flush, and `dilstore info STORE > FILE` on a full disk said "error: No
    space left on device", naming nothing (read56 F5)."""

    def __init__(self, stream: Any) -> None:
        self.stream = stream

    def write(self, text: str) -> int:
        try:
            return self.stream.write(text)
        except OSError as error:
            error.standard_output = True  # type: ignore[attr-defined]
            raise

    def flush(self) -> None:
        try:
            self.stream.flush()
        except OSError as error:
            error.standard_output = True  # type: ignore[attr-defined]
            raise

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream, name)


@contextlib.contextmanager
def _output_marked() -> Iterator[None]:
    """While the block runs, `sys.stdout` is a `_StandardOutput` (left as it is when closed: None)."""
    saved = sys.stdout
    if saved is None:
        yield
        return
    sys.stdout = _StandardOutput(saved)  # type: ignore[assignment]
    try:
        yield
    finally:
        sys.stdout = saved


def _run(args: argparse.Namespace, *, exits: bool) -> int:
    """Run the parsed command `args` (`main`'s promise).

    Its last line (an error, a stop) goes to stderr, or, where stderr was closed as the command started (`2>&-`:
    `sys.stderr` None), to stdout, where print() writes when its file is None (read56 F1). transformers' import
    replaces a None stderr with the null device, so `ask`, `precompute`, `train`, the evaluations, `rerank` and
    `serve` exited 2 with no word where `info` said what went wrong (left58 F6); the line no longer follows it.
    """
    stderr_closed = sys.stderr is None

    def last_lines() -> TextIO | None:
        """Where the command's last line goes: None (print()'s stdout) where stderr was closed, else stderr."""
        return None if stderr_closed else sys.stderr

    verbose = getattr(args, "verbose", False)
    try:
        with signals_interrupt(mute_when_stopping=not verbose):
            status = int(args.run(args) or 0)
            if sys.stdout is not None:  # closed (`>&-`): what was printed went nowhere, as asked
                sys.stdout.flush()
        return status
    except StoppedBySignal as stop:
        with stops_ignored():
            print(f"dilstore {args.command}: {stop}", file=last_lines())
            drop_interrupted_work(stop)
        return 128 + stop.signal_number
    except DilstoreError as error:
        # a model's load that ran out of memory (journey59 F2)
        words = model_load_line() if wraps_out_of_memory(error) else scrubbed(str(error))
        print(f"dilstore {args.command}: error: {words}", file=last_lines())
        return 2
    except KeyboardInterrupt as interrupt:
        earlier = earlier_stop(interrupt)
        with stops_ignored():
            words = interrupt_words(interrupt) if earlier is None else str(earlier)
            print(f"dilstore {args.command}: {words}", file=last_lines())
            drop_interrupted_work(interrupt)
        return 128 + (interrupt_number(interrupt) if earlier is None else earlier.signal_number)
    except BrokenPipeError:
        # The reader of our output went away (`dilstore info STORE | head`): stop quietly, as Unix tools do.
        to_null_device(sys.stdout)  # the interpreter's last flush goes nowhere, where it failed again
        return 141
    except OSError as error:
        print(f"dilstore {args.command}: error: {_os_error_words(error)}", file=last_lines())
        return 2
    except UnicodeError as error:
        print(f"dilstore {args.command}: error: text that is not valid UTF-8: {error}", file=last_lines())
        return 2
    except ImportError as error:  # a library that could not be mapped under ulimit -v
        if (line := library_not_mapped_line(error)) is None:
            raise
        print(f"dilstore {args.command}: error: {scrubbed(line)}", file=last_lines())
        return 2
    except (MemoryError, RuntimeError) as error:  # an allocation refused (torch's is a RuntimeError), a symlink loop
        if (words := _shortage_or_loop_words(args, error)) is None:
            raise
        print(f"dilstore {args.command}: error: {words}", file=last_lines())
        return 2
    finally:
        if not exits:
            thaw()


def _os_error_words(error: OSError) -> str:
    """What an OSError that ended a command says after "error: ": an unwritable output, a full disk, an unreadable
    file, in one line naming the file (the password of a URL in it hidden), as promised; an output that cannot be
    written is named as the standard output where the error names no file (`output_lost`)."""
    if error.filename is None and (output_lost() or getattr(error, "standard_output", False)):
        return f"cannot write the output (standard output): {error.strerror or error}"
    where = f": {error.filename}" if error.filename else ""
    return scrubbed(f"{error.strerror or error}{where}")


def _shortage_or_loop_words(args: argparse.Namespace, error: MemoryError | RuntimeError) -> str | None:
    """What a MemoryError or RuntimeError that ended a command says after "error: ": an allocation refused (torch's
    is a RuntimeError), a thread refused its stack (ulimit -v) or a process (ulimit -u) (journey59 F1), or a loop of
    symbolic links; None for any other, which is a bug to show in full."""
    if is_out_of_memory(error):
        return out_of_memory_line(args)
    if thread_refused(error):
        return process_shortage(error)
    if isinstance(error, RuntimeError) and (loop := symlink_loop(error)) is not None:
        return scrubbed(f"{os.strerror(errno.ELOOP)}: {loop}")
    return None


def symlink_loop(error: RuntimeError) -> str | None:
    """The path of Python 3.11's and 3.12's `Path.resolve()` error for a loop of symbolic links, or None for any other
    RuntimeError: an --output, --predictions or STORE that was such a loop ended precompute, compact, evaluate-qa
    and the other commands that resolve their paths with a traceback; from Python 3.13 it is an OSError (ELOOP),
    one line naming the path, which this gives too (port58 F5)."""
    text = str(error)
    if not text.startswith(_SYMLINK_LOOP):
        return None
    try:
        return str(ast.literal_eval(text.removeprefix(_SYMLINK_LOOP)))
    except (ValueError, SyntaxError):
        return text.removeprefix(_SYMLINK_LOOP)


def output_lost() -> bool:
    """Whether the standard output cannot be written (its file's disk is full, say), found by flushing it once
    more: the bytes a failed write left in its buffer fail again, where an output that works takes them. It is
    then pointed at the null device, so that the interpreter's last flush has nowhere to fail.

    `dilstore info STORE > FILE` on a full disk said "error: No space left on device", naming nothing, then "Exception
    ignored in: <_io.TextIOWrapper name='<stdout>' ...>" and the OSError again, and exited 120, not 2 (disk56 F2).
    An unbuffered output (python -u, PYTHONUNBUFFERED) keeps nothing to flush: its errors are known by the mark
    `_StandardOutput` puts on them.
    """
    if sys.stdout is None:  # closed (`>&-`): nothing to lose
        return False
    try:
        sys.stdout.flush()
    except OSError:
        pass
    else:
        return False
    to_null_device(sys.stdout)  # a stdout that is no file (a test's capture) has no descriptor, and stays as it is
    return True


def earlier_stop(interrupt: KeyboardInterrupt) -> StoppedBySignal | None:
    """The stop `interrupt` came during: a second Ctrl-C while the first one's stop unwound (a LocalCluster closing)
    printed only "interrupted", the first's words about what was kept and how to go on lost (dask50 F8)."""
    earlier = itertools.islice(exception_chain(interrupt), 1, None)  # not `interrupt` itself
    return next((each for each in earlier if isinstance(each, StoppedBySignal)), None)


if __name__ == "__main__":
    sys.exit(command())
