"""What a Kafka job's commits carry of its state (JobLog), and its history pace (HistoryPace): no Spark."""

from __future__ import annotations

import time

import pytest

from source_backfill.core import HistoryRange, SplitState, plan_epoch
from source_backfill.core.codec import END, SPLITS, decode_state
from source_backfill.core.columnar import SplitTable
from source_backfill.core.state_log import SnapshotPolicy
from source_backfill.executors.accounting import Rates
from source_backfill.executors.job_log import JobLog, plan_summary
from source_backfill.executors.pacing import BACKOFF_CAP_S, HistoryPace


def table(**states: SplitState) -> SplitTable:
    return SplitTable.from_states({f"t:{k[1:]}": v for k, v in states.items()})


FINISHED = table(p0=SplitState.finished(9, 9, 10), p1=SplitState.finished(19, 19, 20))
END_AT = {"t:0": 10, "t:1": 20}


def test_the_first_commit_is_a_snapshot_then_deltas_name_their_base_and_previous_commit() -> None:
    log = JobLog(SnapshotPolicy())
    first = decode_state(log.state_doc(None, FINISHED, END_AT))
    assert first.kind == "snapshot" and set(first.sections[SPLITS]) == {"t:0", "t:1"}
    log.landed(3, END_AT)
    moved = {**END_AT, "t:1": 21}
    second = decode_state(log.state_doc(FINISHED, FINISHED, moved))
    assert (second.kind, second.base, second.prev) == ("delta", 3, 3)
    assert second.sections[END] == {"t:1": 21} and second.sections[SPLITS] == {}
    log.landed(5, moved)
    third = decode_state(log.state_doc(FINISHED, FINISHED, {**moved, "t:0": 11}))
    assert (third.kind, third.base, third.prev) == ("delta", 3, 5)
    assert log.covered_to == moved


def test_a_commit_whose_version_is_unknown_makes_the_next_one_a_snapshot() -> None:
    log = JobLog(SnapshotPolicy())
    log.state_doc(None, FINISHED, END_AT)
    log.landed(3, END_AT)
    log.landed(None, END_AT)
    assert decode_state(log.state_doc(FINISHED, FINISHED, END_AT)).kind == "snapshot"


def test_idle_only_when_nothing_moved_and_no_snapshot_is_due_by_age() -> None:
    log = JobLog(SnapshotPolicy())
    assert not log.idle(FINISHED, FINISHED, END_AT)  # no chain yet: the first commit is written
    log.state_doc(None, FINISHED, END_AT)
    log.landed(0, END_AT)
    assert log.idle(FINISHED, FINISHED, END_AT)
    assert not log.idle(FINISHED, FINISHED, {**END_AT, "t:0": 11})  # a live position moved
    moved = table(p0=SplitState.finished(9, 9, 11), p1=SplitState.finished(19, 19, 20))
    assert not log.idle(FINISHED, moved, END_AT)  # a split's state moved
    assert not log.idle(FINISHED, FINISHED, {"t:0": 10})  # a split left
    aged = JobLog(SnapshotPolicy(max_age_s=0.0))
    aged.state_doc(None, FINISHED, END_AT)
    aged.landed(0, END_AT)
    assert not aged.idle(FINISHED, FINISHED, END_AT)  # a snapshot due by age is committed all the same


def test_the_plan_summary_records_adopted_then_own_ranges_and_only_the_positions_that_moved() -> None:
    states = table(p0=SplitState.backfilling(None, 9), p1=SplitState.finished(19, 19, 20))
    plan = plan_epoch(states, {}, 5, {"t:0": 10, "t:1": 21})
    adopted = [HistoryRange("t:0", 0, 2)]
    summary = plan_summary(plan, 5, adopted, {"t:0": 10, "t:1": 20})
    assert summary["budget"] == 5
    assert summary["history"][0] == ["t:0", 0, 2] and len(summary["history"]) == 1 + len(plan.history)
    assert summary["end"] == {"t:1": 21}
    assert plan_summary(plan, 5)["end"] == {"t:0": 10, "t:1": 21}


def test_read_errors_back_off_doubling_up_to_the_cap_and_a_good_read_ends_the_streak() -> None:
    pace = HistoryPace(Rates())
    delays = [pace.read_failed(OSError("broker gone")) for _ in range(9)]
    assert delays[:4] == [1.0, 2.0, 4.0, 8.0] and max(delays) == BACKOFF_CAP_S
    assert pace.backing_off and pace.last_error == "OSError: broker gone"
    assert pace.epoch_budget(rate_limit=None, interval_s=1.0, max_rows_per_epoch=None, paused=False) == 0
    pace.read_ok()
    assert pace.last_error is None and pace.rates.errors_in_a_row == 0
    pace.rates.backoff_until = time.monotonic() - 1
    assert pace.epoch_budget(rate_limit=None, interval_s=1.0, max_rows_per_epoch=None, paused=False) > 0


@pytest.mark.parametrize("spent", [0, 600])
def test_a_read_ahead_under_a_rate_limit_waits_for_an_intervals_worth(spent: int) -> None:
    pace = HistoryPace(Rates())
    args = {"tail_budget": 0, "rate_limit": 1000.0, "interval_s": 1.0, "max_rows_per_epoch": None,
            "paused": False}
    t0 = time.monotonic()
    pace.allowed(1000.0, 1.0)  # the allowance starts with one interval's worth
    pace.spend(spent)
    budget = pace.ahead_budget(remaining=100_000, **args)  # type: ignore[arg-type]
    accrued = (time.monotonic() - t0) * 1000.0  # the bucket refills on the wall clock meanwhile (busy: ms)
    assert (budget > 0) == (spent == 0)
    assert budget <= 1000 + accrued + 1
    # the rest of a backfill smaller than an interval's worth does not wait for a whole interval
    assert pace.ahead_budget(remaining=300, **args) > 0  # type: ignore[arg-type]
