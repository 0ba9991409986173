"""How a message names a few of many items, each cut to a readable width, and counts them."""

from __future__ import annotations

import itertools
import shlex
import unicodedata
from collections.abc import Container, Sequence
from os import PathLike

SHOWN = 5  # items a message names before "and N more"
ITEM_WIDTH = 80  # characters a message shows of one item
FORM_PROBES = 20  # missing ids past ASCII whose other Unicode forms `other_form_hint` looks up


def listed(items: Sequence[str], *, quoted: bool = True, limit: int = SHOWN, separator: str = ", ") -> str:
    """The first `limit` items (each as repr unless not `quoted`) joined by `separator`, then " and N more" when
    there are more: an error names a few of a long list and counts the rest."""
    shown = separator.join(cut(repr(item) if quoted else str(item)) for item in items[:limit])
    return shown + (f" and {len(items) - limit} more" if len(items) > limit else "")


def counted(number: int, noun: str) -> str:
    """`number` with thousands separators and `noun`, plural ("s") unless it is one: "1 shard", "1,024 shards"."""
    return f"{number:,} {noun}" + ("" if number == 1 else "s")


def first_clause(error: Exception) -> str:
    """The error's message up to its first semicolon: Python's refusal of a JSON integer of over 4,300 digits goes on
    to advise `sys.set_int_max_str_digits()`, which no user of a command can call (fuzz60 F3)."""
    return str(error).split(";")[0]


def cut(text: str) -> str:
    """`text` cut to ITEM_WIDTH characters: a message names an item, it does not echo a 500 KB one back."""
    return text if len(text) <= ITEM_WIDTH else text[: ITEM_WIDTH - 1] + "…"


def shown(value: object) -> str:
    """`repr(value)` cut as `cut` does; a number too long for Python to write out (an int past
    `sys.get_int_max_str_digits()`, 4300 digits, or a Fraction of one) is named by its type: repr raised ValueError
    inside the message that was to name it (num58 F1)."""
    try:
        return cut(repr(value))
    except ValueError:
        return f"{type(value).__name__} value too long to write out"


def path_text(path: str | PathLike[str]) -> str:
    """A path or file name as text that any UTF-8 file or stream takes: the bytes of a name that is not UTF-8 (which
    Python decodes to lone surrogates, U+DC80..U+DCFF) as escapes, `q\\xff.jsonl`; any other name as it is."""
    return str(path).encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def command_text(*words: str | PathLike[str]) -> str:
    """A command as a shell takes it pasted back: `dilstore index '/data/my store'`. Hints printed store paths
    unquoted, so a path with a space or a quote ran another command (left58b F2)."""
    return shlex.join(path_text(word) for word in words)


def other_form_hint(held: Container[str], missing: Sequence[str], *, where: str = "in it", what: str = "ids") -> str:
    """" (... the store holds ...)" when `held` (a store) has one of the first few `missing` ids that are not ASCII in
    another Unicode normalization form, shown with escapes (`ascii`); else "". `where` and `what` word the hint for
    other names than a store's ids (serve's store names: "among them", "store names").

    Ids are matched code point by code point, and the two forms of `Zürich#p0` (one `ü`, or `u` and a combining
    diaeresis, as macOS writes file names) print alike: "not in store: 'Zürich#p0'" named an id that `info`, a run
    file and the store all seemed to show (unicode56 F4).
    """
    # The first FORM_PROBES ids past ASCII (which has one form): a slice of the first ids, ASCII ones included, left
    # a near miss unnamed behind 20 missing ASCII ids (mut56 F1).
    for passage_id in itertools.islice((text for text in missing if not text.isascii()), FORM_PROBES):
        for form in ("NFC", "NFD", "NFKC", "NFKD"):
            other = unicodedata.normalize(form, passage_id)
            if other != passage_id and other in held:
                return (f" ({cut(ascii(passage_id))} is not {where}, but {cut(ascii(other))} is: the same text in "
                        f"another Unicode form ({form}); {what} are matched code point by code point)")
    return ""
