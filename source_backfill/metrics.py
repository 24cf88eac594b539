"""Every Prometheus metric of source-backfill, defined once (docs/operations/metrics.md lists them).

RisingWave's names are given in comments so dashboards can be mapped across.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from prometheus_client import Counter, Gauge, Histogram
from prometheus_client.metrics import MetricWrapperBase

from source_backfill.core.latency import BUCKETS

PREFIX = "source_backfill_"

# -- per split: only the splits metrics.per_split picks (PerSplit below); the job-level series always --
# -- source backfill rows (RW: source_backfill_row_count, stream_source_output_rows_counts) ------------
HISTORY_ROWS = Counter(
    PREFIX + "history_rows",
    "Rows emitted by history (backfill) reads.",
    ["job", "split"],
)
LIVE_ROWS = Counter(
    PREFIX + "live_rows",
    "Rows emitted from the live stream.",
    ["job", "split"],
)
SPLIT_STAGE = Gauge(
    PREFIX + "split_stage",
    "Backfill stage per split: 0 backfilling, 1 source_caching_up, 2 finished (core.columnar's codes).",
    ["job", "split"],
)
SPLIT_LAG = Gauge(
    PREFIX + "split_lag_offsets",
    "Offsets still to backfill per split (target - backfilled offset; a read ahead's copy counts as read).",
    ["job", "split"],
)
SPLIT_CHANGES = Counter(
    PREFIX + "split_changes",
    "Split changes applied to a job (added, removed).",
    ["job", "change"],
)
# RW: user_source_error_count
SOURCE_ERRORS = Counter(
    PREFIX + "source_errors",
    "History-read (user source) errors, each followed by a reader rebuild with backoff.",
    ["job", "error_type"],
)
HISTORY_READS_AHEAD = Counter(
    PREFIX + "history_reads_ahead",
    "History reads ahead of the epochs, by outcome: adopted (committed with an epoch), dropped (no longer "
    "fit, or paused/stopped), failed.",
    ["job", "outcome"],
)
HISTORY_WIDTH = Gauge(
    PREFIX + "history_width_tasks",
    "Spark tasks the source's history copies may run together now (the width governor's answer, or "
    "history_width.fixed_tasks).",
    ["source"],
)
HISTORY_SLOT_SECONDS = Counter(
    PREFIX + "history_slot_seconds",
    "Task-seconds the source's history copies held its width, by namespace (the turns go to the namespace "
    "that held the fewest for its share: namespaces[].width_share).",
    ["source", "namespace"],
)
HISTORY_WIDTH_DUTY = Gauge(
    PREFIX + "history_width_duty_ratio",
    "Share of the time the source's history copies may run (1 from one task up; below, one task copies "
    "this share of the time: the width governor slowing the copies for the live stream).",
    ["source"],
)
HISTORY_WIDTH_LATENCY = Gauge(
    PREFIX + "history_width_latency_seconds",
    "The live latency (p99 of the source's Finished jobs, over the governor's last step) the history "
    "width is steered by.",
    ["source"],
)
HISTORY_WIDTH_TARGET = Gauge(
    PREFIX + "history_width_target_seconds",
    "The live latency the width governor keeps (history_width.latency_target_s, or the ratio times the "
    "p99 while no copy ran).",
    ["source"],
)
DATA_LOSS_OFFSETS = Counter(
    PREFIX + "data_loss_offsets",
    "Offsets skipped because they were below the log start (failOnDataLoss=false).",
    ["job", "split"],
)

# -- live latency (core/latency.py has the one definition: record timestamp -> commit of its epoch) ------
LIVE_LATENCY = Histogram(
    PREFIX + "live_latency_seconds",
    "Live rows of a job, by latency: the record's Kafka timestamp (CreateTime or LogAppendTime, see GET "
    "/jobs/{name}) to the success of the Delta commit that holds it. History rows are not measured.",
    ["job"],
    buckets=BUCKETS,
)

# -- epochs (RW: barrier latency) ----------------------------------------------------------------------
EPOCH_DURATION = Histogram(
    PREFIX + "epoch_duration_seconds",
    "Wall time of one source epoch (one micro-batch): the batch read once and handed to the jobs' lanes, "
    "and the steps of those that end within it (a lane still busy goes on after it).",
    ["source"],
    buckets=(0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60),
)
EPOCH_LAG = Gauge(
    PREFIX + "epoch_lag_seconds",
    "Seconds since the last completed epoch of the source.",
    ["source"],
)
EPOCH = Gauge(PREFIX + "epoch", "Last completed epoch (micro-batch id) of the source.", ["source"])
COMMITS = Counter(PREFIX + "commits", "Delta commits per job (skipped replays not counted).", ["job"])
COMMIT_CONFLICTS = Counter(
    PREFIX + "commit_conflicts",
    "Epoch commits retried because another writer committed to the job's table first.",
    ["job"],
)

# -- job progress (RW: CreateMviewProgressReporter) -----------------------------------------------------
JOB_ROWS = Gauge(PREFIX + "job_rows", "Rows of a job, by kind: history and live written; read_ahead "
                 "copied by reads ahead, not committed yet (running reads too).", ["job", "kind"])
JOB_SPLITS = Gauge(PREFIX + "job_splits", "Splits of a job, by stage.", ["job", "stage"])
JOB_LAG = Gauge(
    PREFIX + "job_lag_offsets",
    "Offsets still to backfill, all splits of the job together (a read ahead's copy counts as read).",
    ["job"],
)
JOB_SPLIT_LAG_MAX = Gauge(
    PREFIX + "job_split_lag_max_offsets",
    "The slowest split's lag: the most offsets one split of the job still has to backfill.",
    ["job"],
)
JOB_DATA_LOSS = Counter(
    PREFIX + "job_data_loss_offsets",
    "Offsets skipped below the log start, all splits of the job (failOnDataLoss=false); 0 from the start.",
    ["job"],
)
JOB_HISTORY_TIER_OFFSETS = Counter(
    PREFIX + "job_history_tier_offsets",
    "History offsets of the job's reads by tier as planned with the source's archive: archive, kafka, gap "
    "(below the log start, in the archive's span, not held: nothing read), loss; a read planned again "
    "after a failure counts again.",
    ["job", "tier"],
)
JOB_HISTORY_BROKER_BYTES = Counter(
    PREFIX + "job_history_broker_bytes",
    "Bytes of the records (key + value) the job's history reads fetched from Kafka, the live stream aside: "
    "0 for what its source's archive served. Counted as each read's records are copied (a read cut short "
    "counts what it read).",
    ["job"],
)
JOB_HISTORY_WHOLE_FILES = Counter(
    PREFIX + "job_history_whole_files",
    "Data files of the source's archive the job's history took whole, linked (or copied) into its table "
    "as they are instead of read and written: a job without a transform, a trusted archive's file inside "
    "the history it copies.",
    ["job"],
)
JOB_REPAIRS = Counter(
    PREFIX + "job_repairs",
    "Repairs of the job's rows (POST /jobs/{name}/repair) by outcome: done (committed, or nothing of the "
    "job's rows in the window), failed (the table unchanged; the error is in GET /jobs/{name}).",
    ["job", "outcome"],
)
JOB_REPAIR_ROWS = Counter(
    PREFIX + "job_repair_rows",
    "Rows the job's repairs replaced: removed (the window's rows before) and added (the fresh copy).",
    ["job", "kind"],
)
JOB_ETA = Gauge(PREFIX + "job_eta_seconds", "Estimated seconds until the job's backfill finishes.", ["job"])
JOB_BACKFILLING = Gauge(
    PREFIX + "job_backfilling", "1 while the job is backfilling, 0 once finished.", ["job"]
)
# -- table backfill (RW: snapshot_backfill_consume_row_count, arrangement_backfill_snapshot_read_row_count) --
TABLE_BACKFILL_ROWS = Counter(
    PREFIX + "table_backfill_rows",
    "Rows a table-backfill job emitted, by stage: consuming_snapshot (copied from the table), "
    "consuming_log_store (replayed from its change feed), consume_upstream (live changes forwarded).",
    ["job", "stage"],
)
TABLE_BACKFILL_LAG = Gauge(
    PREFIX + "table_backfill_lag_versions",
    "Table versions the live stream delivered that a table-backfill job has not emitted yet.",
    ["job"],
)
JOB_FAILED = Gauge(
    PREFIX + "job_failed", "1 while the job is failed (see its error in the API; retry or drop it).", ["job"]
)
JOB_NAMESPACE = Gauge(
    PREFIX + "job_namespace",
    "1 for each job the daemon runs (failed ones too), labelled with its namespace (jobs[].namespace): the "
    "job series carry only job, and a job of the default namespace has no <namespace>. prefix to tell it "
    "by, so dashboards choose jobs of a namespace from this series.",
    ["job", "namespace"],
)
# -- lanes: each job runs its epochs on its own lane; a busy lane skips the source's epochs and lags ----
JOB_EPOCHS_SKIPPED = Counter(
    PREFIX + "job_epochs_skipped",
    "Source epochs a job skipped because its lane was still busy with an earlier one (it rejoins by "
    "offsets).",
    ["job"],
)
KAFKA_PARTITIONS_NO_LEADER = Gauge(
    PREFIX + "kafka_partitions_without_leader",
    "Partitions of the source's topics without a leader, as the cluster's metadata said at the last look "
    "(every 5 s): their reads wait for a new leader.",
    ["source"],
)
KAFKA_PARTITIONS_UNDER_REPLICATED = Gauge(
    PREFIX + "kafka_partitions_under_replicated",
    "Partitions of the source's topics with fewer in-sync replicas than replicas (a broker down or behind).",
    ["source"],
)
KAFKA_TRUNCATIONS = Counter(
    PREFIX + "kafka_truncations",
    "Partitions found truncated below what the source copied (an anchor's record gone: unclean leader "
    "election, lost disk); the source's jobs that read them are failed.",
    ["source"],
)
QUOTA_REFUSALS = Counter(
    PREFIX + "quota_refusals",
    "Requests a namespace's quota refused (namespaces[].max_jobs, max_rate_limit, max_bytes_per_day), by "
    "namespace and quota.",
    ["namespace", "quota"],
)
AUDIT_REFUSALS_DROPPED = Counter(
    PREFIX + "audit_refusals_dropped",
    "Refused requests whose audit row was not kept: more than 10,000 waited for their commit (a flood); "
    "their log lines are still written.",
)
NAMESPACE_BYTES_WRITTEN = Counter(
    PREFIX + "namespace_table_bytes_written",
    "Bytes the namespace's jobs added to their tables (Delta files' sizes, counted by table version), "
    "as counted toward namespaces[].max_bytes_per_day.",
    ["namespace"],
)
NAMESPACE_HISTORY_HELD = Gauge(
    PREFIX + "namespace_history_held",
    "1 while the namespace has written its namespaces[].max_bytes_per_day today (UTC): its jobs' history "
    "copies are held and its creates refused until the next day; live rows are still committed.",
    ["namespace"],
)
DEAD_LETTERS = Counter(
    PREFIX + "dead_letters",
    "Records a job could not decode, merged into its dead-letter table (format.on_decode_error = "
    '"dead_letter"; a record read again after a crash counts again, its row does not).',
    ["job"],
)
JOB_REJOINS = Counter(
    PREFIX + "job_rejoins",
    "Epochs that did not start where the job's output ended: the job realigned by offsets "
    "(core.plan.rejoin).",
    ["job"],
)
JOB_LAG_SECONDS = Gauge(
    PREFIX + "job_lag_seconds",
    "Age in seconds of the oldest source epoch the job skipped whose records its output does not hold yet "
    "(0: keeping up); past sources[].max_job_lag_s the job is failed.",
    ["job"],
)
JOB_STEP_DURATION = Histogram(
    PREFIX + "job_step_duration_seconds",
    "Wall time of one job's step on its lane (its epoch: repairs due, plan, reads, transform, commit).",
    ["job"],
    buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300),
)

# -- a transform cannot take the daemon down (executors/spark_work.py, runtime/watchdog.py) -------------
SPARK_WORK_TIMEOUTS = Counter(
    PREFIX + "spark_work_timeouts",
    "A job's Spark work (an epoch's, a read ahead's) cancelled past its deadline (sources[].job_timeout_s).",
    ["job"],
)
JOB_CRASHES = Gauge(
    PREFIX + "job_crashes",
    "Deaths of Spark's JVM in a row with the job's Spark work in flight; 0 again once work of a kind that "
    "was in flight then completes.",
    ["job"],
)
JOB_QUARANTINED = Gauge(
    PREFIX + "job_quarantined",
    "1 while the job is failed because its Spark work was in flight at daemon.quarantine_after_crashes "
    "crashes in a row (retry it to run it again).",
    ["job"],
)
SPARK_JVM_UP = Gauge(
    PREFIX + "spark_jvm_up",
    "1 while Spark's JVM answers the daemon's watchdog; 0 once it is gone (the daemon then exits), and in a "
    "daemon that runs no Spark (delta sources only).",
)


#: The series labelled (job, split): exported for the splits :class:`PerSplit` picks.
PER_SPLIT_SERIES = (HISTORY_ROWS, LIVE_ROWS, SPLIT_STAGE, SPLIT_LAG, DATA_LOSS_OFFSETS)

PerSplitMode = Literal["auto", "always", "never"]


@dataclass(frozen=True)
class PerSplit:
    """Which splits of a job get per-split series (``metrics.per_split``, ``metrics.per_split_max``).

    ``auto``: the splits not Finished and those with data loss, at most ``max_splits`` of them (data loss
    first, then the most lagging); ``always``: every split; ``never``: none. The job-level series
    (``job_*``) are exported whatever the mode, and ``GET /jobs/{name}`` has every split.
    """

    mode: PerSplitMode = "auto"
    max_splits: int = 50


_per_split = PerSplit()


def configure_per_split(policy: PerSplit) -> None:
    """Set the process's per-split policy (the daemon, from its config, before any job publishes)."""
    global _per_split  # process-wide, like the registry the series live in
    _per_split = policy


def per_split() -> PerSplit:
    """The process's per-split policy."""
    return _per_split


def observe_counts(histogram: Histogram, counts: tuple[int, ...], sum_s: float) -> None:
    """Add rows counted per bucket (``+Inf`` last, not cumulative) to a labelled ``histogram``'s child.

    One call per epoch instead of one ``observe`` per row (an epoch may commit 100,000 live rows).
    """
    buckets = histogram._buckets  # noqa: SLF001 - prometheus_client observes one value at a time only
    for bucket, n in zip(buckets, counts, strict=True):
        if n:
            bucket.inc(n)
    histogram._sum.inc(sum_s)  # noqa: SLF001


def forget_split(job: str, split: str) -> None:
    """Drop the per-split series of one split of ``job`` (it no longer qualifies, or left the job)."""
    for metric in PER_SPLIT_SERIES:
        metric.remove(job, split)


def forget_splits(job: str) -> None:
    """Drop every per-split series of ``job`` (a rebuilt job starts its per-split series anew)."""
    for metric in PER_SPLIT_SERIES:
        _remove_job(metric, job)


def forget_job(job: str) -> None:
    """Drop every labelled series of ``job`` (on job drop), so dashboards do not show ghosts.

    Every metric of this module whose first label is ``job``: a hand-written list had left one out.
    """
    for metric in globals().values():
        if isinstance(metric, MetricWrapperBase) and metric._labelnames[:1] == ("job",):  # noqa: SLF001
            _remove_job(metric, job)


def _remove_job(metric: MetricWrapperBase, job: str) -> None:
    for labels in list(metric._metrics):  # noqa: SLF001 - prometheus_client has no public iterator
        if labels[0] == job:
            metric.remove(*labels)
