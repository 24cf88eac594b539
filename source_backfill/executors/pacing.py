"""How much history a source backfill job may read now: its rate limit, its measured pace, its read errors.

Three things bound a job's history reads (the rules are the core's: :mod:`source_backfill.core.budget`):

* the **rate limit**, kept on the wall clock (:class:`~source_backfill.core.RateAllowance`): offsets
  accrue at the limit, a read spends what it plans when it is planned, whether in an epoch or ahead of it;
* the **epoch's budget**: what keeps an epoch within its trigger interval, fitted on the last epochs'
  measured cost (:class:`~source_backfill.executors.accounting.Rates`), and ``max_rows_per_epoch``;
* a **backoff** after a failed history read, doubling per failure in a row up to a minute: the epochs go
  on with their live rows and read no history until it has passed.

:class:`HistoryPace` holds the allowance and the error streak; it decides nothing about failing the job
(a data loss or a timeout is the job's to decide).
"""

from __future__ import annotations

import math
import threading
import time

from source_backfill.core import RateAllowance, fit_epoch_cost, history_budget, read_ahead_budget
from source_backfill.errors import one_line
from source_backfill.executors.accounting import Rates

#: History-read error backoff (seconds): doubles per consecutive error up to the cap.
BACKOFF_BASE_S = 1.0
BACKOFF_CAP_S = 60.0


class HistoryPace:
    """A job's rate-limit allowance, its history budget per epoch and its backoff after read errors."""

    def __init__(self, rates: Rates) -> None:
        self.rates = rates
        self._allowance = RateAllowance()
        self._lock = threading.Lock()  # reads ahead spend from their threads' callbacks too
        #: The last history read error while backing off (None after a good read).
        self.last_error: str | None = None

    def allowed(self, rate_limit: float | None, interval_s: float) -> int | None:
        """What the rate limit lets the job read now (None: no limit)."""
        with self._lock:
            return self._allowance.available(rate_limit, interval_s, time.monotonic())

    def spend(self, offsets: int) -> None:
        """``offsets`` of history are planned for reading: they leave the rate limit's allowance."""
        if offsets:
            with self._lock:
                self._allowance.spend(offsets)

    @property
    def backing_off(self) -> bool:
        """A history read failed lately: no history is read until its backoff has passed."""
        return time.monotonic() < self.rates.backoff_until

    def epoch_budget(self, *, rate_limit: float | None, interval_s: float, max_rows_per_epoch: int | None,
                     paused: bool) -> int:
        """History offsets one epoch may read now (0 in a read-error backoff)."""
        if self.backing_off:
            return 0
        return history_budget(
            allowance=self.allowed(rate_limit, interval_s),
            interval_s=interval_s,
            max_rows_per_epoch=max_rows_per_epoch,
            measured_rows_per_s=self.rates.history_rows_per_s,
            last_epoch_s=self.rates.last_epoch_s,
            paused=paused,
            epoch_cost=fit_epoch_cost(list(self.rates.samples)),
            last_history_rows=self.rates.samples[-1][0] if self.rates.samples else None,
        )

    def ahead_budget(self, *, remaining: int, tail_budget: int, rate_limit: float | None, interval_s: float,
                     max_rows_per_epoch: int | None, paused: bool) -> int:
        """Offsets the next read ahead may copy (0: none now), ``remaining`` offsets left to the targets.

        Under a rate limit a read waits until an interval's worth (or the rest) has accrued: reads of a
        few offsets would each cost a Spark job. ``tail_budget``: the epoch's own budget (what is left
        past it is read in the epoch that finishes).
        """
        allowance = self.allowed(rate_limit, interval_s)
        if allowance is not None and rate_limit:
            if allowance < min(remaining, math.ceil(rate_limit * interval_s)):
                return 0
        return read_ahead_budget(
            allowance=allowance,
            interval_s=interval_s,
            max_rows_per_epoch=max_rows_per_epoch,
            measured_rows_per_s=self.rates.ahead_rows_per_s,
            last_epoch_s=self.rates.last_epoch_s,
            paused=paused,
            remaining=remaining,
            tail_budget=tail_budget,
        )

    def read_ok(self) -> None:
        """A history read worked: the error streak and its backoff message end."""
        self.rates.errors_in_a_row, self.last_error = 0, None

    def read_failed(self, exc: BaseException) -> float:
        """A history read failed: the backoff grows; returns its seconds."""
        self.rates.errors_in_a_row += 1
        self.last_error = f"{type(exc).__name__}: {one_line(exc)}"
        delay: float = min(BACKOFF_CAP_S, BACKOFF_BASE_S * 2.0 ** (self.rates.errors_in_a_row - 1))
        self.rates.backoff_until = time.monotonic() + delay
        return delay
