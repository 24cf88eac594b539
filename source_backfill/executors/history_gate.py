"""A source's history slots shared by its jobs' threads: copies start in turn, within the width.

The rules are the core's (``core.slots.HistorySlots``); this keeps them behind a lock for the epochs'
threads and the reads' threads, and asks the job next in turn to try at once when a copy ends (it would
otherwise wait for its next epoch with the slot idle).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from source_backfill import metrics
from source_backfill.config import DEFAULT_NAMESPACE
from source_backfill.core.slots import HistorySlots

logger = logging.getLogger(__name__)


class HistoryGate:
    """One source's :class:`HistorySlots`, thread-safe, with each waiting job's way to try again."""

    def __init__(self, stale_s: float, clock: Callable[[], float] = time.monotonic,
                 shares: dict[str, float] | None = None, source: str = "",
                 by_namespace: bool = False) -> None:
        #: Each job's namespace, as it said when it asked (the turns go by namespace with tenants).
        self._namespaces: dict[str, str] = {}
        self._slots = HistorySlots(stale_s=stale_s, shares=dict(shares or {}),
                                   namespace_of=self._namespace_of if by_namespace else None)
        self._source = source
        self._lock = threading.Lock()
        self._clock = clock
        self._retry: dict[str, Callable[[], None]] = {}

    def resize(self, tasks: int, duty: float) -> None:
        """The width governor's answer: ``tasks`` at once, and below one task ``duty`` of the time."""
        with self._lock:
            self._slots.resize(tasks, duty)

    def _namespace_of(self, job: str) -> str:
        return self._namespaces.get(job, DEFAULT_NAMESPACE)

    def take(self, job: str, tasks: int, retry: Callable[[], None],
             namespace: str = DEFAULT_NAMESPACE) -> bool:
        """Whether ``job`` (of ``namespace``) may start a copy of ``tasks`` tasks now.

        If not, ``retry`` is called at its turn.
        """
        with self._lock:
            self._namespaces[job] = namespace
            granted = self._slots.take(job, tasks, self._clock())
            if granted:
                self._retry.pop(job, None)
            else:
                self._retry[job] = retry
            return granted

    def give_back(self, job: str, seconds: float) -> None:
        """``job``'s copy ended after ``seconds``: its slots are free; the next job in turn tries now."""
        with self._lock:
            tasks = self._slots.held.get(job, 0)
            following = self._slots.give_back(job, seconds, self._clock())
            retry = None if following is None else self._retry.get(following)
        if tasks:
            metrics.HISTORY_SLOT_SECONDS.labels(self._source, self._namespace_of(job)).inc(
                tasks * max(0.0, seconds))
        self._nudge(following, retry)

    @staticmethod
    def _nudge(job: str | None, retry: Callable[[], None] | None) -> None:
        """Ask ``job``, next in turn, to try now (outside the lock: it takes its own and then the gate's)."""
        if retry is None:
            return
        try:
            retry()
        except Exception:  # noqa: BLE001 - that job tries again at its next epoch
            logger.warning('history copy not started in turn job="%s"', job, exc_info=True)

    def withdraw(self, job: str) -> None:
        """``job`` has nothing to copy now: out of the queue; the next job in turn tries if it may start."""
        with self._lock:
            following = self._slots.withdraw(job, self._clock())
            retry = None if following is None else self._retry.get(following)
        self._nudge(following, retry)

    def leave(self, job: str) -> None:
        """``job`` stops copying (closed): out of the queue, its slots free."""
        with self._lock:
            self._slots.leave(job)
            self._retry.pop(job, None)
            self._namespaces.pop(job, None)

    def holding(self) -> dict[str, int]:
        """Tasks each running copy holds, by job."""
        with self._lock:
            return dict(self._slots.held)
