"""Split ids ``topic:partition``: one parser, the last ``:`` separates (Kafka topics may not hold one,
but the ids are read from state files and API input, so a ``:`` in the topic part is kept whole)."""

from __future__ import annotations

import pytest

from source_backfill.config import OffsetsStart
from source_backfill.core.splits import parse_split_id, split_id, split_topic
from source_backfill.errors import StateFormatError


@pytest.mark.parametrize(("split", "parsed"), [
    ("t:0", ("t", 0)),
    ("orders:12", ("orders", 12)),
    ("a:b:3", ("a:b", 3)),  # the last ':' separates
    ("t::4", ("t:", 4)),
    ("t:007", ("t", 7)),
    ("my.topic-1_x:2", ("my.topic-1_x", 2)),
])
def test_a_split_id_parses_into_topic_and_partition(split, parsed):
    assert parse_split_id(split) == parsed
    assert split_topic(split) == parsed[0]


@pytest.mark.parametrize("split", ["t", "t:", ":3", "", "t:-1", "t: 3", "t:3 ", "t:x", "t:²", "t:٣", "t:3.0"])
def test_what_is_not_topic_colon_partition_raises(split):
    with pytest.raises(StateFormatError, match="is not"):
        parse_split_id(split)
    with pytest.raises(StateFormatError):
        split_topic(split)


def test_split_id_round_trips():
    for topic, partition in [("t", 0), ("a:b", 11)]:
        assert parse_split_id(split_id(topic, partition)) == (topic, partition)


@pytest.mark.parametrize("split", ["t:²", "t:", ":1", "t"])
def test_a_start_at_offsets_checks_its_split_ids_with_the_same_parser(split):
    with pytest.raises(ValueError, match=f'split id "{split}" is not "topic:partition"'):
        OffsetsStart(offsets={split: 1})
    assert OffsetsStart(offsets={"a:b:2": 5}).offsets == {"a:b:2": 5}
