"""Serve the control API with uvicorn in a daemon thread of the daemon process."""

from __future__ import annotations

import logging
import socket
import threading
import time
from typing import Any

import uvicorn

from source_backfill.errors import SourceBackfillError

logger = logging.getLogger(__name__)


class ApiServerError(SourceBackfillError):
    """The API server could not start (port in use, bad host, or it died while starting)."""


class ApiServer:
    """uvicorn in a daemon thread; ``port=0`` binds a free port, readable as :attr:`port` after start."""

    def __init__(
        self, app: Any, host: str = "127.0.0.1", port: int = 8080, *, log_level: str = "warning"
    ) -> None:
        self.app = app
        self.host = host
        self.port = port
        self._config = uvicorn.Config(app, host=host, port=port, log_level=log_level, lifespan="off",
                                      access_log=False)
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
            msg = "API server already started"
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
            msg = f"cannot bind the API to {self.host}:{self.port}: {exc}"
            raise ApiServerError(msg) from exc
        sock.set_inheritable(True)
        self._socket = sock
        self.port = sock.getsockname()[1]
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [sock]}, name="api-server", daemon=True
        )
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while not self._server.started:
            if not self._thread.is_alive():
                msg = f"API server on {self.url} exited while starting"
                raise ApiServerError(msg)
            if time.monotonic() > deadline:
                self.stop()
                msg = f"API server on {self.url} did not start within {timeout_s}s"
                raise ApiServerError(msg)
            time.sleep(0.01)
        logger.info('API listening url="%s"', self.url)

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
        logger.info('API stopped url="%s"', self.url)

    def __enter__(self) -> ApiServer:
        self.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.stop()
