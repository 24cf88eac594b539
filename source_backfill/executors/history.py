"""Reading a job's history: planned offset ranges as rows, with the source's Kafka connector.

Two ways to take a range, one per use:

* :meth:`HistoryReader.rows` — a DataFrame of the ranges, for an epoch that reads its history itself
  (it is written with the live rows and the transform in the epoch's commit);
* :meth:`HistoryReader.stage` — the ranges copied into staged Parquet files of the job's table, for a
  read ahead that a later epoch adopts (a job's transform applied by Spark as it copies).

``connector = "spark"`` reads with Spark's Kafka source (:mod:`connectors.kafka.spark_kafka`);
``connector = "python"`` with the project's data source (:mod:`connectors.kafka.source`), whose read
ahead copies with pyarrow in a Spark task (:mod:`connectors.kafka.parquet_copy`) instead of through Spark's
rows. Errors are the caller's: a read that fails raises, and the job decides (back off, or fail on data
loss).
"""

from __future__ import annotations

import json
import logging
import os
import threading
import uuid
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from source_backfill import metrics
from source_backfill.core import HistoryRange, parse_split_id
from source_backfill.errors import DataLossError, SourceBackfillError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from connectors.delta.sink import DeltaEpochSink
    from connectors.delta.staging import StagedFiles
    from connectors.kafka.admin import KafkaAdmin
    from source_backfill.config import SourceConfig

logger = logging.getLogger(__name__)

#: Spark tasks of one read ahead. One task copies 1M records in ~1.6 s alone and leaves the other task
#: slots to the live stream. With two on ``local[2]``, the live stream's tasks queued behind history for
#: seconds: live p99 went to 2.2-3.3x (bench/bench_backfill.py, three runs), where one task keeps 1.05-1.26x.
READ_AHEAD_TASKS = 1
#: CPU niceness of a Python connector's read-ahead copy (``parquet_copy.write_ranges_parquet``):
#: on a busy machine the live stream's work gets the CPU first; on an idle one the copy runs at full speed.
#: bench_backfill, three runs each: niceness 10 kept live p99 at 1.05-1.15x, niceness 0 at 1.05-1.56x.
READ_AHEAD_NICENESS = 10
#: How long the observed history counts may take to arrive after the write finished (in an epoch; a
#: read ahead waits less: its counts only feed the rows shown).
OBSERVE_TIMEOUT_S = 60.0
READ_AHEAD_OBSERVE_TIMEOUT_S = 10.0


class HistoryReader:
    """Reads history ranges of one source for one job's sink."""

    def __init__(self, spark: SparkSession, source: SourceConfig, admin: KafkaAdmin, *,
                 bootstrap_servers: str, on_data_loss: Callable[[str, int], None] | None = None) -> None:
        self.spark = spark
        self.source = source
        self.admin = admin
        self.bootstrap_servers = bootstrap_servers
        #: ``on_data_loss(split, offsets)``: lost history counted (the job's metrics, which pick the
        #: splits with series of their own); None: the job-level counter only.
        self._on_data_loss = on_data_loss
        #: Per split, the offset below which lost history (under the log start) is already counted.
        self._lost_to: dict[str, int] = {}

    def rows(self, ranges: Sequence[HistoryRange], session: SparkSession | None = None) -> DataFrame:
        """The records of ``ranges`` as a DataFrame of ``session`` (default: the reader's)."""
        session = session or self.spark
        if self.source.connector == "spark":
            from connectors.kafka.spark_kafka import read_ranges, reader_options

            self._check_log_start(ranges)
            return read_ranges(session, ranges, reader_options(self.source, self.bootstrap_servers))
        from connectors.kafka.source import KAFKA_FORMAT, max_read_tasks, reader_options

        spec = []
        for r in ranges:
            topic, partition = parse_split_id(r.split)
            spec.append({"topic": topic, "partition": partition, "start": r.start, "end": r.end})
        options = reader_options(self.source, self.bootstrap_servers,
                                 max_read_tasks(self.spark, self.source.max_read_tasks))
        return session.read.format(KAFKA_FORMAT).options(**options).option("ranges", json.dumps(spec)).load()

    def stage(self, sink: DeltaEpochSink, ranges: Sequence[HistoryRange], after_epoch: int,
              on_folder: Callable[[Path], None] | None = None,
              transform: Callable[[DataFrame], DataFrame] | None = None,
              ) -> tuple[StagedFiles, dict[str, int]]:
        """Copy ``ranges`` into staged files of ``sink``'s table; the files and the records per split.

        Runs as ``READ_AHEAD_TASKS`` Spark tasks (the caller picks the job group and the FAIR pool).
        ``on_folder(folder)``: where the files go, told before the copy starts (its files close as it
        goes: :class:`StagedProgress` reads what they hold). ``transform``: the job's transform, applied
        by Spark to the records as they are copied (either connector).
        """
        if transform is not None:
            return self._stage_transformed(sink, ranges, after_epoch, on_folder, transform)
        if self.source.connector == "spark":
            return self._stage_spark(sink, ranges, after_epoch, on_folder)
        return self._stage_python(sink, ranges, after_epoch, on_folder)

    def _stage_spark(self, sink: DeltaEpochSink, ranges: Sequence[HistoryRange], after_epoch: int,
                     on_folder: Callable[[Path], None] | None) -> tuple[StagedFiles, dict[str, int]]:
        rows = self.rows(ranges).coalesce(READ_AHEAD_TASKS)
        staged = sink.stage_dataframe(rows, after_epoch, on_folder)
        progress = StagedProgress()
        progress.folder = staged.folder
        return staged, {split: n for split, (n, _) in progress.read().items()}

    def _stage_transformed(
        self, sink: DeltaEpochSink, ranges: Sequence[HistoryRange], after_epoch: int,
        on_folder: Callable[[Path], None] | None, transform: Callable[[DataFrame], DataFrame],
    ) -> tuple[StagedFiles, dict[str, int]]:
        """The transformed records; the Kafka records per split are counted before the transform.

        A transform may drop or filter rows and columns, so the files cannot tell how many records were
        read; an observation on the records does. When it does not come (a transform that lets Spark
        prune the scan, say) the counts are the ranges' sizes: they feed only the rows shown.
        """
        counted, observation = count_per_split(self.rows(ranges).coalesce(READ_AHEAD_TASKS), ranges,
                                               "read-ahead")
        staged = sink.stage_dataframe(transform(counted), after_epoch, on_folder)
        try:
            observed_counts = observed(observation, timeout_s=READ_AHEAD_OBSERVE_TIMEOUT_S)
        except SourceBackfillError:
            observed_counts = range_sizes(ranges)
        return staged, {s: int(n) for s, n in observed_counts.items() if n}

    def _stage_python(self, sink: DeltaEpochSink, ranges: Sequence[HistoryRange], after_epoch: int,
                      on_folder: Callable[[Path], None] | None) -> tuple[StagedFiles, dict[str, int]]:
        """The Python connector's reader and pyarrow's Parquet writer in Spark tasks.

        The rows need no transform, so they skip Spark's row conversion (a third of the CPU of a
        DataFrame copy).
        """
        from connectors.kafka.parquet_copy import write_ranges_parquet
        from connectors.kafka.ranges import KafkaRange

        pieces = [KafkaRange(*parse_split_id(r.split), r.start, r.end) for r in ranges]
        slices = [part for i in range(READ_AHEAD_TASKS) if (part := pieces[i::READ_AHEAD_TASKS])]
        bootstrap, kafka = self.bootstrap_servers, dict(self.source.kafka)
        fail_on_data_loss, niceness = self.source.fail_on_data_loss, READ_AHEAD_NICENESS
        poll_timeout_s = self.source.poll_timeout_s
        counts: dict[str, int] = {}

        def write(folder: Path) -> None:
            target = str(folder)
            copied = (
                self.spark.sparkContext.parallelize(slices, len(slices))
                .map(lambda part: write_ranges_parquet(part, bootstrap, kafka, target,
                                                      fail_on_data_loss=fail_on_data_loss, niceness=niceness,
                                                      poll_timeout_s=poll_timeout_s))
                .collect()
            )
            for rows in copied:
                for split, n in rows.items():
                    counts[split] = counts.get(split, 0) + n

        staged = sink.stage_files(write, after_epoch, on_folder)
        return staged, {s: n for s, n in counts.items() if n}

    def count_data_loss(self, job: str, ranges: Iterable[HistoryRange]) -> None:
        """With ``fail_on_data_loss = false`` the readers skip history below the log start: count it.

        Counted when the read is planned, from the log start then (one ListOffsets); offsets a deletion
        removes while a read is already running are skipped by the reader but not counted.
        """
        ranges = list(ranges)
        if self.source.fail_on_data_loss or not ranges:
            return
        log_start = self.admin.earliest_offsets(sorted({r.split for r in ranges}))
        for r in ranges:
            first = max(r.start, self._lost_to.get(r.split, r.start))
            lost_end = min(log_start.get(r.split, r.start), r.end)
            if lost_end > first:
                self._lost_to[r.split] = lost_end
                if self._on_data_loss is not None:
                    self._on_data_loss(r.split, lost_end - first)
                else:
                    metrics.JOB_DATA_LOSS.labels(job).inc(lost_end - first)
                logger.warning('history lost, skipped job="%s" split="%s" offsets="%d..%d" log_start=%d',
                               job, r.split, first, lost_end - 1, lost_end)

    def _check_log_start(self, ranges: Sequence[HistoryRange]) -> None:
        """``fail_on_data_loss``: a range under its split's log start fails before the read, clearly."""
        if not self.source.fail_on_data_loss or not ranges:
            return
        from connectors.kafka.spark_kafka import check_log_start

        check_log_start(ranges, self.admin.earliest_offsets(sorted({r.split for r in ranges})))


def range_sizes(ranges: Iterable[HistoryRange]) -> dict[str, int]:
    """Offsets per split of ``ranges``: an upper bound of the records they hold."""
    sizes: dict[str, int] = {}
    for r in ranges:
        sizes[r.split] = sizes.get(r.split, 0) + r.size
    return sizes


def is_data_loss(exc: BaseException) -> bool:
    """``exc`` (or an exception it was raised from) says history is below the log start."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, DataLossError) or "DataLossError" in str(current):
            return True
        current = current.__cause__ or current.__context__
    return False


def count_per_split(rows: DataFrame, ranges: Sequence[HistoryRange], name: str) -> tuple[DataFrame, Any]:
    """``rows`` counting its records per split of ``ranges`` as an action runs it (one pass).

    Returns the observed DataFrame and the observation (read it with :func:`observed` after the
    action). An observation only sees actions of the session of ``rows``.
    """
    from pyspark.sql import Observation
    from pyspark.sql import functions as F  # noqa: N812

    observation = Observation(f"history-{name}-{uuid.uuid4().hex}")
    per_split = []
    for split in dict.fromkeys(r.split for r in ranges):
        topic, partition = parse_split_id(split)
        cond = (F.col("topic") == topic) & (F.col("partition") == partition)
        per_split.append(F.count_if(cond).alias(split))
    return rows.observe(observation, *per_split), observation


def observed(observation: Any, timeout_s: float = OBSERVE_TIMEOUT_S) -> dict[str, Any]:
    """``observation.get`` (which has no deadline) bounded by ``timeout_s``.

    Past it :class:`~source_backfill.errors.SourceBackfillError` (not a JobError: the job is fine).
    """
    box: dict[str, Any] = {}

    def get() -> None:
        try:
            box["value"] = observation.get
        except Exception as exc:  # noqa: BLE001 - handed to the caller
            box["error"] = exc

    waiter = threading.Thread(target=get, name="observation-get", daemon=True)
    waiter.start()
    waiter.join(timeout_s)
    if "error" in box:
        raise box["error"]
    if "value" not in box:
        msg = f"history row counts not observed within {timeout_s:.0f}s after the write"
        raise SourceBackfillError(msg)
    return dict(box["value"])


def _parquet_files(folder: Path) -> list[Path]:
    """The Parquet files under ``folder`` now, sorted.

    A copy in progress moves its files: a Spark task writes under ``_temporary/`` and its job's commit
    moves them up and removes that folder, so a folder listed a moment ago may be gone when the walk
    enters it. ``os.walk`` skips such a folder (``Path.rglob`` raised FileNotFoundError, which failed
    the epoch that read the progress: two job rebuilds in a 10-minute load soak).
    """
    found: list[Path] = []
    for root, _dirs, files in os.walk(folder):  # an error listing a folder (it vanished) is skipped
        found.extend(Path(root) / name for name in files if name.endswith(".parquet"))
    return sorted(found)


class StagedProgress:
    """What a read ahead has copied so far: rows and the last offset per split, from its closed files.

    A staged copy writes Parquet files that close as it goes (Spark's connector: every
    ``STAGED_FILE_ROWS`` rows; Python's: every range). A closed file has a footer; the one being
    written has none yet and is skipped. Each file is read once (three columns), then remembered.
    """

    def __init__(self) -> None:
        self.folder: Path | None = None
        #: By file name: a Spark task writes under ``_temporary`` and moves its files up when it ends.
        self._files: dict[str, dict[str, tuple[int, int]]] = {}

    def read(self) -> dict[str, tuple[int, int]]:
        """``split -> (rows, last offset)`` over the closed files found now (empty before the copy)."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        from source_backfill.core import split_id

        folder = self.folder
        if folder is not None:
            for file in _parquet_files(folder):
                if file.name in self._files:
                    continue
                try:
                    if not {"topic", "partition", "offset"} <= set(pq.read_schema(file).names):
                        self._files[file.name] = {}  # a transform's output without the Kafka columns
                        continue
                    table = pq.read_table(file, columns=["topic", "partition", "offset"])
                except (OSError, pa.ArrowInvalid):
                    continue  # still being written (no footer yet), or moved away meanwhile
                grouped = table.group_by(["topic", "partition"]).aggregate(
                    [([], "count_all"), ("offset", "max")])
                self._files[file.name] = {split_id(r["topic"], r["partition"]): (int(r["count_all"]),
                                                                            int(r["offset_max"]))
                                     for r in grouped.to_pylist()}
        total: dict[str, tuple[int, int]] = {}
        for stats in self._files.values():
            for split, (n, last) in stats.items():
                rows, top = total.get(split, (0, -1))
                total[split] = (rows + n, max(top, last))
        return total
