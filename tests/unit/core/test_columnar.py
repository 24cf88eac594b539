"""The planner over columns makes, split by split, the decisions of the row rules; the table is a mapping."""

from hypothesis import given, settings
from hypothesis import strategies as st

from source_backfill.core import (
    LiveStats,
    SplitState,
    Stage,
    finish_epoch,
    on_history_row,
    on_live_row,
    plan_epoch,
    states_from_json,
    states_to_json,
)
from source_backfill.core.columnar import SplitTable
from source_backfill.core.plan import at_boundary
from tests.budget import examples
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
            live[s] = LiveStats(first, last, last - first + 1, last + 1)
        if draw(st.booleans()):
            end[s] = draw(st.integers(0, 90))
    return table, live, end, draw(st.integers(0, 120))


@settings(max_examples=examples(500))
@given(epochs(), st.booleans())
def test_plan_and_finish_equal_the_row_rules_split_by_split(epoch, as_table):
    states_, live, end, budget = epoch
    plan = plan_epoch(SplitTable.from_states(states_) if as_table else states_, live, budget, end)
    counts = {r.split: r.end - r.start for r in plan.history}  # every offset a record
    got = finish_epoch(plan, counts)
    assert sum(r.end - r.start for r in plan.history) <= budget
    for split, state in states_.items():
        stats = live.get(split)
        emitted = []
        for o in range(stats.first, stats.last + 1) if stats else ():
            emit, state = on_live_row(state, o)
            if emit:
                emitted.append(o)
        above = plan.emit_above[split]
        assert emitted == ([] if above is None or stats is None else
                           [o for o in range(stats.first, stats.last + 1) if o > above])
        assert plan.states[split] == state
        for r in plan.history:
            if r.split == split:
                for o in range(r.start, r.end):
                    emit, state = on_history_row(state, o)
                    assert emit, f"planned history row {split}@{o} would be dropped"
        if state.stage is not Stage.FINISHED:
            state = at_boundary(state, end.get(split))
        assert got[split] == state


@given(epochs())
def test_a_table_is_the_mapping_of_its_states(epoch):
    states_ = epoch[0]
    table = SplitTable.from_states(states_)
    assert table == states_ and dict(table) == states_ and len(table) == len(states_)
    assert list(table) == list(states_) and all(s in table for s in states_) and "x:9" not in table
    assert table.to_states() == states_
    assert states_from_json(states_to_json(table)) == states_
    changed = {"t:0": SplitState.finished(5, 5, 7)}
    assert table.with_states(changed) == {**states_, **changed}
    assert table == states_  # unchanged: a table is never written


@settings(max_examples=examples(300))
@given(st.dictionaries(st.sampled_from([f"t:{i}" for i in range(6)]), states(), min_size=1),
       st.dictionaries(st.sampled_from([f"t:{i}" for i in range(8)]), st.integers(-1, 120)))
def test_the_lag_columns_are_the_lag_of_each_split_alone(states_, read_ahead_to):
    from source_backfill.core.progress import split_lag

    table = SplitTable.from_states(states_)
    lags = table.lags(read_ahead_to).tolist()
    assert lags == [split_lag(s, read_ahead_to.get(k)) or 0 for k, s in table.items()]
    assert table.lags().tolist() == [split_lag(s) or 0 for s in table.values()]


@given(before=st.lists(states(), min_size=1, max_size=6), after=st.lists(states(), min_size=1, max_size=6),
       same=st.booleans())
def test_only_targets_moved_is_the_rule_split_by_split(before, after, same):
    """``only_targets_moved``: same splits, and per split equal but for the target of one not Finished."""
    from source_backfill.core import Stage

    if same:  # most draws: the same splits, some states kept, some with only their target moved
        after = [b if i % 3 == 0 else (SplitState(b.stage, b.offset, b.num_consumed_rows, a.target_offset)
                                      if i % 3 == 1 else a)
                 for i, (b, a) in enumerate(zip(before, after + before, strict=False))]
    old = {f"t:{i}": s for i, s in enumerate(before)}
    new = {f"t:{i}": s for i, s in enumerate(after)}
    want = list(old) == list(new) and all(
        (o.stage, o.offset, o.num_consumed_rows) == (n.stage, n.offset, n.num_consumed_rows)
        and (o.target_offset == n.target_offset or n.stage is not Stage.FINISHED)
        for o, n in zip(old.values(), new.values(), strict=True))
    assert SplitTable.from_states(new).only_targets_moved(SplitTable.from_states(old)) == want
