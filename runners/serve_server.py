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


@contextlib.contextmanager
def cancelled_requests_unlogged() -> Iterator[None]:
    """Inside the block, uvicorn logs no error for a request cancelled by a forced quit."""
    with records_unlogged("uvicorn.error", raising(asyncio.CancelledError)):
        yield
