"""A source backfill job's accounting: the rates its budgets are sized on, and its metrics per epoch.

:class:`Rates` holds what the job measured (history throughput in and ahead of the epochs, the last
epochs' cost, the read error streak) and the rows it wrote; :class:`JobMetrics` turns an epoch into the
job's Prometheus series (``source_backfill.metrics``), setting the per-split ones only where they changed:
thousands of splits would otherwise cost a labelled series update each per epoch, and a caught-up job
changes none of them.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from source_backfill import metrics
from source_backfill.core import LiveStats, Stage, is_backfill_done
from source_backfill.core.columnar import SplitTable

#: History epochs the budget's cost model is fitted on.
COST_SAMPLES = 8


def ema(previous: float | None, value: float) -> float:
    """An exponential moving average of weight one half (the first value as it is)."""
    return value if previous is None else 0.5 * previous + 0.5 * value


@dataclass
class Rates:
    """Measured history throughput and epoch cost, input of the adaptive budget; rows written."""

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

    @property
    def history_rate(self) -> float | None:
        """Rows/s history is read at, for the ETA: the reads ahead's when they ran, else the epochs'."""
        return self.ahead_rows_per_s or self.history_rows_per_s


def estimate_above(stats: LiveStats, threshold: int) -> int:
    """Rows of a batch above ``threshold``, assuming offsets spread evenly (metrics only)."""
    if threshold >= stats.last:
        return 0
    width = max(1, stats.last - stats.first + 1)
    return round(stats.count * (stats.last - threshold) / width)


class JobMetrics:
    """One job's Prometheus series, set per epoch."""

    def __init__(self, job: str) -> None:
        self.job = job
        #: The per-split series last set: (splits, stage codes, lags).
        self._published: tuple[tuple[str, ...], Any, Any] | None = None

    def rows(self, live: Mapping[str, LiveStats], emit_above: Mapping[str, int | None],
             history: Mapping[str, int]) -> int:
        """Count the epoch's rows per split; return the live rows emitted (estimated for a partial split)."""
        live_rows = 0
        for split, stats in live.items():
            threshold = emit_above.get(split)
            if threshold is None:
                continue
            emitted = stats.count if threshold < stats.first else estimate_above(stats, threshold)
            live_rows += emitted
            metrics.LIVE_ROWS.labels(self.job, split).inc(emitted)
        for split, n in history.items():
            metrics.HISTORY_ROWS.labels(self.job, split).inc(n)
        return live_rows

    def state(self, table: SplitTable, ahead: Mapping[str, tuple[int, int]], rates: Rates,
              eta_seconds: float | None, *, committed: bool) -> None:
        """The job's state after an epoch: commits, rows, splits per stage, ETA, and each split's series.

        ``ahead``: per split (rows, last offset) copied by reads ahead, not committed yet.
        """
        if committed:
            metrics.COMMITS.labels(self.job).inc()
        self._splits(table, ahead)
        metrics.JOB_ROWS.labels(self.job, "history").set(rates.rows_history)
        metrics.JOB_ROWS.labels(self.job, "read_ahead").set(sum(n for n, _ in ahead.values()))
        metrics.JOB_ROWS.labels(self.job, "live").set(rates.rows_live)
        for stage in Stage:
            metrics.JOB_SPLITS.labels(self.job, stage.value).set(table.count(stage))
        metrics.JOB_ETA.labels(self.job).set(eta_seconds or 0)
        metrics.JOB_BACKFILLING.labels(self.job).set(0 if is_backfill_done(table) else 1)

    def _splits(self, table: SplitTable, ahead: Mapping[str, tuple[int, int]]) -> None:
        """Each split's stage and lag (a read ahead's copy counts as read), where they changed."""
        stages, lags = table.stage, table.lags({split: last for split, (_, last) in ahead.items()})
        last = self._published
        if last is None or last[0] != table.splits:
            changed: Any = range(len(table))
        else:
            changed = np.flatnonzero((stages != last[1]) | (lags != last[2])).tolist()
        for i in changed:
            split = table.splits[i]
            metrics.SPLIT_STAGE.labels(self.job, split).set(int(stages[i]))
            metrics.SPLIT_LAG.labels(self.job, split).set(int(lags[i]))
        self._published = (table.splits, stages, lags)
