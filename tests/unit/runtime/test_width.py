"""A source's history width (runtime/width.py) stepped by live latencies, and a copy cut for its tasks.

No Spark: the latencies are made with ``core.latency.measure`` as the jobs make them, the clock is passed.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from source_backfill.config import HistoryWidthConfig
from source_backfill.core import HistoryRange
from source_backfill.core.governor import pieces_for_tasks
from source_backfill.core.latency import Latencies, measure
from source_backfill.runtime.width import (
    IDLE_INTERVALS,
    QUIET_AFTER,
    SLOTS_EVERY_S,
    STEP_EPOCHS,
    HistoryWidth,
)


def rows_at(latency_s: float, n: int = 200) -> Latencies:
    """``n`` live rows committed ``latency_s`` after they were produced (spread a little)."""
    commit_ms = 1_000_000.0
    return measure(commit_ms - 1000 * latency_s * np.linspace(0.9, 1.0, n), commit_ms)


def steps(width: HistoryWidth, latency_s: float, epochs: int, t0: float = 100.0) -> list[int]:
    return [width.after_epoch(t0 + i, copying=True, finished=[rows_at(latency_s)]) for i in range(epochs)]


def test_without_a_finished_job_the_copies_run_as_wide_as_allowed() -> None:
    width = HistoryWidth("s", HistoryWidthConfig(), slots=8, interval_s=1.0)
    assert width.after_epoch(1.0, copying=True, finished=[]) == 8
    assert width.per_job(3) == 2 and width.per_job(16) == 1


def test_finished_jobs_without_a_live_row_keep_no_latency_the_copies_run_wide_until_the_first_one() -> None:
    """A source whose topics receive nothing new: its Finished jobs commit no live row, and nothing would
    ever step the governor up from ``min_tasks``; the copies run at the allowed width until a live row."""
    width = HistoryWidth("s", HistoryWidthConfig(), slots=8, interval_s=1.0)
    for i in range(3 * STEP_EPOCHS):
        assert width.after_epoch(float(i), copying=True, finished=[Latencies.empty(), Latencies.empty()]) == 8
    # the first live row: the governor steps from its start (min_tasks) as for any source
    assert width.after_epoch(20.0, copying=True, finished=[rows_at(1.0)]) == 1
    assert width.after_epoch(21.0, copying=True, finished=[Latencies.empty()]) == 1


def test_the_width_doubles_while_the_live_latency_keeps_the_target_then_narrows_when_it_rises() -> None:
    width = HistoryWidth("s", HistoryWidthConfig(), slots=16, interval_s=1.0)
    for i in range(5):  # idle epochs: the Finished jobs' p99 is 1.0 s, the target 1.2 s
        width.after_epoch(float(i), copying=False, finished=[rows_at(1.0)])
    assert abs(width.idle_p99(5.0) - 1.0) < 0.01
    seen = steps(width, 1.05, 4 * STEP_EPOCHS, t0=10.0)
    # the first Finished job's step starts from min_tasks; each step (STEP_EPOCHS epochs) doubles it
    assert seen[:STEP_EPOCHS - 1] == [1] * (STEP_EPOCHS - 1)
    assert seen[-1] == 16 and width.target_s is not None and abs(width.target_s - 1.2) < 0.02
    # the live path slows down (a copy holds its slots): the width comes down within one step
    slow = steps(width, 3.0, STEP_EPOCHS, t0=50.0)
    assert slow[-1] <= 8
    assert width.latency_s is not None and width.latency_s > width.target_s


def test_epochs_without_a_copy_never_step_the_governor() -> None:
    width = HistoryWidth("s", HistoryWidthConfig(), slots=16, interval_s=1.0)
    steps(width, 1.0, STEP_EPOCHS)
    before = width.governor
    for i in range(10):
        width.after_epoch(200.0 + i, copying=False, finished=[rows_at(9.0)])
    assert width.governor == before


def test_only_quiet_epochs_set_the_idle_latency_not_those_right_after_a_copy() -> None:
    width = HistoryWidth("s", HistoryWidthConfig(), slots=16, interval_s=1.0)
    for i in range(20):  # a copy every 4th epoch (a duty below one task): the epochs after it are slow
        copying = i % 4 == 0
        latency = 1.0 if i % 4 == 3 else 4.0  # only the 3rd epoch after a copy is back to the quiet 1 s
        width.after_epoch(float(i), copying=copying, finished=[rows_at(latency)])
    assert abs(width.idle_p99(20.0) - 1.0) < 0.01
    assert QUIET_AFTER == 2
    # a daemon starts quiet: its first epochs without a copy count at once
    fresh = HistoryWidth("s", HistoryWidthConfig(), slots=16, interval_s=1.0)
    fresh.after_epoch(0.0, copying=False, finished=[rows_at(0.8)])
    assert abs(fresh.idle_p99(1.0) - 0.8) < 0.01


def test_before_any_idle_epoch_the_target_follows_the_trigger_interval() -> None:
    width = HistoryWidth("s", HistoryWidthConfig(latency_target_ratio=2.0), slots=4, interval_s=2.0)
    steps(width, 1.0, STEP_EPOCHS)
    assert width.target_s == 2.0 * IDLE_INTERVALS * 2.0


def test_a_fixed_width_and_explicit_bounds_are_kept() -> None:
    fixed = HistoryWidth("s", HistoryWidthConfig(fixed_tasks=3), slots=2, interval_s=1.0)
    assert steps(fixed, 50.0, 2 * STEP_EPOCHS)[-1] == 2  # within max_tasks: the slots
    bounded = HistoryWidth("s", HistoryWidthConfig(min_tasks=2, max_tasks=4), slots=64, interval_s=1.0)
    assert bounded.after_epoch(1.0, copying=True, finished=[]) == 4
    assert min(steps(bounded, 50.0, 6 * STEP_EPOCHS)) >= 2


def test_finished_jobs_with_no_live_row_hold_the_width() -> None:
    width = HistoryWidth("s", HistoryWidthConfig(), slots=8, interval_s=1.0)
    steps(width, 1.0, STEP_EPOCHS)
    held = width.width
    for i in range(3 * STEP_EPOCHS):
        assert width.after_epoch(300.0 + i, copying=True, finished=[Latencies.empty()]) == held


ranges = st.lists(
    st.tuples(st.integers(0, 3), st.integers(0, 10**6), st.integers(0, 3 * 10**5)), max_size=6,
    unique_by=lambda t: t[0],
).map(lambda ts: [HistoryRange(f"t:{p}", start, start + size) for p, start, size in ts])


@given(ranges, st.integers(1, 64), st.integers(1, 50_000))
def test_the_pieces_cover_the_ranges_exactly_and_are_as_many_as_the_tasks_allow(
    original: list[HistoryRange], tasks: int, min_piece: int,
) -> None:
    pieces = pieces_for_tasks(original, tasks, min_piece)
    assert sum(r.size for r in pieces) == sum(r.size for r in original)
    for r in original:  # per split, the pieces are contiguous, in order, and span the range
        mine = [p for p in pieces if p.split == r.split]
        if r.size == 0:
            continue
        assert mine[0].start == r.start and mine[-1].end == r.end
        assert all(a.end == b.start for a, b in zip(mine, mine[1:], strict=False))
    nonempty = [r for r in original if r.size]
    if tasks > len(nonempty):
        assert len(pieces) <= tasks
        # stopped short only when every piece is too small to halve
        assert len(pieces) == tasks or all(p.size < 2 * min_piece for p in pieces)
    else:
        assert pieces == original


def test_the_slots_are_read_again_as_executors_come_and_go() -> None:
    slots = [2]
    width = HistoryWidth("s", HistoryWidthConfig(), slots=lambda: slots[0], interval_s=1.0)
    assert width.after_epoch(0.0, copying=True, finished=[]) == 2
    slots[0] = 6  # executors joined
    assert width.after_epoch(1.0, copying=True, finished=[]) == 2  # read again only every SLOTS_EVERY_S
    assert width.after_epoch(1.0 + SLOTS_EVERY_S, copying=True, finished=[]) == 6
    configured = HistoryWidth("s", HistoryWidthConfig(max_tasks=3), slots=lambda: slots[0], interval_s=1.0)
    assert configured.after_epoch(0.0, copying=True, finished=[]) == 3


def test_epochs_whose_copies_started_at_an_older_width_do_not_count_towards_a_step() -> None:
    width = HistoryWidth("s", HistoryWidthConfig(), slots=16, interval_s=1.0)
    steps(width, 1.0, STEP_EPOCHS)
    assert width.width == 2
    before = width.governor
    for i in range(5 * STEP_EPOCHS):  # the copy still running was started with 1 task
        width.after_epoch(400.0 + i, copying=True, at_width=False, finished=[rows_at(1.0)])
    assert width.governor == before and width.width == 2
    steps(width, 1.0, STEP_EPOCHS, t0=500.0)  # a copy at 2 tasks kept the target: the width doubles
    assert width.width == 4


def test_history_width_settings_outside_their_bounds_are_refused() -> None:
    import pydantic

    from source_backfill.config import SourceConfig

    for bad in ({"min_tasks": 4, "max_tasks": 2}, {"min_tasks": 0}, {"fixed_tasks": -1},
                {"max_tasks": 10**6}, {"latency_target_ratio": 0.5}, {"latency_target_s": 0},
                {"tasks": 3}, {"fixed_tasks": "all"}):
        with pytest.raises(pydantic.ValidationError):
            SourceConfig(name="s", topics=["t"], history_width=bad)
    with pytest.raises(pydantic.ValidationError):
        SourceConfig(name="s", topics=["t"], table_index_rows=-1)
    assert SourceConfig(name="s", topics=["t"], history_width={"max_tasks": 8}).history_width.max_tasks == 8


def test_below_one_task_the_width_slows_the_copies_down_to_min_duty_and_comes_back() -> None:
    width = HistoryWidth("s", HistoryWidthConfig(), slots=2, interval_s=1.0)
    for i in range(5):
        width.after_epoch(float(i), copying=False, finished=[rows_at(1.0)])
    assert steps(width, 1.0, STEP_EPOCHS, t0=10.0)[-1] == 2 and width.duty == 1.0
    # even one task at a time keeps the live latency over its target: the duty halves per step
    steps(width, 5.0, 6 * STEP_EPOCHS, t0=20.0)
    assert width.width == 1 and width.duty == pytest.approx(0.125)  # min_duty: never below
    assert width.per_job(15) == 1
    # the live path has room again: the duty grows back to whole tasks
    steps(width, 1.0, 12 * STEP_EPOCHS, t0=100.0)
    assert width.duty == 1.0


def test_min_duty_one_never_slows_below_a_task_and_min_tasks_above_one_neither() -> None:
    for config in (HistoryWidthConfig(min_duty=1.0), HistoryWidthConfig(min_tasks=2, max_tasks=4)):
        width = HistoryWidth("s", config, slots=4, interval_s=1.0)
        steps(width, 50.0, 8 * STEP_EPOCHS)
        assert width.duty == 1.0 and width.width == config.min_tasks


def test_slots_read_again_unchanged_leave_the_governor_as_it_was() -> None:
    width = HistoryWidth("s", HistoryWidthConfig(), slots=lambda: 2, interval_s=1.0)
    steps(width, 1.0, 2 * STEP_EPOCHS)
    before = width.governor
    width.after_epoch(10 * SLOTS_EVERY_S, copying=False, finished=[])
    assert width.governor == before
