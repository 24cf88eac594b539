"""JobMetrics: job-level series always, per-split series only for the splits ``metrics.per_split`` picks."""

import uuid

import numpy as np
import pytest
from prometheus_client import REGISTRY, generate_latest

from source_backfill import metrics
from source_backfill.core import LiveStats, SplitState
from source_backfill.core.columnar import SplitTable
from source_backfill.executors.accounting import JobMetrics, Rates, split_series

AUTO = metrics.PerSplit("auto", 50)


def job_name() -> str:
    return f"acct-{uuid.uuid4().hex[:8]}"


def samples(job: str) -> list:
    return [s for m in REGISTRY.collect() for s in m.samples if s.labels.get("job") == job]


def split_samples(job: str) -> dict[str, set[str]]:
    """Per split, the sample names it has."""
    out: dict[str, set[str]] = {}
    for s in samples(job):
        if "split" in s.labels:
            out.setdefault(s.labels["split"], set()).add(s.name)
    return out


def value(name: str, **labels: str) -> float | None:
    return REGISTRY.get_sample_value(metrics.PREFIX + name, labels)


def publish(jm: JobMetrics, states: dict[str, SplitState], history: dict[str, int] | None = None,
            live: dict[str, int] | None = None) -> None:
    """One epoch as ``SourceBackfillJob._account`` runs it: rows, then state."""
    live_stats = {s: LiveStats(1000, 1000 + n - 1, n, 1000 + n) for s, n in (live or {}).items()}
    jm.rows(live_stats, {s: -1 for s in live_stats}, history or {})
    jm.state(SplitTable.from_states(states), {}, Rates(), None, committed=True)


def finished(n: int) -> dict[str, SplitState]:
    return {f"t:{i}": SplitState.finished(99, 99, rows=100) for i in range(n)}


def test_a_finished_job_on_10000_splits_exports_job_level_series_only():
    job = job_name()
    jm = JobMetrics(job, AUTO)
    states = finished(10_000)
    publish(jm, states, history={s: 100 for s in states}, live={s: 5 for s in states})
    lines = [line for line in generate_latest(REGISTRY).decode().splitlines()
             if not line.startswith("#") and f'job="{job}"' in line]
    assert len(lines) <= 100
    assert split_samples(job) == {}
    assert value("job_splits", job=job, stage="finished") == 10_000
    assert value("job_rows", job=job, kind="live") == 0  # Rates() given: the rows the job counted
    assert value("job_lag_offsets", job=job) == 0
    assert value("job_split_lag_max_offsets", job=job) == 0
    assert value("job_data_loss_offsets_total", job=job) == 0
    metrics.forget_job(job)


def test_always_is_every_split_and_never_is_none():
    job_a, job_n = job_name(), job_name()
    states = finished(30)
    publish(JobMetrics(job_a, metrics.PerSplit("always", 5)), states, history={"t:0": 7})
    publish(JobMetrics(job_n, metrics.PerSplit("never", 50)),
            {**states, "t:0": SplitState.backfilling(10, 99)})
    shown = split_samples(job_a)
    assert len(shown) == 30  # the cap is auto's
    assert shown["t:0"] == {metrics.PREFIX + n for n in ("history_rows_total", "history_rows_created",
                                                          "live_rows_total", "live_rows_created",
                                                          "split_stage", "split_lag_offsets")}
    assert value("history_rows_total", job=job_a, split="t:0") == 7
    assert split_samples(job_n) == {}
    assert value("job_split_lag_max_offsets", job=job_n) == 89
    metrics.forget_job(job_a)
    metrics.forget_job(job_n)


def test_a_split_not_finished_has_series_until_it_finishes():
    job = job_name()
    jm = JobMetrics(job, AUTO)
    states = finished(100)
    states["t:7"] = SplitState.backfilling(40, 99, rows=41)
    publish(jm, states, history={"t:7": 41, "t:8": 3}, live={"t:7": 2, "t:9": 4})
    assert set(split_samples(job)) == {"t:7"}
    assert value("split_lag_offsets", job=job, split="t:7") == 59
    assert value("split_stage", job=job, split="t:7") == 0
    assert value("history_rows_total", job=job, split="t:7") == 41  # rows of the epoch it appeared in
    assert value("live_rows_total", job=job, split="t:7") == 2
    assert value("job_lag_offsets", job=job) == 59

    states["t:7"] = SplitState.backfilling(90, 99, rows=91)
    publish(jm, states, history={"t:7": 50})
    assert value("split_lag_offsets", job=job, split="t:7") == 9
    assert value("history_rows_total", job=job, split="t:7") == 91

    states["t:7"] = SplitState.finished(99, 99, rows=100)
    publish(jm, states, history={"t:7": 9})
    assert split_samples(job) == {}
    assert value("job_splits", job=job, stage="finished") == 100
    metrics.forget_job(job)


def test_a_split_that_qualifies_later_starts_at_its_total():
    job = job_name()
    jm = JobMetrics(job, AUTO)
    states = finished(3)
    publish(jm, states, history={"t:1": 10}, live={"t:1": 5})
    publish(jm, states, live={"t:1": 6})
    assert split_samples(job) == {}
    jm.data_loss("t:1", 30)
    publish(jm, states)
    assert set(split_samples(job)) == {"t:1"}  # a Finished split with data loss: interesting
    assert value("history_rows_total", job=job, split="t:1") == 10
    assert value("live_rows_total", job=job, split="t:1") == 11
    assert value("data_loss_offsets_total", job=job, split="t:1") == 30
    jm.data_loss("t:1", 2)
    assert value("data_loss_offsets_total", job=job, split="t:1") == 32
    assert value("job_data_loss_offsets_total", job=job) == 32
    metrics.forget_job(job)


def test_auto_caps_at_the_most_lagging_splits():
    job = job_name()
    jm = JobMetrics(job, metrics.PerSplit("auto", 5))
    states = {f"t:{i}": SplitState.backfilling(i, 1000) for i in range(200)}  # t:0 lags most
    publish(jm, states)
    assert set(split_samples(job)) == {f"t:{i}" for i in range(5)}
    assert value("job_split_lag_max_offsets", job=job) == 1000
    assert value("job_lag_offsets", job=job) == sum(1000 - i for i in range(200))
    for i in range(3):  # three of them advance past the others: replaced, their series removed
        states[f"t:{i}"] = SplitState.backfilling(900, 1000)
    publish(jm, states)
    assert set(split_samples(job)) == {"t:3", "t:4", "t:5", "t:6", "t:7"}
    assert ("t:0" not in {k[1] for k in metrics.SPLIT_LAG._metrics if k[0] == job})
    metrics.forget_job(job)


def test_split_series_ranks_data_loss_then_lag_then_those_shown():
    stages = np.zeros(4, dtype=np.int8)
    lags = np.array([5, 9, 5, 1], dtype=np.int64)
    lost = np.array([0, 0, 0, 3], dtype=np.int64)
    none = np.zeros(4, dtype=bool)
    pick = split_series(metrics.PerSplit("auto", 2), stages, lags, lost, none)
    assert pick.tolist() == [False, True, False, True]
    pick = split_series(metrics.PerSplit("auto", 3), stages, lags, lost, np.array([0, 0, 1, 0], bool))
    assert pick.tolist() == [False, True, True, True]  # the tie at lag 5 kept by the one shown
    assert not split_series(metrics.PerSplit("auto", 0), stages, lags, lost, none).any()


def test_a_split_removed_from_the_job_loses_its_series():
    job = job_name()
    jm = JobMetrics(job, metrics.PerSplit("always", 50))
    states = finished(3)
    publish(jm, states)
    del states["t:2"]
    publish(jm, states)
    assert set(split_samples(job)) == {"t:0", "t:1"}
    metrics.forget_job(job)


def test_a_rebuilt_job_starts_its_per_split_series_anew():
    job = job_name()
    states = {"t:0": SplitState.backfilling(0, 99)}
    publish(JobMetrics(job, AUTO), states, history={"t:0": 10})
    publish(JobMetrics(job, AUTO), states, history={"t:0": 4})  # rebuilt from its table: counts again
    assert value("history_rows_total", job=job, split="t:0") == 4
    metrics.forget_job(job)


def test_a_dropped_job_leaves_no_series():
    job = job_name()
    jm = JobMetrics(job, metrics.PerSplit("always", 50))
    publish(jm, {"t:0": SplitState.backfilling(0, 99)}, history={"t:0": 1})
    jm.data_loss("t:0", 1)
    metrics.HISTORY_READS_AHEAD.labels(job, "adopted").inc()  # left behind by a hand-written list
    metrics.SPLIT_CHANGES.labels(job, "added").inc()
    metrics.JOB_FAILED.labels(job).set(0)
    assert samples(job)
    metrics.forget_job(job)
    assert samples(job) == []


def test_the_daemons_policy_applies_when_none_is_given():
    job = job_name()
    jm = JobMetrics(job)
    try:
        metrics.configure_per_split(metrics.PerSplit("never", 50))
        publish(jm, {"t:0": SplitState.backfilling(0, 99)})
        assert split_samples(job) == {}
        metrics.configure_per_split(metrics.PerSplit("auto", 50))
        publish(jm, {"t:0": SplitState.backfilling(0, 99)})
        assert set(split_samples(job)) == {"t:0"}
    finally:
        metrics.configure_per_split(metrics.PerSplit())
        metrics.forget_job(job)


# -- live latency --------------------------------------------------------------------------------------
def test_live_latency_measures_only_the_live_rows_the_epoch_emits_on_the_driver():
    import pyarrow as pa

    from source_backfill.executors.accounting import live_latencies

    commit_ms = 1_700_000_000_000
    n = 10
    rows = pa.table({
        "topic": ["t"] * 2 * n, "partition": pa.array([0] * n + [1] * n, pa.int32()),
        "offset": pa.array(list(range(n)) * 2, pa.int64()),
        "timestamp": pa.array([(commit_ms - 100) * 1000] * n + [(commit_ms - 5000) * 1000] * n,
                              pa.timestamp("us", "UTC")),  # microseconds, as Spark gives them
        "timestampType": pa.array([1] * 2 * n, pa.int32()),
    })
    # t:1 still backfilling (emits nothing), t:0 emits offsets > 4
    lat, kind = live_latencies({}, {"t:0": 4, "t:1": None}, rows, commit_ms)
    assert lat.rows == 5 and lat.sum_s == 0.5 and kind == 1
    lat, _ = live_latencies({}, {"t:0": None, "t:1": None}, rows, commit_ms)
    assert lat.rows == 0


def test_live_latency_from_spark_stats_spreads_the_emitted_rows_over_the_timestamp_range():
    from source_backfill.executors.accounting import live_latencies

    commit_ms = 1_700_000_000_000
    live = {"t:0": LiveStats(100, 199, 100, 200, commit_ms - 10_000, commit_ms - 0, 0),
            "t:1": LiveStats(0, 9, 10, 10, commit_ms - 1000, commit_ms - 1000, 0),
            "t:2": LiveStats(0, 9, 10, 10)}  # no timestamps known: not measured
    lat, kind = live_latencies(live, {"t:0": 149, "t:1": -1, "t:2": -1}, None, commit_ms)
    assert lat.rows == 50 + 10 and kind == 0
    # t:0's upper half of offsets: the newest half of its timestamps, 0-5 s old
    assert lat.sum_s == pytest.approx(50 * 2.5 + 10 * 1.0, rel=0.01)


def test_live_latency_histogram_counts_rows_per_bucket():
    from source_backfill.core.latency import measure

    job = job_name()
    jm = JobMetrics(job, AUTO)
    jm.latency(measure([1000.0 - 30, 1000.0 - 300, 1000.0 - 300, 1000.0 - 70_000], 1000.0))
    assert value("live_latency_seconds_count", job=job) == 4
    assert value("live_latency_seconds_bucket", job=job, le="0.05") == 1
    assert value("live_latency_seconds_bucket", job=job, le="0.5") == 3
    assert value("live_latency_seconds_bucket", job=job, le="60.0") == 3
    assert value("live_latency_seconds_sum", job=job) == pytest.approx(0.63 + 70)
    metrics.forget_job(job)
    assert value("live_latency_seconds_count", job=job) is None
