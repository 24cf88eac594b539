"""History from a source's archive table below Kafka's log start (issue 31's archive tier), real broker.

A topic's first records are deleted from Kafka (``delete_records``) and held only by an archive: a Delta
table of the records as Kafka gave them. A job (``history_source = "auto"``) copies them from the archive
and the rest from Kafka, then follows the live stream: its table holds each record once. A job told to read
Kafka alone starts at the log start and lacks what the archive held; an archive that holds an offset twice
fails its job, saying so, rather than copying it twice; an archive of a transactional topic (this
service's identity job) has holes where Kafka has its markers and aborted records, read below the log start
as gaps, never as data loss; a live job's growing table as a trusted archive hands over exactly.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.integration.daemon.conftest import finished, job_of, job_spec, metric_total, wait_for

pytestmark = pytest.mark.integration

PARTITIONS = 2
#: The timestamp of the archive's records (:func:`_archive`): records sent with it are the archive's
#: where both hold them (an untrusted archive is compared with Kafka there).
TS_MS = 1_700_000_000_000


def _archive(path: Path, topic: str, upto: int, *, skip: dict[int, range] | None = None,
             twice: dict[int, int] | None = None, changed: dict[int, int] | None = None,
             ts_ms: Callable[[int], int] = lambda offset: TS_MS, file_offsets: int | None = None,
             configuration: dict[str, str] | None = None) -> None:
    """The records ``Producer.send(n, 2, timestamp_ms=TS_MS)`` wrote, offsets ``[0, upto)`` per partition.

    Record ``i`` went to partition ``i % 2`` at offset ``i // 2`` (key ``i``, value ``v<i>``). ``skip``:
    offsets left out per partition (a gap, as transaction markers leave); ``twice``: an offset per
    partition written a second time; ``changed``: an offset per partition whose value is not Kafka's;
    ``ts_ms(offset)``: the records' timestamps (default ``TS_MS``); ``file_offsets``: each data file
    one partition's run of that many offsets (one commit each), else all records in one file;
    ``configuration``: the table's properties (column mapping, say).
    """
    import pyarrow as pa
    from deltalake import write_deltalake

    rows: dict[str, list] = {"key": [], "value": [], "topic": [], "partition": [], "offset": [],
                             "timestamp": [], "timestampType": []}

    def add(partition: int, offset: int) -> None:
        i = offset * PARTITIONS + partition
        value = f"x{i}" if (changed or {}).get(partition) == offset else f"v{i}"
        for column, value in (("key", str(i).encode()), ("value", value.encode()), ("topic", topic),
                              ("partition", partition), ("offset", offset),
                              ("timestamp", ts_ms(offset) * 1000), ("timestampType", 0)):
            rows[column].append(value)

    for partition in range(PARTITIONS):
        for offset in range(upto):
            if offset not in (skip or {}).get(partition, range(0)):
                add(partition, offset)
        if twice and partition in twice:
            add(partition, twice[partition])
    schema = pa.schema([("key", pa.binary()), ("value", pa.binary()), ("topic", pa.string()),
                        ("partition", pa.int32()), ("offset", pa.int64()),
                        ("timestamp", pa.timestamp("us", tz="UTC")), ("timestampType", pa.int32())])
    table = pa.table(rows, schema=schema)
    if file_offsets is None:
        write_deltalake(str(path), table, configuration=configuration)
        return
    import pyarrow.compute as pc

    for partition in range(PARTITIONS):
        for lo in range(0, upto, file_offsets):
            run = pc.and_(pc.equal(table.column("partition"), partition),
                          pc.and_(pc.greater_equal(table.column("offset"), lo),
                                  pc.less(table.column("offset"), lo + file_offsets)))
            write_deltalake(str(path), table.filter(run), mode="append")


def _table_records(path: Path) -> list[tuple[int, int, str]]:
    from deltalake import DeltaTable

    t = DeltaTable(str(path)).to_pyarrow_table(columns=["partition", "offset", "value"])
    return sorted(zip(t.column("partition").to_pylist(), t.column("offset").to_pylist(),
                      [v.decode() for v in t.column("value").to_pylist()], strict=True))


@pytest.mark.slow  # make test-slow (issue 46's budget: 81 s); make test keeps the crash suite's archive of
# records deleted from Kafka (its kills in the archive part, then Kafka, then live, verified offset by offset)
# and the trusted archive's hand-over to Kafka (test_a_job_without_a_transform_takes_..._files_whole)
def test_history_below_the_log_start_comes_from_the_archive_then_kafka_then_live_each_record_once(
    daemon_factory, new_topic, producer_for, kafka_bootstrap, tmp_path
):
    from connectors.kafka.admin import KafkaAdmin
    from source_backfill import metrics

    topic = new_topic(PARTITIONS)
    producer = producer_for(topic)
    producer.send(800, PARTITIONS, timestamp_ms=TS_MS)  # offsets 0..399 per partition
    # the archive holds 0..299 of each partition but 50..59 of partition 0 (a gap); Kafka keeps 200..
    _archive(tmp_path / "archive", topic, 300, skip={0: range(50, 60)})
    sids = [f"{topic}:{p}" for p in range(PARTITIONS)]
    admin = KafkaAdmin(kafka_bootstrap)
    assert admin.delete_records(dict.fromkeys(sids, 200)) == dict.fromkeys(sids, 200)

    jobs = [job_spec("auto", tmp_path), job_spec("kafka", tmp_path, history_source="kafka")]
    d = daemon_factory([topic], jobs, archive={"path": str(tmp_path / "archive")}, starting_offsets="latest")
    wait_for(lambda: finished(d, "auto"), what="the archive-backed job finished")
    # the dry run of the same job plans the same tiers (from the archive's first offset, by the same rule)
    import httpx

    planned = httpx.post(f"{d.api_url}/jobs?dry_run=true", json=job_spec("planned", tmp_path)).json()
    assert planned["tiers_total"] == {"archive": 390, "kafka": 400, "gap": 10, "loss": 0}, planned
    assert [s["from_offset"] for s in planned["splits"]] == [0, 0]
    producer.send(100, PARTITIONS, start=800)  # live: offsets 400..449

    want = sorted((p, o, f"v{o * PARTITIONS + p}") for p in range(PARTITIONS) for o in range(450)
                  if not (p == 0 and 50 <= o < 60))
    wait_for(lambda: _table_records(tmp_path / "auto") == want, timeout=120,
             what="archive below the log start + Kafka + live, each record once")
    # the tiers as planned: below 200 from the archive (the gap read from nowhere), 200..399 from Kafka
    # (the archive is not trusted: where Kafka holds an offset, Kafka's record is copied)
    assert metric_total(metrics.JOB_HISTORY_TIER_OFFSETS, job="auto", tier="archive") == 390
    assert metric_total(metrics.JOB_HISTORY_TIER_OFFSETS, job="auto", tier="gap") == 10
    assert metric_total(metrics.JOB_HISTORY_TIER_OFFSETS, job="auto", tier="kafka") == 400
    assert metric_total(metrics.JOB_HISTORY_TIER_OFFSETS, job="auto", tier="loss") == 0
    # the same in the job as the API shows it (GET /jobs/{name}), and none for a job that reads no archive
    from source_backfill.api.models import JobView

    def tiers(name: str) -> dict[str, int] | None:
        return JobView.of(d.registry.get(name), d.registry.progress(name)).history_tiers

    want_tiers = {"archive": 390, "kafka": 400, "gap": 10, "loss": 0}
    wait_for(lambda: tiers("auto") == want_tiers, timeout=30, what=f"history_tiers {want_tiers}")
    assert tiers("kafka") is None
    # bytes from the broker: the history's Kafka part (200..399), key + value, for both jobs (the kafka
    # job reads the same offsets: it starts at the log start); the archive's part and live rows not in it
    kafka_bytes = sum(2 * len(str(o * PARTITIONS + p)) + 1  # key "i", value "vi"
                      for p in range(PARTITIONS) for o in range(200, 400))

    def fetched(name: str) -> int | None:
        return JobView.of(d.registry.get(name), d.registry.progress(name)).history_broker_bytes

    for name in ("auto", "kafka"):
        wait_for(lambda n=name: fetched(n) == kafka_bytes, timeout=30,
                 what=f"{name}: {kafka_bytes} bytes from the broker (now {fetched(name)})")
        assert metric_total(metrics.JOB_HISTORY_BROKER_BYTES, job=name) == kafka_bytes

    # verify across tiers: the archive stands for the log below the log start, Kafka's log above it
    import pyarrow as pa
    from deltalake import DeltaTable, write_deltalake

    from connectors.delta.archive import archive_holdings
    from source_backfill.verify import verify_job

    held = archive_holdings(str(tmp_path / "archive")).held

    def verify() -> object:
        return verify_job(str(tmp_path / "auto"), "auto", admin, kafka_bootstrap, archive=held)

    result = verify()
    assert result.ok and result.totals()["records"] == 390 + 2 * 250, result.summary()
    # the same through the daemon (POST /jobs/{name}/verify): it finds the source's archives itself
    run = httpx.post(f"{d.api_url}/jobs/auto/verify").json()
    run = wait_for(lambda: (r := httpx.get(f"{d.api_url}/jobs/auto/verify/{run['id']}").json())["status"]
                   != "running" and r, timeout=120, what="the daemon's verify run")
    assert run["status"] == "done" and run["ok"], run
    assert run["result"]["records"] == 390 + 2 * 250, run
    table = tmp_path / "auto"  # below the log start: one row removed, one written twice, one in the gap
    DeltaTable(str(table)).delete("`partition` = 1 AND `offset` = 10")
    rows_of = [("partition", "=", 0), ("offset", "in", [20, 49])]
    extra = DeltaTable(str(table)).to_pyarrow_table(filters=rows_of)
    extra = extra.set_column(extra.schema.get_field_index("offset"), "offset", pa.array([20, 55], pa.int64()))
    write_deltalake(str(table), extra, mode="append")
    result = verify()
    t = result.splits[f"{topic}:0"], result.splits[f"{topic}:1"]
    assert not result.ok
    assert (t[0].duplicated, t[0].unexpected, t[1].missing) == (1, 1, 1), result.summary()
    assert t[0].examples["duplicated"] == [20] and t[0].examples["unexpected"] == [55]
    assert t[1].examples["missing"] == [10]

    # the job that reads Kafka alone starts at the log start: the archive's 200 offsets are not in it
    kafka_only = sorted((p, o, f"v{o * PARTITIONS + p}") for p in range(PARTITIONS) for o in range(200, 450))
    wait_for(lambda: _table_records(tmp_path / "kafka") == kafka_only, timeout=120,
             what="the kafka-only job: the log from its start, each record once")
    assert metric_total(metrics.JOB_HISTORY_TIER_OFFSETS, job="kafka", tier="kafka") == 0  # no tiers planned


def test_an_archive_holding_an_offset_twice_fails_its_job_and_copies_nothing_twice(
    daemon_factory, new_topic, producer_for, kafka_bootstrap, tmp_path
):
    from connectors.kafka.admin import KafkaAdmin

    topic = new_topic(PARTITIONS)
    producer_for(topic).send(400, PARTITIONS)
    _archive(tmp_path / "archive", topic, 150, twice={1: 7})
    sids = [f"{topic}:{p}" for p in range(PARTITIONS)]
    assert KafkaAdmin(kafka_bootstrap).delete_records(dict.fromkeys(sids, 100)) == dict.fromkeys(sids, 100)

    d = daemon_factory([topic], [job_spec("dup", tmp_path)], archive={"path": str(tmp_path / "archive")},
                       starting_offsets="latest")
    wait_for(lambda: d.registry.get("dup").error, what="the job failed on the archive")
    error = d.registry.get("dup").error
    assert "more than once" in error and "archive" in error, error
    assert job_of(d, "dup") is None


@pytest.mark.slow  # make test-slow (issue 46's budget); make test keeps the trusted archive's hand-over
def test_a_live_job_s_growing_table_as_a_trusted_archive_hands_over_to_kafka_and_live_exactly(
    daemon_factory, new_topic, producer_for, kafka_bootstrap, tmp_path
):
    """The archive is this daemon's own identity job ``raw``, Finished and growing under a live stream while
    ``late`` copies from it (at the version pinned at its first read), then from Kafka above what that
    version held, then live: ``late`` ends equal to ``raw``, each record once, the deleted ones included."""
    from connectors.kafka.admin import KafkaAdmin
    from source_backfill import metrics
    from source_backfill.config import JobSpec

    topic = new_topic(PARTITIONS)
    producer = producer_for(topic)
    producer.send(800, PARTITIONS)
    raw = tmp_path / "raw"
    d = daemon_factory([topic], [job_spec("raw", tmp_path, history_source="kafka")],
                       archive={"path": str(raw), "trusted": True}, starting_offsets="latest")
    wait_for(lambda: finished(d, "raw"), what="raw copied the topic")
    sids = [f"{topic}:{p}" for p in range(PARTITIONS)]
    assert KafkaAdmin(kafka_bootstrap).delete_records(dict.fromkeys(sids, 150)) == dict.fromkeys(sids, 150)
    producer.stream(PARTITIONS, per_second=100)  # raw's table grows while late copies
    d.registry.create(JobSpec(**job_spec("late", tmp_path)))
    wait_for(lambda: finished(d, "late"), what="late copied from the archive and Kafka")
    producer.stop()

    def same() -> bool:
        a, b = _table_records(raw), _table_records(tmp_path / "late")
        return a == b and len(set(b)) == len(b) and len(b) > 800

    wait_for(same, timeout=120, what="late equal to raw (the archive), each record once")
    records = _table_records(tmp_path / "late")
    deleted = {(p, o) for p in range(PARTITIONS) for o in range(150)}
    assert {(p, o) for p, o, _ in records if o < 150} == deleted
    assert metric_total(metrics.JOB_HISTORY_TIER_OFFSETS, job="late", tier="archive") >= 2 * 400


def test_an_archive_whose_gaps_are_kafka_s_transaction_markers_copies_each_committed_record_once(
    daemon_factory, new_topic, kafka_bootstrap, tmp_path
):
    """The archive is this service's identity job ``raw`` of a transactional topic: its offsets skip
    Kafka's commit and abort markers and the aborted records, exactly as ``read_committed`` does. Below the
    log start those holes are all that is left of them: ``copy`` reads them as gaps (counted, nothing read,
    never data loss) and holds each committed record once, the deleted ones from the archive included."""
    import uuid

    from confluent_kafka import Producer

    from connectors.delta.archive import archive_holdings
    from connectors.kafka.admin import KafkaAdmin
    from source_backfill import metrics
    from source_backfill.config import JobSpec
    from source_backfill.verify import log_offsets, table_offsets, verify_job

    topic = new_topic(PARTITIONS)
    tx = Producer({"bootstrap.servers": kafka_bootstrap, "transactional.id": f"tx-{uuid.uuid4()}"})
    tx.init_transactions(30)
    for round_ in range(6):  # 25 records a partition each, then a marker; the 2nd and 5th aborted
        tx.begin_transaction()
        for i in range(50):
            tx.produce(topic, value=f"r{round_}-{i}".encode(), partition=i % PARTITIONS)
        if round_ % 3 == 1:
            assert tx.flush(30) == 0
            tx.abort_transaction(30)
        else:
            tx.commit_transaction(30)
    committed = log_offsets(kafka_bootstrap, [topic])  # read_committed: markers and aborted skipped
    assert all(len(o) == 4 * 25 for o in committed.values())

    def offsets(table: Path) -> dict[str, list[int]]:
        return {s: sorted(o) for s, o in table_offsets(str(table)).items()}

    raw = tmp_path / "raw"
    d = daemon_factory([topic], [job_spec("raw", tmp_path, history_source="kafka")],
                       archive={"path": str(raw)}, starting_offsets="latest")
    wait_for(lambda: finished(d, "raw") and offsets(raw) == committed, timeout=120,
             what="raw holds the committed records")
    sids = sorted(committed)
    admin = KafkaAdmin(kafka_bootstrap)
    assert admin.delete_records(dict.fromkeys(sids, 100)) == dict.fromkeys(sids, 100)
    d.registry.create(JobSpec(**job_spec("copy", tmp_path)))
    wait_for(lambda: finished(d, "copy") and offsets(tmp_path / "copy") == committed,
             timeout=120, what="copy holds each committed record once, below the log start included")

    # below the log start (100), inside the archive's span: the offsets it does not hold are the
    # markers and aborted records there: gaps, read as nothing; above it Kafka (the archive is untrusted)
    gaps = sum(100 - sum(1 for o in committed[s] if o < 100) for s in sids)
    assert gaps == 2 * (3 + 25)  # per partition: the markers at 25, 51 and 77, the aborted records 26..50
    assert metric_total(metrics.JOB_HISTORY_TIER_OFFSETS, job="copy", tier="gap") == gaps
    assert metric_total(metrics.JOB_HISTORY_TIER_OFFSETS, job="copy", tier="archive") == 2 * 100 - gaps
    assert metric_total(metrics.JOB_HISTORY_TIER_OFFSETS, job="copy", tier="loss") == 0
    result = verify_job(str(tmp_path / "copy"), "copy", admin, kafka_bootstrap,
                        archive=archive_holdings(str(raw)).held)
    assert result.ok and result.totals()["records"] == 2 * 100, result.summary()


@pytest.mark.slow  # make test-slow (issue 46's budget); make test keeps one archive's hand-over (files_whole)
def test_two_archives_in_order_then_kafka_then_live_each_record_once(
    daemon_factory, new_topic, producer_for, kafka_bootstrap, tmp_path
):
    """A source's archives in order: ``old`` holds offsets 0..99 of each partition, ``recent`` 100..249;
    Kafka keeps 200.. (the archives are untrusted: Kafka's records wherever Kafka has them). A job copies
    0..99 from ``old``, 100..199 from ``recent``, the rest from Kafka, then follows the live stream."""
    from connectors.kafka.admin import KafkaAdmin
    from source_backfill import metrics

    topic = new_topic(PARTITIONS)
    producer = producer_for(topic)
    producer.send(800, PARTITIONS, timestamp_ms=TS_MS)  # offsets 0..399 per partition
    _archive(tmp_path / "old", topic, 100)
    _archive(tmp_path / "recent", topic, 250, skip={p: range(0, 100) for p in range(PARTITIONS)})
    sids = [f"{topic}:{p}" for p in range(PARTITIONS)]
    assert KafkaAdmin(kafka_bootstrap).delete_records(dict.fromkeys(sids, 200)) == dict.fromkeys(sids, 200)
    archives = [{"path": str(tmp_path / "old")}, {"path": str(tmp_path / "recent")}]
    d = daemon_factory([topic], [job_spec("both", tmp_path)], archive=archives, starting_offsets="latest")
    wait_for(lambda: finished(d, "both"), what="the job finished")
    producer.send(100, PARTITIONS, start=800)  # live: offsets 400..449
    want = sorted((p, o, f"v{o * PARTITIONS + p}") for p in range(PARTITIONS) for o in range(450))
    wait_for(lambda: _table_records(tmp_path / "both") == want, timeout=120,
             what="two archives, Kafka and live, each record once")
    assert metric_total(metrics.JOB_HISTORY_TIER_OFFSETS, job="both", tier="archive") == 2 * 200
    assert metric_total(metrics.JOB_HISTORY_TIER_OFFSETS, job="both", tier="kafka") == 2 * 200
    assert metric_total(metrics.JOB_HISTORY_TIER_OFFSETS, job="both", tier="gap") == 0


def test_an_untrusted_archive_is_compared_with_kafka_where_both_hold_offsets_and_refused_if_it_differs(
    daemon_factory, new_topic, producer_for, kafka_bootstrap, tmp_path
):
    """Kafka keeps offsets 100.. of each partition, the archives hold 0..249: before a job reads one below
    the log start, its first ``check_offsets`` offsets from the log start are compared with Kafka's records.
    A value that differs at the window's last offset refuses it (the job fails, naming split and offset);
    one offset past the window it is not seen (and Kafka's record is the one copied there); a hole where
    Kafka has a record refuses it too."""
    from connectors.kafka.admin import KafkaAdmin

    topic = new_topic(PARTITIONS)
    producer_for(topic).send(600, PARTITIONS, timestamp_ms=TS_MS)  # offsets 0..299 per partition
    sids = [f"{topic}:{p}" for p in range(PARTITIONS)]
    assert KafkaAdmin(kafka_bootstrap).delete_records(dict.fromkeys(sids, 100)) == dict.fromkeys(sids, 100)
    _archive(tmp_path / "changed", topic, 250, changed={1: 149})
    _archive(tmp_path / "holed", topic, 250, skip={0: range(120, 121)})
    cases = [  # (job, archive, check_offsets, refusal expected in the error)
        ("edge", "changed", 50, f"{topic}:1 offset 149: the records differ"),
        ("past", "changed", 49, None),
        ("hole", "holed", 1000, f"{topic}:0 offset 120: Kafka has a record the archive lacks"),
    ]
    for name, archive, check_offsets, refusal in cases:
        d = daemon_factory([topic], [job_spec(name, tmp_path)], state_root=tmp_path / f"state-{name}",
                           archive={"path": str(tmp_path / archive), "check_offsets": check_offsets},
                           starting_offsets="latest")
        if refusal is None:
            want = sorted((p, o, f"v{o * PARTITIONS + p}") for p in range(PARTITIONS) for o in range(300))
            wait_for(lambda n=name, w=want: finished(d, n) and _table_records(tmp_path / n) == w, timeout=120,
                     what=f"{name}: the archive below the log start, Kafka's records above it")
            assert d.registry.get(name).error is None
        else:
            wait_for(lambda n=name: d.registry.get(n).error, what=f"{name}: the archive refused")
            error = d.registry.get(name).error
            assert refusal in error and "differs from Kafka" in error, error
            assert job_of(d, name) is None
        d.stop()


def test_a_timestamp_start_older_than_the_log_start_starts_in_the_archive(
    daemon_factory, new_topic, producer_for, kafka_bootstrap, tmp_path
):
    """Offsets 0..99 per partition at time A, 100..199 at B, 200..299 at C; Kafka keeps 150..; the archive
    holds 0..199. A job from timestamp B starts at 100 (the archive's first record at or after B, below the
    log start), not at the log start Kafka's ListOffsets answers: 100..149 from the archive, the rest from
    Kafka. The dry run plans the same start, and the daemon's verify checks from there."""
    import httpx

    from connectors.kafka.admin import KafkaAdmin

    a, b, c = TS_MS, TS_MS + 60_000, TS_MS + 120_000
    topic = new_topic(PARTITIONS)
    producer = producer_for(topic)
    for i, ts in enumerate((a, b, c)):  # 100 offsets per partition each
        producer.send(200, PARTITIONS, start=200 * i, timestamp_ms=ts)
    sids = [f"{topic}:{p}" for p in range(PARTITIONS)]
    admin = KafkaAdmin(kafka_bootstrap)
    assert admin.delete_records(dict.fromkeys(sids, 150)) == dict.fromkeys(sids, 150)
    assert admin.offsets_for_timestamp(sids, b) == dict.fromkeys(sids, 150)  # Kafka knows only from 150
    _archive(tmp_path / "archive", topic, 200, ts_ms=lambda o: a if o < 100 else b)
    start = {"kind": "timestamp", "timestamp_ms": b}
    d = daemon_factory([topic], [], archive={"path": str(tmp_path / "archive")}, starting_offsets="latest")
    spec = job_spec("since_b", tmp_path, start=start)
    planned = httpx.post(f"{d.api_url}/jobs?dry_run=true", json=spec).json()
    assert [s["from_offset"] for s in planned["splits"]] == [100, 100], planned
    assert planned["tiers_total"] == {"archive": 100, "kafka": 300, "gap": 0, "loss": 0}, planned
    from source_backfill.config import JobSpec

    d.registry.create(JobSpec(**spec))
    want = sorted((p, o, f"v{o * PARTITIONS + p}") for p in range(PARTITIONS) for o in range(100, 300))
    wait_for(lambda: finished(d, "since_b") and _table_records(tmp_path / "since_b") == want, timeout=120,
             what="from B: the archive's 100..149, then Kafka, each record once")
    run = httpx.post(f"{d.api_url}/jobs/since_b/verify").json()
    run = wait_for(lambda: (r := httpx.get(f"{d.api_url}/jobs/since_b/verify/{run['id']}").json())["status"]
                   != "running" and r, timeout=120, what="the daemon's verify run")
    assert run["status"] == "done" and run["ok"], run
    assert run["result"]["records"] == 2 * 200, run


def test_a_job_without_a_transform_takes_a_trusted_archive_s_files_whole_each_record_once(
    daemon_factory, new_topic, producer_for, kafka_bootstrap, tmp_path
):
    """A trusted archive of files of 50 offsets of one partition each (0..299): a job without a transform
    stages the files its reads ahead cover as they are (hard links: the same inodes in its table), reads
    the rest, and holds each record once; a job with a transform writes the archive's rows anew."""
    import os
    import shutil

    from deltalake import DeltaTable

    from source_backfill import metrics
    from source_backfill.config import JobSpec

    topic = new_topic(PARTITIONS)
    producer = producer_for(topic)
    producer.send(800, PARTITIONS, timestamp_ms=TS_MS)  # offsets 0..399 per partition
    archive = tmp_path / "archive"
    _archive(archive, topic, 300, file_offsets=50)
    d = daemon_factory([topic], [job_spec("mapped", tmp_path, transform="SELECT * FROM {source}")],
                       archive={"path": str(archive), "trusted": True}, starting_offsets="latest")
    wait_for(lambda: finished(d, "mapped"), what="mapped finished")
    # created while the source runs, its epochs capped: its history is copied by reads ahead
    d.registry.create(JobSpec(**job_spec("whole", tmp_path, max_rows_per_epoch=300)))
    want = sorted((p, o, f"v{o * PARTITIONS + p}") for p in range(PARTITIONS) for o in range(400))
    for name in ("whole", "mapped"):
        wait_for(lambda n=name: finished(d, n), what=f"{name} finished")
        wait_for(lambda n=name: _table_records(tmp_path / n) == want, timeout=60,
                 what=f"{name}: the archive's 300 offsets and Kafka's 100 of each partition, each once")

    def inodes(path: Path) -> set[int]:
        return {os.stat(uri.removeprefix("file://")).st_ino for uri in DeltaTable(str(path)).file_uris()}

    archive_files = inodes(archive)
    assert len(archive_files) == 2 * 6
    linked = inodes(tmp_path / "whole") & archive_files
    assert linked, "no archive file taken whole"  # the archive's own files, in the job's table
    assert metric_total(metrics.JOB_HISTORY_WHOLE_FILES, job="whole") == len(linked)
    assert not inodes(tmp_path / "mapped") & archive_files  # a transform's rows are written anew
    assert metric_total(metrics.JOB_HISTORY_WHOLE_FILES, job="mapped") == 0
    assert metric_total(metrics.JOB_HISTORY_TIER_OFFSETS, job="whole", tier="archive") == 2 * 300
    # the archive's files stay its own: removing the job's table leaves them whole
    d.stop()
    shutil.rmtree(tmp_path / "whole")
    assert DeltaTable(str(archive)).to_pyarrow_table().num_rows == 2 * 300


def test_an_archive_with_column_mapping_is_planned_and_read_each_record_once(
    daemon_factory, new_topic, producer_for, kafka_bootstrap, tmp_path
):
    """Column mapping (a Databricks default): the archive's files name its columns by physical names. Its
    holdings are read by those, Spark reads its rows by the table's names: below the log start from the
    archive, then Kafka, each record once."""
    from connectors.kafka.admin import KafkaAdmin

    topic = new_topic(PARTITIONS)
    producer = producer_for(topic)
    producer.send(400, PARTITIONS, timestamp_ms=TS_MS)  # offsets 0..199 per partition
    _archive(tmp_path / "archive", topic, 150, configuration={
        "delta.columnMapping.mode": "name", "delta.minReaderVersion": "2", "delta.minWriterVersion": "5"})
    sids = [f"{topic}:{p}" for p in range(PARTITIONS)]
    assert KafkaAdmin(kafka_bootstrap).delete_records(dict.fromkeys(sids, 100)) == dict.fromkeys(sids, 100)
    d = daemon_factory([topic], [job_spec("mapped", tmp_path)], archive={"path": str(tmp_path / "archive")},
                       starting_offsets="latest")
    wait_for(lambda: finished(d, "mapped"), what="the job on the column-mapped archive finished")
    want = sorted((p, o, f"v{o * PARTITIONS + p}") for p in range(PARTITIONS) for o in range(200))
    wait_for(lambda: _table_records(tmp_path / "mapped") == want, timeout=60,
             what="0..99 from the archive, 100..199 from Kafka, each record once")
