"""The width governor: how many tasks a history copy may run, steered by the live latency (pure).

Each step (one per source epoch) the governor is told the live latency of the source's Finished jobs
(``core.latency``'s p99: produce time to commit, the one definition) and the target it must stay within,
and answers the width the next history copies may use, in ``[min_width, max_width]`` tasks:

* **Start:** the width doubles while the latency stays within the target (1, 2, 4, ...): a cluster of
  256 free slots is reached in 8 steps, not 256.
* **Over the target:** the width that went over is remembered as too wide (``bad``) and the next one
  is the last width known to keep the target (``good``) when this step was a probe above it, else half
  the width (multiplicative decrease: a live load that doubled is answered in one or two steps).
* **Search:** within the target below a known ``bad``, the next width is halfway to it, until the two
  are within ``SETTLE_FRACTION`` of each other (or one task apart): the width then stays.
* **Probe:** after ``PROBE_AFTER`` steps within the target at a settled width, ``bad`` is forgotten and
  the width grows by ``PROBE_GROWTH``, and by twice as much at each further step that keeps the target
  (more room: a live load that fell, executors added), so at most one step in ``PROBE_AFTER`` goes over
  the target once settled, and a width that has room again is found in a few steps.

The model it is checked against (``tests/unit/core/test_governor.py``): a cluster of ``N`` slots whose
live path takes ``live`` of them, and a live latency of ``base / (1 - u)`` at utilisation
``u = (live + width) / N`` (a queue's latency curve: flat while the cluster is idle, steep near full).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

from source_backfill.core.plan import HistoryRange

#: The search stops when the too-wide width is within this fraction of the good one.
SETTLE_FRACTION = 0.05
#: Settled steps within the target before the governor probes for more room.
PROBE_AFTER = 10
#: A probe's first step grows the width by this fraction (at least one task); each further step that
#: keeps the target doubles it.
PROBE_GROWTH = 0.05
#: The decrease after a width went over the target with no good width below it.
DECREASE = 0.5


@dataclass(frozen=True, slots=True)
class Governor:
    """The width it answered and what it learned. Immutable: ``step`` returns the next state."""

    min_width: int = 1
    max_width: int = 1
    width: int = 1
    #: The widest width seen within the target since the last change of course (None: none yet).
    good: int | None = None
    #: The narrowest width seen over the target (None: none known, or forgotten to probe).
    bad: int | None = None
    #: Still doubling (no width has gone over the target yet).
    starting: bool = True
    #: Steps in a row within the target at a settled width.
    settled_steps: int = 0
    #: The growth of the next probe step (doubles while probes keep the target).
    growth: float = PROBE_GROWTH
    #: The width is a probe above a settled one.
    probing: bool = False

    @classmethod
    def start(cls, min_width: int, max_width: int, width: int | None = None) -> Governor:
        """A governor at ``width`` (or ``min_width``), from ``min_width`` (at least 1) to ``max_width``."""
        low = max(1, min_width)
        high = max(low, max_width)
        return cls(min_width=low, max_width=high, width=low if width is None else min(max(width, low), high))

    def with_bounds(self, min_width: int, max_width: int) -> Governor:
        """The same governor with new bounds (the cluster's free slots changed): the width kept within."""
        low = max(1, min_width)
        high = max(low, max_width)
        return replace(self, min_width=low, max_width=high, width=min(max(self.width, low), high),
                       good=None if self.good is None else min(self.good, high))

    def step(self, latency_s: float | None, target_s: float) -> Governor:
        """The next state after a step whose live latency was ``latency_s`` (None: not measured: stay)."""
        if latency_s is None:
            return self
        if latency_s > target_s:
            return self._over()
        return self._within()

    def _over(self) -> Governor:
        above_good = self.good is not None and self.good < self.width
        good = self.good if above_good else None
        width = self.good if above_good and self.good is not None else math.floor(self.width * DECREASE)
        # a settled width's first probe that went over: no room there, no search between the two
        bad = self.width if not (above_good and self.probing and self.growth == PROBE_GROWTH) else width + 1
        return replace(self, width=self._bounded(width), good=good, bad=bad, starting=False,
                       settled_steps=0, growth=PROBE_GROWTH, probing=False)

    def _within(self) -> Governor:
        good = self.width if self.good is None else max(self.good, self.width)
        if self.width >= self.max_width:
            return replace(self, good=good, starting=False if self.bad is not None else self.starting,
                           settled_steps=self.settled_steps + 1)
        if self.starting:
            return replace(self, width=self._bounded(self.width * 2), good=good)
        if self.bad is not None and self.bad <= good:
            bad = None  # the width once too wide keeps the target now: the load fell
        else:
            bad = self.bad
        if bad is not None and not self._settled(good, bad):
            return replace(self, width=self._bounded((good + bad) // 2), good=good, bad=bad, settled_steps=0,
                           probing=False)
        settled = self.settled_steps + 1
        if bad is not None and settled < PROBE_AFTER:
            return replace(self, width=self._bounded(good), good=good, bad=bad, settled_steps=settled,
                           probing=False)
        # probing: more room than when the search settled? (bad forgotten; the next over brings it back)
        grown = max(good + 1, math.ceil(good * (1 + self.growth)))
        growth = self.growth * 2 if bad is None else PROBE_GROWTH
        return replace(self, width=self._bounded(grown), good=good, bad=None, settled_steps=0, growth=growth,
                       probing=True)

    def _settled(self, good: int, bad: int) -> bool:
        return bad - good <= max(1, math.floor(good * SETTLE_FRACTION))

    def _bounded(self, width: int) -> int:
        return min(max(width, self.min_width), self.max_width)


#: A history copy is not cut into pieces smaller than this many offsets (each piece is a Kafka read: a
#: consumer, a fetch session; a few thousand records per task cost more to start than to copy).
MIN_PIECE_OFFSETS = 20_000


def pieces_for_tasks(ranges: Sequence[HistoryRange], tasks: int,
                     min_piece: int = MIN_PIECE_OFFSETS) -> list[HistoryRange]:
    """``ranges`` cut so that ``tasks`` Spark tasks can copy them side by side.

    Spark's Kafka source reads one task per range; a job with fewer splits than tasks (one partition of
    10M records, say) would copy on one task whatever the width. So the largest ranges are halved, in
    turn, until there are ``tasks`` pieces or none is ``2 * min_piece`` offsets long. The pieces cover the
    ranges exactly (no gap, no overlap, per split in offset order): the copy reads the same records.
    """
    pieces = [r for r in ranges if r.size > 0]
    if tasks <= len(pieces):
        return list(ranges)
    heap = [(-r.size, i, r) for i, r in enumerate(pieces)]
    heapq.heapify(heap)
    order = len(pieces)
    while heap and len(heap) < tasks:
        size, _, largest = heap[0]
        if -size < 2 * max(1, min_piece):
            break
        heapq.heappop(heap)
        middle = largest.start + largest.size // 2
        for half in (HistoryRange(largest.split, largest.start, middle),
                     HistoryRange(largest.split, middle, largest.end)):
            heapq.heappush(heap, (-half.size, order, half))
            order += 1
    return sorted((r for _, _, r in heap), key=lambda r: (r.split, r.start))


def target_latency(idle_p99_s: float | None, *, ratio: float, fixed_s: float | None) -> float | None:
    """The live latency the governor keeps: ``fixed_s`` when set, else ``ratio`` x the idle p99.

    None: neither is known yet (the governor does not step).
    """
    if fixed_s is not None:
        return fixed_s
    return None if idle_p99_s is None else idle_p99_s * ratio
