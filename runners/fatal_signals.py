"""Fatal signals in a `dilstore` process: Python's faulthandler takes them, before the JVM starts."""

from __future__ import annotations

import contextlib
import faulthandler
import sys


def dump_fatal_signals() -> None:
    """Have Python's faulthandler take the fatal signals (SIGBUS, SIGSEGV, ...) of this `dilstore` process from its
    start, unless it is on already, so that a JVM started later hands it those that are not Java's own (HotSpot
    chains to a handler it finds in place).

    The JVM took every such signal as its own crash: a read of a store file cut short under its memory map (the
    SIGBUS README warns of) in `ask`, `serve` or `evaluate-qa` printed "A fatal error has been detected by the Java
    Runtime Environment" on stdout, left a 130 KB hs_err_pidPID.log in the current folder, one a crash, and ended
    with SIGABRT (134) (leak60 F4). Now the process dies of the signal, as it does without the JVM (SIGBUS: 135),
    after faulthandler's "Fatal Python error: Bus error" and the Python stack on stderr, which name the read.

    The command does it, not `start_jvm`: a library must not turn on process-wide state its caller may turn off, and
    a `faulthandler.disable()` once the JVM runs puts the default handlers back over the JVM's, whose own routine
    SIGSEGVs then end the process (read60). Nor where a JVM runs already (jnius imported: a program that searched,
    then runs the command's entry point): faulthandler would take the JVM's own SIGSEGVs, and an index build in that
    process died of one with faulthandler's dump (the suite's `commands_in_one_process`).
    """
    stderr = sys.__stderr__
    if faulthandler.is_enabled() or stderr is None or "jnius" in sys.modules:
        return
    with contextlib.suppress(OSError, ValueError):  # a stderr with no file descriptor: the JVM's way, as before
        faulthandler.enable(file=stderr)
