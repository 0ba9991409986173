"""The commands raise their open-file limit to the hard limit: a store keeps a descriptor per mapped file."""

from __future__ import annotations

import errno
import resource
import subprocess
import sys

from tests.fixtures.paths import ROOT


def test_the_soft_limit_is_raised_to_the_hard_one() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    low = 64 if hard == resource.RLIM_INFINITY else min(64, hard)
    code = ("import resource; from dilstore.runners.open_files import raise_open_file_limit; "
            "print(raise_open_file_limit(), resource.getrlimit(resource.RLIMIT_NOFILE)[0])")  # fmt: skip
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT,
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (low, hard)),
    )  # fmt: skip
    returned, now = map(int, done.stdout.split())
    assert returned == now > low
    assert now == (hard if hard != resource.RLIM_INFINITY else 1 << 20)


def test_a_soft_limit_at_the_hard_one_stays() -> None:
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    low = 64 if hard == resource.RLIM_INFINITY else min(64, hard)
    code = "from dilstore.runners.open_files import raise_open_file_limit; print(raise_open_file_limit())"
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT,
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (low, low)),
    )  # fmt: skip
    assert int(done.stdout) == low


def test_an_unlimited_hard_limit_the_system_caps_gets_the_highest_soft_limit_it_accepts(monkeypatch) -> None:
    """macOS reports an unlimited hard limit and refuses a soft limit over kern.maxfilesperproc (EINVAL, a
    ValueError in Python): the single attempt at 2**20 failed and the default 256 stayed, so `serve` refused every
    store its files did not fit (limits59 F1)."""
    from dilstore.runners import open_files

    limits = {"soft": 256}

    def setrlimit(which: int, values: tuple[int, int]) -> None:
        if values[0] > 10240:
            raise ValueError("current limit exceeds maximum limit")
        limits["soft"] = values[0]

    monkeypatch.setattr(resource, "getrlimit", lambda _: (limits["soft"], resource.RLIM_INFINITY))
    monkeypatch.setattr(resource, "setrlimit", setrlimit)
    assert open_files.raise_open_file_limit() == limits["soft"] == 10240
    assert open_files.raise_open_file_limit() == 10240  # already as high as it goes: left as it is


def test_a_soft_limit_the_system_refuses_with_an_os_error_is_searched_below_too(monkeypatch) -> None:
    """(mut59b M11) Only a ValueError (EINVAL, EPERM) refusal was tried: a platform whose setrlimit fails with
    another errno, an OSError, could end the command in a traceback before its work, and no test noticed."""
    from dilstore.runners import open_files

    limits = {"soft": 256}

    def setrlimit(which: int, values: tuple[int, int]) -> None:
        if values[0] > 4096:
            raise OSError(errno.EOPNOTSUPP, "Operation not supported")
        limits["soft"] = values[0]

    monkeypatch.setattr(resource, "getrlimit", lambda _: (limits["soft"], 100_000))
    monkeypatch.setattr(resource, "setrlimit", setrlimit)
    assert open_files.raise_open_file_limit() == limits["soft"] == 4096
