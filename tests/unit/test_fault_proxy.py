"""The fault-injecting TCP proxy of the broker-fault tests, against a loopback echo server."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import pytest

from tests.fixtures.proxy import FaultyProxy


@pytest.fixture
def proxy() -> Iterator[FaultyProxy]:
    server = socket.create_server(("127.0.0.1", 0))

    def echo() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            threading.Thread(target=lambda c=conn: _echo(c), daemon=True).start()

    threading.Thread(target=echo, daemon=True).start()
    p = FaultyProxy("127.0.0.1", server.getsockname()[1]).start()
    yield p
    p.stop()
    server.close()


def _echo(conn: socket.socket) -> None:
    with conn:
        try:
            while data := conn.recv(4096):
                conn.sendall(data)
        except OSError:
            pass


def _client(proxy: FaultyProxy) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", proxy.port), timeout=5)
    sock.sendall(b"hello")
    assert sock.recv(16) == b"hello"
    return sock


def test_forwards_and_delays_each_chunk(proxy):
    sock = _client(proxy)
    proxy.latency(0.3)
    t0 = time.monotonic()
    sock.sendall(b"slow")
    assert sock.recv(16) == b"slow"
    assert time.monotonic() - t0 >= 0.6  # one chunk each way
    sock.close()


def test_reset_aborts_connections_with_an_rst(proxy):
    sock = _client(proxy)
    assert proxy.reset() == 1
    with pytest.raises(ConnectionResetError):  # an RST, not an orderly close (recv would return b"")
        sock.sendall(b"x")
        sock.recv(16)
    _client(proxy).close()  # new connections work


def test_blackhole_holds_everything_until_it_ends(proxy):
    sock = _client(proxy)
    proxy.blackhole(True)
    sock.sendall(b"held")
    sock.settimeout(0.5)
    with pytest.raises(TimeoutError):
        sock.recv(16)
    late = socket.create_connection(("127.0.0.1", proxy.port), timeout=5)  # accepted, but silent too
    late.sendall(b"late")
    proxy.blackhole(False)
    sock.settimeout(5)
    assert sock.recv(16) == b"held"
    assert late.recv(16) == b"late"
    sock.close()
    late.close()
