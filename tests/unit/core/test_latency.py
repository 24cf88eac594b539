"""Live latency (core.latency): record timestamp -> commit, histogram counts, and p50/p99 over a window."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from source_backfill.core.latency import (
    BUCKETS,
    LOG_APPEND_TIME,
    WINDOW_S,
    Latencies,
    LatencyWindow,
    measure,
    measure_spread,
    merge,
    timestamp_type_name,
)

COMMIT_MS = 1_700_000_000_000.0


def test_latency_is_commit_time_minus_the_record_timestamp_never_negative():
    lat = measure([COMMIT_MS - 30, COMMIT_MS - 700, COMMIT_MS - 90_000, COMMIT_MS + 500], COMMIT_MS)
    assert lat.rows == 4
    assert lat.sum_s == pytest.approx(0.03 + 0.7 + 90.0 + 0.0)  # a producer clock ahead counts as 0
    assert sum(lat.counts) == 4 and len(lat.counts) == len(BUCKETS) + 1
    assert lat.counts[0] == 2  # 0.03 s and 0 s: <= 0.05
    assert lat.counts[BUCKETS.index(1.0)] == 1  # 0.7 s: in (0.5, 1]
    assert lat.counts[-1] == 1  # 90 s: +Inf


def test_a_value_on_a_bucket_bound_is_in_that_bucket_as_prometheus_le():
    lat = measure([COMMIT_MS - 1000], COMMIT_MS)
    assert lat.counts[BUCKETS.index(1.0)] == 1


@given(st.floats(0, 120), st.floats(0, 120), st.integers(1, 10_000))
def test_spread_rows_are_all_counted_and_their_mean_is_the_middle(a, b, rows):
    lo, hi = sorted((a, b))
    lat = measure_spread(COMMIT_MS - hi * 1000, COMMIT_MS - lo * 1000, rows, COMMIT_MS)
    assert lat.rows == rows and sum(lat.counts) == rows and min(lat.counts) >= 0
    assert lat.sum_s / rows == pytest.approx((lo + hi) / 2, abs=1e-6)
    assert lat.weights.sum() == pytest.approx(rows)


def test_spread_matches_row_by_row_counts_within_rounding():
    ts = np.linspace(COMMIT_MS - 20_000, COMMIT_MS - 100, 10_000)
    exact, spread = measure(ts, COMMIT_MS), measure_spread(ts.min(), ts.max(), len(ts), COMMIT_MS)
    assert np.abs(np.array(exact.counts) - np.array(spread.counts)).max() <= 2


def test_merge_adds_rows_counts_and_sums():
    a = measure(np.full(100, COMMIT_MS - 200), COMMIT_MS)
    b = measure_spread(COMMIT_MS - 5000, COMMIT_MS - 1000, 300, COMMIT_MS)
    m = merge([a, Latencies.empty(), b])
    assert m.rows == 400 and m.counts == tuple(x + y for x, y in zip(a.counts, b.counts, strict=True))
    assert m.sum_s == pytest.approx(a.sum_s + b.sum_s)
    assert merge([]).rows == 0


def test_window_quantiles_weigh_every_row_the_same():
    w = LatencyWindow()
    w.add(0.0, measure(np.full(990, COMMIT_MS - 100), COMMIT_MS))  # 990 rows at 0.1 s
    w.add(1.0, measure(np.full(10, COMMIT_MS - 9000), COMMIT_MS))  # 10 rows at 9 s
    p50, p99, p999 = w.quantiles(1.0, (0.5, 0.99, 0.999))
    assert p50 == pytest.approx(0.1) and p99 == pytest.approx(0.1) and p999 == pytest.approx(9.0)
    assert w.rows(1.0) == 1000


def test_window_forgets_rows_committed_before_its_last_window_s():
    w = LatencyWindow()
    w.add(0.0, measure(np.full(1000, COMMIT_MS - 30_000), COMMIT_MS), LOG_APPEND_TIME)  # a slow minute
    w.add(50.0, measure(np.full(10, COMMIT_MS - 200), COMMIT_MS))
    assert w.quantiles(50.0)[1] == pytest.approx(30.0)
    assert w.quantiles(WINDOW_S + 1)[1] == pytest.approx(0.2)  # the slow epoch left the window
    assert w.quantiles(200.0) is None and w.rows(200.0) == 0  # no live row: no figure
    assert timestamp_type_name(w.timestamp_type) == "log_append_time"


def test_a_large_epoch_is_kept_as_a_small_sketch_with_the_same_quantiles():
    rng = np.random.default_rng(7)
    lat_s = rng.exponential(0.3, 100_000)
    lat = measure(COMMIT_MS - lat_s * 1000, COMMIT_MS)
    assert len(lat.points) <= 64
    w = LatencyWindow()
    w.add(0.0, lat)
    p50, p99 = w.quantiles(0.0)
    assert p50 == pytest.approx(np.quantile(lat_s, 0.5), rel=0.05)
    assert p99 == pytest.approx(np.quantile(lat_s, 0.99), rel=0.15)


def test_timestamp_type_names():
    assert timestamp_type_name(0) == "create_time" and timestamp_type_name(1) == "log_append_time"
    assert timestamp_type_name(None) is None and timestamp_type_name(-1) == "none"
