"""A source backfill job's accounting: the rates its budgets are sized on, and its metrics per epoch.

:class:`Rates` holds what the job measured (history throughput in and ahead of the epochs, the last
epochs' cost, the read error streak) and the rows it wrote; :class:`JobMetrics` turns an epoch into the
job's Prometheus series (``source_backfill.metrics``): the job-level ones always, the per-split ones for
the splits :func:`split_series` picks (``metrics.per_split``: by default the few not Finished), set only
where they changed. Four series per split made a Finished job on 10,000 partitions 40,000 series, past
what one Prometheus target should carry; a split that no longer qualifies has its series removed.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from source_backfill import metrics
from source_backfill.core import LiveStats, Stage, is_backfill_done
from source_backfill.core.columnar import FINISHED, I8, I64, SplitTable
from source_backfill.core.latency import Latencies, measure, measure_spread, merge
from source_backfill.core.progress import Throughput

if TYPE_CHECKING:
    import pyarrow as pa

Mask = npt.NDArray[np.bool_]

#: History epochs the budget's cost model is fitted on.
COST_SAMPLES = 8


def ema(previous: float | None, value: float) -> float:
    """An exponential moving average of weight one half (the first value as it is)."""
    return value if previous is None else 0.5 * previous + 0.5 * value


@dataclass
class Rates:
    """Measured history throughput and epoch cost, input of the adaptive budget; rows written.

    ``history_rows_per_s`` and ``ahead_rows_per_s`` are the speed of one read (sizing budgets); what the
    job achieves over time, reads ahead, pauses and rate limit included, is ``copied`` (ETA and API).
    """

    history_rows_per_s: float | None = None
    #: Throughput of the reads ahead (one background job each), input of their size.
    ahead_rows_per_s: float | None = None
    last_epoch_s: float | None = None
    #: (rows, seconds) of the last history epochs: the budget's cost model is fitted on them.
    samples: deque[tuple[int, float]] = field(default_factory=lambda: deque(maxlen=COST_SAMPLES))
    errors_in_a_row: int = 0
    backoff_until: float = 0.0
    rows_history: int = 0
    rows_live: int = 0
    started_at: float = field(default_factory=time.monotonic)
    #: History rows copied (committed + read ahead), wall clock: the rate the ETA and the API give.
    copied: Throughput = field(default_factory=Throughput)

    def epoch(self, inline: tuple[int, float], elapsed: float, history_rows: int, live_rows: int) -> None:
        """An epoch took ``elapsed`` s; ``inline``: (rows, seconds) of the history it read itself.

        Only history read in the epoch fits the epoch's cost model (reads ahead are measured where they
        run: :meth:`read_ahead`).
        """
        rows, seconds = inline
        if rows > 0 and seconds > 0:
            self.samples.append((rows, seconds))
            self.history_rows_per_s = ema(self.history_rows_per_s, rows / seconds)
        self.last_epoch_s = elapsed
        self.rows_history += history_rows
        self.rows_live += live_rows

    def read_ahead(self, rows: int, seconds: float) -> None:
        """A read ahead copied ``rows`` in ``seconds``: the size of the next one follows."""
        if rows and seconds > 0:
            self.ahead_rows_per_s = ema(self.ahead_rows_per_s, rows / seconds)


def estimate_above(stats: LiveStats, threshold: int) -> int:
    """Rows of a batch above ``threshold``, assuming offsets spread evenly (metrics only)."""
    if threshold >= stats.last:
        return 0
    width = max(1, stats.last - stats.first + 1)
    return round(stats.count * (stats.last - threshold) / width)


def live_latencies(live: Mapping[str, LiveStats], emit_above: Mapping[str, int | None], rows: pa.Table | None,
                   commit_ms: float) -> tuple[Latencies, int | None]:
    """The latencies of the live rows an epoch committed at ``commit_ms``, and their ``timestampType``.

    ``rows``: the live batch on the driver (each emitted row measured), else each split's timestamp range
    in ``live`` (its emitted rows, the batch's highest offsets, spread evenly in it). History rows: none.
    """
    if rows is not None:
        import pyarrow as pa  # noqa: F811 - the annotation's import is for type checkers only
        import pyarrow.compute as pc

        from source_backfill.executors.live_filter import live_rows_arrow

        emitted = live_rows_arrow(rows, emit_above)
        if emitted.num_rows == 0:
            return Latencies.empty(), None
        column = emitted.column("timestamp")
        per_ms = {"s": 1e-3, "ms": 1.0, "us": 1e3, "ns": 1e6}[column.type.unit]
        stamps = column.cast(pa.int64()).to_numpy(zero_copy_only=False) / per_ms
        kind = pc.max(emitted.column("timestampType")).as_py()
        return measure(stamps, commit_ms), kind
    parts, kind = [], None
    for split, stats in live.items():
        threshold = emit_above.get(split)
        if threshold is None or stats.ts_min_ms is None or stats.ts_max_ms is None:
            continue
        emitted = stats.count if threshold < stats.first else estimate_above(stats, threshold)
        if not emitted:
            continue
        low = stats.ts_min_ms + (stats.ts_max_ms - stats.ts_min_ms) * (1 - emitted / max(1, stats.count))
        parts.append(measure_spread(low, stats.ts_max_ms, emitted, commit_ms))
        if stats.ts_type is not None:
            kind = max(kind if kind is not None else stats.ts_type, stats.ts_type)
    return merge(parts), kind


def split_series(policy: metrics.PerSplit, stages: I8, lags: I64, lost: I64, shown: Mask) -> Mask:
    """Which splits get per-split series: a mask aligned with the job's split table.

    ``always``: every split; ``never``: none; ``auto``: the splits not Finished and those with data loss
    (``lost`` > 0), at most ``policy.max_splits``: data loss first, then the most lagging, then those
    ``shown`` already (a tie does not swap series), then table order. Pure; O(splits) numpy work.
    """
    n = len(stages)
    if policy.mode == "always":
        return np.ones(n, dtype=bool)
    if policy.mode == "never" or policy.max_splits <= 0:
        return np.zeros(n, dtype=bool)
    wanted: Mask = (stages != FINISHED) | (lost > 0)
    picked = np.flatnonzero(wanted)
    if len(picked) > policy.max_splits:  # lexsort: the last key is the first one sorted on
        order = np.lexsort((picked, ~shown[picked], -lags[picked], lost[picked] <= 0))
        picked = picked[order[: policy.max_splits]]
        wanted = np.zeros(n, dtype=bool)
        wanted[picked] = True
    return wanted


class JobMetrics:
    """One job's Prometheus series, set per epoch.

    Rows and data loss are totalled per split here, so a split that gets its series later (it falls
    behind, it loses history) starts them at its total, not at 0. ``policy``: None reads the process's
    (``metrics.per_split()``, set by the daemon from its config) at every epoch.
    """

    def __init__(self, job: str, policy: metrics.PerSplit | None = None) -> None:
        self.job = job
        self._policy = policy
        self._history: dict[str, int] = {}
        self._live: dict[str, int] = {}
        #: Offsets lost per split (below the log start, ``fail_on_data_loss = false``).
        self.lost: dict[str, int] = {}
        #: The splits with per-split series now.
        self._shown: set[str] = set()
        #: The per-split state last published: (splits, stage codes, lags, shown mask).
        self._published: tuple[tuple[str, ...], Any, Any, Mask] | None = None
        #: Data loss is counted by reads ahead too (their thread): it and the per-split series change apart.
        self._lock = threading.Lock()
        # a job rebuilt or retried: its predecessor's per-split series are not this one's to count on
        metrics.forget_splits(job)
        metrics.JOB_DATA_LOSS.labels(job)  # 0 from the start: increase() sees the first loss

    def rows(self, live: Mapping[str, LiveStats], emit_above: Mapping[str, int | None],
             history: Mapping[str, int]) -> int:
        """Count the epoch's rows per split; return the live rows emitted (estimated for a partial split)."""
        live_rows = 0
        shown = self._shown
        for split, stats in live.items():
            threshold = emit_above.get(split)
            if threshold is None:
                continue
            emitted = stats.count if threshold < stats.first else estimate_above(stats, threshold)
            if not emitted:
                continue
            live_rows += emitted
            self._live[split] = self._live.get(split, 0) + emitted
            if split in shown:
                metrics.LIVE_ROWS.labels(self.job, split).inc(emitted)
        for split, n in history.items():
            self._history[split] = self._history.get(split, 0) + n
            if split in shown:
                metrics.HISTORY_ROWS.labels(self.job, split).inc(n)
        return live_rows

    def latency(self, latencies: Latencies) -> None:
        """Live rows committed: their latencies into ``live_latency_seconds``."""
        if latencies.rows:
            metrics.observe_counts(metrics.LIVE_LATENCY.labels(self.job), latencies.counts, latencies.sum_s)

    def data_loss(self, split: str, offsets: int) -> None:
        """``offsets`` of ``split`` were below the log start and skipped."""
        with self._lock:
            self.lost[split] = self.lost.get(split, 0) + offsets
            metrics.JOB_DATA_LOSS.labels(self.job).inc(offsets)
            if split in self._shown:
                metrics.DATA_LOSS_OFFSETS.labels(self.job, split).inc(offsets)

    def state(self, table: SplitTable, ahead: Mapping[str, tuple[int, int]], rates: Rates,
              eta_seconds: float | None, *, committed: bool) -> None:
        """The job's state after an epoch: commits, rows, splits per stage, lag, ETA; the picked splits'.

        ``ahead``: per split (rows, last offset) copied by reads ahead, not committed yet.
        """
        if committed:
            metrics.COMMITS.labels(self.job).inc()
        lags = table.lags({split: last for split, (_, last) in ahead.items()})
        with self._lock:
            self._splits(table, lags)
        metrics.JOB_ROWS.labels(self.job, "history").set(rates.rows_history)
        metrics.JOB_ROWS.labels(self.job, "read_ahead").set(sum(n for n, _ in ahead.values()))
        metrics.JOB_ROWS.labels(self.job, "live").set(rates.rows_live)
        for stage in Stage:
            metrics.JOB_SPLITS.labels(self.job, stage.value).set(table.count(stage))
        metrics.JOB_LAG.labels(self.job).set(int(lags.sum()))
        metrics.JOB_SPLIT_LAG_MAX.labels(self.job).set(int(lags.max()) if len(lags) else 0)
        metrics.JOB_ETA.labels(self.job).set(eta_seconds or 0)
        metrics.JOB_BACKFILLING.labels(self.job).set(0 if is_backfill_done(table) else 1)

    def _splits(self, table: SplitTable, lags: I64) -> None:
        """The picked splits' stage and lag where they changed; series of splits no longer picked removed.

        Called under ``_lock``.
        """
        stages, splits, job = table.stage, table.splits, self.job
        last = self._published
        same = last is not None and last[0] == splits
        if same:
            assert last is not None  # noqa: S101
            before = last[3]
        else:  # first epoch, or splits added or removed: place the shown ones by name
            before = np.zeros(len(splits), dtype=bool)
            at = [i for i in map(table.index.get, self._shown) if i is not None]
            before[at] = True
            for gone in set(self._history) | set(self._live) | set(self.lost):
                if gone not in table.index:
                    self._history.pop(gone, None)
                    self._live.pop(gone, None)
                    self.lost.pop(gone, None)
        lost = table.column(self.lost, 0) if self.lost else np.zeros(len(splits), dtype=np.int64)
        shown = split_series(self._policy or metrics.per_split(), stages, lags, lost, before)
        leaving = {splits[i] for i in np.flatnonzero(before & ~shown)}
        if not same:
            leaving |= {s for s in self._shown if s not in table.index}
        for split in leaving:
            metrics.forget_split(job, split)
        entering = shown & ~before
        if same:
            assert last is not None  # noqa: S101
            update = shown & (entering | (stages != last[1]) | (lags != last[2]))
        else:
            update = shown
        for i in np.flatnonzero(update).tolist():
            metrics.SPLIT_STAGE.labels(job, splits[i]).set(int(stages[i]))
            metrics.SPLIT_LAG.labels(job, splits[i]).set(int(lags[i]))
        for i in np.flatnonzero(entering).tolist():
            split = splits[i]
            metrics.HISTORY_ROWS.labels(job, split).inc(self._history.get(split, 0))
            metrics.LIVE_ROWS.labels(job, split).inc(self._live.get(split, 0))
            if self.lost.get(split):
                metrics.DATA_LOSS_OFFSETS.labels(job, split).inc(self.lost[split])
        self._shown = (self._shown - leaving) | {splits[i] for i in np.flatnonzero(entering).tolist()}
        self._published = (splits, stages, lags, shown)
