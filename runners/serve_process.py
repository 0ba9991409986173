"""`dilstore serve` as a child process: start it on a free port, learn its URL, stop it gracefully.

For scripts that need a real server over HTTP (the load benchmark, the
process tests): the server picks its own port (`--port 0`), and its URL
comes from uvicorn's start-up line on stderr, which is kept in `log`.
"""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path

LISTENING = re.compile(r"Uvicorn running on (http://127\.0\.0\.1:\d+)")


class ServeProcess:
    """`python -m dilstore serve ARGS --host 127.0.0.1 --port 0` in a child process, ready once it listens."""

    def __init__(self, args: Sequence[str], *, timeout: float = 120.0, cwd: Path | None = None) -> None:
        """Start the server and wait up to `timeout` seconds for it to listen.

        Raises RuntimeError with the server's stderr if it exits or does not
        listen in time (the child is killed then). The child takes SIGHUP as a
        server started from a terminal does, even when this process ignores it
        (under `nohup`, which the server would keep).
        """
        self.command = [sys.executable, "-m", "dilstore", "serve", *args, "--host", "127.0.0.1", "--port", "0"]
        self.timeout = timeout
        started = time.perf_counter()
        self.process = subprocess.Popen(
            self.command, cwd=cwd, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True,
            preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_DFL),
        )
        self.log: list[str] = []
        self.url = ""
        listening = threading.Event()

        def read() -> None:
            assert self.process.stderr is not None
            for line in self.process.stderr:
                self.log.append(line)
                match = LISTENING.search(line)
                if match:
                    self.url = match.group(1)
                    listening.set()

        self.reader = threading.Thread(target=read, daemon=True)
        self.reader.start()
        while not listening.wait(0.1):
            if self.process.poll() is not None or time.perf_counter() - started > timeout:
                self.kill()
                raise RuntimeError(f"the server did not start: {' '.join(self.command)}\n{''.join(self.log)}")
        self.start_seconds = time.perf_counter() - started

    def stop(self) -> int:
        """SIGTERM (the server drains what is in flight), then its exit status; killed if it outlives `timeout`."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            status = self.process.wait(self.timeout)
        except subprocess.TimeoutExpired:
            status = self.kill()
        self.reader.join(self.timeout)
        return status

    def kill(self) -> int:
        """Kill the server if it still runs; its exit status."""
        if self.process.poll() is None:
            self.process.kill()
        return self.process.wait()
