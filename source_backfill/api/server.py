"""Serve the control API with uvicorn in a daemon thread of the daemon process.

uvicorn bounds neither how long a client may take to send its request's headers nor how many connections
may stay open: :class:`GuardedH11Protocol` adds both (:class:`ServerLimits`), so a slow or idle client
(slowloris; a few hundred idle sockets) cannot hold the daemon's connections and file descriptors.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import threading
import time
from dataclasses import dataclass
from typing import Any, ClassVar

import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from source_backfill.errors import SourceBackfillError

logger = logging.getLogger(__name__)


class ApiServerError(SourceBackfillError):
    """The API server could not start (port in use, bad host, or it died while starting)."""


@dataclass(frozen=True)
class ServerLimits:
    """How long a client may take to send a request, and how many connections may be open at once."""

    #: Seconds from a connection's opening (or its last response) to its next request's complete headers.
    header_timeout_s: float = 5.0
    #: Seconds from a request's complete headers to the end of its body.
    body_timeout_s: float = 30.0
    #: Seconds an idle keep-alive connection stays open (uvicorn's ``timeout_keep_alive``).
    keep_alive_timeout_s: float = 5.0
    #: Open connections at most: a new one beyond it closes the one that has waited longest for the client
    #: (for its request's headers or body), or is closed itself with a 503 when the daemon is working on
    #: a request on every open connection.
    max_connections: int = 100
    #: A request line and headers still incomplete past this many bytes: 400 and the connection closed
    #: (h11's limit on what it holds unparsed).
    max_header_bytes: int = 16 * 1024


class _Connections:
    """One server's open connections, and those waiting for their client (headers or body), oldest first."""

    def __init__(self, limits: ServerLimits) -> None:
        self.limits = limits
        self.open: set[GuardedH11Protocol] = set()
        self.waiting: dict[GuardedH11Protocol, None] = {}  # insertion-ordered: the oldest first
        self.refused = 0
        self.evicted = 0
        self.timed_out = 0


class GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with header and body timeouts and a bound on open connections.

    A timer starts when the connection opens and again after each response; a request's complete headers
    stop it (and start the body's timer when a body follows), and if it fires first the connection is
    closed, whatever partial request it holds. A connection opened while
    :attr:`ServerLimits.max_connections` are open closes the connection that has waited longest for its
    client's headers or body (an idle or slow one: a real client sends its request at once) or, when the
    daemon is working on a request on every connection, is closed itself with a 503.
    """

    #: Set on the subclass :func:`guarded_protocol` makes for each server.
    tracker: ClassVar[_Connections]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._timer: asyncio.TimerHandle | None = None
        self._awaiting: str | None = None  # "headers", "body" or None (inside the app, or closed)
        self._admitted = False

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        """Admit the connection (making room if needed) and start its header timer."""
        book = self.tracker
        if len(book.open) >= book.limits.max_connections:
            oldest = next(iter(book.waiting), None)
            if oldest is None:
                book.refused += 1
                logger.warning("connection refused: %d open, the daemon working on a request on each",
                               len(book.open))
                transport.write(_BUSY)
                transport.close()
                return
            book.evicted += 1
            oldest.expire()
        self._admitted = True
        book.open.add(self)
        super().connection_made(transport)
        self._await_headers()

    def connection_lost(self, exc: Exception | None) -> None:
        """Forget the connection (a refused one was never admitted)."""
        if not self._admitted:
            return
        self._stop_timer()
        self.tracker.open.discard(self)
        super().connection_lost(exc)

    def handle_events(self) -> None:
        """Let uvicorn parse; a new request cycle means its headers are complete, ``more_body`` its body."""
        cycle = self.cycle
        super().handle_events()
        if self.cycle is not cycle and self.cycle is not None:  # a request's headers are complete
            self._stop_timer()
            if self.cycle.more_body:
                self._start_timer("body", self.tracker.limits.body_timeout_s)
        elif self._awaiting == "body" and self.cycle is not None and not self.cycle.more_body:
            self._stop_timer()

    def on_response_complete(self) -> None:
        """The next request's headers are due within the timeout too (a keep-alive slowloris)."""
        if not self.transport.is_closing():
            self._await_headers()  # before uvicorn handles a pipelined request, which stops the timer
        super().on_response_complete()

    def expire(self) -> None:
        """Close the connection: its request is late, or a new connection needs its place."""
        self._stop_timer()
        if self.transport.is_closing():
            return
        try:
            self.conn.send(h11.ConnectionClosed())
        except h11.LocalProtocolError:
            pass
        self.transport.close()

    def _late(self) -> None:
        self.tracker.timed_out += 1
        self.expire()

    def _await_headers(self) -> None:
        self._stop_timer()
        self._start_timer("headers", self.tracker.limits.header_timeout_s)

    def _start_timer(self, awaiting: str, timeout_s: float) -> None:
        self._awaiting = awaiting
        self._timer = self.loop.call_later(timeout_s, self._late)
        self.tracker.waiting[self] = None  # waiting for the client: the first to make room

    def _stop_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._awaiting = None
        self.tracker.waiting.pop(self, None)


_BUSY_BODY = b'{"error": {"type": "too_many_connections", "message": "too many open connections"}}'
_BUSY = (b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nconnection: close\r\n"
         b"content-length: %d\r\n\r\n%s" % (len(_BUSY_BODY), _BUSY_BODY))


def guarded_protocol(limits: ServerLimits) -> type[GuardedH11Protocol]:
    """A protocol class of its own for one server: its connections are counted apart from others'."""
    return type("GuardedH11Protocol", (GuardedH11Protocol,), {"tracker": _Connections(limits)})


class ApiServer:
    """uvicorn in a daemon thread; ``port=0`` binds a free port, readable as :attr:`port` after start."""

    def __init__(
        self, app: Any, host: str = "127.0.0.1", port: int = 8080, *, log_level: str = "warning",
        limits: ServerLimits | None = None, name: str = "API",
    ) -> None:
        self.app = app
        self.name = name
        self.host = host
        self.port = port
        self.limits = limits or ServerLimits()
        self.protocol = guarded_protocol(self.limits)
        self._config = uvicorn.Config(
            app, host=host, port=port, log_level=log_level, lifespan="off", access_log=False,
            http=self.protocol, ws="none", h11_max_incomplete_event_size=self.limits.max_header_bytes,
            timeout_keep_alive=self.limits.keep_alive_timeout_s,  # type: ignore[arg-type] # a float works
        )
        self._server = uvicorn.Server(self._config)
        self._thread: threading.Thread | None = None
        self._socket: socket.socket | None = None

    @property
    def url(self) -> str:
        """The base URL (``http://host:port``) clients use."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def start(self, timeout_s: float = 15.0) -> None:
        """Bind, start serving, and return once the server accepts connections."""
        if self._thread is not None:
            msg = f"{self.name} server already started"
            raise ApiServerError(msg)
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        # proto=IPPROTO_TCP, not 0: asyncio sets TCP_NODELAY only on connections accepted from a socket that
        # says it is TCP. Without it every response (headers and body written apart) waited out Nagle and
        # the client's delayed ACK: ~40 ms a request on loopback.
        sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((self.host, self.port))
        except OSError as exc:
            sock.close()
            msg = f"cannot bind the {self.name} to {self.host}:{self.port}: {exc}"
            raise ApiServerError(msg) from exc
        sock.set_inheritable(True)
        self._socket = sock
        self.port = sock.getsockname()[1]
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [sock]}, name=f"{self.name.lower()}-server",
            daemon=True,
        )
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while not self._server.started:
            if not self._thread.is_alive():
                msg = f"{self.name} server on {self.url} exited while starting"
                raise ApiServerError(msg)
            if time.monotonic() > deadline:
                self.stop()
                msg = f"{self.name} server on {self.url} did not start within {timeout_s}s"
                raise ApiServerError(msg)
            time.sleep(0.01)
        logger.info('%s listening url="%s"', self.name, self.url)

    def stop(self, timeout_s: float = 10.0) -> None:
        """Ask uvicorn to exit after in-flight requests and wait for its thread."""
        thread = self._thread
        if thread is None:
            return
        self._server.should_exit = True
        thread.join(timeout_s)
        if thread.is_alive():
            self._server.force_exit = True
            thread.join(timeout_s)
        if self._socket is not None:
            self._socket.close()
            self._socket = None
        self._thread = None
        logger.info('%s stopped url="%s"', self.name, self.url)

    def __enter__(self) -> ApiServer:
        self.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.stop()
