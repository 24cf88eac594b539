"""Per-job source backfill: the core decides, Spark moves the rows, the Delta sink commits.

One :class:`SourceBackfillJob` per job. At every epoch of its source (one micro-batch of the live
stream) :meth:`SourceBackfillJob.run_epoch`:

1. plans from the committed states ``S(e-1)`` and the batch's per-split offset stats (core, pure);
2. keeps the live rows the plan emits (a per-split ``offset > threshold`` filter, none for a split
   still backfilling, all once it is finished);
3. reads the planned history ranges with the Kafka batch source (each range is emitted whole: the
   planner never plans a history row the rules would drop);
4. applies the job's transform and commits output + ``S(e)`` + plan to Delta in one transaction.

No commit without a change: an epoch that adds no row and moves no split's state but targets of splits
still backfilling and live positions (a Finished job on an idle topic, a rate-limited job waiting for its
allowance while the live stream moves its targets) commits nothing; it is still *processed*
(``processed_epoch``: progress, metrics and the missed-epochs check go on), its states kept in memory;
a crash rejoins from the last commit (``core.plan.rejoin``), which rebuilds what was not committed. A
commit carries the state of the splits that moved since the last commit (a delta over the job's last
snapshot, :mod:`source_backfill.core.state_log`) and a full snapshot every ``SnapshotPolicy.every``
commits, when most splits moved, and before half the table's log retention has passed since the last
one (so Delta's log cleanup never takes the state of an idle job).

A history-read error never stops the live stream: the epoch commits its live part with the history
states unchanged, the error is counted, and history resumes after a backoff from the committed offsets.

Read-ahead (the default): step 3 moves out of the epoch. A background Spark job (FAIR pool
``history``, one task) copies the next ranges, planned from the committed states, from Kafka into
staged Parquet files of the table (Spark's Kafka source written by Spark, the job's transform applied
on the way; the Python connector without a transform copies with its reader and pyarrow, skipping
Spark's row conversion: a third of the CPU). The next epoch adopts
the reads that are done (:func:`core.adopt_history` checks they still continue every split) and
commits their files with its live rows and ``S(e)`` in one transaction. Reads chain (each continues
where the one before it ends), so history is read while the live stream waits for its trigger; a read
that no longer fits is thrown away and read again; when what is left fits one epoch's budget, the
epoch reads it itself and the job finishes.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any

from connectors.observe import observed
from source_backfill import metrics
from source_backfill.config import (
    EarliestStart,
    JobSpec,
    LatestStart,
    OffsetsStart,
    SourceConfig,
    TimestampStart,
)
from source_backfill.core import (
    EpochPlan,
    HistoryRange,
    JobProgressSummary,
    LiveStats,
    SplitChange,
    SplitState,
    Stage,
    adopt_history,
    ahead_of,
    attach,
    budget_after_adopted,
    finish_epoch,
    is_backfill_done,
    is_finish_reported,
    job_progress,
    plan_epoch,
    reconcile_splits,
    rejoin,
    split_id,
)
from source_backfill.core.columnar import SplitTable
from source_backfill.core.latency import Latencies, LatencyWindow, merge
from source_backfill.core.state_log import SnapshotPolicy
from source_backfill.errors import (
    ArchiveError,
    DecodeFailedError,
    JobError,
    ReaderOutgrownError,
    SourceBackfillError,
    SparkWorkTimeoutError,
    one_line,
)
from source_backfill.executors.accounting import JobMetrics, Rates, live_latencies
from source_backfill.executors.commit_gate import CommitGate
from source_backfill.executors.decoding import (
    DeadLetters,
    JobDecoding,
    Readers,
    decode_failure,
    unseen_writer,
)
from source_backfill.executors.history import (
    HistoryReader,
    count_per_split,
    is_data_loss,
    range_sizes,
)
from source_backfill.executors.job import HeldByQuota
from source_backfill.executors.job_log import JobLog
from source_backfill.executors.live_filter import live_rows, live_rows_arrow
from source_backfill.executors.pacing import HistoryPace
from source_backfill.executors.read_ahead import Adopted, ReadAhead, ReadsAhead, within_cap
from source_backfill.executors.transform import apply_transform, check_transform

if TYPE_CHECKING:
    from pathlib import Path

    import pyarrow as pa
    from pyspark.sql import DataFrame, Observation, SparkSession
    from pyspark.sql.types import StructType

    from connectors.delta.committer import CommitResult
    from connectors.delta.sink import Recovered
    from connectors.delta.staging import StagedFiles
    from connectors.kafka.admin import KafkaAdmin
    from connectors.kafka.connector import KafkaConnector
    from source_backfill.core.schema_evolution import Record
    from source_backfill.executors.history_gate import HistoryGate
    from source_backfill.executors.job import ByteQuota
    from source_backfill.executors.spark_work import SparkWork

logger = logging.getLogger(__name__)

#: The key of a commit's plan that records the ids of the source's topics (issue 49).
TOPIC_IDS = "topic_ids"

#: An epoch writing at most this many rows writes them as one file (one Spark task).
_SMALL_OUTPUT_ROWS = 50_000


@dataclass(frozen=True)
class EpochInput:
    """What the source hands every job at epoch ``epoch``."""

    epoch: int
    batch: DataFrame
    #: Per split: first/last offset and row count of the live batch, and the exclusive end position.
    live: Mapping[str, LiveStats]
    #: Exclusive live positions per split before / after this batch (``start`` None: unknown).
    start: Mapping[str, int] | None
    end: Mapping[str, int]
    interval_s: float
    #: The live batch's rows on the driver when the batch is small (None: only ``batch``).
    rows: pa.Table | None = None


@dataclass(frozen=True)
class _Written:
    """An epoch's rows written and committed: what the commit paths hand back to :meth:`_committed`."""

    #: The sink's outcome (``committed`` False: the epoch was in the table already).
    result: CommitResult
    #: The plan as committed (without its history when the history read failed).
    plan: EpochPlan
    #: History rows read in the epoch, per split.
    counts: dict[str, int]
    #: The split states the commit carries.
    states: SplitTable
    #: Seconds the epoch's own history read took (counted while written: the write's).
    read_s: float


class SourceBackfillJob(HeldByQuota):
    """One job on a shared Kafka source: split state machines, history reads and exactly-once commits."""

    def __init__(
        self,
        spec: JobSpec,
        source: SourceConfig,
        spark: SparkSession,
        admin: KafkaAdmin,
        *,
        connector: KafkaConnector,
        work: SparkWork | None = None,
    ) -> None:
        from connectors.delta.sink import DeltaEpochSink

        self.spec = spec
        self.source = source
        self.spark = spark
        self.admin = admin
        #: Runs the job's Spark work under its tag and deadline (None: directly, as in unit tests).
        self._work = work
        self.paused = False
        self.rate_limit: float | None = spec.rate_limit
        self.failed: str | None = None
        #: The job's split states, as columns (the planner's form; a mapping for everything else): those of
        #: its last commit, or of a later epoch whose only moves need no commit (``_quiet``).
        self.states: SplitTable | None = None
        #: The split states of the job's last commit (what its table holds; its log's deltas are against
        #: them). ``states`` differs from them only by targets of splits not Finished.
        self._log_base: SplitTable | None = None
        self.committed_epoch: int | None = None
        #: The last epoch the job processed: committed, or with nothing to commit (no change).
        self.processed_epoch: int | None = None
        #: Where the live stream stood after the last epoch the job processed (its ``end``): a batch that
        #: does not start there is not contiguous with the job's output, and the job realigns by offsets
        #: (``core.plan.rejoin``) before it plans. Empty before the attach.
        self.live_to: dict[str, int] = {}
        #: Stopped by a drop, a retry, a failure or the daemon stopping: no commit of the job lands after.
        self._gate = CommitGate(self.name)
        self._rates = Rates()
        #: The rate limit's allowance, the epoch's history budget, the backoff after read errors.
        self._pace = HistoryPace(self._rates)
        self._metrics = JobMetrics(spec.name)
        #: Live latency of the rows committed in the last minute (core.latency: p50/p99 for the API).
        self.latency = LatencyWindow()
        self._interval_s = source.trigger_interval_s
        self.history = HistoryReader(spark, source, admin, connector=connector,
                                     on_data_loss=self._metrics.data_loss, history_source=spec.history_source,
                                     job=spec.name)
        #: Decoding by schema id before the transform (None: the raw Kafka columns; ``jobs[].format``).
        self.decoding = JobDecoding.open(spec, source)
        self.dead_letters = DeadLetters(spec) if self.decoding is not None and self.decoding.dead_letter \
            else None
        self.sink = DeltaEpochSink(spec.sink_path, spec.name, self.output_schema(), writer=spec.writer,
                                   on_conflict=metrics.COMMIT_CONFLICTS.labels(spec.name).inc,
                                   extra_properties=None if self.decoding is None
                                   else self.decoding.properties())
        self.reads_ahead = spec.read_ahead and self.sink.writes_before_commit()
        #: A decoding job's readers when a read ahead met records they do not cover (or that do not
        #: decode): its history is read in its epochs until an epoch grows them (or fails the job).
        self._inline_under: Readers | None = None
        #: Set by the source while the job had Spark work in flight at the JVM's last death: its epochs
        #: run alone and start no read ahead, so none of its work is in flight beside another job's.
        self.alone = False
        #: Spark tasks the job's next history copy may run: its share of the source's history width, set
        #: by the source before each epoch (``runtime/width.py``).
        self.history_tasks = 1
        #: The source's history slots its reads ahead take in turn (None: no turns, as in unit tests).
        self.gate: HistoryGate | None = None
        #: The namespace's table bytes of the day (None: its namespace bounds none): counted after each
        #: commit; while held, the job's history waits as if paused (its live rows still commit).
        self.quota: ByteQuota | None = None
        #: The source's topic ids (``check_topics``), recorded in each commit's plan; empty: unknown.
        self.topic_ids: dict[str, str] = {}
        #: The ids the table's newest commit recorded (None: none recorded).
        self.recorded_topic_ids: dict[str, str] | None = None
        #: The live latencies the job committed since the width governor last took them (its lane's steps
        #: end when they end: a slow job's may end between two of the source's epochs, and were lost when
        #: each step started by clearing them).
        self._unsteered: list[Latencies] = []
        self._unsteered_lock = threading.Lock()
        #: History was copied in the job's last epoch (read in it, or a read ahead running or adopted).
        self.copying = False
        self._reads = ReadsAhead(spec.name, spark, self.sink, work=self.spark_work)
        #: The states a read started before the attach plans from (:meth:`read_early`); None once attached.
        self._early: SplitTable | None = None
        #: What the job's commits carry of its state: the log chain, the live positions covered.
        self.log = JobLog(SnapshotPolicy(max_age_s=self.sink.log_retention_s() / 2))
        recovered = self.sink.recover()
        if recovered is not None:
            self._recover(recovered)
            assert self.states is not None  # noqa: S101 - set by _recover
            self._rates.rows_history = int(self.states.rows.sum())
            logger.info(
                'job recovered job="%s" epoch=%d splits=%d finished=%s version=%d base=%s',
                spec.name, recovered.epoch, len(self.states), is_backfill_done(self.states),
                recovered.version, None if self.log.chain is None else self.log.chain.base,
            )
        self._rates.copied.observe(time.monotonic(), self._rates.rows_history)  # the rate's first point

    def _recover(self, recovered: Recovered) -> None:
        """States, covered positions and the log chain from the job's newest commit (and those it names)."""
        ids = (recovered.plan or {}).get(TOPIC_IDS)
        if isinstance(ids, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in ids.items()):
            self.recorded_topic_ids = dict(ids)
        self.states = self._log_base = self.log.recover(self.sink, recovered)
        self.committed_epoch = recovered.epoch
        self.processed_epoch = None
        self.live_to = dict(self.log.covered_to)

    def check_topics(self, ids: Mapping[str, str]) -> None:
        """Take the source's topic ids (each commit records them); JobError if the table's are others.

        A topic deleted and created again keeps its name and gets a new id (its offsets start at 0): a
        table written from the old topic must not resume at its offsets in the new log. A table whose
        commits recorded no ids (written before they were, or by a job that never committed) is taken as
        it is; its next commit records them.
        """
        self.topic_ids = dict(ids)
        recorded = self.recorded_topic_ids or {}
        changed = sorted(t for t in recorded if t in ids and ids[t] != recorded[t])
        if changed:
            what = "; ".join(f"topic {t} (id {recorded[t]} in the table, {ids[t]} now)" for t in changed)
            msg = (f'job "{self.name}": its table was written from another topic of the same name: {what}. '
                   "The topic was deleted and created again; retry the job into a new table (jobs retry "
                   f"{self.name} --from earliest --new-table) "
                   "(docs/guides/kafka-failures.md)")
            raise JobError(msg)

    @property
    def last_error(self) -> str | None:
        """The last history read error while backing off (None after a good read)."""
        return self._pace.last_error

    @property
    def name(self) -> str:
        """The job's name (also its Delta transaction app id)."""
        return self.spec.name

    # -- schema and transform ---------------------------------------------------------------------------
    def output_schema(self, reader: Record | None = None) -> StructType:
        """The schema of the job's table: its transform (checked first) applied to its input's schema.

        The input: the Kafka columns, or for a decoding job those decoded under ``reader`` (its current
        reader schema by default).
        """
        from connectors.kafka.ranges import kafka_schema

        if self.spec.transform is not None:
            check_transform(self.spark, self.spec.transform)
        if self.decoding is not None:
            empty = self.decoding.empty_input(self.spark, reader)
        else:
            empty = self.spark.createDataFrame([], kafka_schema())
        return apply_transform(self.spark, self.spec.transform, empty).schema

    def transform(self, df: DataFrame, *, ahead: Readers | None = None, seen_only: bool = False,
                  epoch: int | None = None) -> DataFrame:
        """The job's rows from Kafka rows: decoded by schema id (a decoding job), then its SQL transform.

        ``ahead``: a read ahead's, decoded onto the readers it was started under, growing nothing;
        ``seen_only``: its records taken to be of writer ids seen before; ``epoch``: its dead letters'
        (:meth:`JobDecoding.decode`).
        """
        if self.decoding is not None:
            df = self.decoding.decode(df, self.sink, self.output_schema, self.dead_letters, ahead=ahead,
                                      seen_only=seen_only, epoch=epoch)
        return apply_transform(self.spark, self.spec.transform, df)

    @property
    def shapes_rows(self) -> bool:
        """The job's rows are not the Kafka rows as they are (a transform, or decoding)."""
        return self.spec.transform is not None or self.decoding is not None

    def retransform(self, spec: JobSpec) -> None:
        """Take the job's new transform (``spec``: the job's spec with it) from this epoch on.

        Reads ahead staged with the old transform are thrown away (read again with the new one); the
        registry checked that the new transform gives the table its columns.
        """
        self.spec = spec
        self._reads.drop()
        logger.info('job transform changed job="%s" transform=%s', self.name,
                    "identity" if spec.transform is None else f"{len(spec.transform)} chars")

    # -- attach ----------------------------------------------------------------------------------------
    def attach(self, inp: EpochInput) -> None:
        """Create the split state machines at this epoch's live position ``P`` (the batch's start)."""
        if inp.start is None:
            msg = "attach needs the exact live position at the start of the batch"
            raise JobError(msg)
        states = self._attached_at({s: inp.start.get(s, 0) for s in sorted(inp.end)})
        with self._reads.lock:
            self.states = states
            self._early = None
        logger.info(
            'job attached job="%s" epoch=%d splits=%d nothing_to_backfill=%d',
            self.name, inp.epoch, len(states), states.count(Stage.FINISHED),
        )

    def _attached_at(self, positions: Mapping[str, int]) -> SplitTable:
        """The job's initial split states at the live ``positions`` (its start offsets resolved)."""
        splits = sorted(positions)
        return SplitTable.from_states(attach(splits, positions, self.start_offsets(splits, positions)))

    def read_early(self, positions: Mapping[str, int]) -> None:
        """Before the attach: start reading ahead the history below ``positions``.

        ``positions``: where the live stream's next batch starts (its last batch's end offsets). The
        epoch that attaches the job starts at or above them, so the offsets below them are history to it
        whichever epoch that is: the read need not wait for the attach (one trigger interval). The attach
        adopts what was read where it continues from each split's start and stays below its target
        (:func:`core.adopt_history` checks it, as for every read ahead); a read that does not fit (the log
        start moved meanwhile, say) is thrown away and read again.
        """
        if self.states is not None or not self.reads_ahead or not positions or self.failed is not None:
            return
        early = self._attached_at(positions)
        with self._reads.lock:
            if self.states is not None:  # attached meanwhile: its reads ahead start after its epoch
                return
            self._early = early
        self._read_ahead()

    def start_offsets(self, splits: list[str], positions: Mapping[str, int]) -> dict[str, int]:
        """The job's first offset per split by its start, at most the live position ``positions``."""
        start = self.spec.start
        earliest = self.history.earliest_offsets(splits)  # the archive's first offsets, if it has one
        if isinstance(start, EarliestStart):
            chosen = dict(earliest)
        elif isinstance(start, OffsetsStart):
            chosen = {s: max(start.offsets.get(s, earliest[s]), earliest[s]) for s in splits}
        elif isinstance(start, TimestampStart):
            chosen = self.history.offsets_for_timestamp(splits, start.timestamp_ms)  # the archive's too
        elif isinstance(start, LatestStart):
            chosen = dict(positions)  # the live stream covers everything from here
        else:  # pragma: no cover - the config union is closed
            msg = f"unknown start {start!r}"
            raise JobError(msg)
        # A start beyond the live position has nothing to backfill: the live stream covers it.
        return {s: min(chosen.get(s, positions[s]), positions[s]) for s in splits}

    # -- the epoch -------------------------------------------------------------------------------------
    def run_epoch(self, inp: EpochInput) -> bool:
        """Process epoch ``inp.epoch``; return whether it committed.

        False: it was committed already (a replay), or nothing changed (nothing to commit).
        """
        if self.failed is not None:
            return False
        if self.committed_epoch is not None and self.committed_epoch >= inp.epoch:
            logger.info('epoch already committed, skipped job="%s" epoch=%d', self.name, inp.epoch)
            return False
        t0 = time.monotonic()
        if self.states is None:
            self.attach(inp)
        assert self.states is not None  # noqa: S101 - set by attach
        states: SplitTable = self.states
        last = self.processed_epoch if self.processed_epoch is not None else self.committed_epoch
        reconciled, changes = reconcile_splits(states, sorted(inp.end))
        states = SplitTable.from_states(reconciled)
        for change, count in _count_changes(changes).items():
            metrics.SPLIT_CHANGES.labels(self.name, change).inc(count)
        if inp.start:
            covered = {**self.live_to, **self._born_unseen(inp, changes)}
            if any(covered.get(s, p) != p for s, p in inp.start.items()) or (
                    last is not None and last < inp.epoch - 1):
                # the batch does not start where the job's output ends: it missed epochs (its lane was
                # busy while the source went on, it was restarted or re-created on its table): history
                # covers them, by offsets. Epochs processed with no change moved no emitted position,
                # so after those the rejoin plans nothing to read.
                states = SplitTable.from_states(rejoin(states, covered, inp.start))
                metrics.JOB_REJOINS.labels(self.name).inc()
                logger.info('job rejoins by offsets job="%s" last_epoch=%s epoch=%d', self.name, last,
                            inp.epoch)

        self._interval_s = inp.interval_s
        budget = self._budget(inp.interval_s)
        ahead = Adopted()
        if self.reads_ahead:
            states, ahead = self._adopt_reads(inp, states, budget)
        # the caps hold for the epoch: what it adopted counts against the rate limit and max rows
        budget = budget_after_adopted(budget, sum(r.size for r in ahead.ranges),
                                      max_rows_per_epoch=self.spec.max_rows_per_epoch)
        plan = plan_epoch(states, inp.live, budget, inp.end)
        if self.reads_ahead and plan.history and not self._reads_inline(plan, budget, ahead):
            plan = plan.without_history()  # the reads ahead take the history
        self._pace.spend(sum(r.size for r in plan.history))
        self.copying = bool(plan.history or ahead.reads or self._reads.in_flight_besides(ahead.reads))

        kept = self._quiet(inp, plan, ahead)
        if kept is not None:
            return self._skipped(inp, plan, t0, kept)
        self.history.count_data_loss(self.name, plan.history)
        if inp.rows is not None and not plan.history and not self.shapes_rows \
                and self.sink.writes_before_commit():
            # the live batch is on the driver already (a small batch): its rows are written with
            # pyarrow, no Spark job per job and epoch (the caught-up trigger's hot path)
            batch = inp.rows
            written = self._commit(inp, plan, budget, ahead, lambda: live_rows_arrow(batch, plan.emit_above),
                                   {}, read_s=0.0)
        elif not plan.history and self.sink.writes_before_commit() and _output_rows_bound(inp, plan, {}) == 0:
            # no row to write (an attach; an epoch adopting reads ahead): the commit carries the state and
            # the staged files alone, and no Spark job runs for the job's transform or decoding
            schema = self.sink.arrow_schema
            written = self._commit(inp, plan, budget, ahead, schema.empty_table, {}, read_s=0.0)
        else:
            if self.dead_letters is not None:
                self.dead_letters.epoch = inp.epoch
            with self.spark_work(f"epoch {inp.epoch}"):
                try:
                    written = self._write_epoch(inp, plan, budget, ahead)
                except Exception as exc:
                    failure = None if self.decoding is None else decode_failure(self.name, exc)
                    if failure is not None:
                        raise failure from None
                    raise
        return self._committed(inp, written, ahead, t0)

    def _born_unseen(self, inp: EpochInput, changes: Iterable[SplitChange] | None) -> dict[str, int]:
        """Splits new to the job whose first batch it did not see: their log start, where output begins.

        A new partition joins Finished (the live stream reads it from its log start); a job that skipped
        the batch that first read it (its lane busy) would miss the records before this batch: the
        rejoin reads them, from the log start.
        """
        added = [c.split for c in changes or () if c.kind == "added"]
        start = inp.start or {}
        unseen = [s for s in added if start.get(s, 0) > 0] if self.live_to else []
        if not unseen:
            return {}
        earliest = self.history.earliest_offsets(unseen)
        return {s: earliest[s] for s in unseen if earliest.get(s, 0) < start[s]}

    @property
    def stopped(self) -> str | None:
        """Why the job's lane was stopped (dropped, retried, failed, the daemon stopping); None: running."""
        return self._gate.stopped

    def stop_lane(self, why: str, timeout_s: float = 30.0) -> bool:
        """No commit of the job lands from now on: its Spark work in flight is cancelled (by its job tag).

        Returns once a commit in flight has ended (or failed under the cancel), False if that took more
        than ``timeout_s`` (the commit may still land: the caller says so).
        """
        work = self._work
        return self._gate.stop(why, timeout_s, None if work is None else partial(work.cancel, self.name))

    def committing(self) -> AbstractContextManager[None]:
        """Held around each write that commits to the job's table (an epoch's, a repair's).

        Refused (:class:`LaneStoppedError`) once the job's lane is stopped: a drop or a stop that has taken
        the gate's lock (:meth:`stop_lane`) sees no commit of the job land after it.
        """
        return self._gate.committing()

    def spark_work(self, what: str, kind: str = "epoch") -> AbstractContextManager[None]:
        """The job's Spark work: under its own job tag and deadline, marked while it runs (when managed)."""
        if self._work is None:
            return nullcontext()
        return self._work.running(self.name, what, self.source.job_timeout_s, kind)

    def _write_epoch(self, inp: EpochInput, plan: EpochPlan, budget: int, ahead: Adopted) -> _Written:
        """The epoch's rows as Spark writes them (live, history read in it, the transform), committed.

        History is counted in one pass while it is written (the state is then taken after the write),
        where the sink writes before it commits and there is no transform: a transform could let Spark
        prune the history scan, and its observed counts would never come. Otherwise it is cached and
        counted before the commit.
        """
        live = live_rows(self.spark, inp.batch, plan.emit_above)
        observe = bool(plan.history) and not self.shapes_rows and self.sink.writes_before_commit()
        history, counts, read_s, observation = self._read_history(
            plan.history, observe=observe, session=live.sparkSession
        )
        if history is None:
            plan = plan.without_history()  # nothing read: no range may complete
            out = live
        else:
            out = live.unionByName(history)
        bound = _output_rows_bound(inp, plan, counts if observation is None else range_sizes(plan.history))
        if bound <= _SMALL_OUTPUT_ROWS:
            out = out.coalesce(1)  # one task and one file instead of one per split for a small epoch
        try:
            if observation is None:
                return self._commit(inp, plan, budget, ahead, lambda: self.transform(out), counts,
                                    read_s=read_s)
            seen = observation
            return self._commit(inp, plan, budget, ahead, lambda: self.transform(out),
                                lambda: {s: int(n) for s, n in observed(seen).items() if n},
                                live_only=lambda: self.transform(live))
        finally:
            if history is not None and observation is None:
                history.unpersist()

    def _commit(
        self, inp: EpochInput, plan: EpochPlan, budget: int, ahead: Adopted,
        rows: Callable[[], DataFrame | pa.Table], counts: Mapping[str, int] | Callable[[], dict[str, int]],
        *, read_s: float | None = None, live_only: Callable[[], DataFrame] | None = None,
    ) -> _Written:
        """The one commit path: rows, adopted reads' files, ``S(e)`` and the plan summary in one commit.

        An epoch already in the table (a replay) commits nothing: ``result.committed`` is False.

        ``counts``: the history rows read in the epoch per split, or a callable giving them once the rows
        are written (history counted while written; the state is taken after the write, where the sink
        writes before it commits). ``read_s``: seconds the epoch's history read took (None: the commit's,
        for history counted while written). ``live_only``: the epoch's live rows alone, committed instead
        when the write fails before its history was counted; the failure is then taken for a history
        read error (counted, backed off; a data loss fails the job). Adopted reads are thrown away if no
        commit lands.
        """
        t0 = time.monotonic()
        taken: dict[str, Any] = {}

        def state() -> dict[str, Any]:
            taken["counts"] = dict(counts() if callable(counts) else counts)
            taken["states"] = finish_epoch(plan, taken["counts"])
            return self.log.state_doc(self._log_base, taken["states"], plan.end)

        try:
            try:
                with self.committing():
                    result = self.sink.commit_epoch(
                        inp.epoch, rows(), state if self.sink.writes_before_commit() else state(),
                        plan=self._plan_summary(plan, budget, ahead), staged=ahead.staged)
            except Exception as exc:
                if live_only is None or isinstance(exc, SourceBackfillError) or "states" in taken:
                    raise  # the rows were written (or the sink refused): not the history read's fault
                self._history_error(exc)
                return self._commit(inp, plan.without_history(), budget, ahead, live_only, {}, read_s=0.0)
        except Exception:
            if ahead.reads:
                self._reads.drop()  # the adopted ones' files too, unless the failed attempt took them
            raise
        seconds = time.monotonic() - t0 if read_s is None else read_s
        if "states" not in taken:  # the epoch was in already (a replay): nothing was counted
            known = {} if callable(counts) else dict(counts)
            return _Written(result, plan, known, finish_epoch(plan, known), seconds)
        if plan.history:
            self._history_ok()
        return _Written(result, plan, taken["counts"], taken["states"], seconds)

    def _plan_summary(self, plan: EpochPlan, budget: int, ahead: Adopted) -> dict[str, Any]:
        """What the commit records of the plan, and the ids of the topics its offsets belong to."""
        summary = self.log.plan_summary(plan, budget, ahead.ranges)
        if self.topic_ids:
            summary[TOPIC_IDS] = dict(sorted(self.topic_ids.items()))
        return summary

    def _committed(self, inp: EpochInput, written: _Written, ahead: Adopted, t0: float) -> bool:
        """After the commit (or its skip): states, adopted reads, accounting, the next read ahead."""
        result, plan, counts = written.result, written.plan, written.counts
        if result.committed:
            self._live_latency(inp, plan, time.time())
            with self._reads.lock:  # the adopted reads leave the list as the states take them in
                self.states = self._log_base = written.states
                self._reads.retire(ahead.reads)
            if ahead.reads:
                metrics.HISTORY_READS_AHEAD.labels(self.name, "adopted").inc(len(ahead.reads))
            self.log.landed(result.version, inp.end)
            if self.quota is not None:
                self.quota.count(self.name, self.spec.namespace, self.spec.sink_path, result.version)
        else:  # another attempt committed this epoch first: its state is the truth
            if ahead.reads:
                self._reads.drop()
            recovered = self.sink.recover()
            if recovered is not None:
                self._recover(recovered)
        self.committed_epoch = inp.epoch
        self.processed_epoch = inp.epoch
        self.live_to = dict(inp.end)
        elapsed = time.monotonic() - t0
        inline = (sum(counts.values()), written.read_s)
        if result.committed:
            counts = _add_counts(dict(counts), ahead.counts)
        self._account(inp, plan, counts, inline, elapsed, committed=result.committed)
        if self.reads_ahead:
            self._read_ahead()
        return bool(result.committed)

    def _live_latency(self, inp: EpochInput, plan: EpochPlan, committed_at: float) -> None:
        """The epoch's live rows are committed now: their latency (core.latency) to metric and window.

        A measurement that fails is logged, never the epoch's failure: its commit is done.
        """
        try:
            latencies, kind = live_latencies(inp.live, plan.emit_above, inp.rows, committed_at * 1000)
        except Exception as exc:  # noqa: BLE001 - observability only
            logger.warning('live latency not measured job="%s" epoch=%d error="%s"', self.name, inp.epoch,
                           one_line(exc))
            return
        self._metrics.latency(latencies)
        self.latency.add(time.monotonic(), latencies, kind)
        with self._unsteered_lock:
            self._unsteered.append(latencies)

    def take_latencies(self) -> Latencies:
        """The live latencies committed since the last call (the width governor's, after each epoch)."""
        with self._unsteered_lock:
            parts, self._unsteered = self._unsteered, []
        return merge(parts) if parts else Latencies.empty()

    def _quiet(self, inp: EpochInput, plan: EpochPlan, ahead: Adopted) -> SplitTable | None:
        """The epoch's states when it has nothing to commit, else None.

        Nothing to commit: no row and no history, and since the job's last commit no split state moved
        but the targets of splits not Finished, whatever live positions moved, and no snapshot is due by
        age (``JobLog.unrecorded``). A backfilling job whose rate limit holds its history back sees its
        targets follow the live stream every epoch: those are kept in memory, not committed. After a
        crash the job recovers its last commit, which missed the epochs since, and rejoins
        (``core.plan.rejoin``): every target rises to the live position, and history covers the live
        rows those epochs dropped, so none is lost; the next commit's delta carries every move since the
        last (it is taken against ``_log_base``).
        """
        if plan.history or ahead.reads or ahead.staged or _output_rows_bound(inp, plan, {}) > 0:
            return None
        new = finish_epoch(plan, {})
        return new if self.log.unrecorded(self._log_base, new, plan.end) else None

    def _skipped(self, inp: EpochInput, plan: EpochPlan, t0: float, states: SplitTable) -> bool:
        """An epoch with nothing to commit is processed all the same (progress, metrics, read ahead)."""
        self.states = states
        self.processed_epoch = inp.epoch
        self.live_to = dict(inp.end)
        self._account(inp, plan, {}, (0, 0.0), time.monotonic() - t0, committed=False, unchanged=True)
        if self.reads_ahead:
            self._read_ahead()
        return False

    def _budget(self, interval_s: float) -> int:
        """History offsets one epoch may read now (0 in a read-error backoff)."""
        return self._pace.epoch_budget(rate_limit=self.rate_limit, interval_s=interval_s,
                                       max_rows_per_epoch=self.spec.max_rows_per_epoch,
                                       paused=self.history_waits)

    # -- read-ahead ------------------------------------------------------------------------------------
    def _adopt_reads(
        self, inp: EpochInput, states: SplitTable, budget: int
    ) -> tuple[SplitTable, Adopted]:
        """The states after the reads ahead done by now (they apply before this epoch's live batch).

        Reads that no longer fit (or one that failed) are thrown away with those chained on them; at
        budget 0 (paused, rate 0, backing off) none is adopted and none stays in flight.
        """
        taken = within_cap(self._reads.done(), self.spec.max_rows_per_epoch)
        error = next((a.error for a in taken if a.error is not None), None)
        if error is not None and self._decodes_inline(error):
            self._reads.drop()
            return states, Adopted()
        counts: dict[str, int] = {}
        for a in taken:
            _add_counts(counts, a.counts)
        ranges = [r for a in taken for r in a.ranges]
        shaped = self.decoding is None or all(a.shaped_under == self.decoding.readers() for a in taken)
        adopted = None if error is not None or budget == 0 or not shaped \
            else adopt_history(states, ranges, counts)
        if adopted is None:
            if budget == 0 or taken:
                self._reads.drop()  # the reads in flight chain on the ones thrown away
            if error is not None:
                self._history_error(error)  # counted, backed off (a data loss fails the job)
            elif budget and taken:
                logger.info('history read ahead no longer fits, read again job="%s" epoch=%d',
                            self.name, inp.epoch)
            return states, Adopted()
        self._history_ok()
        staged = [a.staged for a in taken if a.staged is not None]
        return SplitTable.from_states(adopted), Adopted(taken, staged, counts, ranges)

    def _reads_inline(self, plan: EpochPlan, budget: int, ahead: Adopted) -> bool:
        """Read this epoch's planned history in the epoch: only the tail of a backfill, all of it.

        That is when nothing is read ahead any more and the history left up to the targets fits the
        epoch's budget: the job then finishes in this epoch instead of chasing the live stream with one
        more read ahead (and a small history finishes in its first epoch). And while a decoding job's
        history is read in its epochs (:meth:`_decodes_inline`).
        """
        if self._inline_decoding():
            return True
        return not self._reads.in_flight_besides(ahead.reads) and _tail_fits(plan.states, budget)

    def _decodes_inline(self, error: Exception) -> bool:
        """Whether a read ahead's ``error`` sends the decoding job's history to its epochs (then it does).

        A read ahead grows no table: records its readers do not cover, a writer schema the policy
        refuses and (``on_decode_error = "fail"``) an undecodable record are read again in an epoch,
        which grows the table, or fails the job, as a live batch would. Read ahead again once the
        readers grew. Not a read error: nothing is counted nor backed off.
        """
        if self.decoding is None:
            return False
        if not isinstance(error, ReaderOutgrownError | DecodeFailedError) \
                and decode_failure(self.name, error) is None:
            return False
        self._inline_under = self.decoding.readers()
        logger.info('history read in epochs job="%s" why="%s"', self.name, one_line(error))
        return True

    def _inline_decoding(self) -> bool:
        """A read ahead sent the job's history to its epochs, and its readers have not grown since."""
        return (self._inline_under is not None and self.decoding is not None
                and self._inline_under == self.decoding.readers())

    def _read_ahead(self) -> None:
        """Start the next history read ahead if the job may read history now and none is running.

        A job with nothing to read now leaves the source's queue for history slots (it asks again when it
        has): a job first in turn that no longer asks would hold the others back.
        """
        if not self._ask_read_ahead() and self.gate is not None:
            self.gate.withdraw(self.name)

    def _ask_read_ahead(self) -> bool:
        """:meth:`_read_ahead`'s work: whether the job asked the source's slots (started, or queued)."""
        with self._reads.lock:
            states = self.states if self.states is not None else self._early
            if (self.failed is not None or states is None or self.alone or not self._reads.may_start()
                    or self._pace.backing_off or self._inline_decoding()):
                return False
            planned = ahead_of(states, self._reads.ranges())
            epoch_budget = self._budget(self._interval_s)
            if _tail_fits(planned, epoch_budget):
                # the next epoch reads the rest itself and finishes: a read ahead of a few offsets costs
                # a Spark job (~0.6 s) and is in flight when that epoch comes, so it would only delay it
                return False
            budget = self._pace.ahead_budget(
                remaining=job_progress(planned).remaining_offsets, tail_budget=epoch_budget,
                rate_limit=self.rate_limit, interval_s=self._interval_s,
                max_rows_per_epoch=self.spec.max_rows_per_epoch, paused=self.history_waits)
            if budget <= 0:
                return False
            ranges = plan_epoch(planned, {}, budget, {}).history
            tasks = self.history_tasks
            gate = self.gate
            if not ranges:
                return False
            if gate is not None and not gate.take(self.name, tasks, self._read_ahead, self.spec.namespace):
                return True  # not its turn: the allowance keeps accruing (up to its cap) for a larger read
            self._pace.spend(sum(r.size for r in ranges))
            self.history.count_data_loss(self.name, ranges)
            after = self.committed_epoch if self.committed_epoch is not None else -1
            readers = None if self.decoding is None else self.decoding.readers()
            self._reads.start(ranges, self._stage_read(after, tasks, readers), self._read_done, tasks=tasks,
                              shaped_under=readers)
            return True

    def _stage_read(self, after_epoch: int, tasks: int,
                    readers: Readers | None) -> Callable[[ReadAhead], tuple[StagedFiles, dict[str, int]]]:
        """A read ahead's copy: its ranges into staged files on ``tasks`` Spark tasks, watched as it goes.

        ``readers``: a decoding job's reader schemas now; its rows are decoded onto them, first taken to be
        of writer ids seen before (one pass over the records, no Spark action collecting their ids), and
        once more with their ids collected when a record of another id is met.
        """
        def stage(read: ReadAhead) -> tuple[StagedFiles, dict[str, int]]:
            def watch(folder: Path) -> None:
                read.progress.folder = folder

            def copy(seen_only: bool) -> tuple[StagedFiles, dict[str, int]]:
                def shape(df: DataFrame) -> DataFrame:
                    return self.transform(df, ahead=readers, seen_only=seen_only, epoch=after_epoch + 1)

                return self.history.stage(self.sink, read.ranges, after_epoch, on_folder=watch,
                                          transform=shape if self.shapes_rows else None, tasks=tasks)

            if readers is None:
                return copy(False)
            try:
                return copy(True)
            except Exception as exc:
                if not unseen_writer(exc):
                    raise
                logger.info('history read ahead met a writer id not seen before, decoding it again job="%s"',
                            self.name)
                return copy(False)

        return stage

    def _read_done(self, read: ReadAhead) -> None:
        """A read ahead ended: its slots go to the next job in turn; its throughput sizes the next read.

        That one starts now if the job's turn allows (they chain).
        """
        if self.gate is not None:
            self.gate.give_back(self.name, read.seconds)
        if read.error is None:
            self._rates.read_ahead(read.rows, read.seconds)
        if read.error is None and not read.dropped:
            logger.debug('history read ahead job="%s" rows=%d seconds=%.3f', self.name, read.rows,
                         read.seconds)
            self._read_ahead()

    def close(self, timeout_s: float = 30.0) -> None:
        """Stop reading ahead: running reads are cancelled and staged files removed (none committed).

        The job's lane commits nothing after this either (:meth:`stop_lane`; a step still running ends
        at its commit).
        """
        self._gate.close("closed")
        self._reads.close(timeout_s)
        if self.gate is not None:
            self.gate.leave(self.name)
        if self.decoding is not None:
            self.decoding.close()

    def _read_history(
        self, ranges: Sequence[HistoryRange], *, observe: bool = False, session: SparkSession | None = None
    ) -> tuple[DataFrame | None, dict[str, int], float, Observation | None]:
        """The planned history ranges: DataFrame, rows read per split, seconds, counting observation.

        ``observe``: the DataFrame counts its rows per split while it is written (one pass; the counts
        are in the returned observation after the write). Otherwise it is cached and counted now (two
        passes, observation None; for sinks that need the state before they write). Read errors back
        off. ``session``: the session the rows are written in (an observation only sees actions of its
        own session; the live batch of ``foreachBatch`` has a session of its own).
        """
        if not ranges:
            return None, {}, 0.0, None
        t0 = time.monotonic()
        try:
            rows = self.history.rows(ranges, session)
        except Exception as exc:  # noqa: BLE001 - a log start under the ranges, the broker unreachable
            self._history_error(exc)
            return None, {}, 0.0, None
        if observe:
            counted, observation = count_per_split(rows, ranges, self.name)
            return counted, {}, 0.0, observation
        try:
            df = rows.persist()
            grouped = df.groupBy("topic", "partition").count().collect()
        except Exception as exc:  # noqa: BLE001 - any reader failure: live goes on, history backs off
            self._history_error(exc)
            return None, {}, 0.0, None
        self._history_ok()
        counts = {split_id(row['topic'], row['partition']): int(row["count"]) for row in grouped}
        return df, counts, time.monotonic() - t0, None

    def _history_ok(self) -> None:
        """A history read worked: the error streak and its backoff message end."""
        self._pace.read_ok()

    def _history_error(self, exc: Exception) -> None:
        """A history read failed: a timeout or a data loss (unless skipped) fails the job; else backoff."""
        if isinstance(exc, SparkWorkTimeoutError):  # a read ahead past its deadline: the job fails
            self.failed = str(exc)
            raise JobError(self.failed) from exc
        if isinstance(exc, ArchiveError):  # the source's archive cannot serve: no retry mends it
            self.failed = f"history from the archive: {one_line(exc)}"
            metrics.SOURCE_ERRORS.labels(self.name, "archive").inc()
            logger.error('job failed job="%s" error="%s"', self.name, self.failed)
            raise JobError(self.failed) from exc
        if is_data_loss(exc) and self.source.fail_on_data_loss:
            self.failed = (
                f"history offsets are below the log start (retention removed them): {one_line(exc)}. "
                "Set fail_on_data_loss=false on the source to skip forward."
            )
            metrics.SOURCE_ERRORS.labels(self.name, "data_loss").inc()
            logger.error('job failed job="%s" error="%s"', self.name, self.failed)
            raise JobError(self.failed) from exc
        delay = self._pace.read_failed(exc)
        metrics.SOURCE_ERRORS.labels(self.name, type(exc).__name__).inc()
        logger.warning(
            'history read failed, live continues job="%s" retry_in_s=%.1f error="%s"', self.name, delay, exc
        )

    def _account(
        self, inp: EpochInput, plan: EpochPlan, counts: Mapping[str, int], inline: tuple[int, float],
        elapsed: float, *, committed: bool, unchanged: bool = False,
    ) -> None:
        """Rates, metrics and the epoch's log line (``executors/accounting.py``).

        ``inline``: (rows, seconds) of the history read in the epoch itself. ``counts`` has the adopted
        reads' rows too.
        """
        history_rows = sum(counts.values())
        live_rows = self._metrics.rows(inp.live, plan.emit_above, counts)
        self._rates.epoch(inline, elapsed, history_rows, live_rows)
        assert self.states is not None  # noqa: S101
        ahead = self.read_ahead()
        progress = self.progress(ahead)
        self._metrics.state(self.states, ahead, self._rates, progress.eta_seconds, committed=committed)
        if unchanged:  # every trigger of an idle job: not worth a line at info
            logger.debug('epoch unchanged, nothing committed job="%s" epoch=%d seconds=%.3f', self.name,
                         inp.epoch, elapsed)
            return
        logger.info(
            'epoch committed job="%s" epoch=%d history_rows=%d live_rows=%d seconds=%.3f finished=%d/%d',
            self.name, inp.epoch, history_rows, live_rows, elapsed,
            progress.splits_finished, progress.splits_total,
        )

    # -- observability ---------------------------------------------------------------------------------
    def read_ahead(self) -> dict[str, tuple[int, int]]:
        """``split -> (rows, last offset)`` copied by reads ahead and not committed yet (running too)."""
        return self._reads.copied() if self.reads_ahead else {}

    def progress(self, read_ahead: Mapping[str, tuple[int, int]] | None = None) -> JobProgressSummary:
        """Progress summary of the current states (core.job_progress), reads ahead counted as read.

        The rate is the wall-clock growth of the history rows copied over the last minute (sampled
        here: after every epoch and whenever progress is asked for).

        ``read_ahead``: :meth:`read_ahead` if the caller has it already.
        """
        ahead = self.read_ahead() if read_ahead is None else read_ahead
        rows_ahead = sum(n for n, _ in ahead.values())
        now = time.monotonic()
        self._rates.copied.observe(now, self._rates.rows_history + rows_ahead)
        return job_progress(self.states or {}, self._rates.copied.rate(now),
                            {split: last for split, (_, last) in ahead.items()},
                            rate_limit=self.rate_limit, paused=self.history_waits,
                            rows_read_ahead=rows_ahead)

    @property
    def copy_tasks(self) -> set[int]:
        """The tasks the job's running history copies were started with (its width share then)."""
        return self._reads.tasks_in_flight() if self.reads_ahead else set()

    @property
    def finish_reported(self) -> bool:
        """Every split is SourceCachingUp or Finished."""
        return self.states is not None and is_finish_reported(self.states)

    @property
    def backfill_done(self) -> bool:
        """Every split is Finished: the job is a plain live consumer now."""
        return self.states is not None and is_backfill_done(self.states)

    @property
    def rows(self) -> tuple[int, int]:
        """Rows written so far by this process: (history, live)."""
        return self._rates.rows_history, self._rates.rows_live

    @property
    def data_loss_offsets(self) -> Mapping[str, int]:
        """Offsets skipped below the log start per split since the daemon started (read-only)."""
        return self._metrics.lost


def _tail_fits(states: Mapping[str, SplitState], budget: int) -> bool:
    """The history left up to the targets fits one epoch's ``budget`` (read inside the epoch)."""
    return job_progress(states).remaining_offsets <= budget


def _add_counts(into: dict[str, int], more: Mapping[str, int]) -> dict[str, int]:
    """Add ``more``'s rows per split to ``into`` (returned)."""
    for split, n in more.items():
        into[split] = into.get(split, 0) + n
    return into


def _output_rows_bound(inp: EpochInput, plan: EpochPlan, counts: Mapping[str, int]) -> int:
    """At most how many rows the epoch writes: the live rows of emitting splits plus the history read."""
    live = sum(stats.count for split, stats in inp.live.items() if plan.emit_above.get(split) is not None)
    return live + sum(counts.values())


def _count_changes(changes: Iterable[SplitChange] | None) -> dict[str, int]:
    counts: dict[str, int] = {}
    for change in changes or ():
        kind = getattr(change, "kind", None) or str(change)
        counts[kind] = counts.get(kind, 0) + 1
    return counts
