"""What every source does with its jobs, whatever it reads: build them, apply control, fail them alone.

A Kafka source (:mod:`source_backfill.runtime.source`) and a delta source
(:mod:`source_backfill.runtime.table_source`) differ in how an epoch comes about and what a job is;
this base holds the rest once:

* mutations at an epoch boundary (create, pause, resume, throttle, drop, retry; a Kafka source also takes
  a job's new transform and its repairs, :meth:`JobHost._apply_job_mutation`);
* one job's failure never stalls the others: a :class:`~source_backfill.errors.JobError` marks it failed
  at once; any other exception in its epoch rebuilds it from its table (its last commit is the truth);
  ``JOB_ATTEMPTS`` epochs failing in a row mark it failed. A job that cannot be built is failed too.
  Failed jobs are persisted by the registry, skipped at start, and come back with a ``retry``;
* each job on its own lane (:mod:`source_backfill.runtime.lanes`, :meth:`JobHost._run_lanes`): a Kafka
  source's epoch hands every job whose lane is free its step, on a pool of ``max_parallel_jobs`` threads
  (its own Spark jobs, its own commit), waits for them at most two triggers, and ends: a job still busy
  when the next epoch comes skips it and rejoins by offsets. Control acts on a busy lane at once (its
  Spark work cancelled by its job tag; a drop is marked applied once its lane is free, and nothing of the
  job commits after it). A delta source still runs its jobs' epochs side by side and waits for all
  (:meth:`JobHost._run_jobs`);
* health in one shape (the source failing, its epochs stale).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import replace
from functools import partial
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from source_backfill import metrics
from source_backfill.errors import JobError, LaneStoppedError, one_line
from source_backfill.executors.job import Job
from source_backfill.runtime.lanes import Lanes, lane_wait_s

if TYPE_CHECKING:
    from source_backfill.config import JobSpec, SourceConfig
    from source_backfill.runtime.progress import JobProgress
    from source_backfill.runtime.registry import JobRecord, JobRegistry, Mutation

logger = logging.getLogger(__name__)

#: Why the lanes of a stopping daemon stop (in the log and in a step's ``LaneStoppedError``).
STOPPING = "the daemon is stopping"

#: Epochs in a row a job may fail with an unexpected error (rebuilt from its table each time) before it
#: is marked failed.
JOB_ATTEMPTS = 3

#: The kind of job a source keeps (:class:`~source_backfill.executors.job.Job`: what is asked of it here).
J = TypeVar("J", bound=Job)
#: One job's epoch, run by :meth:`JobHost._run_jobs` (its result is not used).
JobRun = tuple[J, Callable[[], object]]


class JobHost(ABC, Generic[J]):
    """The jobs of one source; a subclass builds one (`_new_job`) and describes it (`_progress`)."""

    #: What keeps failing when the source itself fails (its health's wording).
    failing_what = "source"
    #: The Spark session the jobs' steps run on (None: none, a Delta source on delta-rs alone).
    spark: Any = None

    def __init__(self, config: SourceConfig, registry: JobRegistry) -> None:
        self.config = config
        self.registry = registry
        self.jobs: dict[str, J] = {}
        self.last_epoch: int | None = None
        self.last_epoch_at: float | None = None
        self.error: str | None = None
        #: Failures of the source since the last epoch that completed.
        self.query_failures = 0
        self.started_at = time.time()
        #: Epochs in a row each job failed with an unexpected error.
        self._job_failures: dict[str, int] = {}
        self._stopping = threading.Event()
        #: The threads the jobs' epochs run on (made at the first epoch with two jobs or more).
        self._pool: _Workers | None = None
        #: Repairs accepted per job, waiting for the job's turn (a Kafka source runs them), and the ids
        #: of those finished (done, failed, or their job dropped) to mark applied after the epoch.
        self._repairs: dict[str, list[Mutation]] = {}
        self._repairs_finished: list[int] = []
        self._repairs_lock = threading.Lock()
        #: Mutations that wait for their job's lane to be free (a retry, a new transform), applied at a
        #: later epoch.
        self._deferred: list[Mutation] = []
        #: Drops whose job's step still ends, with the epoch each was taken at: applied (and marked) by the
        #: lane's thread as the step ends, not an epoch later (:meth:`_lane_freed`).
        self._lane_drops: dict[str, list[tuple[Mutation, int]]] = {}
        self._lane_drops_lock = threading.Lock()
        #: Each job's lane: its step in flight, its lag (``runtime/lanes.py``).
        self.lanes = Lanes(lane_wait_s(config.trigger_interval_s))
        #: Guards ``jobs`` against the lanes: a step failing rebuilds or fails its job on its lane's thread.
        self._jobs_lock = threading.RLock()

    @property
    def name(self) -> str:
        """The source's configured name."""
        return self.config.name

    # -- what a source says ----------------------------------------------------------------------------
    @abstractmethod
    def _new_job(self, spec: JobSpec) -> J:
        """Build the job of ``spec``, recovered from its table (any exception: the job is failed)."""

    @abstractmethod
    def _progress(self, job: J) -> JobProgress:
        """The progress record of ``job`` as it stands (published after each of its epochs)."""

    def _jvm_gone(self) -> bool:
        """Whether the engine the jobs run on is gone (a job's error then is not the job's)."""
        return False

    def _suspect(self, name: str) -> bool:
        """Whether the job had Spark work in flight at the JVM's last deaths (its crash count is not 0)."""
        return False

    def _enter_lane(self) -> None:
        """A step starts on this lane thread: on Spark, its work goes in the lane's FAIR pool."""
        if self.spark is not None:
            from source_backfill.runtime.lanes import enter_lane_pool

            enter_lane_pool(self.spark)

    def _crashes_reset(self, name: str, *, epoch: bool = False) -> None:
        """The job was retried or dropped: its crash count starts from 0.

        ``epoch``: it completed an epoch instead (from 0 if an epoch of it was in flight at its crashes).
        """

    # -- building -----------------------------------------------------------------------------------------
    def _recover_jobs(self) -> None:
        """Build this source's registered jobs (failed ones stay failed until retried)."""
        for record in self.registry.list():
            if record.spec.source != self.name or record.dropped:
                continue
            if record.error is not None:
                metrics.JOB_NAMESPACE.labels(record.name, record.spec.namespace).set(1)
                metrics.JOB_FAILED.labels(record.name).set(1)
                logger.warning('job stays failed until retried job="%s" error="%s"', record.name,
                               record.error)
                continue
            self._build(record)

    def _build(self, record: JobRecord) -> bool:
        """Build a registered job with its accepted control state (pause, rate limit)."""
        return self._add_job(record.spec, paused=record.paused, rate_limit=record.rate_limit)

    def _add_job(self, spec: JobSpec, *, paused: bool, rate_limit: float | None) -> bool:
        """Build the job (recovering it from its table); a job that cannot be built is marked failed."""
        metrics.JOB_NAMESPACE.labels(spec.name, spec.namespace).set(1)  # a failed job is one too
        try:
            job = self._new_job(spec)
        except Exception as exc:  # noqa: BLE001 - its failure is the job's, never the source's
            self._fail(spec.name, f"job could not start: {one_line(exc)}")
            return False
        job.paused = paused
        job.rate_limit = rate_limit
        quota = self.registry.table_bytes
        if quota is not None and quota.counts(spec.namespace):
            job.quota = quota
        with self._jobs_lock:
            self.jobs[spec.name] = job
        metrics.JOB_FAILED.labels(spec.name).set(0)
        self._publish(job)
        return True

    # -- control ----------------------------------------------------------------------------------------
    def _apply_mutations(self, mutations: list[Mutation], epoch: int) -> list[Mutation]:
        """Apply control commands at the boundary of ``epoch``; return those applied."""
        applied: list[Mutation] = []
        for m in mutations:
            job = self.jobs.get(m.job)
            busy = self.lanes.busy(m.job)
            if m.kind == "create":
                if job is None and busy:  # the same name's lane still ends a dropped job's step
                    self._deferred.append(m)
                    continue
                if job is None and m.spec is not None:
                    self._add_job(m.spec, paused=False, rate_limit=m.spec.rate_limit)
            elif m.kind == "retry":
                if busy:  # its step is cancelled; the retry replaces the job once its lane is free
                    if job is not None:
                        self._stop_lane(job, "retried", wait=False)
                    self._deferred.append(m)
                    continue
                self._retry(m.job, epoch)
            elif m.kind == "drop":
                if not self._drop(m, epoch):
                    continue  # applied as its lane frees (nothing commits after it): _lane_freed
            elif job is not None and busy and m.kind not in ("pause", "resume", "throttle"):
                self._deferred.append(m)  # a new transform, a repair: at the job's next step
                continue
            elif job is not None:
                if m.kind == "pause":
                    job.paused = True
                elif m.kind == "resume":
                    job.paused = False
                elif m.kind == "throttle":
                    job.rate_limit = m.rate_limit
                elif not self._apply_job_mutation(job, m):
                    continue  # applied later (a repair, once it is committed)
            applied.append(m)
        return applied

    def _drop(self, m: Mutation, epoch: int) -> bool:
        """Take the job out: no step of it starts, its Spark work is cancelled, nothing of it commits.

        Returns True if its lane is free (the drop is applied now), False while its step still ends: the
        lane's thread then applies it and marks it applied as the step ends (:meth:`_lane_freed`).
        """
        name = m.job
        with self._jobs_lock:
            job = self.jobs.pop(name, None)
        if job is not None:
            self._stop_lane(job, "dropped")
            job.close()
            logger.info('job dropped job="%s" epoch=%d', name, epoch)
        with self._lane_drops_lock:  # against the lane's end: either it sees this drop or this sees it free
            if self.lanes.busy(name):
                self._lane_drops.setdefault(name, []).append((m, epoch))
                return False
        self._dropped(name)
        return True

    def _lane_freed(self, name: str) -> None:
        """The job's step ended (on its lane's thread): drops that waited for it are applied now."""
        with self._lane_drops_lock:
            waiting = self._lane_drops.pop(name, [])
        if not waiting:
            return
        self._dropped(name)
        self.registry.mark_applied([m.id for m, _ in waiting], waiting[0][1])
        logger.info('job drop applied as its lane freed job="%s"', name)

    def _dropped(self, name: str) -> None:
        """The dropped job's lane is free: what is left of it goes (repairs, crash counts, lag, metrics)."""
        self._job_failures.pop(name, None)
        with self._repairs_lock:  # nothing left to repair: applied as nothing
            self._repairs_finished += [r.id for r in self._repairs.pop(name, [])]
        self._crashes_reset(name)
        self.lanes.forget(name)
        metrics.forget_job(name)

    def _stop_lane(self, job: J, why: str, *, wait: bool = True) -> None:
        """Nothing more of the job commits: its work in flight is cancelled; ``wait``: for its commit too."""
        if not job.stop_lane(why, timeout_s=10.0 if wait else 0) and wait:
            logger.warning('job step still committing after its lane was stopped job="%s" why="%s"',
                           job.name, why)

    def _stop_busy_lanes(self, why: str) -> list[J]:
        """Stop the lanes of the jobs whose step runs now (the daemon stops); returns those jobs."""
        busy = [job for job in list(self.jobs.values()) if self.lanes.busy(job.name)]
        for job in busy:  # their work is cancelled: a lane's step ends now, nothing of it commits
            self._stop_lane(job, why, wait=False)
        return busy

    def _await_stopped_lanes(self, busy: Sequence[J], why: str, timeout_s: float) -> None:
        """Wait (``timeout_s`` each) for the commits in flight of the jobs :meth:`_stop_busy_lanes` found."""
        for job in busy:
            if not job.stop_lane(why, timeout_s=timeout_s):
                logger.warning('job step still committing at shutdown source="%s" job="%s"', self.name,
                               job.name)

    def _apply_job_mutation(self, job: J, m: Mutation) -> bool:
        """A mutation of a kind only some sources' jobs take (re-transform, repair); False: not applied yet.

        Here: none (the registry refuses them for such a job; one replayed from the log is applied as
        nothing, said so).
        """
        logger.warning('mutation not for this source\'s jobs ignored id=%d kind="%s" job="%s"',
                       m.id, m.kind, job.name)
        return True

    def _retry(self, name: str, epoch: int) -> None:
        """A retried job is built anew from its table (a running one is replaced)."""
        with self._jobs_lock:
            old = self.jobs.pop(name, None)
        if old is not None:
            old.close()
        self.lanes.forget(name)
        self._job_failures.pop(name, None)
        try:
            record = self.registry.get(name)
        except JobError:
            return
        if record.dropped or record.error is not None:  # failed again after the retry was accepted
            return
        self._crashes_reset(name)
        if self._build(record):
            logger.info('job retried job="%s" epoch=%d', name, epoch)

    # -- the jobs' epochs ---------------------------------------------------------------------------------
    def _run_jobs(self, epoch: int, runs: Sequence[JobRun[J]]) -> None:
        """Run each ``(job, run)`` of ``epoch`` (by :meth:`_run_job`), ``max_parallel_jobs`` at once.

        Returns when all have ended. A job's failure stays its own (:meth:`_run_job`); what
        :meth:`_run_job` lets through (the daemon stopping, the JVM gone) is raised here once every job's
        epoch has ended, so no job is left half-way through a commit when the source epoch fails.

        A job that had Spark work in flight when the JVM last died (:meth:`_suspect`) runs alone, after
        the others: side by side, every job in flight at a death is counted towards its quarantine, and a
        job that only ran beside the culprit would be quarantined with it.
        """
        suspect = [self._suspect(job.name) for job, _ in runs]
        for (job, _), alone in zip(runs, suspect, strict=True):
            job.alone = alone  # a suspect starts no read ahead either (one would run beside the others)
        self._run_together(epoch, [r for r, s in zip(runs, suspect, strict=True) if not s])
        for (job, run), s in zip(runs, suspect, strict=True):
            if s:  # one at a time, after the others: a next death names its job alone
                self._run_job(job, epoch, run)

    def _run_lanes(self, epoch: int, runs: Sequence[JobRun[J]], *, handed: Callable[[], None] | None = None,
                   left: Callable[[], None] | None = None) -> list[str]:
        """Hand each ``(job, run)`` of ``epoch`` to the job's lane; wait for them up to the lanes' bound.

        A job whose lane is still busy with an earlier step skips this epoch (it rejoins by offsets at its
        next one); one that has lagged past ``max_job_lag_s`` is failed. ``handed``/``left``: called as a
        step is handed and as it ends (the caller keeps the batch for the steps that outlive the epoch).
        Returns the jobs whose step still runs when the epoch ends.

        While a job is suspect (Spark work in flight at the JVM's last deaths) the epoch runs as before
        lanes: it waits for every busy lane, then for every job's step, the suspects' alone (
        :meth:`_run_jobs`): a suspect's step must have nothing of another job beside it.
        """
        started = time.monotonic()
        if any(self._suspect(job.name) for job, _ in runs):
            for name in self.lanes.busy_jobs():
                self.lanes.wait_idle(name, self.config.job_timeout_s)
            self._run_jobs(epoch, runs)
            return []
        if self._pool is None:
            self._pool = _Workers(self.config.max_parallel_jobs, f"jobs-{self.name}")
        steps: dict[str, Future[Any]] = {}
        for job, run in runs:
            job.alone = False
            if self.lanes.busy(job.name):
                lag = self.lanes.skipped(job.name)
                self._publish_lag(job.name, lag)
                if lag > self.config.max_job_lag_s:
                    self._fail(job.name, f"fell behind the live stream: its steps skipped the source's "
                                         f"epochs for {lag:.0f} s (sources[].max_job_lag_s = "
                                         f"{self.config.max_job_lag_s:g} s); retry it to rejoin by offsets")
                continue
            if handed is not None:
                handed()
            self.lanes.handing(job.name)
            step = self._pool.submit(partial(self._lane_step, job, epoch, run, left))
            self.lanes.handed(job.name, step)
            steps[job.name] = step
        still = self.lanes.wait(steps, started)
        errors = [step.exception() for step in steps.values() if step.done()]
        first = next((e for e in errors if e is not None), None)
        if first is not None:
            raise first
        if still:
            logger.info('epoch ends with lanes still busy source="%s" epoch=%d jobs=%s', self.name, epoch,
                        ",".join(still))
        return still

    def _lane_step(self, job: J, epoch: int, run: Callable[[], object],
                   left: Callable[[], None] | None) -> None:
        """One step on the job's lane: its epoch (:meth:`_run_job`), timed for the lanes' book."""
        t0 = time.monotonic()
        try:
            self._enter_lane()
            self._run_job(job, epoch, run)
        finally:
            self.lanes.ended(job.name, time.monotonic() - t0)
            if left is not None:
                left()
            self._lane_freed(job.name)

    def _run_together(self, epoch: int, runs: Sequence[JobRun[J]]) -> None:
        width = min(self.config.max_parallel_jobs, len(runs))
        if width <= 1:
            for job, run in runs:
                self._run_job(job, epoch, run)
            return
        if self._pool is None:
            self._pool = _Workers(self.config.max_parallel_jobs, f"jobs-{self.name}")
        futures = [self._pool.submit(partial(self._run_job, job, epoch, run)) for job, run in runs]
        errors = [f.exception() for f in futures]  # waits for each
        first = next((e for e in errors if e is not None), None)
        if first is not None:
            raise first

    def _close_pool(self) -> None:
        """The jobs' threads end (after a running epoch: the caller has waited for it or given up)."""
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown()

    # -- failures ----------------------------------------------------------------------------------------
    def _run_job(self, job: J, epoch: int, run: Callable[[], object]) -> None:
        """Run ``run()`` (the job's epoch); a failure is the job's alone. Publishes its progress."""
        try:
            run()
        except JobError as exc:
            if self.jobs.get(job.name) is job:
                self._fail(job.name, str(exc))
            return
        except Exception as exc:
            if self._stopping.is_set() or self._jvm_gone():
                raise  # not the job's failure: nothing of it is rebuilt or failed
            if self.jobs.get(job.name) is not job or isinstance(exc, LaneStoppedError):
                logger.info('job step stopped job="%s" epoch=%d why="%s"', job.name, epoch, one_line(exc))
                return  # dropped, retried or failed under its step: nothing of it to rebuild
            self._job_epoch_failed(job, epoch, exc)
            return
        if self.jobs.get(job.name) is not job:
            return  # dropped or replaced under its step: its progress is not published
        self._job_failures.pop(job.name, None)
        self._crashes_reset(job.name, epoch=True)
        self._publish(job)

    def _fail(self, name: str, error: str) -> None:
        """Mark the job failed (persisted), stop its reads, take it out of the epochs.

        Not while the JVM is gone: the error is then the JVM's, and the daemon is about to exit.
        """
        if self._jvm_gone():
            logger.warning('job not failed: the JVM is gone job="%s" error="%s"', name, error)
            return
        with self._jobs_lock:
            job = self.jobs.pop(name, None)
        if job is not None:
            self._stop_lane(job, f"failed: {error}", wait=False)
            job.close()
        self.lanes.forget(name)
        self._job_failures.pop(name, None)
        self.registry.set_failed(name, error)
        metrics.JOB_FAILED.labels(name).set(1)

    def _job_epoch_failed(self, job: J, epoch: int, exc: Exception) -> None:
        """An unexpected error in one job's epoch: rebuild the job from its table, or fail it."""
        error = f"{type(exc).__name__}: {one_line(exc)}"
        metrics.SOURCE_ERRORS.labels(job.name, type(exc).__name__).inc()
        count = self._job_failures.get(job.name, 0) + 1
        if count >= JOB_ATTEMPTS:
            self._fail(job.name, f"epoch {epoch} failed {count} times in a row: {error}")
            return
        logger.warning('job epoch failed, rebuilding the job from its table job="%s" epoch=%d attempt=%d '
                       'error="%s"', job.name, epoch, count, error)
        job.close()
        with self._jobs_lock:
            if self.jobs.get(job.name) is not job:
                return  # dropped or replaced meanwhile
            del self.jobs[job.name]
            record = self.registry.get(job.name)
            if record.dropped or record.error is not None:
                return
            if self._build(record):
                self._job_failures[job.name] = count

    def _publish(self, job: J) -> None:
        progress = self._progress(job)
        lag = self.lanes.lag_s(job.name)
        self.registry.publish_progress(job.name, replace(progress, lag_s=lag) if lag else progress)

    def _publish_lag(self, name: str, lag: float) -> None:
        """The job skipped an epoch: its published progress says for how long it has lagged."""
        progress = self.registry.progress(name)
        if progress is not None:
            self.registry.publish_progress(name, replace(progress, lag_s=lag))

    # -- health -----------------------------------------------------------------------------------------
    #: What keeps the source from full health without stopping it (Kafka partitions without a leader or
    #: under-replicated, as the daemon's watch last saw them): ``/health`` says ``degraded``, still 200.
    degraded: tuple[str, ...] = ()

    def health(self, stale_after_intervals: float) -> dict[str, Any]:
        """Whether the source is healthy: not failing, its last epoch recent enough."""
        age = time.time() - (self.last_epoch_at or self.started_at)
        stale_after = stale_after_intervals * self.config.trigger_interval_s
        problems = []
        if self.error is not None:
            problems.append(f"{self.failing_what} failing ({self.query_failures} in a row): {self.error}")
        if age > stale_after:
            problems.append(f"no epoch for {age:.0f}s (more than {stale_after:.0f}s)")
        lagging = {name: round(lag, 1) for name in sorted(self.jobs) if (lag := self.lanes.lag_s(name)) > 0}
        return {
            "degraded": list(self.degraded),
            "lagging_jobs": lagging,
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


class _Workers:
    """Daemon threads that run the jobs' epochs (a fixed number, kept: each has its py4j connection).

    Not a ``ThreadPoolExecutor``: its threads are joined at the interpreter's exit, so a job's epoch still
    in Spark past the shutdown timeout would hold the process up; a daemon thread does not (the epoch
    thread of Spark's ``foreachBatch`` is a daemon thread too).
    """

    def __init__(self, size: int, name: str) -> None:
        self._tasks: queue.SimpleQueue[tuple[Callable[[], Any], Future[Any]] | None] = queue.SimpleQueue()
        self._threads = [threading.Thread(target=self._work, name=f"{name}-{i}", daemon=True)
                         for i in range(size)]
        for thread in self._threads:
            thread.start()

    def submit(self, fn: Callable[[], Any]) -> Future[Any]:
        future: Future[Any] = Future()
        self._tasks.put((fn, future))
        return future

    def shutdown(self) -> None:
        """Each thread ends once the tasks queued before this call have run."""
        for _ in self._threads:
            self._tasks.put(None)

    def _work(self) -> None:
        while (task := self._tasks.get()) is not None:
            fn, future = task
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(fn())
            except BaseException as exc:  # noqa: BLE001 - handed to the waiting epoch thread
                future.set_exception(exc)
