"""Exactly-once Delta sink: one atomic commit per job per epoch, the job's state inside the commit.

Spark executors write Parquet files into an attempt folder *inside* the table
(``sb_attempts/<epoch>-<attempt id>/``); the driver then commits them with delta-rs in one transaction
that also carries ``Transaction(job_id, epoch)`` and the job's new state in the commit metadata. Output
and state cannot fall out of step: there is no second table.

The metadata keys the commits carry in the log are in :mod:`connectors.delta.log`. Writing and staging
the Parquet files a commit adds (an epoch's own rows, rows staged ahead of it) is in
:mod:`connectors.delta.staging`, and the table's maintenance (log checkpoints, the orphan sweep of attempt
folders, compaction, vacuum) in :mod:`connectors.delta.maintenance`: both mixins of :class:`DeltaEpochSink`.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from connectors.delta.log import (
    _HISTORY_STEPS,
    KEY_ATTEMPT,
    KEY_EPOCH,
    KEY_JOB,
    KEY_PLAN,
    KEY_STATE,
    _with_user_metadata,
    read_commit,
)
from connectors.delta.maintenance import MARKER, STAGING, TableMaintenance, _remove_attempt
from connectors.delta.staging import EpochStaging, StagedFiles, _is_arrow_table, _pa
from source_backfill.errors import (
    ConcurrentCommitError,
    DeltaSinkError,
    ForeignTableError,
    StateFormatError,
    one_line,
)

if TYPE_CHECKING:
    import pyarrow as pa
    from deltalake import DeltaTable
    from pyspark.sql import DataFrame

logger = logging.getLogger(__name__)

CHANGE_TYPE = "_change_type"
#: The log retention a new table gets (``delta.logRetentionDuration``): a week of versions to time-travel
#: and diagnose; older commit files are removed by delta-rs as it writes checkpoints. Delta's own default
#: (30 days) keeps ~2.6 million commit files of a busy job at a 1 s trigger.
LOG_RETENTION_HOURS = 168.0
#: Delta's default when a table does not set ``delta.logRetentionDuration``.
DEFAULT_LOG_RETENTION_S = 30 * 24 * 3600.0
#: How often an epoch's log append is retried after conflicting with another writer's commit.
COMMIT_RETRIES = 5

Writer = Literal["delta-rs", "delta-spark"]


@dataclass(frozen=True)
class CommitResult:
    """Outcome of :meth:`DeltaEpochSink.commit_epoch`.

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


class DeltaEpochSink(TableMaintenance, EpochStaging):
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
        mode: Literal["append", "merge"] = "append",
        key_columns: Sequence[str] = (),
        partition_by: Sequence[str] = (),
        writer: Writer = "delta-rs",
        checkpoint_interval: int = 100,
        log_retention_hours: float = LOG_RETENTION_HOURS,
        on_conflict: Callable[[], None] | None = None,
    ) -> None:
        if mode == "merge" and not key_columns:
            msg = "merge mode needs key_columns"
            raise DeltaSinkError(msg)
        if checkpoint_interval < 0:
            msg = f"checkpoint_interval must be >= 0 (0: never), got {checkpoint_interval}"
            raise DeltaSinkError(msg)
        self.path = str(Path(path).absolute())
        self.job_id = job_id
        self.mode = mode
        self.key_columns = tuple(key_columns)
        self.partition_by = tuple(partition_by)
        self.checkpoint_interval = checkpoint_interval
        #: ``delta.logRetentionDuration`` of a table this sink creates (an existing table keeps its own).
        self.log_retention_hours = log_retention_hours
        self.writer = writer
        #: Called once per commit retried after a conflict with another writer (a metric's hook).
        self.on_conflict = on_conflict
        self._spark_schema = None if _is_arrow(schema) else schema
        self.arrow_schema = _to_arrow(schema)
        if mode == "merge":
            import pyarrow as pa

            self.arrow_schema = pa.schema([f for f in self.arrow_schema if f.name != CHANGE_TYPE])
        missing = [c for c in (*self.key_columns, *self.partition_by) if c not in self.arrow_schema.names]
        if missing:
            msg = f"Delta sink {self.path}: key/partition columns {missing} are not in the schema"
            raise DeltaSinkError(msg)
        self._lock = threading.RLock()
        self._dt: DeltaTable | None = None
        self._owner_checked = False
        self._delta_spark: bool | None = None
        self.remove_orphans()

    # -- reading the log -------------------------------------------------------------------------------
    def table(self) -> DeltaTable | None:
        """A fresh snapshot of the table, or None before its first commit."""
        from deltalake import DeltaTable

        if not DeltaTable.is_deltatable(self.path):
            return None
        try:
            return DeltaTable(self.path)
        except Exception as exc:  # deltalake's errors name neither the table nor what to do
            msg = (f"Delta table {self.path}: its transaction log cannot be read ({one_line(exc)}); "
                   "restore _delta_log from a backup, or drop the job and re-create it on a new sink path")
            raise StateFormatError(msg) from exc

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
        commit = self._last_job_commit(table)
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

    def _last_job_commit(self, table: DeltaTable) -> dict[str, Any] | None:
        """The newest commit carrying our metadata; another job's id there raises ForeignTableError.

        Read newest first one commit file at a time (no listing of the log, no replay of it), at most
        ``_HISTORY_STEPS[-1]`` versions back and never below the oldest commit file the log keeps: a
        job's commits are its epochs that changed something plus a fresh snapshot before the log
        retention can remove its state, so the newest of them is normally the newest version.
        """
        newest = int(table.version())
        for version in range(newest, max(-1, newest - _HISTORY_STEPS[-1]), -1):
            commit = self.read_commit(version)
            if commit is None:
                if not (Path(self.path) / "_delta_log" / f"{version:020d}.json").exists():
                    break  # below what the log keeps (cleaned up after its retention)
                continue
            job = commit.get(KEY_JOB)
            if job is None:
                continue
            if job != self.job_id:
                msg = (f'Delta table {self.path} belongs to job "{job}", not "{self.job_id}": '
                       "give this job its own sink path")
                raise ForeignTableError(msg)
            return commit
        return None

    def read_commit(self, version: int) -> dict[str, Any] | None:
        """The ``commitInfo`` of log version ``version`` (:func:`connectors.delta.log.read_commit`)."""
        return read_commit(self.path, version)

    def log_retention_s(self) -> float:
        """How long the table's log keeps a commit (``delta.logRetentionDuration``, Delta's default 30 d)."""
        table = self.table()
        value = None if table is None else table.metadata().configuration.get("delta.logRetentionDuration")
        if value is None:
            return self.log_retention_hours * 3600.0 if table is None else DEFAULT_LOG_RETENTION_S
        return parse_interval_s(value, self.path)

    def _find_epoch_commit(self, table: DeltaTable, epoch: int) -> dict[str, Any] | None:
        """The commit of ``epoch`` of this job among the newest ones (None if not found)."""
        for commit in table.history(_HISTORY_STEPS[1]):
            commit = _with_user_metadata(commit)
            if commit.get(KEY_JOB) == self.job_id and str(commit.get(KEY_EPOCH)) == str(epoch):
                return commit
        return None

    # -- committing ------------------------------------------------------------------------------------
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
           already: skip it (a replay), ``committed=False``.
        3. Spark executors write the rows as Parquet into ``sb_attempts/<epoch>-<attempt>/`` of the table
           (a fresh folder per attempt, holding a ``_ATTEMPT`` marker); the driver reads each file's
           size, row count and partition values from the folder and the Parquet footers.
        4. One delta-rs commit against the snapshot of step 2: the add actions +
           ``Transaction(job_id, epoch)`` + job, epoch, attempt, state and plan in the commit metadata.
           No rows: an empty commit that still carries txn and state. (Merge mode: one delta-rs
           ``merge`` carrying the same txn and metadata; delta-spark writer: its ``txnAppId`` /
           ``txnVersion`` / ``userMetadata`` options.)
        5. If the commit raises, the log decides: this attempt's commit is in (a post-commit step failed)
           -> keep its files, ``committed=True``; another attempt committed the epoch (a racing
           duplicate: ``CommitFailedError``) -> remove this attempt's files, ``committed=False``;
           nothing committed -> remove this attempt's files and raise. Files are removed only once the
           log shows they are not referenced; if the log cannot be read they stay for the orphan sweep.
        6. Every ``checkpoint_interval`` versions a log checkpoint is written.
        """
        with self._lock:
            snapshot = self._snapshot()
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
            if self.mode == "merge" and not new_keys_only:
                result = self._guarded(epoch, attempt, [], lambda: self._merge(snapshot, epoch, df, meta))
            elif df is not None and not _is_arrow_table(df) and self._use_delta_spark(df):
                spark_df = df
                result = self._guarded(
                    epoch, attempt, [], lambda: self._commit_delta_spark(epoch, spark_df, meta)
                )
            else:
                folder = Path(self.path) / STAGING / attempt
                folders = [folder]

                def write_and_commit() -> CommitResult:
                    adds, rows = self._write_files(df, folder)
                    for i, ahead in enumerate(staged):
                        moved = folder.parent / f"{attempt}.s{i}"
                        ahead.folder.rename(moved)  # from now on the attempt's: committed or removed with it
                        folders.append(moved)
                        more, n = self._collect_adds(moved)
                        adds.extend(more)
                        rows += n
                    if callable(state):
                        meta[KEY_STATE] = json.dumps(dict(state()), sort_keys=True)
                    version = self._commit(snapshot, epoch, adds, meta)
                    for f in folders:
                        (f / MARKER).unlink(missing_ok=True)  # sealed: the log references it now
                    return CommitResult(epoch, True, version, len(adds), rows)

                result = self._guarded(epoch, attempt, folders, write_and_commit)
            if result.committed and result.version is not None:
                self._maintain(result.version)
            logger.debug('epoch committed job="%s" epoch=%d version=%s files=%d rows=%d committed=%s',
                         self.job_id, epoch, result.version, result.files, result.rows, result.committed)
            return result

    def _guarded(self, epoch: int, attempt: str, folders: list[Path], step: Any) -> CommitResult:
        """Run write+commit ``step``; on failure let the log decide (protocol step 5).

        ``folders``: the attempt's folders (``step`` may add to it), kept or removed with the attempt.
        """
        try:
            return step()
        except Exception as exc:
            self._dt = None  # the cached snapshot may be stale or broken: reload next time
            try:
                table = self.table()
                done = None if table is None else table.transaction_version(self.job_id)
                winner = None
                if table is not None and done is not None and done >= epoch:
                    winner = self._find_epoch_commit(table, epoch)
            except Exception:
                logger.exception('commit in doubt, attempt files kept for the orphan sweep job="%s" '
                                 'epoch=%d attempt="%s"', self.job_id, epoch, attempt)
                raise exc from None
            if winner is not None and winner.get(KEY_ATTEMPT) == attempt:
                for folder in folders:
                    (folder / MARKER).unlink(missing_ok=True)
                logger.warning('epoch committed, a post-commit step failed job="%s" epoch=%d error="%s"',
                               self.job_id, epoch, exc)
                return CommitResult(epoch, True, int(winner.get("version", table.version())), -1, -1)
            for folder in folders:
                _remove_attempt(folder)
            if done is not None and done >= epoch:
                logger.warning('duplicate commit lost the race, own files removed job="%s" epoch=%d',
                               self.job_id, epoch)
                return CommitResult(epoch, False, None, 0, 0)
            if _is_commit_conflict(exc):
                msg = (f'Delta table {self.path}: commit of job "{self.job_id}" epoch {epoch} '
                       f"conflicted: {exc}")
                raise ConcurrentCommitError(msg) from exc
            raise

    def _snapshot(self) -> DeltaTable:
        """The cached table, created on first use and brought up to date (checked once per sink)."""
        from deltalake import DeltaTable

        if self._dt is None:
            self._ensure_table()
            self._dt = DeltaTable(self.path)
        else:
            self._dt.update_incremental()
        if not self._owner_checked:
            self._check_table(self._dt)
            self._owner_checked = True
        return self._dt

    def _check_table(self, table: DeltaTable) -> None:
        self._last_job_commit(table)  # raises ForeignTableError
        names = [f.name for f in table.schema().fields]
        missing = [n for n in self.arrow_schema.names if n not in names]
        parts = list(table.metadata().partition_columns)
        if missing or parts != list(self.partition_by):
            msg = (f"Delta table {self.path} has columns {names} partitioned by {parts}; the sink of job "
                   f'"{self.job_id}" writes {self.arrow_schema.names} '
                   f"partitioned by {list(self.partition_by)}")
            raise DeltaSinkError(msg)

    def writes_before_commit(self) -> bool:
        """True when ``commit_epoch`` writes the rows, then commits (the delta-rs append path).

        Only then can a deferred ``state`` depend on what the write observed.
        """
        return self.mode != "merge" and self.writer == "delta-rs"

    def _use_delta_spark(self, df: DataFrame) -> bool:
        if self.writer == "delta-rs":
            return False
        if self._delta_spark is None:
            self._delta_spark = delta_spark_available(df.sparkSession)
        if self.writer == "delta-spark" and not self._delta_spark:
            msg = "writer delta-spark asked for, but delta-spark's jars are not on Spark's classpath"
            raise DeltaSinkError(msg)
        return self._delta_spark

    def _commit_delta_spark(self, epoch: int, df: DataFrame, meta: dict[str, str]) -> CommitResult:
        """The same protocol through delta-spark: its txnAppId/txnVersion skip replays for us."""
        (
            self._conform(df).write.format("delta").mode("append")
            .option("txnAppId", self.job_id).option("txnVersion", str(epoch))
            .option("userMetadata", json.dumps(meta, sort_keys=True)).save(self.path)
        )
        table = self.table()
        commit = None if table is None else self._find_epoch_commit(table, epoch)
        # the version of *this* commit (another writer may have committed after it): the chain of a
        # job's state commits names versions
        version = None if commit is None else int(commit["version"])
        return CommitResult(epoch, True, version, 0, -1)

    def _ensure_table(self) -> None:
        from deltalake import DeltaTable

        if DeltaTable.is_deltatable(self.path):
            return
        DeltaTable.create(
            self.path,
            schema=self.arrow_schema,
            mode="ignore",
            partition_by=list(self.partition_by) or None,
            configuration=self.table_properties(),
        )
        logger.info('delta table created path="%s" job="%s"', self.path, self.job_id)

    def table_properties(self) -> dict[str, str]:
        """The properties a new table gets: change data feed, log checkpoints and log retention.

        delta-rs writes a checkpoint every ``delta.checkpointInterval`` versions after a commit and then,
        with ``delta.enableExpiredLogCleanup``, removes the commit files older than
        ``delta.logRetentionDuration`` that a checkpoint covers: readers start at the newest checkpoint
        and the log folder stays the size of the retention, however long the job runs.
        """
        props = {
            "delta.enableChangeDataFeed": "true",
            "delta.logRetentionDuration": f"interval {round(self.log_retention_hours * 3600)} seconds",
            "delta.enableExpiredLogCleanup": "true",
        }
        if self.checkpoint_interval > 0:
            props["delta.checkpointInterval"] = str(self.checkpoint_interval)
        return props

    def _conform(self, df: DataFrame, *extra: str) -> DataFrame:
        """``df`` with the sink's columns (+ ``extra``), in its order, cast to its types where they differ."""
        from pyspark.sql import functions as F  # noqa: N812

        if self._spark_schema is None:
            return df.select(*[F.col(f"`{n}`") for n in (*self.arrow_schema.names, *extra)])
        have = {f.name: f.dataType for f in df.schema.fields}
        cols = []
        for field in self._spark_schema.fields:
            if field.name not in self.arrow_schema.names:
                continue
            col = F.col(f"`{field.name}`")
            same = have.get(field.name) == field.dataType
            cols.append(col if same else col.cast(field.dataType).alias(field.name))
        return df.select(*cols, *[F.col(f"`{n}`") for n in extra])

    def _conform_arrow(self, rows: pa.Table, *extra: str) -> pa.Table:
        """Arrow rows with the sink's columns (+ ``extra``), in its order and types; a missing one raises."""
        missing = [n for n in (*self.arrow_schema.names, *extra) if n not in rows.column_names]
        if missing:
            msg = f"Delta sink {self.path}: rows lack the table's columns {missing}"
            raise DeltaSinkError(msg)
        fields = [*self.arrow_schema, *(rows.schema.field(n) for n in extra)]
        return rows.select([f.name for f in fields]).cast(_pa().schema(fields))

    def _commit(self, table: DeltaTable, epoch: int, adds: list[Any], meta: dict[str, str]) -> int:
        """Append ``adds`` with the epoch's transaction; a conflict with another writer is retried.

        Another writer's commit (a property or metadata change, a compaction) can make ours conflict.
        The files are written already, so only the log append is retried, on a refreshed snapshot, up to
        :data:`COMMIT_RETRIES` times, and only while the epoch is still uncommitted and the table is
        still this job's with its columns: a commit of the same epoch by another instance of the job
        ends the loop (the caller's exactly-once check then finds it), and is never doubled.
        """
        from deltalake.transaction import CommitProperties, Transaction

        before = int(table.version())
        for attempt in range(COMMIT_RETRIES + 1):
            try:
                table.create_write_transaction(
                    adds,
                    mode="append",
                    schema=self.arrow_schema,
                    partition_by=list(self.partition_by) or None,
                    commit_properties=CommitProperties(
                        custom_metadata=meta, app_transactions=[Transaction(self.job_id, epoch)]
                    ),
                )
                break
            except Exception as exc:
                if not _is_commit_conflict(exc) or attempt == COMMIT_RETRIES:
                    raise
                time.sleep(0.05 * 2**attempt)
                table.update_incremental()
                done = table.transaction_version(self.job_id)
                if done is not None and done >= epoch:
                    raise  # committed by another instance of this job: the caller sorts it out
                self._check_table(table)  # still ours, with our columns: else a DeltaSinkError
                if self.on_conflict is not None:
                    self.on_conflict()
                logger.warning('commit conflicted with another writer, retrying job="%s" epoch=%d '
                               'attempt=%d error="%s"', self.job_id, epoch, attempt + 1, one_line(exc))
        table.update_incremental()
        return self._own_version(table, meta, before)

    def _own_version(self, table: DeltaTable, meta: Mapping[str, str], before: int) -> int:
        """The log version of the commit carrying ``meta``'s attempt, newer than ``before``.

        The newest version unless another writer committed right after us: a job's state commits name
        each other by version (``prev``, ``base``), so it must be this commit's own.
        """
        newest = int(table.version())
        for version in range(newest, before, -1):
            commit = self.read_commit(version)
            if commit is not None and commit.get(KEY_ATTEMPT) == meta.get(KEY_ATTEMPT):
                return version
        return newest

    def _merge(
        self, table: DeltaTable, epoch: int, df: DataFrame | None, meta: dict[str, str]
    ) -> CommitResult:
        """Keyed merge of a changelog (insert/update_postimage upsert, delete deletes).

        The epoch's changelog is collected to the driver as Arrow and merged by delta-rs in one commit
        carrying the same txn and metadata; only the last change per key within the epoch counts and
        ``update_preimage`` rows are ignored.
        """
        from deltalake.transaction import CommitProperties, Transaction

        before = int(table.version())
        props = CommitProperties(custom_metadata=meta, app_transactions=[Transaction(self.job_id, epoch)])
        changes = None
        if _is_arrow_table(df):
            import pyarrow.compute as pc

            kept = _pa().array(["insert", "update_postimage", "delete"])
            changes = self._conform_arrow(df, CHANGE_TYPE)
            changes = changes.filter(pc.is_in(changes.column(CHANGE_TYPE), value_set=kept))
        elif df is not None:
            from pyspark.sql import functions as F  # noqa: N812

            keep = F.col(CHANGE_TYPE).isin("insert", "update_postimage", "delete")
            changes = self._conform(df, CHANGE_TYPE).where(keep).toArrow()
        if changes is None or changes.num_rows == 0:
            table.create_write_transaction([], mode="append", schema=self.arrow_schema,
                                           commit_properties=props)
            rows = 0
        else:
            changes = last_per_key(changes, self.key_columns)
            cols = self.arrow_schema.names
            on = " AND ".join(f"t.`{k}` = s.`{k}`" for k in self.key_columns)
            values = {c: f"s.`{c}`" for c in cols}
            (  # the changes are in memory already: not streamed, so delta-rs prunes target files by them
                table.merge(changes, predicate=on, source_alias="s", target_alias="t",
                            commit_properties=props, streamed_exec=False)
                .when_matched_delete(predicate=f"s.`{CHANGE_TYPE}` = 'delete'")
                .when_matched_update(values, predicate=f"s.`{CHANGE_TYPE}` != 'delete'")
                .when_not_matched_insert(values, predicate=f"s.`{CHANGE_TYPE}` != 'delete'")
                .execute()
            )
            rows = changes.num_rows
        table.update_incremental()
        return CommitResult(epoch, True, self._own_version(table, meta, before), 0, rows)


def _is_arrow(schema: Any) -> bool:
    import pyarrow as pa

    return isinstance(schema, pa.Schema)


def _to_arrow(schema: Any) -> pa.Schema:
    if _is_arrow(schema):
        return schema
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(schema, timezone="UTC")


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


_UNITS_S = {"second": 1, "minute": 60, "hour": 3600, "day": 86400, "week": 604800}


def parse_interval_s(value: str, path: str = "") -> float:
    """Seconds of a Delta interval property (``"interval 7 days"``, ``"interval 2 seconds"``)."""
    words = value.strip().lower().split()
    if words and words[0] == "interval":
        words = words[1:]
    try:
        amount, unit = float(words[0]), words[1].rstrip("s")
        return amount * _UNITS_S[unit]
    except (IndexError, KeyError, ValueError):
        msg = f'Delta table {path}: cannot read the interval "{value}" (expected e.g. "interval 7 days")'
        raise DeltaSinkError(msg) from None


def _is_commit_conflict(exc: BaseException) -> bool:
    from deltalake.exceptions import CommitFailedError

    return isinstance(exc, CommitFailedError) or "Concurrent" in str(exc)


def last_per_key(changes: pa.Table, keys: Sequence[str]) -> pa.Table:
    """Keep the last change of each key (row order is the changelog order), in that order."""
    import numpy as np
    import pyarrow as pa

    n = changes.num_rows
    at = pa.array(np.arange(n, dtype=np.int64))
    last = (changes.select(list(keys)).append_column("__at", at)
            .group_by(list(keys), use_threads=False).aggregate([("__at", "max")]).column("__at_max"))
    keep = np.zeros(n, dtype=bool)
    keep[last.to_numpy()] = True  # a mask keeps the rows' order without sorting the positions
    return changes.filter(pa.array(keep))


def delta_spark_available(spark: Any) -> bool:
    """True when delta-spark's JVM classes load in ``spark`` (its jars are on the classpath)."""
    try:
        # spark.jars land in Spark's own class loader (the thread's context loader), not the JVM's
        loader = spark._jvm.java.lang.Thread.currentThread().getContextClassLoader()  # noqa: SLF001
        loader.loadClass("io.delta.tables.DeltaTable")
    except Exception:  # noqa: BLE001 - py4j raises a generic error for a missing class; Connect has no _jvm
        return False
    return True
