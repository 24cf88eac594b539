"""Honest metrics: every metric docs/operations/metrics.md lists is exported, and moves where its event
happens.

Scraped from the daemon's real ``/metrics`` endpoint (what Prometheus sees). The scenario here covers the
job-progress and epoch metrics; metrics of faults move in the tests of those faults, named in
:data:`ASSERTED_ELSEWHERE`, and a check below keeps that table and the metrics page in step (the page and
``metrics.py``: ``tests/unit/test_metrics.py``).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from source_backfill.testing.metrics import scrape, total
from tests.integration.daemon.conftest import exactly_once, finished, job_of, job_spec, wait_for
from tests.unit.test_metrics import documented_metrics

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[3]

#: Metrics whose event is a fault, and the test that asserts they move when it happens.
ASSERTED_ELSEWHERE = {
    "source_errors_total": "daemon/test_broker_faults.py (live_query), daemon/test_log_positions.py",
    "data_loss_offsets_total": "daemon/test_log_positions.py",
    "job_data_loss_offsets_total": "daemon/test_log_positions.py",
    "job_history_tier_offsets_total": "daemon/test_archive_tier.py",
    "job_history_broker_bytes_total": "daemon/test_archive_tier.py",
    "job_history_whole_files_total": "daemon/test_archive_tier.py",
    "job_repairs_total": "daemon/test_repair.py",
    "job_repair_rows_total": "daemon/test_repair.py",
    "job_failed": "daemon/test_isolation.py",
    "job_namespace": "../unit/runtime/test_job_host.py",
    "job_epochs_skipped_total": "daemon/test_lanes.py",
    "job_rejoins_total": "daemon/test_lanes.py",
    "dead_letters_total": "daemon/test_avro.py (slow)",
    "quota_refusals_total": "api/test_tenants.py",
    "history_slot_seconds_total": "daemon/test_history_width.py",
    "namespace_table_bytes_written_total": "daemon/test_quota_daemon.py",
    "namespace_history_held": "daemon/test_quota_daemon.py",
    "audit_refusals_dropped_total": "../unit/runtime/test_audit.py",
    "kafka_partitions_without_leader": "daemon/test_kafka_failover.py (slow)",
    "kafka_partitions_under_replicated": "daemon/test_kafka_failover.py (slow)",
    "kafka_truncations_total": "daemon/test_truncation.py (slow)",
    "job_lag_seconds": "daemon/test_lanes.py",
    "job_step_duration_seconds": "daemon/test_lanes.py",
    "commit_conflicts_total": "daemon/test_table_faults.py",
    "table_backfill_rows_total": "daemon/test_table_daemon.py",
    "table_backfill_lag_versions": "daemon/test_table_daemon.py",
    "spark_work_timeouts_total": "daemon/test_jvm_survival.py",
    "job_crashes": "daemon/test_jvm_survival.py",
    "job_quarantined": "daemon/test_jvm_survival.py",
    "spark_jvm_up": "daemon/test_jvm_survival.py",
    "live_latency_seconds": "daemon/test_live_latency.py",
    "history_width_tasks": "daemon/test_history_width.py",
    "history_width_duty_ratio": "daemon/test_history_width.py",
    "history_width_latency_seconds": "daemon/test_history_width.py",
    "history_width_target_seconds": "daemon/test_history_width.py",
}


def test_progress_and_epoch_metrics_move_where_their_events_happen(
    daemon_factory, new_topic, producer_for, kafka_bootstrap, tmp_path
):
    from connectors.kafka.admin import KafkaAdmin

    topic = new_topic(2)
    p = producer_for(topic)
    p.send(3000, 2)
    p.stream(2, per_second=40)
    d = daemon_factory([topic], [job_spec("m", tmp_path, max_rows_per_epoch=300, rate_limit=600)])
    wait_for(lambda: job_of(d, "m") is not None and job_of(d, "m").rows[0] > 0, what="backfill started")

    during = _unsplit_scrape(d.api_url, "m")
    assert total(during, "job_backfilling", job="m") == 1
    assert total(during, "split_lag_offsets", job="m") > 0  # splits not Finished have series of their own
    assert total(during, "job_lag_offsets", job="m") >= total(during, "split_lag_offsets", job="m")
    assert total(during, "job_split_lag_max_offsets", job="m") > 0
    assert any(v == 0 for lab, v in during["split_stage"] if lab["job"] == "m")  # a split backfilling
    assert total(during, "job_splits", job="m", stage="backfilling") >= 1
    assert total(during, "job_eta_seconds", job="m") > 0
    assert total(during, "history_rows_total", job="m") > 0

    KafkaAdmin(kafka_bootstrap).add_partitions(topic, 3)
    p.send(50, 3, start=5000, weights=[0, 0, 1])  # into the new partition only; the stream goes on
    wait_for(lambda: finished(d, "m") and len(job_of(d, "m").states or {}) == 3, timeout=240,
             what="finished on three splits")
    wait_for(lambda: total(scrape(d.api_url), "job_rows", job="m", kind="live") > 0, what="live rows counted")

    # Finished: the per-split series are gone (metrics.per_split = auto), the job-level ones say it all.
    # The job's step sets Finished before it publishes its series: on a loaded machine a scrape may come
    # in between, so the test waits for the publish (a condition), then checks the scrape it saw
    per_split = ("history_rows_total", "live_rows_total", "split_stage", "split_lag_offsets")

    def published() -> dict | None:
        seen = scrape(d.api_url)
        shown = [(n, lab) for n in per_split for lab, _ in seen.get(n, []) if lab["job"] == "m"]
        return None if shown else seen

    after = wait_for(published, timeout=60, what="the Finished job's per-split series gone")
    assert total(after, "job_rows", job="m", kind="history") >= 3000
    assert total(after, "job_lag_offsets", job="m") == 0
    assert total(after, "job_split_lag_max_offsets", job="m") == 0
    assert total(after, "split_changes_total", job="m", change="added") >= 1
    assert total(after, "job_backfilling", job="m") == 0
    assert total(after, "job_splits", job="m", stage="finished") == 3
    assert total(after, "commits_total", job="m") > total(during, "commits_total", job="m") > 0
    assert total(after, "history_reads_ahead_total", job="m", outcome="adopted") > 0
    assert total(after, "epoch", source="src") > total(during, "epoch", source="src")
    assert total(after, "epoch_duration_seconds_count", source="src") > 0
    assert 0 <= total(after, "epoch_lag_seconds", source="src") < 30
    # every metric the deploy stack's alerts and dashboard query is exported by this live daemon
    import httpx

    from tests.integration.deploy.test_deploy_files import _exported_families, _queried

    exported = _exported_families(httpx.get(f"{d.api_url}/metrics").text)
    assert _queried() - exported == set(), "queried by deploy/ but not exported by the daemon"
    p.stop()
    exactly_once(tmp_path / "m", kafka_bootstrap, [topic])


def _unsplit_scrape(url: str, job: str) -> dict:
    """A scrape no epoch's publish split: the job's lag series the same in it and in the scrape before.

    A scrape reads ``split_lag_offsets`` before ``job_lag_offsets`` (their order in ``metrics.py``), and
    a job's step publishes them while the scrape runs (a fresh-clone ``make test`` saw a job lag of 2,180
    beside split lags summing to 2,460: the splits' from the epoch before, the job's from the next).
    Prometheus has no atomic scrape either; the relation holds between two publishes.
    """
    def lags(s: dict) -> tuple:
        return (sorted((tuple(sorted(lab.items())), v) for lab, v in s.get("split_lag_offsets", [])
                       if lab["job"] == job), total(s, "job_lag_offsets", job=job))

    before = scrape(url)
    for _ in range(50):
        now = scrape(url)
        if lags(now) == lags(before):
            return now
        before = now
    raise AssertionError(f"every scrape of 50 overlapped a publish of job {job}'s lags")


def test_every_documented_metric_is_asserted_somewhere():
    here = {"history_rows_total", "live_rows_total", "split_stage", "split_lag_offsets",
            "split_changes_total", "history_reads_ahead_total", "epoch_duration_seconds",
            "epoch_lag_seconds", "epoch", "commits_total", "job_rows", "job_splits", "job_eta_seconds",
            "job_backfilling", "job_lag_offsets", "job_split_lag_max_offsets"}
    assert here | set(ASSERTED_ELSEWHERE) == documented_metrics()
    tests = ROOT / "tests" / "integration"
    names = {"source_errors_total": "SOURCE_ERRORS", "data_loss_offsets_total": "DATA_LOSS_OFFSETS",
             "job_data_loss_offsets_total": "JOB_DATA_LOSS",
             "job_history_tier_offsets_total": "JOB_HISTORY_TIER_OFFSETS",
             "job_history_broker_bytes_total": "JOB_HISTORY_BROKER_BYTES",
             "job_history_whole_files_total": "JOB_HISTORY_WHOLE_FILES",
             "job_repairs_total": "JOB_REPAIRS", "job_repair_rows_total": "JOB_REPAIR_ROWS",
             "job_failed": "JOB_FAILED", "job_namespace": "JOB_NAMESPACE",
             "commit_conflicts_total": "COMMIT_CONFLICTS",
             "spark_work_timeouts_total": "SPARK_WORK_TIMEOUTS",
             "job_epochs_skipped_total": "JOB_EPOCHS_SKIPPED", "job_rejoins_total": "JOB_REJOINS",
             "job_lag_seconds": "JOB_LAG_SECONDS", "job_step_duration_seconds": "JOB_STEP_DURATION",
             "dead_letters_total": "DEAD_LETTERS", "quota_refusals_total": "QUOTA_REFUSALS",
             "history_slot_seconds_total": "HISTORY_SLOT_SECONDS",
             "namespace_table_bytes_written_total": "NAMESPACE_BYTES_WRITTEN",
             "namespace_history_held": "NAMESPACE_HISTORY_HELD",
             "audit_refusals_dropped_total": "AUDIT_REFUSALS_DROPPED",
             "kafka_partitions_without_leader": "KAFKA_PARTITIONS_NO_LEADER",
             "kafka_partitions_under_replicated": "KAFKA_PARTITIONS_UNDER_REPLICATED",
             "kafka_truncations_total": "KAFKA_TRUNCATIONS"}
    for metric, where in ASSERTED_ELSEWHERE.items():
        path = tests / where.split(" ", 1)[0]
        text = path.read_text()  # the metric's constant, or its scraped name
        assert f"metrics.{names.get(metric)}" in text or f'"{metric}"' in text, (metric, path)
