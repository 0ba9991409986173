"""torch's intra-op threads, started while the process still has room for their stacks."""

from __future__ import annotations

import torch

# Elements of the one parallel operation that starts the threads: past torch's grain size (32,768), below which an
# operation runs on the calling thread alone.
_PARALLEL_ELEMENTS = 1 << 16


def start_thread_pool() -> None:
    """Start torch's intra-op (OpenMP) threads now, for the calling thread, at torch's current thread count.

    libgomp starts them at the first parallel operation, which is often inside a model's load. Under an
    address-space limit (ulimit -v) that leaves the load too little room for a thread's stack, libgomp ended the
    process itself ("libgomp: Thread creation failed", exit 1, after a line blaming the checkpoint: "unknown
    parameter type"), and glibc sometimes did ("cannot allocate memory for thread-local data: ABORT", exit 127),
    where the load's own failed allocation is one line naming the limit (left60 F7). Once started, the threads
    serve every later parallel operation of the calling thread at that count.
    """
    torch.ones(_PARALLEL_ELEMENTS).mul_(2)  # (n,) a throwaway product, on every thread
