import re
from pathlib import Path

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


#: The page that lists every metric (its list starts at the "Per job" heading).
METRICS_PAGE = Path(__file__).resolve().parents[2] / "docs" / "operations" / "metrics.md"


def documented_metrics() -> set[str]:
    """The metric names docs/operations/metrics.md lists (without the prefix), label values left out."""
    text = METRICS_PAGE.read_text()
    listed = text.split("\n## Per job\n", 1)[1]
    return {m for m in re.findall(r"`([a-z_]+)`", listed) if not m.startswith(("error_type", "live_query"))
            and m not in ("data_loss",)}


def module_metrics() -> set[str]:
    """The metric names ``source_backfill.metrics`` defines (a counter with its ``_total``)."""
    from prometheus_client import Counter

    names = set()
    for value in vars(metrics).values():
        describe = getattr(value, "describe", None)
        if describe is None or not hasattr(value, "_name"):
            continue
        name = value._name.removeprefix(metrics.PREFIX)
        names.add(f"{name}_total" if isinstance(value, Counter) else name)
    return names


def test_the_metrics_page_lists_exactly_the_metrics_the_module_defines():
    assert documented_metrics() == module_metrics()
