"""dilstore: precompute the query-independent states of transformer readers and rankers, store them, serve them.

The public Python API (see dilstore/api.py and the README's "Python API"):

    import dilstore
    store = dilstore.precompute(input=["corpus.jsonl"], output="my-store", workers=1)
    dilstore.build_index(store)
    reader = dilstore.open_reader(store)
    print(reader.answer("Which team won Super Bowl 50?").text)

`open_store`, `open_reader`, `open_reranker`, `precompute`, `build_index`,
`compact`, `verify`, `evaluate_qa` and `evaluate_rank` load on first use, so `import dilstore`
pulls in neither torch nor Beam. Every error they explain is a
`dilstore.DilstoreError` (the command line prints its message); the kinds a
program may handle apart are here too (ERRORS), and so are the classes the
functions return (RESULTS), for type hints: `def show(reader:
dilstore.OpenDomainReader)`; a reranker is `dilstore.StoreReranker[Any]`. The
package is typed (py.typed). The layers install under this one name:
`dilstore.storage` (the shard store), `dilstore.reader` (models, serving,
training, evaluation), `dilstore.pipelines` (the Beam precompute job) and
`dilstore.runners` (the `dilstore` command).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from dilstore.storage.errors import DilstoreError

if TYPE_CHECKING:  # what type checkers see (py.typed); at run time `__getattr__` loads each name on first use
    from dilstore.api import (
        build_index,
        compact,
        evaluate_qa,
        evaluate_rank,
        open_reader,
        open_reranker,
        open_store,
        precompute,
        verify,
    )
    from dilstore.reader.evaluation.open_domain import QAEvaluation
    from dilstore.reader.evaluation.rank_metrics import RankEvaluation
    from dilstore.reader.serving.answers import Answer, Span
    from dilstore.reader.serving.odqa import OpenDomainReader
    from dilstore.reader.serving.rerank import RerankStats, StoreReranker
    from dilstore.storage.fingerprint import FingerprintMismatchError
    from dilstore.storage.format import StoreChangedError, StoreFormatError, StoreReadError
    from dilstore.storage.reader import MissingPassagesError, Store
    from dilstore.storage.records import StoredPassage
    from dilstore.storage.verify import VerifyReport

    __version__: str

# The DilstoreError subclasses the README names, by the module that defines each (loaded on first use too); listed
# by name in __all__ as well, where static tools see them.
ERRORS = {
    "FingerprintMismatchError": "dilstore.storage.fingerprint",
    "MissingPassagesError": "dilstore.storage.reader",
    "StoreChangedError": "dilstore.storage.format",
    "StoreFormatError": "dilstore.storage.format",
    "StoreReadError": "dilstore.storage.format",
}

# The classes the API's functions return, by the module that defines each (loaded on first use too).
RESULTS = {
    "Answer": "dilstore.reader.serving.answers",
    "OpenDomainReader": "dilstore.reader.serving.odqa",
    "QAEvaluation": "dilstore.reader.evaluation.open_domain",
    "RankEvaluation": "dilstore.reader.evaluation.rank_metrics",
    "RerankStats": "dilstore.reader.serving.rerank",
    "Span": "dilstore.reader.serving.answers",
    "Store": "dilstore.storage.reader",
    "StoreReranker": "dilstore.reader.serving.rerank",
    "StoredPassage": "dilstore.storage.records",
    "VerifyReport": "dilstore.storage.verify",
}

__all__ = [
    "Answer",
    "DilstoreError",
    "FingerprintMismatchError",
    "MissingPassagesError",
    "OpenDomainReader",
    "QAEvaluation",
    "RankEvaluation",
    "RerankStats",
    "Span",
    "Store",
    "StoreChangedError",
    "StoreFormatError",
    "StoreReadError",
    "StoreReranker",
    "StoredPassage",
    "VerifyReport",
    "build_index",
    "compact",
    "evaluate_qa",
    "evaluate_rank",
    "open_reader",
    "open_reranker",
    "open_store",
    "precompute",
    "verify",
]


if not TYPE_CHECKING:  # a checker that saw it would take every name, a misspelt one too, as Any (api45 M1)

    def __getattr__(name: str) -> Any:
        """Load the API module (or an error's or a result's module) on first use of one of its names;
        `__version__` is the installed package's (`dilstore --version` prints it)."""
        if name == "__version__":
            from dilstore.storage.versions import dilstore_version

            return dilstore_version()
        if name in ERRORS or name in RESULTS:
            return getattr(importlib.import_module(ERRORS.get(name) or RESULTS[name]), name)
        if name in __all__:  # DilstoreError is bound above, so only the API's functions come here
            from dilstore import api

            return getattr(api, name)
        raise AttributeError(f"module 'dilstore' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
