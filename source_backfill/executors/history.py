"""Reading a job's history: planned offset ranges as rows, with the source's Kafka connector.

Two ways to take a range, one per use:

* :meth:`HistoryReader.rows` — a DataFrame of the ranges, for an epoch that reads its history itself
  (it is written with the live rows and the transform in the epoch's commit);
* :meth:`HistoryReader.stage` — the ranges copied into staged Parquet files of the job's table, for a
  read ahead that a later epoch adopts (a job's transform applied by Spark as it copies).

The reads are the source's Kafka connector's (:mod:`connectors.kafka.connector`): Spark's Kafka source,
or the project's data source, whose read ahead copies with pyarrow in a Spark task
(:mod:`connectors.kafka.parquet_copy`) instead of through Spark's rows. Errors are the caller's: a read
that fails raises, and the job decides (back off, or fail on data loss).
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from connectors.kafka.staged import StagedProgress as StagedProgress  # a read ahead's progress
from connectors.observe import arrived, observed
from source_backfill import metrics
from source_backfill.core import HistoryRange, parse_split_id
from source_backfill.core.governor import pieces_for_tasks
from source_backfill.core.tiers import HistorySource, earliest
from source_backfill.errors import DataLossError, SourceBackfillError
from source_backfill.executors.archive_tier import ArchiveTier, TierPlan

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, Observation, SparkSession

    from connectors.delta.archive import ArchiveFile
    from connectors.delta.sink import DeltaEpochSink
    from connectors.delta.staging import StagedFiles
    from connectors.kafka.admin import KafkaAdmin
    from connectors.kafka.connector import KafkaConnector
    from source_backfill.config import SourceConfig

logger = logging.getLogger(__name__)

#: CPU niceness of a Python connector's read-ahead copy (``parquet_copy.write_ranges_parquet``):
#: on a busy machine the live stream's work gets the CPU first; on an idle one the copy runs at full speed.
#: bench_backfill, three runs each: niceness 10 kept live p99 at 1.05-1.15x, niceness 0 at 1.05-1.56x.
READ_AHEAD_NICENESS = 10
#: How long a read ahead waits for its observed counts (an epoch waits ``OBSERVE_TIMEOUT_S``): they only
#: feed the rows shown.
READ_AHEAD_OBSERVE_TIMEOUT_S = 10.0
#: How long a history read's byte count may wait for its action; a read never run counts nothing after.
PENDING_BYTES_S = 600.0


class HistoryReader:
    """Reads history ranges of one source for one job's sink."""

    def __init__(self, spark: SparkSession, source: SourceConfig, admin: KafkaAdmin, *,
                 connector: KafkaConnector, on_data_loss: Callable[[str, int], None] | None = None,
                 history_source: HistorySource = "auto", job: str | None = None) -> None:
        """``connector``: the source's (one per source: the kind is chosen once, by ``connector_for``).

        ``history_source``: the job's (``auto``, ``kafka``, ``archive``); with the source's archive the
        ranges are cut by tier (:mod:`source_backfill.executors.archive_tier`) before they are read.
        ``job``: the job the reads are for (``job_history_broker_bytes_total`` counts under it).
        """
        self.spark = spark
        self.source = source
        self.admin = admin
        self.connector = connector
        self.history_source = history_source
        #: The source's archive as this job reads it; None: Kafka alone (no archive, or ``kafka``).
        self.archive = (ArchiveTier(spark, source.archives, admin, kafka_rows=connector.read_ranges)
                        if source.archives and history_source != "kafka" else None)
        #: ``on_data_loss(split, offsets)``: lost history counted (the job's metrics, which pick the
        #: splits with series of their own); None: the job-level counter only.
        self._on_data_loss = on_data_loss
        #: Per split, the offset below which lost history (under the log start) is already counted.
        self._lost_to: dict[str, int] = {}
        #: History offsets planned per tier (with an archive), as the metric counts them.
        self._tiers_planned: dict[str, int] = {}
        self.job = job
        #: Record bytes the reads fetched from Kafka (:meth:`broker_bytes`), and the observations of
        #: DataFrame reads whose action has not finished yet (with when they were made).
        self._broker_bytes = 0
        self._pending: list[tuple[float, Observation]] = []
        self._bytes_lock = threading.Lock()
        #: Sessions whose file scans are cut into about N partitions, by N (:meth:`_scan_session`).
        self._scan_sessions: dict[int, SparkSession] = {}
        self._scan_lock = threading.Lock()

    def tier_offsets(self) -> dict[str, int] | None:
        """History offsets planned per tier since the reader was made; None without an archive."""
        if self.archive is None:
            return None
        return {tier: self._tiers_planned.get(tier, 0) for tier in ("archive", "kafka", "gap", "loss")}

    def broker_bytes(self) -> int:
        """Record bytes (key + value) the job's history reads fetched from Kafka so far (not the archive's).

        A DataFrame read counts once its first action finished (an observation on its Kafka part, read
        here without waiting); a read that never runs (dropped, failed) counts nothing after
        :data:`PENDING_BYTES_S`.
        """
        now = time.monotonic()
        with self._bytes_lock:
            waiting = []
            for made, observation in self._pending:
                if arrived(observation):
                    try:
                        self._fetched(int(observation.get.get("bytes") or 0))
                    except Exception:  # noqa: BLE001 - a failed action: nothing fetched to count
                        logger.debug("history bytes not observed", exc_info=True)
                elif now - made < PENDING_BYTES_S:
                    waiting.append((made, observation))
            self._pending = waiting
            return self._broker_bytes

    def _fetched(self, n: int) -> None:
        """``n`` record bytes fetched from Kafka: counted (the caller holds ``_bytes_lock``)."""
        self._broker_bytes += n
        if n and self.job is not None:
            metrics.JOB_HISTORY_BROKER_BYTES.labels(self.job).inc(n)

    def _staged_bytes(self, n: int) -> None:
        """A staged copy's bytes, told by the connector once it is done."""
        with self._bytes_lock:
            self._fetched(n)

    def _kafka_rows(self, ranges: Sequence[HistoryRange], session: SparkSession) -> DataFrame:
        """Kafka's records of ``ranges`` (the source's connector), their bytes observed as they are read."""
        from pyspark.sql import Observation
        from pyspark.sql import functions as F  # noqa: N812

        from connectors.kafka.ranges import record_bytes

        rows = self.connector.read_ranges(ranges, session)
        observation = Observation(f"history-bytes-{uuid.uuid4().hex}")
        with self._bytes_lock:
            self._pending.append((time.monotonic(), observation))
        return rows.observe(observation, F.sum(record_bytes()).alias("bytes"))

    def earliest_offsets(self, splits: Sequence[str]) -> dict[str, int]:
        """Each split's first offset history can be read from: Kafka's log start, or the archive's first.

        ``archive``: the archive's first held offset (Kafka's log start where it holds none of a split);
        ``auto``: the lower of the two; ``kafka`` (or no archive): the log start.
        """
        starts = self.admin.earliest_offsets(splits)
        if self.archive is None:
            return starts
        held = self.archive.held()
        return {s: earliest(starts[s], held.get(s, []), self.history_source) for s in splits}

    def offsets_for_timestamp(self, splits: Sequence[str], ts_ms: int) -> dict[str, int]:
        """A timestamp start per split: the first offset at or after ``ts_ms``.

        Kafka's, or the archive's below the log start when it holds such records there (a job reading its
        source's archive).
        """
        if self.archive is None:
            return self.admin.offsets_for_timestamp(splits, ts_ms)
        return self.archive.offsets_for_timestamp(splits, ts_ms)

    def rows(self, ranges: Sequence[HistoryRange], session: SparkSession | None = None) -> DataFrame:
        """The records of ``ranges`` as a DataFrame of ``session`` (default: the reader's).

        With an archive: its part read from the archive, Kafka's from Kafka (one DataFrame, Kafka's
        columns); gaps read nothing; data loss raises :class:`DataLossError` with ``fail_on_data_loss``
        and is skipped without (counted when planned, :meth:`count_data_loss`).
        """
        session = session or self.spark
        self.broker_bytes()  # what earlier reads fetched, counted now that they ran
        if self.archive is None:
            return self._kafka_rows(ranges, session)
        return self._plan_rows(self._tiers(ranges), session)

    def tier_plan(self, ranges: Sequence[HistoryRange]) -> TierPlan | None:
        """``ranges`` cut by tier (None without an archive: Kafka holds them all, or nothing does)."""
        return None if self.archive is None else self._tiers(ranges)

    def _plan_rows(self, plan: TierPlan, session: SparkSession) -> DataFrame:
        """The records of a tier plan: its archive part from the archive, its Kafka part from Kafka."""
        assert self.archive is not None  # noqa: S101 - callers check
        parts = []
        if plan.kafka:
            parts.append(self._kafka_rows(plan.kafka, session))
        if plan.archive or not parts:
            parts.append(self.archive.rows(plan, session))
        rows = parts[0]
        for part in parts[1:]:
            rows = rows.unionByName(part)
        return rows

    def _tiers(self, ranges: Sequence[HistoryRange]) -> TierPlan:
        """``ranges`` cut by tier; data loss with ``fail_on_data_loss`` raises :class:`DataLossError`."""
        assert self.archive is not None  # noqa: S101 - callers check
        plan = self.archive.plan(ranges, self.history_source)
        if plan.loss and self.source.fail_on_data_loss:
            lost = ", ".join(f"{r.split} {r.start}..{r.end - 1}" for r in plan.loss[:5])
            msg = (f"history offsets held by neither the archive nor Kafka (below the log start, outside "
                   f"the archive): {lost}")
            raise DataLossError(msg)
        return plan

    def stage(self, sink: DeltaEpochSink, ranges: Sequence[HistoryRange], after_epoch: int,
              on_folder: Callable[[Path], None] | None = None,
              transform: Callable[[DataFrame], DataFrame] | None = None, *, tasks: int = 1,
              ) -> tuple[StagedFiles, dict[str, int]]:
        """Copy ``ranges`` into staged files of ``sink``'s table; the files and the records per split.

        Runs as ``tasks`` Spark tasks (the source's history width: ``runtime/width.py``; the caller picks
        the job group and the FAIR pool): ranges larger than a task's share are cut into offset pieces
        (:func:`core.governor.pieces_for_tasks`), so a job of few partitions copies as wide too.
        ``on_folder(folder)``: where the files go, told before the copy starts (its files close as it
        goes: :class:`StagedProgress` reads what they hold). ``transform``: the job's transform, applied
        by Spark to the records as they are copied (either connector); without one, the connector
        copies its own way (:meth:`KafkaConnector.stage <connectors.kafka.connector.KafkaConnector.stage>`).
        """
        if self.archive is not None:  # planned by tier once; gaps and skipped loss read nothing
            plan = self._tiers(ranges)
            if plan.archive or not plan.kafka or transform is not None:  # Spark reads (the archive's part)
                plan.kafka = pieces_for_tasks(plan.kafka, tasks)
                whole: list[ArchiveFile] = []
                if transform is None and plan.archive:
                    whole, plan = self.archive.whole_files(plan, sink.staging.takes_whole)
                if not plan.kafka:  # the archive alone
                    return self._stage_archive(sink, plan, after_epoch, on_folder, transform, tasks, whole)
                rows = self._plan_rows(plan, self.spark)
                return self._stage_transformed(sink, rows, ranges, after_epoch, on_folder,
                                               transform or _identity, tasks, whole)
            ranges = plan.kafka
        pieces = pieces_for_tasks(ranges, tasks)
        if transform is not None:
            return self._stage_transformed(sink, self.rows(pieces), pieces, after_epoch, on_folder, transform,
                                           tasks)
        return self.connector.stage(sink, pieces, after_epoch, on_folder, tasks=tasks,
                                    niceness=READ_AHEAD_NICENESS, on_bytes=self._staged_bytes)

    def _stage_transformed(
        self, sink: DeltaEpochSink, rows: DataFrame, ranges: Sequence[HistoryRange], after_epoch: int,
        on_folder: Callable[[Path], None] | None, transform: Callable[[DataFrame], DataFrame], tasks: int,
        whole: Sequence[ArchiveFile] = (),
    ) -> tuple[StagedFiles, dict[str, int]]:
        """``rows`` (the records of ``ranges``, less the ``whole`` files') transformed; records per split.

        A transform may drop or filter rows and columns, so the files cannot tell how many records were
        read; an observation on the records does. When it does not come (a transform that lets Spark
        prune the scan, say) the counts are the ranges' sizes: they feed only the rows shown. ``whole``:
        archive files staged as they are (:meth:`_stage_archive`), their runs counted as theirs.
        """
        counted, observation = count_per_split(rows.coalesce(tasks), ranges, "read-ahead")
        write = self._whole_then(sink, whole, sink.staging.dataframe_write(transform(counted)))
        staged = sink.stage_files(write, after_epoch, on_folder)
        try:
            read = observed(observation, timeout_s=READ_AHEAD_OBSERVE_TIMEOUT_S)
            observed_counts = _with_whole(read, whole)
        except SourceBackfillError:
            observed_counts = range_sizes(ranges)
        return staged, {s: int(n) for s, n in observed_counts.items() if n}

    def _stage_archive(
        self, sink: DeltaEpochSink, plan: TierPlan, after_epoch: int,
        on_folder: Callable[[Path], None] | None, transform: Callable[[DataFrame], DataFrame] | None,
        tasks: int, whole: Sequence[ArchiveFile] = (),
    ) -> tuple[StagedFiles, dict[str, int]]:
        """A plan with no Kafka part: the archive's rows transformed, in ``tasks`` tasks, counted exactly.

        The records per split are what the archives hold of the plan's ranges at their pinned versions
        (:meth:`ArchiveTier.held_counts`: each held offset is one record, the holdings refuse an offset
        held twice), so no observation is needed; and the scan itself is cut into about ``tasks``
        partitions (``spark.sql.files.maxPartitionNum`` on a session of the reader's) instead of being
        coalesced into them: coalescing the scan's splits left one task with more of them than the other.

        ``whole``: the archive's data files taken out of the plan by :meth:`ArchiveTier.whole_files` (a
        job without a transform; each holds exactly a run of the offsets to copy, with the sink's columns):
        they are staged as they are, linked (:meth:`EpochStaging.link_files`), and only the rest of the
        plan is read. A file's rows are the records its run's read would write: the copy is the same,
        without decoding and encoding them.
        """
        assert self.archive is not None  # noqa: S101 - callers check
        spark_write = None
        if plan.archive or not whole:
            rows = self.archive.rows(plan, self._scan_session(tasks))
            spark_write = sink.staging.dataframe_write((transform or _identity)(rows))
        write = self._whole_then(sink, whole, spark_write)
        staged = sink.stage_files(write, after_epoch, on_folder)
        counts = _with_whole(self.archive.held_counts(plan), whole)
        return staged, {s: n for s, n in counts.items() if n}

    def _whole_then(self, sink: DeltaEpochSink, whole: Sequence[ArchiveFile],
                    spark_write: Callable[[Path], None] | None) -> Callable[[Path], None]:
        """A staged write: the ``whole`` archive files linked into the folder, then Spark's write, if any."""
        def write(folder: Path) -> None:
            if whole:
                copied = sink.staging.link_files([Path(f.path) for f in whole], folder)
                if self.job is not None:
                    metrics.JOB_HISTORY_WHOLE_FILES.labels(self.job).inc(len(whole))
                logger.info('archive files staged whole job="%s" files=%d offsets=%d bytes_copied=%d',
                            self.job, len(whole), sum(f.end - f.start for f in whole), copied)
            if spark_write is not None:
                spark_write(folder)

        return write

    def _scan_session(self, tasks: int) -> SparkSession:
        """A session of the reader's Spark whose file scans are cut into about ``tasks`` partitions."""
        with self._scan_lock:
            session = self._scan_sessions.get(tasks)
            if session is None:
                session = self.spark.newSession()
                session.conf.set("spark.sql.files.maxPartitionNum", str(max(1, tasks)))
                self._scan_sessions[tasks] = session
            return session

    def count_data_loss(self, job: str, ranges: Iterable[HistoryRange]) -> None:
        """With ``fail_on_data_loss = false`` the readers skip history below the log start: count it.

        Counted when the read is planned, from the log start then (one ListOffsets); offsets a deletion
        removes while a read is already running are skipped by the reader but not counted.
        """
        ranges = list(ranges)
        if not ranges:
            return
        if self.archive is not None:
            try:
                plan = self.archive.plan(ranges, self.history_source)
            except Exception:  # noqa: BLE001 - the read plans again, and its error is the job's
                logger.debug("history tiers not planned for counting", exc_info=True)
                return
            for tier, offsets in plan.sizes().items():
                self._tiers_planned[tier] = self._tiers_planned.get(tier, 0) + offsets
                if offsets:
                    metrics.JOB_HISTORY_TIER_OFFSETS.labels(job, tier).inc(offsets)
            if plan.gap:
                logger.info('history gaps in the archive below the log start, nothing read job="%s" '
                            'offsets=%d first="%s %d..%d"', job, plan.sizes()["gap"], plan.gap[0].split,
                            plan.gap[0].start, plan.gap[0].end - 1)
            if self.source.fail_on_data_loss:
                return
            losses = [(r.split, r.start, r.end) for r in plan.loss]
        else:
            if self.source.fail_on_data_loss:
                return
            log_start = self.admin.earliest_offsets(sorted({r.split for r in ranges}))
            losses = [(r.split, r.start, min(log_start.get(r.split, r.start), r.end)) for r in ranges]
        for split, start, end in losses:
            first = max(start, self._lost_to.get(split, start))
            lost_end = end
            if lost_end > first:
                self._lost_to[split] = lost_end
                if self._on_data_loss is not None:
                    self._on_data_loss(split, lost_end - first)
                else:
                    metrics.JOB_DATA_LOSS.labels(job).inc(lost_end - first)
                logger.warning('history lost, skipped job="%s" split="%s" offsets="%d..%d" held_from=%d',
                               job, split, first, lost_end - 1, lost_end)


def _identity(df: DataFrame) -> DataFrame:
    """No transform: the rows as read (an archive's part staged through Spark)."""
    return df


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


def _with_whole(counts: Mapping[str, int], whole: Sequence[ArchiveFile]) -> dict[str, int]:
    """Records per split of a staged read: ``counts`` (what was read) plus the runs of the ``whole`` files."""
    out = dict(counts)
    for f in whole:
        out[f.split] = out.get(f.split, 0) + f.end - f.start
    return out


def count_per_split(rows: DataFrame, ranges: Sequence[HistoryRange],
                    name: str) -> tuple[DataFrame, Observation]:
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
