"""The packaging scripts' size check: the packaged weights' size as JSON on stdout, and a failure over the limit.

Shipped checkpoints have a size limit: 50 MB for the reader (package_default_checkpoint.py), 60 MB for the rankers
(package_default_ranker.py).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from dilstore.reader.training.release import weights_megabytes


def report_package_size(destination: Path, limit_mb: float) -> int:
    """Print the packaged weights' size as JSON; exit status 1 (with a line on stderr) when over `limit_mb`."""
    size = weights_megabytes(destination)
    print(json.dumps({"destination": str(destination), "weights_mb": round(size, 2), "limit_mb": limit_mb}))
    if size > limit_mb:
        print(f"packaged weights are {size:.1f} MB, over the {limit_mb:.0f} MB limit", file=sys.stderr)
        return 1
    return 0
