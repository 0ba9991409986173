"""argparse types shared by the commands (a bad value is a usage error naming the option, never a traceback later),
and the way back from parsed options to command-line words."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

# The largest seed numpy's legacy and Generator seeding accept.
MAX_SEED = 2**32 - 1
# The most torch threads a command may ask for per CPU this process may use (as pipelines.options.WORKERS_PER_CPU
# bounds --workers: more only wait for a core).
THREADS_PER_CPU = 4
# The most threads torch.set_num_threads takes (a C int).
MAX_TORCH_THREADS = 2**31 - 1


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1."""
    return _integer_in(text, 1, None, "a positive integer")


def non_negative_int(text: str) -> int:
    """argparse type: an integer >= 0 (where 0 means none, or all)."""
    return _integer_in(text, 0, None, "an integer of at least 0")


def integer_at_least(low: int) -> Callable[[str], int]:
    """argparse type: an integer >= `low`."""

    def parse(text: str) -> int:
        return _integer_in(text, low, None, f"an integer of at least {low}")

    return parse


def thread_count(text: str) -> int:
    """argparse type: torch's CPU threads, or BM25's Java threads (`index`, `train ranking-data`), a positive integer
    of at most THREADS_PER_CPU per CPU this process may use.

    torch takes no count of 2**31 or more: `evaluate-rc --threads 99999999999999999999` (ask, rerank, serve, train
    too) ended in a ValueError traceback from torch.set_num_threads, and `precompute --threads` in "the pipeline
    failed: ValueError: Overflow when unpacking long long" after its model load, naming no option (complex61 F9); a
    count short of that started as many OpenMP threads, which only wait for a core. The bound is --workers' own.
    `index --threads 100000` failed as "java.lang.IllegalArgumentException: None", naming no option (complex61 F10).
    """
    value = positive_int(text)
    beyond = threads_beyond_cpus(value)
    if beyond is not None:
        raise argparse.ArgumentTypeError(beyond)
    return value


def worker_thread_count(text: str) -> int:
    """argparse type: `precompute --threads`, torch's threads in each worker, a positive integer torch takes (below
    2**31). Its workers may run on other machines (Dataflow, Flink, a Dask cluster), whose CPUs this process cannot
    count: precompute bounds the count per CPU (`threads_beyond_cpus`) only for workers that run here. Bounded here
    by this machine's CPUs, `precompute --runner dataflow --threads 16` was refused on a 2-CPU launcher (read61 F1).
    """
    return _integer_in(text, 1, MAX_TORCH_THREADS, f"a positive integer of at most {MAX_TORCH_THREADS} (torch's most)")


def threads_beyond_cpus(value: int) -> str | None:
    """Why `value` threads are more than THREADS_PER_CPU per CPU this process may use, in words; None if they are
    not."""
    from dilstore.storage.cpus import usable_cpu_count

    cpus = usable_cpu_count()
    if value > (most := THREADS_PER_CPU * cpus):
        return (
            f"expected at most {most} threads ({THREADS_PER_CPU} per CPU of the {cpus} this process may use), "
            f"got {value}"
        )
    return None


def numpy_seed(text: str) -> int:
    """argparse type: a seed numpy accepts, 0 to 2**32 - 1 (`np.random.seed` raises on any other)."""
    return _integer_in(text, 0, MAX_SEED, f"a seed from 0 to {MAX_SEED}")


def sample_seed(text: str) -> int:
    """argparse type: the seed of a seeded random subset (--limit's, --eval-limit's), any integer of at least 0.

    Python's `random.Random` seeds with the absolute value, so `--seed -1` drew the same subset as `--seed 1`
    (left55b F1); a negative seed is refused rather than let two seeds name one subset. No upper bound, unlike
    `numpy_seed`: `random.Random` draws a subset of its own for every seed of at least 0.
    """
    return _integer_in(text, 0, None, "a seed of at least 0")


def _integer_in(text: str, low: int, high: int | None, expected: str) -> int:
    """`text` as an integer from `low` to `high` (no bound when None); an ArgumentTypeError saying `expected`."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}") from None
    if value < low or (high is not None and value > high):
        raise argparse.ArgumentTypeError(f"expected {expected}, got {value}")
    return value


def absolute_path(text: str) -> Path:
    """argparse type: a path made absolute against the folder the command was started in.

    For scripts that run their children in another folder (the repository, a source tree): a relative path handed
    on as given named something else there.
    """
    return Path(text).absolute()


def torch_device(text: str) -> str:
    """argparse type: a torch device this machine has ("cpu", "cuda", "cuda:N", "mps"), as given.

    torch is imported only when the option is used, so `--help` stays fast.
    """
    import torch

    try:
        device = torch.device(text)
    except RuntimeError:
        raise argparse.ArgumentTypeError(f"not a torch device: {text!r} (expected cpu, cuda, cuda:N or mps)") from None
    if device.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if (device.index or 0) >= count:
            raise argparse.ArgumentTypeError(f"{text}: this machine has {count} CUDA device(s) that torch can use")
    elif device.type == "mps" and not torch.backends.mps.is_available():
        raise argparse.ArgumentTypeError(f"{text}: this machine has no MPS device that torch can use")
    elif device.type not in ("cpu", "cuda", "mps"):
        raise argparse.ArgumentTypeError(f"{text}: dilstore runs on cpu, cuda or mps devices")
    return text


def option_words(options: Mapping[str, Any], *, beam: bool = False) -> list[str]:
    """`--flag value` words for options by their Python names: None and False leave a flag out, True is the bare
    flag, and a list (or other iterable but a string or path) repeats the flag for each item. A value that
    begins with "-" is joined to its flag (`--input=-data.jsonl`), as argparse would read it as an option.

    `beam`: the options are Beam's, under Beam's own names (`temp_location`), each as one `--name=value` word.
    """
    words: list[str] = []
    for name, value in options.items():
        if value is None or value is False:
            continue
        flag = "--" + (name if beam else name.replace("_", "-"))
        if value is True:
            words.append(flag)
        else:
            values = value if isinstance(value, Iterable) and not isinstance(value, str | Path) else [value]
            for item in map(str, values):
                words += [f"{flag}={item}"] if beam or item.startswith("-") else [flag, item]
    return words
