"""The tier planner against its offset-by-offset rule (core/tiers.py's table)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from source_backfill.core.tiers import Segment, Tier, normalized, plan_tiers, tier_of, tier_sizes

ranges = st.lists(st.tuples(st.integers(0, 60), st.integers(0, 60)), max_size=5)
sources = st.sampled_from(["auto", "archive", "kafka"])


def _covers(segments: list[Segment], start: int, target: int) -> bool:
    """Asserts the segments cover ``[start, target)`` once: contiguous, in order, none empty, neighbours
    of different tiers (or archives); False when there is nothing to cover (and no segment)."""
    if target == start:
        assert segments == []
        return False
    assert segments[0].start == start and segments[-1].end == target
    for a, b in zip(segments, segments[1:], strict=False):
        assert a.end == b.start and (a.tier, a.archive) != (b.tier, b.archive)
    assert all(s.size > 0 for s in segments)
    return True


@given(start=st.integers(0, 60), length=st.integers(0, 60), held=ranges, log_start=st.integers(0, 70),
       source=sources)
def test_segments_cover_the_history_once_and_agree_with_the_rule_offset_by_offset(start, length, held,
                                                                                  log_start, source):
    target = start + length
    segments = plan_tiers(start, target, held, log_start, source)
    if not _covers(segments, start, target):
        return
    by_offset = [s.tier for s in segments for _ in range(s.start, s.end)]
    assert by_offset == [tier_of(o, held, log_start, source) for o in range(start, target)]
    assert sum(tier_sizes(segments).values()) == length


def test_the_hand_over_boundary_is_exact():
    # the archive holds [0, 100); Kafka from 100 on: offset 99 from the archive, 100 from Kafka
    handed_over = [Segment(Tier.ARCHIVE, 0, 100), Segment(Tier.KAFKA, 100, 150)]
    assert plan_tiers(0, 150, [(0, 100)], 100) == handed_over
    # overlap: the archive is preferred where both hold; Kafka starts where the archive ends
    assert plan_tiers(0, 150, [(0, 100)], 40) == handed_over
    # the archive ends one short of the log start: that offset is lost (outside the archive's span)
    assert plan_tiers(0, 150, [(0, 99)], 100) == [
        Segment(Tier.ARCHIVE, 0, 99), Segment(Tier.LOSS, 99, 100), Segment(Tier.KAFKA, 100, 150)]
    # a hole inside the archive below the log start: a gap (a marker, trusted and counted)
    assert plan_tiers(0, 150, [(0, 50), (51, 100)], 100) == [
        Segment(Tier.ARCHIVE, 0, 50), Segment(Tier.GAP, 50, 51), Segment(Tier.ARCHIVE, 51, 100),
        Segment(Tier.KAFKA, 100, 150)]
    # the same hole above the log start is read from Kafka, which still has it
    assert plan_tiers(0, 150, [(0, 50), (51, 100)], 20)[1] == Segment(Tier.KAFKA, 50, 51)


def test_the_job_chooses_its_source():
    held = [(10, 100)]
    assert plan_tiers(0, 150, held, 50, "kafka") == [Segment(Tier.LOSS, 0, 50), Segment(Tier.KAFKA, 50, 150)]
    assert plan_tiers(0, 150, held, 50, "archive") == [
        Segment(Tier.LOSS, 0, 10), Segment(Tier.ARCHIVE, 10, 100), Segment(Tier.LOSS, 100, 150)]
    assert plan_tiers(0, 150, held, 50) == [
        Segment(Tier.LOSS, 0, 10), Segment(Tier.ARCHIVE, 10, 100), Segment(Tier.KAFKA, 100, 150)]
    # no archive: today's rule (below the log start is data loss)
    assert plan_tiers(0, 10, [], 5) == [Segment(Tier.LOSS, 0, 5), Segment(Tier.KAFKA, 5, 10)]


def test_held_ranges_are_merged_and_empty_ones_dropped():
    assert normalized([(5, 9), (0, 3), (3, 4), (8, 12), (20, 20), (7, 2)]) == [(0, 4), (5, 12)]
    assert tier_sizes(plan_tiers(0, 12, [(0, 4), (5, 12)], 100)) == {
        Tier.ARCHIVE: 11, Tier.KAFKA: 0, Tier.GAP: 1, Tier.LOSS: 0}


@given(start=st.integers(0, 60), length=st.integers(0, 60), helds=st.lists(ranges, min_size=1, max_size=3),
       log_start=st.integers(0, 70), source=sources)
def test_with_several_archives_each_offset_comes_from_the_first_that_holds_it(start, length, helds,
                                                                              log_start, source):
    from source_backfill.core.tiers import plan_tiers_many, tier_of_many

    target = start + length
    segments = plan_tiers_many(start, target, helds, log_start, source)
    if not _covers(segments, start, target):
        return
    by_offset = [(s.tier, s.archive) for s in segments for _ in range(s.start, s.end)]
    assert by_offset == [tier_of_many(o, helds, log_start, source) for o in range(start, target)]
    for o, (tier, index) in zip(range(start, target), by_offset, strict=True):  # the rule, spelled out
        holders = [i for i, h in enumerate(helds) if any(lo <= o < hi for lo, hi in h)]
        if source != "kafka" and holders:
            assert (tier, index) == (Tier.ARCHIVE, holders[0])
    # one archive: the same as plan_tiers
    assert plan_tiers_many(start, target, helds[:1], log_start, source) == plan_tiers(
        start, target, helds[0], log_start, source)


def test_a_second_archive_fills_the_first_one_s_hole_and_the_rest_is_kafka():
    from source_backfill.core.tiers import plan_tiers_many

    segments = plan_tiers_many(0, 100, [[(0, 40)], [(30, 60)]], 50)
    assert segments == [Segment(Tier.ARCHIVE, 0, 40, 0), Segment(Tier.ARCHIVE, 40, 60, 1),
                        Segment(Tier.KAFKA, 60, 100)]
    # below the log start, a hole in the first archive's span that the second holds is not a gap
    segments = plan_tiers_many(0, 100, [[(0, 10), (20, 30)], [(10, 15)]], 90)
    assert [(s.tier, s.start, s.end, s.archive) for s in segments] == [
        (Tier.ARCHIVE, 0, 10, 0), (Tier.ARCHIVE, 10, 15, 1), (Tier.GAP, 15, 20, 0),
        (Tier.ARCHIVE, 20, 30, 0), (Tier.LOSS, 30, 90, 0), (Tier.KAFKA, 90, 100, 0)]


@given(held=ranges, log_start=st.integers(0, 70), offsets=st.integers(0, 30))
def test_the_overlap_window_is_the_first_offsets_of_the_archive_s_span_kafka_still_holds(held, log_start,
                                                                                       offsets):
    """Against the rule spelled out offset by offset: the offsets ``o >= log_start`` inside the archive's
    span (from its first held offset to the end of its last range), the first ``offsets`` of them."""
    from source_backfill.core.tiers import overlap_window

    ranges_ = normalized(held)
    span = range(ranges_[0][0], ranges_[-1][1]) if ranges_ else range(0)
    want = [o for o in span if o >= log_start][:offsets]
    window = overlap_window(held, log_start, offsets)
    assert (list(range(*window)) if window else []) == want
    assert window is None or window[1] > window[0]


def test_the_overlap_window_at_its_edges():
    from source_backfill.core.tiers import overlap_window

    assert overlap_window([(0, 300)], 200, 1000) == (200, 300)  # to the archive's end
    assert overlap_window([(0, 300)], 200, 50) == (200, 250)  # check_offsets of it
    assert overlap_window([(0, 200)], 200, 50) is None  # ends at the log start: nothing overlaps
    assert overlap_window([(0, 300)], 200, 0) is None  # check_offsets = 0: not compared
    assert overlap_window([(250, 300)], 100, 1000) == (250, 300)  # the archive starts above the log start
    assert overlap_window([(0, 100), (250, 300)], 200, 1000) == (200, 300)  # a hole at the log start: in it


runs_of = st.lists(st.tuples(st.sampled_from(["t:0", "t:1"]), st.integers(0, 60), st.integers(0, 60)),
                   max_size=6)


@given(ranges=runs_of, runs=runs_of)
def test_whole_runs_take_each_offset_once_and_leave_the_rest_of_the_ranges(ranges, runs):
    from source_backfill.core.tiers import whole_runs

    def offsets(rs):
        return [(s, o) for s, lo, hi in rs for o in range(lo, hi)]

    wanted = set(offsets(ranges))
    taken, rest = whole_runs(ranges, runs)
    got = offsets(runs[i] for i in taken) + offsets(rest)
    assert len(got) == len(set(got)), "an offset taken twice, or both taken and left"
    assert set(got) == wanted
    assert taken == sorted(taken)
    assert all(hi > lo for _, lo, hi in rest)
    for i, run in enumerate(runs):
        inside = set(offsets([run])) <= wanted and run[2] > run[1]
        clashes = any(set(offsets([run])) & set(offsets([runs[j]])) for j in taken if j < i)
        # greedy: a non-empty run wholly inside the ranges is taken unless a run taken before overlaps it
        assert (i in taken) == (inside and not clashes), (i, run)


def test_whole_runs_cut_a_range_around_a_file_exactly():
    from source_backfill.core.tiers import whole_runs

    taken, rest = whole_runs([("t:0", 0, 100)], [("t:0", 10, 20), ("t:0", 90, 101), ("t:1", 0, 5)])
    assert taken == [0]  # the second pokes one offset past the range, the third is another split's
    assert rest == [("t:0", 0, 10), ("t:0", 20, 100)]
