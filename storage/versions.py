"""The installed version of a package, for a store's manifest and for `dilstore --version`."""

from __future__ import annotations

from importlib import metadata


def installed_version(package: str) -> str | None:
    """`package`'s installed version; None when it is not installed (the source tree put on sys.path)."""
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def dilstore_version() -> str:
    """dilstore's installed version, for people (`dilstore --version`, `dilstore.__version__`)."""
    return installed_version("dilstore") or "unknown (not installed)"
