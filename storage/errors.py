"""The exception type that carries a user-facing message (and its one kind for a run stopped by a signal), the
one "must be at least 1" check, the one check that an argument is a positive integer (a numpy one too), the one
check that an argument is a list, and how a message names a few of many items.

It lives in the lowest layer so that every layer above can raise it and the
command line can turn it into a clear message and a non-zero exit, never a
traceback.
"""

from __future__ import annotations

import numbers
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any
from urllib.parse import urlsplit

SHOWN = 5  # items a message names before "and N more"
# The user parts with a password ("user:pw@") and the http(s) query strings ("?sig=...") of the store URLs given in
# this process, as they appear in a URL, each with what shows instead.
_SECRETS: dict[str, str] = {}
URL_PASSWORD = re.compile(r"://([^/@:\s]*):([^/@\s]*)@")  # a URL's user part that holds a password: user, password
ITEM_WIDTH = 80  # characters a message shows of one item


class DilstoreError(Exception):
    """A problem with the user's input or files, explained in the message."""


class StoppedBySignal(DilstoreError):
    """A command stopped by a signal (SIGINT, SIGTERM or SIGHUP); the message says what is kept and how to go on.

    Not the user's mistake: the command line prints the message and exits
    with 128 + `signal_number`, as a shell reports a process that signal ended.
    """

    def __init__(self, message: str, signal_number: int) -> None:
        super().__init__(message)
        self.signal_number = signal_number


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


def positive_int(name: str, value: Any) -> int:
    """`value` as a Python int; a DilstoreError naming `name` unless it is an integer of at least 1.

    A numpy integer (a count read from an array) is taken and turned into an
    int, which JSON and Java both take; a bool or a float is refused.
    """
    if not is_integer(value) or value < 1:
        raise DilstoreError(f"{name} must be a positive integer, got {_cut(repr(value))}")
    return int(value)


def listed(items: Sequence[str], *, quoted: bool = True, limit: int = SHOWN, separator: str = ", ") -> str:
    """The first `limit` items (each as repr unless not `quoted`) joined by `separator`, then " and N more" when
    there are more: an error names a few of a long list and counts the rest."""
    shown = separator.join(_cut(repr(item) if quoted else str(item)) for item in items[:limit])
    return shown + (f" and {len(items) - limit} more" if len(items) > limit else "")


def _cut(text: str) -> str:
    """`text` cut to ITEM_WIDTH characters: a message names an item, it does not echo a 500 KB one back."""
    return text if len(text) <= ITEM_WIDTH else text[: ITEM_WIDTH - 1] + "…"


def as_list(items: Any, what: str) -> list[Any]:
    """`items`, any iterable but a string, as a list; else a DilstoreError naming `what` (e.g. "doc_ids must be a
    list of document ids"): a string would be read one item per character, and None or a number failed deep
    inside with a TypeError."""
    if isinstance(items, (str, bytes)) or not isinstance(items, Iterable):
        raise DilstoreError(f"{what}, got {type(items).__name__} {_cut(repr(items))}")
    return list(items)


def remember_secrets(url: str) -> None:
    """Note the password-bearing user part (and the http(s) query string) of each part of a store URL, for
    `scrubbed`. As they appear in URLs ("user:pw@", "?q"), never the bare password: one of "a" would have
    starred every "a" of every message."""
    for user, password in URL_PASSWORD.findall(url):
        _SECRETS[f"{user}:{password}@"] = f"{user}:***@"
    for part in url.split("::"):
        parts = urlsplit(part)
        if parts.query and parts.scheme in ("http", "https"):
            _SECRETS[f"?{parts.query}"] = "?***"


def scrubbed(text: str) -> str:
    """`text` with every user part and query string `remember_secrets` noted hidden: messages name a store's files
    by their full URL, and `serve` sends its messages to any client (it has no authentication)."""
    for secret in sorted(_SECRETS, key=len, reverse=True):
        text = text.replace(secret, _SECRETS[secret])
    return text
