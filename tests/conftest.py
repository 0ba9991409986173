"""Shared fixtures: where the repo and ../shared/data are."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = ROOT.parent / "shared" / "data"


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """../shared/data, or a skip that says why when this checkout has none beside it."""
    if not SHARED_DATA.is_dir():
        pytest.skip(f"needs real data at {SHARED_DATA} (absent in this checkout)")
    return SHARED_DATA
