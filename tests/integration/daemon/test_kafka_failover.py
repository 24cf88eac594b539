"""Kafka as a cluster fails: three KRaft nodes (``connectors/kafka/cluster.py``), a partition's leader
SIGKILLed under a job's backfill and under the live stream, every node restarted in turn under a live
producer with ``acks=all`` — every job ends exactly once, offset by offset.

Slow (``make test-slow``): three broker JVMs, and each kill waits out the controller's broker session
timeout (3 s here; Kafka's default is 9 s) before a new leader is elected.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import pytest

from tests.integration.daemon.conftest import INTERVAL_S, Producer, exactly_once, finished, wait_for

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

    def make(topic: str, jobs: list[dict[str, Any]]) -> Any:
        return daemon_factory([topic], jobs, bootstrap_servers=cluster.bootstrap)

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
