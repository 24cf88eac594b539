"""Tenants: principals with roles per namespace, over a real API server (issue 50).

The route x role x namespace matrix is generated from the app's routes: a route this file has no expected
role for fails it, so a new route cannot ship without a rule. Each principal tries every route on a job of
its own namespace and on one of another: a role too low is 403, a job of a namespace it holds no role in
is 404 in the very words of a job that does not exist, no credential is 401.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.routing import APIRoute

from source_backfill.api.access import Authenticator
from source_backfill.api.app import create_app
from source_backfill.api.oidc import OidcVerifier
from source_backfill.api.principals import TokenPrincipals, hash_token
from source_backfill.api.server import ApiServer
from source_backfill.config import JobSpec, OidcConfig
from source_backfill.runtime.registry import JobRegistry
from source_backfill.testing.jwks import JwksServer

pytestmark = pytest.mark.integration

SOURCES = ["events", "orders"]
ROLES = ("viewer", "operator", "editor", "admin")
#: What each guarded route needs, as this test expects it (not read from the code's table).
EXPECTED: dict[tuple[str, str], str] = {
    ("GET", "/jobs"): "viewer",
    ("GET", "/jobs/{name}"): "viewer",
    ("POST", "/jobs"): "editor",
    ("POST", "/jobs/{name}/pause"): "operator",
    ("POST", "/jobs/{name}/resume"): "operator",
    ("PATCH", "/jobs/{name}"): "operator",
    ("POST", "/jobs/{name}/repair"): "operator",
    ("POST", "/jobs/{name}/retry"): "operator",
    ("DELETE", "/jobs/{name}"): "editor",
    ("POST", "/jobs/{name}/verify"): "viewer",
    ("GET", "/jobs/{name}/verify/{run_id}"): "viewer",
    ("GET", "/metrics"): "viewer",  # its namespaces' jobs' series only (a role on "*": every series)
    ("GET", "/audit"): "viewer",  # its rows of the principal's namespaces
    ("GET", "/audit/refused"): "viewer",  # the refusals about the principal's namespaces
    ("POST", "/sources/{source}/reset"): "admin",  # on every namespace ("*"): a source is all of theirs
}
#: Routes about no one namespace: the role is needed on "*" (an admin of team-a alone is refused).
DAEMON_WIDE = {("POST", "/sources/{source}/reset")}
#: Never guarded: the probes name no job, the status page asks for a token itself.
UNGUARDED = {"/health", "/ready", "/live", "/ui", "/ui.js"}
#: Bodies that pass each route's own checks far enough to show the access decision was "yes".
BODIES: dict[tuple[str, str], Any] = {
    ("PATCH", "/jobs/{name}"): {"rate_limit": 5},
    ("POST", "/jobs/{name}/repair"): {"from_offset": 0, "to_offset": 10},
}


def _token(name: str) -> str:
    return f"token-of-{name}-{'x' * 24}"


def _principals(path: Path) -> Path:
    """team-a's viewer, operator, editor and admin; a dashboard viewing all; an admin of all."""
    entries = [{"name": f"a-{role}", "token_sha256": hash_token(_token(f"a-{role}")),
                "roles": {"team-a": role}} for role in ROLES]
    entries += [
        {"name": "dashboard", "token_sha256": hash_token(_token("dashboard")), "roles": {"*": "viewer"}},
        {"name": "root", "token_sha256": hash_token(_token("root")), "roles": {"*": "admin"}},
    ]
    path.write_text(json.dumps({"principals": entries}))
    return path


class Tenants:
    """A registry with a job in team-a and one in team-b, served with principals from a file."""

    def __init__(self, tmp: Path, auth: Authenticator, **registry: Any) -> None:
        self.registry = JobRegistry(tmp / "state", SOURCES, **registry)
        for ns in ("team-a", "team-b"):
            self.registry.create(JobSpec(name=f"{ns}.j", namespace=ns, source="events",
                                         sink_path=str(tmp / ns / "j")))
        health = {"ok": True, "ready": True, "sources": {"events": {
            "jobs": ["team-a.j", "team-b.j"], "failed_jobs": ["team-b.j"], "lagging_jobs": {"team-a.j": 3}}}}
        self.app = create_app(self.registry, health=lambda: json.loads(json.dumps(health)), auth=auth)
        self.server = ApiServer(self.app, "127.0.0.1", 0)
        self.server.start()

    def call(self, method: str, path: str, token: str | None, body: Any = None) -> httpx.Response:
        headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
        return httpx.request(method, self.server.url + path, headers=headers, json=body, timeout=10)

    def close(self) -> None:
        self.server.stop()
        self.registry.close()


@pytest.fixture
def tenants(tmp_path: Path) -> Iterator[Any]:
    made: list[Tenants] = []
    principals = TokenPrincipals.from_file(_principals(tmp_path / "principals.json"))

    def make(name: str = "t", **registry: Any) -> Tenants:
        t = Tenants(tmp_path / name, Authenticator(principals=principals), **{"audit": True, **registry})
        made.append(t)
        return t

    yield make
    for t in made:
        t.close()


def _api_routes(routes: Any) -> Iterator[APIRoute]:
    """Every operation the app serves, the included routers' too (FastAPI wraps each in one route)."""
    for route in routes:
        included = getattr(route, "original_router", None)
        if included is not None:
            yield from _api_routes(included.routes)
        elif isinstance(route, APIRoute):
            yield route


def _guarded_routes(app: Any) -> list[tuple[str, str]]:
    routes = [(method, r.path) for r in _api_routes(app.routes) if r.path not in UNGUARDED
              for method in sorted(r.methods)]
    assert len(routes) >= len(EXPECTED), routes  # the walk found the routes (none: the test proves nothing)
    return sorted(routes, key=lambda mr: mr[0] == "DELETE")  # a drop last: the job stays for the others


def _request(method: str, template: str, ns: str) -> tuple[str, Any]:
    path = template.replace("{name}", f"{ns}.j").replace("{run_id}", "abc").replace("{source}", "events")
    if (method, template) == ("POST", "/jobs"):
        return path, {"name": f"{ns}.new", "namespace": ns, "source": "events", "sink_path": f"/t/{ns}/new"}
    return path, BODIES.get((method, template))


def test_every_route_has_an_expected_rule_and_the_code_has_one_too(tenants):
    from source_backfill.api.access import RULES

    routes = set(_guarded_routes(tenants().app))
    assert routes - set(EXPECTED) == set(), "a route without an expected role in this test"
    assert routes - set(RULES) == set(), "a route without an access rule"
    assert {k: r.role.name.lower() for k, r in RULES.items()} == EXPECTED
    assert {k for k, r in RULES.items() if r.scope == "all"} == DAEMON_WIDE


@pytest.mark.parametrize("role", ROLES)
def test_the_route_role_namespace_matrix(tenants, role):
    t = tenants(role)
    token = _token(f"a-{role}")
    rank = ROLES.index(role)
    missing = t.call("GET", "/jobs/team-b.none", token).json()["error"]
    for method, template in _guarded_routes(t.app):
        needed = EXPECTED[(method, template)]
        # no credential, or a wrong one: 401 before anything else is decided
        for bad in (None, "wrong-token", _token("a-viewer")[:-1]):
            path, body = _request(method, template, "team-a")
            assert t.call(method, path, bad, body).status_code == 401, (method, template, bad)
        for ns in ("team-a", "team-b"):
            path, body = _request(method, template, ns)
            r = t.call(method, path, token, body)
            where = (role, method, template, ns, r.status_code, r.text[:200])
            if (method, template) in DAEMON_WIDE:  # no role on "*": refused whatever the namespace
                assert r.status_code == 403, where
                assert 'every namespace' in r.json()["error"]["message"], where
            elif ns == "team-b" and "{name}" in template:
                # never told that team-b's job exists: the words of a job that does not
                assert r.status_code == 404, where
                assert r.json()["error"] == {**missing, "message": missing["message"].replace(
                    "team-b.none", "team-b.j")}, where
            elif ns == "team-b" and template == "/jobs" and method == "POST":
                assert r.status_code == 403, where
            elif ns == "team-b" and template == "/metrics":  # team-a's series only
                assert r.status_code == 200 and "team-b" not in r.text, where
            elif ns == "team-b" and template in ("/audit", "/audit/refused"):  # team-a's rows only
                assert r.status_code == 200 and {a["namespace"] for a in r.json()} <= {"team-a"}, where
            elif ns == "team-b":  # GET /jobs: team-a's jobs only
                assert r.status_code == 200 and [j["name"] for j in r.json()] == ["team-a.j"], where
            elif rank >= ROLES.index(needed):
                assert r.status_code not in (401, 403, 404), where
            else:
                assert r.status_code == 403, where
                assert needed in r.json()["error"]["message"], where


def test_the_transform_needs_an_editor_the_rate_limit_an_operator(tenants):
    t = tenants()
    change = {"transform": "SELECT * FROM {source}"}
    assert t.call("PATCH", "/jobs/team-a.j", _token("a-operator"), change).status_code == 403
    assert t.call("PATCH", "/jobs/team-a.j", _token("a-operator"), {"rate_limit": 1}).status_code == 202
    assert t.call("PATCH", "/jobs/team-a.j", _token("a-editor"), change).status_code == 202


def test_a_retry_into_a_new_table_needs_an_editor_of_the_job_s_namespace(tenants, tmp_path):
    t = tenants("retry", data_root=tmp_path / "retry", namespaces=[_ns("team-a"), _ns("team-b")])
    for ns in ("team-a", "team-b"):
        t.registry.set_failed(f"{ns}.j", "topic t was deleted and created again")
    new = {"from": "earliest", "new_table": True}
    log = t.registry.path.read_bytes()
    assert t.call("POST", "/jobs/team-a.j/retry", _token("a-operator"), new).status_code == 403
    # another namespace's job: not told it exists, body or not
    r = t.call("POST", "/jobs/team-b.j/retry", _token("a-editor"), new)
    assert r.status_code == 404 and r.json()["error"]["message"] == 'job "team-b.j" not found'
    # a sink in another namespace's folder, or naming another namespace's table (whose: not said)
    for sink in ("team-b/new", "team-b/j"):
        asked = {**new, "sink": str(tmp_path / "retry" / sink)}
        r = t.call("POST", "/jobs/team-a.j/retry", _token("a-editor"), asked)
        assert r.status_code == 422 and "namespace 'team-a'" in r.json()["error"]["message"], r.text
    assert t.registry.path.read_bytes() == log
    r = t.call("POST", "/jobs/team-a.j/retry", _token("a-editor"), new)
    assert r.status_code == 202 and r.json()["sink_path"] == str(tmp_path / "retry" / "team-a" / "j-2")
    assert t.call("POST", "/jobs/team-b.j/retry", _token("a-operator")).status_code == 404  # as before


def test_a_source_is_reset_by_an_admin_of_every_namespace_only(tenants):
    t = tenants()
    for who in ("a-admin", "dashboard"):
        assert t.call("POST", "/sources/events/reset", _token(who)).status_code == 403, who
    # root passes the rule; this API has no sources to reset
    assert t.call("POST", "/sources/events/reset", _token("root")).status_code == 503


def _ns(name: str) -> Any:
    from source_backfill.config import NamespaceConfig

    return NamespaceConfig(name=name)


def test_a_viewer_of_every_namespace_reads_all_and_changes_nothing(tenants):
    t = tenants()
    token = _token("dashboard")
    assert [j["name"] for j in t.call("GET", "/jobs", token).json()] == ["team-a.j", "team-b.j"]
    assert t.call("GET", "/metrics", token).status_code == 200
    for method, template in _guarded_routes(t.app):
        if EXPECTED[(method, template)] in ("operator", "editor"):
            path, body = _request(method, template, "team-b")
            assert t.call(method, path, token, body).status_code == 403, (method, template)
    assert t.registry.get("team-b.j").paused is False and not t.registry.get("team-b.j").dropped


def test_the_probes_name_no_job_and_errors_name_no_other_source(tenants):
    t = tenants()
    for path in ("/health", "/ready"):
        text = t.call("GET", path, None).text
        assert "team-" not in text, (path, text)
    assert t.call("GET", "/health", None).json()["sources"]["events"] == {
        "jobs": 2, "failed_jobs": 1, "lagging_jobs": 1}
    body = {"name": "team-a.x", "namespace": "team-a", "source": "nope", "sink_path": "/t/team-a/x"}
    r = t.call("POST", "/jobs", _token("a-editor"), body)
    assert r.status_code == 404 and "orders" not in r.text and "events" not in r.text, r.text
    assert "orders" in t.call("POST", "/jobs", _token("root"), body).text  # an admin of all is told
    # a table inside another namespace's: refused without naming whose it is
    inside = str(Path(t.registry.get("team-b.j").spec.sink_path) / "inner")
    body = {"name": "team-a.x", "namespace": "team-a", "source": "events", "sink_path": inside}
    r = t.call("POST", "/jobs", _token("a-editor"), body)
    assert r.status_code == 409 and "team-b.j" not in r.json()["error"]["message"], r.text
    assert "team-b.j" in t.call("POST", "/jobs", _token("root"), body).text


def test_names_belong_to_their_namespace(tenants):
    t = tenants()
    # a team-a job named outside team-a's prefix, or a dotted name in default: refused (422), nothing made
    for body in ({"name": "team-b.x", "namespace": "team-a"}, {"name": "x", "namespace": "team-a"},
                 {"name": "team-a.x"}):
        r = t.call("POST", "/jobs", _token("root"), {**body, "source": "events", "sink_path": "/t/x"})
        assert r.status_code == 422, (body, r.text)
    # the same short name in two namespaces is two jobs
    r = t.call("POST", "/jobs", _token("a-editor"), {"name": "team-a.orders", "namespace": "team-a",
                                                      "source": "events", "sink_path": "/t/team-a/orders"})
    assert r.status_code == 201, r.text


def test_a_namespace_keeps_its_jobs_to_its_sources_and_its_folder(tenants, tmp_path):
    from source_backfill.config import NamespaceConfig

    root = tmp_path / "bound"
    t = tenants("bound", data_root=root, namespaces=[NamespaceConfig(name="team-a", sources=["events"])])
    token = _token("a-editor")

    def create(name: str, source: str, sink: Path) -> httpx.Response:
        return t.call("POST", "/jobs", token, {"name": f"team-a.{name}", "namespace": "team-a",
                                                "source": source, "sink_path": str(sink)})

    r = create("x", "orders", root / "team-a" / "x")  # a source the daemon has, not team-a's
    assert r.status_code == 404 and r.json()["error"]["message"] == 'unknown source "orders"', r.text
    r = create("x", "events", root / "team-b" / "x")  # another namespace's folder
    assert r.status_code == 422 and "daemon.data_root/team-a/" in r.text, r.text
    r = create("x", "events", root / "team-b" / "j" / "inner")  # inside team-b's table
    assert r.status_code == 422 and "team-b.j" not in r.text, r.text
    # a '..' after a symlink: the kernel lands inside team-a's folder, a lexical reading in team-b's
    (root / "team-a" / "sub" / "deeper").mkdir(parents=True)
    (root / "team-a" / "link").symlink_to(root / "team-a" / "sub" / "deeper")
    r = create("x", "events", Path(f"{root}/team-a/link/../../team-b/x"))
    assert r.status_code == 422 and "daemon.data_root/team-a/" in r.text, r.text
    assert create("x", "events", root / "team-a" / "x").status_code == 201
    r = create("y", "events", root / "team-a" / "x" / "inner")  # inside team-a's own table: named, its own
    assert r.status_code == 409, r.text


def test_a_jobs_quota_holds_when_creates_race(tenants):
    from concurrent.futures import ThreadPoolExecutor

    from source_backfill import metrics
    from source_backfill.config import NamespaceConfig

    t = tenants("quota", namespaces=[NamespaceConfig(name="team-a", max_jobs=3)])  # team-a.j is one
    before = metrics.QUOTA_REFUSALS.labels("team-a", "max_jobs")._value.get()  # noqa: SLF001

    def create(i: int) -> int:
        return t.call("POST", "/jobs", _token("a-editor"), {
            "name": f"team-a.n{i}", "namespace": "team-a", "source": "events",
            "sink_path": f"/t/quota/n{i}"}).status_code

    with ThreadPoolExecutor(12) as pool:
        codes = list(pool.map(create, range(12)))
    assert sorted(codes) == [201] * 2 + [403] * 10, codes
    assert sum(r.spec.namespace == "team-a" for r in t.registry.list()) == 3
    assert metrics.QUOTA_REFUSALS.labels("team-a", "max_jobs")._value.get() - before == 10  # noqa: SLF001
    # a drop frees a place; team-b, without a quota, is not held by team-a's
    assert t.call("DELETE", "/jobs/team-a.j", _token("a-editor")).status_code == 202
    assert create(99) == 201


def test_metrics_show_a_tenant_its_own_jobs_series_and_every_series_to_a_viewer_of_all(tenants):
    from source_backfill import metrics

    t = tenants()
    for job in ("team-a.j", "team-b.j"):
        metrics.JOB_FAILED.labels(job).set(0)
        metrics.JOB_REJOINS.labels(job).inc()
    metrics.QUOTA_REFUSALS.labels("team-b", "max_jobs").inc()
    metrics.EPOCH_LAG.labels("events").set(1.5)
    mine = t.call("GET", "/metrics", _token("a-viewer")).text
    assert 'job="team-a.j"' in mine and "job_rejoins_total" in mine
    assert "team-b" not in mine and 'source="events"' not in mine  # another tenant's jobs, the sources
    every = t.call("GET", "/metrics", _token("dashboard")).text
    assert 'job="team-b.j"' in every and 'namespace="team-b"' in every and 'source="events"' in every


def test_the_audit_shows_who_changed_what_in_the_callers_namespaces_only(tenants):
    t = tenants()
    assert t.call("POST", "/jobs/team-a.j/pause", _token("a-operator")).status_code == 202
    assert t.call("POST", "/jobs/team-b.j/pause", _token("root")).status_code == 202
    assert t.call("DELETE", "/jobs/team-a.j", _token("a-editor")).status_code == 202
    mine = t.call("GET", "/audit", _token("a-viewer")).json()
    assert [(r["kind"], r["job"], r["by"]) for r in mine] == [
        ("create", "team-a.j", None), ("pause", "team-a.j", "a-operator"), ("drop", "team-a.j", "a-editor")]
    every = t.call("GET", "/audit?limit=2", _token("root")).json()
    assert [(r["id"], r["by"]) for r in every] == [(4, "root"), (5, "a-editor")]
    # each row names its request: the client's X-Request-Id, or one made for it (a bad one replaced)
    r = httpx.post(t.server.url + "/jobs/team-b.j/resume", timeout=10, headers={
        "Authorization": f"Bearer {_token('root')}", "X-Request-Id": "ticket-4711"})
    assert r.status_code == 202
    r = httpx.post(t.server.url + "/jobs/team-b.j/pause", timeout=10, headers={
        "Authorization": f"Bearer {_token('root')}", "X-Request-Id": "bad id forged=1"})
    last = t.call("GET", "/audit?limit=2", _token("root")).json()
    assert last[0]["request_id"] == "ticket-4711"
    assert last[1]["request_id"] not in (None, "") and "forged" not in last[1]["request_id"]
    assert all(row["request_id"] for row in every)
    assert t.call("GET", "/audit?job=team-b.j", _token("a-viewer")).json() == []  # not its to see


def test_a_rate_ceiling_refuses_faster_or_unlimited_history_at_create_and_patch(tenants):
    from source_backfill.config import NamespaceConfig

    t = tenants("ceiling", namespaces=[NamespaceConfig(name="team-c", max_rate_limit=100)])
    body = {"name": "team-c.y", "namespace": "team-c", "source": "events", "sink_path": "/t/ceiling/y"}
    for rate in (None, 101):
        r = t.call("POST", "/jobs", _token("root"), {**body, "rate_limit": rate})
        assert r.status_code == 403 and r.json()["error"]["type"] == "quota_exceeded", r.text
    assert t.call("POST", "/jobs", _token("root"), {**body, "rate_limit": 100}).status_code == 201
    for rate in (None, 500):
        r = t.call("PATCH", "/jobs/team-c.y", _token("root"), {"rate_limit": rate})
        assert r.status_code == 403 and "max_rate_limit" in r.text, r.text
    assert t.call("PATCH", "/jobs/team-c.y", _token("root"), {"rate_limit": 0}).status_code == 202
    assert t.registry.get("team-c.y").rate_limit == 0
    # team-a, without a ceiling, is not held by team-c's
    assert t.call("PATCH", "/jobs/team-a.j", _token("a-operator"), {"rate_limit": None}).status_code == 202


def test_a_rotated_token_is_refused_after_reload_and_a_broken_file_keeps_the_set(tmp_path, tenants):
    t = tenants()
    principals = t.app.state.api.auth.principals
    old, new = _token("a-operator"), "the-new-operator-token-" + "y" * 20
    assert t.call("POST", "/jobs/team-a.j/pause", old).status_code == 202
    document = json.loads(principals.path.read_text())
    for entry in document["principals"]:
        if entry["name"] == "a-operator":
            entry["token_sha256"] = hash_token(new)
    principals.path.write_text(json.dumps(document))
    assert t.app.state.api.auth.reload()
    assert t.call("POST", "/jobs/team-a.j/resume", old).status_code == 401
    assert t.call("POST", "/jobs/team-a.j/resume", new).status_code == 202
    principals.path.write_text("{not json")
    assert not t.app.state.api.auth.reload()
    assert t.call("POST", "/jobs/team-a.j/pause", new).status_code == 202  # the previous set holds


def test_oidc_tokens_by_a_real_issuer_get_their_roles_and_forged_ones_get_401(tmp_path):
    with JwksServer() as issuer:
        config = OidcConfig(issuer=issuer.issuer, audience=issuer.audience, jwks_url=issuer.jwks_url)
        t = Tenants(tmp_path, Authenticator(oidc=OidcVerifier(config)))
        try:
            good = issuer.token(sub="alice", roles={"team-a": "operator"})
            assert t.call("POST", "/jobs/team-a.j/pause", good).status_code == 202
            assert t.call("GET", "/jobs/team-b.j", good).status_code == 404
            assert t.call("DELETE", "/jobs/team-a.j", good).status_code == 403
            forged = [
                issuer.token(sub="alice", roles={"team-a": "admin"}, exp_in_s=-120),  # expired
                issuer.token(sub="alice", roles={"team-a": "admin"}, nbf_in_s=600),  # not yet valid
                issuer.token(sub="alice", roles={"team-a": "admin"}, aud="another-service"),
                issuer.token(sub="alice", roles={"team-a": "admin"}, iss="https://evil.example.com"),
                _resigned(good, "none", b""),  # alg: none
                _resigned(good, "HS256", issuer.public_pem()),  # the public key as an HMAC secret
            ]
            for token in forged:
                r = t.call("POST", "/jobs/team-a.j/resume", token)
                assert r.status_code == 401 and token not in r.text, r.text
        finally:
            t.close()


def _resigned(token: str, alg: str, secret: bytes) -> str:
    """The token's claims, made admin of team-a, under ``alg`` (none: unsigned; HS256 keyed by ``secret``)."""
    import base64
    import hashlib
    import hmac

    def b64(data: bytes) -> str:
        return base64.urlsafe_b64encode(data).rstrip(b"=").decode()

    payload = json.loads(base64.urlsafe_b64decode(token.split(".")[1] + "=="))
    payload["source_backfill_roles"] = {"team-a": "admin"}
    header = json.dumps({"alg": alg, "typ": "JWT"}).encode()
    signing_input = f"{b64(header)}.{b64(json.dumps(payload).encode())}"
    if alg == "none":
        return f"{signing_input}."
    return f"{signing_input}.{b64(hmac.new(secret, signing_input.encode(), hashlib.sha256).digest())}"


def test_refused_requests_are_audit_rows_about_their_namespace_without_the_credential(tenants):
    from source_backfill.config import NamespaceConfig

    t = tenants("refusals", namespaces=[NamespaceConfig(name="team-a", max_jobs=1)])
    bad = "wrong-token-" + "s" * 30
    t.call("GET", "/jobs", bad)  # 401: about no namespace
    t.call("POST", "/jobs/team-a.j/pause", _token("a-viewer"))  # 403: a role too low in team-a
    t.call("POST", "/jobs/team-b.j/pause", _token("a-operator"))  # 404: a job of team-b
    body = {"name": "team-a.k", "namespace": "team-a", "source": "events", "sink_path": "/t/a/k"}
    assert t.call("POST", "/jobs", _token("a-editor"), body).status_code == 403  # team-a's max_jobs
    every = t.call("GET", "/audit/refused", _token("root")).json()
    assert [(r["status"], r["by"], r["namespace"], r["job"]) for r in every] == [
        (401, None, None, None), (403, "a-viewer", "team-a", "team-a.j"),
        (404, "a-operator", "team-b", "team-b.j"), (403, "a-editor", "team-a", None)]
    assert "max_jobs" in every[3]["reason"] and every[2]["reason"] == "job of another namespace"
    assert all(r["request_id"] for r in every) and bad not in json.dumps(every)
    # team-a sees the refusals about team-a; team-b's viewer is not told of team-a's, nor of a 401
    mine = t.call("GET", "/audit/refused", _token("a-viewer")).json()
    assert [(r["status"], r["by"]) for r in mine] == [(403, "a-viewer"), (403, "a-editor")]
    # (the reading itself is allowed: no row for it) and the rows outlive the daemon's registry
    t.registry.close()
    again = JobRegistry(t.registry.state_root, SOURCES, audit=True)
    try:
        assert len(again.refusals.rows()) == 4
    finally:
        again.close()
