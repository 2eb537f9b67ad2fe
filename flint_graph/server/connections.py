"""Connection limits for `flint-graph serve` that uvicorn's own settings do not give: a time
limit on a request's headers and a cap on open connections.

Why. uvicorn times out an idle keep-alive connection, but not one that is still sending its
request line and headers. A hostile-input trial (2026-12-03) opened ~20,000 connections that
each sent half a request and stopped: none was ever closed, the server ran out of file
descriptors, every other client got nothing, and asyncio logged a traceback per failed accept
(110 MB of log in 25 s). Here a connection must finish a request's headers within
`header_timeout` seconds of opening (or of its previous response), and connections past
`max_connections` are closed as soon as they are accepted, so descriptors stay free and the
clients already connected keep being served; one client address may hold at most
`per_client` of them, so a single host cannot take every slot. The request body has its own
limit in the app (`create_app`'s body_timeout_s). Many addresses together can still fill the
cap: a public server belongs behind a reverse proxy that limits clients.

A request uvicorn cannot parse gets the API's JSON error (400 `bad_http_request`) instead of
uvicorn's plain text.

`guarded_protocol` subclasses the HTTP protocol class uvicorn would choose itself
(`uvicorn.protocols.http.auto.AutoHTTPProtocol`: httptools when installed, else h11) and is
passed as `uvicorn.Config(http=...)`.
"""

from __future__ import annotations

import asyncio
import resource

HEADER_TIMEOUT_S = 30.0  # to finish a request's line and headers
DESCRIPTORS_SPARE = 64  # left for the model's files, logs and the engine
# open connections from one client address: a second trial held all 1,000 slots from one
# address with a request every 28 s per connection (~36 requests/s), and a normal client waited
# 80 s; one address now holds at most this share. Clients behind one reverse proxy share it.
PER_CLIENT = 256


def default_max_connections() -> int:
    """Open connections the server accepts: 1,000, or fewer where the process may open fewer
    files (RLIMIT_NOFILE's soft limit minus DESCRIPTORS_SPARE, at least 16)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return 1000
    return max(16, min(1000, soft - DESCRIPTORS_SPARE))


def bad_request_bytes(reason: str) -> bytes:
    """The whole HTTP/1.1 400 response for a request uvicorn could not parse (`reason`, its
    words): the OpenAI error object the app gives every other error (type
    invalid_request_error, code bad_http_request), then the connection closes."""
    import json

    body = json.dumps({"error": {"message": f"malformed HTTP request: {reason}",
                                 "type": "invalid_request_error", "param": None,
                                 "code": "bad_http_request"}}).encode()
    head = (f"HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\nconnection: close\r\n\r\n")
    return head.encode("ascii") + body


def guarded_protocol(header_timeout: float = HEADER_TIMEOUT_S,
                     max_connections: int | None = None,
                     per_client: int = PER_CLIENT) -> type[asyncio.Protocol]:
    """uvicorn's HTTP protocol class with the header time limit and the connection caps, in
    all (None: `default_max_connections()`) and per client address. Raises ValueError for a
    limit that is not positive."""
    from collections import Counter

    from uvicorn.protocols.http.auto import AutoHTTPProtocol

    most = default_max_connections() if max_connections is None else max_connections
    if not header_timeout > 0 or most < 1 or per_client < 1:
        raise ValueError(f"header_timeout {header_timeout!r}, max_connections {most!r} and "
                         f"per_client {per_client!r}: expected positive values")
    by_client: Counter = Counter()  # open connections per address (one event loop)

    class GuardedHTTPProtocol(AutoHTTPProtocol):  # type: ignore[misc, valid-type]
        _refused = False
        _address = None
        _header_timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport):
            peer = transport.get_extra_info("peername")
            address = peer[0] if isinstance(peer, tuple) and peer else None
            if len(self.connections) >= most or by_client[address] >= per_client:
                self._refused = True  # closed at once: its descriptor is freed
                transport.abort()
                return
            self._address = address
            by_client[address] += 1
            super().connection_made(transport)
            self._arm()

        def connection_lost(self, exc):
            if self._refused:
                return
            by_client[self._address] -= 1
            if by_client[self._address] <= 0:
                del by_client[self._address]
            if self._header_timer is not None:
                self._header_timer.cancel()
            super().connection_lost(exc)

        def on_response_complete(self):
            super().on_response_complete()
            self._arm()  # the next request's headers get the same time

        def _arm(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
            # the request in progress when armed: a new one replaces `cycle` once its
            # headers are complete, and then the timer leaves the connection alone
            armed = self.cycle
            self._header_timer = self.loop.call_later(header_timeout, self._expire, armed)

        def send_400_response(self, msg: str) -> None:
            # uvicorn answers a request it cannot parse (a bad request line or header) as
            # plain text before the app sees it; clients of this API read JSON errors
            # (a bad-input trial, 2026-12-06)
            if self.transport.is_closing():
                return
            self.transport.write(bad_request_bytes(msg))
            self.transport.close()

        def _expire(self, armed) -> None:
            self._header_timer = None
            # `armed` may be a request already running (pipelined behind the last one): it
            # is left alone, and its response re-arms the timer
            idle = armed is None or getattr(armed, "response_complete", True)
            if self.cycle is armed and idle and not self.transport.is_closing():
                self.transport.close()

    return GuardedHTTPProtocol
