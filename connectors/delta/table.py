"""The Delta table one job's sink writes: where it is, its columns, how it is opened, created and checked.

:class:`SinkTable` is what the sink's collaborators are handed (the committers of
:mod:`connectors.delta.committer`, :class:`connectors.delta.staging.EpochStaging`,
:class:`connectors.delta.maintenance.TableMaintenance`): the table's path and job, its Arrow (and Spark)
schema and partitioning, a table opener (a fresh snapshot, or the cached one the commits use, under the
lock every commit holds), and the reads of its log the commits need (this job's last commit, the commit
of an epoch, the version of a commit of ours).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from connectors.delta.log import KEY_ATTEMPT, KEY_EPOCH, KEY_JOB, commits_back, read_commit
from connectors.delta.log_append import (
    LogHead,
    LogVersionTaken,
    direct_refusal,
    grown_metadata,
    grown_schema,
    head_of,
    write_append,
)
from source_backfill.errors import DeltaSinkError, ForeignTableError, StateFormatError, one_line

if TYPE_CHECKING:
    import pyarrow as pa
    from deltalake import DeltaTable
    from pyspark.sql import DataFrame

logger = logging.getLogger(__name__)

#: How far back the commit of an epoch is looked for (a commit in doubt is among the newest).
HISTORY_SEARCH = 256

#: The log retention a new table gets (``delta.logRetentionDuration``): a week of versions to time-travel
#: and diagnose; older commit files are removed by delta-rs as it writes checkpoints. Delta's own default
#: (30 days) keeps ~2.6 million commit files of a busy job at a 1 s trigger.
LOG_RETENTION_HOURS = 168.0
#: Delta's default when a table does not set ``delta.logRetentionDuration``.
DEFAULT_LOG_RETENTION_S = 30 * 24 * 3600.0


class SinkTable:
    """The Delta table at ``path`` that job ``job_id`` commits to, with the columns of ``schema``.

    ``schema``: a Spark ``StructType`` (rows are conformed to its types) or an Arrow schema. ``lock`` is
    held by every commit and maintenance step; the cached snapshot (:meth:`snapshot`) is theirs.
    """

    def __init__(
        self,
        path: str,
        job_id: str,
        schema: Any,
        *,
        drop_columns: tuple[str, ...] = (),
        partition_by: tuple[str, ...] = (),
        checkpoint_interval: int = 100,
        log_retention_hours: float = LOG_RETENTION_HOURS,
        extra_properties: Mapping[str, str] | None = None,
    ) -> None:
        self.path = str(Path(path).absolute())
        self.job_id = job_id
        self.spark_schema = None if _is_arrow_schema(schema) else schema
        arrow = to_arrow_schema(schema)
        if drop_columns:
            import pyarrow as pa

            arrow = pa.schema([f for f in arrow if f.name not in drop_columns])
        #: The columns rows are written with: the table's, and those a growth to commit adds (:meth:`grow`).
        self.arrow_schema: pa.Schema = arrow
        #: The columns the table has as far as this sink knows (what its appends are checked against).
        self.table_schema: pa.Schema = arrow
        #: Properties a new table gets besides :meth:`properties` (a decoding job's reader schema, say).
        self.extra_properties = dict(extra_properties or {})
        #: Properties the next commit sets with the grown columns (None: no growth waiting).
        self.pending: dict[str, str] | None = None
        self.partition_by = partition_by
        self.checkpoint_interval = checkpoint_interval
        self.log_retention_hours = log_retention_hours
        self.lock = threading.RLock()
        self._dt: DeltaTable | None = None
        self._owner_checked = False
        #: The log's head as last seen (loaded, or after an append written here), and why appends may not
        #: be written here (None: they may), decided at the last load (:mod:`connectors.delta.log_append`).
        self._head: LogHead | None = None
        self._refusal: str | None = "not loaded"
        #: The table's properties at the last load, and the last version an append wrote here.
        self.properties_seen: dict[str, str] = {}
        self.last_direct: int | None = None

    # -- opening ---------------------------------------------------------------------------------------
    def open(self) -> DeltaTable | None:
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

    def snapshot(self) -> DeltaTable:
        """The cached table, created on first use and brought up to date (checked once per sink)."""
        from deltalake import DeltaTable

        self._head = None
        if self._dt is None:
            self.ensure()
            self._dt = DeltaTable(self.path)
        else:
            self._dt.update_incremental()
        if not self._owner_checked:
            self.check(self._dt)
            self._owner_checked = True
        self._head = head_of(self.path, self._dt, self.job_id)
        self.properties_seen = dict(self._dt.metadata().configuration)
        refusal = direct_refusal(self._dt, self.table_schema, self.partition_by)
        if refusal != self._refusal and refusal is not None:
            logger.info('appends committed through delta-rs path="%s" job="%s" because="%s"', self.path,
                        self.job_id, refusal)
        self._refusal = refusal
        return self._dt

    def direct_head(self) -> LogHead | None:
        """The log's head when appends may be written here and nothing else was written since; else None.

        Two ``stat`` calls instead of a reload: the cheap replay check of a commit
        (:meth:`connectors.delta.sink.DeltaEpochSink.commit_epoch`).
        """
        head = self._head
        if head is None or self._refusal is not None or not head.current(self.path):
            return None
        return head

    def grow(self, schema: Any, properties: Mapping[str, str]) -> list[str]:
        """From the next commit on, the columns of ``schema`` the table lacks, and ``properties``; the added.

        Only additive (:func:`~connectors.delta.log_append.grown_schema`; else :class:`DeltaSinkError`).
        The rows written from now on have the grown columns; the commit that adds them carries the
        table's new ``metaData`` (:meth:`append_grown`), so the columns appear with the first rows that
        hold them. Nothing to add and the properties as they are: nothing changes.
        """
        output = to_arrow_schema(schema)
        try:
            grown = grown_schema(self.arrow_schema, output)
        except ValueError as exc:
            msg = f'Delta table {self.path} of job "{self.job_id}": {exc}'
            raise DeltaSinkError(msg) from None
        added = grown.names[len(self.arrow_schema):]
        known = {**self.extra_properties, **self.properties_seen, **(self.pending or {})}
        if not added and all(known.get(k) == v for k, v in properties.items()):
            return []
        if added and self.spark_schema is not None and not _is_arrow_schema(schema):
            from pyspark.sql.types import StructType

            self.spark_schema = StructType([*self.spark_schema.fields,
                                            *(f for f in schema.fields if f.name in added)])
        self.arrow_schema = grown
        self.pending = {**(self.pending or {}), **properties}
        logger.info('table columns grow at the next commit path="%s" job="%s" added=%s', self.path,
                    self.job_id, ",".join(added) or "-")
        return list(added)

    def append_grown(self, adds: list[Any], epoch: int, meta: dict[str, str], table: DeltaTable) -> int:
        """Commit ``adds`` with the grown columns and properties (:meth:`grow`) straight into the log.

        ``table``: just loaded (:meth:`snapshot`). delta-rs' append keeps a table's columns as they are,
        so a growth is written here or not at all: a table whose appends may not be written here
        (:func:`~connectors.delta.log_append.direct_refusal`) cannot grow, :class:`DeltaSinkError`;
        :class:`LogVersionTaken` when another writer took the version first (the caller reloads, retries).
        """
        head = self.direct_head()
        if head is None:
            msg = (f'Delta table {self.path} of job "{self.job_id}": its columns cannot grow here '
                   f"({self._refusal or 'its log moved'})")
            raise DeltaSinkError(msg)
        assert self.pending is not None  # noqa: S101 - the caller checked
        metadata = grown_metadata(table, self.arrow_schema, self.pending)
        self._head = None
        after = write_append(self.path, head, adds, meta, self.job_id, epoch, metadata)
        self._head = after
        self.last_direct = after.version
        self.table_schema = self.arrow_schema
        self.properties_seen = dict(metadata["configuration"])
        self.pending = None
        return after.version

    def append_direct(self, adds: list[Any], epoch: int, meta: dict[str, str]) -> int | None:
        """Commit ``adds`` straight into the log (:func:`~connectors.delta.log_append.write_append`).

        The new version, or None when this table's appends go through delta-rs or the log moved since it
        was last seen (the caller reloads it and commits through delta-rs); :class:`LogVersionTaken` when
        another writer took the version between the check and the write. The cached snapshot is left
        behind the log: :meth:`snapshot` brings it up to date when it is next needed.
        """
        head = self.direct_head()
        if head is None:
            return None
        self._head = None  # until the write is known
        try:
            after = write_append(self.path, head, adds, meta, self.job_id, epoch)
        except LogVersionTaken:
            raise
        except OSError as exc:  # a file system without hard links, say: delta-rs from now on
            self._refusal = f"the log cannot be appended to directly ({one_line(exc)})"
            logger.warning('appends committed through delta-rs path="%s" job="%s" because="%s"', self.path,
                           self.job_id, self._refusal)
            return None
        self._head = after
        self.last_direct = after.version
        return after.version

    def cached(self) -> DeltaTable | None:
        """The cached snapshot if there is one, else a fresh one (None before the first commit).

        The cached snapshot may be behind appends written straight into the log (:meth:`append_direct`).
        """
        return self._dt or self.open()

    def forget_snapshot(self) -> None:
        """Drop the cached snapshot (stale or broken, or rewritten by maintenance): reloaded next time."""
        self._dt = None
        self._head = None

    def ensure(self) -> None:
        """Create the table from the schema (with :meth:`properties`) unless it exists."""
        from deltalake import DeltaTable

        if DeltaTable.is_deltatable(self.path):
            return
        DeltaTable.create(
            self.path,
            schema=self.table_schema,
            mode="ignore",
            partition_by=list(self.partition_by) or None,
            configuration={**self.properties(), **self.extra_properties},
            raise_if_key_not_exists=False,  # the extra properties are ours, not Delta's
        )
        logger.info('delta table created path="%s" job="%s"', self.path, self.job_id)

    def properties(self) -> dict[str, str]:
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

    def log_retention_s(self) -> float:
        """How long the table's log keeps a commit (``delta.logRetentionDuration``, Delta's default 30 d)."""
        table = self.open()
        value = None if table is None else table.metadata().configuration.get("delta.logRetentionDuration")
        if value is None:
            return self.log_retention_hours * 3600.0 if table is None else DEFAULT_LOG_RETENTION_S
        return parse_interval_s(value, self.path)

    # -- checking and reading the log ------------------------------------------------------------------
    def check(self, table: DeltaTable) -> None:
        """The table is this job's (else :class:`ForeignTableError`) and has the sink's columns."""
        self.last_job_commit(table)  # raises ForeignTableError
        names = [f.name for f in table.schema().fields]
        missing = [n for n in self.table_schema.names if n not in names]
        parts = list(table.metadata().partition_columns)
        if missing or parts != list(self.partition_by):
            msg = (f"Delta table {self.path} has columns {names} partitioned by {parts}; the sink of job "
                   f'"{self.job_id}" writes {self.arrow_schema.names} '
                   f"partitioned by {list(self.partition_by)}")
            raise DeltaSinkError(msg)

    def last_job_commit(self, table: DeltaTable) -> dict[str, Any] | None:
        """The newest commit carrying our metadata; another job's id there raises ForeignTableError.

        Read newest first one commit file at a time (no listing of the log, no replay of it), at most
        ``HISTORY_LIMIT`` versions back and never below the oldest commit file the log keeps: a
        job's commits are its epochs that changed something plus a fresh snapshot before the log
        retention can remove its state, so the newest of them is normally the newest version.
        """
        for commit in commits_back(self.path, int(table.version())):
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

    def find_epoch_commit(self, table: DeltaTable, epoch: int) -> dict[str, Any] | None:
        """The commit of ``epoch`` of this job among the newest ones (None if not found)."""
        for commit in commits_back(self.path, int(table.version()), HISTORY_SEARCH):
            if commit.get(KEY_JOB) == self.job_id and str(commit.get(KEY_EPOCH)) == str(epoch):
                return commit
        return None

    def own_version(self, table: DeltaTable, attempt: str | None, before: int) -> int:
        """The log version of the commit carrying ``attempt``, newer than ``before``.

        The newest version unless another writer committed right after us: a job's state commits name
        each other by version (``prev``, ``base``), so it must be this commit's own.
        """
        newest = int(table.version())
        for version in range(newest, before, -1):
            commit = self.read_commit(version)
            if commit is not None and commit.get(KEY_ATTEMPT) == attempt:
                return version
        return newest

    # -- rows in the table's columns -------------------------------------------------------------------
    def conform(self, df: DataFrame, *extra: str) -> DataFrame:
        """``df`` with the sink's columns (+ ``extra``), in its order, cast to its types where they differ."""
        from pyspark.sql import functions as F  # noqa: N812

        if self.spark_schema is None:
            return df.select(*[F.col(f"`{n}`") for n in (*self.arrow_schema.names, *extra)])
        have = {f.name: f.dataType for f in df.schema.fields}
        cols = []
        for field in self.spark_schema.fields:
            if field.name not in self.arrow_schema.names:
                continue
            col = F.col(f"`{field.name}`")
            same = have.get(field.name) == field.dataType
            cols.append(col if same else col.cast(field.dataType).alias(field.name))
        return df.select(*cols, *[F.col(f"`{n}`") for n in extra])

    def conform_arrow(self, rows: pa.Table, *extra: str) -> pa.Table:
        """Arrow rows with the sink's columns (+ ``extra``), in its order and types; a missing one raises."""
        import pyarrow as pa

        missing = [n for n in (*self.arrow_schema.names, *extra) if n not in rows.column_names]
        if missing:
            msg = f"Delta sink {self.path}: rows lack the table's columns {missing}"
            raise DeltaSinkError(msg)
        fields = [*self.arrow_schema, *(rows.schema.field(n) for n in extra)]
        target, picked = pa.schema(fields), rows.select([f.name for f in fields])
        # the live batch's rows already have the sink's types (each job's epoch casts the same batch)
        return picked if picked.schema.equals(target) else picked.cast(target)


def is_arrow_table(df: Any) -> bool:
    """True when ``df`` is rows already on the driver (an Arrow table), not a Spark DataFrame or None."""
    import pyarrow as pa

    return df is not None and isinstance(df, pa.Table)


def _is_arrow_schema(schema: Any) -> bool:
    import pyarrow as pa

    return isinstance(schema, pa.Schema)


def to_arrow_schema(schema: Any) -> pa.Schema:
    """``schema`` as Arrow (a Spark ``StructType`` converted with UTC timestamps)."""
    if _is_arrow_schema(schema):
        return schema
    from pyspark.sql.pandas.types import to_arrow_schema as spark_to_arrow

    return spark_to_arrow(schema, timezone="UTC")


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
