"""A created job starts reading its history before the epoch that attaches it.

A job of a Kafka source is built and attached at an epoch boundary: its attach needs the exact live
position of a batch's start. The offsets below where the live stream stands already are history whichever
epoch attaches the job, so their copy need not wait for it. When a create is queued, the source builds
the job at once and starts its first read ahead, of ``[start, the next batch's start)``
(:meth:`SourceBackfillJob.read_early`); the epoch that applies the create takes that job, and its attach
(or a later epoch) adopts the read by the rule of every read ahead (:func:`core.adopt_history`). A copy
then ends one trigger interval sooner: its reads no longer start after the attach's epoch.

What is built early is only ever the job the create would build: the same spec, from the same table.
A build that fails is left to the epoch (which builds it again and fails it, saying why); a job built
early whose create was drained meanwhile is closed (its reads thrown away, nothing committed).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from source_backfill.errors import one_line

if TYPE_CHECKING:
    from source_backfill.config import JobSpec
    from source_backfill.executors.source_backfill import SourceBackfillJob
    from source_backfill.runtime.registry import JobRegistry

logger = logging.getLogger(__name__)


class EarlyJobs:
    """The jobs of one source built before the epoch that applies their create (see the module)."""

    def __init__(
        self,
        source: str,
        registry: JobRegistry,
        build: Callable[[JobSpec], SourceBackfillJob],
        positions: Callable[[], Mapping[str, int] | None],
        may_build: Callable[[str], bool],
        tasks: Callable[[], int],
    ) -> None:
        """What the source lends: how it builds a job, where its live stream stands.

        ``build(spec)``: the job, recovered from its table; ``positions()``: where the live stream's next
        batch starts (None: not known yet); ``may_build(name)``: not built by the source already, nor
        suspect; ``tasks()``: the history tasks of one more job backfilling.
        """
        self.source = source
        self.registry = registry
        self._build = build
        self._positions = positions
        self._may_build = may_build
        self._tasks = tasks
        self._jobs: dict[str, SourceBackfillJob] = {}
        #: Held while a job is built, and while the epoch takes one.
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Build early from now on: whenever a mutation of the source's jobs is queued."""
        self._thread = threading.Thread(target=self._loop, name=f"early-{self.source}", daemon=True)
        self._thread.start()
        self.registry.on_mutation(self.source, self._wake.set)

    def take(self, spec: JobSpec) -> SourceBackfillJob | None:
        """The job built early for ``spec`` (the epoch applies its create now), or None."""
        with self._lock:
            job = self._jobs.pop(spec.name, None)
        if job is not None and job.spec != spec:  # not the job this create builds
            job.close()
            return None
        return job

    def stop(self, timeout_s: float = 30.0) -> None:
        """No more early builds; the jobs not taken are closed (their reads thrown away)."""
        self._stopping.set()
        self._wake.set()
        with self._lock:
            jobs, self._jobs = list(self._jobs.values()), {}
        for job in jobs:
            job.close(timeout_s)
        if self._thread is not None:
            self._thread.join(timeout_s)

    def _loop(self) -> None:
        while not self._stopping.is_set():
            self._wake.wait()
            self._wake.clear()
            if self._stopping.is_set():
                return
            try:
                self._build_queued()
            except Exception as exc:  # noqa: BLE001 - an early start is an optimisation: the epoch builds
                logger.warning('early start failed source="%s" error="%s"', self.source, one_line(exc))

    def _creates(self) -> dict[str, JobSpec]:
        """The queued creates (not drained yet) of jobs with no other mutation queued."""
        queued = self.registry.queued(self.source)
        names = [m.job for m in queued]
        return {m.job: m.spec for m in queued
                if m.kind == "create" and m.spec is not None and names.count(m.job) == 1}

    def _build_queued(self) -> None:
        for name in self._creates():
            positions = self._positions()
            if positions is None or self._stopping.is_set():
                return
            with self._lock:
                spec = self._creates().get(name)  # again: the epoch may have drained it meanwhile
                if spec is None or name in self._jobs or not self._may_build(name):
                    continue
                try:
                    job = self._build(spec)
                except Exception as exc:  # noqa: BLE001 - the epoch builds it again and fails it
                    logger.info('job not built early job="%s" error="%s"', name, one_line(exc))
                    continue
                job.history_tasks = self._tasks()
                self._jobs[name] = job
            # outside the lock (the epoch may take the job meanwhile: the job's own lock orders its
            # attach and this read, and an attached job starts no early read)
            try:
                job.read_early(positions)
            except Exception as exc:  # noqa: BLE001 - its reads start after its attach instead
                logger.info('job history not read early job="%s" error="%s"', name, one_line(exc))
                continue
            logger.info('job built before its attach, history read ahead started job="%s"', name)
