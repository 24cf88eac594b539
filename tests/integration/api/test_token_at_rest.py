"""The API token never reaches the state root: not the mutation log, not a compacted log, no other file."""

from __future__ import annotations

import base64
from pathlib import Path

import httpx
import pytest
from pydantic import SecretStr

from source_backfill.api.app import create_app
from source_backfill.api.server import ApiServer
from source_backfill.config import JobSpec
from source_backfill.runtime.registry import JobRegistry

pytestmark = pytest.mark.integration

TOKEN = "tok-3f9a1c77e2b54d0d9b1e6a8c4f2d7e10"  # noqa: S105 - a test secret


def secrets_in(root: Path) -> list[str]:
    needles = [TOKEN.encode(), base64.b64encode(TOKEN.encode()), TOKEN.encode()[::-1], TOKEN[4:20].encode()]
    found = []
    for path in root.rglob("*"):
        if path.is_file():
            data = path.read_bytes()
            found += [f"{path}: {n!r}" for n in needles if n in data]
    return found


def test_no_state_file_holds_the_token(tmp_path: Path) -> None:
    state = tmp_path / "state"
    registry = JobRegistry(state, ["events"])
    server = ApiServer(create_app(registry, SecretStr(TOKEN), health=lambda: {"ok": True}), "127.0.0.1", 0)
    server.start()
    auth = {"Authorization": f"Bearer {TOKEN}"}
    try:
        with httpx.Client(base_url=server.url, timeout=10, headers=auth) as api:
            body = {"name": "j", "source": "events", "sink_path": str(tmp_path / "tables" / "j")}
            assert api.post("/jobs", json=body).status_code == 201
            # a client that puts the token into the body: no spec field takes it, the create is refused
            for extra in ({"token": TOKEN}, {"authorization": f"Bearer {TOKEN}"}, {"api": {"token": TOKEN}}):
                assert api.post("/jobs", json=body | {"name": "k"} | extra).status_code == 422
            assert api.post("/jobs/j/pause").status_code < 300
            assert api.post("/jobs/j/resume").status_code < 300
            assert api.patch("/jobs/j", json={"rate_limit": 5}).status_code < 300
            registry.set_failed("j", "boom")
            assert api.post("/jobs/j/retry").status_code < 300
            assert api.delete("/jobs/j").status_code < 300
            again = body | {"name": "j2", "sink_path": str(tmp_path / "tables" / "j2")}
            assert api.post("/jobs", json=again).status_code == 201
        with httpx.Client(base_url=server.url, timeout=10) as anon:  # wrong and half tokens
            for header in (f"Bearer {TOKEN}x", f"Bearer {TOKEN[:-1]}", TOKEN, f"Basic {TOKEN}"):
                assert anon.post("/jobs/j2/pause", headers={"Authorization": header}).status_code == 401
        registry.mark_applied([m.id for m in registry.drain("events")], epoch=1)
        assert registry.compact()
    finally:
        server.stop()
        registry.close()
    JobRegistry(state, ["events"]).close()  # a restart replays (and may compact) the log again
    assert list(state.rglob("*")), "nothing was written under the state root"
    assert secrets_in(state) == []


def test_no_job_spec_field_is_a_secret() -> None:
    fields = set(JobSpec.model_fields)
    assert not {f for f in fields if any(w in f.lower() for w in ("token", "secret", "password", "auth"))}
    assert JobSpec.model_config.get("extra") == "forbid"  # unknown keys (a "token") are refused, not kept
