"""Python's cyclic garbage collector held off while a command loads what it keeps to its end.

Loading torch, transformers, a model, a store and the JVM makes about a
million objects that live as long as the process. Python runs a full
collection each time the surviving objects grow by a quarter, and each walks
all of them: six full collections took 0.75-0.97 s of a one-question `ask` of
6.4 s, and 1.1 s of `serve`'s start (perf49 F1). Once loaded, those objects
are frozen: later collections scan only what each question allocates.

What loading leaves in reference cycles is frozen with them, not collected:
one collection over everything took 0.35 s of the one-question `ask`, to free
about 12,000 objects of some 8 MB (tuples, closures and typing aliases of the
imports; no tensor), with no fall in the process's resident memory (measured
2026-11-30 on the shipped reader and the default store).
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def loading_for_good() -> Iterator[None]:
    """No cyclic collection in the block; then, when it finished, every object there is frozen (a load that failed
    or was stopped keeps nothing for good: its leftovers are collected as the command ends, review49 F5). A block
    inside another (or with the collector off) leaves the collector as it was."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    except BaseException:
        gc.enable()
        raise
    gc.freeze()
    gc.enable()


def thaw() -> None:
    """Give what `loading_for_good` froze back to the collector, once a command is done: a program (or a test
    session) that runs commands in one process would otherwise never collect their objects' cycles. A process
    that ends with its command does not: the interpreter's collection at exit would scan them all."""
    gc.unfreeze()
