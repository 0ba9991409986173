"""The one "must be at least 1" check, the one check that an argument is a positive integer (a numpy one too),
and the one check that an argument is a list: each a DilstoreError naming the argument."""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable, Mapping
from typing import Any

from dilstore.storage.errors import DilstoreError
from dilstore.storage.messages import shown


def require_at_least_one(values: Mapping[str, int | None], *, dashed: bool = True) -> None:
    """A DilstoreError naming the first value below 1; None means unset.

    Names are spelt as their command-line flags (`batch_size` → batch-size)
    unless not `dashed`, for settings objects whose errors name the field.
    """
    for name, value in values.items():
        if value is not None and value < 1:
            label = name.replace("_", "-") if dashed else name
            raise DilstoreError(f"{label} must be at least 1, got {value}")


def is_integer(value: Any) -> bool:
    """Whether `value` is an integer, a numpy one too, and not a bool."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def is_size_list(value: Any) -> bool:
    """Whether `value` is a recorded state shape: a JSON list of positive integers, not bools. The one check that the
    manifest, shard and codebook readers share: read with int() per item, the string "32" was the shape (3, 2)
    (fuzz60 F6, tail61 F1)."""
    return isinstance(value, list) and all(isinstance(size, int) and not isinstance(size, bool) and size > 0
                                           for size in value)  # fmt: skip


def positive_int(name: str, value: Any) -> int:
    """`value` as a Python int; a DilstoreError naming `name` unless it is an integer of at least 1.

    A numpy integer (a count read from an array) is taken and turned into an
    int, which JSON and Java both take; a bool or a float is refused.
    """
    if not is_integer(value) or value < 1:
        raise DilstoreError(f"{name} must be a positive integer, got {shown(value)}")
    return int(value)


def finite_float(value: Any) -> float | None:
    """`value` as a float when it is a real number (a numpy one too, not a bool) that a float holds as a finite
    number; else None. An int or a Fraction past float's range is None: float() raised OverflowError on it, a
    traceback where the caller refuses the value by name (num58 F1)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return None
    try:
        converted = float(value)
    except OverflowError:
        return None
    return converted if math.isfinite(converted) else None


def as_list(items: Any, what: str) -> list[Any]:
    """`items`, any iterable but a string, as a list; else a DilstoreError naming `what` (e.g. "doc_ids must be a
    list of document ids"): a string would be read one item per character, and None or a number failed deep
    inside with a TypeError."""
    if isinstance(items, (str, bytes)) or not isinstance(items, Iterable):
        raise DilstoreError(f"{what}, got {type(items).__name__} {shown(items)}")
    return list(items)
