"""What a command says when it ran out of memory: the address-space limit where one is set (`ulimit -v`), and the
options that bound what the command holds at once.

torch's CPU allocator reports a failed allocation as a RuntimeError ("[enforce fail at alloc_cpu.cpp:127] ...
DefaultCPUAllocator: can't allocate memory"), not a MemoryError, so `evaluate-qa` under `ulimit -v 3000000` ended in
a 60-line traceback naming neither (limits59 F9).
"""

from __future__ import annotations

import argparse
import errno
import os

from dilstore.storage.read_failures import address_space_words

# How torch words a failed allocation (CPU allocator; CUDA's OutOfMemoryError is a RuntimeError too), and a map of a
# file it was refused for want of room (a checkpoint's weights: "unable to mmap N bytes from file <…>: Cannot
# allocate memory (12)", which named no limit: left60 F8).
_TORCH_OUT_OF_MEMORY = ("can't allocate memory", "CUDA out of memory", f"{os.strerror(errno.ENOMEM)} ({errno.ENOMEM})")
# How the dynamic loader words a shared library it could not map (ENOMEM), as an ImportError's message.
_LIBRARY_NOT_MAPPED = ": failed to map segment from shared object"
# How an error that already says what to do about memory words it (`out_of_memory_line`, precompute's
# `memory_advice`).
_RAN_OUT = "ran out of memory"


def is_out_of_memory(error: BaseException) -> bool:
    """Whether `error` is an allocation that failed: Python's MemoryError or torch's allocator's RuntimeError."""
    if isinstance(error, MemoryError):
        return True
    return isinstance(error, RuntimeError) and any(words in str(error) for words in _TORCH_OUT_OF_MEMORY)


def wraps_out_of_memory(error: BaseException) -> bool:
    """Whether `error` (a DilstoreError) only wraps torch's failed allocation, so `model_load_line` says more than
    it: a model loader's "cannot load a model from DIR: [enforce fail ...]" (journey59 F2); the loaders and the
    rankers' weight checks are the DilstoreErrors that wrap torch's RuntimeError. Not where its own words already say
    the run ran out of memory: precompute's pipeline failure names --workers too and that the same command goes on
    from the finished shards, which the command's line took the place of (read59b F2)."""
    cause = error.__cause__
    return isinstance(cause, RuntimeError) and is_out_of_memory(cause) and _RAN_OUT not in str(error)


def out_of_memory_line(args: argparse.Namespace) -> str:
    """The error line of a command `args` that ran out of memory: the limit, and its batch options to lower."""
    options = [f"--{name.replace('_', '-')}" for name in sorted(vars(args)) if "batch" in name]
    lower = f"lower {', '.join(options[:-1])} or {options[-1]}" if len(options) > 1 else f"lower {''.join(options)}"
    advice = f"{lower} (what it reads at once), or give it more memory" if options else "give it more memory"
    return f"ran out of memory{address_space_words()}: {advice}"


def model_load_line() -> str:
    """The error line of a command whose model's load ran out of memory (`wraps_out_of_memory`). It was
    `out_of_memory_line`'s, which told `precompute`, `ask` and the others to lower their batch options: those bound
    what a command holds once its model is loaded, and no option shrinks a model (read59b, left60 F3)."""
    return f"ran out of memory{address_space_words()} while loading a model: give it more memory"


def library_not_mapped_line(error: ImportError) -> str | None:
    """The error line of a command whose import of a compiled library could not map it (no address space left), or
    None for any other ImportError. Under `ulimit -v 1800000` `precompute` ended in a traceback of "ImportError:
    libtorch_cpu.so: failed to map segment from shared object", exit 1 (journey59 F3)."""
    text = str(error)
    if not text.endswith(_LIBRARY_NOT_MAPPED):
        return None
    library = text.removesuffix(_LIBRARY_NOT_MAPPED)
    return f"ran out of memory{address_space_words()} while loading the library {library}: give it more memory"
