from source_backfill.core import (
    HistoryRange,
    LiveStats,
    SplitState,
    Stage,
    adopt_history,
    ahead_of,
    attach,
    finish_epoch,
    is_backfill_done,
    is_finish_reported,
    job_progress,
    plan_epoch,
    reconcile_splits,
    rejoin,
)
from source_backfill.core.columnar import SplitTable

B, C, F = SplitState.backfilling, SplitState.caching_up, SplitState.finished


def test_attach_targets_the_live_position_and_finishes_empty_splits():
    states = attach(["t:0", "t:1", "t:2"], {"t:0": 10, "t:1": 0, "t:2": 5}, {"t:0": 0, "t:1": 0, "t:2": 7})
    assert states == {"t:0": B(-1, 9), "t:1": F(), "t:2": F()}


def test_history_range_is_bounded_by_target_and_budget():
    plan = plan_epoch({"t:0": B(-1, 9)}, {}, 4, {"t:0": 10})
    assert plan.history == (HistoryRange("t:0", 0, 4),)
    assert plan.emit_above == {"t:0": None}
    assert finish_epoch(plan, {"t:0": 4}) == {"t:0": B(3, 9, rows=4)}


def test_range_read_to_target_caches_up_then_finishes_at_the_boundary():
    plan = plan_epoch({"t:0": B(3, 9)}, {}, 100, {"t:0": 10})
    assert plan.history == (HistoryRange("t:0", 4, 10),)
    # offsets 8, 9 were transaction markers: only 4 records, the range still completes
    assert finish_epoch(plan, {"t:0": 4}) == {"t:0": SplitState(Stage.FINISHED, 9, 4, 9)}


def test_live_rows_ahead_of_backfill_are_dropped_and_move_the_target():
    plan = plan_epoch({"t:0": B(3, 9)}, {"t:0": LiveStats(10, 14, 5, 15)}, 100, {"t:0": 15})
    assert plan.emit_above == {"t:0": None}
    assert plan.history == (HistoryRange("t:0", 4, 15),)
    assert finish_epoch(plan, {"t:0": 11})["t:0"].stage is Stage.FINISHED


def test_finished_split_emits_every_live_row():
    plan = plan_epoch({"t:0": F(9)}, {"t:0": LiveStats(10, 14, 5, 15)}, 100, {"t:0": 15})
    assert plan.emit_above == {"t:0": -1}
    assert plan.history == ()


def test_budget_zero_reads_nothing_but_keeps_the_target_moving():
    plan = plan_epoch({"t:0": B(3, 9)}, {"t:0": LiveStats(10, 14, 5, 15)}, 0, {"t:0": 15})
    assert plan.history == ()
    assert finish_epoch(plan, {}) == {"t:0": B(3, 14)}


def test_budget_is_shared_by_water_filling():
    states = {"a:0": B(-1, 1), "a:1": B(-1, 99), "a:2": B(-1, 99)}
    plan = plan_epoch(states, {}, 60, {s: 100 for s in states})
    widths = {r.split: r.end - r.start for r in plan.history}
    assert widths == {"a:0": 2, "a:1": 29, "a:2": 29}
    assert sum(widths.values()) <= 60


def test_no_target_reads_no_history():
    plan = plan_epoch({"t:0": B(None)}, {}, 100, {"t:0": 5})
    assert plan.history == ()


def test_boundary_rule_needs_the_live_position_past_b():
    plan = plan_epoch({"t:0": C(9, 9)}, {}, 10, {"t:0": 9})
    assert finish_epoch(plan, {})["t:0"].stage is Stage.SOURCE_CACHING_UP
    plan = plan_epoch({"t:0": C(9, 9)}, {}, 10, {"t:0": 10})
    assert finish_epoch(plan, {})["t:0"].stage is Stage.FINISHED


def test_split_changes_new_finished_vanished_trimmed_existing_resumed():
    states, changes = reconcile_splits({"t:0": B(3, 9), "t:1": F()}, ["t:0", "t:2"])
    assert states == {"t:0": B(3, 9), "t:2": F()}
    assert {(c.split, c.kind) for c in changes} == {("t:2", "added"), ("t:1", "removed")}


def test_rejoin_backfills_the_epochs_a_job_missed():
    states = {"t:0": F(4), "t:1": B(2, 6), "t:2": C(8, 8), "t:3": F()}
    covered = {"t:0": 10, "t:1": 10, "t:2": 9, "t:3": 20}
    out = rejoin(states, covered, dict.fromkeys(states, 20))
    assert out == {"t:0": B(9, 19), "t:1": B(2, 19), "t:2": B(8, 19), "t:3": F()}


def test_rejoin_a_batch_that_overlaps_a_finished_splits_output_drops_what_was_emitted():
    """A Finished split emits a batch whole only if it starts where the split's output ends."""
    states = {"t:0": F(4), "t:1": F()}
    out = rejoin(states, {"t:0": 15, "t:1": 10}, {"t:0": 10, "t:1": 10})
    assert out == {"t:0": C(14), "t:1": F()}  # offsets 10..14 were emitted already: dropped again
    assert rejoin(states, {"t:0": 10, "t:1": 10}, {"t:0": 10, "t:1": 10}) == states  # contiguous


def test_finish_reported_vs_done_and_progress():
    states = {"t:0": C(5, 5, 6), "t:1": F(3, 3, 4), "t:2": B(1, 11, 2)}
    assert not is_finish_reported(states)
    assert is_finish_reported({k: v for k, v in states.items() if k != "t:2"})
    assert not is_backfill_done({"t:0": C(5)})
    p = job_progress(states, history_rows_per_s=5.0)
    assert (p.splits_total, p.splits_finished, p.rows_backfilled, p.remaining_offsets) == (3, 1, 12, 10)
    assert p.eta_seconds == 2.0
    # offsets copied by a read ahead, not committed yet, count as read (never past the target; a
    # split past backfilling has nothing left either way)
    p = job_progress(states, history_rows_per_s=5.0, read_ahead_to={"t:2": 6, "t:0": 99})
    assert (p.remaining_offsets, p.eta_seconds) == (5, 1.0)
    assert job_progress(states, read_ahead_to={"t:2": 50}).remaining_offsets == 0
    assert job_progress(states, read_ahead_to={"t:2": 0}).remaining_offsets == 10  # behind the commit


def test_states_stay_columns_from_epoch_to_epoch():
    states = SplitTable.from_states({"t:0": F(9), "t:1": C(20, 20), "t:2": B(3, 9)})
    plan = plan_epoch(states, {"t:0": LiveStats(10, 14, 5, 15)}, 0, {"t:0": 15, "t:1": 20, "t:2": 10})
    out = finish_epoch(plan, {})
    assert isinstance(out, SplitTable) and out.splits is states.splits
    assert out == {"t:0": F(9), "t:1": C(20, 20), "t:2": B(3, 9)}  # the live rows changed nothing
    assert plan.without_history().history == () and isinstance(ahead_of(out, []), SplitTable)


def test_backfilling_at_its_target_with_nothing_to_read_caches_up_then_finishes():
    plan = plan_epoch({"t:0": B(9, 9)}, {}, 100, {"t:0": 9})
    assert plan.history == ()
    assert finish_epoch(plan, {}) == {"t:0": C(9, 9)}
    plan = plan_epoch({"t:0": B(9, 9)}, {}, 100, {"t:0": 10})
    assert finish_epoch(plan, {}) == {"t:0": SplitState(Stage.FINISHED, 9, 0, 9)}


def test_backfilling_none_reads_from_the_given_start():
    plan = plan_epoch({"t:0": B(None)}, {"t:0": LiveStats(10, 12, 3, 13)}, 100, {"t:0": 13}, {"t:0": 4})
    assert plan.states == {"t:0": B(None, 12)}
    assert plan.history == (HistoryRange("t:0", 4, 13),)
    assert finish_epoch(plan, {"t:0": 9})["t:0"] == SplitState(Stage.FINISHED, 12, 9, 12)


def test_history_read_ahead_chains_and_applies_before_the_live_batch():
    states = {"t:0": B(-1, 9), "t:1": B(4, 20)}
    first = plan_epoch(states, {}, 6, {}).history
    assert first == (HistoryRange("t:0", 0, 3), HistoryRange("t:1", 5, 8))
    # a second read continues where the first (not committed yet) ends
    second = plan_epoch(ahead_of(states, first), {}, 6, {}).history
    assert second == (HistoryRange("t:0", 3, 6), HistoryRange("t:1", 8, 11))
    adopted = adopt_history(states, first + second, {"t:0": 6, "t:1": 5})
    assert adopted == {"t:0": B(5, 9, rows=6), "t:1": B(10, 20, rows=5)}
    # meanwhile the live stream moved t:1's target up: the live batch applies after the reads
    plan = plan_epoch(adopted, {"t:1": LiveStats(21, 25, 5, 26)}, 0, {"t:0": 10, "t:1": 26})
    assert plan.history == ()
    assert finish_epoch(plan, {})["t:1"] == B(10, 25, rows=5)


def test_history_read_ahead_to_the_target_finishes_on_the_next_live_batch():
    # the read reached the target the last batch set; this batch's rows above it finish the split
    states = {"t:0": B(3, 9)}
    adopted = adopt_history(states, [HistoryRange("t:0", 4, 10)], {"t:0": 6})
    assert adopted == {"t:0": C(9, 9, rows=6)}
    plan = plan_epoch(adopted, {"t:0": LiveStats(10, 14, 5, 15)}, 0, {"t:0": 15})
    assert plan.emit_above == {"t:0": 9}
    assert finish_epoch(plan, {})["t:0"].stage is Stage.FINISHED


def test_history_read_ahead_that_no_longer_fits_is_refused():
    states = {"t:0": B(3, 9)}
    assert adopt_history(states, [HistoryRange("t:0", 5, 8)], {}) is None  # a gap after b
    assert adopt_history(states, [HistoryRange("t:0", 4, 11)], {}) is None  # past the target
    assert adopt_history(states, [HistoryRange("t:0", 4, 6), HistoryRange("t:0", 7, 9)], {}) is None  # a hole
    assert adopt_history(states, [HistoryRange("t:9", 0, 1)], {}) is None  # a split the job no longer has
    assert adopt_history({"t:0": C(9)}, [HistoryRange("t:0", 4, 6)], {}) is None  # past backfilling
    assert adopt_history(states, [], {}) is None


def test_reads_ahead_catch_up_with_a_live_stream_that_never_pauses():
    # 1000 history records; 10 live records per epoch, every epoch; one read of 100 ready per epoch
    states, pos, pending = {"t:0": B(-1, 999)}, 1000, ()
    for epoch in range(40):  # noqa: B007 - the epoch it finished at is asserted
        current = states
        if pending:
            size = sum(r.end - r.start for r in pending)
            adopted = adopt_history(states, pending, {"t:0": size})
            assert adopted is not None
            current = adopted
        plan = plan_epoch(current, {"t:0": LiveStats(pos, pos + 9, 10, pos + 10)}, 0, {"t:0": pos + 10})
        pos += 10
        states = finish_epoch(plan, {})
        if is_backfill_done(states):
            break
        pending = plan_epoch(states, {}, 100, {}).history
    assert is_backfill_done(states)
    assert epoch <= 13  # the gap closes by 90 offsets an epoch; the last read reaches the target
    # history read every offset up to the last batch's first; that batch emitted the rest
    assert states["t:0"].num_consumed_rows == pos - 10
    assert plan.emit_above == {"t:0": pos - 11}
