from hypothesis import given
from hypothesis import strategies as st

from source_backfill.core import (
    WAIT_EPOCH_MULTIPLE,
    EpochCost,
    RateAllowance,
    budget_after_adopted,
    fit_epoch_cost,
    history_budget,
    read_ahead_budget,
)
from source_backfill.core.budget import (
    FIRST_EPOCH_BUDGET,
    FIRST_READ_AHEAD,
    HISTORY_SHARE,
    MAX_GROWTH,
    MIN_ADAPTIVE_BUDGET,
    READ_AHEAD_S,
    burst_seconds,
)


def budget(**kw):
    args = dict(allowance=None, interval_s=1.0, max_rows_per_epoch=None,
                measured_rows_per_s=None, last_epoch_s=None, paused=False)
    args.update(kw)
    return history_budget(**args)


def test_paused_and_rate_zero_read_nothing():
    assert budget(paused=True) == 0
    assert budget(allowance=0) == 0  # rate 0, or nothing accrued yet


def test_self_pause_after_an_epoch_over_the_multiple():
    assert budget(last_epoch_s=WAIT_EPOCH_MULTIPLE * 1.0 + 0.1) == 0
    assert budget(last_epoch_s=WAIT_EPOCH_MULTIPLE * 1.0) > 0


def test_smallest_of_rate_cap_and_adaptive():
    assert budget() == FIRST_EPOCH_BUDGET
    assert budget(allowance=200) == 200
    assert budget(allowance=100, max_rows_per_epoch=50) == 50
    assert budget(measured_rows_per_s=10_000, interval_s=1) == 8_000
    assert budget(measured_rows_per_s=10, interval_s=1) == MIN_ADAPTIVE_BUDGET



def test_adopted_reads_count_against_the_cap_not_the_rate_or_the_adaptive_share():
    def left(budget, adopted, cap=None):
        return budget_after_adopted(budget, adopted, max_rows_per_epoch=cap)

    assert left(50_000, 1_000_000) == 50_000  # no cap: the tail is read in the adopting epoch
    assert left(700, 600, cap=700) == 100 and left(700, 700, cap=700) == 0  # the cap holds for the epoch
    assert left(50, 10, cap=500) == 50  # never above the epoch's own budget
    assert left(0, 0) == 0 and left(0, 10, cap=5) == 0  # paused / backing off stays at 0


# -- the rate limit's allowance ---------------------------------------------------------------------------
def test_the_allowance_starts_with_an_interval_and_accrues_up_to_the_burst():
    a = RateAllowance()
    assert a.available(None, 1.0, 0.0) is None
    assert a.available(100.0, 2.0, 10.0) == 200  # one interval's worth at first
    a.spend(200)
    assert a.available(100.0, 2.0, 10.5) == 50
    assert a.available(100.0, 2.0, 1_000.0) == int(100 * burst_seconds(2.0))  # never more than the burst
    assert a.available(0.0, 2.0, 1_001.0) == 0  # rate 0: nothing, and nothing saved up
    assert a.available(100.0, 2.0, 1_002.0) == 100
    tiny = RateAllowance()
    assert tiny.available(0.1, 1.0, 0.0) == 0
    assert tiny.available(0.1, 1.0, 9.0) == 1  # a tiny rate still progresses, at its pace


@given(
    rate=st.floats(1.0, 1e6),
    interval=st.floats(0.1, 5.0),
    gaps=st.lists(st.floats(0.0, 0.9), min_size=1, max_size=60),  # up to 0.9 of the burst apart
)
def test_a_reader_taking_what_accrued_copies_at_the_limit_whatever_its_pace(rate, interval, gaps):
    """Reads at any pace up to the burst (epochs of any length, Spark jobs slower than the interval)
    copy exactly the limit's worth: one interval's at the start plus ``rate`` per second since."""
    a = RateAllowance()
    now, copied = 0.0, 0
    for gap in [0.0, *gaps]:
        now += gap * burst_seconds(interval)
        got = a.available(rate, interval, now)
        copied += got
        a.spend(got)
    expected = rate * (interval + now)
    assert expected - 1 <= copied <= expected


def test_epochs_slower_than_the_interval_still_copy_at_the_limit():
    """The demo's case: epochs 1.5 s apart on a 1 s trigger. A budget of one interval's worth per epoch
    copied 2/3 of the limit; the allowance copies the limit."""
    rate, a, copied = 3_000.0, RateAllowance(), 0
    for epoch in range(40):
        got = a.available(rate, 1.0, epoch * 1.5)
        copied += got
        a.spend(got)
    assert copied == rate * (1.0 + 39 * 1.5)


def test_read_ahead_is_sized_in_seconds_of_measured_throughput_within_the_limits():
    def ahead(**kw):
        args = dict(allowance=None, interval_s=1.0, max_rows_per_epoch=None,
                    measured_rows_per_s=None, last_epoch_s=None, paused=False)
        args.update(kw)
        return read_ahead_budget(**args)

    assert ahead() == FIRST_READ_AHEAD
    assert ahead(measured_rows_per_s=100_000) == int(100_000 * READ_AHEAD_S)
    assert ahead(measured_rows_per_s=1) == MIN_ADAPTIVE_BUDGET
    assert ahead(measured_rows_per_s=100_000, max_rows_per_epoch=5_000) == 5_000
    assert ahead(allowance=200) == 200  # what the rate limit accrued since the last read
    assert ahead(paused=True) == ahead(allowance=0) == 0
    assert ahead(last_epoch_s=WAIT_EPOCH_MULTIPLE + 0.1) == 0  # the live stream struggles: no reads


def test_a_read_ahead_takes_the_tail_one_epoch_would_read_after_it_within_the_limits():
    def ahead(remaining, tail_budget, **kw):
        args = dict(allowance=None, interval_s=1.0, max_rows_per_epoch=None,
                    measured_rows_per_s=None, last_epoch_s=None, paused=False)
        args.update(kw)
        return read_ahead_budget(remaining=remaining, tail_budget=tail_budget, **args)

    n = FIRST_READ_AHEAD
    assert ahead(n + 5_900, 50_000) == n + 5_900  # the bench's 1M backfill: one read, no tail epoch
    assert ahead(n + 50_000, 50_000) == n + 50_000 and ahead(n + 50_001, 50_000) == n  # the bound
    assert ahead(n // 2, 0) == n  # less left than a read: the plan takes what is there
    assert ahead(n + 10, 50_000, max_rows_per_epoch=n) == n  # the cap still holds
    assert ahead(500, 1_000, allowance=100) == 100  # and the rate limit
    assert ahead(n + 10, 50_000, paused=True) == 0


# -- the fitted cost model ------------------------------------------------------------------------------
@given(
    fixed=st.floats(0.0, 2.0),
    rate=st.floats(1e3, 1e6),
    rows=st.lists(st.integers(1_000, 500_000), min_size=2, max_size=8, unique=True),
)
def test_fit_recovers_fixed_cost_and_rate_from_exact_samples(fixed, rate, rows):
    samples = [(n, fixed + n / rate) for n in rows]
    cost = fit_epoch_cost(samples)
    if cost is None:  # rows too alike to see a slope
        mean = sum(rows) / len(rows)
        assert sum((n - mean) ** 2 for n in rows) <= len(rows) * (0.05 * mean) ** 2
        return
    assert abs(cost.fixed_s - fixed) < 1e-6 + 1e-6 * fixed
    assert abs(cost.rows_per_s - rate) / rate < 1e-6


def test_fit_needs_two_distinct_sizes_and_a_positive_slope():
    assert fit_epoch_cost([]) is None
    assert fit_epoch_cost([(1000, 0.5)]) is None
    assert fit_epoch_cost([(1000, 0.5), (1000, 0.7)]) is None  # same size: no slope
    assert fit_epoch_cost([(1000, 0.9), (50_000, 0.5)]) is None  # bigger was faster: noise
    cost = fit_epoch_cost([(10_000, 0.1), (20_000, 0.05)] + [(30_000, 2.0)])
    assert cost is not None and 0.0 <= cost.fixed_s <= (0.1 + 0.05 + 2.0) / 3  # clamped


def test_fitted_budget_fills_the_share_after_the_fixed_cost_and_grows_at_most_the_cap():
    cost = EpochCost(fixed_s=0.3, rows_per_s=100_000)
    target = int(100_000 * (HISTORY_SHARE - 0.3))
    assert budget(epoch_cost=cost) == target
    assert budget(epoch_cost=cost, last_history_rows=10_000) == int(10_000 * MAX_GROWTH)
    assert budget(epoch_cost=EpochCost(5.0, 100_000)) == MIN_ADAPTIVE_BUDGET  # fixed cost over the share
    assert budget(epoch_cost=cost, max_rows_per_epoch=700) == 700
    assert budget(epoch_cost=cost, allowance=10) == 10
    assert budget(epoch_cost=cost, paused=True) == 0


def test_a_fitted_ramp_reaches_the_target_in_a_few_epochs():
    """Simulated epochs costing 0.35 s + rows / 150k rows/s: from the first-epoch budget, the budget
    settles within 5% of the rows that fill the share of the interval in at most six epochs."""
    fixed, rate = 0.35, 150_000.0
    target = rate * (HISTORY_SHARE - fixed)
    samples: list[tuple[int, float]] = []
    rows = budget()
    for epoch in range(6):
        samples.append((rows, fixed + rows / rate))
        rows = budget(epoch_cost=fit_epoch_cost(samples[-8:]), last_history_rows=rows,
                      measured_rows_per_s=rows / samples[-1][1])
        if abs(rows - target) / target < 0.05:
            break
    assert abs(rows - target) / target < 0.05, (epoch, rows, target)


def test_a_table_jobs_budget_is_its_allowance_and_cap():
    from source_backfill.core.budget import table_budget

    assert table_budget(paused=False, allowance=None, max_rows_per_epoch=None) is None  # no limit
    assert table_budget(paused=True, allowance=None, max_rows_per_epoch=None) == 0
    assert table_budget(paused=False, allowance=0, max_rows_per_epoch=None) == 0  # rate 0
    assert table_budget(paused=False, allowance=500, max_rows_per_epoch=None) == 500
    assert table_budget(paused=False, allowance=500, max_rows_per_epoch=200) == 200
    assert table_budget(paused=False, allowance=None, max_rows_per_epoch=200) == 200
