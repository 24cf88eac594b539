"""The load soak's quantiles: interpolated within the histogram's buckets, over the window only."""

from __future__ import annotations

from functools import partial

from bench.bench_load import _quantile as quantile

_quantile = partial(quantile, name="epoch_duration_seconds", source="src")

INF = float("inf")


def _hist(pairs: list[tuple[float, float]]) -> dict:
    return {"epoch_duration_seconds_bucket": [({"source": "src", "le": str(le)}, n) for le, n in pairs]
            + [({"source": "other", "le": "1.0"}, 1000.0)]}


def test_quantiles_interpolate_within_the_bucket_as_prometheus_does() -> None:
    after = _hist([(0.5, 0), (1.0, 10), (2.0, 30), (5.0, 40), (INF, 40)])
    assert _quantile(after, {}, 0.25) == 1.0
    assert _quantile(after, {}, 0.5) == 1.5
    assert _quantile(after, {}, 0.99) == 4.88


def test_only_the_windows_epochs_count() -> None:
    before = _hist([(0.5, 0), (1.0, 0), (2.0, 100), (5.0, 100), (INF, 100)])
    after = _hist([(0.5, 0), (1.0, 10), (2.0, 110), (5.0, 120), (INF, 120)])
    assert _quantile(after, before, 0.5) == 1.0  # 10 in (0.5, 1], 10 in (2, 5]: the median at 1.0
    assert _quantile(after, after, 0.5) is None


def test_the_live_latency_sums_every_jobs_series() -> None:
    counts = {"a": (10.0, 10.0, 10.0), "b": (0.0, 10.0, 10.0)}  # cumulative, at le 1.0, 2.0, +Inf
    after = {"live_latency_seconds_bucket": [({"job": job, "le": le}, n) for job, ns in counts.items()
                                             for le, n in zip(("1.0", "2.0", "+Inf"), ns, strict=True)]}
    # 20 rows: 10 in (0, 1], 10 in (1, 2]; one job's series alone would put the median at 0.5 or 1.5
    assert quantile(after, {}, 0.5, "live_latency_seconds") == 1.0
    assert quantile(after, {}, 0.5, "live_latency_seconds", job="b") == 1.5
