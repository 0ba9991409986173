"""CI runs the README's test command, with Hypothesis's derandomized "ci" profile.

A clean checkout has no example database, so without it every CI run would
draw new property-test examples and could go red on a rare one that no
change of the session caused (a hypothesis-found float-rounding case once
cost a run 312 s of shrinking and a failure).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

from tests.fixtures.paths import ROOT


def _commands(script: str) -> list[str]:
    """The script's command lines: neither blank nor comments."""
    return [line.strip() for line in script.splitlines() if line.strip() and not line.lstrip().startswith("#")]


def test_ci_runs_the_readme_test_command_last_with_ci_set() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    test_command = re.search(r"^(make test)\b.*what CI runs", readme, flags=re.MULTILINE)
    assert test_command is not None, "README no longer names the test command CI runs"
    commands = _commands((ROOT / ".ci" / "run").read_text(encoding="utf-8"))
    assert commands[-1] == test_command.group(1)
    assert "export CI=true" in commands[:-1]


def _profile_derandomizes(environment: dict[str, str]) -> bool:
    """Whether Hypothesis's default settings derandomize in a fresh interpreter with this environment."""
    probe = "from hypothesis import settings; print(settings.default.derandomize)"
    result = subprocess.run(
        [sys.executable, "-c", probe], env=environment, capture_output=True, text=True, check=True, timeout=120
    )
    return result.stdout.strip() == "True"


def test_ci_true_loads_a_derandomized_profile_and_local_runs_stay_random() -> None:
    local = {"PATH": os.environ.get("PATH", "")}  # none of the CI markers Hypothesis looks for (CI, GITHUB_ACTIONS, …)
    assert _profile_derandomizes({**local, "CI": "true"})
    assert not _profile_derandomizes(local)
