"""Dropping the page cache, so that a benchmark's first reads come from the disk (bench_scale, bench_store)."""

from __future__ import annotations

import os
from pathlib import Path


def drop_page_cache() -> bool:
    """Flush and drop the page cache (needs root); False when not permitted."""
    os.sync()
    try:
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
    except OSError:
        return False
    return True
