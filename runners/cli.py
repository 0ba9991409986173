"""The `dilstore` command: one subcommand per module, registered in COMMANDS.

Each command module exposes `register(subparsers)`, which adds its parser and
sets `run=callable(args) -> int`. Heavy imports (torch, Beam, pyserini) happen
inside `run`, so `dilstore --help` stays fast.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence

from storage.errors import DilstoreError

# Order is the order `dilstore --help` lists them in.
COMMANDS: tuple[str, ...] = (
    "runners.cmd_precompute",
    "runners.cmd_index",
    "runners.cmd_train",
    "runners.cmd_evaluate_rc",
    "runners.cmd_ask",
    "runners.cmd_evaluate_qa",
    "runners.cmd_evaluate_rank",
    "runners.cmd_rerank",
    "runners.cmd_store",
)


def build_parser() -> argparse.ArgumentParser:
    """The top-level parser with every registered subcommand."""
    parser = argparse.ArgumentParser(
        prog="dilstore",
        description="Precompute transformer reader/ranker states into a shard store and serve them.",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module_name in COMMANDS:
        importlib.import_module(module_name).register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run one subcommand and return its exit status (the README's promise).

    0 on success; 2 with one `dilstore CMD: error: ...` line for a user error,
    and for the operating-system and decoding errors a user causes (a path
    that cannot be written or read, bytes that are not UTF-8); 130 on Ctrl-C;
    141 when the reader of the output went away. A command's own status
    (verify's 1) is passed through.
    """
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "run", None):
        parser.print_help()
        return 2
    try:
        status = int(args.run(args) or 0)
        sys.stdout.flush()
        return status
    except DilstoreError as error:
        print(f"dilstore {args.command}: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"dilstore {args.command}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # The reader of our output went away (`dilstore info STORE | head`): stop quietly, as Unix tools do.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141
    except OSError as error:
        # An unwritable output, a full disk, an unreadable file: one line naming the file, as promised.
        where = f": {error.filename}" if error.filename else ""
        print(f"dilstore {args.command}: error: {error.strerror or error}{where}", file=sys.stderr)
        return 2
    except UnicodeError as error:
        print(f"dilstore {args.command}: error: text that is not valid UTF-8: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
