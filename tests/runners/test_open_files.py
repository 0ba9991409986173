"""The commands raise their open-file limit to the hard limit: a store keeps a descriptor per mapped file."""

from __future__ import annotations

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
