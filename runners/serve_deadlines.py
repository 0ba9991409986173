"""A deadline for every request `dilstore serve` reads: it must arrive whole within --request-timeout seconds.

uvicorn times out only the idle wait between two requests of a kept-alive
connection (`timeout_keep_alive`). A client that connects and sends nothing,
or stops halfway through its headers or its body, held its socket for as long
as it liked, and enough such clients use up the process's file descriptors,
after which the server accepts no one. The protocol below is uvicorn's h11
protocol with one timer added: it runs while the client still owes part of a
request and closes the connection when it expires. A request that has arrived
whole is never cut, however long its answer takes.
"""

from __future__ import annotations

import asyncio
import logging

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

LOGGER = logging.getLogger("uvicorn.error")
# The client's h11 states while it owes part of a request: its headers (or a first byte of them), or its body.
OWING = (h11.IDLE, h11.SEND_BODY)


def request_deadline_protocol(seconds: float) -> type[H11Protocol]:
    """uvicorn's h11 protocol that closes a connection whose request is not whole `seconds` after it began."""

    class RequestDeadlineProtocol(H11Protocol):
        """Arms the timer when a connection opens or a request's first bytes arrive; stops it once it is whole."""

        deadline: asyncio.TimerHandle | None = None

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._watch()

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            self._watch()

        def connection_lost(self, exc: Exception | None) -> None:
            self._stop_watching()
            super().connection_lost(exc)

        def _watch(self) -> None:
            """Keep the timer running while the client owes part of a request, and only then."""
            if self.conn.their_state not in OWING:
                self._stop_watching()
            elif self.deadline is None:
                self.deadline = self.loop.call_later(seconds, self._expire)

        def _stop_watching(self) -> None:
            if self.deadline is not None:
                self.deadline.cancel()
                self.deadline = None

        def _expire(self) -> None:
            self.deadline = None
            if self.conn.their_state in OWING and not self.transport.is_closing():
                client = "%s:%d" % self.client if self.client else "a client"
                LOGGER.warning(
                    "closed the connection of %s: its request did not arrive whole within %g s (--request-timeout)",
                    client, seconds,
                )  # fmt: skip
                self.transport.close()

    return RequestDeadlineProtocol
