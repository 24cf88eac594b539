"""Attacks on the control plane, each against a real uvicorn server: a page that rebinds its DNS name to the
daemon (foreign Host), a page that posts to it (foreign Origin, cross-site fetch, a text/plain "simple"
request), a client that never finishes its headers (slowloris), hundreds of idle connections, and what an
error or a log line could give away (the token, the daemon's paths).
"""

from __future__ import annotations

import asyncio
import json
import socket
import struct
import threading
import time

import httpx
import pytest
from pydantic import SecretStr

from source_backfill.api.app import create_app
from source_backfill.api.server import ApiServer, ServerLimits
from source_backfill.config import JobSpec
from source_backfill.runtime.registry import JobRegistry
from tests.integration.api.conftest import SOURCES, TOKEN, job_body

pytestmark = pytest.mark.integration

AUTH = {"Authorization": f"Bearer {TOKEN}"}

#: Every route but the probes, as a browser page would reach it (reads and mutations).
ROUTES = [
    ("GET", "/health", None), ("GET", "/jobs", None), ("GET", "/jobs/j", None), ("GET", "/metrics", None),
    ("GET", "/openapi.json", None), ("GET", "/docs", None), ("GET", "/ui", None), ("GET", "/ui.js", None),
    ("POST", "/jobs", job_body("x")), ("POST", "/jobs/j/pause", None), ("POST", "/jobs/j/resume", None),
    ("POST", "/jobs/j/retry", None), ("PATCH", "/jobs/j", {"rate_limit": 1.0}), ("DELETE", "/jobs/j", None),
]
MUTATIONS = [r for r in ROUTES if r[0] != "GET"]
ROUTE_IDS = [f"{m} {p}" for m, p, _ in ROUTES]
MUTATION_IDS = [f"{m} {p}" for m, p, _ in MUTATIONS]


@pytest.fixture
def served(tmp_path):
    """``served(**create_app kwargs)`` -> (server, registry) with a failed job ``j`` (so retry acts)."""
    made = []

    def make(**kw):
        registry = JobRegistry(tmp_path / f"state{len(made)}", SOURCES)
        registry.create(JobSpec(name="j", source="events", sink_path="/tables/j"))
        registry.set_failed("j", "boom")
        kw.setdefault("token", None)
        server = ApiServer(create_app(registry, kw.pop("token"), **kw), "127.0.0.1", 0)
        server.start()
        made.append((server, registry))
        return server, registry

    yield make
    for server, registry in made:
        server.stop()
        registry.close()


def state(registry: JobRegistry) -> tuple[list, bytes]:
    """What a refused request must not change: the jobs and the mutation log's bytes."""
    return registry.list(), registry.path.read_bytes()


def host_of(server: ApiServer) -> str:
    return f"127.0.0.1:{server.port}"


def send(server: ApiServer, method: str, path: str, body: dict | None, headers: dict[str, str]):
    with httpx.Client(base_url=server.url, timeout=10) as client:
        return client.request(method, path, json=body, headers=headers)


# -- Host: DNS rebinding ---------------------------------------------------------------------------------
@pytest.mark.parametrize(("method", "path", "body"), ROUTES, ids=ROUTE_IDS)
@pytest.mark.parametrize("with_token", [False, True], ids=["no-token", "token"])
def test_a_rebound_dns_name_is_refused_on_every_route(served, method, path, body, with_token):
    """evil.com resolving to 127.0.0.1: the browser connects to the daemon but names evil.com as the Host."""
    server, registry = served(token=SecretStr(TOKEN) if with_token else None)
    before = state(registry)
    for host in ("evil.com", f"evil.com:{server.port}", "127.0.0.1.evil.com", "localhost.evil.com:80"):
        headers = {"Host": host} | (AUTH if with_token else {})
        r = send(server, method, path, body, headers)
        assert r.status_code == 421, (host, r.status_code, r.text)
        assert r.json() == {"error": {"type": "host_not_allowed", "message": r.json()["error"]["message"]}}
    assert state(registry) == before


@pytest.mark.parametrize("host", ["", "127.0.0.1:80:80", "evil.com@127.0.0.1", "127.0.0.1/x", "::1",
                                  "[::1", "127.0.0.1:port", "*", "127.0.0.1, evil.com"])
def test_a_malformed_host_is_refused(served, host):
    server, _ = served()
    assert send(server, "GET", "/jobs", None, {"Host": host}).status_code == 421


def test_loopback_names_are_served_on_any_port(served):
    server, _ = served()
    for host in ("localhost", f"localhost:{server.port}", "LOCALHOST:1", "127.0.0.1", "127.0.0.1:8",
                 f"[::1]:{server.port}", "[::1]", "localhost."):
        assert send(server, "GET", "/jobs", None, {"Host": host}).status_code == 200, host


def test_the_probes_answer_whatever_the_host(served):
    """Kubernetes probes name the pod's IP address, which no allow-list knows in advance."""
    server, _ = served()
    for path in ("/live", "/ready"):
        for host in ("10.1.2.3:8080", "evil.com", ""):
            assert send(server, "GET", path, None, {"Host": host}).status_code == 200, (path, host)


def test_configured_hosts_are_served_and_others_are_not(served):
    server, _ = served(allowed_hosts=("localhost", "api.example.com", "*.svc.cluster.local", "10.0.0.7"))
    for host in ("api.example.com", "API.example.com:443", "sb.ns.svc.cluster.local:8080", "10.0.0.7:8080"):
        assert send(server, "GET", "/jobs", None, {"Host": host}).status_code == 200, host
    for host in ("example.com", "evilapi.example.com", "svc.cluster.local", "127.0.0.1", "10.0.0.8"):
        assert send(server, "GET", "/jobs", None, {"Host": host}).status_code == 421, host


def test_a_star_serves_any_host_when_the_operator_says_so(served):
    server, _ = served(allowed_hosts=("*",))
    assert send(server, "GET", "/jobs", None, {"Host": "anything.example:1"}).status_code == 200


# -- Origin, Sec-Fetch-Site, Content-Type: cross-site request forgery --------------------------------------
@pytest.mark.parametrize(("method", "path", "body"), MUTATIONS, ids=MUTATION_IDS)
@pytest.mark.parametrize("with_token", [False, True], ids=["no-token", "token"])
def test_a_mutation_from_a_foreign_origin_is_refused(served, method, path, body, with_token):
    server, registry = served(token=SecretStr(TOKEN) if with_token else None)
    before = state(registry)
    port = server.port
    for origin in ("http://evil.com", "null", f"http://evil.com:{port}", f"http://127.0.0.1:{port + 1}",
                   f"http://localhost:{port}", "https://127.0.0.1", f"http://127.0.0.1:{port}/x", "garbage"):
        headers = {"Origin": origin} | (AUTH if with_token else {})
        r = send(server, method, path, body, headers)
        assert r.status_code == 403, (origin, r.status_code, r.text)
        assert r.json()["error"]["type"] == "cross_origin"
    assert state(registry) == before


@pytest.mark.parametrize(("method", "path", "body"), MUTATIONS, ids=MUTATION_IDS)
def test_a_mutation_a_browser_calls_cross_site_is_refused_without_an_origin(served, method, path, body):
    server, registry = served()
    before = state(registry)
    for site in ("cross-site", "same-site", "Cross-Site"):
        r = send(server, method, path, body, {"Sec-Fetch-Site": site})
        assert r.status_code == 403, (site, r.text)
    assert state(registry) == before


@pytest.mark.parametrize(("method", "path"), [("POST", "/jobs/j/pause"), ("POST", "/jobs/j/resume"),
                                              ("POST", "/jobs/j/retry"), ("DELETE", "/jobs/j"),
                                              ("PATCH", "/jobs/j"), ("POST", "/jobs")])
@pytest.mark.parametrize("content_type", [
    "text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x",
    "text/plain; a=application/json",
])
def test_a_form_post_is_refused(served, method, path, content_type):
    """What an HTML form sends cross-site without a preflight: a "simple" content type, body or none."""
    server, registry = served()
    before = state(registry)
    body = json.dumps(job_body("x") if path == "/jobs" else {"rate_limit": 1.0})
    for content in (body, ""):
        with httpx.Client(base_url=server.url, timeout=10) as client:
            r = client.request(method, path, content=content, headers={"Content-Type": content_type})
        assert r.status_code == 415, (content, r.status_code, r.text)
        assert r.json()["error"]["type"] == "unsupported_media_type"
    assert state(registry) == before


def test_a_body_without_a_content_type_is_refused(served):
    server, registry = served()
    before = state(registry)
    with httpx.Client(base_url=server.url, timeout=10) as client:
        r = client.post("/jobs", content=json.dumps(job_body("x")).encode())
    assert r.status_code == 415
    assert state(registry) == before


def test_the_status_page_s_own_calls_are_accepted(served):
    """Same origin, as ui.js sends them: Origin of the page, Sec-Fetch-Site same-origin, JSON bodies."""
    server, registry = served(token=SecretStr(TOKEN))
    page = {"Origin": f"http://127.0.0.1:{server.port}", "Sec-Fetch-Site": "same-origin"} | AUTH
    assert send(server, "POST", "/jobs/j/retry", None, page).status_code == 202
    assert send(server, "POST", "/jobs/j/pause", None, page).status_code == 202
    assert send(server, "PATCH", "/jobs/j", {"rate_limit": 5.0}, page).status_code == 202
    local = page | {"Host": f"localhost:{server.port}", "Origin": f"http://localhost:{server.port}"}
    assert send(server, "POST", "/jobs/j/resume", None, local).status_code == 202
    record = registry.get("j")
    assert (record.paused, record.rate_limit, record.error) == (False, 5.0, None)
    with httpx.Client(base_url=server.url, timeout=10) as client:  # a client that is no browser: no Origin
        r = client.post("/jobs", json=job_body("k"), headers=AUTH)
        assert r.status_code == 201, r.text
        json_type = {"Content-Type": "application/json"}
        assert client.post("/jobs/k/pause", headers=AUTH | json_type).status_code == 202
    assert send(server, "GET", "/jobs", None, {"Origin": "http://evil.com"}).status_code == 200  # reads: CORS


def test_behind_a_tls_proxy_the_public_origin_is_same_origin(served):
    server, registry = served(allowed_hosts=("api.example.com",))
    proxied = {"Host": "api.example.com", "Origin": "https://api.example.com"}
    assert send(server, "POST", "/jobs/j/pause", None, proxied).status_code == 202
    assert send(server, "POST", "/jobs/j/resume", None, proxied | {"Origin": "https://api.example.com:8443"}
                ).status_code == 403


def test_allowed_hosts_are_configured_typed_and_checked(monkeypatch):
    from source_backfill.config import load_settings
    from source_backfill.errors import ConfigError

    assert load_settings().api.served_hosts == ("localhost", "127.0.0.1", "::1")
    monkeypatch.setenv("SOURCE_BACKFILL_API__TOKEN", "t0ken")
    monkeypatch.setenv("SOURCE_BACKFILL_API__HOST", "0.0.0.0")  # noqa: S104 - a wildcard names no host
    monkeypatch.setenv("SOURCE_BACKFILL_API__ALLOWED_HOSTS", '["API.example.com", "*.svc.cluster.local"]')
    api = load_settings().api
    assert api.served_hosts == ("localhost", "127.0.0.1", "::1", "api.example.com", "*.svc.cluster.local")
    monkeypatch.setenv("SOURCE_BACKFILL_API__HOST", "10.0.0.7")
    assert "10.0.0.7" in load_settings().api.served_hosts
    for bad in ('["https://api.example.com"]', '["api.example.com:8080"]', '["a b"]', '[""]'):
        monkeypatch.setenv("SOURCE_BACKFILL_API__ALLOWED_HOSTS", bad)
        with pytest.raises(ConfigError, match="allowed_hosts"):
            load_settings()


# -- connections: slowloris, idle sockets ------------------------------------------------------------------
def raw_socket(server: ApiServer) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=10)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # no TIME_WAIT pile-up
    return sock


def closed_by_server(sock: socket.socket, within_s: float, trickle: bytes = b"") -> float | None:
    """Seconds until the server closed ``sock`` (sending ``trickle`` every 0.2 s meanwhile), None if not."""
    started = time.monotonic()
    sock.settimeout(0.2)
    while time.monotonic() - started < within_s:
        try:
            if trickle:
                sock.sendall(trickle)
            data = sock.recv(65536)
        except TimeoutError:
            continue
        except (ConnectionResetError, BrokenPipeError):
            return time.monotonic() - started
        if data == b"":
            return time.monotonic() - started
    return None


@pytest.fixture
def limited(tmp_path):
    """``limited(**ServerLimits kwargs)`` -> a server with those limits."""
    made = []

    def make(**limits):
        registry = JobRegistry(tmp_path / f"state{len(made)}", SOURCES)
        server = ApiServer(create_app(registry), "127.0.0.1", 0, limits=ServerLimits(**limits))
        server.start()
        made.append((server, registry))
        return server

    yield make
    for server, registry in made:
        server.stop()
        registry.close()


def test_a_slowloris_is_closed_within_the_header_timeout(limited):
    """Headers sent a byte at a time, never finished: the connection is closed once the timeout is up."""
    server = limited(header_timeout_s=1.0)
    with raw_socket(server) as sock:
        sock.sendall(b"GET /jobs HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
        took = closed_by_server(sock, within_s=6.0, trickle=b"a")
    assert took is not None, "the server kept a connection whose headers never ended"
    assert 0.8 <= took <= 3.0, took
    assert httpx.get(f"{server.url}/live").status_code == 200


def test_an_idle_connection_is_closed_within_the_header_timeout(limited):
    server = limited(header_timeout_s=1.0)
    with raw_socket(server) as sock:
        took = closed_by_server(sock, within_s=6.0)
    assert took is not None and took <= 3.0, took


def test_a_keep_alive_slowloris_is_closed_too(limited):
    """The second request on a kept-alive connection has to finish its headers in time as well."""
    server = limited(header_timeout_s=1.0, keep_alive_timeout_s=60.0)
    with raw_socket(server) as sock:
        sock.sendall(b"GET /live HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        assert b"200 OK" in sock.recv(65536)
        sock.sendall(b"GET /live HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
        took = closed_by_server(sock, within_s=6.0, trickle=b"a")
    assert took is not None and took <= 3.0, took


def test_a_body_that_never_arrives_is_cut_off(limited):
    server = limited(body_timeout_s=1.0)
    with raw_socket(server) as sock:
        sock.sendall(b"POST /jobs HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 1000\r\n\r\n{")
        took = closed_by_server(sock, within_s=6.0, trickle=b" ")
    assert took is not None and took <= 3.0, took


def test_oversized_headers_are_refused_and_the_connection_closed(limited):
    """Headers still not complete past max_header_bytes (h11 measures what it buffers unparsed)."""
    server = limited(max_header_bytes=4096)
    with raw_socket(server) as sock:
        sock.sendall(b"GET /jobs HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: " + b"a" * 8192)
        answer = sock.recv(65536)
        assert answer.startswith(b"HTTP/1.1 400"), answer[:100]
        assert closed_by_server(sock, within_s=3.0) is not None


def test_two_host_headers_are_refused(limited):
    """Which one would a proxy have checked? h11 refuses the request (400); the guard trusts neither."""
    server = limited()
    for hosts in ((b"evil.com", b"127.0.0.1"), (b"127.0.0.1", b"evil.com"), (b"127.0.0.1", b"127.0.0.1")):
        with raw_socket(server) as sock:
            sock.sendall(b"GET /jobs HTTP/1.1\r\nHost: %s\r\nHost: %s\r\nConnection: close\r\n\r\n" % hosts)
            answer = b""
            while chunk := sock.recv(65536):
                answer += chunk
        assert answer.split(b" ", 2)[1] in (b"400", b"421"), answer[:200]


def test_three_hundred_idle_connections_do_not_lock_the_api_out(limited):
    """Idle sockets are bounded (the oldest make room), so the daemon keeps its file descriptors and a
    real client is answered at once, long before any of them times out."""
    server = limited(max_connections=50, header_timeout_s=30.0)
    socks = [raw_socket(server) for _ in range(300)]
    try:
        started = time.monotonic()
        r = httpx.get(f"{server.url}/jobs", timeout=10)
        assert r.status_code == 200
        assert time.monotonic() - started < 5.0
        closed = sum(closed_by_server(s, within_s=0.05) is not None for s in socks)
        assert closed >= 300 - 50, f"only {closed} of 300 idle connections closed: the server holds the rest"
        assert len(server.protocol.tracker.open) <= 50
    finally:
        for s in socks:
            s.close()


def test_trickling_bodies_make_room_for_a_real_client(limited):
    """Connections whose body never comes wait for their client: the oldest makes room, like idle ones."""
    server = limited(max_connections=3, body_timeout_s=60.0)
    slow = [raw_socket(server) for _ in range(3)]
    try:
        for sock in slow:
            sock.sendall(b"POST /jobs HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                         b"Content-Length: 100\r\n\r\n{")
        time.sleep(0.3)
        assert httpx.get(f"{server.url}/jobs", timeout=10).status_code == 200
        assert closed_by_server(slow[0], within_s=1.0) is not None  # the oldest made room
    finally:
        for s in slow:
            s.close()


def test_when_the_daemon_works_on_every_connection_a_new_one_gets_503(tmp_path):
    """Only connections waiting for their client make room; requests in progress are not cut off."""
    release = threading.Event()

    async def busy_app(scope, receive, send):
        await asyncio.to_thread(release.wait, 10)
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"4")]})
        await send({"type": "http.response.body", "body": b"done"})

    with ApiServer(busy_app, "127.0.0.1", 0, limits=ServerLimits(max_connections=2)) as server:
        busy = [raw_socket(server) for _ in range(2)]
        try:
            for sock in busy:
                sock.sendall(b"GET /work HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            time.sleep(0.3)
            with raw_socket(server) as extra:
                answer = extra.recv(65536)
            assert answer.startswith(b"HTTP/1.1 503") and b"too_many_connections" in answer
            release.set()
            for sock in busy:  # the requests in progress were finished, not cut off
                answer = b""
                while b"done" not in answer and (chunk := sock.recv(65536)):
                    answer += chunk
                assert answer.startswith(b"HTTP/1.1 200") and answer.endswith(b"done"), answer
        finally:
            for sock in busy:
                sock.close()


def test_the_limits_are_settings_the_daemon_serves_with(monkeypatch):
    from source_backfill.config import load_settings
    from source_backfill.daemon import Daemon

    assert Daemon(load_settings())._server_limits() == ServerLimits()  # the defaults agree  # noqa: SLF001
    for key, value in (("HEADER_TIMEOUT_S", "2.5"), ("BODY_TIMEOUT_S", "9"), ("KEEP_ALIVE_TIMEOUT_S", "1"),
                       ("MAX_CONNECTIONS", "20"), ("MAX_HEADER_BYTES", "4096")):
        monkeypatch.setenv(f"SOURCE_BACKFILL_API__{key}", value)
    limits = Daemon(load_settings())._server_limits()  # noqa: SLF001
    assert limits == ServerLimits(header_timeout_s=2.5, body_timeout_s=9.0, keep_alive_timeout_s=1.0,
                                  max_connections=20, max_header_bytes=4096)


def test_the_metrics_port_has_the_api_s_connection_limits(tmp_path):
    """A daemon without sources (no Spark) serving metrics on a port of its own."""
    from source_backfill.config import Settings
    from source_backfill.daemon import Daemon

    settings = Settings(daemon={"state_root": tmp_path / "state"}, api={"port": 0, "header_timeout_s": 1.0},
                        metrics={"port": 0})
    daemon = Daemon(settings)
    daemon.start()
    try:
        url = daemon.metrics_url
        assert url is not None and url != daemon.api_url
        r = httpx.get(f"{url}/metrics")
        assert r.status_code == 200 and "source_backfill_" in r.text
        port = int(url.rsplit(":", 1)[1])
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
            took = closed_by_server(sock, within_s=6.0, trickle=b"a")
        assert took is not None and took <= 3.0, took
        assert httpx.get(f"{url}/jobs").status_code == 404  # only the metrics there
    finally:
        daemon.stop()


# -- what errors and logs give away -----------------------------------------------------------------------
def test_errors_name_no_path_of_the_daemon_s_state(tmp_path, monkeypatch):
    """A sink path is echoed as sent, never what it resolves to (the working directory, a symlink's
    target) nor the data root; an unwritable mutation log says why, not where."""
    import errno

    from source_backfill.runtime import mutation_log

    data, secret = tmp_path / "data", tmp_path / "secret-target"
    data.mkdir()
    secret.mkdir()
    (data / "out").symlink_to(secret)
    registry = JobRegistry(tmp_path / "state", SOURCES, data_root=data)
    monkeypatch.chdir(tmp_path / "state")
    hidden = [str(secret), "secret-target", str(tmp_path / "state"), "mutations.jsonl"]
    try:
        with ApiServer(create_app(registry), "127.0.0.1", 0) as server, \
                httpx.Client(base_url=server.url, timeout=10) as client:
            for sink, also_hidden in ((str(data / "out" / "t"), []), ("relative/t", [str(data)]),
                                      ("/etc/evil", [str(data)]), ("../../x", [str(data)])):
                r = client.post("/jobs", json={"name": "j", "source": "events", "sink_path": sink})
                assert r.status_code == 422, r.text
                assert repr(sink) in r.json()["error"]["message"]  # what was sent is said back
                for text in hidden + also_hidden:
                    assert text not in r.text, (sink, text, r.text)

            assert client.post("/jobs", json={"name": "j", "source": "events",
                                              "sink_path": str(data / "j")}).status_code == 201

            def full(_fd):
                raise OSError(errno.ENOSPC, "No space left on device")

            monkeypatch.setattr(mutation_log.os, "fsync", full)
            for method, path in (("POST", "/jobs/j/pause"), ("PATCH", "/jobs/j"), ("DELETE", "/jobs/j")):
                r = client.request(method, path, json={"rate_limit": 1} if method == "PATCH" else None)
                assert r.status_code == 503, r.text
                assert "No space left" in r.json()["error"]["message"]
                for text in [*hidden, str(data), str(tmp_path)]:
                    assert text not in r.text, (path, text, r.text)
    finally:
        registry.close()


def test_the_token_is_never_logged_nor_answered(tmp_path, capfd):
    """A daemon with a token (no sources), every kind of request, the token sent right and in every wrong
    place: no log record, no stdout/stderr line, no response body or header holds it."""
    import logging

    from source_backfill.config import Settings
    from source_backfill.daemon import Daemon

    token = "Tok3n-" + "s3cr3t" * 4
    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record):
            records.append(record)

    keep = Keep(level=logging.DEBUG)
    loggers = [logging.getLogger(n) for n in ("", "uvicorn", "uvicorn.error", "uvicorn.access")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.addHandler(keep)
        lg.setLevel(logging.DEBUG)
    answers: list[str] = []
    try:
        settings = Settings(daemon={"state_root": tmp_path / "state", "data_root": tmp_path / "data"},
                            api={"port": 0, "token": token, "guard_reads": True}, metrics={"port": 0})
        daemon = Daemon(settings)
        daemon.start()
        try:
            right = {"Authorization": f"Bearer {token}"}
            wrong = [{"Authorization": f"Bearer {token}x"}, {"Authorization": f"Basic {token}"},
                     {"Authorization": token}, {"X-Api-Key": token}, {"Cookie": f"token={token}"},
                     {"Authorization": f"Bearer {token[:-1]}"}]
            with httpx.Client(base_url=daemon.api_url, timeout=10) as client:
                requests = [("GET", p, None) for p in ("/health", "/ready", "/live", "/jobs", "/jobs/nope",
                                                       "/metrics", "/openapi.json", "/docs", "/ui", "/ui.js")]
                requests += [("POST", "/jobs", {"name": "j", "source": "nope", "sink_path": "/x"}),
                             ("POST", "/jobs", {"name": "j", "source": "events", "sink_path": "/outside"}),
                             ("POST", "/jobs/nope/pause", None), ("PATCH", "/jobs/nope", {"rate_limit": -1}),
                             ("DELETE", "/jobs/nope", None), ("POST", "/jobs", {"bad": True})]
                for method, path, body in requests:
                    for headers in [right, *wrong, {}]:
                        r = client.request(method, path, json=body, headers=headers)
                        answers.append(f"{r.status_code} {dict(r.headers)} {r.text}")
                    r = client.request(method, f"{path}?token={token}", json=body, headers=right)
                    answers.append(f"{r.status_code} {dict(r.headers)} {r.text}")
                    r = client.request(method, path, json=body, headers=right | {"Host": "evil.com"})
                    answers.append(f"{r.status_code} {dict(r.headers)} {r.text}")
            r = httpx.get(f"{daemon.metrics_url}/metrics", headers=right)
            answers.append(r.text)
        finally:
            daemon.stop()
    finally:
        for lg, level in zip(loggers, levels, strict=True):
            lg.removeHandler(keep)
            lg.setLevel(level)
    assert len(answers) > 100 and any(a.startswith("401") for a in answers)
    assert any(a.startswith("200") for a in answers)
    for answer in answers:
        assert token not in answer and "s3cr3t" not in answer, answer
    formatter = logging.Formatter()
    for record in records:
        if record.name.startswith(("httpx", "httpcore")):
            continue  # the test's own client, which logs the URLs it was given
        line = record.getMessage() + (formatter.formatException(record.exc_info) if record.exc_info else "")
        assert "s3cr3t" not in line, line
    out, err = capfd.readouterr()
    assert "s3cr3t" not in out and "s3cr3t" not in err
    assert records  # the capture saw the daemon's log
