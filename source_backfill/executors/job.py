"""What a source needs of a job, whatever it reads: the :class:`Job` protocol.

A source (:class:`source_backfill.runtime.jobs.JobHost`) builds its jobs, applies control to them at an
epoch boundary (pause, resume, throttle), runs their epochs, closes them when they are dropped, failed or
rebuilt, and publishes their progress. That is all it asks of a job; how an epoch runs is the job's own
(:class:`~source_backfill.executors.source_backfill.SourceBackfillJob` on a Kafka source,
:class:`~source_backfill.executors.table_backfill.TableBackfillJob` on a delta source), and the source
that made it calls it with its own type.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from source_backfill.config import JobSpec


class ByteQuota(Protocol):
    """A namespace's table bytes of the day (``runtime/quotas.py``): what a job asks and tells it."""

    def held(self, namespace: str) -> str | None:
        """Why ``namespace``'s history copies are held now (its bytes of the day written); None: not."""

    def count(self, job: str, namespace: str, table: str, version: int | None) -> None:
        """``job`` committed ``version`` of its table at ``table``: the versions since its last count."""


class Job(Protocol):
    """One job as its source keeps it: its name, its control flags, its epochs, its end."""

    #: Whether the job's history (or snapshot copy) waits: set by the source at a ``pause``/``resume``.
    paused: bool
    #: History rows per second the job may copy (None: no limit): set by the source at a ``throttle``.
    rate_limit: float | None
    #: Set by the source for an epoch the job runs alone, after the others (it had Spark work in flight at
    #: the JVM's last deaths): it then starts no work beside that epoch.
    alone: bool
    #: The namespace's table bytes of the day, set by the source when its namespace bounds them.
    quota: ByteQuota | None

    @property
    def name(self) -> str:
        """The job's name (unique in the daemon)."""

    @property
    def committed_epoch(self) -> int | None:
        """The last epoch the job committed (None: none yet)."""

    @property
    def processed_epoch(self) -> int | None:
        """The last epoch the job processed: committed, or with nothing to commit (None: none yet)."""

    def close(self) -> None:
        """Stop whatever the job runs beside its epochs: it is dropped, failed or rebuilt."""

    def stop_lane(self, why: str, timeout_s: float = 30.0) -> bool:
        """Nothing of the job commits from now on; its work in flight is cancelled (``commit_gate.py``).

        False if a commit in flight took more than ``timeout_s`` to end (it may still land).
        """


class HeldByQuota:
    """What both kinds of job say of their history's hold: paused, or held by the namespace's quota."""

    paused: bool
    quota: ByteQuota | None
    spec: JobSpec

    @property
    def history_held(self) -> str | None:
        """Why the job's namespace holds its history now (its table bytes of the day written); None: not."""
        return None if self.quota is None else self.quota.held(self.spec.namespace)

    @property
    def history_waits(self) -> bool:
        """The job reads no history now (the copy, the replay): paused, or held by its namespace's quota."""
        return self.paused or self.history_held is not None
