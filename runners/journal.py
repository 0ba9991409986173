"""Parts of a long run kept beside its output as each is done, so that a stopped run goes on from them.

`evaluate-qa` over a full question set takes hours on a CPU, as does `rerank` over MS MARCO's dev queries
(`evaluate-rc` over SQuAD dev, minutes), and a Ctrl-C at 90% kept nothing (longrun45 F1). With an output file,
the command now works through its questions or queries in parts and appends each finished part's result to
`.NAME.dilstore-partial` beside the output (one JSON line, flushed). The first line records the run's settings;
the same command run again finds them equal and takes the parts already done. A run of other settings starts
the journal anew once its first part is done: one stopped before then (a mistyped option) leaves the earlier
run's parts as they were (they went at once, review45b M1). The journal is removed once the output is written.

A journal is used in a `with` block, which holds the output's write lock (storage/write_lock.py): a second run
writing the same output is refused, where two runs wrote their parts into one journal and a later run took the
other's parts for its own (review45 H1). A line cut short by a kill ends what is read; the journal is then
written again without it.
"""

from __future__ import annotations

import contextlib
import errno
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, TextIO

from dilstore.runners.stop_signals import interrupt_number, interrupt_words
from dilstore.storage.atomic_files import atomic_write_text
from dilstore.storage.errors import DilstoreError, StoppedBySignal
from dilstore.storage.format import StoreChangedError, StoreReadError
from dilstore.storage.write_lock import write_lock

if TYPE_CHECKING:
    from dilstore.storage.manifest import Manifest

JOURNAL_FORMAT = "dilstore-partial/1"


def store_build(manifest: Manifest) -> dict[str, Any]:
    """What a journal records of the store a run reads: its build and its appends' (a part read from another
    state of the store is not this run's)."""
    return {"generation": manifest.generation, "appends": [record.get("generation") for record in manifest.appends]}


def compacted_builds(store: str | Path, manifest: Manifest) -> list[dict[str, Any]]:
    """The build the store at `store` (its manifest now: `manifest`) was compacted from, as `store_build` gives it,
    when its spec records one and no append came since: `dilstore compact` copies the states, so the compacted
    store serves what that build did, and a journal kept while reading it is this run's too. A compaction under a
    run ended it ("open it again"), and the same command then started every question or query anew (conc54 F4)."""
    from dilstore.storage.location import StoreLocation
    from dilstore.storage.manifest import compacted_record

    location = StoreLocation.parse(str(store))
    if location.local_root is None or manifest.appends:
        return []
    record = compacted_record(location)
    if record is None or record.get("generation") in (None, manifest.generation):
        return []
    return [{"generation": record.get("generation"), "appends": record.get("appends")}]


def compacted_settings(settings: dict[str, Any], store: str | Path, manifest: Manifest) -> list[dict[str, Any]]:
    """A journal's `settings` as a run over the build the store at `store` was compacted from recorded them (that
    build in place of this one's, `compacted_builds`): the `also` a Journal accepts, so a run a compaction ended
    goes on from its parts over the compacted store. One definition for evaluate-qa and rerank (dup55 D2)."""
    return [{**settings, **build} for build in compacted_builds(store, manifest)]


def compacted_under(store: str | Path, read: Manifest) -> bool:
    """Whether the store at `store` is now a compaction of the build `read` (the manifest a run opened), which
    serves what that build did (`compacted_builds`); False when its manifest cannot be read now."""
    from dilstore.storage.location import StoreLocation
    from dilstore.storage.manifest import read_manifest

    try:
        now = read_manifest(StoreLocation.parse(str(store)))
    except DilstoreError:
        return False
    return store_build(read) in compacted_builds(store, now)


def journal_path(output: Path) -> Path:
    """Where the journal of a command writing `output` lives: a hidden file beside it."""
    return output.parent / f".{output.name}.dilstore-partial"


def stopped_keeping(interrupt: KeyboardInterrupt, journal: Journal | None, kept: str | None) -> StoppedBySignal:
    """The stop of a run that keeps its parts: the signal's words and, when `kept` names what the journal holds
    ("the answers of 120 questions"), where it is and that the same command goes on from it (a stop at 90% kept
    nothing and said nothing of it, longrun45 F1)."""
    words, number = interrupt_words(interrupt), interrupt_number(interrupt)
    if journal is None or kept is None:
        return StoppedBySignal(words, number)
    return StoppedBySignal(f"{words}; {kept} are kept in {journal.path}: run the same command again to go on from "
                           "them", number)  # fmt: skip


def failed_keeping(error: StoreReadError | StoreChangedError, journal: Journal | None, kept: str | None,
                   store: str | Path, opened: Manifest) -> DilstoreError:  # fmt: skip
    """The error a run that keeps its parts ends in when a read of its store fails in transit (a server that went
    away), or finds the store changed: the error's words and, when `kept` names what the journal holds, where it is
    and that the same command goes on from it, as a stop by a signal says (`stopped_keeping`). A change counts only
    when the store at `store` is now a compaction of the build `opened` (`compacted_under`), which serves the same
    passages; any other is the error as it was. It said only "try again" (multi53 F6), or "open it again" (conc54
    F4), not that the parts done were kept."""
    if journal is None or kept is None:
        return error
    why = ""
    if isinstance(error, StoreChangedError):
        if not compacted_under(store, opened):
            return error
        why = "the store was compacted, which serves the same passages: "
    return type(error)(f"{error}; {why}{kept} are kept in {journal.path}: run the same command again to go on from "
                       "them")  # fmt: skip


class Journal:
    """The finished parts of one run (`parts`: part number -> its record, read as the block starts), and where the
    next ones are added."""

    def __init__(self, output: Path, settings: dict[str, Any], check: Callable[[Any], object] | None = None,
                 also: Sequence[dict[str, Any]] = ()) -> None:  # fmt: skip
        """`check(record)` raises KeyError, TypeError or ValueError for a record the caller cannot use (a file
        edited by hand, or another version's under the same format tag): reading stops there, as at a line a kill
        cut short, where a KeyError traceback ended the resumed run (qa48 L1). `also`: earlier settings whose parts
        are this run's too (those of the build a store was compacted from); a journal of them is taken, and written
        again under `settings`."""
        self.output, self.path = output, journal_path(output)
        self._check = check
        self._header = {"journal": JOURNAL_FORMAT, "settings": settings}
        self._accepted = [self._header, *({"journal": JOURNAL_FORMAT, "settings": earlier} for earlier in also)]
        self.parts: dict[int, Any] = {}
        self._resumed = False  # whether the file holds this run's header (and the parts read back)
        self._stream: TextIO | None = None
        self._held = contextlib.ExitStack()

    def __enter__(self) -> Journal:
        self._held.enter_context(write_lock(self.output, doing="written"))
        try:
            found = self._read()
            if found is not None:  # written again without a line a kill cut short
                self.parts, self._resumed = found, True
                try:
                    self._write(self.parts)
                except OSError as error:
                    raise self._not_rewritten(error) from None
        except BaseException:
            self._held.close()
            raise
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
                 ) -> None:  # fmt: skip
        try:
            self.close()
        finally:
            self._held.close()

    def _read(self) -> dict[int, Any] | None:
        """The parts a run of these settings kept here before, in order; None when there is no journal, it is
        unreadable, or it was written with other settings. A line nested too deep for Python's parser (RecursionError)
        is unreadable too: the resumed run ended with that traceback (fuzz60 F5)."""
        try:
            lines = self.path.read_text(encoding="utf-8").splitlines()
            if not lines or json.loads(lines[0]) not in self._accepted:
                return None
        except (OSError, UnicodeError, ValueError, RecursionError):
            return None
        parts: dict[int, Any] = {}
        for line in lines[1:]:
            try:
                entry = json.loads(line)
                part, record = entry["part"], entry["record"]
                if self._check is not None:
                    self._check(record)
            except (ValueError, TypeError, KeyError, AttributeError, RecursionError):  # cut short by a kill, or a
                # record of another shape (a list where a mapping was kept: review48b B4): what follows is not trusted
                break
            if part != len(parts):
                break
            parts[part] = record
        return parts

    def _write(self, parts: dict[int, Any]) -> None:
        """The journal file as this run's header and `parts`, in place of what was there."""
        lines = [self._header, *({"part": part, "record": record} for part, record in parts.items())]
        atomic_write_text(self.path, "".join(_line(line) for line in lines), named_by_user=True)

    def add(self, part: int, record: Any) -> None:
        """Keep `record` as part `part`'s result (the next part in order).

        A write that fails (a full disk) is a DilstoreError naming the journal and what it keeps (`_not_kept`): it
        was "No space left on device" alone, naming no file and not saying that the parts done were kept (disk56
        F1). What was written of the line is cut short, which the next run's read ends at."""
        line = _line({"part": part, "record": record})
        try:
            if self._stream is None:
                if not self._resumed:  # the first part of a new run: an earlier run's journal goes now, not before
                    self._write({})
                    self._resumed = True
                self._stream = self.path.open("a", encoding="utf-8")
            self._stream.write(line)
            self._stream.flush()
        except OSError as error:
            raise self._not_kept(part, error) from None
        self.parts[part] = record

    def _not_kept(self, part: int, error: OSError) -> DilstoreError:
        """The error of a part that could not be added: the stream is dropped first, as its close would write what
        it holds of the line again and fail the same way, and the journal's own parts say what the same command
        goes on from."""
        if self._stream is not None:
            with contextlib.suppress(OSError):
                self._stream.close()
            self._stream = None
        kept = len(self.parts)
        what = (f"the {kept} part{'s' if kept != 1 else ''} done before it {'are' if kept != 1 else 'is'} kept there"
                if kept else "nothing was kept yet")
        on = f" to go on from {'them' if kept != 1 else 'it'}" if kept else ""
        return DilstoreError(f"cannot keep part {part + 1} of the run in {self.path}: {error.strerror or error}; "
                             f"{what}: {_advice(error)}, then run the same command again{on}")  # fmt: skip

    def _not_rewritten(self, error: OSError) -> DilstoreError:
        """The error of a journal that could not be written again as a resumed run starts (without a line a stop cut
        short): it was the bare `No space left on device: DIR/.X.dilstore-partial`, not saying that the journal,
        written atomically, is as it was, nor what to do (disk56 L, left56b F4)."""
        kept = len(self.parts)
        what = f"the {kept} part{'s' if kept != 1 else ''} kept there {'are' if kept != 1 else 'is'}"
        return DilstoreError(f"cannot write the journal {self.path} again to go on from it: {error.strerror or error}; "
                             f"{what} as {'they' if kept != 1 else 'it'} were: {_advice(error)}, then run the same "
                             "command again to go on from them")  # fmt: skip

    def output_not_written(self, error: Exception, kept: str) -> Exception:
        """The error of a run whose output file could not be written (a full disk, its folder gone) once every part
        was done: the error's words, that `kept` (say "the answers of all 7 questions") stay in the journal, and that
        the same command run again writes the file from them at once. It named the file alone, as if the run's work
        were lost (disk56 L, left56b F3). Any other error (not a write's: a score that is not finite) is `error`."""
        if not isinstance(error, OSError) and not isinstance(error.__context__, OSError):
            return error
        words = f"cannot write {self.output}: {error.strerror or error}" if isinstance(error, OSError) else str(error)
        return DilstoreError(f"{words}; {kept} are kept in {self.path}: run the same command again once {self.output} "
                             "can be written, and it writes the file from them at once")  # fmt: skip

    def close(self) -> None:
        """Stop adding; what was added stays. A journal of this run's that holds no part goes; an earlier run's of
        other settings stays, as this run added nothing in its place."""
        if self._stream is not None:
            self._stream.close()
            self._stream = None
        if self._resumed and not self.parts:
            self.path.unlink(missing_ok=True)

    def remove(self) -> None:
        """Delete the journal: the output it served is written."""
        self.close()
        self.path.unlink(missing_ok=True)


def _advice(error: OSError) -> str:
    """What to do about a journal write that failed with `error`, in words: a full disk or quota, a file size limit
    (EFBIG said "check its disk", where precompute says to raise the limit: disk56 L, left56b F4), or anything
    else."""
    if error.errno in (errno.ENOSPC, errno.EDQUOT):
        return "free space on its disk"
    if error.errno == errno.EFBIG:
        return ("the file grew past the size this process may write (`ulimit -f`) or its filesystem holds: raise the "
                "limit")
    return "check its disk"


def _line(value: Any) -> str:
    """One journal line: JSON with every character past ASCII escaped. A path or file name that is not UTF-8 (bytes
    Python decoded to lone surrogates) in the settings could not be written as UTF-8: the journal's first part
    ended the run with "text that is not valid UTF-8" (unicode56 F6); escaped, it reads back as it was."""
    return json.dumps(value) + "\n"
