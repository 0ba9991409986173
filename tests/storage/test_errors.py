"""How a message names a few of many items (storage/errors.py `listed`), the one rule six messages wrote out, the
one check that an argument is a list (`as_list`), and the one check that a count is a positive integer
(`positive_int`)."""

from __future__ import annotations

import re

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from dilstore.storage.checks import as_list, positive_int
from dilstore.storage.errors import DilstoreError
from dilstore.storage.messages import ITEM_WIDTH, SHOWN, listed


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


@given(st.integers(min_value=1, max_value=2**62), st.sampled_from([int, np.int64, np.int32, np.uint64]))
def test_a_positive_integer_of_any_integer_type_is_an_int(value: int, kind: type) -> None:
    """A numpy count was refused by `reader.answer(top_p=np.int64(3))` and `rerank_run(depth=...)` (api39 L1)."""
    if kind is np.int32:
        value = min(value, 2**31 - 1)
    taken = positive_int("top_p", kind(value))
    assert taken == value and type(taken) is int


def test_anything_but_a_positive_integer_is_refused_by_name() -> None:
    for refused in (0, -3, np.int64(0), True, 2.0, np.float64(2.0), "2", None):
        with pytest.raises(DilstoreError, match=f"^depth must be a positive integer, got {re.escape(repr(refused))}$"):
            positive_int("depth", refused)


def test_a_store_url_s_password_is_hidden_as_it_appears_in_urls_not_wherever_its_letters_do() -> None:
    """A password of "a" starred every "a" of every message."""
    from dilstore.storage.secrets import remember_secrets, scrubbed

    remember_secrets("simplecache::http://reader:a@host/store")
    remember_secrets("https://host/store?sig=Q9")
    assert scrubbed("a banana: http://reader:a@host/store/f, https://host/store?sig=Q9/manifest.json") == (
        "a banana: http://reader:***@host/store/f, https://host/store?***/manifest.json")


@pytest.mark.parametrize("scheme", ["http", "https"])
def test_the_query_of_a_plain_http_url_is_hidden_as_the_https_one_is(scheme: str, monkeypatch) -> None:
    from dilstore.storage import secrets

    monkeypatch.setattr(secrets, "_SECRETS", {})
    secrets.remember_secrets(f"simplecache::{scheme}://host/store?sig=H7tk")
    assert secrets.scrubbed(f"{scheme}://host/store?sig=H7tk/manifest.json: 403") == (
        f"{scheme}://host/store?***/manifest.json: 403")


def test_a_query_that_another_one_starts_is_hidden_whole(monkeypatch) -> None:
    """The longer secret goes first: the shorter one replaced first left the rest of the longer one shown."""
    from dilstore.storage import secrets

    monkeypatch.setattr(secrets, "_SECRETS", {})
    secrets.remember_secrets("https://host/a?sig=K1")
    secrets.remember_secrets("https://host/b?sig=K1&key=Z9")
    assert secrets.scrubbed("https://host/b?sig=K1&key=Z9/f and https://host/a?sig=K1/f") == (
        "https://host/b?***/f and https://host/a?***/f")


def _every_error_kind() -> list[type[DilstoreError]]:
    """DilstoreError and every subclass the storage layer defines (the kinds `dilstore` names among them)."""
    import dilstore.storage.append
    import dilstore.storage.fingerprint
    import dilstore.storage.format
    import dilstore.storage.id_index
    import dilstore.storage.reader  # noqa: F401 - each import defines its error kinds

    found, todo = [], [DilstoreError]
    while todo:
        kind = todo.pop()
        found.append(kind)
        todo += kind.__subclasses__()
    return found


@pytest.mark.parametrize("kind", _every_error_kind(), ids=lambda kind: kind.__name__)
def test_every_error_kind_crosses_a_process_boundary_whole(kind: type[DilstoreError]) -> None:
    """A worker process's MissingPassagesError (and StoppedBySignal) could not be unpickled (its `missing` was not
    passed back to `__init__`): a ProcessPoolExecutor whose worker's `store.fetch` met a missing id failed every
    future, the good ones too, with "BrokenProcessPool: A process in the process pool was terminated abruptly", and
    `multiprocessing.Pool.map` waited for good, its result thread dead (api54 F1)."""
    import pickle

    extra = {"MissingPassagesError": (["a", "b"],), "StoppedBySignal": (15,),
             "ScaleBeyondRange": (3, "has a residual beyond its scale")}.get(kind.__name__, ())  # fmt: skip
    error = kind("what went wrong", *extra)
    error.add_note("a note")
    back = pickle.loads(pickle.dumps(error))
    assert type(back) is kind and str(back) == "what went wrong" and back.args == error.args
    assert vars(back) == vars(error) and back.__notes__ == ["a note"]


def test_an_id_missing_in_any_of_the_four_forms_is_named_with_the_form_held() -> None:
    """(mut56 M40, M41) `other_form_hint` looks each missing id up in all four normalization forms: a decomposed id
    (`Zu\\u0308rich`, a macOS file name) whose store holds it composed is found by NFC, a full-width id whose store
    holds it decomposed by NFKD. Only NFD and NFKC were held by tests; without the other two such a near miss was
    a bare "not in store" again."""
    from dilstore.storage.messages import other_form_hint

    assert "'Z\\xfcrich' is: the same text in another Unicode form (NFC)" in other_form_hint({"Zürich"},
                                                                                          ["Zu\u0308rich"])
    assert "'1e\\u0301' is: the same text in another Unicode form (NFKD)" in other_form_hint({"1e\u0301"},
                                                                                           ["\uff11\u00e9"])


def test_a_near_miss_behind_many_missing_ascii_ids_is_still_named() -> None:
    """(mut56 F1) `other_form_hint` looked at the first FORM_PROBES missing ids, ASCII ones included, and skipped the
    ASCII ones there: a run whose first 20 missing docids were ASCII got a bare "not in store" for a 21st that the
    store holds in another form. It now looks at the first FORM_PROBES ids that are not ASCII, as it was meant to."""
    from dilstore.storage.messages import FORM_PROBES, other_form_hint

    missing = [f"ghost{number}" for number in range(FORM_PROBES)] + ["Zu\u0308rich"]
    assert "'Z\\xfcrich' is: the same text in another Unicode form (NFC)" in other_form_hint({"Zürich"}, missing)
    assert other_form_hint({"Zürich"}, ["G\u00e9n\u00e8ve"] * FORM_PROBES + ["Zu\u0308rich"]) == ""
