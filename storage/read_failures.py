"""What a failed read of a store's file is, and whether it is tried again: the messages every read path gives.

A remote read that fails in transit (HTTP 500, a body cut short, a timeout) is
a StoreReadError, which may not recur and is tried again; a file cut short, or
a local file that cannot be read for good (no permission, a directory in its
place), is damage, a StoreFormatError. No zarr here: reading a manifest (`dilstore
info`) needs these messages, and importing zarr cost it a third of its time
(perf49 F4); storage/zarr_reads.py applies them to zarr-python's reads.
"""

from __future__ import annotations

import errno
import math
import os
import resource
import ssl
from pathlib import Path

from dilstore.storage.format import StoreFormatError, StoreReadError, is_special_file

# Local failures no retry mends: a directory or a loop of links in a file's place, a file without permission.
# Others (too many open files, no memory for a map, an I/O error on a network file system) may pass.
LASTING_ERRNOS = frozenset({errno.EISDIR, errno.ENOTDIR, errno.ELOOP, errno.EACCES, errno.EPERM, errno.ENAMETOOLONG})
_RANGE_NOT_SATISFIABLE = 416
MESSAGE_WIDTH = 300  # characters of an error's text a message shows
READ_TIMEOUT_ENV = "DILSTORE_READ_TIMEOUT"  # seconds a store over HTTP may take to connect and to send each read
_REFUSED = (401, 403)  # no credentials, or not allowed: no retry mends it
# A remote read that failed in transit (a 503 "slow down", a reset, a timeout) is tried again this many times in
# all, RETRY_SECONDS, then twice that, apart (or after a server's Retry-After, up to MAX_RETRY_SECONDS): one hiccup
# of a web server ended a rerank run of hours, its work lost. The waits stay short: a `serve` store's one worker
# waits them, and the requests queued behind it with it.
READ_ATTEMPTS = 3
RETRY_SECONDS = 0.5
MAX_RETRY_SECONDS = 2.0


def refuse_special_file(path: str | Path, shown: str) -> None:
    """A StoreFormatError naming `shown` when the local `path` is a pipe, socket or device, not a file: opening one
    for reading waits for a writer for good (hostile46 F3, review46b 2: a compressed store, the ranged and zarr
    read paths). A path that is missing or cannot be read is left to the read, which says so."""
    try:
        special = is_special_file(Path(path))
    except OSError:
        return
    if special:
        raise StoreFormatError(f"{shown} is not a regular file (a pipe, socket or device stands for it)")


def worth_retrying(
    failure: StoreFormatError | StoreReadError, error: BaseException, *, local: bool, attempt: int
) -> bool:
    """Whether a failed read (`error`, reported as `failure`) is tried again after attempt number `attempt` (from
    0): a remote read that failed in transit, READ_ATTEMPTS times in all."""
    transient = isinstance(failure, StoreReadError) and is_transient(error)
    return not local and transient and attempt + 1 < READ_ATTEMPTS


def retry_delay(error: BaseException, attempt: int) -> float:
    """Seconds to wait before trying a failed remote read again: the server's Retry-After where it gave one, else
    RETRY_SECONDS doubled per attempt; never over MAX_RETRY_SECONDS. A `nan` is no wait: it passed both bounds,
    and time.sleep raised ValueError (a traceback, a 500 from `serve`) where asyncio.sleep waited on (remote52 F2)."""
    headers = getattr(error, "headers", None) or {}
    try:
        asked = float(headers.get("Retry-After", 0))
    except (TypeError, ValueError):  # an HTTP date: the doubling wait stands
        asked = 0.0
    if math.isnan(asked):
        asked = 0.0
    return min(max(asked, RETRY_SECONDS * 2**attempt), MAX_RETRY_SECONDS)


def read_failure(what: str, error: BaseException, *, local: bool = False) -> StoreFormatError | StoreReadError:
    """The error for a failed read of `what`: the file cut short (HTTP 416, a range past its end) is damage, a
    StoreFormatError; so is a `local` file that cannot be read for good (no permission, a directory or a loop of
    links in its place, a null byte in its name), which trying again would not mend; anything else failed in
    transit or for a while (too many open files), a StoreReadError, which may not recur. A file refused for want of
    permission is named in the error's `unreadable`, which `serve` looks at again (perm57 F1)."""
    shortage = process_shortage(error)
    if shortage is not None and getattr(error, "errno", None) not in (errno.EMFILE, errno.ENFILE):
        # Memory under an address-space limit, or for a map: the process's, which may pass; it was damage (a
        # StoreFormatError: `serve` took a sound store out of service) or "try again" (limits59 F7).
        return StoreReadError(f"reading {what} failed: {shortage}")
    if isinstance(error, MemoryError):  # a file far larger than any of a store's: trying again would fail again
        return StoreFormatError(f"reading {what} needed more memory than this process has: no file of a store is "
                                "that large; run `dilstore verify`")  # fmt: skip
    if local and (isinstance(error, ValueError) or getattr(error, "errno", None) in LASTING_ERRNOS):
        lasting = StoreFormatError(
            f"cannot read {what}: {describe(error)}; every file of a store must be a readable file "
            "(`dilstore verify` checks them)"
        )
        denied = getattr(error, "errno", None) in (errno.EACCES, errno.EPERM) and getattr(error, "filename", None)
        lasting.unreadable = os.fsdecode(error.filename) if denied else None  # type: ignore[attr-defined]
        return lasting
    if getattr(error, "status", None) == _RANGE_NOT_SATISFIABLE:
        return StoreFormatError(
            f"reading {what} failed: {describe(error)}: the file is shorter than its metadata says; "
            "run `dilstore verify`"
        )
    if getattr(error, "status", None) in _REFUSED:
        return StoreReadError(f"reading {what} failed: {describe(error)}: the server refuses it; check the "
                              "credentials (in the URL or the environment) and the store's permissions")  # fmt: skip
    if getattr(error, "errno", None) in (errno.EMFILE, errno.ENFILE):
        return StoreReadError(f"reading {what} failed: {describe(error)}: each memory-mapped file of an open store "
                              "holds a file open; raise the open-file limit (ulimit -n)")  # fmt: skip
    if _untrusted_certificate(error):
        return StoreReadError(f"reading {what} failed: {describe(error)}: the server's certificate is not trusted "
                              "(SSL_CERT_FILE names a certificate bundle to trust)")  # fmt: skip
    failure = StoreReadError(f"reading {what} failed: {describe(error)}; try again")
    failure.in_transit = not local and is_transient(error)  # tried READ_ATTEMPTS times (worth_retrying)
    return failure


def process_shortage(error: BaseException) -> str | None:
    """What this process ran short of, where `error` or an error it was raised from says so, as words to end a
    sentence; None where it does not. Open files, threads and (ENOMEM) kernel memory for a map are the process's
    or the machine's limits, never a file's fault; a MemoryError is one only under an address-space limit (ulimit
    -v), as without one it is what a forged size asking for terabytes gives, which is damage. `verify` called a sound
    store FAILED, every file "cannot be read: MemoryError", under `ulimit -v 600000` (limits59 F5)."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        code = getattr(current, "errno", None)
        if code in (errno.EMFILE, errno.ENFILE):
            soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
            return f"this process holds as many open files as it may ({_limit(soft)}; ulimit -n)"
        under = address_space_words()
        if thread_refused(current):
            stack = f"no room for its stack{under}, or " if under else ""
            return f"no thread could be started ({stack}the limit on processes and threads: ulimit -u)"
        if code == errno.ENOMEM or (isinstance(current, MemoryError) and under):
            return f"this process ran out of memory{under}"
        current = current.__cause__ or current.__context__
    return None


def raise_if_shortage(error: BaseException) -> None:
    """Raise `error` again where it is this process's shortage (`process_shortage`): a check that makes a problem line
    of any failed read, or a listing that passes over a folder it cannot open, would call a sound store damaged
    (verify's FAILED with every file "cannot be read", limits59 F5; a codebook's attributes, read59b F3; files
    "missing", read59b F4)."""
    if process_shortage(error) is not None:
        raise error


def thread_refused(error: BaseException) -> bool:
    """Whether `error` is Python's refusal to start a thread, which the system denied (RLIMIT_NPROC, a pids cgroup,
    no room for its stack): a shortage of the whole process that may pass."""
    return isinstance(error, RuntimeError) and str(error) == "can't start new thread"


def address_space_words() -> str:
    """The words ` under its address-space limit (ulimit -v) of N MiB` where the process has one, else nothing."""
    limit = resource.getrlimit(resource.RLIMIT_AS)[0]
    limited = limit != resource.RLIM_INFINITY
    return f" under its address-space limit (ulimit -v) of {limit >> 20:,} MiB" if limited else ""


def _limit(value: int) -> str:
    """A resource limit in words: its number, or "unlimited"."""
    return "unlimited" if value == resource.RLIM_INFINITY else f"{value:,}"


def _first_line(text: str) -> str:
    """The first non-blank line of an error's text, cut to MESSAGE_WIDTH characters: a server's bad answer put raw
    response bytes, a kilobyte over several lines, into the message."""
    line = next((line.strip() for line in text.splitlines() if line.strip()), "")
    return line if len(line) <= MESSAGE_WIDTH else line[: MESSAGE_WIDTH - 1] + "…"


def is_transient(error: BaseException) -> bool:
    """Whether a failed remote read may work if tried again: not a refusal (401, 403), a missing or short file
    (404, 416) or a certificate this machine does not trust."""
    status = getattr(error, "status", None)
    return status not in (*_REFUSED, 404, _RANGE_NOT_SATISFIABLE) and not _untrusted_certificate(error)


def _untrusted_certificate(error: BaseException) -> bool:
    """Whether `error` is (or was caused by) a failed check of the server's TLS certificate."""
    return isinstance(error, ssl.SSLCertVerificationError) or isinstance(
        getattr(error, "certificate_error", None), ssl.SSLCertVerificationError)  # fmt: skip


def describe(error: BaseException) -> str:
    """`Type: message`, or what a message-less error means (an fsspec timeout has an empty message); a timeout
    says how to change the wait."""
    name, text = type(error).__name__, _first_line(str(error))
    if "timeout" in name.lower():
        return f"{name}: {text or 'the server did not answer in time'} ({READ_TIMEOUT_ENV} sets the wait)"
    return f"{name}: {text}" if text else name
