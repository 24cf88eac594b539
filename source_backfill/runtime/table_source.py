"""A ``delta`` source: one live stream of a Delta table's change feed, shared by its table-backfill jobs.

The daemon drives the epochs itself: every ``trigger_interval_s`` (at once when a mutation of its jobs is
queued: a new job starts copying without waiting for the trigger) it reads the table's newest version
``b`` (the live stream's position), reads the change feed once for the versions after the slowest
following job's cursor, and hands each job its epoch over ``(a, b]`` (``a``: what the previous epoch
delivered) on the job's lane (:meth:`JobHost._run_lanes`): a job still busy skips the epoch and reads the
versions after its own cursor at its next one. A quiet table still yields epochs (``a == b``), so
backfills progress and finish without new versions. Epoch ids only need to grow per job (they are the
Delta transaction versions of the jobs' commits): a start continues after the highest one its jobs
committed. Positions live in each job's own committed state, not in the source: a restarted daemon loses
nothing by starting the stream at the table's current version.
"""

from __future__ import annotations

import logging
import threading
import time
from functools import partial
from typing import TYPE_CHECKING

from source_backfill import metrics
from source_backfill.errors import ConfigError, one_line
from source_backfill.runtime.jobs import STOPPING, JobHost

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import SparkSession

    from source_backfill.config import JobSpec, SourceConfig
    from source_backfill.executors.table_backfill import TableBackfillJob
    from source_backfill.runtime.progress import JobProgress
    from source_backfill.runtime.registry import JobRegistry

logger = logging.getLogger(__name__)


class TableLiveSource(JobHost["TableBackfillJob"]):
    """The epochs of one ``delta`` source and the jobs that read it (how jobs are kept: :class:`JobHost`)."""

    failing_what = "table source"

    def __init__(self, config: SourceConfig, registry: JobRegistry,
                 spark: SparkSession | None = None) -> None:
        from connectors.delta.table_source import DeltaTableSource

        assert config.table_path is not None
        super().__init__(config, registry)
        self.table = DeltaTableSource(config.table_path)
        #: The daemon's Spark, if it runs one: large snapshot and chain copies go by files on it.
        self.spark = spark
        self.delivered: int | None = None
        self._epoch = 0
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        #: Set when a mutation of the source's jobs is queued (or the source stops): the next epoch runs
        #: at once, so a job created, paused or throttled does not wait for the trigger.
        self._wake = threading.Event()

    # -- lifecycle -------------------------------------------------------------------------------------
    def start(self) -> None:
        """Check the table, recover the jobs from their tables, start the epochs."""
        self.open()
        self.registry.on_mutation(self.name, self._wake.set)
        self._thread = threading.Thread(target=self._loop, name=f"table-source-{self.name}", daemon=True)
        self._thread.start()

    def open(self) -> None:
        """Check the table and recover the jobs from their tables (epochs then run by :meth:`run_epoch`)."""
        try:
            if not self.table.change_feed_enabled():
                msg = (f'delta source "{self.name}": table {self.config.table_path} does not record its '
                       "change data feed; set delta.enableChangeDataFeed = true on it")
                raise ConfigError(msg)
            self.delivered = self.table.latest_version()
        except ConfigError:
            raise
        except Exception as exc:
            msg = f'delta source "{self.name}": cannot read table {self.config.table_path}: {one_line(exc)}'
            raise ConfigError(msg) from exc
        self._recover_jobs()
        self._epoch = max((j.committed_epoch or 0 for j in self.jobs.values()), default=0)
        logger.info('table source started source="%s" table="%s" version=%d jobs=%d', self.name,
                    self.config.table_path, self.delivered, len(self.jobs))

    def stop(self, timeout_s: float = 30.0) -> None:
        """Stop after the running epoch; a later one never starts."""
        self._stopping.set()
        self._wake.set()
        busy = self._stop_busy_lanes(STOPPING)
        if self._thread is not None:
            self._thread.join(timeout_s)
            if self._thread.is_alive():
                logger.warning('epoch still running at shutdown source="%s"', self.name)
        self._await_stopped_lanes(busy, STOPPING, min(5.0, timeout_s))
        self._close_pool()
        for job in self.jobs.values():
            job.close()

    def _loop(self) -> None:
        interval = self.config.trigger_interval_s
        delay = 1.0
        while not self._stopping.is_set():
            t0 = time.monotonic()
            self._wake.clear()  # a mutation queued from here on wakes the wait after this epoch
            try:
                self.run_epoch()
                delay = 1.0
            except Exception as exc:  # noqa: BLE001 - the table unreadable for a while: retry with backoff
                self.error = one_line(exc)
                self.query_failures += 1
                metrics.SOURCE_ERRORS.labels("", "table_source").inc()
                logger.error('table source epoch failed, retrying source="%s" in_s=%.0f error="%s"',
                             self.name, delay, self.error)
                if self._stopping.wait(delay):
                    return
                delay = min(delay * 2, 60.0)
                continue
            self._wake.wait(max(0.0, interval - (time.monotonic() - t0)))

    # -- the epoch -------------------------------------------------------------------------------------
    def run_epoch(self) -> None:
        """One epoch: the table's newest version, mutations, the shared change feed, every job."""
        with self._lock:
            t0 = time.monotonic()
            before = self.delivered
            assert before is not None
            delivered = self.table.latest_version()
            epoch = self._epoch + 1
            pending, self._deferred = self._deferred + self.registry.drain(self.name), []
            mutations = self._apply_mutations(pending, epoch)
            live = self._live(before, delivered)
            self._run_lanes(epoch, [(job, partial(job.run_epoch, epoch, before, delivered,
                                                  live if job.needs_live() else None))
                                    for job in list(self.jobs.values())])
            if mutations:
                self.registry.mark_applied([m.id for m in mutations], epoch)
            self._epoch, self.delivered = epoch, delivered
            metrics.EPOCH_DURATION.labels(self.name).observe(time.monotonic() - t0)
            metrics.EPOCH.labels(self.name).set(epoch)
            self.last_epoch, self.last_epoch_at = epoch, time.time()
            self.error, self.query_failures = None, 0

    def _live(self, before: int, delivered: int) -> pa.Table | None:
        """The change feed once for every following job: versions after the lowest cursor."""
        cursors = [before if j.cursor is None else j.cursor for j in self.jobs.values() if j.needs_live()]
        if not cursors:
            return None
        return self.table.changes_arrow(min(min(cursors) + 1, delivered + 1), delivered)

    # -- jobs --------------------------------------------------------------------------------------------
    def _new_job(self, spec: JobSpec) -> TableBackfillJob:
        from source_backfill.executors.table_backfill import TableBackfillJob

        return TableBackfillJob(spec, self.config, self.table, spark=self.spark)

    def _progress(self, job: TableBackfillJob) -> JobProgress:
        from source_backfill.runtime.progress import table_job_progress

        return table_job_progress(job)
