"""A job's Spark work: under a job tag of its own with a deadline, and durably marked while it runs.

All jobs of all sources share one Spark JVM, and every job of a source shares each epoch. So a job's
transform must not be able to stall the others forever, nor take the JVM down again and again:

* **deadline**: :meth:`SparkWork.running` runs a job's Spark work (its epoch's writes, a history read
  ahead) with a Spark job tag of its own, added on the thread that runs it. Past ``timeout_s`` the tag's
  jobs are cancelled (again at every :meth:`SparkWork.tick` until the work returns), and the error that
  comes out is a :class:`~source_backfill.errors.SparkWorkTimeoutError` naming the deadline: that job
  fails alone, the others of the epoch commit.
* **attribution**: before the work starts, :class:`WorkLedger` writes a marker file naming the job and
  the kind of work (``epoch``, ``read-ahead``) under ``state_root/spark-work/`` (fsynced) and removes it
  when the work ends. A work that ends in an error while the JVM is gone keeps its marker. So when the
  JVM dies (the watchdog writes down why and makes the daemon exit) the markers name exactly the jobs
  whose Spark work was in flight: never every job of the source. At the next start
  :meth:`WorkLedger.recover` adds one crash to each of them. Markers left by a daemon killed as a whole
  (no death written down: ``kill -9`` of the process group, a deploy) count nothing. The count starts
  from 0 again once work of a kind that was in flight completes (an epoch commits; a read ahead
  finishes): a job whose read ahead takes the JVM down while its epochs commit is still counted. A job
  at ``quarantine_after_crashes`` is failed (quarantined) by the daemon before it runs again, until it
  is retried.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from source_backfill import metrics
from source_backfill.errors import SparkWorkCancelledError, SparkWorkTimeoutError

logger = logging.getLogger(__name__)

#: Where the ledger lives under the state root.
LEDGER_DIR = "spark-work"
#: The crash counts (JSON), rewritten atomically.
CRASHES_FILE = "crashes.json"
#: Why the JVM died, written by the watchdog before the daemon exits (read at the next start).
DEATH_FILE = "jvm-died.json"
_MARKER_SUFFIX = ".running"


#: The kinds of a job's Spark work: its epoch's writes, a history read ahead.
EPOCH = "epoch"
READ_AHEAD = "read-ahead"


@dataclass(frozen=True)
class Crashes:
    """A job's crashes in a row with its Spark work in flight, and what the last one was.

    ``kinds``: the kinds of its work in flight at them (a work of one of them completing resets the count).
    """

    count: int
    last: str
    kinds: frozenset[str] = frozenset()


class WorkLedger:
    """Durable record of which jobs run Spark work now, and of the crashes each was in flight at.

    Thread-safe: the epoch thread and the read-ahead threads mark their jobs concurrently.
    """

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        #: Works in flight per (job, kind).
        self._running: dict[tuple[str, str], int] = {}
        #: Set once the JVM is gone: no marker is removed any more, whatever ends.
        self._frozen = False
        self.crashes: dict[str, Crashes] = self._load()

    # -- while running -------------------------------------------------------------------------------
    def begin(self, job: str, kind: str = EPOCH) -> None:
        """``job``'s Spark work of ``kind`` starts: its marker is on disk (fsynced) before this returns."""
        with self._lock:
            n = self._running.get((job, kind), 0)
            self._running[job, kind] = n + 1
            if n == 0:
                _write_durably(self._marker(job, kind), json.dumps(
                    {"job": job, "kind": kind, "since": datetime.now(UTC).isoformat(),
                     "pid": os.getpid()}).encode())

    def end(self, job: str, kind: str = EPOCH, *, keep: bool = False) -> None:
        """``job``'s Spark work of ``kind`` ended; ``keep``: because the JVM is gone (the marker stays)."""
        with self._lock:
            n = self._running.get((job, kind), 0) - 1
            if n > 0:
                self._running[job, kind] = n
                return
            self._running.pop((job, kind), None)
            if keep or self._frozen:
                return
            self._marker(job, kind).unlink(missing_ok=True)

    def in_flight(self) -> list[str]:
        """The jobs whose markers are on disk now."""
        return sorted({job for job, _ in self._markers()})

    def _markers(self) -> list[tuple[str, str]]:
        found = []
        for path in self.root.glob("*" + _MARKER_SUFFIX):
            job, _, kind = path.name.removesuffix(_MARKER_SUFFIX).rpartition(".")
            found.append((job, kind))
        return found

    def jvm_died(self, reason: str) -> list[str]:
        """The JVM is gone: keep every marker, write down why; return the jobs in flight."""
        with self._lock:
            self._frozen = True
            jobs = self.in_flight()
            try:
                _write_durably(self.root / DEATH_FILE, json.dumps(
                    {"reason": reason, "jobs": jobs, "at": datetime.now(UTC).isoformat()}).encode())
            except OSError as exc:  # the markers still say who was in flight
                logger.error('cannot record the JVM death path="%s" error="%s"', self.root, exc)
            return jobs

    # -- at start and after epochs --------------------------------------------------------------------
    def recover(self, registered: set[str]) -> dict[str, Crashes]:
        """At start: after a JVM death, one more crash for every job a marker names; markers and note go.

        Markers without a death note (the daemon was killed as a whole) are only logged. Jobs no longer
        registered are forgotten. Returns the crash counts (also in :attr:`crashes`).
        """
        with self._lock:
            death = self.root / DEATH_FILE
            reason = None
            try:
                reason = "Spark's JVM died: " + str(json.loads(death.read_text())["reason"])
            except (OSError, ValueError, KeyError, TypeError):
                pass
            at = datetime.now(UTC).isoformat(timespec="seconds")
            kinds: dict[str, set[str]] = {}
            for job, kind in self._markers():
                kinds.setdefault(job, set()).add(kind)
            if reason is None and kinds:
                logger.info('the daemon ended with Spark work in flight but no JVM death was seen (killed '
                            'as a whole?): no crash counted jobs="%s"', ",".join(sorted(kinds)))
                kinds = {}
            for job, running in sorted(kinds.items()):
                before = self.crashes.get(job)
                self.crashes[job] = Crashes((before.count if before else 0) + 1, f"{reason} ({at})",
                                            frozenset(running) | (before.kinds if before else frozenset()))
                logger.warning('job was running Spark work when the daemon went down job="%s" crashes=%d '
                               'reason="%s"', job, self.crashes[job].count, reason)
            self.crashes = {j: c for j, c in self.crashes.items() if j in registered}
            self._save()
            for marker in self.root.glob("*" + _MARKER_SUFFIX):
                marker.unlink(missing_ok=True)
            death.unlink(missing_ok=True)
            return dict(self.crashes)

    def completed(self, job: str, kind: str) -> None:
        """``job``'s work of ``kind`` completed: if that kind was in flight at its crashes, they are over."""
        crashes = self.crashes.get(job)  # the epoch's hot path: a look-up, no write
        if crashes is not None and kind in crashes.kinds:
            self.reset(job)

    def reset(self, job: str) -> None:
        """``job``'s crash count starts from 0 (retried, dropped, or its crashing work completed)."""
        if job not in self.crashes:
            return
        with self._lock:
            if self.crashes.pop(job, None) is not None:
                self._save()
        metrics.JOB_CRASHES.labels(job).set(0)
        metrics.JOB_QUARANTINED.labels(job).set(0)

    # -- internals --------------------------------------------------------------------------------------
    def _marker(self, job: str, kind: str) -> Path:
        return self.root / f"{job}.{kind}{_MARKER_SUFFIX}"

    def _load(self) -> dict[str, Crashes]:
        path = self.root / CRASHES_FILE
        try:
            raw = json.loads(path.read_text())
            return {str(j): Crashes(int(c["count"]), str(c["last"]), frozenset(map(str, c.get("kinds", []))))
                    for j, c in raw["jobs"].items()}
        except FileNotFoundError:
            return {}
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            logger.error('crash counts unreadable, starting from none path="%s" error="%s"', path, exc)
            return {}

    def _save(self) -> None:
        data = {"v": 1, "jobs": {j: {"count": c.count, "last": c.last, "kinds": sorted(c.kinds)}
                                 for j, c in self.crashes.items()}}
        _write_durably(self.root / CRASHES_FILE, json.dumps(data, indent=1).encode())


@dataclass
class _Work:
    job: str
    what: str
    timeout_s: float
    deadline: float
    expired: bool = False
    #: Why the work was cancelled by its job's control (a drop, a retry, the daemon stopping); None: not.
    cancelled: str | None = None


class SparkWork:
    """Runs jobs' Spark work under a job tag each, with a deadline, marked in the :class:`WorkLedger`.

    ``alive()``: whether Spark's JVM still answers (the watchdog's check); a work that fails while it does
    not keeps its marker. :meth:`tick` (the watchdog calls it every second) cancels works past their
    deadline.
    """

    def __init__(self, spark: Any, ledger: WorkLedger, alive: Callable[[], bool]) -> None:
        self._sc = spark.sparkContext
        self.ledger = ledger
        self._alive = alive
        self._lock = threading.Lock()
        self._works: dict[str, _Work] = {}

    def alive(self) -> bool:
        """Whether Spark's JVM answers now."""
        return self._alive()

    @contextmanager
    def running(self, job: str, what: str, timeout_s: float, kind: str = EPOCH) -> Iterator[None]:
        """Run the body as ``job``'s Spark work of ``kind``, cancelled past ``timeout_s``.

        ``what`` names the work in messages. Completed, it resets the job's crash count if work of that
        kind was in flight at its crashes. The tag is added on the calling thread: run the body's Spark
        actions on this thread.
        """
        tag = f"source-backfill-{job}-{uuid.uuid4().hex[:12]}"
        work = _Work(job, what, timeout_s, time.monotonic() + timeout_s)
        self.ledger.begin(job, kind)
        failed = True
        try:
            self._sc.addJobTag(tag)
            with self._lock:
                self._works[tag] = work
            yield
            failed = False
        except Exception as exc:
            if work.cancelled is not None:
                msg = f"{what} was cancelled: {work.cancelled}"
                raise SparkWorkCancelledError(msg) from exc
            if work.expired:
                msg = (f"{what} ran past its deadline of {timeout_s:g} s (sources[].job_timeout_s): its "
                       "Spark jobs were cancelled and the job failed alone (retry it to run it again)")
                raise SparkWorkTimeoutError(msg) from exc
            raise
        finally:
            with self._lock:
                self._works.pop(tag, None)
            try:
                self._sc.removeJobTag(tag)
            except Exception:  # noqa: BLE001 - the JVM may be gone; the marker decides below
                failed = True
            self.ledger.end(job, kind, keep=failed and not self._alive())
        if not failed:
            self.ledger.completed(job, kind)

    def cancel(self, job: str, why: str) -> int:
        """Cancel every Spark work of ``job`` in flight now (its job tags), and again each tick until it ends.

        A work that does not start a Spark job right away (its next one comes later in the body) is
        cancelled at that one's tick. Returns the works found.
        """
        now = time.monotonic()
        with self._lock:
            works = [(tag, w) for tag, w in self._works.items() if w.job == job]
            for _, work in works:
                work.cancelled = why
                work.deadline = min(work.deadline, now)
        for tag, _ in works:
            self._sc.cancelJobsWithTag(tag)
        if works:
            logger.info('job Spark work cancelled job="%s" works=%d why="%s"', job, len(works), why)
        return len(works)

    def tick(self) -> None:
        """Cancel the Spark jobs of every work past its deadline (again each tick until it returns)."""
        now = time.monotonic()
        with self._lock:
            late = [(tag, w) for tag, w in self._works.items() if now >= w.deadline]
        for tag, work in late:
            if not work.expired and work.cancelled is None:
                work.expired = True
                metrics.SPARK_WORK_TIMEOUTS.labels(work.job).inc()
                logger.error('job Spark work past its deadline, cancelling it job="%s" work="%s" '
                             'timeout_s=%g', work.job, work.what, work.timeout_s)
            self._sc.cancelJobsWithTag(tag)


def _write_durably(path: Path, data: bytes) -> None:
    """Write ``path`` atomically (temporary file, fsync, rename) and fsync its directory."""
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
