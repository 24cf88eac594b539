"""``verify``: a job's table against the Kafka log, offset by offset, up to the job's committed positions."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest
from deltalake import CommitProperties, write_deltalake

from connectors.delta.log import KEY_JOB, KEY_PLAN, KEY_STATE
from source_backfill.config import LatestStart, OffsetsStart
from source_backfill.errors import VerifyRefusedError
from source_backfill.verify import verify_job


def _table(path, topic, offsets, *, job="late-copy", states=None, end=None, columns=None):
    """A job's table as its sink writes it: the rows, and the job's state and plan in the commit."""
    rows = {"topic": [topic] * len(offsets), "partition": [0] * len(offsets), "offset": offsets,
            "value": [b"x"] * len(offsets)}
    if columns is not None:
        rows = {k: v for k, v in rows.items() if k in columns}
    meta = {KEY_JOB: job, KEY_STATE: json.dumps({"version": 1, "splits": states}),
            KEY_PLAN: json.dumps({"budget": 0, "history": [], "end": end or {}})}
    write_deltalake(str(path), pa.table(rows), mode="overwrite",
                    commit_properties=CommitProperties(custom_metadata=meta))


def _finished(split, last):
    return {split: {"stage": "finished", "offset": last, "num_consumed_rows": 0, "target_offset": last}}


@pytest.fixture
def log(topic_factory, transactional_producer):
    """A topic whose log has gaps: committed records, an aborted transaction, markers."""
    topic = topic_factory(1)
    first = transactional_producer.commit(topic, [b"a"] * 20, partition=0)
    aborted = transactional_producer.abort(topic, [b"z"] * 3, partition=0)
    last = transactional_producer.commit(topic, [b"b"] * 10, partition=0)
    committed = [o for _, o in first + last]
    return topic, committed, [o for _, o in aborted]


def test_an_exact_table_passes_and_one_removed_one_duplicated_fails(log, kafka_admin, kafka_bootstrap,
                                                                  tmp_path):
    topic, committed, aborted = log
    split, end = f"{topic}:0", committed[-1] + 2  # the commit marker after the last record
    t = tmp_path / "t"
    _table(t, topic, committed, states=_finished(split, end - 1), end={split: end})
    result = verify_job(str(t), "late-copy", kafka_admin, kafka_bootstrap, batch_rows=7)  # several batches
    assert result.ok, result.summary()
    assert result.summary() == f"late-copy: exactly once, {len(committed)} records, 0 missing, 0 duplicated"

    broken = [o for o in committed if o != committed[5]] + [committed[7]]
    _table(t, topic, broken, states=_finished(split, end - 1), end={split: end})
    result = verify_job(str(t), "late-copy", kafka_admin, kafka_bootstrap)
    assert not result.ok
    first = result.summary().splitlines()[0]
    assert first == f"late-copy: NOT exactly once, {len(committed)} records, 1 missing, 1 duplicated"
    tally = result.splits[split]
    assert tally.examples["missing"] == [committed[5]] and tally.examples["duplicated"] == [committed[7]]

    # an aborted transaction's record in the table is named: the log has no such record
    _table(t, topic, [*committed, aborted[0]], states=_finished(split, end - 1), end={split: end})
    result = verify_job(str(t), "late-copy", kafka_admin, kafka_bootstrap)
    assert not result.ok and result.totals()["unexpected"] == 1
    assert result.splits[split].examples["unexpected"] == [aborted[0]]


def test_only_what_the_job_committed_is_checked(log, kafka_admin, kafka_bootstrap, tmp_path):
    topic, committed, _ = log
    split, t = f"{topic}:0", tmp_path / "t"
    b = committed[9]  # still backfilling: history copied up to b, live rows above it not yet the job's
    states = {split: {"stage": "backfilling", "offset": b, "num_consumed_rows": 10, "target_offset": 40}}
    _table(t, topic, committed[:10], states=states, end={split: committed[-1] + 2})
    result = verify_job(str(t), "late-copy", kafka_admin, kafka_bootstrap)
    assert result.ok and result.totals()["records"] == 10, result.summary()
    # a start offset: the records before it are not the job's
    _table(t, topic, committed[3:10], states=states, end={})
    result = verify_job(str(t), "late-copy", kafka_admin, kafka_bootstrap,
                        start=OffsetsStart(kind="offsets", offsets={split: committed[3]}))
    assert result.ok and result.totals()["records"] == 7, result.summary()
    # a latest start: from the first row the table holds (the job's attach position is in no commit)
    end = committed[-1] + 2
    _table(t, topic, committed[12:], states=_finished(split, end - 1), end={split: end})
    result = verify_job(str(t), "late-copy", kafka_admin, kafka_bootstrap, start=LatestStart(kind="latest"),
                        batch_rows=5)
    assert result.ok and result.totals()["records"] == len(committed) - 12, result.summary()


def test_a_table_without_offset_columns_or_of_another_job_is_refused(log, kafka_admin, kafka_bootstrap,
                                                                     tmp_path):
    topic, committed, _ = log
    split, t = f"{topic}:0", tmp_path / "t"
    _table(t, topic, committed, states=_finished(split, 40), end={split: 41}, columns={"value"})
    with pytest.raises(VerifyRefusedError, match="topic/partition/offset.*transform drops them"):
        verify_job(str(t), "late-copy", kafka_admin, kafka_bootstrap)
    _table(tmp_path / "u", topic, committed, job="other", states=_finished(split, 40), end={split: 41})
    with pytest.raises(VerifyRefusedError, match='belongs to job "other"'):
        verify_job(str(tmp_path / "u"), "late-copy", kafka_admin, kafka_bootstrap)


def test_a_job_whose_newest_commit_is_a_state_delta_is_checked_through_its_chain(
    log, kafka_admin, kafka_bootstrap, tmp_path
):
    """The sink's format 2: a snapshot, then deltas carrying only what moved (here the split finishing)."""
    topic, committed, _ = log
    split, t, end = f"{topic}:0", tmp_path / "t", committed[-1] + 2
    b = committed[9]
    backfilling = {split: {"stage": "backfilling", "offset": b, "num_consumed_rows": 10, "target_offset": 40}}
    snapshot = {"version": 2, "kind": "snapshot", "splits": backfilling, "end": {split: end}}
    rows = {"topic": [topic] * 10, "partition": [0] * 10, "offset": committed[:10], "value": [b"x"] * 10}
    write_deltalake(str(t), pa.table(rows), mode="overwrite", commit_properties=CommitProperties(
        custom_metadata={KEY_JOB: "late-copy", KEY_STATE: json.dumps(snapshot)}))
    delta = {"version": 2, "kind": "delta", "base": 0, "prev": 0, "splits": _finished(split, end - 1),
             "end": {}}
    rest = committed[10:]
    rows = {"topic": [topic] * len(rest), "partition": [0] * len(rest), "offset": rest,
            "value": [b"x"] * len(rest)}
    write_deltalake(str(t), pa.table(rows), mode="append", commit_properties=CommitProperties(
        custom_metadata={KEY_JOB: "late-copy", KEY_STATE: json.dumps(delta)}))
    result = verify_job(str(t), "late-copy", kafka_admin, kafka_bootstrap)
    assert result.ok and result.totals()["records"] == len(committed), result.summary()

    # the chain's snapshot garbled in the log: refused saying so, never a guess
    first = t / "_delta_log" / f"{0:020d}.json"
    actions = [json.loads(line) for line in first.read_text().splitlines()]
    for action in actions:
        if KEY_STATE in action.get("commitInfo", {}):
            action["commitInfo"][KEY_STATE] = json.dumps({"version": 2, "kind": "snapshot"})
    first.write_text("\n".join(map(json.dumps, actions)) + "\n")
    with pytest.raises(VerifyRefusedError, match="state in its table cannot be read"):
        verify_job(str(t), "late-copy", kafka_admin, kafka_bootstrap)


def _records(bootstrap, topic):
    """The log's committed records of partition 0: ``(offset, key, value, timestamp ms)``."""
    from confluent_kafka import Consumer, TopicPartition

    from connectors.kafka.admin import consume_available, consumer_config

    consumer = Consumer(consumer_config(bootstrap, None, **{
        "enable.auto.commit": False, "isolation.level": "read_committed", "enable.partition.eof": True}))
    consumer.assign([TopicPartition(topic, 0, 0)])
    out, ended = [], False
    while not ended:
        for msg in consume_available(consumer, 1000, 5.0):
            if msg.error() is not None:
                ended = True
            else:
                out.append((msg.offset(), msg.key(), msg.value(), msg.timestamp()[1]))
    consumer.close()
    return out


def _content_table(path, topic, records, end):
    """A job's table keeping Kafka's columns (the identity transform's), its state finished at ``end``."""
    from datetime import UTC, datetime

    split = f"{topic}:0"
    rows = pa.table({
        "key": pa.array([r[1] for r in records], pa.binary()),
        "value": pa.array([r[2] for r in records], pa.binary()),
        "topic": [topic] * len(records), "partition": pa.array([0] * len(records), pa.int32()),
        "offset": pa.array([r[0] for r in records], pa.int64()),
        "timestamp": pa.array([datetime.fromtimestamp(r[3] / 1000, UTC) for r in records],
                              pa.timestamp("us", tz="UTC")),
    })
    meta = {KEY_JOB: "late-copy", KEY_STATE: json.dumps({"version": 1, "splits": _finished(split, end - 1)}),
            KEY_PLAN: json.dumps({"budget": 0, "history": [], "end": {split: end}})}
    write_deltalake(str(path), rows, mode="overwrite",
                    commit_properties=CommitProperties(custom_metadata=meta))


def test_a_copy_whose_contents_are_not_the_logs_is_reported_by_offset_range(log, kafka_admin,
                                                                             kafka_bootstrap, tmp_path):
    """Every offset once but two records' contents other than the log's (a log truncated and written again
    since the copy): verify names the range, where comparing offsets alone passes."""
    topic, committed, _ = log
    records = _records(kafka_bootstrap, topic)
    assert [r[0] for r in records] == committed
    end, t = committed[-1] + 2, tmp_path / "t"
    _content_table(t, topic, records, end)
    result = verify_job(str(t), "late-copy", kafka_admin, kafka_bootstrap, batch_rows=7)
    assert result.ok and result.contents_compared, result.summary()
    assert result.summary() == f"late-copy: exactly once, {len(committed)} records, 0 missing, 0 duplicated"

    changed = [r if r[0] != committed[4] else (r[0], r[1], b"not-a", r[3]) for r in records]
    changed = [r if r[0] != committed[25] else (r[0], r[1], r[2], r[3] + 1) for r in changed]
    _content_table(t, topic, changed, end)
    result = verify_job(str(t), "late-copy", kafka_admin, kafka_bootstrap, batch_rows=7)
    assert not result.ok
    tally = result.splits[f"{topic}:0"]
    assert (tally.missing, tally.duplicated, tally.unexpected) == (0, 0, 0)
    # offsets below 64 are one block: both changes fall in it
    assert tally.content_differs == [(committed[0], end)]
    lines = result.summary().splitlines()
    assert "contents differ in 1 offset range" in lines[0]
    assert f"contents differ at offsets [{committed[0]}, {end})" in lines[1]
    assert result.to_json()["splits"][f"{topic}:0"]["content_differs"] == [[committed[0], end]]
    # a job with a transform or decoding: its columns need not be the log's, so offsets only
    result = verify_job(str(t), "late-copy", kafka_admin, kafka_bootstrap, contents=False)
    assert result.ok and not result.contents_compared

    # an empty key where the log has none (or the other way) differs too
    _content_table(t, topic, [(o, b"" if k is None else None, v, ts) if o == committed[0] else (o, k, v, ts)
                              for o, k, v, ts in records], end)
    result = verify_job(str(t), "late-copy", kafka_admin, kafka_bootstrap)
    assert not result.ok and result.splits[f"{topic}:0"].content_differs == [(committed[0], end)]
    # a table without the content columns is compared by offsets only
    u = tmp_path / "u"
    _table(u, topic, committed, states=_finished(f"{topic}:0", end - 1), end={f"{topic}:0": end})
    result = verify_job(str(u), "late-copy", kafka_admin, kafka_bootstrap)
    assert result.ok and not result.contents_compared
