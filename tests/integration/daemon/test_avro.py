"""Avro jobs against the real Schema Registry: a history spanning versions, a live producer moving on,
each policy's table, dead letters, exactly once.

Records are produced as Confluent-framed Avro (fastavro, the schema ids the registry gave); every row of
a job's table is checked against the record it came from as Avro resolves it onto the job's reader
(``core.schema_evolution.resolve``), and its offsets against the Kafka log offset by offset.

Slow (``make test-slow``): they need the registry, which ``make test`` does not build or start.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from deltalake import DeltaTable

from source_backfill.config import DEAD_LETTER_SUFFIX
from source_backfill.core.schema_evolution import parse, resolve
from source_backfill.executors.decoding import READER_PROPERTY
from tests.fixtures.avro import INCOMPATIBLE, KAFKA_COLUMNS, VERSIONS, AvroTopic, framed, register
from tests.fixtures.proxy import FaultyProxy
from tests.integration.daemon.conftest import await_both_tables, exactly_once, finished, job_spec, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.slow]

def avro_daemon(daemon_factory, topic: AvroTopic, jobs: list[dict[str, Any]]):
    return daemon_factory([topic.topic], jobs, schema_registry={"url": topic.registry})


def rows_by_id(path) -> dict[int, dict[str, Any]]:
    rows = DeltaTable(str(path)).to_pyarrow_table().to_pylist()
    got = {r["id"]: r for r in rows}
    assert len(got) == len(rows), "an id twice"
    return got


def assert_rows_as_resolved(path, topic: AvroTopic, reader_version_fields: list[str]) -> None:
    """Each row holds its record as Avro resolves it from its writer onto the table's reader."""
    table = DeltaTable(str(path))
    reader = parse(table.metadata().configuration[READER_PROPERTY])
    assert [f.name for f in reader.fields] == reader_version_fields
    assert table.schema().to_arrow().names == [*KAFKA_COLUMNS, *reader_version_fields]
    got = rows_by_id(path)
    assert set(got) == set(topic.sent)
    for i, (v, rec) in topic.sent.items():
        want = resolve(reader, VERSIONS[v]).project(rec)
        assert {k: got[i][k] for k in want} == want, (i, v)


def test_history_over_three_versions_then_a_live_fourth_evolves_the_table_exactly_once(
    daemon_factory, avro_topic, kafka_bootstrap, tmp_path
):
    topic = avro_topic()
    for v in (1, 2, 3):
        topic.send(v, 300)
    d = avro_daemon(daemon_factory, topic, [job_spec("evolving", tmp_path, format={"value": "avro"},
                                                      max_rows_per_epoch=200)])
    wait_for(lambda: finished(d, "evolving"), what="the avro job finished its history")
    # the reader was v3 (the subject's latest at create): the history lands in v3's columns
    assert [f.name for f in parse(DeltaTable(str(tmp_path / "evolving")).metadata().configuration[
        READER_PROPERTY]).fields] == ["id", "qty", "sku", "note", "channel"]
    topic.send(4, 200)  # the live producer moves to v4: a field added
    exactly_once(tmp_path / "evolving", kafka_bootstrap, [topic.topic])
    assert_rows_as_resolved(tmp_path / "evolving", topic, ["id", "qty", "sku", "note", "channel", "amount"])
    # the column came with the first rows that hold it: no row before v4's has an amount
    got = rows_by_id(tmp_path / "evolving")
    assert all(got[i]["amount"] is None for i, (v, _) in topic.sent.items() if v < 4)
    assert any(got[i]["amount"] is not None for i, (v, _) in topic.sent.items() if v == 4)


def test_history_read_ahead_meets_newer_writers_reads_them_in_epochs_and_reads_ahead_again(
    daemon_factory, avro_topic, kafka_bootstrap, tmp_path
):
    """A read ahead grows no table: one that meets a writer its reader does not cover is thrown away,
    the job reads on in its epochs until one grows the table, then reads ahead again under the new one."""
    from source_backfill import metrics
    from tests.integration.daemon.conftest import metric_total

    topic = avro_topic()
    for v in (1, 2, 3):
        topic.send(v, 400)
    job = job_spec("grows-ahead", tmp_path, format={"value": "avro", "reader_version": 1},
                   max_rows_per_epoch=100)
    d = avro_daemon(daemon_factory, topic, [job])
    wait_for(lambda: finished(d, "grows-ahead"), timeout=300, what="the avro job finished its history")
    exactly_once(tmp_path / "grows-ahead", kafka_bootstrap, [topic.topic])
    assert_rows_as_resolved(tmp_path / "grows-ahead", topic, ["id", "qty", "sku", "note", "channel"])
    assert metric_total(metrics.HISTORY_READS_AHEAD, job="grows-ahead", outcome="adopted") >= 2  # v1's, v3's
    assert d.registry.get("grows-ahead").error is None


def test_pin_keeps_the_readers_columns_and_an_incompatible_writer_fails_that_job_alone(
    daemon_factory, avro_topic, kafka_bootstrap, tmp_path
):
    topic = avro_topic()
    topic.version(1)  # registered, never written: the pinned job's reader
    topic.send(2, 200)  # the strict job's reader (the latest) is the only writer of the history
    jobs = [job_spec("pinned", tmp_path, format={"value": "avro", "reader_version": 1, "evolution": "pin"}),
            job_spec("strict", tmp_path, format={"value": "avro", "evolution": "fail"}),
            job_spec("raw", tmp_path)]
    d = avro_daemon(daemon_factory, topic, jobs)
    wait_for(lambda: all(finished(d, j) for j in ("pinned", "strict", "raw")), what="the jobs finished")
    topic.send(4, 100)
    exactly_once(tmp_path / "pinned", kafka_bootstrap, [topic.topic])
    assert_rows_as_resolved(tmp_path / "pinned", topic, ["id", "qty", "sku"])
    # "fail": its reader is v2 (the latest at create); v4 differs from it: the job fails, naming the id
    wait_for(lambda: d.registry.get("strict").error, what="the strict job failed")
    assert f"writer schema id {topic.ids[4]}" in d.registry.get("strict").error
    # a writer no reader reads (qty as text): the pinned job fails alone, the raw job goes on
    sid = register(topic.registry, f"{topic.topic}-other-value", INCOMPATIBLE)
    topic.send_raw(framed(sid, INCOMPATIBLE, {"id": 10_000, "qty": "many", "sku": "x"}))
    wait_for(lambda: d.registry.get("pinned").error, what="the pinned job failed")
    error = d.registry.get("pinned").error
    assert f"writer schema id {sid}" in error and "'qty'" in error
    topic.send(2, 10)
    exactly_once(tmp_path / "raw", kafka_bootstrap, [topic.topic])
    assert d.registry.get("raw").error is None


def test_undecodable_records_go_to_the_dead_letter_table_each_offset_in_exactly_one_table(
    daemon_factory, avro_topic, kafka_bootstrap, tmp_path
):
    topic = avro_topic()
    topic.send(1, 1000, corrupt_every=100)  # 1 % cut short
    topic.send_raw(b"\x01not avro")  # another magic byte
    topic.send_raw(b"\x00\x7f\xff\xff\xf0" + b"\x02")  # an id the registry does not know
    jobs = [job_spec("dl", tmp_path, format={"value": "avro", "on_decode_error": "dead_letter"},
                     max_rows_per_epoch=300),
            job_spec("strict", tmp_path, format={"value": "avro"})]
    d = avro_daemon(daemon_factory, topic, jobs)
    wait_for(lambda: finished(d, "dl"), what="the dead-letter job finished its history")
    topic.send(1, 200, corrupt_every=100)  # live ones too
    main, dead = tmp_path / "dl", tmp_path / f"dl{DEAD_LETTER_SUFFIX}"

    await_both_tables(main, dead, kafka_bootstrap, topic.topic, timeout=120)
    # `verify` counts the dead-letter table with the job's: each offset in exactly one of the two
    from connectors.kafka.admin import KafkaAdmin
    from source_backfill.verify.kafka_job import verify_job

    admin = KafkaAdmin(kafka_bootstrap)
    try:
        assert verify_job(str(main), "dl", admin, kafka_bootstrap, also=[str(dead)]).ok
        alone = verify_job(str(main), "dl", admin, kafka_bootstrap)
        assert not alone.ok and alone.totals()["missing"] >= 10  # the dead letters, not in the table
    finally:
        admin.close()
    letters = DeltaTable(str(dead)).to_pyarrow_table().to_pylist()
    assert len(letters) == 12 + 2
    from source_backfill import metrics
    from tests.integration.daemon.conftest import metric_total

    assert metric_total(metrics.DEAD_LETTERS, job="dl") >= 14  # a record read again counts again
    errors = sorted({r["error"].split(" ")[0] for r in letters})
    assert errors == ["its", "not", "schema"], errors  # a cut body, another magic byte, an unknown id
    assert any("unknown to the registry" in r["error"] for r in letters)
    # the epoch that read it (a read ahead's: the first that may commit it; 0 before the job's first)
    assert all(r["value"] is not None and r["epoch"] >= 0 for r in letters)
    assert set(rows_by_id(main)) == set(topic.sent)
    # on_decode_error = "fail": the first undecodable record fails the job, naming where it is
    wait_for(lambda: d.registry.get("strict").error, what="the strict job failed")
    error = d.registry.get("strict").error
    assert f"the record at {topic.topic}:" in error and "cannot be decoded (" in error, error
    assert "times in a row" not in error  # failed at once, not after the retries of an unexpected error


def test_a_registry_down_for_20_s_delays_the_job_never_fails_or_skips_it(
    daemon_factory, avro_topic, kafka_bootstrap, tmp_path
):
    from urllib.parse import urlsplit

    topic = avro_topic()
    topic.send(1, 100)
    url = urlsplit(topic.registry)
    proxy = FaultyProxy(url.hostname, url.port).start()
    try:
        behind = f"{url.scheme}://{proxy.address}{url.path}"
        d = daemon_factory([topic.topic], [job_spec("patient", tmp_path, format={"value": "avro"})],
                           schema_registry={"url": behind})
        wait_for(lambda: finished(d, "patient"), what="the avro job finished its history")
        proxy.blackhole(True)  # a partition: connections hang, nothing answers
        topic.send(2, 100)  # a new writer id: the job must ask the registry for it
        down_until = time.monotonic() + 20
        while time.monotonic() < down_until:
            assert d.registry.get("patient").error is None
            time.sleep(1)
        assert len(rows_by_id(tmp_path / "patient")) == 100  # delayed: v2's records wait for their schema
        proxy.blackhole(False)
        exactly_once(tmp_path / "patient", kafka_bootstrap, [topic.topic])
        assert d.registry.get("patient").error is None
        assert_rows_as_resolved(tmp_path / "patient", topic, ["id", "qty", "sku", "note"])
    finally:
        proxy.stop()
