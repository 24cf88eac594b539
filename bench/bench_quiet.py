"""Cost that grows with work, not with size (issue 27): what a job that does nothing costs. ``quiet.*`` keys.

One function per key, each returning its figures; :func:`main` runs them all. Each compares with the
cost before the fix, measured in the same run.

``quiet.metrics_series_10k``: the sample lines (``_created`` and friends included) that one Finished job
on 10,000 splits adds to ``/metrics`` (goal ≤ 100). The job's split states are built with the core types
(no topic, no Spark) and published through the runtime's own path, ``JobMetrics.rows`` then
``JobMetrics.state`` as ``SourceBackfillJob._account`` calls them, for two epochs: every split backfilling
(history rows on each), then every split Finished (live rows on each). Counted in the exposition text
Prometheus scrapes (``generate_latest``), lines naming the job. Baseline: ``metrics.per_split =
"always"``, what every job exported before.
"""

from __future__ import annotations

import json
import time
from typing import Any

SPLITS = 10_000
GOAL_SERIES = 100


def _job_lines(job: str) -> int:
    from prometheus_client import REGISTRY, generate_latest

    label = f'job="{job}"'
    return sum(1 for line in generate_latest(REGISTRY).decode().splitlines()
               if not line.startswith("#") and label in line)


def _publish_job(job: str, policy: Any) -> float:
    """One job's life on ``SPLITS`` splits through ``JobMetrics``; the caught-up epoch's publish in ms."""
    from source_backfill import metrics
    from source_backfill.core import LiveStats, SplitState
    from source_backfill.core.columnar import SplitTable
    from source_backfill.executors.accounting import JobMetrics, Rates

    splits = [f"events:{i}" for i in range(SPLITS)]
    metrics.JOB_FAILED.labels(job).set(0)  # what the runtime sets besides JobMetrics (runtime/jobs.py)
    metrics.SPLIT_CHANGES.labels(job, "added").inc(SPLITS)
    metrics.HISTORY_READS_AHEAD.labels(job, "adopted").inc()
    jm = JobMetrics(job, policy)
    rates = Rates()
    backfilling = SplitTable.from_states({s: SplitState.backfilling(499, 999, rows=500) for s in splits})
    jm.rows({}, {}, {s: 500 for s in splits})
    rates.rows_history = 500 * SPLITS
    jm.state(backfilling, {}, rates, 60.0, committed=True)
    done = SplitTable.from_states({s: SplitState.finished(999, 999, rows=1000) for s in splits})
    live = {s: LiveStats(1000, 1019, 20, 1020) for s in splits}
    best = float("inf")
    for _ in range(3):  # caught up: every split Finished, live rows on each
        t = time.perf_counter()
        jm.rows(live, dict.fromkeys(splits, -1), {})
        jm.state(done, {}, rates, None, committed=True)
        best = min(best, time.perf_counter() - t)
    return best * 1000


def metrics_series_10k() -> dict[str, Any]:
    """``quiet.metrics_series_10k``: sample lines of one Finished job on 10,000 splits (default policy)."""
    from source_backfill import metrics

    figures: dict[str, Any] = {}
    for name, policy in (("before", metrics.PerSplit("always")), ("after", metrics.PerSplit())):
        job = f"bench-quiet-{name}"
        ms = _publish_job(job, policy)
        figures[name] = (_job_lines(job), ms)
        metrics.forget_job(job)
    after, before = figures["after"][0], figures["before"][0]
    return {
        "quiet.metrics_series_10k": after,
        "quiet.metrics_series_10k.before": before,
        "quiet.metrics_series_10k.ratio_vs_before": round(after / before, 5),
        "quiet.metrics_series_10k.verdict": "ok" if after <= GOAL_SERIES else f"{after} > {GOAL_SERIES}",
        "quiet.metrics_publish_ms_10k": round(figures["after"][1], 2),
        "quiet.metrics_publish_ms_10k.before": round(figures["before"][1], 2),
    }


def main() -> dict[str, Any]:
    result = metrics_series_10k()
    print("bench_quiet:", json.dumps(result), flush=True)
    print(f"  one Finished job on {SPLITS} splits adds {result['quiet.metrics_series_10k']} sample lines to "
          f"/metrics (goal <= {GOAL_SERIES}: {result['quiet.metrics_series_10k.verdict']}); "
          f"per_split = \"always\" (before): {result['quiet.metrics_series_10k.before']}, ratio "
          f"{result['quiet.metrics_series_10k.ratio_vs_before']}")
    print(f"  a caught-up epoch's metrics: {result['quiet.metrics_publish_ms_10k']} ms "
          f"(before: {result['quiet.metrics_publish_ms_10k.before']} ms)")
    return result


if __name__ == "__main__":
    main()
