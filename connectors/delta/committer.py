"""The epoch committer: what writes one epoch's rows into the sink's table in one commit.

:meth:`connectors.delta.sink.DeltaEpochSink.commit_epoch` runs the commit protocol (the replay check,
the epoch's metadata, the log deciding a failed commit) and hands the write itself to a committer, one
per writer:

* :class:`connectors.delta.append.DeltaRsAppend`: the rows written as Parquet into the epoch's attempt
  folder, then one delta-rs commit adding them (the default; the only one that commits files staged
  ahead, or a state taken after the write);
* :class:`connectors.delta.merge.DeltaRsMerge`: a keyed merge of a changelog by delta-rs (merge mode);
* :class:`connectors.delta.spark_writer.DeltaSparkAppend`: delta-spark's own write (``writer="delta-spark"``).

The sink chooses its committers once, when it is built, from its ``writer`` and ``mode``; a committer
that cannot take an epoch's rows (a merge of new keys only, delta-spark given rows already on the
driver) leaves them to the next one, and the delta-rs append takes anything.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from connectors.delta.log import KEY_STATE

if TYPE_CHECKING:
    from pathlib import Path

    import pyarrow as pa
    from deltalake import DeltaTable
    from pyspark.sql import DataFrame

    from connectors.delta.staging import StagedFiles


@dataclass(frozen=True)
class CommitResult:
    """Outcome of :meth:`connectors.delta.sink.DeltaEpochSink.commit_epoch`.

    ``committed`` is False when the epoch was already in the table (a replay, or a racing duplicate that
    won); ``version`` is the table version of this commit (None when skipped); ``files`` and ``rows``
    count what this commit added (merge: ``files`` 0, ``rows`` the changes applied; delta-spark:
    ``files`` 0, ``rows`` -1, not measured).
    """

    epoch: int
    committed: bool
    version: int | None
    files: int
    rows: int


@dataclass
class EpochWrite:
    """One attempt at committing epoch ``epoch``: its rows and the metadata its commit carries.

    ``meta`` holds the job, epoch, attempt, and the state and plan unless the state is deferred
    (``deferred_state``, taken by :meth:`take_deferred_state` once the rows are written). ``folders``
    are the attempt's folders in the table: a committer adds each one it writes or moves there before
    anything is in it, so the protocol keeps or removes them with the attempt when the commit fails.
    """

    epoch: int
    attempt: str
    df: DataFrame | pa.Table | None
    meta: dict[str, str]
    deferred_state: Callable[[], Mapping[str, Any]] | None = None
    staged: Sequence[StagedFiles] = ()
    folders: list[Path] = field(default_factory=list)

    def take_deferred_state(self) -> None:
        """Put the deferred state into ``meta`` (called after the rows are written, before the commit)."""
        if self.deferred_state is not None:
            self.meta[KEY_STATE] = json.dumps(dict(self.deferred_state()), sort_keys=True)


class EpochCommitter(Protocol):
    """Writes an epoch's rows and commits them with its metadata and ``Transaction(job, epoch)``."""

    #: True when the rows are written first, then committed: only then can files staged ahead join the
    #: commit, or a deferred state depend on what the write observed.
    writes_before_commit: bool
    #: True when it commits without a snapshot while the log's head is current
    #: (:meth:`~connectors.delta.table.SinkTable.direct_head`): ``commit`` is then given None.
    direct: bool

    def takes(self, df: DataFrame | pa.Table | None, *, new_keys_only: bool) -> bool:
        """Whether this committer writes these rows (else the sink's next committer does)."""
        ...

    def commit(self, snapshot: DeltaTable | None, write: EpochWrite) -> CommitResult:
        """Write ``write``'s rows and commit them against ``snapshot`` (the table of the replay check).

        Raises when the commit fails; the sink's protocol then asks the log what happened.
        """
        ...


def is_commit_conflict(exc: BaseException) -> bool:
    """True when a delta-rs commit failed on another writer's commit (retried, or a lost race)."""
    from deltalake.exceptions import CommitFailedError

    return isinstance(exc, CommitFailedError) or "Concurrent" in str(exc)
