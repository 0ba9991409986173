"""How a message names a few of many items, each cut to a readable width, and counts them."""

from __future__ import annotations

from collections.abc import Sequence

SHOWN = 5  # items a message names before "and N more"
ITEM_WIDTH = 80  # characters a message shows of one item


def listed(items: Sequence[str], *, quoted: bool = True, limit: int = SHOWN, separator: str = ", ") -> str:
    """The first `limit` items (each as repr unless not `quoted`) joined by `separator`, then " and N more" when
    there are more: an error names a few of a long list and counts the rest."""
    shown = separator.join(cut(repr(item) if quoted else str(item)) for item in items[:limit])
    return shown + (f" and {len(items) - limit} more" if len(items) > limit else "")


def counted(number: int, noun: str) -> str:
    """`number` with thousands separators and `noun`, plural ("s") unless it is one: "1 shard", "1,024 shards"."""
    return f"{number:,} {noun}" + ("" if number == 1 else "s")


def cut(text: str) -> str:
    """`text` cut to ITEM_WIDTH characters: a message names an item, it does not echo a 500 KB one back."""
    return text if len(text) <= ITEM_WIDTH else text[: ITEM_WIDTH - 1] + "…"
