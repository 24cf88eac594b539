"""POST /jobs/{name}/verify starts a background run, GET .../verify/{id} polls it; the CLI's verify."""

from __future__ import annotations

import threading
import time

import pytest
from pydantic import SecretStr

from source_backfill import cli
from source_backfill.api.app import create_app
from source_backfill.api.server import ApiServer
from source_backfill.config import JobSpec
from source_backfill.errors import VerifyRefusedError
from source_backfill.runtime.registry import JobRegistry
from source_backfill.runtime.verifications import Verifications
from tests.integration.api.conftest import TOKEN


class _Result:
    def __init__(self, ok: bool) -> None:
        self.ok = ok

    def to_json(self) -> dict:
        line = "j: exactly once, 10 records, 0 missing, 0 duplicated" if self.ok else \
            "j: NOT exactly once, 10 records, 1 missing, 1 duplicated"
        return {"ok": self.ok, "summary": line, "records": 10}


@pytest.fixture
def served(tmp_path, monkeypatch):
    registry = JobRegistry(tmp_path / "state", ["events"])
    for name in ("good", "bad", "dropped-cols"):
        registry.create(JobSpec(name=name, source="events", sink_path=f"/t/{name}"))
    gate = threading.Event()

    def check(job: str):
        if job == "dropped-cols":
            msg = "the table keeps no topic/partition/offset column (its transform drops them)"
            raise VerifyRefusedError(msg)

        def work():
            gate.wait(10)
            return _Result(job == "good")

        return work

    server = ApiServer(create_app(registry, SecretStr(TOKEN), verifications=Verifications(check)),
                       "127.0.0.1", 0)
    server.start()
    monkeypatch.setenv(cli.ENV_API, server.url)
    monkeypatch.setenv(cli.ENV_TOKEN, TOKEN)
    monkeypatch.setattr(cli, "VERIFY_POLL_S", 0.05)
    try:
        yield server, gate
    finally:
        gate.set()
        server.stop()
        registry.close()


def test_a_run_is_started_polled_and_its_result_served(served) -> None:
    import httpx

    server, gate = served
    admin = httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {TOKEN}"})
    assert httpx.post(f"{server.url}/jobs/good/verify").status_code == 401  # it reads a whole table: guarded
    r = admin.post("/jobs/good/verify")
    assert r.status_code == 202, r.text
    run = r.json()
    assert run["status"] == "running" and r.headers["Location"] == f"/jobs/good/verify/{run['id']}"
    assert admin.post("/jobs/good/verify").json()["id"] == run["id"]  # one run per job at a time
    gate.set()
    deadline = time.monotonic() + 10
    while run["status"] == "running" and time.monotonic() < deadline:
        run = admin.get(f"/jobs/good/verify/{run['id']}").json()
    assert run["status"] == "done" and run["ok"] is True
    assert run["summary"] == "j: exactly once, 10 records, 0 missing, 0 duplicated"
    r = admin.post("/jobs/dropped-cols/verify")
    assert r.status_code == 422 and "transform drops them" in r.json()["error"]["message"]
    assert admin.post("/jobs/ghost/verify").status_code == 404
    assert admin.get(f"/jobs/bad/verify/{run['id']}").status_code == 404  # another job's run
    admin.close()


def test_the_cli_prints_the_summary_and_exits_3_on_differences(served, capsys) -> None:
    _, gate = served
    gate.set()
    assert cli.main(["verify", "good"]) == 0
    assert capsys.readouterr().out.strip() == "j: exactly once, 10 records, 0 missing, 0 duplicated"
    assert cli.main(["verify", "bad"]) == cli.EXIT_DIFFERS == 3
    assert "1 missing, 1 duplicated" in capsys.readouterr().out
    assert cli.main(["verify", "dropped-cols"]) == 1
    assert "transform drops them" in capsys.readouterr().err
