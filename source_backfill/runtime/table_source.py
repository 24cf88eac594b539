"""A ``delta`` source: one live stream of a Delta table's change feed, shared by its table-backfill jobs.

The daemon drives the epochs itself: every ``trigger_interval_s`` it reads the table's newest version
``b`` (the live stream's position), reads the change feed once for the versions after the slowest
following job's cursor, and runs each job's epoch over ``(a, b]`` (``a``: what the previous epoch
delivered). A quiet table still yields epochs (``a == b``), so backfills progress and finish without new
versions. Epoch ids only need to grow per job (they are the Delta transaction versions of the jobs'
commits): a start continues after the highest one its jobs committed. Positions live in each job's own
committed state, not in the source: a restarted daemon loses nothing by starting the stream at the
table's current version.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING, Any

from source_backfill import metrics
from source_backfill.errors import ConfigError, JobError, one_line

if TYPE_CHECKING:
    import pyarrow as pa

    from source_backfill.config import SourceConfig
    from source_backfill.executors.table_backfill import TableBackfillJob
    from source_backfill.runtime.registry import JobRegistry, Mutation

logger = logging.getLogger(__name__)

#: An unexpected error in a job's epoch rebuilds the job from its table; this many in a row fail it.
JOB_ATTEMPTS = 3


class TableLiveSource:
    """The epochs of one ``delta`` source and the jobs that read it."""

    def __init__(self, config: SourceConfig, registry: JobRegistry) -> None:
        from connectors.delta.table_source import DeltaTableSource

        assert config.table_path is not None
        self.config = config
        self.registry = registry
        self.table = DeltaTableSource(config.table_path)
        self.jobs: dict[str, TableBackfillJob] = {}
        self.last_epoch: int | None = None
        self.last_epoch_at: float | None = None
        self.delivered: int | None = None
        self.error: str | None = None
        self.query_failures = 0
        self.started_at = time.time()
        self._epoch = 0
        self._failures: dict[str, int] = {}
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def name(self) -> str:
        """The source's configured name."""
        return self.config.name

    # -- lifecycle -------------------------------------------------------------------------------------
    def start(self) -> None:
        """Check the table, recover the jobs from their tables, start the epochs."""
        self.open()
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
        for record in self.registry.list():
            if record.spec.source != self.name or record.dropped:
                continue
            if record.error is not None:
                metrics.JOB_FAILED.labels(record.name).set(1)
                continue
            self._add_job(record.spec, paused=record.paused, rate_limit=record.rate_limit)
        self._epoch = max((j.committed_epoch or 0 for j in self.jobs.values()), default=0)
        logger.info('table source started source="%s" table="%s" version=%d jobs=%d', self.name,
                    self.config.table_path, self.delivered, len(self.jobs))

    def stop(self, timeout_s: float = 30.0) -> None:
        """Stop after the running epoch; a later one never starts."""
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
            if self._thread.is_alive():
                logger.warning('epoch still running at shutdown source="%s"', self.name)
        for job in self.jobs.values():
            job.close()

    def _loop(self) -> None:
        interval = self.config.trigger_interval_s
        delay = 1.0
        while not self._stopping.is_set():
            t0 = time.monotonic()
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
            self._stopping.wait(max(0.0, interval - (time.monotonic() - t0)))

    def health(self, stale_after_intervals: float) -> dict[str, Any]:
        """The same shape as a Kafka source's health."""
        age = time.time() - (self.last_epoch_at or self.started_at)
        stale_after = stale_after_intervals * self.config.trigger_interval_s
        problems = []
        if self.error is not None:
            problems.append(f"table source failing ({self.query_failures} in a row): {self.error}")
        if age > stale_after:
            problems.append(f"no epoch for {age:.0f}s (more than {stale_after:.0f}s)")
        return {
            "healthy": not problems,
            "ready": self.last_epoch_at is not None and not problems,
            "problems": problems,
            "last_epoch": self.last_epoch,
            "last_epoch_at": self.last_epoch_at,
            "last_epoch_age_s": round(age, 1),
            "error": self.error,
            "query_failures": self.query_failures,
            "jobs": sorted(self.jobs),
            "failed_jobs": sorted(r.name for r in self.registry.failed() if r.source == self.name),
        }

    # -- the epoch -------------------------------------------------------------------------------------
    def run_epoch(self) -> None:
        """One epoch: the table's newest version, mutations, the shared change feed, every job."""
        with self._lock:
            t0 = time.monotonic()
            before = self.delivered
            assert before is not None
            delivered = self.table.latest_version()
            epoch = self._epoch + 1
            mutations = self.registry.drain(self.name)
            self._apply(mutations)
            live = self._live(before, delivered)
            for job in list(self.jobs.values()):
                try:
                    job.run_epoch(epoch, before, delivered, live if job.needs_live() else None)
                    job.last_error = None
                except JobError as exc:
                    self._fail(job.name, str(exc))
                    continue
                except Exception as exc:
                    if self._stopping.is_set():
                        raise
                    self._job_failed(job, epoch, exc)
                    continue
                self._failures.pop(job.name, None)
                self._publish(job)
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
    def _apply(self, mutations: list[Mutation]) -> None:
        for m in mutations:
            job = self.jobs.get(m.job)
            if m.kind == "create":
                if job is None and m.spec is not None:
                    self._add_job(m.spec, paused=False, rate_limit=m.spec.rate_limit)
            elif m.kind == "retry":
                old = self.jobs.pop(m.job, None)
                if old is not None:
                    old.close()
                self._failures.pop(m.job, None)
                record = self.registry.get(m.job)
                if not record.dropped:
                    self._add_job(record.spec, paused=record.paused, rate_limit=record.rate_limit)
            elif m.kind == "drop":
                if job is not None:
                    job.close()
                    del self.jobs[m.job]
                self._failures.pop(m.job, None)
                metrics.forget_job(m.job)
            elif job is not None:
                if m.kind == "pause":
                    job.paused = True
                elif m.kind == "resume":
                    job.paused = False
                elif m.kind == "throttle":
                    job.rate_limit = m.rate_limit

    def _add_job(self, spec: Any, *, paused: bool, rate_limit: float | None) -> bool:
        from source_backfill.executors.table_backfill import TableBackfillJob

        try:
            job = TableBackfillJob(spec, self.config, self.table)
        except Exception as exc:  # noqa: BLE001 - its failure is the job's, never the source's
            self._fail(spec.name, f"job could not start: {one_line(exc)}")
            return False
        job.paused, job.rate_limit = paused, rate_limit
        self.jobs[spec.name] = job
        metrics.JOB_FAILED.labels(spec.name).set(0)
        self._publish(job)
        return True

    def _fail(self, name: str, error: str) -> None:
        job = self.jobs.pop(name, None)
        if job is not None:
            job.close()
        self._failures.pop(name, None)
        self.registry.set_failed(name, error)
        metrics.JOB_FAILED.labels(name).set(1)

    def _job_failed(self, job: TableBackfillJob, epoch: int, exc: Exception) -> None:
        error = f"{type(exc).__name__}: {one_line(exc)}"
        metrics.SOURCE_ERRORS.labels(job.name, type(exc).__name__).inc()
        count = self._failures.get(job.name, 0) + 1
        if count >= JOB_ATTEMPTS:
            self._fail(job.name, f"epoch {epoch} failed {count} times in a row: {error}")
            return
        logger.warning('table job epoch failed, rebuilding it from its table job="%s" epoch=%d attempt=%d '
                       'error="%s"', job.name, epoch, count, error)
        job.close()
        del self.jobs[job.name]
        record = self.registry.get(job.name)
        if self._add_job(record.spec, paused=record.paused, rate_limit=record.rate_limit):
            self._failures[job.name] = count
            self.jobs[job.name].last_error = error

    def _publish(self, job: TableBackfillJob) -> None:
        from source_backfill.runtime.progress import table_job_progress

        self.registry.publish_progress(job.name, table_job_progress(job))
