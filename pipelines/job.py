"""One precompute run's settings, as one picklable value every worker gets.

`PrecomputeJob` carries what workers need (inputs, split, shard count, model
reference and fingerprint, encoding, compressor, batch policy, threads, where
to report progress). `run_spec` is the part that decides the store's contents:
a re-run may resume a store only when its spec is the same, and the spec is
written to `STORE/precompute.json` before any shard, so a later run can tell.
`prepare_store` makes the output folder ready for a run (start, resume, or
refuse); with --overwrite, a store of other settings is replaced by building
the new one beside it and swapping it in once complete (`replacement_dir`,
`storage.replacement.swap_in`), and only a dilstore store that holds no input and is not the
current folder is ever replaced (`check_replaceable`).
"""

from __future__ import annotations

import contextlib
import datetime
import shlex
import shutil
import signal
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dilstore.pipelines.routing import ReadTask, RouteSettings
from dilstore.pipelines.shard_sink import ShardSettings, committed_passages
from dilstore.pipelines.spec_file import read_spec, spec_json
from dilstore.reader.batching import BatchPolicy
from dilstore.storage.atomic_files import atomic_write_text
from dilstore.storage.codebook import CODEBOOK_DIR, codebook_digest, read_codebook
from dilstore.storage.encodings import get_encoding
from dilstore.storage.errors import DilstoreError, StoppedBySignal
from dilstore.storage.file_errors import remove_tree
from dilstore.storage.fingerprint import Fingerprint
from dilstore.storage.format import MANIFEST_FILE, SPEC_FILE
from dilstore.storage.location import StoreLocation
from dilstore.storage.manifest import read_manifest
from dilstore.storage.replacement import building_dir, refuse_undeletable


@dataclass(frozen=True)
class PrecomputeJob:
    """Everything a precompute run's workers share.

    store: absolute local path of the output store. model: a path or a
    packaged-model reference (reader/offline/encoding.py). started_at: launch time
    (epoch seconds) for the summary's `seconds`, and started_monotonic and
    started_on the launcher's monotonic clock then and its machine
    (`seconds_since_start`). progress_dir: the launching command's
    scratch folder, for live progress files (local runners) and Beam's own
    temporary folder, or None. compressor: None
    (uncompressed, memory-mappable) or a storage compressor name ("zstd",
    "blosc"). codebook: a codebook folder given with `--codebook` for a
    2bit/1bit run, or None to train one on a sample (pipelines/codebook.py).
    creation: facts recorded in the manifest (command line, runner).
    """

    inputs: tuple[ReadTask, ...]
    store: str
    strategy: str
    num_shards: int
    max_length: int
    model: str
    fingerprint: Fingerprint
    policy: BatchPolicy
    threads: int
    runner: str
    started_at: float
    progress_dir: str | None = None
    compressor: str | None = None
    codebook: str | None = None
    generation: str | None = None
    # Where the store ends up when it is built elsewhere (an --overwrite replacement, built beside it; an --append,
    # built in the store's appends/<generation>/ folder).
    destination: str | None = None
    # --append: the finalized store the run's shards join (whose codebook they use), the index of the run's shard 0
    # there, and whether the new rows supersede stored rows of the same id (--replace). pipelines/append.py.
    append_to: str | None = None
    first_shard: int = 0
    replace: bool = False
    creation: dict[str, Any] = field(default_factory=dict, compare=False)
    # The shards (numbered as stored) committed before this run started, which it resumes; None: not looked up, and
    # every commit marker found counts as resumed. A shard committed by this run's own task before its worker died
    # is a retry, not a resume (dask50 F7). Set by the launcher (runners/precompute_run.py).
    resumed_shards: frozenset[int] | None = field(default=None, compare=False)
    # The launcher's time.monotonic() at launch and its machine (`this_machine`), set by runners/cmd_precompute.py.
    started_monotonic: float | None = field(default=None, compare=False)
    started_on: str | None = field(default=None, compare=False)

    def seconds_since_start(self) -> float:
        """Seconds since the run was launched: by the monotonic clock where the launcher's machine is this one, else
        by the wall clock, never below 0.

        The summary's `seconds` was `time.time() - started_at` alone: a wall
        clock stepped back during a run (an NTP correction, a VM resumed) made
        it negative, and its rate the passages over 1e-9 s (time58 F2). The
        monotonic clock does not step, and is one per machine (per kernel:
        containers share it); a worker on another machine (Dataflow) has only
        the wall clock to go by, where a clock behind the launcher's gives 0.
        """
        if self.started_monotonic is not None and self.started_on == this_machine():
            return max(time.monotonic() - self.started_monotonic, 0.0)
        return max(time.time() - self.started_at, 0.0)

    @property
    def kind(self) -> str:
        return self.fingerprint.kind

    @property
    def layers(self) -> int:
        """The split point: k for dilbert, the query layers N for the EARL kinds."""
        return self.fingerprint.layers

    @property
    def encoding(self) -> str:
        return self.fingerprint.encoding

    def route_settings(self) -> RouteSettings:
        """What the route step needs of the run: split strategy, shard count, window length, kind."""
        return RouteSettings(
            strategy=self.strategy, num_shards=self.num_shards, max_length=self.max_length, kind=self.kind
        )

    def shard_settings(self) -> ShardSettings:
        """What each shard writer needs of the run: store, kind, encoding, batching, compressor, codebook."""
        return ShardSettings(
            store=self.store, kind=self.kind, encoding=self.encoding, policy=self.policy, compressor=self.compressor,
            codebook=str(Path(self.append_to or self.store) / CODEBOOK_DIR) if get_encoding(self.encoding).codebook
            else None,
            generation=self.generation, fingerprint=self.fingerprint,
        )  # fmt: skip

    def resumed_passages(self) -> int:
        """The passages of the shards this run resumes (`resumed_shards`), which an earlier invocation encoded: where
        the progress bar starts, and what the summary's rate leaves out (docs50 L1)."""
        return committed_passages(self.shard_settings(), self.resumed_shards or ())


def this_machine() -> str:
    """What names this machine's monotonic clock: the Linux boot id (one per kernel boot, shared by its containers),
    else the host name."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text(encoding="ascii").strip()
    except (OSError, UnicodeDecodeError):
        return socket.gethostname()


def run_spec(job: PrecomputeJob) -> dict[str, Any]:
    """What fixes a store's contents: inputs (path, size, modification time), format, split, shards, model
    fingerprint, compression, a given codebook.

    The modification time makes an input edited in place (same size) a
    different spec, so a re-run does not call the old store complete.
    `compression` is only present for a compressed store, and `codebook` (the
    SHA-256 of its arrays) only for a codebook given with `--codebook`, so a
    given codebook is part of the spec and of the generation made from it. A
    sampled codebook needs no entry: it follows from the inputs and the model.
    """
    spec: dict[str, Any] = {"inputs": [_input_entry(task.path, task.format) for task in job.inputs],
        "split": job.strategy,
        "shards": job.num_shards,
        "fingerprint": job.fingerprint.to_dict(),
    }
    if job.compressor is not None:
        spec["compression"] = job.compressor
    if job.codebook is not None:
        spec["codebook"] = codebook_digest(read_codebook(job.codebook, job.encoding)[0])
    return spec


def _input_entry(path: str, format: str) -> dict[str, Any]:
    """One input as the spec records it: what the file is now, by size and modification time (ns)."""
    status = Path(path).stat()
    return {"path": path, "format": format, "bytes": status.st_size, "mtime_ns": status.st_mtime_ns}


def spec_differences(found: dict[str, Any], wanted: dict[str, Any]) -> list[str]:
    """The spec entries that differ, for an error message: a fingerprint's by field (`fingerprint.encoding`), and a
    setting with both values (`split: the store's 'words', this run's 'none'`); inputs, hashes and the codebook's
    digest by name alone."""
    differences = []
    for key in sorted(found.keys() | wanted.keys()):
        old, new = found.get(key), wanted.get(key)
        if isinstance(old, dict) and isinstance(new, dict):
            differences += [f"{key}.{name}{_both_values(name, old.get(name), new.get(name))}"
                            for name in sorted(old.keys() | new.keys()) if old.get(name) != new.get(name)]  # fmt: skip
        elif old != new:
            differences.append(f"{key}{_both_values(key, old, new)}")
    return differences


def retimed_inputs(found: dict[str, Any], wanted: dict[str, Any]) -> str:
    """For the inputs the spec `found` recorded with this run's path, format and size but another modification time
    (a copy without -p, a download, a checkout: maybe the same bytes), a sentence that names each, with both times in
    UTC, and the `touch` that gives it back the recorded time, so that the run resumes; "" when there is none.

    A store's spec records each input's size and modification time (`_input_entry`). An input copied or downloaded
    again, byte for byte, was "differs in: inputs", and the way out offered, --overwrite, started the whole build
    over, a stopped one's committed shards not used (time58 F3). Only where the modification times are all that
    differs (or all besides a compaction's): with other settings changed too, the touch was offered as the way on
    and the command refused again after it (read58 F2).
    """
    old, new = found.get("inputs"), wanted.get("inputs")
    if not (isinstance(old, list) and isinstance(new, list)) or len(old) != len(new):
        return ""
    timeless_found, timeless_wanted = timeless(found), timeless(wanted)
    if timeless_found != timeless_wanted and not compacted_from(timeless_found, timeless_wanted):
        return ""  # other settings differ too: the touch would not let the command go on (read58 F2)
    retimed = [(before, now) for before, now in zip(old, new, strict=True)
               if isinstance(before, dict) and isinstance(now, dict) and isinstance(before.get("mtime_ns"), int)
               and {**before, "mtime_ns": None} == {**now, "mtime_ns": None} and before != now]  # fmt: skip
    if not retimed:
        return ""
    named = "; ".join(f"{before['path']} ({_both_times(before['mtime_ns'], now['mtime_ns'])})"
                      for before, now in retimed)  # fmt: skip
    touches = " && ".join(f"touch -d {_utc(before['mtime_ns'], to_nanosecond=True)} {shlex.quote(str(before['path']))}"
                          for before, _ in retimed)  # fmt: skip
    return (f". Of the inputs, only the modification time differs, the size is the recorded one: {named}; if the "
            f"contents are the same (a copy, a download, a checkout), `{touches}` gives the recorded time back and "
            "this command goes on from what the earlier run did")


def timeless(spec: dict[str, Any]) -> dict[str, Any]:
    """`spec` without its inputs' modification times."""
    inputs = spec.get("inputs")
    if not isinstance(inputs, list):
        return spec
    return {**spec, "inputs": [{**entry, "mtime_ns": None} if isinstance(entry, dict) else entry for entry in inputs]}


def _both_times(recorded: int, now: int) -> str:
    """`recorded T1, now T2` in UTC, to the second, or to the nanosecond where the two share their second: a copy that
    kept the second but not its fraction (tar, zip, a file system of whole seconds) read "recorded 18:45:12Z, now
    18:45:12Z", two equal times for the one thing said to differ (read58 F5)."""
    precise = _utc(recorded) == _utc(now)
    return f"recorded {_utc(recorded, to_nanosecond=precise)}, now {_utc(now, to_nanosecond=precise)}"


def _utc(nanoseconds: int, *, to_nanosecond: bool = False) -> str:
    """A modification time in nanoseconds since the epoch as UTC ISO 8601, to the second (`2026-12-01T18:45:12Z`) or
    to the nanosecond (`2026-12-01T18:45:12.123456789Z`), which `touch -d` takes on Linux (GNU) and macOS (BSD)
    alike. The `@SECONDS.NANOS` offered before is GNU's alone, an illegal time to macOS's touch, and was a second
    off before 1970 (`@-2.5` for -1.5 s) (read58 F3)."""
    seconds, fraction = divmod(nanoseconds, 10**9)  # floored: -1.5 s is -2 s and 0.5 s, as the calendar counts it
    moment = datetime.datetime.fromtimestamp(seconds, datetime.UTC).isoformat(timespec="seconds")
    return f"{moment.removesuffix('+00:00')}{f'.{fraction:09d}' if to_nanosecond else ''}Z"


def _both_values(name: str, old: Any, new: Any) -> str:
    """`: the store's OLD, this run's NEW` for a setting a user chose; nothing for inputs, hashes and digests."""
    if name in ("inputs", "codebook") or name.endswith("_sha256") or isinstance(old, list) or isinstance(new, list):
        return ""
    return f": the store's {'none' if old is None else repr(old)}, this run's {'none' if new is None else repr(new)}"


def compacted_from(found: dict[str, Any] | None, spec: dict[str, Any]) -> bool:
    """Whether `found` is the spec `dilstore compact` wrote for a store first built with `spec`: the same but for
    its shard count and the `compacted` record (a re-run of the first build's command finds that store complete,
    as it did before the compaction, and is not told to --overwrite it, which would drop its appends)."""
    if not isinstance(found, dict) or "compacted" not in found:
        return False
    return {**found, "shards": None, "compacted": None} == {**spec, "shards": None, "compacted": None}


def prepare_store(store: Path, spec: dict[str, Any], overwrite: bool) -> bool:
    """Make `store` ready for this run's spec; True when it is already complete with that spec.

    An empty or absent folder is started; a folder holding an earlier run of
    the same spec is resumed (or, when finalized, left as it is); anything
    else is refused. With `overwrite` a store of other settings is not
    touched here: the caller builds the new one beside it (`replacement_dir`)
    and swaps it in when complete (`storage.replacement.swap_in`), so a
    failed run leaves the old store as it was. It runs once, before the
    pipeline starts, so no worker ever sees a half-prepared store.
    """
    if store.exists() and not store.is_dir():
        raise DilstoreError(f"--output {store} exists and is not a directory")
    if store.is_dir() and any(store.iterdir()):
        found = read_spec(store)
        if found == spec or compacted_from(found, spec):
            # --overwrite of a store that took appends since builds it again from these inputs alone (conc54 F2)
            return (store / MANIFEST_FILE).is_file() and not (overwrite and changed_since_built(store, found))
        if found is None and not (store / MANIFEST_FILE).is_file():
            raise DilstoreError(
                f"--output {store} is not empty and was not made by `dilstore precompute`; choose another folder"
                + ("" if overwrite else " (--overwrite replaces only dilstore stores)")
            )
        if not overwrite:
            differing = "; ".join(spec_differences(found or {}, spec))
            raise DilstoreError(
                f"--output {store} holds a run with other settings (differs in: {differing}); "
                f"choose another folder or pass --overwrite{retimed_inputs(found or {}, spec)}"
            )
        return False
    atomic_write_text(store / SPEC_FILE, spec_json(spec))
    return False


@dataclass
class BuildAttempt:
    """What a failed build's take-back must know: whether it launched a job that runs on without this process
    (`launched`: set by the launcher once a remote or external runner accepted the job)."""

    launched: bool = False


# How a failed or stopped build says that the shards it committed stay for the same command to go on from. One whose
# start was taken back (unmade_if_nothing_stored) committed none, and says so instead (dask50 F8, review50 L3).
SHARDS_KEPT = "(the shards it finished are kept)"


@contextlib.contextmanager
def unmade_if_nothing_stored(store: Path, replaces: Path | None = None) -> Iterator[BuildAttempt]:
    """Around a build: when one into an absent or empty folder fails before its pipeline wrote anything, and no job
    it launched can still be running, take back what its start wrote.

    `prepare_store` writes the spec first and a 2bit/1bit run its codebook
    (pipelines/codebook.py). A run whose job never started (a Dataflow
    project Beam refuses, a runner that cannot start) left that spec behind,
    and a corrected command with other settings was then refused as "a run
    with other settings" unless given --overwrite. Anything else in the
    folder (a shard, a part file) means the run started, and it stays for a
    re-run to resume. So does everything once the attempt is `launched`: a
    Dataflow job goes on when its launcher is interrupted, and its workers
    read the codebook and write beside the spec, which must still be there.
    A folder this run created is removed; one that was there, empty, stays.
    A take-back that fails leaves the folder as it is, and the build's own
    error is the one raised; one that succeeds words a stop, or an error
    that promised kept shards, as nothing kept (`nothing_kept`), and, for a
    replacement of the store `replaces`, says that store is as it was.
    """
    attempt = BuildAttempt()
    existed = store.is_dir()
    if existed and any(store.iterdir()):
        yield attempt  # a resumed run keeps what the earlier one stored
        return
    try:
        yield attempt
    except DilstoreError as error:
        if attempt.launched or not _taken_back(store, remove_folder=not existed):
            raise
        if not isinstance(error, StoppedBySignal) and SHARDS_KEPT not in str(error):
            raise  # its words promise nothing kept: the error as it is, of its own type
        raise nothing_kept(error, replaces) from None
    except BaseException:
        if not attempt.launched:
            _taken_back(store, remove_folder=not existed)
        raise


def nothing_kept(error: DilstoreError, replaces: Path | None = None) -> DilstoreError:
    """The error of a build whose start was taken back: it kept no shard, so its words say so, not that the same
    command goes on from the shards it finished (dask50 F8, review50 L3); a replacement's, that the store it was to
    replace is as it was (review50 L2: "nothing was kept" read as the store gone)."""
    unchanged = f"; {replaces} is as it was" if replaces is not None else ""
    if isinstance(error, StoppedBySignal):
        number = error.signal_number
        words = "interrupted" if number == signal.SIGINT else f"stopped by {signal.Signals(number).name}"
        return StoppedBySignal(f"{words} before any shard was stored; nothing was kept{unchanged}", number)
    return DilstoreError(str(error).replace(SHARDS_KEPT, "(none was stored: it starts anew)") + unchanged)


def _taken_back(store: Path, *, remove_folder: bool) -> bool:
    """Remove the spec and codebook a start wrote into `store`, when they are all it holds (and the folder too);
    whether it did. A worker writing meanwhile, or no folder at all, leaves it as it is."""
    try:
        written = list(store.iterdir())
        if not all(path.name in (SPEC_FILE, CODEBOOK_DIR) for path in written):
            return False
        for path in written:
            shutil.rmtree(path) if path.is_dir() else path.unlink()
        if remove_folder:
            store.rmdir()
    except OSError:
        return False
    return True


def needs_replacement(store: Path, spec: dict[str, Any]) -> bool:
    """True when `store` holds a dilstore store of another spec, or a finalized one of this spec that appends or a
    compaction changed since it was built (`changed_since_built`): what --overwrite replaces."""
    if not (store.is_dir() and any(store.iterdir())):
        return False
    found = read_spec(store)
    return found != spec or ((store / MANIFEST_FILE).is_file() and changed_since_built(store, found))


def changed_since_built(store: Path, found: dict[str, Any] | None) -> bool:
    """Whether the finalized `store`, whose spec is `found`, is no longer what its build made: its manifest lists
    appends, or `dilstore compact` rewrote it (its spec records that). `--overwrite` of such a store with its first
    build's inputs said "already complete with these settings" and kept every appended passage, where README offers
    it as the way to build a store again without them (conc54 F2)."""
    if isinstance(found, dict) and "compacted" in found:
        return True
    try:
        return bool(read_manifest(StoreLocation.parse(store)).appends)
    except DilstoreError:  # a manifest that does not read is no proof of appends: the store is taken as before
        return False


def check_replaceable(store: Path, inputs: list[str]) -> None:
    """--overwrite never replaces the current folder, a parent of it, a folder that holds an input, or one this user
    could not delete."""
    target = store.resolve()
    here = Path.cwd().resolve()
    if target == here or target in here.parents:
        raise DilstoreError(f"--output {store} is the current folder or one of its parents; it is never replaced")
    for given in inputs:
        source = Path(given).resolve()
        if target in source.parents:
            raise DilstoreError(f"--output {store} holds the input {given}; it is never replaced")
    # Before the build, not after it (perm57 F4).
    refuse_undeletable(store, "--overwrite deletes the store it replaces; another --output builds the new one there")


def discard_other_replacement(store: Path, spec: dict[str, Any]) -> Path:
    """The folder beside `store` that its replacement is built in, emptied of a replacement of other settings (this
    project's own leftover); one of this spec is kept, for the run to resume."""
    building = building_dir(store)
    if building.is_dir() and read_spec(building) != spec:
        remove_tree(building, "the replacement of other settings a stopped run was building")
    return building


def replacement_dir(store: Path, spec: dict[str, Any]) -> Path:
    """The folder beside `store` that its replacement is built in, ready for this spec.

    An earlier replacement of the same spec (a run killed after --overwrite)
    is resumed; one of other settings is this project's own leftover and is
    removed.
    """
    building = discard_other_replacement(store, spec)
    building.mkdir(parents=True, exist_ok=True)
    if read_spec(building) is None:
        atomic_write_text(building / SPEC_FILE, spec_json(spec))
    return building
