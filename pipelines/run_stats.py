"""The counts a precompute run adds up, and how partial counts merge.

Every stage that counts something emits a `RunStats` with only its own fields
set; one CombinePerKey sums them into the run's totals. That works on every
runner, including Dask, whose runner collects no Beam metrics, so the
end-of-run summary never depends on a metrics backend.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass, fields


@dataclass(frozen=True)
class RunStats:
    """Counts of one run, or of one piece of it.

    documents: documents accepted (read, not rejected, split into passages);
    skipped: records left out on purpose (e.g. Wikipedia redirects);
    rejected: dead-lettered records; rejected_passages: passages left out as dead letters (no word piece), of
    documents stored or rejected; passages, tokens: what the store holds;
    long_passages: passages over the model's maximum length, split into windows;
    shards: shards in the store; shards_resumed: of those, committed before this
    run started and not recomputed (dask50 F7: not a retry within it); bytes: bytes of shard and passage-table files.
    """

    documents: int = 0
    skipped: int = 0
    rejected: int = 0
    rejected_passages: int = 0
    passages: int = 0
    tokens: int = 0
    long_passages: int = 0
    shards: int = 0
    shards_resumed: int = 0
    bytes: int = 0

    def to_dict(self) -> dict[str, int]:
        """The counts as a plain dict (JSON-ready)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, int]) -> RunStats:
        """Counts from `to_dict`'s output; unknown keys are ignored."""
        names = {field.name for field in fields(cls)}
        return cls(**{key: int(value) for key, value in data.items() if key in names})


def merge_stats(parts: Iterable[RunStats]) -> RunStats:
    """The field-wise sum of `parts` (a CombinePerKey callable: order does not matter)."""
    totals = dict.fromkeys((field.name for field in fields(RunStats)), 0)
    for part in parts:
        for name, value in asdict(part).items():
            totals[name] += value
    return RunStats(**totals)
