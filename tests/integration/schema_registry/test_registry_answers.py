"""What a registry answers is input too: a subject's version listing that is not a list of version
numbers is refused naming what was asked (a real HTTP server giving each answer)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from connectors.schema_registry.client import RegistryClient
from source_backfill.errors import SchemaRegistryError

pytestmark = pytest.mark.integration

ANSWERS = [{"versions": [1]}, ["1"], [True], [1, None], "1", None, [[1]]]


@pytest.fixture
def answering() -> Iterator[tuple[str, list[object]]]:
    """A server answering every GET with the JSON of ``answer[0]``; its URL and that list."""
    answer: list[object] = [None]

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            body = json.dumps(answer[0]).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", answer
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize("bad", ANSWERS)
def test_a_version_listing_that_is_not_version_numbers_is_refused(answering, bad) -> None:
    url, answer = answering
    answer[0] = bad
    with RegistryClient(url, deadline_s=5) as client, \
            pytest.raises(SchemaRegistryError, match="the versions of subject 'orders-value'"):
        client.versions("orders-value")
