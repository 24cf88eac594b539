"""The progress records the registry serves (API, CLI, metrics), and how a running job is turned into one."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from source_backfill.core import split_lag

if TYPE_CHECKING:
    from source_backfill.executors.source_backfill import SourceBackfillJob
    from source_backfill.executors.table_backfill import TableBackfillJob

JobStatus = Literal["pending", "backfilling", "finished", "failed"]


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


@dataclass(frozen=True, slots=True)
class JobProgress:
    """A job's progress as published by the epoch loop after each epoch."""

    epoch: int | None
    status: JobStatus
    rows_history: int
    rows_live: int
    splits: list[SplitProgress] = field(default_factory=list)
    finish_reported: bool = False
    eta_seconds: float | None = None
    history_rows_per_s: float | None = None
    #: History rows copied by reads ahead (running ones too) that no epoch committed yet.
    rows_read_ahead: int = 0
    #: The last history read error while the job backs off (None after a good read).
    last_error: str | None = None
    #: Jobs on a ``delta`` source: their table-backfill progress (no splits).
    table: TableProgress | None = None


# -- from running jobs ----------------------------------------------------------------------------------
def to_job_progress(job: SourceBackfillJob) -> JobProgress:
    """A snapshot of ``job``'s split states, rows, rate and ETA."""
    states = job.states
    history, live = job.rows
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
        history_rows_per_s=job._rates.history_rows_per_s,  # noqa: SLF001 - same package, read-only
        rows_read_ahead=sum(n for n, _ in ahead.values()),
        last_error=job.last_error,
    )


def table_job_progress(job: TableBackfillJob) -> JobProgress:
    """A table-backfill job's phase, vnodes, versions and rows."""
    from source_backfill.core.table_backfill import Phase

    state = job.state
    if state is None:
        status = "pending"
    else:  # a failed job is the registry's to report: the source drops it from its jobs
        status = "finished" if job.backfill_done else "backfilling"
    rows = dict(job.rows)
    table = None
    if state is not None:
        table = TableProgress(
            strategy=state.strategy.value, phase=state.phase.value,
            vnodes_completed=state.vnodes.count if state.phase is not Phase.CONSUMING_SNAPSHOT
            else state.vnodes.completed(),
            vnodes_total=state.vnodes.count, pinned_version=state.pinned, cursor_version=state.cursor,
            lag_versions=job.lag_versions, rows=rows,
        )
    return JobProgress(
        epoch=_epoch(job),
        status=status,
        rows_history=sum(rows.get(p.value, 0) for p in (Phase.CONSUMING_SNAPSHOT, Phase.CONSUMING_LOG_STORE)),
        rows_live=rows.get(Phase.CONSUME_UPSTREAM.value, 0),
        finish_reported=job.backfill_done,
        last_error=job.last_error,
        table=table,
    )


def _epoch(job: SourceBackfillJob | TableBackfillJob) -> int | None:
    """The job's last epoch: processed (an epoch with nothing to commit counts), else committed."""
    processed = job.processed_epoch
    return processed if processed is not None else job.committed_epoch
