"""HTTP connections that never finish their request: closed at a deadline, and only so many at once.

    config = server_config(app, host="127.0.0.1", port=8765)   # jobs.server: what `trainforge server` and the tests run
    uvicorn.Server(config).run()

uvicorn closes a keep-alive connection that stays idle between requests (`timeout_keep_alive`, 5 s), but nothing
closes one that never completes a request: a client that connects and sends nothing, drips its headers a byte a
second, or sends its body slowly holds a connection (a file descriptor, a protocol object) for as long as it likes,
and a few hundred of them are as cheap to open as they are to keep. `DeadlineH11Protocol` is uvicorn's own h11
protocol (what `http="h11"` runs, and `"auto"` without httptools) with one rule added: from the moment a connection
is made, and from the first byte of each later request on it, the request, headers and body, must be fully received
within `request_timeout_s` (REQUEST_TIMEOUT_S); past it the server answers 408 and closes the connection. A request
being handled has no deadline here: once it is received, the app takes what it takes (a submission's check has caps
of its own). Connections still receiving a request ("partial") are at most `max_partial` (MAX_PARTIAL_CONNECTIONS)
per server: one more closes the oldest the same way, so a flood of them can neither exhaust the server's file
descriptors nor keep a normal client out, whose request over loopback arrives in milliseconds.

The deadline is a timer (`loop.call_later`) armed when a request begins and cancelled when h11 says the client is
done sending it (`their_state` leaves IDLE / SEND_BODY); the rest of the protocol is uvicorn's, unchanged.
"""
from __future__ import annotations

import asyncio
import weakref
from typing import Any, Optional

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

REQUEST_TIMEOUT_S = 10.0  # a 2 MiB submission (the body cap) needs 1.7 Mbit/s to arrive in time; loopback: ms
MAX_PARTIAL_CONNECTIONS = 128  # per server: a team's browsers and CLIs have a few requests in flight, not hundreds
_TIMED_OUT_BODY = b"request not received in time; send it again\n"
TIMED_OUT = (b"HTTP/1.1 408 Request Timeout\r\ncontent-type: text/plain; charset=utf-8\r\nconnection: close\r\n"
             b"content-length: %d\r\n\r\n%s" % (len(_TIMED_OUT_BODY), _TIMED_OUT_BODY))

# the connections of each server still receiving a request, oldest first (a dict keeps insertion order)
_partial: "weakref.WeakKeyDictionary[Any, dict[DeadlineH11Protocol, None]]" = weakref.WeakKeyDictionary()


class DeadlineH11Protocol(H11Protocol):
    """uvicorn's H11Protocol with a deadline on receiving each request and a bound on connections doing so."""

    request_timeout_s: float = REQUEST_TIMEOUT_S
    max_partial: int = MAX_PARTIAL_CONNECTIONS

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._deadline: Optional[asyncio.TimerHandle] = None
        self._first = True  # no request has begun on this connection yet: its deadline runs from the connection

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._watch()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        self._watch()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._watch()  # a pipelined request may have begun; or the connection now idles (uvicorn's keep-alive)

    def connection_lost(self, exc: Optional[Exception]) -> None:
        self._stop()
        super().connection_lost(exc)

    def _receiving(self) -> bool:
        """Is a request on this connection begun (or, on a new connection, due) and not yet fully received?"""
        state = self.conn.their_state
        if state is not h11.IDLE:
            self._first = False
        if state is h11.SEND_BODY:
            return True
        return state is h11.IDLE and (self._first or bool(self.conn.trailing_data[0]))

    def _watch(self) -> None:
        if self.transport.is_closing() or not self._receiving():
            self._stop()
            return
        if self._deadline is None:
            self._deadline = self.loop.call_later(self.request_timeout_s, self._expire)
            partial = _partial.setdefault(self.server_state, {})
            partial[self] = None
            while len(partial) > self.max_partial:
                next(iter(partial))._expire()  # the oldest: it leaves `partial` at once

    def _stop(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None
        partial = _partial.get(self.server_state)
        if partial is not None:
            partial.pop(self, None)

    def _expire(self) -> None:
        """408 (unless a response has begun) and close."""
        self._stop()
        if self.transport.is_closing():
            return
        answered = self.conn.their_state is not h11.IDLE and self.cycle is not None and self.cycle.response_started
        if not answered:  # (while headers are awaited, `cycle` is the previous request's, or None)
            self.transport.write(TIMED_OUT)
        self.transport.close()


def deadline_protocol(request_timeout_s: float = REQUEST_TIMEOUT_S,
                      max_partial: int = MAX_PARTIAL_CONNECTIONS) -> type[DeadlineH11Protocol]:
    """The protocol class to pass uvicorn as `http=`, with these limits."""
    return type("DeadlineH11Protocol", (DeadlineH11Protocol,),
                {"request_timeout_s": request_timeout_s, "max_partial": max_partial})
