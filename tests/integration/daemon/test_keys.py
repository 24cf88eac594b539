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


#: :data:`KEY` and a field with a default: a compatible change of the key's subject.
KEY2 = parse({"type": "record", "name": "OrderKey", "fields": [
    {"name": "id", "type": "long"}, {"name": "region", "type": "string"},
    {"name": "shard", "type": "int", "default": 0}]})


class KeyedTopic(AvroTopic):
    """Avro values (the fixture's versions) under Avro keys of :data:`KEY` (or :data:`KEY2`)."""

    key_id = 0
    key_schema = KEY

    def register_key(self, schema: Any = KEY, subject: str | None = None) -> None:
        r = httpx.post(f"{self.registry}/subjects/{subject or self.topic + '-key'}/versions", timeout=30,
                       json={"schema": json.dumps(schema.avro())})
        r.raise_for_status()
        self.key_id, self.key_schema = int(r.json()["id"]), schema

    def key(self, i: int) -> bytes | None:
        rec: dict[str, Any] = {"id": i, "region": ("eu", "us")[i % 2]}
        if self.key_schema is KEY2:
            rec["shard"] = i % 7
        return framed(self.key_id, self.key_schema, rec)


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


def test_a_key_schema_that_evolves_grows_the_key_columns_in_history_read_ahead_and_live_exactly_once(
    daemon_factory, registry_topic, kafka_bootstrap, tmp_path
):
    """The key's subject gains a field with a default (``evolve``): ``key_shard`` comes with the first rows
    whose key has it, in the history (a read ahead meeting it is read again in the epochs) and live."""
    from source_backfill import metrics
    from tests.integration.daemon.conftest import exactly_once, metric_total

    topic = registry_topic(KeyedTopic)
    topic.register_key(KEY)
    old = set(topic.send(1, 300))
    topic.register_key(KEY2, f"{topic.topic}-key-next")  # the key subject's latest stays KEY: the reader
    new = set(topic.send(1, 300))
    job = job_spec("key-grows", tmp_path, format={"value": "avro", "key": "avro"},
                   max_rows_per_epoch=100)
    d = daemon_factory([topic.topic], [job], schema_registry={"url": topic.registry})
    wait_for(lambda: finished(d, "key-grows"), timeout=300, what="the keyed job finished its history")
    new |= set(topic.send(1, 100))  # live ones
    exactly_once(tmp_path / "key-grows", kafka_bootstrap, [topic.topic])
    table = DeltaTable(str(tmp_path / "key-grows"))
    grown = parse(table.metadata().configuration[KEY_READER_PROPERTY])
    assert [f.name for f in grown.fields] == ["id", "region", "shard"]
    rows = {r["id"]: r for r in table.to_pyarrow_table().to_pylist()}
    assert set(rows) == old | new
    for i in old:  # read before the growth: no column yet (null); after it: the default
        assert (rows[i]["key_id"], rows[i]["key_region"]) == (i, ("eu", "us")[i % 2])
        assert rows[i]["key_shard"] in (None, 0), rows[i]
    for i in new:
        assert (rows[i]["key_id"], rows[i]["key_shard"]) == (i, i % 7), rows[i]
    assert metric_total(metrics.HISTORY_READS_AHEAD, job="key-grows", outcome="adopted") >= 1
    assert d.registry.get("key-grows").error is None
