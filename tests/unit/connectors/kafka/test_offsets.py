"""Offset planning of the kafka_py source without a broker: admission, ticks, new splits, data loss."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from connectors.kafka.ranges import KafkaRange, split_ranges
from connectors.kafka.source import (
    KafkaStreamReader,
    ReadMaxRows,
    _resolve_offsets,
    fair_advance,
    parse_ranges,
)
from connectors.kafka.stream import batch_offsets
from source_backfill.errors import DataLossError, KafkaConnectorError, UnknownTopicError
from tests.budget import examples


class FakeAdmin:
    """Splits and offsets held in dicts; ``earliest_calls`` counts earliest-offset lookups."""

    def __init__(self, topics, ends, earliest=None):
        self.topics = dict(topics)
        self.ends = dict(ends)
        self.earliest = dict(earliest or {})
        self.earliest_calls = 0

    def topic_partitions(self):
        return dict(self.topics)

    def list_splits(self, topics):
        missing = [t for t in topics if t not in self.topics]
        if missing:
            raise UnknownTopicError(str(missing))
        return [(t, p) for t in topics for p in range(self.topics[t])]

    def end_offsets(self, sids):
        return {s: self.ends.get(s, 0) for s in sids}

    def earliest_offsets(self, sids):
        self.earliest_calls += 1
        return {s: self.earliest.get(s, 0) for s in sids}

    def offsets_for_timestamp(self, sids, ts):
        return {s: ts for s in sids}


def _reader(admin, **options):
    reader = KafkaStreamReader({"kafka.bootstrap.servers": "unused:9092", **options})
    reader._admin_client = admin
    return reader


@given(
    st.dictionaries(st.text(min_size=1, max_size=3), st.integers(0, 1000), max_size=6), st.integers(0, 3000)
)
def test_fair_advance_grants_at_most_budget_and_available(available, budget):
    grant = fair_advance(available, budget)
    assert set(grant) == set(available)
    assert all(0 <= grant[s] <= available[s] for s in available)
    assert sum(grant.values()) == min(budget, sum(available.values()))


def test_split_ranges_cover_each_range_once():
    pieces = split_ranges([KafkaRange("t", 0, 3, 3), KafkaRange("t", 1, 0, 25)], max_size=10)
    assert [(p.partition, p.start, p.end, p.check_loss) for p in pieces] == [
        (1, 0, 9, True),
        (1, 9, 18, False),
        (1, 18, 25, False),
    ]


def test_parse_ranges_rejects_garbage():
    assert parse_ranges('[{"topic": "a:b", "partition": 1, "start": 2, "end": 5}]') == [
        KafkaRange("a:b", 1, 2, 5)
    ]
    with pytest.raises(KafkaConnectorError, match="ranges"):
        parse_ranges('[{"topic": "t"}]')


def test_resolve_offsets_json_with_earliest_latest_and_timestamp():
    admin = FakeAdmin({"t": 3}, {"t:0": 10, "t:1": 20, "t:2": 30}, earliest={"t:1": 4})
    sids = ["t:0", "t:1", "t:2"]
    spec = json.dumps({"t": {"0": 7, "1": -2}})
    assert _resolve_offsets(admin, sids, spec, "latest") == {"t:0": 7, "t:1": 4, "t:2": 30}
    assert _resolve_offsets(admin, sids, "earliest", "latest") == {"t:0": 0, "t:1": 4, "t:2": 0}
    assert _resolve_offsets(admin, sids, "earliest", "latest", timestamp_ms=99) == dict.fromkeys(sids, 99)
    with pytest.raises(KafkaConnectorError, match="neither"):
        _resolve_offsets(admin, sids, "yesterday", "latest")


def test_every_trigger_is_a_new_offset_even_without_data():
    admin = FakeAdmin({"t": 1}, {"t:0": 5})
    reader = _reader(admin, subscribe="t", startingOffsets="earliest")
    first = reader.initialOffset()
    assert first == {"splits": {"t:0": 0}, "tick": 0}
    a = reader.latestOffset(first, reader.getDefaultReadLimit())
    b = reader.latestOffset(a, reader.getDefaultReadLimit())
    assert a == {"splits": {"t:0": 5}, "tick": 1}
    assert b == {"splits": {"t:0": 5}, "tick": 2}  # idle: same splits, new tick -> Spark runs an epoch


def test_max_offsets_per_trigger_bounds_each_batch():
    admin = FakeAdmin({"t": 2}, {"t:0": 100, "t:1": 10})
    reader = _reader(admin, subscribe="t", startingOffsets="earliest", maxOffsetsPerTrigger="30")
    limit = reader.getDefaultReadLimit()
    assert isinstance(limit, ReadMaxRows) and limit.max_rows == 30
    offset = reader.initialOffset()
    sizes = []
    while offset["splits"] != {"t:0": 100, "t:1": 10}:
        nxt = reader.latestOffset(offset, limit)
        sizes.append(sum(nxt["splits"][s] - offset["splits"][s] for s in nxt["splits"]))
        offset = nxt
    assert sum(sizes) == 110 and max(sizes) <= 30


def test_new_split_is_born_at_its_earliest_and_replays_without_the_broker():
    admin = FakeAdmin({"t": 1}, {"t:0": 5})
    reader = _reader(admin, subscribe="t", startingOffsets="latest")
    start = reader.initialOffset()
    admin.topics["t"] = 2
    admin.ends["t:1"] = 9
    admin.earliest["t:1"] = 3
    end = reader.latestOffset(start, reader.getDefaultReadLimit())
    assert end == {"splits": {"t:0": 5, "t:1": 9}, "tick": 1, "born": {"t:1": 3}}
    # the replay (partitions planned again from the same offsets) needs no earliest lookup: exact range
    calls = admin.earliest_calls
    admin.earliest["t:1"] = 7  # retention moved on since
    parts = reader.partitions(start, end)
    assert [(p.partition, p.start, p.end) for p in parts] == [(1, 3, 9)]
    assert admin.earliest_calls == calls
    nxt = reader.latestOffset(end, reader.getDefaultReadLimit())
    assert "born" not in nxt


def test_offsets_going_backwards_fail_or_skip_by_fail_on_data_loss():
    admin = FakeAdmin({"t": 1}, {"t:0": 3})
    start = {"splits": {"t:0": 8}, "tick": 4}
    with pytest.raises(DataLossError, match="below the committed position"):
        _reader(admin, subscribe="t").latestOffset(start, None)
    skipped = _reader(admin, subscribe="t", failOnDataLoss="false").latestOffset(start, None)
    assert skipped == {"splits": {"t:0": 3}, "tick": 5}


def test_available_now_stops_at_the_ends_seen_when_prepared():
    admin = FakeAdmin({"t": 1}, {"t:0": 4})
    reader = _reader(admin, subscribe="t", startingOffsets="earliest", maxOffsetsPerTrigger="3")
    offset = reader.initialOffset()
    reader.prepareForTriggerAvailableNow()
    admin.ends["t:0"] = 50  # arrives after the trigger started: not part of this run
    offset = reader.latestOffset(offset, reader.getDefaultReadLimit())
    offset = reader.latestOffset(offset, reader.getDefaultReadLimit())
    assert offset["splits"] == {"t:0": 4}
    assert reader.latestOffset(offset, reader.getDefaultReadLimit()) == offset  # no new batch: the run ends


def test_unknown_topic_is_typed():
    with pytest.raises(UnknownTopicError):
        _reader(FakeAdmin({}, {}), subscribe="missing").initialOffset()


def _write_log(root, batch_id, offset):
    path = root / "offsets" / str(batch_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    meta = {"batchWatermarkMs": 0, "batchTimestampMs": 0, "conf": {}}
    path.write_text("v1\n" + json.dumps(meta) + "\n" + json.dumps(offset))


def test_batch_offsets_reads_the_offset_log(tmp_path):
    _write_log(tmp_path, 0, {"splits": {"t:0": 5}, "tick": 1})
    _write_log(tmp_path, 1, {"splits": {"t:0": 9, "t:1": 2}, "tick": 2, "born": {"t:1": 0}})
    assert batch_offsets(str(tmp_path), 0) == (None, {"t:0": 5})
    assert batch_offsets(str(tmp_path), 1) == ({"t:0": 5, "t:1": 0}, {"t:0": 9, "t:1": 2})
    with pytest.raises(KafkaConnectorError, match="does not exist"):
        batch_offsets(str(tmp_path), 7)


@settings(max_examples=examples(200), deadline=None)
@given(sizes=st.lists(st.integers(1, 1000), max_size=120), max_tasks=st.integers(1, 8))
def test_group_ranges_makes_at_most_max_tasks_partitions_covering_each_range_once(sizes, max_tasks):
    from connectors.kafka.ranges import KafkaRangeGroup, group_ranges

    ranges = [KafkaRange("t", i, 10, 10 + n) for i, n in enumerate(sizes)]
    parts = group_ranges(ranges, max_tasks)
    assert len(parts) == min(len(ranges), max_tasks)
    flat = [r for p in parts for r in (p.ranges if isinstance(p, KafkaRangeGroup) else (p,))]
    assert sorted(flat, key=lambda r: r.partition) == ranges  # every range once, none changed
    if len(ranges) > max_tasks:  # balanced: no group exceeds the lightest by more than one range's size
        loads = [sum(r.end - r.start for r in (p.ranges if isinstance(p, KafkaRangeGroup) else (p,)))
                 for p in parts]
        assert max(loads) - min(loads) <= max(sizes)


def test_group_ranges_refuses_zero_tasks():
    from connectors.kafka.ranges import group_ranges
    from source_backfill.errors import KafkaConnectorError

    with pytest.raises(KafkaConnectorError, match="maxTasks"):
        group_ranges([KafkaRange("t", 0, 0, 1)], 0)


def test_batch_offsets_reads_spark_kafka_offsets_with_the_tick_as_second_source(tmp_path):
    # Spark's Kafka source first, the tick (rate source) second; a new split has no start in the log
    for batch_id, offset in ((0, {"t": {"0": 5}}), (1, {"t": {"0": 9, "1": 2}})):
        path = tmp_path / "offsets" / str(batch_id)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("v1\n{}\n" + json.dumps(offset) + "\n" + str(batch_id + 3))
    assert batch_offsets(str(tmp_path), 0) == (None, {"t:0": 5})
    assert batch_offsets(str(tmp_path), 1) == ({"t:0": 5}, {"t:0": 9, "t:1": 2})
    (tmp_path / "offsets" / "2").write_text('v1\n{}\n{"t": ["not", "offsets"]}\n4')
    with pytest.raises(KafkaConnectorError, match="not a Kafka offset"):
        batch_offsets(str(tmp_path), 2)
