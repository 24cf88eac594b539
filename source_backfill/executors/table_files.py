"""The copy by files: a table-backfill job's large pinned version, read and written by Spark's executors.

A snapshot or chain job whose pinned version holds at least ``sources[].spark_copy_rows`` rows (by the
log's file statistics) copies it this way when the daemon runs Spark. Each epoch takes the next whole
data files of the version in path order (:func:`~source_backfill.core.table_backfill.plan_files`, at
most ``spark_copy_epoch_rows`` rows and the rate limit's allowance, at least one file), and the job
commits their rows with the state ``files = n`` in its one Delta commit of the epoch.

Why files: a version's files hold disjoint rows, each key once, and neither snapshot nor chain forwards
a live change before its copy is done, so any order of the files is a valid copy, and a file is a unit
of progress that needs no key order (sorting by vnode and key is what keeps the copy by vnode on the
driver). A version's files never change: the list, and a copy's place in it, is the same after a
restart. Arrangement keeps the copy by vnode: it forwards live changes by key position as it copies.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, NamedTuple

from connectors.delta.merge import CHANGE_TYPE
from source_backfill.core.table_backfill import Phase, TableBackfillState, copies_by_files, plan_files
from source_backfill.errors import JobError

if TYPE_CHECKING:
    from collections.abc import Sequence

    from pyspark.sql import DataFrame, SparkSession

    from connectors.delta.table_source import DeltaTableSource


class FileChunk(NamedTuple):
    """An epoch's files: their rows (a Spark DataFrame, read when the commit writes it) and how many."""

    frame: DataFrame
    rows: int


class FileStep(NamedTuple):
    """What an epoch of the copy by files does: files copied after it, its chunk (None: none), done."""

    files: int
    chunk: FileChunk | None
    done: bool


class FileCopy:
    """The copy by files of one job: which copies it takes, each epoch's files, how Spark runs them."""

    def __init__(self, job: str, table: DeltaTableSource, spark: SparkSession | None, *,
                 min_rows: int | None, epoch_rows: int) -> None:
        self.job = job
        self.table = table
        self.spark = spark
        self.min_rows = min_rows
        self.epoch_rows = epoch_rows
        #: The Spark job group of the copy's jobs (named in Spark's status and UI; cancelled by a drop).
        self._group = f"table-copy-{job}"
        #: The pinned version's data files and row counts (listed once per version).
        self._files: tuple[int, list[tuple[str, int]]] | None = None
        #: Rows of the version being copied (its progress and ETA); None before its files are listed.
        self.total_rows: int | None = None

    def takes(self, state: TableBackfillState) -> bool:
        """Whether a copy not started yet goes by files.

        It does by :func:`~source_backfill.core.table_backfill.copies_by_files`, the pinned version's rows
        counted from its files' statistics (listed once: the copy's steps take the same list).
        """
        if state.pinned is None or state.files is not None:
            return False
        if state.phase is not Phase.CONSUMING_SNAPSHOT or state.vnodes.vnodes:
            return False
        if self.spark is None or self.min_rows is None:
            return False  # (so no log is read)
        files = self._listed(state.pinned)
        rows = None if files is None else sum(n for _, n in files)
        return copies_by_files(state.strategy, rows, self.min_rows, spark=True)

    def step(self, state: TableBackfillState, budget: int | None) -> FileStep:
        """The epoch's files after ``state.files`` within ``budget`` rows (None: unlimited; 0: none)."""
        assert state.pinned is not None and state.files is not None
        if self.spark is None:
            msg = (f'job "{self.job}" copies version {state.pinned} by files with Spark, but this daemon '
                   "runs no Spark (a daemon of delta sources alone needs spark.tables = true)")
            raise JobError(msg)
        files = self._listed(state.pinned)
        if files is None:
            msg = f'job "{self.job}": a data file of version {state.pinned} has no row count'
            raise JobError(msg)
        self.total_rows = sum(n for _, n in files)
        end = plan_files([n for _, n in files], state.files, budget, max_rows=self.epoch_rows)
        chunk = None
        if end > state.files:
            taken = files[state.files:end]
            frame = self.table.read_files(self.spark, state.pinned, [uri for uri, _ in taken])
            chunk = FileChunk(frame, sum(n for _, n in taken))
        done = end == len(files)
        if done:
            self._files = None
        return FileStep(end, chunk, done)

    @property
    def file_count(self) -> int | None:
        """How many data files the version being copied has (None: not listed, or its copy is done)."""
        return None if self._files is None else len(self._files[1])

    def _listed(self, version: int) -> list[tuple[str, int]] | None:
        """``version``'s data files and row counts, read from the log once (None: a file without one)."""
        if self._files is None or self._files[0] != version:
            files = self.table.data_files(version)
            if files is None:
                return None
            self._files = (version, files)
        return self._files[1]

    @staticmethod
    def output(rows: DataFrame, columns: Sequence[str], epoch: int, *, changelog: bool) -> DataFrame:
        """A chunk's rows as the job's table takes them: inserts (changelog: ``_epoch``, ``_seq``).

        ``_seq`` is unique within the epoch, not contiguous (Spark numbers each task's rows apart): the
        rows are inserts of distinct keys, so any order of them replays the same.
        """
        from pyspark.sql import functions as F  # noqa: N812

        df = rows.select(*[F.col(f"`{c}`") for c in columns]).withColumn(CHANGE_TYPE, F.lit("insert"))
        if changelog:
            df = (df.withColumn("_epoch", F.lit(epoch).cast("long"))
                  .withColumn("_seq", F.monotonically_increasing_id()))
        return df

    def cancel(self) -> None:
        """Cancel the Spark jobs of this job's copy by files in flight (its group); a no-op without Spark."""
        if self.spark is not None:
            self.spark.sparkContext.cancelJobGroup(self._group)

    @contextmanager
    def spark_jobs(self) -> Iterator[None]:
        """Run the Spark jobs started inside in group ``table-copy-<job>``, in the pool of history copies.

        Spark's status and UI name them by the group; the FAIR pool gives a source's live stream free
        slots first.
        """
        if self.spark is None:
            yield
            return
        from source_backfill.executors.read_ahead import HISTORY_POOL

        sc = self.spark.sparkContext
        sc.setJobGroup(self._group, f"table copy by files of job {self.job}",
                       interruptOnCancel=True)
        sc.setLocalProperty("spark.scheduler.pool", HISTORY_POOL)
        try:
            yield
        finally:
            for key in ("spark.jobGroup.id", "spark.job.description", "spark.scheduler.pool"):
                sc.setLocalProperty(key, None)  # type: ignore[arg-type]
