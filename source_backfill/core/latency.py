"""Live latency: one definition for the metric, the API, the CLI and the scale-out governor (pure).

The **latency of a live row** is ``commit time - record timestamp``:

- *record timestamp*: the Kafka record's ``timestamp`` column. Its ``timestampType`` says whose clock it
  is: ``0`` CreateTime (set by the producer: a producer clock skewed against the daemon's shifts the
  latency by the skew) or ``1`` LogAppendTime (set by the broker when it appended the record; a topic with
  ``message.timestamp.type=LogAppendTime`` gives latencies free of producer skew). The job reports which
  type its live rows carried (:func:`timestamp_type_name`).
- *commit time*: the daemon's wall clock once the epoch's Delta commit holding the row succeeded (a
  replayed epoch that another attempt committed is not measured).
- Only **live** rows a job writes are measured; history (backfill) rows never are. A negative value (a
  producer clock ahead of the daemon's) counts as 0.

p50 and p99 are taken over the live rows committed in the last :data:`WINDOW_S` seconds, every row
weighing the same (:class:`LatencyWindow`); no live row in the window: no figure (``None``). The
histogram ``source_backfill_live_latency_seconds`` has the same rows in :data:`BUCKETS`.

Rows whose timestamps are on the driver are measured one by one (:func:`measure`); a live batch too large
to collect gives per split only its smallest and largest timestamp and the rows spread evenly between them
are assumed (:func:`measure_spread`, as ``estimate_above`` assumes of offsets).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

F8 = npt.NDArray[np.float64]

#: Upper bounds (seconds) of the histogram's buckets (``+Inf`` after the last).
BUCKETS: tuple[float, ...] = (0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0)
#: p50/p99 are over the live rows committed in this many last seconds.
WINDOW_S = 60.0
#: Points an epoch's latencies are summarised to for the window (quantiles of equal weight).
SKETCH_POINTS = 64

CREATE_TIME = 0
LOG_APPEND_TIME = 1
_TYPE_NAMES = {CREATE_TIME: "create_time", LOG_APPEND_TIME: "log_append_time"}


def timestamp_type_name(code: int | None) -> str | None:
    """``create_time``, ``log_append_time`` (Kafka's ``timestampType`` 0, 1); None when unknown."""
    return None if code is None else _TYPE_NAMES.get(int(code), "none")


@dataclass(frozen=True)
class Latencies:
    """Latencies of a set of live rows: histogram counts, their sum, and a sketch for quantiles."""

    rows: int
    sum_s: float
    #: Rows per bucket of :data:`BUCKETS`, ``+Inf`` last (not cumulative).
    counts: tuple[int, ...]
    #: Sketch: latency values (seconds, sorted) each standing for ``weights[i]`` rows.
    points: F8
    weights: F8

    @staticmethod
    def empty() -> Latencies:
        """No row."""
        return Latencies(0, 0.0, (0,) * (len(BUCKETS) + 1), np.zeros(0), np.zeros(0))


def _sketch(values: F8, weights: F8) -> tuple[F8, F8]:
    """At most :data:`SKETCH_POINTS` points of equal weight with the same distribution."""
    total = float(weights.sum())
    if len(values) <= SKETCH_POINTS or total <= 0:
        order = np.argsort(values, kind="stable")
        return values[order], weights[order]
    qs = (np.arange(SKETCH_POINTS) + 0.5) / SKETCH_POINTS
    points = weighted_quantiles(values, weights, qs)
    return points, np.full(SKETCH_POINTS, total / SKETCH_POINTS)


def weighted_quantiles(values: F8, weights: F8, qs: Sequence[float] | F8) -> F8:
    """The ``qs`` quantiles of ``values`` weighted by ``weights`` (no interpolation)."""
    order = np.argsort(values, kind="stable")
    v, cum = values[order], np.cumsum(weights[order])
    at = np.searchsorted(cum, np.asarray(qs, dtype=np.float64) * cum[-1], side="left")
    return np.asarray(v[np.minimum(at, len(v) - 1)], dtype=np.float64)


def measure(timestamps_ms: npt.ArrayLike, commit_ms: float) -> Latencies:
    """Latencies of live rows with these record timestamps (epoch ms) committed at ``commit_ms``."""
    ts = np.asarray(timestamps_ms, dtype=np.float64)
    if len(ts) == 0:
        return Latencies.empty()
    lat = np.maximum(0.0, (commit_ms - ts) / 1000.0)
    counts = np.bincount(np.searchsorted(BUCKETS, lat, side="left"), minlength=len(BUCKETS) + 1)
    points, weights = _sketch(lat, np.ones(len(lat)))
    return Latencies(len(lat), float(lat.sum()), tuple(int(c) for c in counts), points, weights)


def measure_spread(ts_min_ms: float, ts_max_ms: float, rows: int, commit_ms: float) -> Latencies:
    """``rows`` live rows whose timestamps are known only to lie in ``[ts_min, ts_max]``: spread evenly."""
    if rows <= 0:
        return Latencies.empty()
    lo = max(0.0, (commit_ms - ts_max_ms) / 1000.0)
    hi = max(lo, (commit_ms - ts_min_ms) / 1000.0)
    bounds = np.asarray(BUCKETS, dtype=np.float64)
    below = np.clip((bounds - lo) / (hi - lo), 0.0, 1.0) if hi > lo else (bounds >= lo).astype(np.float64)
    cumulative = np.append(np.round(below * rows), rows).astype(np.int64)  # rows <= each bound, +Inf
    counts = np.diff(cumulative, prepend=0)
    k = min(rows, SKETCH_POINTS)
    points = lo + (hi - lo) * (np.arange(k) + 0.5) / k
    return Latencies(rows, rows * (lo + hi) / 2, tuple(int(c) for c in counts), points, np.full(k, rows / k))


def merge(parts: Iterable[Latencies]) -> Latencies:
    """The latencies of all rows of ``parts`` together."""
    parts = [p for p in parts if p.rows]
    if not parts:
        return Latencies.empty()
    if len(parts) == 1:
        return parts[0]
    points, weights = _sketch(np.concatenate([p.points for p in parts]),
                              np.concatenate([p.weights for p in parts]))
    counts = tuple(int(sum(c)) for c in zip(*(p.counts for p in parts), strict=True))
    return Latencies(sum(p.rows for p in parts), sum(p.sum_s for p in parts), counts, points, weights)


class LatencyWindow:
    """A job's live latencies of the last ``window_s`` seconds: p50/p99 over the rows committed in it.

    ``now`` is passed in (a monotonic clock): the window is pure and tested with a simulated clock.
    """

    def __init__(self, window_s: float = WINDOW_S) -> None:
        self.window_s = window_s
        self._epochs: deque[tuple[float, Latencies]] = deque()
        #: Kafka ``timestampType`` of the last live rows measured (None: none yet).
        self.timestamp_type: int | None = None

    def add(self, now: float, latencies: Latencies, timestamp_type: int | None = None) -> None:
        """Live rows committed at ``now``."""
        if timestamp_type is not None:
            self.timestamp_type = timestamp_type
        if latencies.rows:
            self._epochs.append((now, latencies))
        self._expire(now)

    def quantiles(self, now: float, qs: Sequence[float] = (0.5, 0.99)) -> tuple[float, ...] | None:
        """The ``qs`` quantiles (seconds) of the window's rows; None when no live row was committed in it."""
        self._expire(now)
        if not self._epochs:
            return None
        points = np.concatenate([lat.points for _, lat in self._epochs])
        weights = np.concatenate([lat.weights for _, lat in self._epochs])
        return tuple(float(x) for x in weighted_quantiles(points, weights, qs))

    def rows(self, now: float) -> int:
        """Live rows committed in the window."""
        self._expire(now)
        return sum(lat.rows for _, lat in self._epochs)

    def _expire(self, now: float) -> None:
        while self._epochs and self._epochs[0][0] < now - self.window_s:
            self._epochs.popleft()
