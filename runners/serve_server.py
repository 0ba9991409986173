"""The uvicorn server `dilstore serve` runs: a second stop signal of any kind forces the quit, which then reads as
the one warning line the app's lifespan logs.

uvicorn drains on SIGINT or SIGTERM and forces the quit only on a second
SIGINT: a second SIGTERM (or SIGHUP, which `serve` turns into one) waited the
whole --shutdown-timeout. A forced quit cancels the requests still in flight,
and uvicorn logged each as "Exception in ASGI application" with a
CancelledError traceback under the lifespan's warning that already says so.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Iterator
from types import FrameType

import uvicorn

from dilstore.runners.quiet import raising, records_unlogged


class StopServer(uvicorn.Server):
    """uvicorn's Server, where any stop signal after the first forces the quit; given the listening socket, it still
    logs its "Uvicorn running on URL" line (uvicorn leaves it to whoever bound a socket it is given)."""

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if sockets is not None and self.started:
            self._log_started_message(sockets)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self.should_exit:
            self.force_exit = True
        super().handle_exit(sig, frame)


# uvicorn/server.py logs this at ERROR when --shutdown-timeout ends the graceful shutdown.
_SHUTDOWN_TIMEOUT_MESSAGE = "Cancel %s running task(s), timeout graceful shutdown exceeded"


@contextlib.contextmanager
def shutdown_timeout_reworded(seconds: float) -> Iterator[None]:
    """Inside the block, uvicorn's ERROR for the requests a graceful shutdown cut off at its timeout is a WARNING
    that names --shutdown-timeout: it is the designed end of a drain (each of them is answered 503), and an
    operator who alerts on ERROR lines is not paged by every restart a stalled client outlasts."""

    def reword(record: logging.LogRecord) -> bool:
        if record.msg == _SHUTDOWN_TIMEOUT_MESSAGE:
            record.levelno, record.levelname = logging.WARNING, logging.getLevelName(logging.WARNING)
            record.msg = "%s request(s) still unfinished after --shutdown-timeout %g s: answered 503"
            record.args = (*record.args[:1], seconds)
        return True

    log = logging.getLogger("uvicorn.error")
    log.addFilter(reword)
    try:
        yield
    finally:
        log.removeFilter(reword)


@contextlib.contextmanager
def cancelled_requests_unlogged() -> Iterator[None]:
    """Inside the block, uvicorn logs no error for a request cancelled by a forced quit."""
    with records_unlogged("uvicorn.error", raising(asyncio.CancelledError)):
        yield
