"""A real uvicorn server (ApiServer on a free port) over a real JobRegistry in tmp_path; no Spark or Kafka."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from pydantic import SecretStr

from source_backfill.api.app import create_app
from source_backfill.api.server import ApiServer
from source_backfill.runtime.registry import JobRegistry

TOKEN = "t0ken-for-tests"
SOURCES = ["events", "orders"]


@dataclass
class LiveApi:
    registry: JobRegistry
    server: ApiServer
    client: httpx.Client  # no credentials
    admin: httpx.Client  # with the bearer token

    @property
    def url(self) -> str:
        return self.server.url


@pytest.fixture
def live_api(tmp_path: Path) -> Iterator[LiveApi]:
    registry = JobRegistry(tmp_path / "state", SOURCES, audit=True)  # as the daemon keeps it
    health = {"ok": True, "sources": {"events": {"last_epoch": 7}}}
    server = ApiServer(create_app(registry, SecretStr(TOKEN), health=lambda: dict(health)), "127.0.0.1", 0)
    server.start()
    client = httpx.Client(base_url=server.url, timeout=10)
    admin = httpx.Client(base_url=server.url, timeout=10, headers={"Authorization": f"Bearer {TOKEN}"})
    try:
        yield LiveApi(registry, server, client, admin)
    finally:
        client.close()
        admin.close()
        server.stop()
        registry.close()


@pytest.fixture
def cli_against(capsys, monkeypatch):
    """``cli_against(url)`` -> ``run(*argv)`` -> (exit code, stdout, stderr): the CLI in-process against
    the server at ``url``, the token from the environment."""
    from source_backfill import cli

    def against(url: str):
        monkeypatch.setenv(cli.ENV_API, url)
        monkeypatch.setenv(cli.ENV_TOKEN, TOKEN)

        def invoke(*argv: str) -> tuple[int, str, str]:
            code = cli.main(list(argv))
            captured = capsys.readouterr()
            return code, captured.out, captured.err

        return invoke

    return against


def job_body(name: str = "j", source: str = "events", **kw) -> dict:
    return {"name": name, "source": source, "sink_path": f"/tables/{name}", **kw}
