"""Starting over after a recreated topic, over a real API server and the CLI (issue 49): ``POST
/sources/{source}/reset`` and ``POST /jobs/{name}/retry`` with its body (no Spark, no Kafka: the reset's
sources are stand-ins, what it does to the folders is real).

The retry's body is untrusted input: every attack on it is kept here (a path outside the data root, ``..``,
another namespace's folder or job, another job's table, the old table, a job that has not failed, fields
the body does not have), each refused with nothing changed.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import SecretStr

from source_backfill.api.app import create_app
from source_backfill.api.server import ApiServer
from source_backfill.config import JobSpec, NamespaceConfig, SourceConfig
from source_backfill.runtime.registry import JobRegistry
from source_backfill.runtime.source_reset import SourceResets
from tests.integration.api.conftest import TOKEN

pytestmark = pytest.mark.integration

AUTH = {"Authorization": f"Bearer {TOKEN}"}
CONFIGS = {"events": SourceConfig(name="events", bootstrap_servers="localhost:9092", topics=["t"]),
           "orders": SourceConfig(name="orders", bootstrap_servers="localhost:9092", topics=["o"])}


class Stub:
    """A source as a reset sees it."""

    def __init__(self, stopped_for_good: str | None = None) -> None:
        self.stopped_for_good = stopped_for_good
        self.error: str | None = None
        self.started = False

    def stop(self, _timeout_s: float = 0) -> None:
        pass

    def start(self) -> None:
        self.started = True


class Served:
    def __init__(self, tmp: Path) -> None:
        self.state, self.data = tmp / "state", tmp / "data"
        for folder in ("team-a", "team-b"):
            (self.data / folder).mkdir(parents=True)
        (self.state / "sources" / "events" / "checkpoint").mkdir(parents=True)
        (self.state / "sources" / "events" / "topic_ids.json").write_text('{"t": "old"}')
        namespaces = [NamespaceConfig(name="team-a"), NamespaceConfig(name="team-b")]
        self.registry = JobRegistry(self.state, list(CONFIGS), data_root=self.data, audit=True,
                                    namespaces=namespaces)
        self.sources: dict[str, Any] = {"events": Stub("topic t was deleted and created again"),
                                        "orders": Stub()}
        self.resets = SourceResets(self.registry, self.state, CONFIGS, self.sources, lambda _c: Stub())
        app = create_app(self.registry, SecretStr(TOKEN), reset_source=self.resets.reset)
        self.server = ApiServer(app, "127.0.0.1", 0)
        self.server.start()
        self.http = httpx.Client(base_url=self.server.url, headers=AUTH, timeout=10)

    def failed(self, name: str, namespace: str = "default", **kw: Any) -> None:
        folder = self.data / namespace if namespace != "default" else self.data
        self.registry.create(JobSpec(name=name, namespace=namespace, source="events",
                                     sink_path=str(folder / name.split(".")[-1]), **kw))
        self.registry.set_failed(name, "topic t was deleted and created again")

    def unchanged(self) -> tuple[Any, bytes]:
        return self.registry.list(), self.registry.path.read_bytes()

    def close(self) -> None:
        self.http.close()
        self.server.stop()
        self.registry.close()


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Served]:
    s = Served(tmp_path)
    yield s
    s.close()


def body(**kw: Any) -> dict[str, Any]:
    return {"from": "earliest", "new_table": True, **kw}


# -- POST /jobs/{name}/retry with a body ----------------------------------------------------------------
def test_a_retry_without_a_body_resumes_from_the_old_table_as_before(served):
    served.failed("a")
    r = served.http.post("/jobs/a/retry")
    assert r.status_code == 202 and r.json()["error"] is None
    assert r.json()["sink_path"] == str(served.data / "a")
    assert served.http.post("/jobs/a/retry").status_code == 202  # not failed: a no-op, as before
    assert [(m.kind, m.spec) for m in served.registry.drain("events")][1:] == [("retry", None)]  # plain


def test_a_retry_into_a_new_table_answers_the_job_with_its_new_table(served):
    served.failed("a")
    r = served.http.post("/jobs/a/retry", json=body())
    assert r.status_code == 202, r.text
    job = r.json()
    assert (job["sink_path"], job["start"], job["error"]) == (str(served.data / "a-2"), {"kind": "earliest"},
                                                            None)
    r = served.http.post("/jobs/a/retry", json=body())  # it runs again: not failed any more
    assert r.status_code == 409 and r.json()["error"]["type"] == "job_not_failed"
    rows = served.http.get("/audit").json()
    assert json.loads(rows[-1]["detail"]) == {"new_table": str(served.data / "a-2"), "from": "earliest"}


@pytest.mark.parametrize(("sent", "status", "field"), [
    (body(sink="/etc/evil"), 422, "sink_path"),  # outside the data root
    (body(sink="{data}/../escape"), 422, "sink_path"),  # '..' out of it
    (body(sink="{data}/a"), 409, "sink_path"),  # the old table
    (body(sink="{data}/a/x"), 409, "sink_path"),  # inside it
    (body(sink="{data}/other"), 409, "sink_path"),  # another job's table
    (body(sink="{state}/sources/events/checkpoint"), 422, "sink_path"),  # the daemon's state
    (body(sink="{data}/team-b/x"), 409, "sink_path"),  # another namespace's job's table
    (body(sink="s3://bucket/t"), 422, "sink_path"),
    (body(sink="{data}/nul\u0000"), 422, "sink_path"),
    (body(sink=""), 422, "sink"),
    (body(sink="{data}/\ud800"), 422, "sink"),  # not Unicode
    (body(sink=7), 422, "sink"),
    ({"from": "latest", "new_table": True}, 422, "from"),
    ({"from": "earliest", "new_table": False}, 422, "new_table"),  # re-read into the old table: never
    ({"from": "earliest"}, 422, "new_table"),
    ({"new_table": True}, 422, "from"),
    ({"sink": "/x"}, 422, "from"),
    (body(sink_path="/x"), 422, "sink_path"),  # a field the body does not have
    (body(name="b"), 422, "name"),
    ([], 422, "body"),
])
def test_attacks_on_the_retry_body_are_refused_and_change_nothing(served, sent, status, field):
    served.failed("a")
    served.registry.create(JobSpec(name="other", source="events", sink_path=str(served.data / "other")))
    served.registry.create(JobSpec(name="team-b.x", namespace="team-b", source="events",
                                   sink_path=str(served.data / "team-b" / "x")))
    if isinstance(sent, dict) and isinstance(sent.get("sink"), str):
        sent = {**sent, "sink": sent["sink"].format(data=served.data, state=served.state)}
    before = served.unchanged()
    r = served.http.post("/jobs/a/retry", content=json.dumps(sent).encode(),
                         headers={"Content-Type": "application/json"})
    assert r.status_code == status, r.text
    assert r.json()["error"]["field"] == field, r.text
    if str(served.state) not in json.dumps(sent):
        assert str(served.state) not in r.text  # never the daemon's paths, but what was sent
    assert served.unchanged() == before


def test_a_job_that_has_not_failed_or_does_not_exist_is_not_retried_into_a_new_table(served):
    served.registry.create(JobSpec(name="running", source="events", sink_path=str(served.data / "running")))
    before = served.unchanged()
    r = served.http.post("/jobs/running/retry", json=body())
    assert r.status_code == 409 and r.json()["error"]["type"] == "job_not_failed"
    assert served.http.post("/jobs/ghost/retry", json=body()).status_code == 404
    assert served.http.post("/jobs/..%2Fetc/retry", json=body()).status_code in (404, 422)
    assert served.unchanged() == before


# -- POST /sources/{source}/reset ----------------------------------------------------------------------------
def test_a_source_stopped_for_good_is_reset_and_runs_again(served):
    r = served.http.post("/sources/events/reset")
    assert r.status_code == 200, r.text
    done = r.json()
    assert done["state"] == "running" and done["moved_to"].startswith("sources/events.reset-")
    assert (served.state / done["moved_to"] / "topic_ids.json").read_text() == '{"t": "old"}'
    assert served.sources["events"].started
    [row] = [a for a in served.http.get("/audit").json() if a["kind"] == "reset"]
    assert (row["id"], row["source"], row["namespace"]) == (done["id"], "events", "*")


def test_a_running_unknown_or_unnamed_source_is_not_reset(served):
    before = served.unchanged()
    r = served.http.post("/sources/orders/reset")
    assert r.status_code == 409 and r.json()["error"]["type"] == "source_running"
    assert "running: a reset is for a source stopped for good" in r.json()["error"]["message"]
    assert served.http.post("/sources/nope/reset").status_code == 404
    assert served.http.post("/sources/..%2F..%2Fetc/reset").status_code in (404, 422)
    wrong = {"Authorization": "Bearer wrong"}
    assert served.http.post("/sources/events/reset", headers=wrong).status_code == 401
    assert served.unchanged() == before
    assert sorted(p.name for p in (served.state / "sources").iterdir()) == ["events"]


def test_without_sources_the_reset_answers_503(tmp_path):
    registry = JobRegistry(tmp_path / "state", ["events"])
    server = ApiServer(create_app(registry), "127.0.0.1", 0)
    server.start()
    try:
        r = httpx.post(server.url + "/sources/events/reset", timeout=10)
        assert r.status_code == 503 and "not available" in r.json()["error"]["message"]
    finally:
        server.stop()
        registry.close()


# -- the CLI -----------------------------------------------------------------------------------------------
@pytest.fixture
def run(served, cli_against):
    return cli_against(served.server.url)


def test_the_cli_resets_a_source_and_retries_its_jobs_into_new_tables(run, served, tmp_path, monkeypatch):
    served.failed("a")
    served.failed("b")
    code, out, err = run("sources", "reset", "events")
    assert code == 0, err
    assert out.startswith('reset source "events": its old folder is kept at <state_root>/sources/events.')
    code, out, err = run("sources", "reset", "events")  # it runs now
    assert code == 1 and "is running" in err and "HTTP 409 source_running" in err

    code, out, err = run("jobs", "retry", "a", "--from", "earliest", "--new-table")
    assert code == 0, err
    assert out == f'retried job "a" from the earliest offsets into a new table {served.data / "a-2"} ' \
                  "(applies at the next epoch boundary)\n"
    monkeypatch.chdir(served.data)  # a relative --sink is the command's directory's, as a create's
    code, out, err = run("jobs", "retry", "b", "--from", "earliest", "--new-table", "--sink", "b-new")
    assert code == 0, err
    assert served.registry.get("b").spec.sink_path == str(served.data / "b-new")


@pytest.mark.parametrize("argv", [
    ("jobs", "retry", "a", "--new-table"),  # without --from
    ("jobs", "retry", "a", "--from", "earliest"),  # without --new-table
    ("jobs", "retry", "a", "--sink", "/x"),
    ("jobs", "retry", "a", "--from", "latest", "--new-table"),
    ("sources", "reset"),
    ("sources",),
])
def test_retry_and_reset_usage_errors_exit_2_and_send_nothing(run, served, argv):
    served.failed("a")
    before = served.unchanged()
    code, _, err = run(*argv)
    assert code == 2 and err
    assert served.unchanged() == before
