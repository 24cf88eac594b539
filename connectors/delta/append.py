"""The delta-rs append committer: an epoch's rows written as Parquet into its attempt folder, then added.

Spark's executors (or pyarrow, for rows already on the driver) write the rows into
``sb_attempts/<epoch>-<attempt id>/`` of the table (:class:`connectors.delta.staging.EpochStaging`);
files staged ahead of the epoch are moved into the attempt beside them; then one delta-rs commit adds
them all with the epoch's transaction and metadata (protocol steps 3 and 4 of
:meth:`connectors.delta.sink.DeltaEpochSink.commit_epoch`): written straight into the table's log while
nothing else was written there since the sink last saw it (:mod:`connectors.delta.log_append`), else by
delta-rs on a reloaded snapshot.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from connectors.delta.committer import CommitResult, EpochWrite, is_commit_conflict
from connectors.delta.log import KEY_ATTEMPT
from connectors.delta.log_append import LogVersionTaken
from connectors.delta.maintenance import MARKER, STAGING
from source_backfill.errors import DeltaSinkError, one_line

if TYPE_CHECKING:
    import pyarrow as pa
    from deltalake import DeltaTable
    from pyspark.sql import DataFrame

    from connectors.delta.staging import EpochStaging
    from connectors.delta.table import SinkTable

logger = logging.getLogger(__name__)

#: How often an epoch's log append is retried after conflicting with another writer's commit (a version
#: taken before an append written straight into the log could be counts as one).
COMMIT_RETRIES = 5


class DeltaRsAppend:
    """Write the epoch's rows (and take the files staged ahead), then append them with delta-rs."""

    writes_before_commit = True
    #: Commits without a snapshot when the log's head is current (:meth:`SinkTable.direct_head`).
    direct = True

    def __init__(self, target: SinkTable, staging: EpochStaging,
                 on_conflict: Callable[[], None] | None = None) -> None:
        self.target = target
        self.staging = staging
        #: Called once per commit retried after a conflict with another writer (a metric's hook).
        self.on_conflict = on_conflict

    def takes(self, df: DataFrame | pa.Table | None, *, new_keys_only: bool) -> bool:
        """Any rows: the sink's last committer."""
        return True

    def commit(self, snapshot: DeltaTable | None, write: EpochWrite) -> CommitResult:
        """Write the rows into the attempt folder, move the staged folders into it, commit them all.

        A staged folder is moved into this attempt (``<attempt>.s<i>``): from then on it is the
        attempt's, committed or removed with it. Once committed, the folders lose their ``_ATTEMPT``
        marker (sealed: the log references them now).
        """
        folder = Path(self.target.path) / STAGING / write.attempt
        write.folders.append(folder)
        adds, rows = self.staging.write_files(write.df, folder)
        for i, ahead in enumerate(write.staged):
            moved = folder.parent / f"{write.attempt}.s{i}"
            ahead.folder.rename(moved)  # from now on the attempt's: committed or removed with it
            write.folders.append(moved)
            more, n = self.staging.collect_adds(moved)
            adds.extend(more)
            rows += n
        write.take_deferred_state()
        version = self._append(snapshot, write.epoch, adds, write.meta)
        for f in write.folders:
            (f / MARKER).unlink(missing_ok=True)  # sealed: the log references it now
        return CommitResult(write.epoch, True, version, len(adds), rows)

    def _append(self, table: DeltaTable | None, epoch: int, adds: list[Any], meta: dict[str, str]) -> int:
        """Append ``adds`` with the epoch's transaction; a conflict with another writer is retried.

        First straight into the log (:meth:`SinkTable.append_direct`), while its head is the one the
        sink last saw; ``table`` is then None when the replay check read that head. Otherwise, or when
        another writer took the version first, delta-rs commits on the table reloaded, the epoch checked
        again (another instance of the job may have committed it meanwhile).

        Another writer's commit (a property or metadata change, a compaction) can make ours conflict.
        The files are written already, so only the log append is retried, on a refreshed snapshot, up to
        :data:`COMMIT_RETRIES` times, and only while the epoch is still uncommitted and the table is
        still this job's with its columns: a commit of the same epoch by another instance of the job
        ends the loop (the caller's exactly-once check then finds it), and is never doubled.
        """
        if self.target.pending is not None:
            return self._append_grown(epoch, adds, meta)
        retries = COMMIT_RETRIES
        try:
            version = self.target.append_direct(adds, epoch, meta)
        except LogVersionTaken as exc:
            version, table, retries = None, None, retries - 1
            self._conflicted(epoch, 1, exc)
        if version is not None:
            return version
        if table is None:
            table = self.target.snapshot()
            self._still_to_commit(table, epoch)
        return self._append_delta_rs(table, epoch, adds, meta, retries)

    def _append_grown(self, epoch: int, adds: list[Any], meta: dict[str, str]) -> int:
        """The append of a commit that grows the table's columns: always into the log here, on a reload.

        delta-rs' append would keep the table's columns as they are (the added columns' values unread),
        so the commit is written here with the table's new ``metaData`` (:meth:`SinkTable.append_grown`),
        retried on a reloaded table when another writer took its version.
        """
        for attempt in range(COMMIT_RETRIES + 1):
            table = self.target.snapshot()
            self._still_to_commit(table, epoch)
            try:
                return self.target.append_grown(adds, epoch, meta, table)
            except LogVersionTaken as exc:
                if attempt == COMMIT_RETRIES:
                    raise DeltaSinkError(str(exc)) from exc
                self._conflicted(epoch, attempt + 1, exc)
                time.sleep(0.05 * 2**attempt)
        raise AssertionError  # pragma: no cover - the loop returns or raises

    def _append_delta_rs(self, table: DeltaTable, epoch: int, adds: list[Any], meta: dict[str, str],
                         retries: int) -> int:
        from deltalake.transaction import CommitProperties, Transaction

        job_id = self.target.job_id
        before = int(table.version())
        for attempt in range(retries + 1):
            try:
                table.create_write_transaction(
                    adds,
                    mode="append",
                    schema=self.target.arrow_schema,
                    partition_by=list(self.target.partition_by) or None,
                    commit_properties=CommitProperties(
                        custom_metadata=meta, app_transactions=[Transaction(job_id, epoch)]
                    ),
                )
                break
            except Exception as exc:
                if not is_commit_conflict(exc) or attempt == retries:
                    raise
                time.sleep(0.05 * 2**attempt)
                table.update_incremental()
                self._still_to_commit(table, epoch, exc)
                self._conflicted(epoch, COMMIT_RETRIES - retries + attempt + 1, exc)  # the retry's number
        table.update_incremental()
        return self.target.own_version(table, meta.get(KEY_ATTEMPT), before)

    def _still_to_commit(self, table: DeltaTable, epoch: int, exc: Exception | None = None) -> None:
        """The epoch is not in ``table`` and the table is still ours with our columns; else raise.

        A commit of the epoch by another instance of this job raises (``exc``, the conflict, when there
        was one): the caller's exactly-once check then finds that commit and drops this attempt.
        """
        done = table.transaction_version(self.target.job_id)
        if done is not None and done >= epoch:
            if exc is not None:
                raise exc
            msg = (f'Delta sink {self.target.path}: epoch {epoch} of job "{self.target.job_id}" was '
                   "committed by another writer meanwhile")
            raise DeltaSinkError(msg)
        self.target.check(table)  # still ours, with our columns: else a DeltaSinkError

    def _conflicted(self, epoch: int, retry: int, exc: Exception) -> None:
        if self.on_conflict is not None:
            self.on_conflict()
        logger.warning('commit conflicted with another writer, retrying job="%s" epoch=%d attempt=%d '
                       'error="%s"', self.target.job_id, epoch, retry, one_line(exc))
