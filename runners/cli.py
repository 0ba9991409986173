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
    "runners.cmd_serve",
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
    """Run one subcommand and return its exit status; user errors exit 2 with a message."""
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


if __name__ == "__main__":
    sys.exit(main())
