"""Exactly-once Delta sink: one atomic commit per job per epoch, the job's state inside the commit.

Spark executors write Parquet files into an attempt folder *inside* the table
(``sb_attempts/<epoch>-<attempt id>/``); the driver then commits them with delta-rs in one transaction
that also carries ``Transaction(job_id, epoch)`` and the job's new state in the commit metadata. Output
and state cannot fall out of step: there is no second table.

:class:`DeltaEpochSink` runs the commit protocol (:meth:`DeltaEpochSink.commit_epoch`) and recovery, and
hands the rest to collaborators that are each handed the table (:class:`connectors.delta.table.SinkTable`):
an epoch committer per writer (:mod:`connectors.delta.committer`: delta-rs append, delta-rs merge,
delta-spark), chosen once when the sink is built; the staging of the Parquet files a commit adds
(:class:`connectors.delta.staging.EpochStaging`); and the table's maintenance (log checkpoints, the
orphan sweep of attempt folders, compaction, vacuum: :class:`connectors.delta.maintenance.TableMaintenance`).
The metadata keys the commits carry in the log are in :mod:`connectors.delta.log`.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from connectors.delta.append import DeltaRsAppend
from connectors.delta.committer import CommitResult, EpochCommitter, EpochWrite, is_commit_conflict
from connectors.delta.log import KEY_ATTEMPT, KEY_EPOCH, KEY_JOB, KEY_PLAN, KEY_STATE
from connectors.delta.maintenance import MARKER, TableMaintenance, remove_attempt
from connectors.delta.merge import CHANGE_TYPE, DeltaRsMerge
from connectors.delta.spark_writer import DeltaSparkAppend
from connectors.delta.staging import EpochStaging, StagedFiles
from connectors.delta.table import LOG_RETENTION_HOURS, SinkTable
from source_backfill.errors import ConcurrentCommitError, DeltaSinkError, StateFormatError

if TYPE_CHECKING:
    import pyarrow as pa
    from deltalake import DeltaTable
    from pyspark.sql import DataFrame

logger = logging.getLogger(__name__)

Writer = Literal["delta-rs", "delta-spark"]
Mode = Literal["append", "merge"]


@dataclass(frozen=True)
class Recovered:
    """A job's latest committed epoch, state and plan, read back from its table's log.

    ``state`` is that commit's own (a job writing deltas rebuilds its full state from the commits it
    names, :meth:`DeltaEpochSink.read_commit`); ``timestamp_ms``: when it was committed.
    """

    epoch: int
    state: dict[str, Any]
    plan: dict[str, Any] | None
    version: int
    timestamp_ms: int | None = None


def choose_committers(
    target: SinkTable,
    staging: EpochStaging,
    *,
    mode: Mode,
    writer: Writer,
    key_columns: tuple[str, ...] = (),
    on_conflict: Callable[[], None] | None = None,
) -> tuple[EpochCommitter, ...]:
    """The committers of a sink of ``mode`` and ``writer``, in the order they are offered an epoch.

    The first is the one chosen for the sink (merge mode: the delta-rs merge; else delta-spark's write
    with ``writer="delta-spark"``); the last is always the delta-rs append, which takes what the others
    do not (new keys only in merge mode, rows already on the driver or none with delta-spark).
    """
    chain: list[EpochCommitter] = []
    if mode == "merge":
        chain.append(DeltaRsMerge(target, key_columns))
    if writer == "delta-spark":
        chain.append(DeltaSparkAppend(target))
    chain.append(DeltaRsAppend(target, staging, on_conflict))
    return tuple(chain)


class DeltaEpochSink:
    """Commit each epoch of one job to the Delta table at ``path`` exactly once.

    One job owns a table (its id is the Delta transaction app id). The sink assumes one live writer per
    job: creating a sink sweeps the attempt folders of epochs not committed yet, so a second, concurrent
    writer of the same job loses its in-flight attempt (its commit then fails cleanly: see ``MARKER``);
    two writers racing on the same epoch still commit it exactly once.
    """

    def __init__(
        self,
        path: str,
        job_id: str,
        schema: Any,
        *,
        mode: Mode = "append",
        key_columns: Sequence[str] = (),
        partition_by: Sequence[str] = (),
        writer: Writer = "delta-rs",
        checkpoint_interval: int = 100,
        log_retention_hours: float = LOG_RETENTION_HOURS,
        on_conflict: Callable[[], None] | None = None,
        extra_properties: Mapping[str, str] | None = None,
    ) -> None:
        if mode == "merge" and not key_columns:
            msg = "merge mode needs key_columns"
            raise DeltaSinkError(msg)
        if checkpoint_interval < 0:
            msg = f"checkpoint_interval must be >= 0 (0: never), got {checkpoint_interval}"
            raise DeltaSinkError(msg)
        self.mode = mode
        self.key_columns = tuple(key_columns)
        self.writer = writer
        #: The table the collaborators below are handed (``delta.logRetentionDuration`` of a table this
        #: sink creates: ``log_retention_hours``; an existing table keeps its own).
        self.target = SinkTable(
            path, job_id, schema,
            drop_columns=(CHANGE_TYPE,) if mode == "merge" else (),
            partition_by=tuple(partition_by),
            checkpoint_interval=checkpoint_interval,
            log_retention_hours=log_retention_hours,
            extra_properties=extra_properties,
        )
        missing = [c for c in (*self.key_columns, *self.partition_by) if c not in self.arrow_schema.names]
        if missing:
            msg = f"Delta sink {self.path}: key/partition columns {missing} are not in the schema"
            raise DeltaSinkError(msg)
        self.staging = EpochStaging(self.target, accepts_staged=mode == "append")
        self.maintenance = TableMaintenance(self.target)
        self.committers = choose_committers(self.target, self.staging, mode=mode, writer=writer,
                                            key_columns=self.key_columns, on_conflict=on_conflict)
        self.remove_orphans()

    # -- the table -------------------------------------------------------------------------------------
    @property
    def path(self) -> str:
        """The table's absolute path."""
        return self.target.path

    @property
    def job_id(self) -> str:
        """The job that owns the table (its Delta transaction app id)."""
        return self.target.job_id

    @property
    def arrow_schema(self) -> pa.Schema:
        """The table's columns (merge mode: without the changelog's change type)."""
        return self.target.arrow_schema

    @property
    def partition_by(self) -> tuple[str, ...]:
        """The table's partition columns."""
        return self.target.partition_by

    @property
    def checkpoint_interval(self) -> int:
        """A log checkpoint every this many versions (0: never)."""
        return self.target.checkpoint_interval

    @property
    def log_retention_hours(self) -> float:
        """``delta.logRetentionDuration`` of a table this sink creates (an existing table keeps its own)."""
        return self.target.log_retention_hours

    @property
    def committer(self) -> EpochCommitter:
        """The committer chosen for the sink's writer and mode (:func:`choose_committers`)."""
        return self.committers[0]

    def table(self) -> DeltaTable | None:
        """A fresh snapshot of the table, or None before its first commit."""
        return self.target.open()

    def table_properties(self) -> dict[str, str]:
        """The properties a new table gets (:meth:`connectors.delta.table.SinkTable.properties`)."""
        return self.target.properties()

    def properties_now(self) -> dict[str, str]:
        """The table's properties as they are in its log now (empty before its first commit)."""
        table = self.table()
        return {} if table is None else dict(table.metadata().configuration)

    def grow(self, schema: Any, properties: Mapping[str, str]) -> list[str]:
        """Grow the table's columns to ``schema``'s and set ``properties`` with the next commit.

        Append mode, delta-rs writer only (:meth:`connectors.delta.table.SinkTable.grow`); the names added.
        """
        if self.mode != "append" or self.writer != "delta-rs":
            msg = f"Delta sink {self.path}: only an append sink written by delta-rs grows its columns"
            raise DeltaSinkError(msg)
        return self.target.grow(schema, properties)

    def log_retention_s(self) -> float:
        """How long the table's log keeps a commit (``delta.logRetentionDuration``, Delta's default 30 d)."""
        return self.target.log_retention_s()

    # -- reading the log -------------------------------------------------------------------------------
    def committed_epoch(self) -> int | None:
        """The last epoch this job committed (the table's ``transaction_version(job_id)``)."""
        table = self.table()
        return None if table is None else table.transaction_version(self.job_id)

    def recover(self) -> Recovered | None:
        """The job's latest committed epoch, state and plan; None for a new table.

        A table written by another job (its log carries another ``source_backfill.job``) is refused with
        :class:`ForeignTableError`; unreadable or inconsistent state metadata with
        :class:`StateFormatError`.
        """
        table = self.table()
        if table is None:
            return None
        epoch = table.transaction_version(self.job_id)
        commit = self.target.last_job_commit(table)
        if commit is None:
            if epoch is not None:
                msg = (f'Delta table {self.path}: job "{self.job_id}" committed epoch {epoch} but no '
                       f"{KEY_STATE} is in the log")
                raise StateFormatError(msg)
            return None
        if epoch is None:
            msg = (f'Delta table {self.path}: the log carries state of job "{self.job_id}" but no '
                   "transaction of it")
            raise StateFormatError(msg)
        logged = commit.get(KEY_EPOCH)
        if logged is not None and str(logged) != str(epoch):
            msg = (f'Delta table {self.path}: job "{self.job_id}" transaction is at epoch {epoch} but its '
                   f"last state says epoch {logged}")
            raise StateFormatError(msg)
        plan = commit.get(KEY_PLAN)
        return Recovered(
            epoch=int(epoch),
            state=_json(commit.get(KEY_STATE), self.path, KEY_STATE),
            plan=None if plan is None else _json(plan, self.path, KEY_PLAN),
            version=int(commit.get("version", table.version())),
            timestamp_ms=_int_or_none(commit.get("timestamp")),
        )

    def read_commit(self, version: int) -> dict[str, Any] | None:
        """The ``commitInfo`` of log version ``version`` (:func:`connectors.delta.log.read_commit`)."""
        return self.target.read_commit(version)

    # -- committing ------------------------------------------------------------------------------------
    def writes_before_commit(self) -> bool:
        """True when ``commit_epoch`` writes the rows, then commits (the delta-rs append path).

        Only then can a deferred ``state`` depend on what the write observed.
        """
        return self.committer.writes_before_commit

    def committer_for(
        self, df: DataFrame | pa.Table | None, *, new_keys_only: bool = False
    ) -> EpochCommitter:
        """The first of the sink's committers that takes these rows (the last, delta-rs append, takes all)."""
        return next(c for c in self.committers if c.takes(df, new_keys_only=new_keys_only))

    def commit_epoch(
        self,
        epoch: int,
        df: DataFrame | pa.Table | None,
        state: Mapping[str, Any] | Callable[[], Mapping[str, Any]],
        plan: Mapping[str, Any] | None = None,
        *,
        staged: Sequence[StagedFiles] = (),
        new_keys_only: bool = False,
    ) -> CommitResult:
        """Commit epoch ``epoch``'s rows and the job's new ``state`` (+ ``plan``) atomically, exactly once.

        ``df``: a Spark DataFrame, or an Arrow table of rows already on the driver (written by pyarrow;
        the table-backfill modules), or None for a state-only commit.

        ``state`` may be a callable, called once after the rows are written and before the commit (for a
        state that depends on what the write observed); only where :meth:`writes_before_commit` is true.
        ``new_keys_only`` (merge mode): every row is an insert of a key the table does not hold (a
        table-backfill chunk), so the rows are appended instead of merged — the same result, without
        the merge's join. ``staged``: files written ahead by :meth:`stage_files`, committed with the
        epoch's rows (same path only). A staged folder is moved into this attempt (``<attempt>.s<i>``)
        before the commit: if the epoch does not commit, it goes with the attempt; if it is skipped (a
        replay) it stays where it was.

        1. Create the table on first use (change data feed on) from the sink's schema; on an existing
           table check once that it belongs to this job and has the sink's columns.
        2. Take the current snapshot; if its ``transaction_version(job_id) >= epoch`` the epoch is in
           already: skip it (a replay), ``committed=False``. (An append whose table nothing else wrote
           to since this sink last saw its log reads the epoch from that head instead, two ``stat``
           calls: :meth:`SinkTable.direct_head`.)
        3. Spark executors write the rows as Parquet into ``sb_attempts/<epoch>-<attempt>/`` of the table
           (a fresh folder per attempt, holding a ``_ATTEMPT`` marker); the driver reads each file's
           size, row count and partition values from the folder and the Parquet footers.
        4. One delta-rs commit against the snapshot of step 2: the add actions +
           ``Transaction(job_id, epoch)`` + job, epoch, attempt, state and plan in the commit metadata.
           No rows: an empty commit that still carries txn and state. (After a head read in step 2 the
           same commit is written straight into the log, its file created only if its version is free:
           :mod:`connectors.delta.log_append`; if it is not, the table is reloaded, the epoch checked
           again and delta-rs commits.) (Merge mode: one delta-rs
           ``merge`` carrying the same txn and metadata; delta-spark writer: its ``txnAppId`` /
           ``txnVersion`` / ``userMetadata`` options.)
        5. If the commit raises, the log decides: this attempt's commit is in (a post-commit step failed)
           -> keep its files, ``committed=True``; another attempt committed the epoch (a racing
           duplicate: ``CommitFailedError``) -> remove this attempt's files, ``committed=False``;
           nothing committed -> remove this attempt's files and raise. Files are removed only once the
           log shows they are not referenced; if the log cannot be read they stay for the orphan sweep.
        6. Every ``checkpoint_interval`` versions a log checkpoint is written.
        """
        with self.target.lock:
            committer = self.committer_for(df, new_keys_only=new_keys_only)
            # steps 1 and 2: the log's head when nothing was written since this sink last saw it (two
            # stat calls; its appends are then written straight into the log), else the table reloaded
            head = self.target.direct_head() if committer.direct else None
            snapshot = None
            if head is not None:
                done = head.epoch
            else:
                snapshot = self.target.snapshot()
                done = snapshot.transaction_version(self.job_id)
            if done is not None and done >= epoch:
                logger.info('epoch already committed, skipped job="%s" epoch=%d committed=%d',
                            self.job_id, epoch, done)
                return CommitResult(epoch, False, None, 0, 0)
            attempt = f"{epoch}-{uuid.uuid4().hex[:16]}"
            meta = {
                KEY_JOB: self.job_id,
                KEY_EPOCH: str(epoch),
                KEY_ATTEMPT: attempt,
            }
            if (callable(state) or staged) and not self.writes_before_commit():
                msg = ("a deferred state or staged files need the delta-rs append path (files written, "
                       "then committed)")
                raise DeltaSinkError(msg)
            if not callable(state):
                meta[KEY_STATE] = json.dumps(dict(state), sort_keys=True)
            if plan is not None:
                meta[KEY_PLAN] = json.dumps(dict(plan), sort_keys=True)
            # steps 3 and 4: the committer that takes these rows writes and commits them; step 5: the guard
            write = EpochWrite(epoch, attempt, df, meta, deferred_state=state if callable(state) else None,
                               staged=staged)
            result = self._guarded(write, lambda: committer.commit(snapshot, write))
            if result.committed and result.version is not None:
                self.maintenance.maintain(result.version)  # step 6
            logger.debug('epoch committed job="%s" epoch=%d version=%s files=%d rows=%d committed=%s',
                         self.job_id, epoch, result.version, result.files, result.rows, result.committed)
            return result

    def _guarded(self, write: EpochWrite, step: Callable[[], CommitResult]) -> CommitResult:
        """Run write+commit ``step``; on failure let the log decide (protocol step 5).

        ``write.folders``: the attempt's folders (``step`` may add to them), kept or removed with the
        attempt.
        """
        epoch, attempt, folders = write.epoch, write.attempt, write.folders
        try:
            return step()
        except Exception as exc:
            self.target.forget_snapshot()  # the cached snapshot may be stale or broken: reload next time
            try:
                table = self.table()
                done = None if table is None else table.transaction_version(self.job_id)
                winner = None
                if table is not None and done is not None and done >= epoch:
                    winner = self.target.find_epoch_commit(table, epoch)
            except Exception:
                logger.exception('commit in doubt, attempt files kept for the orphan sweep job="%s" '
                                 'epoch=%d attempt="%s"', self.job_id, epoch, attempt)
                raise exc from None
            if table is not None and winner is not None and winner.get(KEY_ATTEMPT) == attempt:
                for folder in folders:
                    (folder / MARKER).unlink(missing_ok=True)
                logger.warning('epoch committed, a post-commit step failed job="%s" epoch=%d error="%s"',
                               self.job_id, epoch, exc)
                return CommitResult(epoch, True, int(winner.get("version", table.version())), -1, -1)
            for folder in folders:
                remove_attempt(folder)
            if done is not None and done >= epoch:
                logger.warning('duplicate commit lost the race, own files removed job="%s" epoch=%d',
                               self.job_id, epoch)
                return CommitResult(epoch, False, None, 0, 0)
            if is_commit_conflict(exc):
                msg = (f'Delta table {self.path}: commit of job "{self.job_id}" epoch {epoch} '
                       f"conflicted: {exc}")
                raise ConcurrentCommitError(msg) from exc
            raise

    # -- staging (:class:`connectors.delta.staging.EpochStaging`) -----------------------------------------
    def stage_files(self, write: Callable[[Path], Any], after_epoch: int,
                    on_folder: Callable[[Path], None] | None = None) -> StagedFiles:
        """Have ``write(folder)`` stage Parquet files now, for a later epoch to commit (``staged=...``).

        :meth:`connectors.delta.staging.EpochStaging.stage_files`.
        """
        return self.staging.stage_files(write, after_epoch, on_folder)

    def stage_dataframe(self, df: DataFrame, after_epoch: int,
                        on_folder: Callable[[Path], None] | None = None) -> StagedFiles:
        """:meth:`stage_files` with Spark writing ``df`` (:meth:`EpochStaging.stage_dataframe`).

        Through this sink's :meth:`stage_files`, as every staged write.
        """
        return self.stage_files(self.staging.dataframe_write(df), after_epoch, on_folder)

    @staticmethod
    def discard(staged: StagedFiles) -> None:
        """Remove staged files no commit took (a no-op once a commit moved them into its attempt)."""
        EpochStaging.discard(staged)

    # -- maintenance (:class:`connectors.delta.maintenance.TableMaintenance`) ------------------------------
    def remove_orphans(self) -> int:
        """Remove attempt folders the log does not reference and never will; returns how many."""
        return self.maintenance.remove_orphans()

    def checkpoint(self) -> None:
        """Write a log checkpoint now (readers then start from it instead of replaying every commit)."""
        self.maintenance.checkpoint()

    def compact(self, target_size: int | None = None) -> dict[str, Any]:
        """Rewrite small files into larger ones; returns delta-rs' metrics."""
        return self.maintenance.compact(target_size)

    def vacuum(self, retention_hours: int = 168, *, full: bool = True) -> list[str]:
        """Delete files no version within ``retention_hours`` references; returns them."""
        return self.maintenance.vacuum(retention_hours, full=full)


def _json(text: Any, path: str, key: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except (TypeError, ValueError) as exc:
        msg = f"Delta table {path}: commit metadata {key} is not valid JSON: {exc}"
        raise StateFormatError(msg) from exc
    if not isinstance(value, dict):
        msg = f"Delta table {path}: commit metadata {key} is not a JSON object"
        raise StateFormatError(msg)
    return value


def _int_or_none(value: Any) -> int | None:
    try:
        return None if value is None else int(value)
    except (TypeError, ValueError):
        return None
