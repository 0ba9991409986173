"""uvicorn's h11 protocol as `dilstore serve` needs it: a deadline for every request, and JSON protocol errors.

**Deadline.** A request must arrive whole within --request-timeout seconds; one
whose headers came but not all of its body gets a 408 before the close.

uvicorn times out only the idle wait between two requests of a kept-alive
connection (`timeout_keep_alive`). A client that connects and sends nothing,
or stops halfway through its headers or its body, held its socket for as long
as it liked, and enough such clients use up the process's file descriptors,
after which the server accepts no one. The protocol below is uvicorn's h11
protocol with one timer added: it runs while the client still owes part of a
request and closes the connection when it expires. A request that has arrived
whole is never cut, however long its answer takes.

**Protocol errors.** A request h11 cannot parse (a malformed request line,
headers past h11's size limit) gets uvicorn's 400, but with the body every
other error of the server has, `{"detail": ...}` as JSON, not plain text.
"""

from __future__ import annotations

import asyncio
import json
import logging

import h11
from uvicorn.protocols.http.h11_impl import STATUS_PHRASES, H11Protocol

LOGGER = logging.getLogger("uvicorn.error")
# The client's h11 states while it owes part of a request: its headers (or a first byte of them), or its body.
OWING = (h11.IDLE, h11.SEND_BODY)


class ServeProtocol(H11Protocol):
    """The deadline runs from a connection's opening or a request's first bytes until the request is whole."""

    request_timeout: float  # seconds: set by serve_protocol
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

    def on_response_complete(self) -> None:
        """A request sent behind this one on the connection starts now: part of it may be here already, and
        no data may come to start the timer for it (an idle kept-alive connection is uvicorn's to time out)."""
        super().on_response_complete()
        state = self.conn.their_state
        if state is h11.SEND_BODY or (state is h11.IDLE and self.conn.trailing_data[0]):
            self._watch()

    def _watch(self) -> None:
        """Keep the timer running while the client owes part of a request, and only then."""
        if self.conn.their_state not in OWING:
            self._stop_watching()
        elif self.deadline is None:
            self.deadline = self.loop.call_later(self.request_timeout, self._expire)

    def _stop_watching(self) -> None:
        if self.deadline is not None:
            self.deadline.cancel()
            self.deadline = None

    def _expire(self) -> None:
        """Close the connection of a request overdue; one whose headers came, missing part of its body, first gets a
        408 saying why (a client or proxy saw an empty reply)."""
        self.deadline = None
        if self.conn.their_state in OWING and not self.transport.is_closing():
            client = "%s:%d" % self.client if self.client else "a client"
            LOGGER.warning(
                "closed the connection of %s: its request did not arrive whole within %g s (--request-timeout)",
                client, self.request_timeout,
            )  # fmt: skip
            if self.conn.their_state is h11.SEND_BODY and self.conn.our_state is h11.SEND_RESPONSE:
                self._send_error(408, f"the request did not arrive whole within {self.request_timeout:g} s "
                                      "(--request-timeout)")  # fmt: skip
            self.transport.close()

    def send_400_response(self, msg: str) -> None:
        """uvicorn's answer to a request h11 cannot parse (then it closes), with a JSON body."""
        self._send_error(400, msg)
        self.transport.close()

    def _send_error(self, status: int, message: str) -> None:
        """An error answer with the JSON body every error of the server has, on a connection that then closes.

        h11 sends no body after the headers of an answer to HEAD (the request line parsed, the body did not):
        the headers go alone, where uvicorn's own version raised out of the protocol, a traceback in the log.
        """
        body = json.dumps({"detail": message}).encode()
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"connection", b"close"),
        ]
        try:
            for event in (
                h11.Response(status_code=status, headers=headers, reason=STATUS_PHRASES[status]),
                h11.Data(data=body),
                h11.EndOfMessage(),
            ):
                self.transport.write(self.conn.send(event) or b"")
        except h11.LocalProtocolError:
            pass  # what h11 refused to send (a body to HEAD) is not sent; the connection closes all the same


def serve_protocol(seconds: float) -> type[ServeProtocol]:
    """uvicorn's h11 protocol with a request deadline of `seconds` and JSON protocol errors (module docstring)."""
    return type("ServeProtocol", (ServeProtocol,), {"request_timeout": seconds})
