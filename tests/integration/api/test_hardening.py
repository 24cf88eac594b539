"""Hostile requests against a real server: oversized and nested bodies, server errors, guarded reads."""

from __future__ import annotations

import logging

import httpx
import pytest
from pydantic import SecretStr

from source_backfill.api.app import create_app
from source_backfill.api.server import ApiServer
from source_backfill.runtime.registry import JobRegistry
from tests.integration.api.conftest import SOURCES, TOKEN, job_body

pytestmark = pytest.mark.integration


@pytest.fixture
def served(tmp_path):
    servers = []

    def make(**kw):
        registry = JobRegistry(tmp_path / f"state{len(servers)}", SOURCES)
        server = ApiServer(create_app(registry, SecretStr(TOKEN), **kw), "127.0.0.1", 0)
        server.start()
        servers.append((server, registry))
        return server, registry

    yield make
    for server, registry in servers:
        server.stop()
        registry.close()


AUTH = {"Authorization": f"Bearer {TOKEN}"}


def test_a_declared_body_over_the_limit_is_refused_before_it_is_read(served):
    server, registry = served(max_body_bytes=2048)
    body = job_body("big") | {"transform": "SELECT * FROM {source} -- " + "x" * 4000}
    r = httpx.post(f"{server.url}/jobs", json=body, headers=AUTH)
    assert r.status_code == 413
    assert r.json()["error"]["type"] == "body_too_large"
    assert registry.list() == []
    # The same job under the limit is accepted: the limit, not the content, refused it.
    assert httpx.post(f"{server.url}/jobs", json=job_body("small"), headers=AUTH).status_code == 201


def test_a_streamed_body_over_the_limit_is_refused(served):
    server, registry = served(max_body_bytes=2048)

    def chunks():
        yield b'{"name": "streamed", "source": "events", "sink_path": "/t/s", "transform": "'
        for _ in range(10):
            yield b"y" * 1000
        yield b'"}'

    headers = AUTH | {"Content-Type": "application/json"}
    r = httpx.post(f"{server.url}/jobs", content=chunks(), headers=headers)  # chunked: no Content-Length
    assert r.status_code == 413
    assert registry.list() == []


def test_deeply_nested_json_is_a_client_error_not_a_crash(served):
    server, registry = served()
    nested = "[" * 200_000 + "]" * 200_000
    r = httpx.post(f"{server.url}/jobs", content=nested, headers=AUTH | {"Content-Type": "application/json"})
    assert 400 <= r.status_code < 500
    assert "Traceback" not in r.text
    assert registry.list() == []


def test_a_server_error_names_an_id_never_the_exception_text(served, caplog, monkeypatch):
    server, registry = served()

    def boom(_name):
        msg = "secret detail /var/lib/state/jobs.log"
        raise RuntimeError(msg)

    monkeypatch.setattr(registry, "get", boom)
    with caplog.at_level(logging.ERROR, logger="source_backfill.api.app"):
        r = httpx.get(f"{server.url}/jobs/some", headers=AUTH)
    assert r.status_code == 500
    body = r.json()["error"]
    assert body["type"] == "internal_error"
    assert "secret detail" not in r.text
    assert "RuntimeError" not in r.text
    error_id = body["message"].split()[2].rstrip(";")
    assert any(error_id in rec.getMessage() for rec in caplog.records)  # the log has it, under that id


def test_guarded_reads_need_the_token_but_probes_do_not(served):
    server, _ = served(guard_reads=True)
    assert httpx.post(f"{server.url}/jobs", json=job_body("g"), headers=AUTH).status_code == 201
    for path in ("/jobs", "/jobs/g", "/metrics"):
        assert httpx.get(server.url + path).status_code == 401, path
        assert httpx.get(server.url + path, headers=AUTH).status_code == 200, path
    for path in ("/health", "/ready", "/live"):
        assert httpx.get(server.url + path).status_code == 200, path


def test_reads_are_open_by_default(served):
    server, _ = served()
    assert httpx.get(f"{server.url}/jobs").status_code == 200
    assert httpx.get(f"{server.url}/metrics").status_code == 200
