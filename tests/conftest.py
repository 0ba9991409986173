"""Shared fixtures: where the repo and ../shared/data are, one torch thread, a tiny base encoder and SQuAD file.

Torch and the model helpers are imported inside the fixtures that use them,
so that tests which need neither never load them.
"""

from __future__ import annotations

import os
import signal
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fixtures.paths import SHARED_DATA
from tests.fixtures.serve_process import no_proxy_for_this_machine


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """../shared/data, or a skip that says why when this checkout has none beside it."""
    if not SHARED_DATA.is_dir():
        pytest.skip(f"needs real data at {SHARED_DATA} (absent in this checkout)")
    return SHARED_DATA


def _no_fsync(descriptor: int) -> None:
    os.fstat(descriptor)  # a bad descriptor still raises, as os.fsync's would


def bytecode_cached() -> None:
    """Let this process and every process it starts write the bytecode of what they import (__pycache__ is ignored).

    With PYTHONDONTWRITEBYTECODE set, as in this machine's environment, no process keeps what it compiles: each of
    the ~150 Python processes the suite starts compiled dilstore's modules again (about a tenth of the CPU time of
    the test files that start commands), and a second run rewrote every test module's assertions again (14 s of each
    worker's collection). Whether a module is read from source or from its cached bytecode changes nothing a test
    checks.
    """
    sys.dont_write_bytecode = False
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)


def pytest_configure(config: pytest.Config) -> None:
    """Torch on one thread in every test process and in every process a test starts.

    `make test` runs one xdist worker per core (-n 2 on 2 cores). Torch's default of a thread per core
    would put two threads on each core, and tiny tensors then spend their time waiting on each other:
    tests/reader/training/test_qa.py took 324 s so on this VM, 25 s on one thread. OMP_NUM_THREADS reaches the
    commands, Beam and Dask workers that tests start; a test that wants more threads asks for them.
    """
    os.environ["OMP_NUM_THREADS"] = "1"
    bytecode_cached()
    no_proxy_for_this_machine()  # the tests' requests to their own servers never go through an HTTP_PROXY
    # Flushing a test's temporary files to the disk proves nothing (no test loses power) and took up to a fifth of a
    # store-building test's time: every call is still made, in order (tests/storage/test_durability.py records
    # them), and returns at once. Processes a test starts still flush.
    os.fsync = _no_fsync
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(1)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Test files that hold a slow test first, then the other files, each group with its most numerous files first.

    `make test` hands whole files to its workers in this order (--dist loadfile --no-loadscope-reorder). xdist's own
    order, most tests first, left the one-test journeys (test_store_stops, test_store_life: about 95 s together) for
    the end, where one worker ran them while the other had nothing left to run. Tests keep their order within a file.
    """
    files = [item.nodeid.split("::")[0] for item in items]
    per_file = Counter(files)
    slow_files = {file for file, item in zip(files, items) if item.get_closest_marker("slow")}
    order = {file: (file not in slow_files, -count) for file, count in per_file.items()}
    items[:] = [item for _, item in sorted(zip(files, items), key=lambda pair: order[pair[0]])]


@pytest.fixture(autouse=True)
def torch_back_on_one_thread() -> Iterator[None]:
    """One torch thread again after each test: a command run in-process with --threads N sets N for its process."""
    yield
    torch = sys.modules.get("torch")
    if torch is not None and torch.get_num_threads() != 1:
        torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def signal_handlers_left_as_found() -> Iterator[None]:
    """Each test, and the code it runs in-process, leaves SIGINT, SIGTERM and SIGHUP as it found them: a Python
    caller of dilstore's API would otherwise keep a handler that no longer raises KeyboardInterrupt."""
    watched = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    before = {number: signal.getsignal(number) for number in watched}
    yield
    changed = [number for number in watched if signal.getsignal(number) != before[number]]
    for number in changed:
        signal.signal(number, before[number])
    if changed:
        pytest.fail(f"left the {', '.join(signal.Signals(number).name for number in changed)} handler changed")


@pytest.fixture
def quick_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    """Failed remote reads retried as in use, without the real waits (1.5 s a failed read, about 16 s of the suite
    in the files that fail reads on purpose); tests/storage/test_zarr_reads.py proves the waits themselves."""
    monkeypatch.setattr("dilstore.storage.read_failures.RETRY_SECONDS", 0.01)


@pytest.fixture(scope="module")
def tiny_base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tests/fixtures/qa_training_fixtures.py's random 2-layer BERT with the MiniLM tokenizer, a plain encoder
    directory."""
    from tests.fixtures.qa_training_fixtures import write_tiny_checkpoint

    return write_tiny_checkpoint(tmp_path_factory.mktemp("tiny-base"))


@pytest.fixture(scope="module")
def tiny_base_with_dropout(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`tiny_base` with dropout 0.1, for proving that a resumed run continues the dropout RNG exactly."""
    from tests.fixtures.qa_training_fixtures import write_tiny_checkpoint

    return write_tiny_checkpoint(tmp_path_factory.mktemp("tiny-base-dropout"), dropout=0.1)


@pytest.fixture(scope="module")
def squad_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tests/fixtures/qa_training_fixtures.py's handful of SQuAD v1.1 questions, written as a file."""
    from tests.fixtures.qa_training_fixtures import write_squad

    return write_squad(tmp_path_factory.mktemp("squad") / "tiny.json")


@pytest.fixture(autouse=True)
def output_switches_restored() -> Iterator[None]:
    """Undo, after each test, the quiet switches that an in-process `cli.main` sets in os.environ.

    runners/quiet.configure sets them for the rest of a process (right for the
    command line); without this, one test's command would change what later
    tests on the same worker see.
    """
    names = ("DILSTORE_QUIET", "TRANSFORMERS_VERBOSITY", "HF_HUB_DISABLE_PROGRESS_BARS")
    before = {name: os.environ.get(name) for name in names}
    yield
    for name, value in before.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
