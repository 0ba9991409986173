"""`dilstore info` and `dilstore verify`: describe or check a shard store."""

from __future__ import annotations

import argparse
import os
import sys
import threading
from typing import TYPE_CHECKING, Any

from dilstore.runners.terminal import json_text
from dilstore.storage.messages import counted, listed

if TYPE_CHECKING:
    from dilstore.storage.verify import VerifyProgress, VerifyReport

_SHOWN_UNTRACKED = 10


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add `info` and `verify`."""
    info = subparsers.add_parser(
        "info",
        help="describe a store: counts, sizes, bytes per token, fingerprint",
        description="Print a store's passage, token and shard counts, size on disk, bytes per token and fingerprint.",
    )
    info.add_argument("store", metavar="STORE", help="store directory or fsspec URL")
    info.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    info.set_defaults(run=run_info)

    verify = subparsers.add_parser(
        "verify",
        help="check a store's checksums, arrays, offsets and id index",
        description=(
            "Check every file against the manifest's SHA-256, every array's shape and dtype, that offsets "
            "increase and stay in bounds, that strings and char spans are valid, and that the id index is "
            "consistent. Exits 0 when the store is sound and 1 on any problem."
        ),
    )
    verify.add_argument("store", metavar="STORE", help="store directory or fsspec URL")
    verify.add_argument("--json", action="store_true", help="print the report as one JSON object")
    verify.add_argument("--no-progress", action="store_true", help="no progress bars (also off with --json)")
    verify.set_defaults(run=run_verify)


def run_info(args: argparse.Namespace) -> int:
    """`dilstore info`: print the store's description (`store_info`), as a table or JSON; 0."""
    from dilstore.storage.info import store_info

    info = store_info(args.store)
    if args.json:
        print(json_text(info, sys.stdout, indent=2))
    else:
        print(format_info(info))
    leftover = stopped_compaction_note(args.store)
    if leftover is not None:
        print(f"dilstore info: {leftover}", file=sys.stderr)
    return 0


def stopped_compaction_note(store: str) -> str | None:
    """What an in-place `dilstore compact` killed before its swap left beside a local store, and the commands that
    delete it, in words; None when nothing is left or a compaction is running. `info` said nothing of a folder that
    holds a copy of the store's live rows (left55 F1)."""
    from dilstore.storage.location import StoreLocation
    from dilstore.storage.replacement import stopped_compaction_beside
    from dilstore.storage.write_lock import writer_of

    root = StoreLocation.parse(store).local_root
    if root is None or writer_of(root) is not None:  # a compaction running now is building in it
        return None
    stopped = stopped_compaction_beside(root)
    if stopped is None:
        return None
    from dilstore.storage.format import SPEC_FILE

    size = sum(path.stat().st_size for path in stopped.rglob("*") if path.is_file())
    # Without a spec it may also be a `precompute --overwrite` stopped before it wrote one (left57 F1).
    who = "`dilstore compact`" if (stopped / SPEC_FILE).exists() else "`dilstore compact` or `precompute --overwrite`"
    return (f"{stopped} ({_size(size)}) is what a {who} of {store} stopped before its end left; the "
            f"store is as it was, and the next `dilstore compact` or `dilstore precompute` of it deletes the folder")


def run_verify(args: argparse.Namespace) -> int:
    """`dilstore verify`: check the store and its BM25 index (`verify_with_index`) and print the report; 0 when
    sound, 1 otherwise."""
    with BarProgress("verify", disabled=args.no_progress or args.json) as progress:
        report = verify_with_index(args.store, progress=progress)
    if args.json:
        print(json_text(report.to_dict(), sys.stdout, indent=2))
    else:
        print(format_report(report.to_dict()))
    return 0 if report.ok else 1


def verify_with_index(
    store: str, storage_options: dict[str, Any] | None = None, progress: VerifyProgress | None = None
) -> VerifyReport:
    """The report `dilstore verify` prints and `dilstore.verify` returns: `verify_store`'s, which checks the store
    only, with the problems of a local store's BM25 index (`bm25_problems`) added.

    One function for both: a program that verified through `verify_store` after an append was told the store was
    sound while its index was stale, which the command calls a problem (left56 F1).
    """
    from dilstore.storage.verify import verify_store

    report = verify_store(store, storage_options, progress=progress)
    index = bm25_problems(store)
    if index is not None:  # its files are checked by Lucene's checksums, no longer "not checked"
        from dilstore.reader.retrieval import BM25_INDEX_DIR

        report.problems.extend(index)
        report.untracked = [path for path in report.untracked if not path.startswith(f"{BM25_INDEX_DIR}/")]
    return report


def bm25_problems(store: str) -> list[str] | None:
    """The problems of a local store's BM25 index (STORE/bm25, outside the manifest: `reader.retrieval.
    index_problems`), when it has one and its manifest can be read; None when it was not checked. An index folder
    that cannot be listed is named even where the manifest cannot be read (perm57 F2), unless the store's folder
    itself cannot be reached: then `verify` named a STORE/bm25 the user never gave (url59 F5)."""
    from dilstore.reader.retrieval import bm25_index_dir, holds_lucene_index, index_problems
    from dilstore.storage.errors import DilstoreError
    from dilstore.storage.format import StoreFormatError
    from dilstore.storage.location import StoreLocation
    from dilstore.storage.manifest import read_manifest

    location = StoreLocation.parse(store)
    if location.local_root is None:
        return None
    try:
        manifest = read_manifest(location)
    except StoreFormatError:  # verify has said why
        manifest = None
        if not os.path.isdir(location.local_root):  # a loop of links, a name too long: no folder to look in
            return None
    try:
        if not holds_lucene_index(bm25_index_dir(store)):
            return None
    except DilstoreError as error:  # an index this user cannot list was passed over, and verify said OK (perm57 F2)
        return [str(error)]
    return None if manifest is None else index_problems(bm25_index_dir(store), manifest, store)


def _size(size: float) -> str:
    """`size` bytes in B, KiB, MiB or GiB: the largest unit of which the figure shown is at least 1.0."""
    if size < 1024:
        return f"{int(size)} B"
    for unit in ("KiB", "MiB"):
        size /= 1024
        if round(size, 1) < 1024:  # 1,048,575 bytes are 1023.999 KiB, shown as 1.0 MiB, not "1024.0 KiB"
            return f"{size:.1f} {unit}"
    return f"{size / 1024:.1f} GiB"


class BarProgress:
    """A VerifyProgress shown as one tqdm bar per phase on stderr (bytes scaled to KB, MB, ...)."""

    def __init__(self, command: str, *, disabled: bool) -> None:
        self.command, self.disabled = command, disabled
        self.bar: Any = None
        self._lock = threading.Lock()  # verify hashes on several threads, and tqdm's count is a plain +=

    def __enter__(self) -> BarProgress:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._close()

    def phase(self, name: str, total: int, unit: str) -> None:
        """Close the last phase's bar and open this one's."""
        from tqdm import tqdm

        from dilstore.reader.progress_lines import bar_options, steady_bar

        self._close()
        self.bar = steady_bar(tqdm)(total=total, unit=unit, unit_scale=unit == "B", desc=f"{self.command} {name}",
                        disable=self.disabled, **bar_options())  # fmt: skip

    def advance(self, amount: int) -> None:
        """Move the current bar on by `amount`."""
        with self._lock:
            if self.bar is not None:
                self.bar.update(amount)

    def _close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None


def format_info(info: dict[str, Any]) -> str:
    """The human-readable table of `store_info` output."""
    shape = "×".join(map(str, info["state_shape"])) if info["state_shape"] else "none"
    per_token = ", ".join(
        f"{part} {value:g}" for part, value in info["bytes_per_token_by_part"].items() if value
    ) or "no tokens"
    rows = [
        ("store", info["store"]),
        ("kind", f"{info['kind']} (per-token shape {shape})"),
        ("encoding", f"{info['encoding']}, {info['compressor'] or 'uncompressed'}"),
        ("passages", f"{info['passages']:,}"),
        ("tokens", f"{info['tokens']:,}"),
        ("shards", f"{info['shards']:,}"),
        ("on disk", f"{_size(info['bytes_on_disk'])} ({info['bytes_on_disk']:,} bytes)"),
        ("bytes/token", ", ".join(f"{kind} {'n/a (no tokens)' if value is None else value}"
                                  for kind, value in info["bytes_per_token"].items())),  # fmt: skip
        ("  by part", per_token),
    ]
    if info["state_bytes_per_token_marginal"] is not None:
        states = info["state_bytes"]
        superseded = f" + {_size(states['superseded'])} superseded" if states.get("superseded") else ""
        rows.append(("  states", f"{info['state_bytes_per_token_marginal']} per token "
                                 f"({_size(states['per_token'])}){superseded} + {_size(states['fixed'])} fixed "
                                 "(last-chunk padding, chunk indexes, per-shard parameters, codebook)"))
    if "appends" in info:
        rows.append(("appends", f"{info['appends']:,}; {info['superseded']['passages']:,} passages "
                                f"({info['superseded']['tokens']:,} tokens) superseded by --replace, still on disk"))
    rows += [
        ("fingerprint" if i == 0 else "", f"{key}: {value}")
        for i, (key, value) in enumerate(info["fingerprint"].items())
    ]
    width = max(len(label) for label, _ in rows)
    return "\n".join(f"{label:<{width}}  {value}" for label, value in rows)


def format_report(report: dict[str, Any]) -> str:
    """The human-readable verify report."""
    lines = [
        f"store    {report['store']}",
        f"checked  {counted(report['files_checked'], 'file')} ({_size(report['bytes_checked'])}), "
        f"{counted(report['shards'], 'shard')}, {counted(report['passages'], 'passage')}, "
        f"{counted(report['tokens'], 'token')}",
    ]
    untracked = report["untracked"]
    if untracked:
        shown = listed(untracked, quoted=False, limit=_SHOWN_UNTRACKED)
        lines.append(f"not in the manifest (added after finalize, not checked): {shown}")
    if report["ok"]:
        lines.append("OK")
    else:
        lines.append(f"FAILED: {len(report['problems'])} problem(s)")
        lines += [f"  - {problem}" for problem in report["problems"]]
    return "\n".join(lines)
