from source_backfill import metrics


def test_forget_job_drops_only_that_jobs_series():
    metrics.HISTORY_ROWS.labels("gone", "t:0").inc()
    metrics.JOB_ETA.labels("gone").set(3)
    metrics.JOB_ETA.labels("kept").set(1)
    metrics.forget_job("gone")
    assert ("gone", "t:0") not in metrics.HISTORY_ROWS._metrics
    assert ("gone",) not in metrics.JOB_ETA._metrics
    assert ("kept",) in metrics.JOB_ETA._metrics


def test_every_metric_has_the_prefix():
    from prometheus_client import REGISTRY

    ours = [m.name for m in REGISTRY.collect() if "backfill" in m.name]
    assert ours and all(n.startswith(metrics.PREFIX) for n in ours)
