"""Each job's lane: its steps (its epochs) in order, one at a time, never holding its source's epoch.

A source's epoch reads its batch once and hands every job whose lane is free its step
(:meth:`source_backfill.runtime.jobs.JobHost._run_lanes`). It waits for those steps up to
:func:`lane_wait_s` (two triggers), so a job that keeps up ends its step inside the epoch as before; a
step still running then goes on alone, and the source's next epochs do not wait for it. A job whose lane
is still busy when the next epoch comes **skips** that epoch: its next step does not start where its
output ends, and the job rejoins by offsets (``core.plan.rejoin``: its splits read the skipped offsets
from Kafka, or the archive, and hand over by the row rules). That is a lane's whole backlog: a bound of
zero pending epochs, kept as offset ranges by the job's own output positions (nothing to spill, nothing
to lose on a crash; a queue of kept batches would only save the re-read of a few seconds of records).

This module keeps the lanes' book: which step is in flight, which jobs ran slower than the wait lately
(the epoch does not wait for those), and each job's lag: the age of the oldest epoch it skipped whose
records its output does not hold yet (a metric, its status, and past ``max_job_lag_s`` the job is failed —
the source's checkpoint moves on without a lagging job, and a lag past the topic's retention would lose
records). A step handed after skips reads the skipped offsets (its rejoin), so the skipped epochs stay the
job's lag until that step ends; epochs skipped while it ran are the lag from then on. A job whose every
step is a rejoin slower than the trigger is therefore as far behind as a step and a trigger, not behind
since its first skip: its lag stays bounded and it is never failed for it.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future, wait
from typing import Any

from source_backfill import metrics

#: How many triggers a source's epoch waits for the steps it handed out before it ends without them.
WAIT_TRIGGERS = 2.0

#: How many steps in a row a slow job must end within the wait before the epoch waits for it again. One
#: was not enough: a heavy job's step after its skips is its rejoin's first commit (its splits back to
#: Backfilling, no rows, 0.3 s), the job counted as keeping up, and the epoch then waited the whole
#: ``wait_s`` for its next heavy step: a second of every neighbour's live latency each time.
FAST_STEPS_TO_WAIT = 3


def lane_wait_s(trigger_interval_s: float) -> float:
    """How long a source's epoch waits for its jobs' steps (two triggers)."""
    return WAIT_TRIGGERS * trigger_interval_s


def enter_lane_pool(spark: Any) -> str:
    """Put the Spark work of the step running on this thread in a FAIR pool of the thread's own.

    Every job's step used to run in the ``default`` pool, FIFO inside: a heavy step's queued tasks went
    before a neighbour's next ones. A pool per lane thread (``lane-<thread>``: a source's lane threads are
    a fixed few, so the pools are too; Spark never drops one) lets FAIR give a freed task slot to the pool
    running the fewest tasks, so a light job's next task goes before a heavy one's queue. FAIR cannot take
    back a slot a running task holds. The live stream keeps ``default`` (weight 2, one slot guaranteed).
    Returns the pool's name.
    """
    pool = f"lane-{threading.current_thread().name}"
    spark.sparkContext.setLocalProperty("spark.scheduler.pool", pool)
    return pool


class Lanes:
    """The book of one source's lanes: steps in flight, slow lanes, lag per job. Thread-safe."""

    def __init__(self, wait_s: float) -> None:
        self.wait_s = wait_s
        self._lock = threading.Lock()
        #: The step in flight per job (queued or running).
        self._steps: dict[str, Future[object]] = {}
        #: Jobs with a step past ``wait_s`` not followed by ``FAST_STEPS_TO_WAIT`` steps within it: how many
        #: such steps they have had since. Their steps are not waited for.
        self._slow: dict[str, int] = {}
        #: When each job first skipped an epoch since its step in flight was handed: records no step holds.
        self._skipped_since: dict[str, float] = {}
        #: The skips the job's step in flight reads (its rejoin): still its lag until that step ends.
        self._covering_since: dict[str, float] = {}

    def busy(self, job: str) -> bool:
        """Whether the job has a step in flight (queued behind others, or running)."""
        with self._lock:
            step = self._steps.get(job)
        return step is not None and not step.done()

    def busy_jobs(self) -> list[str]:
        """The jobs with a step in flight."""
        with self._lock:
            return sorted(name for name, step in self._steps.items() if not step.done())

    def handing(self, job: str) -> None:
        """The job's next step is about to start: it reads the epochs the job skipped so far (its rejoin)."""
        with self._lock:
            since = self._skipped_since.pop(job, None)
            if since is None:
                self._covering_since.pop(job, None)
            else:
                self._covering_since[job] = since

    def handed(self, job: str, step: Future[object]) -> None:
        """The job's step (announced by :meth:`handing`) was handed to its lane."""
        with self._lock:
            self._steps[job] = step

    def wait(self, steps: dict[str, Future[object]], started: float) -> list[str]:
        """Wait for the ``steps`` of jobs not known to be slow, up to ``wait_s`` after ``started``.

        Returns the jobs whose step is still running then (they go on alone).
        """
        with self._lock:
            waited = [step for name, step in steps.items() if name not in self._slow]
        wait(waited, timeout=max(0.0, started + self.wait_s - time.monotonic()))
        return sorted(name for name, step in steps.items() if not step.done())

    def wait_idle(self, job: str, timeout_s: float) -> bool:
        """Wait until the job's lane is free (its step ended); False after ``timeout_s``."""
        with self._lock:
            step = self._steps.get(job)
        if step is None:
            return True
        done, _ = wait([step], timeout=timeout_s)
        return bool(done)

    def ended(self, job: str, seconds: float, now: float | None = None) -> None:
        """The job's step ended after ``seconds``; its lag is now only the epochs skipped while it ran.

        Its output holds every epoch up to the one it was handed (a rejoin's included); none skipped
        meanwhile: it keeps up. A step longer than the wait makes the job slow: the epoch does not wait for
        its next steps, until ``FAST_STEPS_TO_WAIT`` of them in a row have ended within it (:meth:`waited`).
        """
        metrics.JOB_STEP_DURATION.labels(job).observe(seconds)
        now = time.monotonic() if now is None else now
        with self._lock:
            self._steps.pop(job, None)  # free from now (its thread only has its book-keeping left)
            if seconds > self.wait_s:
                self._slow[job] = 0
            elif job in self._slow:
                self._slow[job] += 1
                if self._slow[job] >= FAST_STEPS_TO_WAIT:
                    del self._slow[job]
            self._covering_since.pop(job, None)
            since = self._skipped_since.get(job)
        metrics.JOB_LAG_SECONDS.labels(job).set(0.0 if since is None else now - since)

    def skipped(self, job: str, now: float | None = None) -> float:
        """The job's lane was busy when an epoch came: it skips it. Returns the job's lag (:meth:`lag_s`)."""
        now = time.monotonic() if now is None else now
        with self._lock:
            self._skipped_since.setdefault(job, now)
        lag = self.lag_s(job, now)
        metrics.JOB_EPOCHS_SKIPPED.labels(job).inc()
        metrics.JOB_LAG_SECONDS.labels(job).set(lag)
        return lag

    def lag_s(self, job: str, now: float | None = None) -> float:
        """Seconds since the oldest skipped epoch the job's output does not hold yet (0: it keeps up)."""
        now = time.monotonic() if now is None else now
        with self._lock:
            marks = (self._skipped_since.get(job), self._covering_since.get(job))
        since = [t for t in marks if t is not None]
        return now - min(since) if since else 0.0

    def waited(self, job: str) -> bool:
        """Whether the epoch waits for the job's steps (it is not slow, or no longer)."""
        with self._lock:
            return job not in self._slow

    def forget(self, job: str) -> None:
        """The job left (dropped, failed, rebuilt): its lag and slowness start anew."""
        with self._lock:
            self._slow.pop(job, None)
            self._skipped_since.pop(job, None)
            self._covering_since.pop(job, None)
