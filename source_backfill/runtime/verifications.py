"""Verify runs in the background: ``POST /jobs/{name}/verify`` starts one, ``GET .../verify/{id}`` polls it.

A run checks a job's table against its source (:func:`source_backfill.verify.verify_job` for a Kafka job):
it may read the whole table and the log, so it runs on a thread of its own and the API answers at once
with a handle. One run per job at a time (asking again while one runs returns that one), at most
:data:`MAX_RUNNING` at once over all jobs; the last :data:`KEEP` finished runs are kept, in memory only.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from source_backfill.errors import JobError, JobNotFoundError, SourceBackfillError, one_line

logger = logging.getLogger(__name__)

#: Runs at once, over all jobs (each scans a table and reads a log: 2 cores are easily taken).
MAX_RUNNING = 2
#: Finished runs kept to be polled.
KEEP = 32

RunStatus = Literal["running", "done", "refused", "error"]


@dataclass
class VerifyRun:
    """One run: ``done`` with the result (``ok`` says whether exactly once), or ``refused``/``error`` why."""

    id: str
    job: str
    status: RunStatus = "running"
    started_at: float = field(default_factory=time.time)
    finished_at: float | None = None
    result: dict[str, Any] | None = None
    error: str | None = None

    def to_json(self) -> dict[str, Any]:
        """The API's view of the run."""
        result = self.result or {}
        return {"id": self.id, "job": self.job, "status": self.status, "started_at": self.started_at,
                "finished_at": self.finished_at, "ok": result.get("ok"), "summary": result.get("summary"),
                "result": self.result, "error": self.error}


class Verifications:
    """The runs: started by the API, each on a thread; ``check`` (quick) refuses before a run starts."""

    def __init__(self, check: Callable[[str], Callable[[], Any]],
                 redact: Callable[[str], str] = lambda text: text) -> None:
        #: ``check(job)`` raises why the job cannot be verified, else returns the run's work (no args,
        #: returns an object with ``to_json()``).
        self._check = check
        #: A run's error is served by the API: no path of the daemon's own in it.
        self._redact = redact
        self._lock = threading.Lock()
        self._runs: dict[str, VerifyRun] = {}

    def start(self, job: str) -> VerifyRun:
        """Start a run for ``job`` (or return the one running); the check's refusal raises here."""
        with self._lock:
            running = next((r for r in self._runs.values() if r.job == job and r.status == "running"), None)
            if running is not None:
                return running
            if sum(r.status == "running" for r in self._runs.values()) >= MAX_RUNNING:
                msg = f"{MAX_RUNNING} verify runs are running already: ask again when one is done"
                raise JobError(msg)
        work = self._check(job)  # outside the lock: it opens the job's table
        run = VerifyRun(id=uuid.uuid4().hex[:12], job=job)
        with self._lock:
            self._runs[run.id] = run
            self._trim()
        threading.Thread(target=self._run, args=(run, work), name=f"verify-{job}", daemon=True).start()
        logger.info('verify started job="%s" id="%s"', job, run.id)
        return run

    def get(self, job: str, run_id: str) -> VerifyRun:
        """The run ``run_id`` of ``job``; JobNotFoundError when unknown (or no longer kept)."""
        with self._lock:
            run = self._runs.get(run_id)
            if run is None or run.job != job:
                msg = f'no verify run "{run_id}" of job "{job}" (finished runs are kept while there are few)'
                raise JobNotFoundError(msg)
            return run

    def _run(self, run: VerifyRun, work: Callable[[], Any]) -> None:
        try:
            result = work().to_json()
            status: RunStatus = "done"
            error = None
        except SourceBackfillError as exc:
            result, status, error = None, "refused", self._redact(one_line(exc))
        except Exception as exc:  # noqa: BLE001 - a broker outage, an unreadable file: said in the run
            logger.exception('verify failed job="%s" id="%s"', run.job, run.id)
            result, status, error = None, "error", self._redact(f"{type(exc).__name__}: {one_line(exc)}")
        with self._lock:
            run.result, run.status, run.error, run.finished_at = result, status, error, time.time()
        logger.info('verify done job="%s" id="%s" status="%s" ok=%s', run.job, run.id, status,
                    None if result is None else result.get("ok"))

    def _trim(self) -> None:
        done = [r for r in self._runs.values() if r.status != "running"]
        for r in sorted(done, key=lambda r: r.started_at)[: max(0, len(done) - KEEP)]:
            del self._runs[r.id]
