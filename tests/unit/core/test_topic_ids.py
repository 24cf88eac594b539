from source_backfill.core.topic_ids import Recreated, compare


def test_a_changed_id_is_a_recreated_topic_and_the_record_keeps_the_first_ids():
    recreated, keep = compare({"a": "x1", "b": "y1"}, {"a": "x2", "b": "y1", "c": "z1"})
    assert recreated == [Recreated("a", "x1", "x2")]
    assert keep == {"a": "x1", "b": "y1", "c": "z1"}  # a new topic (a pattern's) is recorded
    assert "topic a was deleted and created again (topic id x1, now x2)" == str(recreated[0])


def test_a_deleted_topic_keeps_its_record_until_it_comes_back():
    recreated, keep = compare({"a": "x1"}, {})
    assert recreated == [] and keep == {"a": "x1"}
    assert compare(keep, {"a": "x2"})[0] == [Recreated("a", "x1", "x2")]
    assert compare({}, {"a": "x1"}) == ([], {"a": "x1"})
