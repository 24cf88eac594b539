"""The decoding side's registry client against the real registry (Apicurio's Confluent API): writer
schemas by id, fetched once; a subject's latest version; an unknown id said plainly; a registry that stops
answering (a black hole, then refused connections) delays a fetch and never fails it before its deadline."""

from __future__ import annotations

import json
import threading
import time
import uuid
from urllib.parse import urlsplit

import httpx
import pytest

from connectors.schema_registry.client import RegistryClient
from source_backfill.errors import RegistryUnavailableError, SchemaNotFoundError
from tests.fixtures.proxy import FaultyProxy

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SCHEMA = {"type": "record", "name": "Order", "fields": [{"name": "id", "type": "long"}]}


def _register(url: str, subject: str, schema: dict) -> int:
    r = httpx.post(f"{url}/subjects/{subject}/versions", json={"schema": json.dumps(schema)}, timeout=30)
    r.raise_for_status()
    return int(r.json()["id"])


def test_schemas_by_id_are_fetched_once_and_latest_names_the_newest(schema_registry):
    subject = f"orders-{uuid.uuid4().hex[:8]}-value"
    v1 = _register(schema_registry, subject, SCHEMA)
    v2_schema = {**SCHEMA, "fields": [*SCHEMA["fields"], {"name": "note", "type": ["null", "string"],
                                                          "default": None}]}
    v2 = _register(schema_registry, subject, v2_schema)
    with RegistryClient(schema_registry) as client:
        assert json.loads(client.schemas([v1, v2, v1])[v2])["fields"][1]["name"] == "note"
        sent = client.requests
        assert json.loads(client.schema(v1))["fields"] == SCHEMA["fields"]
        assert client.requests == sent  # from the cache
        latest = client.latest(subject)
        assert (latest.id, latest.version) == (v2, 2)
        with pytest.raises(SchemaNotFoundError, match="schema id 987654321"):
            client.schema(987654321)
        with pytest.raises(SchemaNotFoundError, match="no-such-subject"):
            client.latest("no-such-subject")
        assert [(v.version, v.id) for v in client.versions(subject)] == [(1, v1), (2, v2)]
        with pytest.raises(SchemaNotFoundError, match="no-such-subject"):
            client.versions("no-such-subject")


def test_a_registry_that_stops_answering_delays_the_fetch_and_gives_up_only_at_its_deadline(schema_registry):
    subject = f"orders-{uuid.uuid4().hex[:8]}-value"
    sid = _register(schema_registry, subject, SCHEMA)
    target = urlsplit(schema_registry)
    proxy = FaultyProxy(target.hostname or "127.0.0.1", target.port or 80).start()
    url = f"http://{proxy.address}{target.path}"
    try:
        proxy.blackhole(True)  # accepted, nothing answers: each attempt times out
        got: dict[str, object] = {}
        client = RegistryClient(url, timeout_s=1.0, deadline_s=120)
        fetch = threading.Thread(target=lambda: got.setdefault("schema", client.schema(sid)), daemon=True)
        fetch.start()
        ceiling = time.monotonic() + 90
        while client.requests < 3:  # retried meanwhile
            assert time.monotonic() < ceiling, f"{client.requests} requests in 90 s"
            time.sleep(0.1)
        assert "schema" not in got
        proxy.blackhole(False)
        fetch.join(60)
        assert "Order" in str(got["schema"])
        client.close()
        with RegistryClient(url, timeout_s=1.0, deadline_s=3) as short:
            proxy.blackhole(True)
            with pytest.raises(RegistryUnavailableError, match="unavailable for 3 s while asking for schema"):
                short.schema(sid + 1000)
    finally:
        proxy.stop()
