"""An exception and those it was raised from or during: how Beam and the command line find the error that counts.

Beam wraps a worker's errors (and a Ctrl-C) in its own; a second Ctrl-C raised while the first stop unwound has
the first in its context.
"""

from __future__ import annotations

from collections.abc import Iterator


def exception_chain(error: BaseException) -> Iterator[BaseException]:
    """`error`, then the exception it was raised from (`__cause__`) or during (`__context__`), and so on; each once."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        yield current
        seen.add(id(current))
        current = current.__cause__ or current.__context__
