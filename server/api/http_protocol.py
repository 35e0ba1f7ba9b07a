"""HTTP/1.1 connections that cannot be held open by sending nothing: a header-read timeout.

uvicorn closes idle keep-alive connections, but a client that opens a connection and trickles
its request line and headers a byte at a time holds a connection (and a slot of every limit)
forever. This protocol gives each request `HEADER_TIMEOUT_SECONDS` from its first byte (or from
the connection's opening) to finish its headers, then closes the connection. Bodies have their
own deadline (`server.api.http_body`).
"""

from __future__ import annotations

import asyncio

from uvicorn.protocols.http.h11_impl import H11Protocol

HEADER_TIMEOUT_SECONDS = 10.0


class HeaderTimeoutProtocol(H11Protocol):
    """uvicorn's h11 protocol with a deadline on reading each request's headers."""

    header_timeout = HEADER_TIMEOUT_SECONDS
    _header_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def data_received(self, data: bytes) -> None:
        if self._waiting_for_headers():
            self._arm()
        super().data_received(data)
        if not self._waiting_for_headers():
            self._disarm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _waiting_for_headers(self) -> bool:
        return self.cycle is None or self.cycle.response_complete

    def _arm(self) -> None:
        if self._header_timer is None:
            self._header_timer = self.loop.call_later(self.header_timeout, self._expired)

    def _disarm(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _expired(self) -> None:
        self._header_timer = None
        if self._waiting_for_headers() and not self.transport.is_closing():
            self.transport.close()
