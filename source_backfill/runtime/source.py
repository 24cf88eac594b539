"""The live source: one streaming query per topic set, fanning each micro-batch out to its jobs.

Each micro-batch is one epoch (epoch id = Spark ``batchId``). At the boundary, inside ``foreachBatch``:

1. read the batch's exact per-split start/end positions from the query's offset log;
2. apply the queued mutations of this source's jobs (recorded durably by the registry before); a job's
   repairs wait for its turn in step 3, where they run before its epoch (``executors/repair.py``);
3. hand every job its step on its own lane (plan, filter live, read history, commit output + state
   atomically; :meth:`JobHost._run_lanes`, ``runtime/lanes.py``), up to ``max_parallel_jobs`` at once,
   the live batch read once for all and kept until the last step that uses it ends; wait for the steps
   at most two triggers: a job still busy goes on alone, skips the epochs that come meanwhile and
   rejoins by offsets (the job checks that each batch starts where its output ends);
4. mark the mutations applied (repairs: once done or failed; a drop: once its lane is free).

A job already committed for this epoch skips it (replay after a crash). One job's failure never stalls
the others: a :class:`~source_backfill.errors.JobError` marks the job failed at once; any other exception
in its epoch makes the job miss this epoch and be rebuilt from its table (its last commit is the truth,
and the missed live range becomes history at its next epoch); after ``JOB_ATTEMPTS`` epochs failing in a
row it is marked failed too. A create that cannot build its job (a transform that fails analysis, a table
owned by another job) marks that job failed. Failed jobs are persisted by the registry, skipped at start,
and come back with a ``retry`` (or leave with a ``drop``). A failure outside the jobs (the live batch
itself) stops the query; the supervisor restarts it from its checkpoint, which replays the batch.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from source_backfill import metrics
from source_backfill.config import SourceConfig
from source_backfill.core import LiveStats, split_id
from source_backfill.core.anchors import Anchors, Truncation, first_per_split
from source_backfill.errors import JobError, one_line
from source_backfill.executors.history_gate import HistoryGate
from source_backfill.executors.source_backfill import EpochInput, SourceBackfillJob
from source_backfill.executors.spark_work import EPOCH
from source_backfill.runtime.early_start import EarlyJobs
from source_backfill.runtime.jobs import STOPPING, JobHost
from source_backfill.runtime.spark import task_slots
from source_backfill.runtime.width import HistoryWidth

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming.query import StreamingQuery

    from connectors.kafka.admin import KafkaAdmin
    from connectors.kafka.connector import KafkaConnector
    from source_backfill.config import JobSpec
    from source_backfill.executors.spark_work import SparkWork
    from source_backfill.runtime.progress import JobProgress
    from source_backfill.runtime.registry import JobRegistry, Mutation

logger = logging.getLogger(__name__)


class LiveSource(JobHost[SourceBackfillJob]):
    """One shared live Kafka source and the jobs attached to it (how jobs are kept: :class:`JobHost`)."""

    failing_what = "live query"

    def __init__(
        self,
        config: SourceConfig,
        spark: SparkSession,
        registry: JobRegistry,
        admin: KafkaAdmin,
        *,
        connector: KafkaConnector,
        state_root: Path,
        work: SparkWork | None = None,
    ) -> None:
        super().__init__(config, registry)
        #: Runs each job's Spark work under its own tag and deadline, marked while in flight (None: not).
        self.work = work
        self.spark = spark
        self.admin = admin
        #: How the source reads Kafka (:func:`connectors.kafka.factory.connector_for`); it keeps the
        #: driver's consumer of small live batches (closed at stop).
        self.connector = connector
        self.checkpoint = state_root / "sources" / config.name / "checkpoint"
        #: Each split's last record as the newest completed epoch gave it (``runtime/anchors.py``): read
        #: at start, checked against the log at start, after a failure of the query and periodically.
        self.anchors = Anchors()
        self._anchors_lock = threading.Lock()
        metrics.KAFKA_TRUNCATIONS.labels(config.name)  # at 0 from the start: increase() sees the first
        self._lock = threading.Lock()
        self._query: StreamingQuery | None = None
        self._supervisor: threading.Thread | None = None
        #: How wide the jobs' history copies run, steered by the Finished jobs' live latency.
        self.width = HistoryWidth(config.name, config.history_width, functools.partial(task_slots, spark),
                                  config.trigger_interval_s)
        #: The slots the jobs' copies take in turn, sized by the width (a job that has not asked again
        #: for three triggers has left the queue).
        self.gate = HistoryGate(stale_s=max(5.0, 3 * config.trigger_interval_s),
                                shares=registry.width_shares(), source=config.name,
                                by_namespace=bool(registry.namespaces))
        self.gate.resize(self.width.width, self.width.duty)
        #: Where the live stream's next batch starts: the end offsets of its last batch that completed.
        self._next_start: dict[str, int] | None = None
        #: The ids of the source's topics as the cluster gave them at the last look (empty: none yet).
        self.topic_ids: dict[str, str] = {}
        #: Why the source stopped for good (a topic of it created again: :meth:`_recreated`), else None;
        #: only such a source may be reset (``runtime/source_reset.py``).
        self.stopped_for_good: str | None = None
        #: The reset that made the source's folder (``runtime/source_reset.py``), None if none did.
        self.reset_marker: dict[str, object] | None = None
        #: Jobs created between epochs, built and reading history before the epoch that attaches them.
        self.early = EarlyJobs(config.name, registry, self._build_job, lambda: self._next_start,
                               lambda name: name not in self.jobs and not self._suspect(name),
                               lambda: self._share(more=1))

    @property
    def bootstrap_servers(self) -> str:
        """The source's resolved bootstrap servers (its connector's)."""
        return self.connector.bootstrap_servers

    # -- lifecycle -------------------------------------------------------------------------------------
    def start(self) -> None:
        """Recover this source's jobs from their tables, then start (and supervise) the live query.

        Not when one of its topics was created again since the source first read it (:meth:`_recreated`).
        Its jobs are failed when a log was truncated below what it copied (:meth:`_check_truncation`).
        """
        from source_backfill.runtime.anchors import read_anchors
        from source_backfill.runtime.source_reset import read_marker

        self.reset_marker = read_marker(self.checkpoint.parent)
        self._recover_jobs()
        if self._recreated():
            return
        self._check_job_topics()
        self.anchors = read_anchors(self.checkpoint.parent)
        self._check_truncation()
        self._query = self._start_query()
        self._supervisor = threading.Thread(target=self._supervise, name=f"source-{self.name}", daemon=True)
        self._supervisor.start()
        self.early.start()

    def stop(self, timeout_s: float = 30.0) -> None:
        """Stop after the running epoch (if any) finishes; a later one is skipped (:meth:`_skip_at_stop`)."""
        self._stopping.set()
        busy = self._stop_busy_lanes(STOPPING)
        acquired = self._lock.acquire(timeout=timeout_s)
        if acquired:
            self._lock.release()
        else:
            logger.warning('epoch still running at shutdown, abandoning it source="%s"', self.name)
        self._await_stopped_lanes(busy, STOPPING, min(5.0, timeout_s))
        self._close_pool()
        self.early.stop(timeout_s)
        for job in list(self.jobs.values()):
            job.close()  # history read ahead and not committed is thrown away; it is read again later
        query = self._query
        if query is not None:
            try:
                query.stop()
            except Exception as exc:  # noqa: BLE001 - stopping a failed query may raise; we are leaving
                logger.debug('query stop raised source="%s" error="%s"', self.name, exc)
        if acquired:  # no epoch reads with them any more
            self.connector.close()
            # the stopped query's foreachBatch callback stays referenced by py4j (and so this source,
            # its jobs and their admin) until the JVM drops it: close the client now, not at exit
            self.admin.close()

    def _skip_at_stop(self, batch_id: int) -> None:
        """A batch that comes while the source stops: no job runs it, and it ends without an error.

        Spark then counts it done and the next start reads after it: every job rejoins by offsets at
        its first step, its output ending before this batch (a skipped epoch, invariant 1 of the lanes).
        Raising instead would abandon it for a replay, but the query then ends with an error (Spark and
        py4j log it at ERROR, with a stack, on every such clean stop).
        """
        logger.info('epoch skipped at shutdown source="%s" epoch=%d: the jobs rejoin by offsets on restart',
                    self.name, batch_id)

    def _start_query(self) -> StreamingQuery:
        self.checkpoint.mkdir(parents=True, exist_ok=True)
        query = (
            self.connector.live_stream(self.checkpoint)
            .writeStream.foreachBatch(self._on_batch)
            .option("checkpointLocation", str(self.checkpoint))
            .trigger(processingTime=f"{self.config.trigger_interval_s} seconds")
            .queryName(f"source_{self.name}".replace("-", "_").replace(".", "_"))
            .start()
        )
        logger.info('live source started source="%s" topics="%s"', self.name,
                    self.config.topic_pattern or ",".join(self.config.topics))
        return query

    def _supervise(self) -> None:
        """Restart the query from its checkpoint after a failure (the failed batch replays)."""
        delay = 1.0
        while not self._stopping.is_set():
            query = self._query
            if query is None:
                return
            try:  # the anchors are checked every truncation_check_interval_s while the query runs
                while not query.awaitTermination(self.config.truncation_check_interval_s):  # type: ignore[arg-type]
                    if self._stopping.is_set():
                        return
                    self._check_truncation()
            except Exception as exc:  # noqa: BLE001 - any query failure: restart from the checkpoint
                if self._stopping.is_set():
                    return
                self.error = self._explained(one_line(exc))
                self.query_failures += 1
                metrics.SOURCE_ERRORS.labels("", "live_query").inc()
                logger.error('live query failed, restarting source="%s" in_s=%.0f error="%s"',
                             self.name, delay, self.error)
            if self._stopping.is_set() or self._recreated():
                return
            self._check_truncation()
            if self._stopping.wait(delay):
                return
            delay = min(delay * 2, 60.0)
            try:
                self._query = self._start_query()  # the error stays until an epoch completes
            except Exception as exc:  # noqa: BLE001
                self.error = one_line(exc)
                self.query_failures += 1
                logger.error('live query restart failed source="%s" error="%s"', self.name, exc)

    def _recreated(self) -> bool:
        """Whether a topic of the source was deleted and created again: then the source stops for good.

        Its checkpoint and its jobs' committed positions belong to the old topic's log (the new one's
        offsets restart at 0): the live query is not (re)started and the source's jobs are failed, naming
        the topic and both ids (``core/topic_ids.py``), never run against the new log.
        """
        from source_backfill.runtime.topic_record import recreated_topics

        found: dict[str, str] = {}
        recreated = recreated_topics(self.admin, self.config, self.checkpoint.parent, found)
        if found:
            self.topic_ids = found
        if not recreated:
            return False
        why = "; ".join(str(r) for r in recreated)
        self.error = (f"{why}: source {self.name} stopped, its checkpoint and its jobs' positions belong to "
                      f"the old topic. To start over: source-backfill sources reset {self.name}, then "
                      "source-backfill jobs retry <job> --from earliest --new-table for each of its jobs "
                      "(docs/guides/kafka-failures.md)")
        self.stopped_for_good = why
        self.query_failures += 1
        logger.error('source stopped: topic recreated source="%s" why="%s"', self.name, why)
        for record in self.registry.list():
            if record.source == self.name and record.error is None and not record.dropped:
                self._fail(record.name, f"{why}: its table holds records of the old topic (once the source "
                                        "is reset, retry the job --from earliest --new-table)")
        return True

    def _check_truncation(self) -> list[Truncation]:
        """Read each anchor's record again; fail the source's jobs that read a split truncated below it.

        The jobs' tables hold records the log no longer has, and new records took their offsets: every
        job of the source that is not failed or dropped fails, its error naming the topic, the partition,
        the anchor's offset and what is there now (the log's end, or another record). The live query
        goes on (the other splits' records, and jobs created afterwards, copy the log as it is now); the
        split's anchor is dropped, and the next epoch anchors it in the new log. Never raises: a check
        that cannot read is no verdict.
        """
        from source_backfill.runtime.anchors import find_truncations, save_anchors

        with self._anchors_lock:
            at_check = self.anchors
        try:
            found, read = find_truncations(self.admin, self.config, self.bootstrap_servers,
                                           at_check.to_check())
            found = first_per_split(found)
        except Exception as exc:  # noqa: BLE001 - no verdict; the next check tries again
            logger.warning('anchors not checked source="%s" error="%s"', self.name, one_line(exc))
            return []
        with self._anchors_lock:
            kept = at_check.after_check(self.anchors, found, read)
            if kept != self.anchors:
                save_anchors(self.checkpoint.parent, kept)
                self.anchors = kept
        if not found:
            return []
        why = "; ".join(str(t) for t in found)
        logger.error('kafka log truncated below what was copied source="%s" why="%s"', self.name, why)
        metrics.KAFKA_TRUNCATIONS.labels(self.name).inc(len(found))
        for record in self.registry.list():
            if record.source == self.name and record.error is None and not record.dropped:
                self._fail(record.name, f"{why}: its table holds records the log no longer has, and new "
                           "records took their offsets (docs/guides/kafka-failures.md)")
        return found

    def _keep_anchors(self, live: dict[str, LiveStats]) -> None:
        """Record each split's newest anchor of an epoch whose jobs' steps were handed off."""
        from source_backfill.runtime.anchors import from_stats, save_anchors

        with self._anchors_lock:
            kept = self.anchors.advanced(from_stats(live))
            if kept != self.anchors:
                save_anchors(self.checkpoint.parent, kept)
                self.anchors = kept

    def _explained(self, error: str) -> str:
        """The query's error, with its cause said for a user (``connectors/kafka/security.py``).

        A refused password, an untrusted certificate or one naming another host, a denied topic.
        """
        from connectors.kafka.security import explain_failure, librdkafka_options

        try:
            return explain_failure(error, self.bootstrap_servers, librdkafka_options(self.config))
        except Exception:  # noqa: BLE001 - the error itself is what matters
            return error

    # -- the epoch -------------------------------------------------------------------------------------
    def _on_batch(self, batch: DataFrame, batch_id: int) -> None:
        if self._stopping.is_set():
            self._skip_at_stop(batch_id)
            return
        with self._lock:
            if self._stopping.is_set():
                self._skip_at_stop(batch_id)
                return
            t0 = time.monotonic()
            self._run_epoch(batch, batch_id)
            metrics.EPOCH_DURATION.labels(self.name).observe(time.monotonic() - t0)
            metrics.EPOCH.labels(self.name).set(batch_id)
            self.last_epoch = batch_id
            self.last_epoch_at = time.time()
            self.error, self.query_failures = None, 0  # healthy again only once an epoch completes

    def _run_epoch(self, batch: DataFrame, batch_id: int) -> None:
        from connectors.kafka.stream import batch_offsets

        start, end = batch_offsets(str(self.checkpoint), batch_id)
        if start is not None and end.keys() - start.keys():
            # a split first read in this batch (Spark's source records no start for it): it started at
            # its log start, where Spark's source starts a new partition
            born = self.admin.earliest_offsets(sorted(end.keys() - start.keys()))
            start = {**start, **born}
        # read once, only if a job reads the batch: the query's first batch with no job attached yet is
        # read by none (attaching waits for the next batch, whose start is known), so no Spark job runs
        read: tuple[pa.Table | None, dict[str, LiveStats]] | None = None
        def release() -> None:  # a batch too large for the driver was persisted: every job read it
            if read is not None and read[0] is None:
                _unpersist(batch)

        hold = _BatchHold(release)
        try:
            if self._reads_batch(start):  # before the mutations: a failing batch leaves them queued
                read = _rows_and_stats(batch, start, end, self.connector.read_small)
            pending, self._deferred = self._deferred + self.registry.drain(self.name), []
            applied = self._apply_mutations(pending, batch_id)
            if self._reads_batch(start):  # a mutation may have brought a job with a position
                rows, live = read or (read := _rows_and_stats(batch, start, end, self.connector.read_small))
                inp = EpochInput(epoch=batch_id, batch=batch, live=live, start=start, end=end,
                                 interval_s=self.config.trigger_interval_s, rows=rows)
                # attach needs the exact live position: a new job waits for an epoch whose start is known
                self._share_width()
                self._run_lanes(inp.epoch, [(job, functools.partial(self._job_turn, job, inp))
                                            for job in list(self.jobs.values())
                                            if job.states is not None or inp.start is not None],
                                handed=hold.take, left=hold.give)
                self._steer_width()
                self._keep_anchors(live)
            with self._repairs_lock:
                finished, self._repairs_finished = self._repairs_finished, []
            if applied or finished:
                self.registry.mark_applied([m.id for m in applied] + finished, batch_id)
            self._next_start = end  # the next batch starts where this one ended (Spark's offset log)
        finally:
            hold.give()  # the batch is unpersisted once the last step that may read it has ended too

    def _job_turn(self, job: SourceBackfillJob, inp: EpochInput) -> bool:
        """The job's turn in an epoch: its repairs due (between its last commit and this one), its epoch."""
        self._run_repairs(job)
        return job.run_epoch(inp)

    def _run_repairs(self, job: SourceBackfillJob) -> None:
        """Run the job's accepted repairs, in order, once it has committed (``executors/repair.py``).

        Each is marked applied once it is done or failed (after the epoch); a crash before that replays
        it, and its transaction in the table tells a committed one from one to run again.
        """
        from source_backfill.executors.repair import run_repair

        if job.failed is not None or job.committed_epoch is None or job.stopped is not None:
            return
        with self._repairs_lock:
            due = list(self._repairs.get(job.name, []))
        for m in due:
            assert m.repair is not None  # noqa: S101 - a repair mutation carries its window
            outcome = run_repair(job, m.id, m.repair)
            self.registry.publish_repair(job.name, outcome.to_json())
            with self._repairs_lock:
                self._repairs[job.name] = [r for r in self._repairs.get(job.name, []) if r.id != m.id]
                self._repairs_finished.append(m.id)

    def _apply_job_mutation(self, job: SourceBackfillJob, m: Mutation) -> bool:
        """A new transform takes effect now; a repair waits for the job's turn (applied once it ran)."""
        if m.kind == "retransform" and m.spec is not None:
            job.retransform(m.spec)
            return True
        if m.kind == "repair":
            with self._repairs_lock:
                if all(r.id != m.id for r in self._repairs.get(job.name, [])):
                    self._repairs.setdefault(job.name, []).append(m)
            return False
        return super()._apply_job_mutation(job, m)

    def _steer_width(self) -> None:
        """The width governor's step after the jobs' epochs (``runtime/width.py``); then the shares."""
        jobs = [job for job in self.jobs.values() if job.failed is None and job.states is not None]
        share = self._share()  # what the running copies were started with, if the width held
        self.width.after_epoch(time.monotonic(), copying=any(job.copying for job in jobs),
                               at_width=all(job.copy_tasks <= {share} for job in jobs),
                               finished=[job.take_latencies() for job in jobs if job.backfill_done])
        self._share_width()

    def _backfilling(self) -> list[SourceBackfillJob]:
        """The jobs still backfilling, or about to attach (they share the history width)."""
        return [job for job in self.jobs.values() if job.failed is None and not job.backfill_done]

    def _share(self, more: int = 0) -> int:
        """Each backfilling job's share of the width (``more``: jobs about to join them)."""
        return self.width.per_job(len(self._backfilling()) + more)

    def _share_width(self) -> None:
        """Each job still backfilling (or about to attach) gets its share of the source's history width.

        The copies running together hold at most the width: they take it in turns.
        """
        self.gate.resize(self.width.width, self.width.duty)
        share = self._share()
        for job in self._backfilling():
            job.history_tasks = share

    def _reads_batch(self, start: dict[str, int] | None) -> bool:
        """Whether a job reads this batch: its start is known, or a job has a position already."""
        return start is not None or any(job.states is not None for job in self.jobs.values())

    def _new_job(self, spec: JobSpec) -> SourceBackfillJob:
        """The job built early for a create (``runtime/early_start.py``), else built now.

        A job whose table was written from a topic of the same name but another id fails to start
        (:meth:`SourceBackfillJob.check_topics`).
        """
        job = self.early.take(spec)
        job = job if job is not None else self._build_job(spec)
        try:
            self._check_topics(job)
        except JobError:
            job.close()
            raise
        return job

    def _check_topics(self, job: SourceBackfillJob) -> None:
        """JobError if the job's table was written from another log than the one the source reads now.

        Its commits name other topic ids (:meth:`SourceBackfillJob.check_topics`), or none at all while it
        has commits and was written before the source's reset (its ``old_tables``): written before ids
        were recorded, its epochs are the old checkpoint's (they would skip the new one's up to them).
        """
        from source_backfill.runtime.paths import resolve

        if self.topic_ids:
            job.check_topics(self.topic_ids)
        old = (self.reset_marker or {}).get("old_tables")
        if isinstance(old, list) and job.committed_epoch is not None and job.recorded_topic_ids is None \
                and str(resolve(job.spec.sink_path)) in old:
            msg = (f'job "{job.name}": its table was written before its source {self.name} was reset (its '
                   "commits name no topic id: a release before they were recorded); retry the job into a "
                   f"new table (jobs retry {job.name} --from earliest --new-table)")
            raise JobError(msg)

    def _check_job_topics(self) -> None:
        """The jobs recovered before the topics' ids were read, each checked against them.

        A job whose table was written from another topic of the same name is failed, naming both ids.
        """
        for name, job in list(self.jobs.items()):
            try:
                self._check_topics(job)
            except JobError as exc:
                self._fail(name, str(exc))

    def _build_job(self, spec: JobSpec) -> SourceBackfillJob:
        job = SourceBackfillJob(spec, self.config, self.spark, self.admin, connector=self.connector,
                                work=self.work)
        job.gate = self.gate
        return job

    def _jvm_gone(self) -> bool:
        return self.work is not None and not self.work.alive()

    def _suspect(self, name: str) -> bool:
        return self.work is not None and name in self.work.ledger.crashes

    def _crashes_reset(self, name: str, *, epoch: bool = False) -> None:
        if self.work is not None:
            if epoch:
                self.work.ledger.completed(name, EPOCH)
            else:
                self.work.ledger.reset(name)

    def _progress(self, job: SourceBackfillJob) -> JobProgress:
        from source_backfill.runtime.progress import to_job_progress

        return to_job_progress(job)


class _BatchHold:
    """The live batch, kept for the steps that read it: released when the epoch and each of them end."""

    def __init__(self, release: Callable[[], None]) -> None:
        self._release = release
        self._count = 1  # the epoch's own
        self._lock = threading.Lock()

    def take(self) -> None:
        with self._lock:
            self._count += 1

    def give(self) -> None:
        with self._lock:
            self._count -= 1
            last = self._count == 0
        if last:
            self._release()


def _unpersist(batch: DataFrame) -> None:
    """Unpersist a live batch whose last reader ended (it may outlive its epoch: a lane's step)."""
    try:
        batch.unpersist()
    except Exception as exc:  # noqa: BLE001 - the session may be stopping; the cache goes with it
        logger.debug('live batch not unpersisted error="%s"', one_line(exc))


#: A live batch whose offset ranges bound it to at most this many rows is collected to the driver once
#: (Arrow): its stats come from there, and jobs with nothing else to write commit it with pyarrow, no
#: Spark job each. A larger one is persisted and aggregated by Spark.
SMALL_BATCH_ROWS = 100_000


def _rows_and_stats(
    batch: DataFrame, start: dict[str, int] | None, end: dict[str, int],
    read_small: Callable[[dict[str, int], dict[str, int]], pa.Table],
) -> tuple[pa.Table | None, dict[str, LiveStats]]:
    """The batch's rows on the driver when small, and its per-split stats.

    A batch bounded (by its offsets) to ``SMALL_BATCH_ROWS`` is read by ``read_small(start, end)``. A
    larger one (or one whose start is not known) is persisted instead (every job reads it: once from
    Kafka); the caller unpersists it.
    """
    bound = None if start is None else sum(max(0, e - start.get(s, 0)) for s, e in end.items())
    rows = read_small(start, end) if start is not None and bound is not None and bound <= SMALL_BATCH_ROWS \
        else None
    if rows is not None:
        return rows, _live_stats(batch, end, rows)
    batch.persist()
    try:
        return None, _live_stats(batch, end, None)
    except BaseException:
        batch.unpersist()
        raise


def _live_stats(batch: DataFrame, end: dict[str, int], rows: pa.Table | None) -> dict[str, LiveStats]:
    """Per split of the live batch: first and last offset, row count, and the exclusive end position."""
    from pyspark.sql import functions as F  # noqa: N812

    from source_backfill.core.anchors import fingerprint
    from source_backfill.runtime.anchors import last_fingerprints

    if rows is not None:
        grouped = rows.select(["topic", "partition", "offset"]).group_by(["topic", "partition"]).aggregate(
            [("offset", "min"), ("offset", "max"), ("offset", "count")]
        )
        found = [
            {"topic": r["topic"], "partition": r["partition"], "first": r["offset_min"],
             "last": r["offset_max"], "n": r["offset_count"]}
            for r in grouped.to_pylist()
        ]  # the rows' timestamps are on the driver: the jobs measure their live latency row by row
        fps = last_fingerprints(rows, {(r["topic"], r["partition"]): r["last"] for r in found}) \
            if {"key", "value", "timestamp"} <= set(rows.column_names) else {}
        for r in found:
            r["fingerprint"] = fps.get((r["topic"], r["partition"]))
    else:
        # the same aggregation gives the timestamp range the jobs' live latency is estimated from
        aggs = [F.min("offset").alias("first"), F.max("offset").alias("last"), F.count("*").alias("n")]
        if {"timestamp", "timestampType"} <= set(batch.columns):
            ts = F.col("timestamp").cast("double") * 1000
            aggs += [F.min(ts).alias("ts_min"), F.max(ts).alias("ts_max"),
                     F.max("timestampType").alias("ts_type")]
        if {"key", "value", "timestamp"} <= set(batch.columns):  # the anchor: the last record's content
            aggs.append(F.max_by(F.struct("key", "value", F.unix_millis("timestamp").alias("ms")),
                                 "offset").alias("anchor"))
        found = [r.asDict() for r in batch.groupBy("topic", "partition").agg(*aggs).collect()]
        for r in found:  # hashed here, as the driver's rows are (core/anchors.py)
            a = r.pop("anchor", None)
            r["fingerprint"] = None if a is None or a["ms"] is None else fingerprint(
                _bytes(a["key"]), _bytes(a["value"]), int(a["ms"]))
    stats: dict[str, LiveStats] = {}
    for row in found:
        split = split_id(row["topic"], row["partition"])
        stats[split] = LiveStats(
            first=int(row["first"]), last=int(row["last"]), count=int(row["n"]),
            end=max(end.get(split, 0), int(row["last"]) + 1),
            ts_min_ms=row.get("ts_min"), ts_max_ms=row.get("ts_max"), ts_type=row.get("ts_type"),
            fingerprint=row.get("fingerprint"),
        )
    return stats


def _bytes(value: object) -> bytes | None:
    """A binary column's value as Spark's rows give it (``bytearray``), as bytes."""
    return None if value is None else bytes(value)  # type: ignore[call-overload]
