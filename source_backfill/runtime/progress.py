"""Turn a running job into the progress record the registry serves (API, CLI, metrics)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from source_backfill.core import split_lag

if TYPE_CHECKING:
    from source_backfill.executors.source_backfill import SourceBackfillJob
    from source_backfill.executors.table_backfill import TableBackfillJob
    from source_backfill.runtime.registry import JobProgress


def to_job_progress(job: SourceBackfillJob) -> JobProgress:
    """A snapshot of ``job``'s split states, rows, rate and ETA."""
    from source_backfill.runtime.registry import JobProgress, SplitProgress

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
        epoch=job.committed_epoch,
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
    from source_backfill.runtime.registry import JobProgress, TableProgress

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
        epoch=job.committed_epoch,
        status=status,
        rows_history=sum(rows.get(p.value, 0) for p in (Phase.CONSUMING_SNAPSHOT, Phase.CONSUMING_LOG_STORE)),
        rows_live=rows.get(Phase.CONSUME_UPSTREAM.value, 0),
        finish_reported=job.backfill_done,
        last_error=job.last_error,
        table=table,
    )
