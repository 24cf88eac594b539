"""The progress records the registry serves (API, CLI, metrics), and how a running job is turned into one."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from source_backfill.core import split_lag
from source_backfill.core.latency import LatencyWindow, timestamp_type_name
from source_backfill.core.progress import table_eta, table_fraction

if TYPE_CHECKING:
    from source_backfill.executors.job import Job
    from source_backfill.executors.source_backfill import SourceBackfillJob
    from source_backfill.executors.table_backfill import TableBackfillJob

#: ``lagging``: the job's lane skips its source's epochs (it rejoins by offsets; ``lag_s`` says how long).
JobStatus = Literal["pending", "backfilling", "finished", "lagging", "failed"]


# -- data types -----------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class SplitProgress:
    """One split of a job as the epoch loop last saw it."""

    split: str
    #: ``backfilling``, ``source_caching_up`` or ``finished``.
    stage: str
    backfilled_offset: int | None
    target_offset: int | None
    #: History rows consumed for this split.
    rows: int
    #: Offsets still to backfill (``target - backfilled``); 0 once finished; ``None`` while unknown.
    lag: int | None
    #: The last offset copied by reads ahead and not committed yet (``None``: none in flight), and
    #: their rows: the backfill's progress before an epoch commits it.
    read_ahead_offset: int | None = None
    rows_read_ahead: int = 0
    #: Offsets skipped below the log start (``fail_on_data_loss = false``) since the daemon started: the
    #: per-split figure, which ``/metrics`` carries only for the splits ``metrics.per_split`` picks.
    data_loss_offsets: int = 0


@dataclass(frozen=True, slots=True)
class TableProgress:
    """Where a job on a ``delta`` source stands (its strategy's phase, vnodes copied, versions behind)."""

    strategy: str
    #: ``consuming_snapshot``, ``consuming_log_store`` or ``consume_upstream``.
    phase: str
    vnodes_completed: int
    vnodes_total: int
    #: The snapshot's version (snapshot, chain); None for arrangement.
    pinned_version: int | None
    #: Source versions up to this one are in the job's table.
    cursor_version: int | None
    #: Versions the live stream delivered that the job has not emitted yet.
    lag_versions: int | None
    #: Rows emitted per stage.
    rows: dict[str, int] = field(default_factory=dict)
    #: Rows of the table version the snapshot phase copies (the pinned one; arrangement: its cursor's);
    #: None until the job has read it.
    rows_total: int | None = None
    #: Rows copied of them (``consuming_snapshot``), and the fraction (core.table_fraction).
    rows_copied: int = 0
    progress: float = 0.0
    #: A copy by files (Spark): the pinned version's data files copied, and how many it has (None:
    #: a copy by vnode, or not listed yet).
    files_copied: int | None = None
    files_total: int | None = None


@dataclass(frozen=True, slots=True)
class LiveLatency:
    """Live latency of a job's rows committed in the last ``window_s`` seconds (core.latency's definition)."""

    #: p50 and p99 (seconds) of record timestamp -> commit; None when no live row was committed in the window.
    p50_s: float | None
    p99_s: float | None
    window_s: float
    #: Live rows committed in the window.
    rows: int
    #: ``create_time`` (the producer's clock) or ``log_append_time`` (the broker's); None before any live row.
    timestamp_type: str | None


@dataclass(frozen=True, slots=True)
class JobProgress:
    """A job's progress as published by the epoch loop after each epoch."""

    epoch: int | None
    status: JobStatus
    rows_history: int
    rows_live: int
    splits: list[SplitProgress] = field(default_factory=list)
    finish_reported: bool = False
    #: Seconds left at the recent rate bounded by the rate limit; None while paused or unknown.
    eta_seconds: float | None = None
    #: History rows copied per second, wall clock, over the last 60 s (reads ahead included).
    history_rows_per_s: float | None = None
    #: Fraction of the job's history copied (reads ahead counted); 1.0 once nothing is left.
    progress: float | None = None
    #: Offsets still to backfill, all splits (reads ahead counted as read).
    remaining_offsets: int | None = None
    #: History reads stopped (paused, or rate limit 0) with offsets left: no ETA.
    history_paused: bool = False
    #: Why the job's namespace holds its history (its table bytes of the day written,
    #: ``namespaces[].max_bytes_per_day``); None: not held.
    history_held: str | None = None
    #: History rows copied by reads ahead (running ones too) that no epoch committed yet.
    rows_read_ahead: int = 0
    #: The last history read error while the job backs off (None after a good read).
    last_error: str | None = None
    #: Jobs on a ``delta`` source: their table-backfill progress (no splits).
    table: TableProgress | None = None
    #: Kafka jobs: the live latency over the last minute.
    live_latency: LiveLatency | None = None
    #: Kafka jobs reading their source's archive: history offsets planned per tier (``archive``,
    #: ``kafka``, ``gap``, ``loss``) since the daemon started; None for the others.
    history_tiers: dict[str, int] | None = None
    #: Kafka jobs: record bytes (key + value) the history reads fetched from Kafka since the daemon
    #: started (what the archive served is not in it); None for table jobs.
    history_broker_bytes: int | None = None
    #: Seconds the job's lane has been skipping its source's epochs (each step slower than the trigger;
    #: it rejoins by offsets); 0 while it keeps up. Past ``sources[].max_job_lag_s`` the job is failed.
    lag_s: float = 0.0


def live_latency(window: LatencyWindow, now: float | None = None) -> LiveLatency:
    """The published figure of a job's latency window (p50, p99) at ``now`` (monotonic; default: now)."""
    at = time.monotonic() if now is None else now
    quantiles = window.quantiles(at, (0.5, 0.99))
    p50, p99 = quantiles if quantiles is not None else (None, None)
    return LiveLatency(p50_s=p50, p99_s=p99, window_s=window.window_s, rows=window.rows(at),
                       timestamp_type=timestamp_type_name(window.timestamp_type))


# -- from running jobs ----------------------------------------------------------------------------------
def to_job_progress(job: SourceBackfillJob) -> JobProgress:
    """A snapshot of ``job``'s split states, rows, rate and ETA."""
    states = job.states
    history, live = job.rows
    status: JobStatus
    if states is None:
        status = "pending"
    elif job.failed is not None:
        status = "failed"
    elif job.backfill_done:
        status = "finished"
    else:
        status = "backfilling"
    ahead = job.read_ahead()
    summary = job.progress(ahead)
    lost = job.data_loss_offsets
    splits = []
    for split, state in sorted((states or {}).items()):
        rows_ahead, last_ahead = ahead.get(split, (0, None))
        splits.append(
            SplitProgress(
                split=split,
                stage=state.stage.value,
                backfilled_offset=state.offset,
                target_offset=state.target_offset,
                rows=state.num_consumed_rows,
                lag=split_lag(state, last_ahead),
                read_ahead_offset=last_ahead,
                rows_read_ahead=rows_ahead,
                data_loss_offsets=lost.get(split, 0),
            )
        )
    return JobProgress(
        epoch=_epoch(job),
        status=status,
        rows_history=history,
        rows_live=live,
        splits=splits,
        finish_reported=job.finish_reported,
        eta_seconds=summary.eta_seconds,
        history_rows_per_s=summary.history_rows_per_s,
        progress=summary.fraction if states is not None else None,
        remaining_offsets=summary.remaining_offsets if states is not None else None,
        history_paused=summary.paused,
        history_held=job.history_held if summary.paused else None,
        rows_read_ahead=sum(n for n, _ in ahead.values()),
        last_error=job.last_error,
        live_latency=live_latency(job.latency),
        history_tiers=job.history.tier_offsets(),
        history_broker_bytes=job.history.broker_bytes(),
    )


def table_job_progress(job: TableBackfillJob) -> JobProgress:
    """A table-backfill job's phase, vnodes, versions and rows."""
    from source_backfill.core.table_backfill import Phase

    state = job.state
    status: JobStatus
    if state is None:
        status = "pending"
    else:  # a failed job is the registry's to report: the source drops it from its jobs
        status = "finished" if job.backfill_done else "backfilling"
    rows = dict(job.rows)
    table = None
    eta_s: float | None = None
    rate: float | None = None
    paused = False
    if state is not None:
        snapshot_done = state.phase is not Phase.CONSUMING_SNAPSHOT
        vnodes_done = state.vnodes.count if snapshot_done else state.vnodes.completed()
        copied = rows.get(Phase.CONSUMING_SNAPSHOT.value, 0)
        total = job.snapshot_rows
        now = time.monotonic()
        rate = job.copied_rate.rate(now)
        replayed, arrived = job.replayed_rate.rate(now), job.arrived_rate.rate(now)
        shrinking = None if replayed is None else replayed - (arrived or 0.0)
        paused = not job.backfill_done and (job.history_waits or job.rate_limit == 0)
        eta_s = 0.0 if job.backfill_done else table_eta(
            snapshot_done, None if total is None else max(0, total - copied), rate, job.lag_versions,
            shrinking, job.rate_limit, paused=job.history_waits)
        table = TableProgress(
            strategy=state.strategy.value, phase=state.phase.value,
            vnodes_completed=vnodes_done,
            vnodes_total=state.vnodes.count, pinned_version=state.pinned, cursor_version=state.cursor,
            lag_versions=job.lag_versions, rows=rows, rows_total=total, rows_copied=copied,
            progress=table_fraction(snapshot_done, copied, total, vnodes_done, state.vnodes.count),
            files_copied=state.files,
            files_total=state.files if snapshot_done else job.file_copy.file_count,
        )
    return JobProgress(
        epoch=_epoch(job),
        status=status,
        rows_history=sum(rows.get(p.value, 0) for p in (Phase.CONSUMING_SNAPSHOT, Phase.CONSUMING_LOG_STORE)),
        rows_live=rows.get(Phase.CONSUME_UPSTREAM.value, 0),
        finish_reported=job.backfill_done,
        eta_seconds=eta_s,
        history_rows_per_s=rate if table is not None and table.phase == Phase.CONSUMING_SNAPSHOT.value
        else None,
        progress=None if table is None else table.progress,
        history_paused=paused,
        history_held=job.history_held if paused else None,
        last_error=job.last_error,
        table=table,
    )


def _epoch(job: Job) -> int | None:
    """The job's last epoch: processed (an epoch with nothing to commit counts), else committed."""
    processed = job.processed_epoch
    return processed if processed is not None else job.committed_epoch
