"""Lone surrogates: code points a Python string may hold that are not Unicode text.

JSON may escape half of a surrogate pair (`"\\ud800"`), and `json.loads` turns it into
a one-character string that no tokenizer reads and no UTF-8 writer writes. Such
text is refused where it comes in (a file's line or item, a request), with an error
that says where, rather than as a TypeError from deep inside the tokenizer.
"""

from __future__ import annotations

from dilstore.storage.errors import DilstoreError


def lone_surrogate(text: str) -> str | None:
    """Where `text` stops being Unicode text ("a lone surrogate U+D800 at character 7", its first), else None."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        return f"a lone surrogate U+{ord(text[error.start]):04X} at character {error.start + 1}"
    return None


def require_unicode(text: str, what: str) -> str:
    """`text` itself, or a DilstoreError "`what` holds a lone surrogate U+D800 at character 7, not Unicode text"."""
    problem = lone_surrogate(text)
    if problem is not None:
        raise DilstoreError(f"{what} holds {problem}, which is not Unicode text")
    return text
