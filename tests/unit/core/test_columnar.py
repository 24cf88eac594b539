"""The columnar planner makes exactly the decisions of the readable one, on arbitrary inputs."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from source_backfill.core import LiveStats, finish_epoch, plan_epoch
from source_backfill.core.columnar import NONE, SplitTable, finish_table, live_columns, plan_table
from tests.unit.core.strategies import states


@st.composite
def epochs(draw):
    n = draw(st.integers(1, 8))
    splits = [f"t:{i}" for i in range(n)]
    table = {s: draw(states()) for s in splits}
    live, end = {}, {}
    for s in splits:
        if draw(st.booleans()):
            first = draw(st.integers(0, 60))
            last = draw(st.integers(first, 80))
            live[s] = LiveStats(first, last, draw(st.integers(1, last - first + 1)), last + 1)
        if draw(st.booleans()):
            end[s] = draw(st.integers(0, 90))
    return table, live, end, draw(st.integers(0, 120))


@settings(max_examples=500)
@given(epochs(), st.randoms())
def test_columnar_plan_and_finish_equal_the_readable_planner(epoch, rnd):
    states_, live, end, budget = epoch
    plan = plan_epoch(states_, live, budget, end)
    counts = {r.split: rnd.randint(0, r.end - r.start) for r in plan.history}
    expected = finish_epoch(plan, counts)

    table = SplitTable.from_states(states_)
    stats = {s: (v.first, v.last, v.count) for s, v in live.items()}
    first, last, count, ends = live_columns(table.splits, stats, end)
    tplan = plan_table(table, first, last, count, ends, budget)
    assert tplan.table.to_states() == plan.states
    for i, s in enumerate(table.splits):
        above = int(tplan.emit_above[i])
        assert (None if above == NONE else above) == plan.emit_above[s]
    got_ranges = {s: (int(a), int(b)) for s, a, b in zip(table.splits, tplan.history_start,
                                                        tplan.history_end, strict=True) if b > a}
    assert got_ranges == {r.split: (r.start, r.end) for r in plan.history}
    cnt = np.array([counts.get(s, 0) for s in table.splits], dtype=np.int64)
    assert finish_table(tplan, cnt).to_states() == expected
