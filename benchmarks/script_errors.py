"""The one way a benchmark script ends on a DilstoreError: `SCRIPT: error: MESSAGE` on stderr and exit status 2.

A missing input, a refused output or a model that does not fit is the user's to fix: one line naming it, not a
traceback (bench53 F6, F15). Each script's `main` wore its own copy of that try/except; `@one_line_errors` is it
once (dup55 D1). Scripts import it as a neighbour (`from script_errors import one_line_errors`): run as
`python benchmarks/NAME.py`, their folder heads sys.path.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from pathlib import Path
from typing import ParamSpec

from dilstore.storage.errors import DilstoreError

P = ParamSpec("P")


def one_line_errors(main: Callable[P, int]) -> Callable[P, int]:
    """`main`, with a DilstoreError it raises printed as `SCRIPT: error: MESSAGE` on stderr and returned as exit
    status 2; SCRIPT is the name of the file `main` is defined in, without .py."""
    script = Path(main.__code__.co_filename).stem

    @functools.wraps(main)
    def guarded(*args: P.args, **kwargs: P.kwargs) -> int:
        try:
            return main(*args, **kwargs)
        except DilstoreError as error:
            print(f"{script}: error: {error}", file=sys.stderr)
            return 2

    return guarded
