"""The inputs of a rerank checked before any model loads: the depth and the topics of a first-stage run.

Apart from reader/serving/rerank.py (which imports them from here) because that module imports torch and the
rankers: `dilstore rerank` checks its topics against its run before the ranker loads, and a mismatch is named at once,
not after those libraries' import of several seconds (fast59 F2).
"""

from __future__ import annotations

from collections.abc import Mapping

from dilstore.reader.data.trec import Run
from dilstore.storage.checks import positive_int
from dilstore.storage.errors import DilstoreError
from dilstore.storage.messages import listed, other_form_hint

DEFAULT_DEPTH = 100


def checked_depth(depth: int) -> int:
    """depth as an int; a DilstoreError unless it is a positive integer (a numpy one is taken)."""
    return positive_int("depth", depth)


def require_topics(topics: Mapping[str, str], run: Run, source: str = "the topics") -> None:
    """Raise DilstoreError naming the run's queries that have no topic in `topics` (read from `source`), or the
    first whose topic is not a string (`topics` a string was searched for qids as substrings)."""
    if not isinstance(topics, Mapping):
        raise DilstoreError(f"the topics must be a {{qid: query text}} mapping, got {type(topics).__name__}")
    missing = [qid for qid in run if qid not in topics]
    if missing:
        raise DilstoreError(f"{len(missing)} query(ies) of the run have no topic in {source}: {listed(missing)}"
                            f"{other_form_hint(topics, missing)}")  # fmt: skip
    for qid in run:
        if not isinstance(topics[qid], str):
            raise DilstoreError(f"the topic of query {qid!r:.60} must be its text, got {type(topics[qid]).__name__}")
