"""The process-wide quiet switch of a dilstore command without --verbose: `dilstore.runners.quiet` sets it (a
layer above, and in Beam's workers too, through the environment), the reader's noisy libraries read it."""

from __future__ import annotations

import os

QUIET_ENV = "DILSTORE_QUIET"


def is_quiet() -> bool:
    """Whether the command runs quiet (no --verbose)."""
    return os.environ.get(QUIET_ENV) == "1"
