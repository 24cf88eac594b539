"""Exactly-once Delta sink: one atomic commit per job per epoch, the job's state inside the commit.

Spark executors write Parquet files into a staging folder *inside* the table; the driver then commits
them with delta-rs in one transaction that also carries ``Transaction(job_id, epoch)`` and the job's new
state in the commit metadata. Output and state cannot fall out of step: there is no second table.

Log metadata keys (in each commit's ``commitInfo``): ``source_backfill.job``, ``source_backfill.epoch``,
``source_backfill.state`` (JSON), ``source_backfill.plan`` (JSON).
"""

from __future__ import annotations

import json
import logging
import shutil
import threading
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from source_backfill.errors import DeltaSinkError, ForeignTableError, StateFormatError

if TYPE_CHECKING:
    import pyarrow as pa
    from deltalake import DeltaTable
    from pyspark.sql import DataFrame

logger = logging.getLogger(__name__)

STAGING = "_sb_staging"
KEY_JOB = "source_backfill.job"
KEY_EPOCH = "source_backfill.epoch"
KEY_STATE = "source_backfill.state"
KEY_PLAN = "source_backfill.plan"
CHANGE_TYPE = "_change_type"
#: How far back :meth:`DeltaEpochSink.recover` looks for the job's last commit (maintenance commits
#: such as OPTIMIZE carry no state).
_HISTORY_SCAN = 1000


@dataclass(frozen=True)
class CommitResult:
    """Outcome of :meth:`DeltaEpochSink.commit_epoch` (``committed`` False: the epoch was already in)."""

    epoch: int
    committed: bool
    version: int | None
    files: int
    rows: int


@dataclass(frozen=True)
class Recovered:
    """A job's latest committed epoch, state and plan, read back from its table's log."""

    epoch: int
    state: dict[str, Any]
    plan: dict[str, Any] | None
    version: int


class DeltaEpochSink:
    """Commit each epoch of one job to the Delta table at ``path`` exactly once."""

    def __init__(
        self,
        path: str,
        job_id: str,
        schema: Any,
        *,
        mode: Literal["append", "merge"] = "append",
        key_columns: Sequence[str] = (),
        partition_by: Sequence[str] = (),
        writer: Literal["auto", "delta-rs", "delta-spark"] = "auto",
        checkpoint_interval: int = 100,
    ) -> None:
        if mode == "merge" and not key_columns:
            msg = "merge mode needs key_columns"
            raise DeltaSinkError(msg)
        self.path = str(Path(path).absolute())
        self.job_id = job_id
        self.mode = mode
        self.key_columns = tuple(key_columns)
        self.partition_by = tuple(partition_by)
        self.checkpoint_interval = checkpoint_interval
        self.writer = writer
        self._spark_schema = schema if not _is_arrow(schema) else None
        self.arrow_schema = _to_arrow(schema)
        if mode == "merge":
            import pyarrow as pa

            self.arrow_schema = pa.schema([f for f in self.arrow_schema if f.name != CHANGE_TYPE])
        self._lock = threading.Lock()
        self.remove_orphans()

    # -- reading the log -------------------------------------------------------------------------------
    def table(self) -> DeltaTable | None:
        """The table, or None before its first commit."""
        from deltalake import DeltaTable

        if not DeltaTable.is_deltatable(self.path):
            return None
        return DeltaTable(self.path)

    def committed_epoch(self) -> int | None:
        """The last epoch this job committed (the table's ``transaction_version(job_id)``)."""
        table = self.table()
        return None if table is None else table.transaction_version(self.job_id)

    def recover(self) -> Recovered | None:
        """The job's latest committed state; None for a new table.

        A table written by another job (its log carries another ``source_backfill.job``) is refused with
        :class:`ForeignTableError`; unreadable state metadata with :class:`StateFormatError`.
        """
        table = self.table()
        if table is None:
            return None
        epoch = table.transaction_version(self.job_id)
        for commit in table.history(_HISTORY_SCAN):
            if KEY_JOB not in commit and isinstance(commit.get("userMetadata"), str):
                try:  # written by delta-spark: our keys travel as userMetadata JSON
                    commit = {**commit, **json.loads(commit["userMetadata"])}
                except ValueError:
                    pass
            job = commit.get(KEY_JOB)
            if job is None:
                continue
            if job != self.job_id:
                msg = (f'Delta table {self.path} belongs to job "{job}", not "{self.job_id}": '
                       "use another sink path")
                raise ForeignTableError(msg)
            if epoch is None:
                msg = f"Delta table {self.path}: commit metadata of {job} without its transaction"
                raise StateFormatError(msg)
            return Recovered(
                epoch=int(epoch),
                state=_json(commit.get(KEY_STATE), self.path, KEY_STATE),
                plan=_json(commit.get(KEY_PLAN), self.path, KEY_PLAN) if commit.get(KEY_PLAN) else None,
                version=int(commit.get("version", table.version())),
            )
        if epoch is not None:
            msg = f'Delta table {self.path}: job "{self.job_id}" committed epoch {epoch} but no state found'
            raise StateFormatError(msg)
        return None

    # -- committing ------------------------------------------------------------------------------------
    def commit_epoch(
        self,
        epoch: int,
        df: DataFrame | None,
        state: Mapping[str, Any],
        plan: Mapping[str, Any] | None = None,
    ) -> CommitResult:
        """Commit epoch ``epoch``'s rows and the job's new ``state`` atomically, exactly once.

        1. If ``transaction_version(job_id) >= epoch`` the epoch is in already: skip (replay).
        2. Create the table on first use (change data feed on) from the sink's schema.
        3. Spark executors write the rows as Parquet into ``_sb_staging/<epoch>-<attempt>/`` of the
           table; the driver reads each file's size, row count and partition values.
        4. One delta-rs commit: the add actions + ``Transaction(job_id, epoch)`` + state and plan in the
           commit metadata. No rows: an empty commit that still carries txn and state.
        5. A racing duplicate (``CommitFailedError``, or the txn already at ``epoch``) resolves to the
           other commit: this attempt's files are removed, ``committed=False``.
        6. Any other failure removes this attempt's files and re-raises; nothing becomes visible.
        7. Every ``checkpoint_interval`` versions a log checkpoint is written.
        """
        from deltalake import DeltaTable

        with self._lock:
            self._ensure_table()
            # The commit below is made against THIS snapshot: a concurrent commit of the same txn after
            # it makes delta-rs fail the commit instead of silently committing the epoch twice.
            snapshot = DeltaTable(self.path)
            done = snapshot.transaction_version(self.job_id)
            if done is not None and done >= epoch:
                logger.info('epoch already committed, skipped job="%s" epoch=%d', self.job_id, epoch)
                return CommitResult(epoch, False, None, 0, 0)
            meta = {
                KEY_JOB: self.job_id,
                KEY_EPOCH: str(epoch),
                KEY_STATE: json.dumps(dict(state), sort_keys=True),
            }
            if plan is not None:
                meta[KEY_PLAN] = json.dumps(dict(plan), sort_keys=True)
            if self.mode == "merge":
                return self._merge(snapshot, epoch, df, meta)
            if df is not None and self._use_delta_spark(df):
                return self._commit_delta_spark(epoch, df, meta)
            attempt = Path(self.path) / STAGING / f"{epoch}-{uuid.uuid4().hex}"
            try:
                adds, rows = self._write_files(df, attempt)
                version = self._commit(snapshot, epoch, adds, meta)
            except Exception as exc:
                shutil.rmtree(attempt, ignore_errors=True)
                if _is_commit_conflict(exc) and (self.committed_epoch() or -1) >= epoch:
                    logger.warning('duplicate commit lost the race job="%s" epoch=%d', self.job_id, epoch)
                    return CommitResult(epoch, False, None, 0, 0)
                raise
            self._maintain(version)
            logger.debug('epoch committed job="%s" epoch=%d version=%d files=%d rows=%d',
                         self.job_id, epoch, version, len(adds), rows)
            return CommitResult(epoch, True, version, len(adds), rows)

    def _use_delta_spark(self, df: DataFrame) -> bool:
        if self.writer == "delta-rs":
            return False
        available = delta_spark_available(df.sparkSession)
        if self.writer == "delta-spark" and not available:
            msg = "writer delta-spark asked for, but delta-spark's jars are not on Spark's classpath"
            raise DeltaSinkError(msg)
        return available

    def _commit_delta_spark(self, epoch: int, df: DataFrame, meta: dict[str, str]) -> CommitResult:
        """The same protocol through delta-spark: its txnAppId/txnVersion skip replays for us."""
        (
            df.select(*self.arrow_schema.names).write.format("delta").mode("append")
            .option("txnAppId", self.job_id).option("txnVersion", str(epoch))
            .option("userMetadata", json.dumps(meta)).save(self.path)
        )
        table = self.table()
        version = None if table is None else int(table.version())
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
            configuration={"delta.enableChangeDataFeed": "true"},
        )
        logger.info('delta table created path="%s" job="%s"', self.path, self.job_id)

    def _write_files(self, df: DataFrame | None, attempt: Path) -> tuple[list[Any], int]:
        """Have Spark's executors write ``df`` under ``attempt``; return add actions and row count."""
        import pyarrow.parquet as pq
        from deltalake.transaction import AddAction

        if df is None:
            return [], 0
        writer = df.select(*self.arrow_schema.names).write.mode("overwrite")
        if self.partition_by:
            writer = writer.partitionBy(*self.partition_by)
        writer.parquet(str(attempt))
        adds, rows = [], 0
        for file in sorted(attempt.rglob("*.parquet")):
            meta = pq.read_metadata(file)
            if meta.num_rows == 0:
                file.unlink()
                continue
            stat = file.stat()
            rel = file.relative_to(self.path).as_posix()
            parts = {k: (None if v == "__HIVE_DEFAULT_PARTITION__" else v) for k, v in
                     (seg.split("=", 1) for seg in file.relative_to(attempt).parts[:-1])}
            adds.append(AddAction(rel, stat.st_size, parts, int(stat.st_mtime * 1000), True,
                                  json.dumps({"numRecords": meta.num_rows})))
            rows += meta.num_rows
        return adds, rows

    def _commit(self, table: DeltaTable, epoch: int, adds: list[Any], meta: dict[str, str]) -> int:
        from deltalake.transaction import CommitProperties, Transaction

        table.create_write_transaction(
            adds,
            mode="append",
            schema=self.arrow_schema,
            partition_by=list(self.partition_by) or None,
            commit_properties=CommitProperties(
                custom_metadata=meta, app_transactions=[Transaction(self.job_id, epoch)]
            ),
        )
        table.update_incremental()
        return int(table.version())

    def _merge(
        self, table: DeltaTable, epoch: int, df: DataFrame | None, meta: dict[str, str]
    ) -> CommitResult:
        """Keyed merge of a changelog (insert/update_postimage upsert, delete deletes).

        The epoch's changelog is collected to the driver as Arrow and merged by delta-rs in one commit
        carrying the same txn and metadata; only the last change per key within the epoch counts.
        """
        import pyarrow as pa
        from deltalake.transaction import CommitProperties, Transaction

        props = CommitProperties(custom_metadata=meta, app_transactions=[Transaction(self.job_id, epoch)])
        changes = None if df is None else df.where(f"{CHANGE_TYPE} != 'update_preimage'").toArrow()
        try:
            if changes is None or changes.num_rows == 0:
                table.create_write_transaction([], mode="append", schema=self.arrow_schema,
                                               commit_properties=props)
                rows = 0
            else:
                changes = _last_per_key(changes, self.key_columns)
                cols = self.arrow_schema.names
                on = " AND ".join(f"t.`{k}` = s.`{k}`" for k in self.key_columns)
                values = {c: f"s.`{c}`" for c in cols}
                (
                    table.merge(pa.table(changes), predicate=on, source_alias="s", target_alias="t",
                                commit_properties=props)
                    .when_matched_delete(predicate=f"s.{CHANGE_TYPE} = 'delete'")
                    .when_matched_update(values, predicate=f"s.{CHANGE_TYPE} != 'delete'")
                    .when_not_matched_insert(values, predicate=f"s.{CHANGE_TYPE} != 'delete'")
                    .execute()
                )
                rows = changes.num_rows
        except Exception as exc:
            if _is_commit_conflict(exc) and (self.committed_epoch() or -1) >= epoch:
                return CommitResult(epoch, False, None, 0, 0)
            raise
        table.update_incremental()
        version = int(table.version())
        self._maintain(version)
        return CommitResult(epoch, True, version, 0, rows)

    # -- maintenance -----------------------------------------------------------------------------------
    def _maintain(self, version: int) -> None:
        if self.checkpoint_interval > 0 and version > 0 and version % self.checkpoint_interval == 0:
            table = self.table()
            if table is not None:
                table.create_checkpoint()
                logger.info('delta checkpoint written path="%s" version=%d', self.path, version)

    def remove_orphans(self) -> int:
        """Remove staging folders of attempts that never committed (epoch above the committed one).

        Folders of epochs at or below the committed epoch are left to :meth:`vacuum`: their files may be
        referenced by the log (the committed attempt) and must never be deleted here.
        """
        staging = Path(self.path) / STAGING
        if not staging.is_dir():
            return 0
        done = self.committed_epoch()
        removed = 0
        for attempt in staging.iterdir():
            head = attempt.name.split("-", 1)[0]
            if head.isdigit() and (done is None or int(head) > done):
                shutil.rmtree(attempt, ignore_errors=True)
                removed += 1
        if removed:
            logger.info('orphan attempts removed path="%s" count=%d', self.path, removed)
        return removed

    def compact(self) -> dict[str, Any]:
        """Rewrite small files into larger ones (a commit without state; recovery skips it)."""
        table = self.table()
        if table is None:
            return {}
        return dict(table.optimize.compact())

    def vacuum(self, retention_hours: int = 168) -> list[str]:
        """Delete files no version within ``retention_hours`` references (staging leftovers included)."""
        table = self.table()
        if table is None:
            return []
        return list(table.vacuum(retention_hours=retention_hours, dry_run=False,
                                 enforce_retention_duration=retention_hours >= 168))


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
        msg = f"Delta table {path}: commit metadata {key} is not an object"
        raise StateFormatError(msg)
    return value


def _is_commit_conflict(exc: BaseException) -> bool:
    from deltalake.exceptions import CommitFailedError

    return isinstance(exc, CommitFailedError) or "Concurrent" in str(exc)


def _last_per_key(changes: pa.Table, keys: Sequence[str]) -> pa.Table:
    """Keep the last change of each key (row order is the changelog order)."""
    import pyarrow as pa

    seen: dict[tuple[Any, ...], int] = {}
    columns = [changes.column(k).to_pylist() for k in keys]
    for i, key in enumerate(zip(*columns, strict=True)):
        seen[key] = i
    return changes.take(pa.array(sorted(seen.values()), type=pa.int64()))


def delta_spark_available(spark: Any) -> bool:
    """True when delta-spark's JVM classes load in ``spark`` (its jars are on the classpath)."""
    try:
        spark._jvm.java.lang.Class.forName("io.delta.tables.DeltaTable")  # noqa: SLF001
    except Exception:  # noqa: BLE001 - py4j raises a generic error for a missing class
        return False
    return True
