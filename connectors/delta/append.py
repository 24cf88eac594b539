"""The delta-rs append committer: an epoch's rows written as Parquet into its attempt folder, then added.

Spark's executors (or pyarrow, for rows already on the driver) write the rows into
``sb_attempts/<epoch>-<attempt id>/`` of the table (:class:`connectors.delta.staging.EpochStaging`);
files staged ahead of the epoch are moved into the attempt beside them; then one delta-rs commit adds
them all with the epoch's transaction and metadata (protocol steps 3 and 4 of
:meth:`connectors.delta.sink.DeltaEpochSink.commit_epoch`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from connectors.delta.committer import CommitResult, EpochWrite, is_commit_conflict
from connectors.delta.log import KEY_ATTEMPT
from connectors.delta.maintenance import MARKER, STAGING
from source_backfill.errors import one_line

if TYPE_CHECKING:
    import pyarrow as pa
    from deltalake import DeltaTable
    from pyspark.sql import DataFrame

    from connectors.delta.staging import EpochStaging
    from connectors.delta.table import SinkTable

logger = logging.getLogger(__name__)

#: How often an epoch's log append is retried after conflicting with another writer's commit.
COMMIT_RETRIES = 5


class DeltaRsAppend:
    """Write the epoch's rows (and take the files staged ahead), then append them with delta-rs."""

    writes_before_commit = True

    def __init__(self, target: SinkTable, staging: EpochStaging,
                 on_conflict: Callable[[], None] | None = None) -> None:
        self.target = target
        self.staging = staging
        #: Called once per commit retried after a conflict with another writer (a metric's hook).
        self.on_conflict = on_conflict

    def takes(self, df: DataFrame | pa.Table | None, *, new_keys_only: bool) -> bool:
        """Any rows: the sink's last committer."""
        return True

    def commit(self, snapshot: DeltaTable, write: EpochWrite) -> CommitResult:
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

    def _append(self, table: DeltaTable, epoch: int, adds: list[Any], meta: dict[str, str]) -> int:
        """Append ``adds`` with the epoch's transaction; a conflict with another writer is retried.

        Another writer's commit (a property or metadata change, a compaction) can make ours conflict.
        The files are written already, so only the log append is retried, on a refreshed snapshot, up to
        :data:`COMMIT_RETRIES` times, and only while the epoch is still uncommitted and the table is
        still this job's with its columns: a commit of the same epoch by another instance of the job
        ends the loop (the caller's exactly-once check then finds it), and is never doubled.
        """
        from deltalake.transaction import CommitProperties, Transaction

        job_id = self.target.job_id
        before = int(table.version())
        for attempt in range(COMMIT_RETRIES + 1):
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
                if not is_commit_conflict(exc) or attempt == COMMIT_RETRIES:
                    raise
                time.sleep(0.05 * 2**attempt)
                table.update_incremental()
                done = table.transaction_version(job_id)
                if done is not None and done >= epoch:
                    raise  # committed by another instance of this job: the caller sorts it out
                self.target.check(table)  # still ours, with our columns: else a DeltaSinkError
                if self.on_conflict is not None:
                    self.on_conflict()
                logger.warning('commit conflicted with another writer, retrying job="%s" epoch=%d '
                               'attempt=%d error="%s"', job_id, epoch, attempt + 1, one_line(exc))
        table.update_incremental()
        return self.target.own_version(table, meta.get(KEY_ATTEMPT), before)
