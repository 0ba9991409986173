"""How a message names a few of many items (storage/errors.py `listed`), the one rule six messages wrote out."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from dilstore.storage.errors import SHOWN, listed


@given(items=st.lists(st.text(max_size=8), max_size=12), limit=st.integers(1, 7))
def test_the_first_items_are_named_and_the_rest_counted(items: list[str], limit: int) -> None:
    text = listed(items, limit=limit, separator=" | ")
    counted = f" and {len(items) - limit} more" if len(items) > limit else ""
    assert text.endswith(counted)
    assert text.removesuffix(counted) == " | ".join(repr(item) for item in items[:limit])


def test_unquoted_items_and_the_default_limit() -> None:
    assert listed([f"f{i}" for i in range(SHOWN + 2)], quoted=False) == "f0, f1, f2, f3, f4 and 2 more"
    assert listed(["a"]) == "'a'" and listed([]) == ""
