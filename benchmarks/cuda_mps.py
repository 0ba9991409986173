"""CUDA MPS for training processes that share the one lent GPU (issue #12's k-sweep).

Without MPS the CUDA contexts of several processes take the GPU in turns, so the small kernels of a 6-layer,
384-wide reader leave much of the chip idle even with two runs side by side (on a lent H200 one run alone kept
it busy 65% of the time, and two side by side trained at 1.2x the windows/s of one). Under MPS one server runs
the kernels of all its client processes at once. Whether that pays on the lent machines is measured, not
assumed: benchmarks/bench_side_by_side.py times the same phases with and without it.

`mps_server(directory)` starts the control daemon with its pipes and logs under `directory`, checks that a
CUDA client runs under it and that the daemon then lists a server, and yields the environment every client must
be started with; where the daemon is missing, a client fails or no server comes up, it yields None and the
reason, and the caller goes on without MPS. The daemon is told to quit on the way out.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

# Where the driver's tools sit on the lent machines when they are not on PATH.
DRIVER_BIN = Path("/usr/local/nvidia/bin")
CONTROL = "nvidia-cuda-mps-control"
# A client that creates a CUDA context and runs one kernel: what every training process does first.
CLIENT_CHECK = "import torch; torch.ones(1, device='cuda').add_(1); torch.cuda.synchronize(); print('ok')"


@dataclass(frozen=True)
class MpsServer:
    """The environment for clients of a running MPS server (None when there is none) and what happened."""

    env: dict[str, str] | None
    note: str


def control_binary() -> Path | None:
    """The MPS control program on PATH or in the driver's folder, or None."""
    found = shutil.which(CONTROL) or (str(DRIVER_BIN / CONTROL) if (DRIVER_BIN / CONTROL).is_file() else None)
    return None if found is None else Path(found)


@contextmanager
def mps_server(directory: Path, timeout: float = 60.0) -> Iterator[MpsServer]:
    """An MPS control daemon for the duration of the block (module docstring); never raises for a missing MPS.

    A daemon already serving `directory` (left by a call cut off before it could quit it) is used as it is.
    MPS is on only when, after a CUDA client ran, the daemon lists a server: a client that finds no daemon
    runs without MPS and would otherwise pass for one.
    """
    control = control_binary()
    if control is None:
        yield MpsServer(None, f"no {CONTROL} on PATH or in {DRIVER_BIN}")
        return
    pipes, logs = directory / "pipe", directory / "log"
    pipes.mkdir(parents=True, exist_ok=True)
    logs.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "CUDA_MPS_PIPE_DIRECTORY": str(pipes), "CUDA_MPS_LOG_DIRECTORY": str(logs)}
    started, start_output = _run([str(control), "-d"], env, timeout)
    client, client_output = _run([sys.executable, "-c", CLIENT_CHECK], env, timeout)
    listed, servers = _run([str(control)], env, timeout, stdin="get_server_list\n")
    if not (client and listed and servers):
        _run([str(control)], env, timeout, stdin="quit\n")
        reason = (
            f"a CUDA client failed under MPS: {client_output}" if not client
            else f"no MPS server listed after a client ran ({servers or 'none'})"
        )  # fmt: skip
        yield MpsServer(None, reason if started else f"{CONTROL} -d failed ({start_output}); {reason}")
        return
    try:
        yield MpsServer(env, "on" if started else f"on (a daemon was already serving {pipes})")
    finally:
        _run([str(control)], env, timeout, stdin="quit\n")


def _run(command: list[str], env: dict[str, str], timeout: float, stdin: str | None = None) -> tuple[bool, str]:
    """Run `command`: whether it exited 0, and the end of its output (with the exit status when it did not)."""
    try:
        done = subprocess.run(command, env=env, input=stdin, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as error:
        return False, str(error)
    output = (done.stdout + done.stderr).strip()[-300:]
    return (True, output) if done.returncode == 0 else (False, f"exit {done.returncode}: {output}")
