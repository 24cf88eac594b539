"""Honest progress: a wall-clock rate over a recent window, an ETA bounded by the rate limit, "paused".

The estimator is fed a simulated clock and a job copying at a steady rate the way reads ahead do it: in
chunks (a read copies a few seconds' worth at its own, much higher, speed, then waits for the rate limit).
"""

import pytest

from source_backfill.core import SplitState, Stage, job_progress
from source_backfill.core.progress import RATE_WINDOW_S, Throughput, copied_fraction, eta

TOTAL = 123_917
LIMIT = 2_000.0


def simulate(chunk_rows: int, chunk_every_s: float, *, sample_every_s: float = 1.0, limit=LIMIT):
    """Yield (t, copied, eta, rate) at every epoch while a job copies TOTAL offsets in chunks."""
    meter = Throughput()
    steady = chunk_rows / chunk_every_s
    t, copied = 0.0, 0
    meter.observe(t, 0)
    while copied < TOTAL:
        t += sample_every_s
        # a chunk lands once copied, at the steady rate (the last, smaller one, sooner)
        while copied < TOTAL and min(TOTAL, copied + chunk_rows) / steady <= t + 1e-9:
            copied = min(TOTAL, copied + chunk_rows)
        meter.observe(t, copied)
        rate = meter.rate(t)
        yield t, copied, eta(TOTAL - copied, rate, limit), rate


@pytest.mark.parametrize(("chunk_rows", "chunk_every_s", "sample_every_s"), [
    (4_000, 2.0, 1.0),  # reads ahead of 4,000 rows every 2 s (the rate limit's pace), epochs every second
    (20_000, 10.0, 1.0),  # larger reads: 10 s apart
    (2_000, 1.0, 0.5),  # steady
])
def test_eta_is_within_25_percent_of_the_time_left_at_25_50_and_75_percent(chunk_rows, chunk_every_s,
                                                                           sample_every_s):
    samples = list(simulate(chunk_rows, chunk_every_s, sample_every_s=sample_every_s))
    end = samples[-1][0]
    for mark in (0.25, 0.5, 0.75):
        t, copied, left_s, _ = next(s for s in samples if s[1] >= mark * TOTAL)
        actual = end - t
        assert left_s is not None and abs(left_s - actual) <= 0.25 * actual, (mark, left_s, actual)


def test_the_rate_is_above_0_in_every_sample_while_rows_are_copied():
    for t, copied, _, rate in simulate(20_000, 10.0):
        if 0 < copied < TOTAL:  # from the first rows copied (a running read ahead reports its closed files)
            assert rate is not None and rate > 0, (t, copied)


def test_a_read_faster_than_the_limit_does_not_make_the_eta_shorter():
    # the user's bug: 123,917 offsets left at a 2,000 rows/s limit showed "eta 6.6 s" (one read's speed)
    assert eta(TOTAL, 18_775.0, LIMIT) == pytest.approx(TOTAL / LIMIT)
    assert eta(TOTAL, 1_000.0, LIMIT) == pytest.approx(TOTAL / 1_000.0)  # slower than the limit: measured
    assert eta(TOTAL, None, LIMIT) == pytest.approx(TOTAL / LIMIT)  # no rate yet: the limit
    assert eta(TOTAL, None, None) is None and eta(TOTAL, 0.0, None) is None
    assert eta(0, None, None) == 0.0


def test_no_eta_while_paused_or_at_rate_limit_0():
    assert eta(TOTAL, 5_000.0, 5_000.0, paused=True) is None
    assert eta(TOTAL, 5_000.0, 0.0) is None
    states = {"t:0": SplitState(Stage.BACKFILLING, 99, 10, 999)}
    p = job_progress(states, 5_000.0, rate_limit=5_000.0, paused=True)
    assert p.eta_seconds is None and p.paused and p.remaining_offsets == 900
    p = job_progress(states, 5_000.0, rate_limit=5_000.0)
    assert p.eta_seconds == pytest.approx(900 / 5_000) and not p.paused


def test_the_rate_falls_while_nothing_moves_and_restarts_when_copies_are_thrown_away():
    meter = Throughput()
    for t in range(11):
        meter.observe(float(t), 1000 * t)
    assert meter.rate(10.0) == pytest.approx(1000)
    meter.observe(10.0 + RATE_WINDOW_S, 10_000)  # paused for a window: nothing copied
    assert meter.rate(10.0 + RATE_WINDOW_S) < 100
    meter.observe(100.0, 4_000)  # reads ahead dropped: their copies no longer count
    assert meter.rate(100.0) is None


def test_the_jobs_fraction_counts_what_reads_ahead_copied():
    states = {"t:0": SplitState(Stage.BACKFILLING, 49, 50, 99), "t:1": SplitState(Stage.FINISHED, 9, 10, 9)}
    p = job_progress(states)
    assert p.remaining_offsets == 50 and p.fraction == pytest.approx(60 / 110)
    p = job_progress(states, read_ahead_to={"t:0": 89}, rows_read_ahead=40)
    assert p.remaining_offsets == 10 and p.fraction == pytest.approx(100 / 110)
    assert copied_fraction(0, 0) == 1.0 and copied_fraction(0, 10) == 0.0


def test_idle_time_before_the_backfill_starts_does_not_dilute_the_rate():
    # the daemon took 20 s to start the job's first read: the rate is the copy's, not averaged with that
    meter = Throughput()
    for t in range(21):
        meter.observe(float(t), 0)
    assert meter.rate(20.0) is None  # nothing moved: no rate, not 0 rows/s
    for t in range(21, 31):
        meter.observe(float(t), 1500 * (t - 20))
    assert meter.rate(30.0) == pytest.approx(1500)


def test_the_first_reads_start_up_is_not_taken_for_the_copys_pace():
    # a rate-limited copy at 600 rows/s whose first rows came 1 s after the job was ready (its first read's
    # Spark job): from the first growth on, the rate is the pace, so the ETA at a quarter is not 30 % long
    meter = Throughput()
    meter.observe(0.0, 0)
    meter.observe(0.5, 0)
    for i in range(1, 6):
        meter.observe(0.5 + i * 0.5, 300 * i)  # 300 rows every 0.5 s from t = 1.0
    assert meter.rate(3.0) == pytest.approx(600)
    assert meter.rate(1.2) is not None and meter.rate(1.2) > 0  # before a second growth: since the idle point
    lone = Throughput()
    lone.observe(0.0, 0)
    lone.observe(1.0, 0)
    lone.observe(2.0, 5_000)  # one chunk, nothing since: the rate is not 0 while its rows count
    lone.observe(3.0, 5_000)
    assert lone.rate(3.0) == pytest.approx(2_500)


def test_table_fraction_counts_rows_copied_of_the_snapshot_not_completed_vnodes():
    from source_backfill.core.progress import table_fraction

    # the user's job: 0 of 256 vnodes completed while 130,000 of 180,000 rows were copied
    assert table_fraction(False, 130_000, 180_000, 0, 256) == pytest.approx(130 / 180)
    assert table_fraction(False, 0, None, 64, 256) == 0.25  # row count not known yet: vnodes
    assert table_fraction(False, 200_000, 180_000, 256, 256) < 1.0  # 100 % only once the snapshot is done
    assert table_fraction(True, 0, None, 0, 256) == 1.0


def test_table_eta_in_every_phase():
    from source_backfill.core.progress import table_eta

    assert table_eta(False, 50_000, 2_500.0, None, None) == pytest.approx(20)  # copying the snapshot
    assert table_eta(False, 50_000, 9_000.0, None, None, 2_000.0) == pytest.approx(25)  # the limit bounds it
    assert table_eta(False, 50_000, 2_500.0, None, None, paused=True) is None
    assert table_eta(False, None, 2_500.0, None, None) is None  # row count not known yet
    assert table_eta(True, None, None, 12, 3.0) == pytest.approx(4)  # replaying: 12 versions, lag -3/s
    assert table_eta(True, None, None, 12, -1.0) is None  # the lag does not shrink: no promise
    assert table_eta(True, None, None, 0, None) == 0.0
