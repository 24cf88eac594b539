"""A partition's log truncated below what a job copied, for real: an unclean leader election.

A cluster of three brokers and one dedicated controller (``EmbeddedCluster(dedicated_controller=True)``:
the controller elects leaders while both replicas of the partition are down, which a quorum of
broker+controller nodes cannot). The topic's one partition has replicas on brokers A and B only,
``unclean.leader.election.enable = true``, ``min.insync.replicas = 1``. B stops; records acked by A alone
are copied by a job; A stops (the partition is offline); B comes back out of sync and is elected
uncleanly: its log ends below the job's committed offset. New records take the lost offsets; A comes back
and truncates its log to B's. The source's anchor check (``core/anchors.py``) finds the record it copied
gone: the job fails naming topic, partition and offsets, and ``kafka_truncations_total`` counts it.

Slow (``make test-slow``): four broker JVMs besides Spark and the suite's broker; each stop waits out the
controller's broker session timeout (3 s here).
"""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from source_backfill import metrics
from tests.integration.daemon.conftest import exactly_once, finished, job_spec, metric_total, wait_for

A, B = 1, 2


@pytest.fixture(scope="module")
def cluster():
    from connectors.kafka.cluster import EmbeddedCluster

    overrides = {"broker.session.timeout.ms": "3000", "broker.heartbeat.interval.ms": "500",
                 "min.insync.replicas": "1", "transaction.state.log.min.isr": "1",
                 "share.coordinator.state.topic.min.isr": "1"}
    with EmbeddedCluster(3, overrides=overrides, dedicated_controller=True) as c:
        yield c


def _topic(cluster: Any) -> str:
    """One partition on A and B only (leader A), unclean leader election allowed."""
    from confluent_kafka.admin import AdminClient, NewTopic

    name = f"trunc-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    admin.create_topics([NewTopic(name, num_partitions=1, replica_assignment=[[A, B]],
                                  config={"unclean.leader.election.enable": "true",
                                          "min.insync.replicas": "1"})])[name].result(30)
    wait_for(lambda: _leader(cluster, name) == A, timeout=60, what="A leads the new topic")
    return name


def _leader(cluster: Any, topic: str) -> int:
    """The partition's leader now (-1: none; -2: the metadata does not list the partition yet)."""
    try:
        return int(cluster.leader(topic, 0))
    except KeyError:
        return -2


def _send(cluster: Any, topic: str, tag: str, count: int) -> None:
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": ",".join(cluster.nodes[i].bootstrap for i in cluster.running()),
                  "acks": "all", "log_level": "0"})
    for i in range(count):
        p.produce(topic, key=f"{tag}{i}".encode(), value=f"{tag}-value-{i}".encode(), partition=0)
    assert p.flush(60) == 0, "records not acknowledged"


def _log_end(cluster: Any, topic: str) -> int:
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": ",".join(cluster.nodes[i].bootstrap for i in cluster.running()),
                  "group.id": "probe", "isolation.level": "read_committed", "log_level": "0"})
    try:
        return int(c.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)[1])
    finally:
        c.close()


def _anchor(state: Path) -> dict[str, Any]:
    """The source's newest anchors by split (``anchors.json``)."""
    path = state / "sources" / "src" / "anchors.json"
    return json.loads(path.read_text())["newest"] if path.exists() else {}


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_an_unclean_leader_election_below_the_copied_offsets_fails_the_job_naming_them(
    cluster, daemon_factory, tmp_path
):
    topic = _topic(cluster)
    split = f"{topic}:0"
    state = tmp_path / "state"
    before = metric_total(metrics.KAFKA_TRUNCATIONS, source="src")
    d = daemon_factory([topic], [job_spec("copied", tmp_path)], state_root=state,
                       bootstrap_servers=cluster.bootstrap, truncation_check_interval_s=2)
    wait_for(lambda: finished(d, "copied"), what="the job attached (an empty log: finished at once)")
    _send(cluster, topic, "a", 10)  # on A and B
    cluster.kill(B)
    wait_for(lambda: cluster.in_sync(topic, 0) == [A], timeout=60, what="B out of the in-sync replicas")
    _send(cluster, topic, "b", 20)  # acked by A alone: offsets 10..29
    assert _log_end(cluster, topic) == 30
    # the job copies them from the live stream; the anchor is the last one's (anchors come from live batches)
    wait_for(lambda: _anchor(state).get(split, {}).get("offset") == 29, what="the anchor at offset 29")
    report = exactly_once(tmp_path / "copied", cluster.bootstrap, [topic])
    assert report.splits[split].log_records == 30  # offsets 0..29 copied, b19 the last
    old = _anchor(state)[split]["fingerprint"]

    cluster.kill(A)  # the partition's only in-sync replica: offline
    wait_for(lambda: _leader(cluster, topic) == -1, timeout=60, what="the partition offline")
    cluster.restart(B)  # out of sync: elected uncleanly (the topic allows it), its log ends at 10
    wait_for(lambda: _leader(cluster, topic) == B, timeout=120, what="B elected uncleanly")
    truncated_end = _log_end(cluster, topic)
    assert truncated_end == 10, truncated_end  # below the job's committed offset 29: records lost
    _send(cluster, topic, "c", 40)  # new records take offsets 10..49 (past the old end: no offset says it)
    cluster.restart(A)
    wait_for(lambda: A in cluster.in_sync(topic, 0), timeout=120, what="A in sync again (truncated to B's)")

    error = wait_for(lambda: d.registry.get("copied").error, timeout=180, what="the job failed")
    assert f"topic {topic} partition 0 was truncated below what was copied: offset 29 held the record of " \
           f"fingerprint {old}" in error, error
    assert ("the log now ends at offset 10" in error or "another record is at offset 29" in error), error
    assert metric_total(metrics.KAFKA_TRUNCATIONS, source="src") >= before + 1
    # the split is anchored again in the log as it is now, and no job copies over the divergence
    wait_for(lambda: _anchor(state).get(split, {}).get("fingerprint") not in (None, old), timeout=60,
             what="a new anchor in the new log")
    assert d.sources["src"].error is None or "truncated" not in d.sources["src"].error
    assert "copied" not in d.sources["src"].jobs
    # verify compares contents too: each offset 0..29 is in the table once, but 10..29 are not the log's now
    result = d._verify_work("copied")()
    tally = result.splits[split]
    assert result.contents_compared and (tally.missing, tally.duplicated, tally.unexpected) == (0, 0, 0)
    assert not result.ok and tally.content_differs == [(0, 30)], result.summary()
    assert "contents differ at offsets [0, 30)" in result.summary()


@pytest.mark.integration
def test_a_source_folder_of_the_previous_release_without_anchors_starts_and_writes_them(
    daemon_factory, new_topic, producer_for, kafka_bootstrap, tmp_path
):
    """``anchors.json`` is new: a folder without it starts (no check, nothing failed) and writes it."""
    topic = new_topic(2)
    p = producer_for(topic)
    state = tmp_path / "state"
    d = daemon_factory([topic], [job_spec("j", tmp_path)], state_root=state)
    wait_for(lambda: finished(d, "j"), what="the job attached")
    p.send(200, 2)  # live: anchors come from the live batches
    wait_for(lambda: len(_anchor(state)) == 2, what="both splits anchored")
    d.stop()
    (state / "sources" / "src" / "anchors.json").unlink()  # as the previous release left the folder

    again = daemon_factory([topic], [job_spec("j", tmp_path)], state_root=state,
                           truncation_check_interval_s=1)
    wait_for(lambda: finished(again, "j"), what="the job resumed")
    p.send(100, 2, start=200)
    anchors = wait_for(lambda: (a := _anchor(state)) and min(x["offset"] for x in a.values()) >= 100 and a,
                       what="anchors written again past the new records")
    assert set(anchors) == {f"{topic}:0", f"{topic}:1"}
    time.sleep(3)  # a few periodic checks of the anchors just written: the log holds them
    assert again.registry.get("j").error is None
    exactly_once(tmp_path / "j", kafka_bootstrap, [topic])
