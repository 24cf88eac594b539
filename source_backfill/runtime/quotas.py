"""The namespaces' daily table bytes (``namespaces[].max_bytes_per_day``): counted, saved, enforced.

Each job counts its table after each commit that landed (:meth:`TableBytes.count`: the versions since
the job's last count, read from the table's log, ``core.quota``). The ledger is saved whole (a temporary
file renamed over ``state_root/quota.json``) at most once a second and at close, its counts and its
versions together: after a crash the first commit of each job counts again from the saved version, so
nothing is counted twice or missed.

A namespace that has written its bytes of the day (UTC) is *held*: its jobs read no history (their
history copies pause, as ``pause`` does, until the next day), its creates are refused with
``quota_exceeded``, and its jobs' live rows are still committed (and counted).
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

from connectors.delta.log import added_bytes
from source_backfill import metrics
from source_backfill.config import NamespaceConfig
from source_backfill.core.quota import DayLedger, day_of
from source_backfill.errors import QuotaExceededError, StateFormatError, one_line

logger = logging.getLogger(__name__)

#: The ledger's file under the state root.
FILE_NAME = "quota.json"
#: Seconds between two saves of the ledger (each save is whole; a crash loses no count, see the module).
SAVE_EVERY_S = 1.0


class TableBytes:
    """The ledger of the namespaces that bound their daily bytes, thread-safe (the jobs' lanes count)."""

    def __init__(self, state_root: Path, namespaces: Mapping[str, NamespaceConfig],
                 clock: Callable[[], float] = time.time) -> None:
        self.path = Path(state_root) / FILE_NAME
        self.limits = {name: n.max_bytes_per_day for name, n in namespaces.items()
                       if n.max_bytes_per_day is not None}
        self._clock = clock
        self._lock = threading.Lock()
        self._ledger = self._load()
        self._saved_at = 0.0
        self._dirty = False
        self._held: set[str] = set()
        self._publish(day_of(clock()))

    def _load(self) -> DayLedger:
        if not self.path.exists():
            return DayLedger(day=day_of(self._clock()))
        try:
            return DayLedger.from_json(json.loads(self.path.read_text(encoding="utf-8")))
        except (OSError, ValueError) as exc:
            msg = (f"{self.path} cannot be read ({one_line(exc)}): remove it to count the namespaces' "
                   "bytes of the day from the jobs' next commits on")
            raise StateFormatError(msg) from exc

    def counts(self, namespace: str) -> bool:
        """Whether ``namespace`` bounds its daily bytes (its jobs count their commits)."""
        return namespace in self.limits

    def count(self, job: str, namespace: str, table: str, version: int | None) -> None:
        """``job`` of ``namespace`` committed ``version`` of its local table at ``table``: count it."""
        if version is None or namespace not in self.limits:
            return
        today = day_of(self._clock())
        try:
            with self._lock:
                new = job not in self._ledger.versions
                counted = self._ledger.count(job, namespace, version, today,
                                             lambda v: added_bytes(table, v))
                self._dirty = True
                self._publish(today)
        except (OSError, StateFormatError) as exc:  # the commit has landed: a count is not its failure
            logger.warning('table bytes not counted job="%s" version=%d error="%s"', job, version,
                           one_line(exc))
            return
        if counted:
            metrics.NAMESPACE_BYTES_WRITTEN.labels(namespace).inc(counted)
        self.save(force=new)  # a job's first count at once: until saved, a crash would start it anew

    def held(self, namespace: str) -> str | None:
        """Why ``namespace``'s history copies are held now (its bytes of the day written); None: not held."""
        limit = self.limits.get(namespace)
        if limit is None:
            return None
        today = day_of(self._clock())
        with self._lock:
            used = self._ledger.used(namespace, today)
            if used < limit:
                if namespace in self._held:
                    self._publish(today)
                return None
            if namespace not in self._held:
                self._publish(today)
        return (f'namespace "{namespace}" wrote {used:,} bytes to its tables today (UTC), its '
                f"max_bytes_per_day {limit:,}: history copies resume tomorrow")

    def check_create(self, namespace: str) -> None:
        """QuotaExceededError when ``namespace`` has written its bytes of the day."""
        why = self.held(namespace)
        if why is not None:
            metrics.QUOTA_REFUSALS.labels(namespace, "max_bytes_per_day").inc()
            why = why.replace("history copies resume", "creates are refused until")
            raise QuotaExceededError(why, namespace)

    def forget(self, jobs: Iterable[str]) -> None:
        """Dropped jobs leave the ledger."""
        with self._lock:
            self._ledger.forget(jobs)
            self._dirty = True

    def save(self, *, force: bool = False) -> None:
        """Write the ledger whole (renamed over the file), at most once a second unless ``force``."""
        with self._lock:
            now = time.monotonic()
            if not self._dirty or (not force and now - self._saved_at < SAVE_EVERY_S):
                return
            text = json.dumps(self._ledger.to_json(), sort_keys=True)
            self._dirty = False
            self._saved_at = now
            tmp = self.path.with_suffix(".tmp")
            try:
                tmp.write_text(text, encoding="utf-8")
                os.replace(tmp, self.path)
            except OSError as exc:
                self._dirty = True
                logger.warning('quota ledger not saved path="%s" error="%s"', self.path, one_line(exc))

    def _publish(self, today: int) -> None:
        """The held gauge per namespace (under the lock)."""
        for namespace, limit in self.limits.items():
            over = self._ledger.over(namespace, limit, today)
            metrics.NAMESPACE_HISTORY_HELD.labels(namespace).set(1 if over else 0)
            if over and namespace not in self._held:
                logger.warning('namespace history held namespace="%s" bytes_today=%d max_bytes_per_day=%d',
                               namespace, self._ledger.used(namespace, today), limit)
            (self._held.add if over else self._held.discard)(namespace)


__all__ = ["FILE_NAME", "TableBytes"]
