"""Job progress derived from split states (pure): what the API, CLI and metrics show."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from source_backfill.core.columnar import SplitTable
from source_backfill.core.splits import SplitId, SplitState, Stage


@dataclass(frozen=True, slots=True)
class JobProgressSummary:
    """Splits finished/total, rows backfilled, offsets still to read, and an ETA at the measured rate."""

    splits_total: int
    splits_finished: int
    rows_backfilled: int
    remaining_offsets: int
    eta_seconds: float | None


def split_lag(state: SplitState, read_ahead_to: int | None = None) -> int | None:
    """Offsets still to backfill (target - backfilled offset); 0 once past Backfilling; None if unknown.

    ``read_ahead_to``: the last offset a read ahead has copied for the split, not committed yet (it
    counts as read: the copy is done, only its commit waits for an epoch).
    """
    if state.stage is not Stage.BACKFILLING:
        return 0
    if state.target_offset is None:
        return None
    done = -1 if state.offset is None else state.offset
    if read_ahead_to is not None:
        done = max(done, read_ahead_to)
    return max(0, state.target_offset - done)


def job_progress(
    states: Mapping[SplitId, SplitState], history_rows_per_s: float | None = None,
    read_ahead_to: Mapping[SplitId, int] | None = None,
) -> JobProgressSummary:
    """Summarise ``states``; the ETA is remaining offsets over the measured history rate.

    ``read_ahead_to``: per split, the last offset read ahead and not committed yet (see
    :func:`split_lag`); the remaining offsets and the ETA count it as read.
    """
    table = SplitTable.from_states(states)
    remaining = int(table.lags(read_ahead_to).sum())
    finished = table.count(Stage.FINISHED)
    eta: float | None
    if remaining == 0:
        eta = 0.0
    elif history_rows_per_s:
        eta = remaining / history_rows_per_s
    else:
        eta = None
    return JobProgressSummary(
        splits_total=len(table),
        splits_finished=finished,
        rows_backfilled=int(table.rows.sum()),
        remaining_offsets=remaining,
        eta_seconds=eta,
    )
