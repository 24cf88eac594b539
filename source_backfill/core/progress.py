"""Job progress derived from split states (pure): what the API, CLI and metrics show."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from source_backfill.core.splits import SplitId, SplitState, Stage


@dataclass(frozen=True, slots=True)
class JobProgressSummary:
    """Splits finished/total, rows backfilled, offsets still to read, and an ETA at the measured rate."""

    splits_total: int
    splits_finished: int
    rows_backfilled: int
    remaining_offsets: int
    eta_seconds: float | None


def split_lag(state: SplitState) -> int | None:
    """Offsets still to backfill (target - backfilled offset); 0 once past Backfilling; None if unknown."""
    if state.stage is not Stage.BACKFILLING:
        return 0
    if state.target_offset is None:
        return None
    done = -1 if state.offset is None else state.offset
    return max(0, state.target_offset - done)


def job_progress(
    states: Mapping[SplitId, SplitState], history_rows_per_s: float | None = None
) -> JobProgressSummary:
    """Summarise ``states``; the ETA is remaining offsets over the measured history rate."""
    remaining = sum(split_lag(s) or 0 for s in states.values())
    finished = sum(1 for s in states.values() if s.stage is Stage.FINISHED)
    eta: float | None
    if remaining == 0:
        eta = 0.0
    elif history_rows_per_s:
        eta = remaining / history_rows_per_s
    else:
        eta = None
    return JobProgressSummary(
        splits_total=len(states),
        splits_finished=finished,
        rows_backfilled=sum(s.num_consumed_rows for s in states.values()),
        remaining_offsets=remaining,
        eta_seconds=eta,
    )
