"""argparse types shared by the commands: a bad value is a usage error naming the option, never a traceback later."""

from __future__ import annotations

import argparse

# The largest seed numpy's legacy and Generator seeding accept.
MAX_SEED = 2**32 - 1


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def non_negative_int(text: str) -> int:
    """argparse type: an integer >= 0 (where 0 means none, or all)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer of at least 0, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected an integer of at least 0, got {value}")
    return value


def numpy_seed(text: str) -> int:
    """argparse type: a seed numpy accepts, 0 to 2**32 - 1 (`np.random.seed` raises on any other)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a seed from 0 to {MAX_SEED}, got {text!r}") from None
    if not 0 <= value <= MAX_SEED:
        raise argparse.ArgumentTypeError(f"expected a seed from 0 to {MAX_SEED}, got {value}")
    return value


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
