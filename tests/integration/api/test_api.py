"""The control API over a live uvicorn server: auth, 4xx naming the field, round trips, progress, metrics."""

from __future__ import annotations

import httpx
import pytest

from source_backfill import metrics
from source_backfill.runtime.progress import JobProgress, SplitProgress
from tests.integration.api.conftest import TOKEN, job_body

MUTATING = [
    ("POST", "/jobs", job_body("x")),
    ("POST", "/jobs/j/pause", None),
    ("POST", "/jobs/j/resume", None),
    ("PATCH", "/jobs/j", {"rate_limit": 1.0}),
    ("DELETE", "/jobs/j", None),
    ("POST", "/jobs/j/retry", None),
]


def _error(r: httpx.Response) -> dict:
    body = r.json()
    assert set(body) == {"error"}, body
    return body["error"]


@pytest.mark.parametrize(("method", "path", "body"), MUTATING)
@pytest.mark.parametrize("auth", [None, "Bearer wrong", f"Basic {TOKEN}", "Bearer", f"Bearer {TOKEN}x"],
                         ids=["none", "wrong", "basic", "empty", "prefix"])
def test_mutating_routes_need_the_token(live_api, method, path, body, auth) -> None:
    live_api.registry.create(_spec("j"))
    headers = {"Authorization": auth} if auth else {}
    r = live_api.client.request(method, path, json=body, headers=headers)
    assert r.status_code == 401, r.text
    assert r.headers["www-authenticate"] == "Bearer"
    assert _error(r)["type"] == "unauthorized"
    rec = live_api.registry.get("j")  # nothing happened
    assert (rec.paused, rec.rate_limit, rec.dropped) == (False, None, False)
    assert [r.name for r in live_api.registry.list()] == ["j"]


def test_an_unwritable_state_root_is_a_clear_503_and_changes_nothing(live_api, monkeypatch) -> None:
    import errno

    from source_backfill.runtime import mutation_log

    live_api.registry.create(_spec("j"))

    def full(_fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(mutation_log.os, "fsync", full)
    auth = {"Authorization": f"Bearer {TOKEN}"}
    r = live_api.client.post("/jobs/j/pause", headers=auth)
    assert r.status_code == 503, r.text
    assert _error(r)["type"] == "state_unwritable" and "No space left" in _error(r)["message"]
    r = live_api.client.post("/jobs", json=job_body("k"), headers=auth)
    assert r.status_code == 503
    assert not live_api.registry.get("j").paused and [j.name for j in live_api.registry.list()] == ["j"]


def test_reads_need_no_token(live_api) -> None:
    live_api.registry.create(_spec("j"))
    for path in ("/health", "/jobs", "/jobs/j", "/metrics", "/openapi.json"):
        assert live_api.client.get(path).status_code == 200, path


def test_no_token_configured_means_open(tmp_path) -> None:
    from source_backfill.api.app import create_app
    from source_backfill.api.server import ApiServer
    from source_backfill.runtime.registry import JobRegistry

    registry = JobRegistry(tmp_path, ["events"])
    with ApiServer(create_app(registry), "127.0.0.1", 0) as server:
        r = httpx.post(f"{server.url}/jobs", json=job_body("open"))
        assert r.status_code == 201, r.text
    registry.close()


@pytest.mark.parametrize(
    ("body", "status", "field", "text"),
    [
        (job_body(rate_limit=-1), 422, "rate_limit", "greater than or equal to 0"),
        (job_body(rate_limit="fast"), 422, "rate_limit", "valid number"),
        (job_body(name="bad name!"), 422, "name", "pattern"),
        (job_body(transform="DROP TABLE t"), 422, "transform", "SELECT"),
        (job_body(transform="SELECT key FROM t"), 422, "transform", "{source}"),
        (job_body(source="nope"), 404, "source", 'unknown source "nope"'),
        ({"name": "j", "source": "events"}, 422, "sink_path", "Field required"),
        (job_body(start={"kind": "offsets", "offsets": {"nocolon": 1}}), 422, "start.offsets.offsets",
         "topic:partition"),
        (job_body(start={"kind": "yesterday"}), 422, "start", "kind"),
        (job_body(max_rows_per_epoch=0), 422, "max_rows_per_epoch", "greater than 0"),
        (job_body(colour="blue"), 422, "colour", "Extra inputs"),
    ],
    ids=["neg-rate", "str-rate", "name", "transform-not-select", "transform-no-source", "source", "missing",
         "offsets", "start-kind", "max-rows", "extra"],
)
def test_bad_create_names_the_field(live_api, body, status, field, text) -> None:
    r = live_api.admin.post("/jobs", json=body)
    assert r.status_code == status, r.text
    err = _error(r)
    assert err["field"] == field
    assert text in err["message"]
    assert live_api.registry.list() == []


def test_bad_requests_elsewhere(live_api) -> None:
    live_api.admin.post("/jobs", json=job_body("j")).raise_for_status()
    r = live_api.admin.post("/jobs", content=b"{not json", headers={"content-type": "application/json"})
    assert r.status_code == 422 and _error(r)["field"] == "body"
    r = live_api.admin.post("/jobs", json=job_body("j"))
    assert r.status_code == 409 and _error(r) == {"type": "job_exists", "message": 'job "j" already exists',
                                                  "field": "name"}
    for body in ({"rate_limit": -0.5}, {"rate_limit": "x"}, {"rate_limit": 1, "paused": True},
                 {"transform": "DROP TABLE t"}, {"transform": 5}):
        r = live_api.admin.patch("/jobs/j", json=body)
        assert r.status_code == 422, body
        assert _error(r)["field"] in ("rate_limit", "paused", "transform"), (body, r.text)
    r = live_api.admin.patch("/jobs/j", json={})  # neither field: nothing to change is not a PATCH
    assert r.status_code == 422 and _error(r)["field"] == "body" and "rate_limit" in _error(r)["message"]
    ghosts = (("GET", "/jobs/ghost"), ("POST", "/jobs/ghost/pause"), ("POST", "/jobs/ghost/resume"),
              ("DELETE", "/jobs/ghost"))
    for method, path in ghosts:
        r = live_api.admin.request(method, path)
        assert r.status_code == 404 and _error(r)["field"] == "name", (method, path)
    r = live_api.admin.patch("/jobs/ghost", json={"rate_limit": 1})
    assert r.status_code == 404
    r = live_api.client.get("/jobs/bad%20name")
    assert r.status_code == 422 and _error(r)["field"] == "name"
    r = live_api.client.get("/no/such/route")
    assert r.status_code == 404 and _error(r)["type"] == "not_found"


def test_round_trip(live_api) -> None:
    api = live_api.admin
    r = api.post("/jobs", json=job_body("a", start={"kind": "timestamp", "timestamp_ms": 1700000000000},
                                        rate_limit=100, transform="SELECT key, value FROM {source}"))
    assert r.status_code == 201 and r.headers["location"] == "/jobs/a"
    view = r.json()
    assert view["status"] == "pending"
    assert view["start"] == {"kind": "timestamp", "timestamp_ms": 1700000000000}
    assert (view["rate_limit"], view["paused"], view["pending_mutations"]) == (100, False, 1)
    assert view["splits"] == [] and view["transform"] == "SELECT key, value FROM {source}"
    api.post("/jobs", json=job_body("b", source="orders")).raise_for_status()
    assert [j["name"] for j in api.get("/jobs").json()] == ["a", "b"]

    r = api.post("/jobs/a/pause")
    assert r.status_code == 202 and r.json()["paused"] is True
    assert api.get("/jobs/a").json()["paused"] is True
    assert api.post("/jobs/a/resume").json()["paused"] is False
    assert api.patch("/jobs/a", json={"rate_limit": 0}).json()["rate_limit"] == 0
    assert api.patch("/jobs/a", json={"rate_limit": None}).json()["rate_limit"] is None
    # what the epoch loop of "events" will apply, in order
    queued = live_api.registry.drain("events")
    assert [m.kind for m in queued] == ["create", "pause", "resume", "throttle", "throttle"]
    live_api.registry.mark_applied([m.id for m in queued], epoch=5)
    assert api.get("/jobs/a").json()["pending_mutations"] == 0

    r = api.delete("/jobs/a")
    assert r.status_code == 202 and r.json()["dropped"] is True
    assert api.post("/jobs/a/pause").status_code == 404  # no longer live
    assert [j["name"] for j in api.get("/jobs").json()] == ["b"]  # not listed once its drop is accepted
    assert api.get("/jobs/a").json()["dropped"] is True  # still readable until the loop applies the drop
    live_api.registry.mark_applied([m.id for m in live_api.registry.drain("events")], epoch=6)
    assert api.get("/jobs/a").status_code == 404
    assert [j["name"] for j in api.get("/jobs").json()] == ["b"]
    assert api.post("/jobs", json=job_body("a")).status_code == 201  # the name is free again


def test_per_split_progress_is_visible(live_api) -> None:
    live_api.admin.post("/jobs", json=job_body("p")).raise_for_status()
    live_api.registry.publish_progress("p", JobProgress(
        epoch=12, status="backfilling", rows_history=5300, rows_live=40, finish_reported=False,
        eta_seconds=8.5, history_rows_per_s=640.0, rows_read_ahead=2000,
        splits=[
            SplitProgress("events:0", "backfilling", 5199, 9999, 5200, 4800),
            SplitProgress("events:1", "source_caching_up", 99, 99, 100, 0),
            SplitProgress("events:2", "finished", None, None, 0, 0, data_loss_offsets=37),
            SplitProgress("events:3", "backfilling", 999, 9999, 1000, 7000, read_ahead_offset=2999,
                          rows_read_ahead=2000),  # a read ahead copied 2000 more, not committed yet
        ],
    ))
    job = live_api.client.get("/jobs/p").json()
    assert (job["status"], job["epoch"]) == ("backfilling", 12)
    assert (job["rows_history"], job["rows_live"], job["rows_read_ahead"]) == (5300, 40, 2000)
    assert (job["splits_total"], job["splits_finished"], job["eta_seconds"]) == (4, 1, 8.5)
    assert job["splits"][0] == {"split": "events:0", "stage": "backfilling", "backfilled_offset": 5199,
                                "target_offset": 9999, "rows": 5200, "lag": 4800, "progress": 0.52,
                                "read_ahead_offset": None, "rows_read_ahead": 0, "data_loss_offsets": 0}
    assert [s["progress"] for s in job["splits"][1:3]] == [1.0, 1.0]
    assert job["splits"][2]["data_loss_offsets"] == 37  # every split's, whatever /metrics exports
    ahead = job["splits"][3]  # progress counts what the read ahead copied: 3000 of 10000
    assert (ahead["progress"], ahead["read_ahead_offset"], ahead["rows_read_ahead"]) == (0.3, 2999, 2000)
    live_api.registry.set_failed("p", "history read failed: boom")
    job = live_api.client.get("/jobs/p").json()
    assert job["status"] == "failed" and job["error"] == "history read failed: boom"


def test_health_and_metrics(live_api) -> None:
    r = live_api.client.get("/health")
    assert r.json() == {"ok": True, "sources": {"events": {"last_epoch": 7}}, "jobs": 0}
    metrics.EPOCH.labels("api-test").set(3)
    r = live_api.client.get("/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    assert 'source_backfill_epoch{source="api-test"} 3.0' in r.text
    assert "# TYPE source_backfill_history_rows_total counter" in r.text


def test_unhealthy_is_503(tmp_path) -> None:
    from source_backfill.api.app import create_app
    from source_backfill.api.server import ApiServer
    from source_backfill.runtime.registry import JobRegistry

    registry = JobRegistry(tmp_path, ["events"])
    with ApiServer(create_app(registry, health=lambda: {"ok": False, "error": "query failed"}), "127.0.0.1",
                   0) as server:
        r = httpx.get(f"{server.url}/health")
    assert r.status_code == 503 and r.json()["error"] == "query failed"
    registry.close()


def test_openapi_lists_the_routes(live_api) -> None:
    doc = live_api.client.get("/openapi.json").json()
    paths = doc["paths"]
    assert set(paths["/jobs"]) == {"get", "post"}
    assert set(paths["/jobs/{name}"]) == {"get", "patch", "delete"}
    assert {"/health", "/metrics", "/jobs/{name}/pause", "/jobs/{name}/resume"} <= set(paths)
    assert "HTTPBearer" in doc["components"]["securitySchemes"]
    assert live_api.client.get("/docs").status_code == 200


def test_server_binds_a_free_port_and_stops(live_api) -> None:
    assert live_api.server.port > 0 and live_api.url.endswith(f":{live_api.server.port}")
    live_api.server.stop()
    with pytest.raises(httpx.TransportError):
        httpx.get(f"{live_api.url}/health", timeout=2)


def _spec(name: str):
    from source_backfill.config import JobSpec

    return JobSpec(**job_body(name))


def test_connections_have_tcp_nodelay(live_api) -> None:
    """Each response goes out at once: without TCP_NODELAY it waited ~40 ms for the client's delayed ACK."""
    import socket

    assert live_api.client.get("/live").status_code == 200  # a kept-alive connection the server now holds
    connections = list(live_api.server._server.server_state.connections)
    sockets = [c.transport.get_extra_info("socket") for c in connections]
    assert sockets and all(s.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) for s in sockets)


def test_a_clashing_sink_is_a_409_at_create_and_changes_nothing(live_api, tmp_path) -> None:
    import pyarrow as pa
    from deltalake import CommitProperties, write_deltalake

    from connectors.delta.log import KEY_JOB

    old = tmp_path / "old"  # a table job "gone" wrote (dropped since): the new job would fail on it later
    write_deltalake(str(old), pa.table({"x": [1]}),
                    commit_properties=CommitProperties(custom_metadata={KEY_JOB: "gone"}))
    live_api.admin.post("/jobs", json=job_body("a")).raise_for_status()
    log = (live_api.registry.path).read_bytes()
    for sink, text in ((str(old), 'written by job "gone"'), ("/tables/a/part", 'job "a"'),
                       (str(old / "inner"), "inside an existing Delta table")):
        r = live_api.admin.post("/jobs", json={**job_body("b"), "sink_path": sink})
        assert r.status_code == 409, r.text
        err = _error(r)
        assert err["type"] == "sink_conflict" and err["field"] == "sink_path" and text in err["message"]
    assert [j.name for j in live_api.registry.list()] == ["a"] and live_api.registry.path.read_bytes() == log


def test_a_dry_run_checks_like_a_create_and_changes_nothing(live_api, tmp_path) -> None:
    live_api.admin.post("/jobs", json=job_body("a")).raise_for_status()
    log = live_api.registry.path.read_bytes()
    sink = tmp_path / "would-be"
    r = live_api.admin.post("/jobs?dry_run=true", json={**job_body("b"), "sink_path": str(sink)})
    assert r.status_code == 200, r.text
    assert r.json()["dry_run"] is True and r.json()["job"]["name"] == "b"
    # the same refusals as a create: name taken, sink clash, bad source, bad field; and the token
    for body, code in ((job_body("a"), 409), ({**job_body("b"), "sink_path": "/tables/a/x"}, 409),
                       (job_body("b", source="nope"), 404), (job_body("b", rate_limit=-1), 422)):
        assert live_api.admin.post("/jobs?dry_run=true", json=body).status_code == code, body
    assert live_api.client.post("/jobs?dry_run=true", json=job_body("b")).status_code == 401
    assert [j.name for j in live_api.registry.list()] == ["a"]
    assert live_api.registry.path.read_bytes() == log and not sink.exists()
