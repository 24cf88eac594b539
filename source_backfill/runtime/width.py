"""How wide a Kafka source's history copies run: the width governor, stepped by the live latency.

One :class:`HistoryWidth` per source. After every source epoch it is told whether a history copy ran
(a read ahead in flight, or history read in an epoch) and the live latencies the source's Finished jobs
committed in that epoch (``core.latency``: produce time to commit in the job's table, the one
definition). From them:

* **quiet epochs** give the idle latency (the Finished jobs' p99 over the last minute of such epochs):
  no copy ran in them nor in the ``QUIET_AFTER`` epochs before (right after a copy the rows it held up
  are still being committed, and the JVM is still busy with it: under a duty below one task most epochs
  have no copy running, and counting those set the target at 2.8-3.3 s on a load whose quiet p99 was
  under 2 s); the target is ``latency_target_ratio`` x that, or ``latency_target_s`` when set. Before any
  idle epoch was seen (a daemon restarted mid-backfill) the idle p99 is taken as 1.5 trigger intervals
  (a row waits for the next trigger, then one epoch's work);
* **epochs with a copy** started at the current width are gathered (a running copy keeps the tasks it
  started with); once ``STEP_EPOCHS`` of them ran, their p99 is
  the governor's step (``core.governor.Governor``: it doubles from ``min_tasks`` while the target holds,
  falls back to the last good width or halves when it does not, then searches and probes). The gathered
  latencies are then dropped, so each step sees only its own width;
* **no Finished job** on the source, or none has committed a live row yet (a source whose topics
  receive nothing new): there is no live latency to keep, the copies run at ``max_tasks``. From the first
  live row on, the governor steps from its start as above.

The governor counts in eighths of a task (``UNITS``): from one task up it is the tasks the copies may
run at once; below, the **duty**, the share of the time one task may copy (down to ``min_duty``): one
task at a time beside the live stream can be too much on a small machine with many jobs (each copy of
many partitions costs the driver and the JVM more than its one task shows), and the live stream comes
first. ``fixed_tasks`` switches the governor off. The width is the source's: the jobs backfilling share
it (:meth:`HistoryWidth.per_job`) and take it in turns (``core.slots.HistorySlots``: the copies running
together hold at most ``tasks``). Metrics: ``history_width_tasks``, ``history_width_duty_ratio``,
``history_width_latency_seconds``, ``history_width_target_seconds`` (per source).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterable

import numpy as np

from source_backfill import metrics
from source_backfill.config import HistoryWidthConfig
from source_backfill.core.governor import Governor, target_latency
from source_backfill.core.latency import Latencies, LatencyWindow, merge, weighted_quantiles

logger = logging.getLogger(__name__)

#: Copy epochs at one width before the governor steps (the latency of a width shows once its copies ran).
STEP_EPOCHS = 3
#: The idle p99 before any quiet epoch was seen, in trigger intervals.
IDLE_INTERVALS = 1.5
#: Epochs after one with a copy that still do not count as quiet (idle) ones.
QUIET_AFTER = 2
#: Seconds between two readings of the task slots (executors come and go on a cluster).
SLOTS_EVERY_S = 30.0
#: The governor's steps per task: below one task, the duty moves in eighths.
UNITS = 8


class HistoryWidth:
    """One source's history width: the governor, its idle latency and the copy epochs of its next step."""

    def __init__(self, source: str, config: HistoryWidthConfig, slots: int | Callable[[], int],
                 interval_s: float) -> None:
        """``slots``: the task slots Spark has, or how to read them (read again every ``SLOTS_EVERY_S``)."""
        self.source = source
        self.config = config
        self._slots = slots
        self._slots_at: float | None = None
        self.governor = Governor.start(self._low(), UNITS * self._high(slots() if callable(slots) else slots),
                                       UNITS * config.min_tasks)
        self.interval_s = interval_s
        self._idle = LatencyWindow()
        self._gathered: list[Latencies] = []
        self._epochs = 0
        #: Epochs since the last one with a copy (a daemon starts quiet).
        self._since_copy = QUIET_AFTER + 1
        #: A Finished job committed a live row since the daemon started (before: no latency to keep).
        self._live_seen = False
        #: The p99 of the governor's last step and the target it was held to (None: none yet).
        self.latency_s: float | None = None
        self.target_s: float | None = None
        #: Tasks the copies may run at once (at least one), and the share of the time (below one task).
        self.width, self.duty = 1, 1.0
        self._set(self._fixed() or self.governor.max_width)

    def _high(self, slots: int) -> int:
        configured = self.config.max_tasks
        return configured if configured is not None else max(self.config.min_tasks, slots)

    def _low(self) -> int:
        """The governor's least width, in units: ``min_tasks``, or ``min_duty`` of one task."""
        if self.config.min_tasks > 1:
            return UNITS * self.config.min_tasks
        return max(1, min(UNITS, math.ceil(self.config.min_duty * UNITS - 1e-9)))

    def _rebound(self, now: float) -> None:
        """The slots read again (when they are read and not bounded by ``max_tasks``): new bounds."""
        if not callable(self._slots) or self.config.max_tasks is not None:
            return
        if self._slots_at is not None and now - self._slots_at < SLOTS_EVERY_S:
            return
        self._slots_at = now
        high = self._high(self._slots())
        if UNITS * high != self.governor.max_width:
            logger.info('history width bounds source="%s" max_tasks=%d->%d', self.source,
                        self.governor.max_width // UNITS, high)
            self.governor = self.governor.with_bounds(self._low(), UNITS * high)

    def _fixed(self) -> int | None:
        fixed = self.config.fixed_tasks
        if fixed is None:
            return None
        return min(max(UNITS * fixed, self.governor.min_width), self.governor.max_width)

    def idle_p99(self, now: float) -> float:
        """The Finished jobs' live p99 in quiet epochs (last minute), else ``IDLE_INTERVALS`` triggers."""
        found = self._idle.quantiles(now, (0.99,))
        return found[0] if found is not None else IDLE_INTERVALS * self.interval_s

    def after_epoch(self, now: float, *, copying: bool, finished: Iterable[Latencies],
                    at_width: bool = True) -> int:
        """The width the next copies may use, after an epoch (``now``: monotonic seconds).

        ``copying``: a history copy ran in the epoch; ``at_width``: the copies running were started with
        the current width (a copy keeps the tasks it started with: until the ones started before a change
        are done, the epochs say nothing of the new width and do not count towards a step);
        ``finished``: the live latencies each Finished job of the source committed in it (empty: none is
        Finished).
        """
        parts = list(finished)
        self._rebound(now)
        self._since_copy = 0 if copying else self._since_copy + 1
        if self._since_copy > QUIET_AFTER:
            for part in parts:
                self._idle.add(now, part)
        fixed = self._fixed()
        if fixed is not None:
            return self._set(fixed)
        self._live_seen = self._live_seen or any(p.rows for p in parts)
        if not parts or not self._live_seen:  # nobody's live latency to keep: as wide as allowed
            self._gathered, self._epochs = [], 0
            return self._set(self.governor.max_width if self.latency_s is None else self._units)
        if not copying or not at_width:
            return self._set(self.governor.width)
        self._gathered.extend(p for p in parts if p.rows)
        self._epochs += 1
        if self._epochs < STEP_EPOCHS:
            return self._set(self.governor.width)
        latency = _p99(self._gathered)
        target = target_latency(self.idle_p99(now), ratio=self.config.latency_target_ratio,
                                fixed_s=self.config.latency_target_s)
        self._gathered, self._epochs = [], 0
        if latency is None or target is None:
            return self._set(self.governor.width)
        before = self.governor.width
        self.governor = self.governor.step(latency, target)
        self.latency_s, self.target_s = latency, target
        metrics.HISTORY_WIDTH_LATENCY.labels(self.source).set(latency)
        metrics.HISTORY_WIDTH_TARGET.labels(self.source).set(target)
        if self.governor.width != before:
            logger.info('history width source="%s" tasks=%.3f->%.3f live_p99_s=%.3f target_s=%.3f',
                        self.source, before / UNITS, self.governor.width / UNITS, latency, target)
        return self._set(self.governor.width)

    def _set(self, units: int) -> int:
        """The width at ``units`` eighths of a task: ``width`` tasks (at least one), ``duty``; the tasks."""
        self._units = units
        self.width, self.duty = max(1, units // UNITS), min(1.0, units / UNITS)
        metrics.HISTORY_WIDTH.labels(self.source).set(self.width)
        metrics.HISTORY_WIDTH_DUTY.labels(self.source).set(self.duty)
        return self.width

    def per_job(self, copying_jobs: int) -> int:
        """The tasks each of ``copying_jobs`` backfilling jobs may use (at least one each)."""
        return max(1, self.width // max(1, copying_jobs))


def _p99(parts: list[Latencies]) -> float | None:
    """The p99 of the live rows in ``parts`` (None: no row)."""
    merged = merge(parts)
    if not merged.rows:
        return None
    return float(weighted_quantiles(merged.points, merged.weights, np.array([0.99]))[0])
