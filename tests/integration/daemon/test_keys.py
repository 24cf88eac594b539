"""Jobs that decode their records' keys too (``format.key``), against the real Schema Registry: each key
lands in ``key_<field>`` columns, a key that does not decode makes its record a dead letter (or fails the
job, naming the key), exactly once. Slow (``make test-slow``): they need the registry."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from deltalake import DeltaTable

from source_backfill.config import DEAD_LETTER_SUFFIX
from source_backfill.core.schema_evolution import parse
from source_backfill.executors.decoding import KEY_READER_PROPERTY
from tests.fixtures.avro import AvroTopic, framed
from tests.integration.daemon.conftest import await_both_tables, finished, job_spec, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.slow]

KEY = parse({"type": "record", "name": "OrderKey", "fields": [
    {"name": "id", "type": "long"}, {"name": "region", "type": "string"}]})


class KeyedTopic(AvroTopic):
    """Avro values (the fixture's versions) under Avro keys of :data:`KEY`."""

    key_id = 0

    def register_key(self) -> None:
        r = httpx.post(f"{self.registry}/subjects/{self.topic}-key/versions", timeout=30,
                       json={"schema": json.dumps(KEY.avro())})
        r.raise_for_status()
        self.key_id = int(r.json()["id"])

    def key(self, i: int) -> bytes | None:
        return framed(self.key_id, KEY, {"id": i, "region": ("eu", "us")[i % 2]})


def test_keys_land_in_their_columns_and_an_undecodable_key_is_a_dead_letter_exactly_once(
    daemon_factory, registry_topic, kafka_bootstrap, tmp_path
):
    topic = registry_topic(KeyedTopic)
    topic.register_key()
    topic.send(1, 200)
    topic.send_raw(framed(topic.version(1), *_v1(10_000)), key=b"\x01not avro")  # a key of no id
    topic.send_raw(framed(topic.version(1), *_v1(10_001)), key=None)  # no key: null columns, kept
    jobs = [job_spec("keyed", tmp_path, format={"value": "avro", "key": "avro",
                                                "on_decode_error": "dead_letter"}),
            job_spec("strict", tmp_path, format={"value": "avro", "key": "avro"})]
    d = daemon_factory([topic.topic], jobs, schema_registry={"url": topic.registry})
    wait_for(lambda: finished(d, "keyed"), what="the keyed job finished its history")
    wait_for(lambda: d.registry.get("strict").error, what="the strict job failed on the bad key")
    assert "its key: not in the Confluent wire format" in d.registry.get("strict").error
    topic.send(1, 100)  # live ones too
    main, dead = tmp_path / "keyed", tmp_path / f"keyed{DEAD_LETTER_SUFFIX}"

    await_both_tables(main, dead, kafka_bootstrap, topic.topic, timeout=180)
    table = DeltaTable(str(main))
    assert parse(table.metadata().configuration[KEY_READER_PROPERTY]) == KEY
    rows = table.to_pyarrow_table().to_pylist()
    assert "key" not in rows[0] and len(rows) == 301
    for r in rows:
        if r["id"] == 10_001:
            assert r["key_id"] is None and r["key_region"] is None
        else:
            assert (r["key_id"], r["key_region"]) == (r["id"], ("eu", "us")[r["id"] % 2]), r
    letters = DeltaTable(str(dead)).to_pyarrow_table().to_pylist()
    assert len(letters) == 1 and letters[0]["key"] == b"\x01not avro"
    assert letters[0]["error"].startswith("its key: not in the Confluent wire format"), letters[0]


def _v1(i: int) -> tuple[Any, dict[str, Any]]:
    from tests.fixtures.avro import VERSIONS, record

    return VERSIONS[1], record(1, i)
