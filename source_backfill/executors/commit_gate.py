"""A job's commit gate: once its lane is stopped, nothing of the job commits any more.

A job's step runs on its lane (``runtime/lanes.py``) and may outlive the source's epoch; a drop, a retry, a
failure or the daemon stopping must not wait for it. They :meth:`CommitGate.stop` the gate (and cancel the
job's Spark work), and every write that commits to the job's table runs inside
:meth:`CommitGate.committing`, which checks the gate under the same lock: once ``stop`` has taken that lock,
no commit of the job lands after it. Both job kinds (a Kafka source's, a Delta source's) hold one.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from source_backfill.errors import LaneStoppedError


class CommitGate:
    """Whether ``job`` may still commit, and the lock its commits hold."""

    def __init__(self, job: str) -> None:
        self.job = job
        #: Why the lane was stopped (dropped, retried, failed, the daemon stopping, closed); None: running.
        self.stopped: str | None = None
        self._lock = threading.Lock()

    def close(self, why: str) -> None:
        """Refuse commits from now on (the first reason stays), without waiting for one in flight."""
        if self.stopped is None:
            self.stopped = why

    def stop(self, why: str, timeout_s: float, cancel: Callable[[str], object] | None = None) -> bool:
        """Refuse commits from now on, ``cancel`` the job's work, and wait for a commit in flight to end.

        Returns False if that commit took more than ``timeout_s`` (it may still land: the caller says so);
        ``timeout_s <= 0`` does not wait.
        """
        self.close(why)
        if cancel is not None:
            cancel(why)
        if timeout_s <= 0 or not self._lock.acquire(timeout=timeout_s):
            return False
        self._lock.release()
        return True

    @contextmanager
    def committing(self) -> Iterator[None]:
        """Held around each write that commits to the job's table: :class:`LaneStoppedError` once stopped."""
        with self._lock:
            if self.stopped is not None:
                msg = f"job {self.job} commits nothing more: {self.stopped}"
                raise LaneStoppedError(msg)
            yield
