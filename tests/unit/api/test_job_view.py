"""A job's status as the API shows it (``JobView.of``): its progress, its lag, its failure."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from source_backfill.api.models import JobView
from source_backfill.config import JobSpec
from source_backfill.runtime.job_record import JobRecord
from source_backfill.runtime.progress import JobProgress


def _view(status: str, lag_s: float, error: str | None = None) -> str:
    record = JobRecord(spec=JobSpec(name="j", source="s", sink_path="/tmp/j"), paused=False, rate_limit=None,
                       dropped=False, created_at=datetime.now(UTC), error=error)
    progress = JobProgress(epoch=None, status=status, rows_history=0, rows_live=0,  # type: ignore[arg-type]
                           lag_s=lag_s)
    return JobView.of(record, progress).status


@pytest.mark.parametrize("status", ["pending", "backfilling", "finished"])
def test_a_job_behind_its_source_is_lagging_whatever_its_phase(status: str) -> None:
    """A first step slower than the trigger lags too: it was shown "pending" while its lag grew."""
    assert _view(status, 3.0) == "lagging"
    assert _view(status, 0.0) == status


def test_a_failed_job_is_failed_even_while_its_lag_shows() -> None:
    assert _view("backfilling", 3.0, error="boom") == "failed"
