"""Kafka as a cluster fails: three KRaft nodes (``connectors/kafka/cluster.py``), a partition's leader
SIGKILLed under a job's backfill and under the live stream, every node restarted in turn under a live
producer with ``acks=all``, a broker quota throttling every read, partitions reassigned to other brokers
mid-backfill — every job ends exactly once, offset by offset.

Slow (``make test-slow``): three broker JVMs, and each kill waits out the controller's broker session
timeout (3 s here; Kafka's default is 9 s) before a new leader is elected.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import pytest

from tests.integration.daemon.conftest import INTERVAL_S, Producer, exactly_once, finished, job_of, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(900)]

PARTITIONS = 4

@pytest.fixture(scope="module")
def cluster():
    """The test kit's cluster (``source_backfill.testing.kafka_cluster_of``), one per module."""
    from source_backfill.testing import kafka_cluster_of

    with kafka_cluster_of(3) as c:
        yield c

@pytest.fixture
def topic(cluster) -> str:
    from connectors.kafka.admin import KafkaAdmin

    name = f"failover-{uuid.uuid4().hex[:8]}"
    admin = KafkaAdmin(cluster.bootstrap)
    try:
        admin.create_topic(name, PARTITIONS, replication_factor=3)
    finally:
        admin.close()
    return name

@pytest.fixture
def daemon_on(daemon_factory, cluster):
    """``daemon_on(topic, jobs)``: the suite's in-process daemon (``daemon_factory``) on the cluster."""

    def make(topic: str, jobs: list[dict[str, Any]], **source: Any) -> Any:
        return daemon_factory([topic], jobs, bootstrap_servers=cluster.bootstrap, **source)

    return make

def _producer(cluster, topic: str) -> Producer:
    return Producer(cluster.bootstrap, topic, {"acks": "all", "enable.idempotence": "true"})

def _new_leader(cluster, topic: str, partition: int, old: int) -> int:
    return wait_for(lambda: (leader := cluster.leader(topic, partition)) not in (-1, old) and leader,
                    timeout=120, what=f"a new leader of {topic}:{partition}")

def test_the_leader_killed_mid_backfill_and_under_the_live_stream_ends_exactly_once(
    cluster, topic, daemon_on, tmp_path
):
    p = _producer(cluster, topic)
    p.send(40_000, PARTITIONS)
    p.stream(PARTITIONS, per_second=100)
    try:
        d = daemon_on(topic, [{"name": "deep", "source": "src", "sink_path": str(tmp_path / "deep"),
                               "rate_limit": 4000}])
        wait_for(lambda: "deep" in d.sources["src"].jobs and d.sources["src"].jobs["deep"].states is not None,
                 what="the job attached")
        # the leader of partition 0 dies while the job copies its history
        assert not finished(d, "deep")
        first = cluster.leader(topic, 0)
        cluster.kill(first)
        _new_leader(cluster, topic, 0, first)
        # /health: degraded (its partitions under-replicated), still ok (200) and ready, the cause named
        health = wait_for(lambda: (h := d.health())["status"] == "degraded" and h, timeout=60,
                          what="/health degraded")
        assert health["ok"] and health["ready"]
        assert any("under-replicated" in why for why in health["sources"]["src"]["degraded"])
        from prometheus_client import REGISTRY

        from source_backfill import metrics

        gauge = metrics.KAFKA_PARTITIONS_UNDER_REPLICATED._name  # noqa: SLF001
        assert (REGISTRY.get_sample_value(gauge, {"source": "src"}) or 0) >= 1
        leaderless = metrics.KAFKA_PARTITIONS_NO_LEADER._name  # noqa: SLF001
        assert REGISTRY.get_sample_value(leaderless, {"source": "src"}) == 0  # a new leader was elected
        cluster.restart(first)
        wait_for(lambda: finished(d, "deep"), timeout=300, what="the backfill finished")
        wait_for(lambda: d.health()["status"] == "ok", timeout=120, what="/health ok once in sync again")
        # now the live stream's leader of partition 1
        second = cluster.leader(topic, 1)
        cluster.kill(second)
        _new_leader(cluster, topic, 1, second)
        time.sleep(3 * INTERVAL_S)
        cluster.restart(second)
        assert d.registry.get("deep").error is None
    finally:
        p.stop()
    exactly_once(tmp_path / "deep", cluster.bootstrap, [topic])

def test_every_node_restarted_in_turn_under_acks_all_ends_exactly_once(cluster, topic, daemon_on, tmp_path):
    p = _producer(cluster, topic)
    p.send(20_000, PARTITIONS)
    p.stream(PARTITIONS, per_second=100)
    try:
        d = daemon_on(topic, [{"name": "rolled", "source": "src", "sink_path": str(tmp_path / "rolled"),
                               "rate_limit": 2000}])
        for node in sorted(cluster.nodes):  # a rolling restart, as an upgrade does
            cluster.kill(node)
            time.sleep(2)
            cluster.restart(node)
            wait_for(lambda: all(len(cluster.in_sync(topic, q)) == 3 for q in range(PARTITIONS)),
                     timeout=120, what="every replica in sync again")
        wait_for(lambda: finished(d, "rolled"), timeout=300, what="the backfill finished")
        assert d.registry.get("rolled").error is None
    finally:
        p.stop()
    exactly_once(tmp_path / "rolled", cluster.bootstrap, [topic])

def _java_hash(text: str) -> int:
    """Java's ``String.hashCode`` (Kafka places a transactional id by it)."""
    h = 0
    for ch in text:
        h = (31 * h + ord(ch)) & 0xFFFFFFFF
    return h - (1 << 32) if h & 0x80000000 else h

def _coordinator(cluster, txn_id: str) -> int:
    """The node coordinating ``txn_id``: the leader of its ``__transaction_state`` partition."""
    from connectors.kafka.embedded import BROKER_DEFAULTS

    partitions = int(BROKER_DEFAULTS["transaction.state.log.num.partitions"])
    return cluster.leader("__transaction_state", (_java_hash(txn_id) & 0x7FFFFFFF) % partitions)

def test_the_transaction_coordinator_killed_mid_transaction_aborted_never_committed_once(
    cluster, topic, daemon_on, tmp_path
):
    """A transactional producer whose coordinator's node dies inside a transaction: the records of the
    transactions that committed are in the table once, those of aborted ones (by the producer, or by the
    coordinator's failover) never."""
    import threading

    from confluent_kafka import KafkaException, Producer
    from deltalake import DeltaTable

    txn_id = f"tx-{uuid.uuid4().hex[:10]}"
    committed: list[str] = []
    stop, inside = threading.Event(), threading.Event()

    def produce() -> None:
        producer = Producer({"bootstrap.servers": cluster.bootstrap, "transactional.id": txn_id,
                             "transaction.timeout.ms": 20000, "log_level": 0})
        producer.init_transactions(60)
        def finish(commit: bool) -> bool:
            """Commit (or abort) the open transaction, asking again while the outcome is not known."""
            while True:
                try:
                    if commit:
                        producer.commit_transaction(60)
                    else:
                        producer.abort_transaction(60)
                    return commit
                except KafkaException as exc:
                    err = exc.args[0]
                    if err.retriable():
                        continue  # the outcome is not known yet: the same call again
                    if err.txn_requires_abort():
                        producer.abort_transaction(60)
                        return False
                    raise

        n = 0
        while not stop.is_set():
            values = [f"t{n}-{i}" for i in range(20)]
            producer.begin_transaction()
            try:
                for v in values:
                    producer.produce(topic, value=v.encode(), partition=n % PARTITIONS)
                inside.set()
                producer.flush(30)
                time.sleep(0.05)
                ok = True
            except KafkaException:
                ok = False
            if finish(ok and n % 3 != 2):
                committed.extend(values)
            n += 1

    thread = threading.Thread(target=produce, daemon=True)
    thread.start()
    try:
        d = daemon_on(topic, [{"name": "tx", "source": "src", "sink_path": str(tmp_path / "tx")}])
        wait_for(lambda: len(committed) >= 200, timeout=120, what="transactions committed")
        node = wait_for(lambda: (c := _coordinator(cluster, txn_id)) > 0 and c, what="the coordinator")
        inside.clear()
        inside.wait(30)  # inside a transaction
        cluster.kill(node)
        wait_for(lambda: (c := _coordinator(cluster, txn_id)) not in (-1, node) and c, timeout=120,
                 what="a new coordinator")
        cluster.restart(node)
        have = len(committed)
        wait_for(lambda: len(committed) >= have + 200, timeout=180, what="transactions after the failover")
    finally:
        stop.set()
        thread.join(120)
    exactly_once(tmp_path / "tx", cluster.bootstrap, [topic])
    values = DeltaTable(str(tmp_path / "tx")).to_pyarrow_table(columns=["value"]).column("value").to_pylist()
    got = sorted(v.decode() for v in values)
    assert got == sorted(committed)  # each committed record once, nothing of an aborted transaction
    assert d.registry.get("tx").error is None


# -- broker quotas and partition reassignment (issue 49) ----------------------------------------------------

#: The client quota of the quota test: ``consumer_byte_rate`` per client id, per broker (bytes/s).
QUOTA = 64 * 1024
#: Kafka's quota window: 11 samples of 1 s, its rate taken over at least 10 s, so a client reads
#: ``10 * QUOTA`` bytes (640 KiB) of a broker before it is throttled, and a fetch carries at most that
#: much. A fetch over the client's quota is answered empty (the broker takes its bytes back) after the
#: throttle: so a record batch larger than ``10 * QUOTA`` is never delivered to that client at all
#: (docs/guides/kafka-failures.md). Each read here is 1 MiB of one partition: over the allowance, and more
#: than one fetch.
READ_BYTES = 1 << 20
#: A record's value; the producer's batches are at most ``BATCH`` bytes, well under ``10 * QUOTA``.
VALUE = 1024
BATCH = 128 * 1024


def _send_bytes(cluster, topic: str, partition: int, tag: str, total: int = READ_BYTES,
                batch: int = BATCH, linger_ms: int = 20) -> int:
    """Write ``total`` bytes of ``VALUE``-byte records to ``partition`` (acks=all) in record batches of at
    most ``batch`` bytes; their count."""
    from confluent_kafka import Producer as KafkaProducer

    count = -(-total // VALUE)
    failed: list[str] = []
    producer = KafkaProducer({"bootstrap.servers": cluster.bootstrap, "acks": "all", "linger.ms": linger_ms,
                              "batch.size": batch, "enable.idempotence": True, "log_level": 0})
    value = bytes(range(256)) * (VALUE // 256)
    for i in range(count):
        while True:
            try:
                producer.produce(topic, key=f"{tag}{i}".encode(), value=value, partition=partition,
                                 on_delivery=lambda err, _m: err is not None and failed.append(str(err)))
                break
            except BufferError:
                producer.poll(0.5)
    assert producer.flush(60) == 0 and not failed, failed[:3]
    return count


def _table_ends(table) -> dict[int, int]:
    """The table's highest offset by partition (``-1``: none)."""
    from deltalake import DeltaTable

    if not (table / "_delta_log").exists():
        return {}
    rows = DeltaTable(str(table)).to_pyarrow_table(columns=["partition", "offset"])
    top = rows.group_by("partition").aggregate([("offset", "max")]).to_pylist()
    return {int(r["partition"]): int(r["offset_max"]) for r in top}


def _log_ends(cluster, topic: str, partitions: int) -> dict[int, int]:
    from connectors.kafka.admin import KafkaAdmin
    from source_backfill.core.splits import split_id

    admin = KafkaAdmin(cluster.bootstrap)
    try:
        ends = admin.end_offsets([split_id(topic, q) for q in range(partitions)])
    finally:
        admin.close()
    return {q: ends[split_id(topic, q)] for q in range(partitions)}


def _no_errors(d, job: str, errors_before: float) -> None:
    """The job and its source saw no error: no failed state, no read error counted, no query failure."""
    from source_backfill import metrics
    from tests.integration.daemon.conftest import metric_total

    record = d.registry.get(job)
    assert record.error is None, record.error
    assert (d.registry.progress(job).last_error or None) is None
    assert d.sources["src"].error is None and d.sources["src"].query_failures == 0
    assert metric_total(metrics.SOURCE_ERRORS) == errors_before  # no history read or live query failed
    assert d.health()["ok"]


def test_a_broker_quota_slows_history_and_live_reads_never_fails_them_and_ends_exactly_once(
    cluster, daemon_on, tmp_path, monkeypatch
):
    """A ``consumer_byte_rate`` quota on every client id (the entity default, as ``kafka-configs.sh
    --entity-type clients --entity-default`` sets it): the brokers throttle each of the daemon's readers —
    Spark's history consumers, the driver's librdkafka reader of small live batches, Spark's streaming
    consumer of a large one — as their own quota metrics show, and the job ends exactly once, with no
    error, no failed state and no read retried."""
    from source_backfill import metrics
    from source_backfill.runtime import source as live_source
    from tests.integration.daemon.conftest import metric_total

    topic = f"quota-{uuid.uuid4().hex[:8]}"
    cluster.create_topic(topic, [[1, 2, 3], [2, 3, 1]])  # partition 0 led by node 1, partition 1 by node 2
    for q in (0, 1):
        _send_bytes(cluster, topic, q, f"h{q}-")
    leaders = {q: cluster.leader(topic, q) for q in (0, 1)}
    errors_before = metric_total(metrics.SOURCE_ERRORS)
    table = tmp_path / "throttled"
    cluster.set_client_quota({"consumer_byte_rate": QUOTA})
    t0 = time.monotonic()
    try:
        with cluster.watch_fetch_throttle() as watch:
            d = daemon_on(topic, [{"name": "throttled", "source": "src", "sink_path": str(table)}])
            wait_for(lambda: finished(d, "throttled"), timeout=300, what="the backfill finished")
            print(f"history copied at {time.monotonic() - t0:.1f} s")
            # each partition's history was read by a Spark consumer its leader throttled
            history = {node for (node, client), ms in watch.throttled().items()
                       if "source-backfill-src-history" in client and ms > 0}
            assert set(leaders.values()) <= history, (leaders, watch.throttled(), watch.clients())

            # a live burst: a small batch (by its offsets), read on the driver by librdkafka
            _send_bytes(cluster, topic, 0, "live-rdkafka-")
            end = _log_ends(cluster, topic, 2)[0]
            wait_for(lambda: _table_ends(table).get(0, -1) >= end - 1, timeout=180,
                     what="the librdkafka live burst copied")
            wait_for(lambda: watch.throttled().get((leaders[0], "rdkafka"), 0) > 0, timeout=60,
                     what=f"the driver's librdkafka reader throttled by node {leaders[0]}")
            print(f"librdkafka live burst copied at {time.monotonic() - t0:.1f} s")

            # every live batch through Spark's streaming consumer (as one of over 100,000 rows goes)
            monkeypatch.setattr(live_source, "SMALL_BATCH_ROWS", 0)
            _send_bytes(cluster, topic, 1, "live-spark-")
            end = _log_ends(cluster, topic, 2)[1]
            wait_for(lambda: _table_ends(table).get(1, -1) >= end - 1, timeout=180,
                     what="the Spark live burst copied")
            wait_for(lambda: any(node == leaders[1] and "spark-kafka-source" in client
                                 for node, client in watch.throttled()), timeout=60,
                     what=f"Spark's streaming consumer throttled by node {leaders[1]}")
            throttled = watch.throttled()
            print(f"Spark live burst copied at {time.monotonic() - t0:.1f} s")
    finally:
        cluster.set_client_quota({"consumer_byte_rate": None})
    print(f"throttled clients (node, client id): peak throttle-time ms: {throttled}")
    _no_errors(d, "throttled", errors_before)
    exactly_once(table, cluster.bootstrap, [topic])


def test_a_record_batch_over_the_quota_window_holds_the_history_read_skips_nothing_until_the_quota_allows_it(
    cluster, daemon_on, tmp_path
):
    """Kafka answers a fetch that would put a client over its quota empty, after the throttle (it takes the
    bytes back), and a fetch carries at least one whole record batch: a batch larger than the quota's
    window (10 s x ``consumer_byte_rate``) never reaches that client. The daemon's history read of it
    times out at the source's ``poll_timeout_s`` and is retried with backoff: the job is not failed and
    copies nothing past the batch (its partition waits for it), the source's other jobs copy the live
    records meanwhile; once the quota is raised over the batch's size / 10 s the job ends exactly once."""
    from source_backfill import metrics
    from tests.integration.daemon.conftest import metric_total

    topic = f"quota-batch-{uuid.uuid4().hex[:8]}"
    cluster.create_topic(topic, [[1, 2, 3]])
    # one record batch of ~930 KB (under librdkafka's batch.size and the broker's max.message.bytes,
    # Kafka's defaults): more than the 640 KiB a client of QUOTA may fetch in the window
    n = _send_bytes(cluster, topic, 0, "big-", total=900 * VALUE, batch=1_000_000, linger_ms=5_000)
    errors_before = metric_total(metrics.SOURCE_ERRORS, job="held")
    table = tmp_path / "held"
    cluster.set_client_quota({"consumer_byte_rate": QUOTA})
    try:
        # a 10 s stall deadline (60 s by default) for a short test; "beside" copies live records only
        d = daemon_on(topic, [{"name": "held", "source": "src", "sink_path": str(table)},
                              {"name": "beside", "source": "src", "sink_path": str(tmp_path / "beside"),
                               "start": {"kind": "latest"}}], poll_timeout_s=10)
        wait_for(lambda: metric_total(metrics.SOURCE_ERRORS, job="held") >= errors_before + 2, timeout=180,
                 what="the history read timed out, and again once retried")
        progress = d.registry.progress("held")
        # Spark's consumer: "Cannot fetch record for offset 0 in 10000 milliseconds", or its offset lookup
        # on the muted connection: "Timeout of 3333ms expired before the position ... could be determined"
        assert "TimeoutException" in (progress.last_error or ""), progress.last_error
        assert d.registry.get("held").error is None  # retried, not failed
        assert not finished(d, "held") and progress.rows_history == 0  # nothing skipped
        # the live stream goes on: small batches after the big one are copied by the job beside
        wait_for(lambda: job_of(d, "beside") is not None and job_of(d, "beside").states is not None,
                 what="the job beside attached")
        _send_bytes(cluster, topic, 0, "live-", total=20 * VALUE, batch=4 * VALUE)
        wait_for(lambda: _table_ends(tmp_path / "beside").get(0, -1) == n + 19, timeout=120,
                 what="the live records copied by the job beside")
        assert d.registry.progress("held").rows_history == 0 and not finished(d, "held")
        assert _table_ends(table).get(0, -1) == -1  # nothing past the held batch
        # a quota whose window holds the batch: the read gets it
        cluster.set_client_quota({"consumer_byte_rate": 2 * QUOTA})
        wait_for(lambda: finished(d, "held"), timeout=180, what="the backfill finished")
    finally:
        cluster.set_client_quota({"consumer_byte_rate": None})
    assert d.registry.get("held").error is None and d.registry.get("beside").error is None
    exactly_once(table, cluster.bootstrap, [topic])


def test_partitions_reassigned_to_other_brokers_mid_backfill_end_exactly_once_with_live_after(
    cluster, daemon_on, tmp_path
):
    """A topic of replication 2 on nodes A and B; while a rate-limited job copies its history, under a
    live producer (``acks=all``), both partitions move to other nodes (``alterPartitionReassignments``),
    each losing its leader's replica: the job reads on from the new leaders, copies what was written
    after the move, and ends exactly once, offset by offset."""
    from source_backfill import metrics
    from tests.integration.daemon.conftest import metric_total

    a, b, c = sorted(cluster.nodes)
    topic = f"reassign-{uuid.uuid4().hex[:8]}"
    cluster.create_topic(topic, [[a, b], [b, a]])
    errors_before = metric_total(metrics.SOURCE_ERRORS)
    table = tmp_path / "moved"
    p = _producer(cluster, topic)
    p.send(30_000, 2)
    p.stream(2, per_second=50)
    try:
        # 200 rows/s: the history outlasts the move by minutes, whatever the machine's load
        d = daemon_on(topic, [{"name": "moved", "source": "src", "sink_path": str(table), "rate_limit": 200}])
        wait_for(lambda: (pr := d.registry.progress("moved")) is not None and pr.rows_history >= 1_000,
                 timeout=180, what="the backfill under way")
        before = {q: cluster.leader(topic, q) for q in (0, 1)}
        # each partition to C (which had none of the topic) and its follower: its leader's replica goes
        target = {q: [c, *({a, b} - {before[q]})] for q in (0, 1)}
        at_start, t0 = d.registry.progress("moved").rows_history, time.monotonic()
        cluster.reassign(topic, target)
        leaders = cluster.wait_reassigned(topic, target)
        for q in (0, 1):
            assert leaders[q] in target[q] and leaders[q] != before[q]
            assert before[q] not in cluster.replicas(topic, q)
        assert not finished(d, "moved")  # the move completed mid-backfill
        copied = d.registry.progress("moved").rows_history
        moved_at = _log_ends(cluster, topic, 2)
        print(f"leaders {before} -> {leaders} in {time.monotonic() - t0:.1f} s; history rows copied "
              f"{at_start} at the move's start, {copied} at its end; log ends then {moved_at}")
        # history read from the new leaders, and live records written to them
        wait_for(lambda: d.registry.progress("moved").rows_history >= copied + 1_000, timeout=180,
                 what="history copied after the move")
        wait_for(lambda: all(e >= moved_at[q] + 100 for q, e in _log_ends(cluster, topic, 2).items()),
                 timeout=120, what="live records written after the move")
        d.registry.throttle("moved", None)  # the rest need not crawl
        wait_for(lambda: finished(d, "moved"), timeout=300, what="the backfill finished")
        wait_for(lambda: all(_table_ends(table).get(q, -1) >= moved_at[q] + 99 for q in (0, 1)), timeout=120,
                 what="the live records written after the move copied")
    finally:
        p.stop()
    exactly_once(table, cluster.bootstrap, [topic])
    _no_errors(d, "moved", errors_before)
    wait_for(lambda: d.health()["status"] == "ok", timeout=60, what="/health ok: every replica in sync")
