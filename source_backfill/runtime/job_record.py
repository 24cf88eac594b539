"""A registered job and its accepted control state: what the registry's table holds and the API serves."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from source_backfill.config import JobSpec


@dataclass(frozen=True, slots=True)
class JobRecord:
    """A registered job and its accepted control state."""

    spec: JobSpec
    paused: bool
    rate_limit: float | None
    #: True from the accepted drop until the drop is applied (then the record disappears).
    dropped: bool
    created_at: datetime
    #: Why the job failed (set by the epoch loop, persisted), else ``None``; a retry clears it.
    error: str | None = None

    @property
    def name(self) -> str:
        """The job's name."""
        return self.spec.name

    @property
    def source(self) -> str:
        """The name of the source the job reads."""
        return self.spec.source
