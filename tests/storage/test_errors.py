"""How a message names a few of many items (storage/errors.py `listed`), the one rule six messages wrote out, and
the one check that an argument is a list (`as_list`)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dilstore.storage.errors import ITEM_WIDTH, SHOWN, DilstoreError, as_list, listed


@given(items=st.lists(st.text(max_size=8), max_size=12), limit=st.integers(1, 7))
def test_the_first_items_are_named_and_the_rest_counted(items: list[str], limit: int) -> None:
    text = listed(items, limit=limit, separator=" | ")
    counted = f" and {len(items) - limit} more" if len(items) > limit else ""
    assert text.endswith(counted)
    assert text.removesuffix(counted) == " | ".join(repr(item) for item in items[:limit])


def test_unquoted_items_and_the_default_limit() -> None:
    assert listed([f"f{i}" for i in range(SHOWN + 2)], quoted=False) == "f0, f1, f2, f3, f4 and 2 more"
    assert listed(["a"]) == "'a'" and listed([]) == ""


@given(item=st.text(min_size=ITEM_WIDTH, max_size=5 * ITEM_WIDTH))
def test_a_long_item_is_cut_to_a_readable_width(item: str) -> None:
    """A 500 KB document id came back whole in a /rerank 422 that named it."""
    shown = listed([item])
    whole = repr(item)
    assert shown == (whole if len(whole) <= ITEM_WIDTH else whole[: ITEM_WIDTH - 1] + "…")
    assert len(shown) <= ITEM_WIDTH


def test_any_iterable_but_a_string_is_a_list() -> None:
    assert as_list((word for word in "ab"), "words") == ["a", "b"]
    assert as_list(range(2), "numbers") == [0, 1]
    for refused, named in (("ab", "str 'ab'"), (b"ab", "bytes b'ab'"), (None, "NoneType None"), (3, "int 3")):
        with pytest.raises(DilstoreError, match=f"^words must be a list, got {named}$"):
            as_list(refused, "words must be a list")
