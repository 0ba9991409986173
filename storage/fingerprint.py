"""What produced a store: the model, the split, the encoding and the maximum length.

A store's states are only meaningful to the exact model half that made them.
The fingerprint travels in the manifest, and opening a store with the
fingerprint of a different model fails with both fingerprints side by side.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, fields
from typing import Any

from dilstore.storage.errors import DilstoreError


class FingerprintMismatchError(DilstoreError):
    """A store was made by a different model, split or encoding than the caller's."""


@dataclass(frozen=True)
class Fingerprint:
    """Identity of the model half and settings that produced a store's states.

    architecture: the model class (e.g. "BertModel"); config_sha256: hash of its
    config; weights_sha256: hash of its weights; tokenizer_sha256: hash of its
    tokenizer files; kind: representation kind ("dilbert", "earl-s1", "earl-s2", "listformer");
    layers: the split point (k for dilbert and listformer, N for EARL); encoding: on-disk encoding name; max_length:
    the longest passage window in tokens.
    """

    architecture: str
    config_sha256: str
    weights_sha256: str
    tokenizer_sha256: str
    kind: str
    layers: int
    encoding: str
    max_length: int

    def __post_init__(self) -> None:
        for field in fields(self):
            value = getattr(self, field.name)
            expected = int if field.type in ("int", int) else str
            if not isinstance(value, expected) or isinstance(value, bool):
                raise DilstoreError(
                    f"fingerprint field {field.name!r} must be {expected.__name__}, got {value!r}"
                )

    def to_dict(self) -> dict[str, Any]:
        """A plain JSON-ready dict, keys in field order."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Fingerprint:
        """Parse a dict written by `to_dict`; missing or unknown keys are a clear error."""
        if not isinstance(data, dict):
            raise DilstoreError(f"a fingerprint must be a JSON object, got {type(data).__name__}")
        names = [field.name for field in fields(cls)]
        missing = [name for name in names if name not in data]
        unknown = sorted(set(data) - set(names))
        if missing or unknown:
            raise DilstoreError(f"malformed fingerprint: missing keys {missing}, unknown keys {unknown}")
        return cls(**{name: data[name] for name in names})

    def differences(self, other: Fingerprint) -> list[str]:
        """Names of the fields whose values differ from `other`'s."""
        return [field.name for field in fields(self) if getattr(self, field.name) != getattr(other, field.name)]


def fingerprint_sha256(fingerprint: Fingerprint) -> str:
    """SHA-256 of the fingerprint's canonical JSON: what every shard records, so `verify` can tell an edited one."""
    canonical = json.dumps(fingerprint.to_dict(), sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def check_fingerprint(found: Fingerprint, expected: Fingerprint, where: str, advice: str = "") -> None:
    """Raise FingerprintMismatchError showing both fingerprints unless they are equal, `advice` (what to do) last."""
    differing = found.differences(expected)
    if not differing:
        return
    width = max(len(field.name) for field in fields(Fingerprint))
    lines = [
        f"  {'*' if field.name in differing else ' '} {field.name:<{width}}  "
        f"store: {getattr(found, field.name)!s:<66}  expected: {getattr(expected, field.name)}"
        for field in fields(Fingerprint)
    ]
    raise FingerprintMismatchError(
        f"{where} was made by a different model or settings than expected "
        f"(differs in: {', '.join(differing)}):\n" + "\n".join(lines) + (f"\n{advice}" if advice else "")
    )
