"""A repair's window cut to the job's rows (core/repair.py) against its offset-by-offset rule."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from source_backfill.core import SplitState, Stage
from source_backfill.core.repair import cut_repair, windows_for

SPLITS = ["t:0", "t:1", "t:2"]
stages = st.sampled_from([Stage.FINISHED, Stage.BACKFILLING, Stage.SOURCE_CACHING_UP, None])


def _state(stage: Stage) -> SplitState:
    return SplitState(stage, 0 if stage is not Stage.BACKFILLING else None)


@given(lo=st.integers(0, 50), size=st.integers(1, 50), stage=st.lists(stages, min_size=3, max_size=3),
       starts=st.lists(st.integers(0, 60), min_size=3, max_size=3),
       covered=st.lists(st.integers(0, 80), min_size=3, max_size=3))
def test_each_offset_is_replaced_iff_the_job_holds_it_in_a_finished_split_inside_the_window(
        lo, size, stage, starts, covered):
    states = {s: _state(st_) for s, st_ in zip(SPLITS, stage, strict=True) if st_ is not None}
    start = dict(zip(SPLITS, starts, strict=True))
    end = dict(zip(SPLITS, covered, strict=True))
    cut = cut_repair(windows_for(SPLITS, lo, lo + size), states, start, end)
    replaced = {(r.split, o) for r in cut.ranges for o in range(r.start, r.end)}
    assert len(replaced) == sum(r.size for r in cut.ranges)  # no range overlaps another
    for split in SPLITS:
        state = states.get(split)
        if state is None or state.stage is not Stage.FINISHED:
            assert split in cut.refused and not any(s == split for s, _ in replaced)
            continue
        assert split not in cut.refused
        for o in range(0, 100):
            want = lo <= o < lo + size and start[split] <= o < end[split]
            assert ((split, o) in replaced) == want, (split, o)
        assert (split in cut.skipped) == (not any(s == split for s, _ in replaced))


def test_the_window_s_edges_are_exact():
    states = {"t:0": SplitState.finished(9)}
    cut = cut_repair({"t:0": (5, 10)}, states, {"t:0": 0}, {"t:0": 20})
    assert [(r.start, r.end) for r in cut.ranges] == [(5, 10)]  # 5 in, 10 out
    cut = cut_repair({"t:0": (5, 30)}, states, {"t:0": 7}, {"t:0": 20})
    assert [(r.start, r.end) for r in cut.ranges] == [(7, 20)]  # from the job's start to its covered end
    cut = cut_repair({"t:0": (20, 30)}, states, {"t:0": 0}, {"t:0": 20})
    assert cut.ranges == [] and "none of the job's offsets" in cut.skipped["t:0"]


def test_unknown_and_unfinished_splits_are_refused_saying_why():
    states = {"t:0": SplitState.backfilling(3, 10)}
    cut = cut_repair({"t:0": (0, 5), "t:9": (0, 5)}, states, {}, {})
    assert cut.refused == {"t:0": "still backfilling: repair it once its history copy is Finished",
                           "t:9": "not a split of the job"}
