"""The per-epoch history budget: prefer the live stream; the rate limit's allowance."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

#: An epoch that ran over this many intervals makes the next one read no history (self-pause).
WAIT_EPOCH_MULTIPLE = 5
#: Budget of an epoch before any history throughput was measured.
FIRST_EPOCH_BUDGET = 50_000
#: The adaptive budget never drops below this, so history always progresses when allowed.
MIN_ADAPTIVE_BUDGET = 1_000
#: Share of the interval the adaptive budget plans to spend on history.
HISTORY_SHARE = 0.8
#: A history read ahead is sized to take about this long at the measured throughput: long enough that
#: its fixed cost (~0.6 s: a Spark job, consumers, staging) is small, short enough that progress commits
#: regularly and a crash or a pause throws little away.
READ_AHEAD_S = 10.0
#: Throughput assumed for the first read ahead, before one was measured: its one task (Kafka reader and
#: pyarrow Parquet writer) copied 185-320k rows/s beside a live stream on two cores (~600k alone), so
#: this errs on the short side.
FIRST_READ_AHEAD_ROWS_PER_S = 100_000
#: Offsets of the first history read ahead: ``READ_AHEAD_S`` at the assumed throughput.
FIRST_READ_AHEAD = int(READ_AHEAD_S * FIRST_READ_AHEAD_ROWS_PER_S)
#: The fitted budget grows at most this many times the rows of the last history epoch (a noisy fit
#: must not plan one huge epoch that stalls the live stream).
MAX_GROWTH = 2.0


#: Seconds of the rate limit the allowance holds at most (READ_AHEAD_S, or two intervals if longer): a read
#: that took longer than the interval leaves the next one its share, so the copy keeps the limit's pace
#: on average instead of losing the time its Spark jobs took; never more than this is read at once.
BURST_INTERVALS = 2.0


@dataclass(slots=True)
class RateAllowance:
    """A rate limit kept on the wall clock (a token bucket): ``rate`` offsets accrue each second.

    Reads spend what they plan to copy when they start (a read ahead) or are planned (an epoch's own);
    the allowance never holds more than ``burst_seconds(interval)`` of the rate, and starts with one
    interval's worth. Kept in step with the clock the caller passes (``now``, monotonic seconds): no I/O.
    A limit that reads slower than its Spark jobs take (epochs past their interval) still copies at the
    limit on average, where a per-epoch budget of one interval's worth read that much less per second.
    """

    tokens: float = 0.0
    at: float | None = None

    def available(self, rate: float | None, interval_s: float, now: float) -> int | None:
        """Offsets that may be read now (None: no limit; 0 at rate 0)."""
        if rate is None:
            self.at = None
            return None
        if rate <= 0:
            self.tokens, self.at = 0.0, now
            return 0
        cap = rate * burst_seconds(interval_s)
        if self.at is None:
            self.tokens = rate * interval_s
        else:
            self.tokens += rate * max(0.0, now - self.at)
        self.tokens = min(self.tokens, cap)
        self.at = now
        return max(0, math.floor(self.tokens))

    def spend(self, offsets: int) -> None:
        """``offsets`` were planned for reading: they leave the allowance (it may go below 0: owed)."""
        if self.at is not None:
            self.tokens -= offsets


def burst_seconds(interval_s: float) -> float:
    """Seconds of the rate limit the allowance holds at most."""
    return max(READ_AHEAD_S, BURST_INTERVALS * interval_s)


@dataclass(frozen=True, slots=True)
class EpochCost:
    """A history epoch's cost model: ``seconds = fixed_s + rows / rows_per_s``."""

    fixed_s: float
    rows_per_s: float


def fit_epoch_cost(samples: Sequence[tuple[int, float]]) -> EpochCost | None:
    """Least-squares fit of ``seconds = fixed + rows / rate`` over ``(rows, seconds)`` history epochs.

    ``None`` when the samples cannot separate the two (fewer than two, rows all about equal, or a
    slope that is not positive). ``fixed`` is clamped into ``[0, mean seconds]``.
    """
    if len(samples) < 2:
        return None
    n = len(samples)
    mean_rows = sum(r for r, _ in samples) / n
    mean_s = sum(t for _, t in samples) / n
    var = sum((r - mean_rows) ** 2 for r, _ in samples)
    if mean_rows <= 0 or var <= n * (0.05 * mean_rows) ** 2:  # rows within ~5%: no slope to see
        return None
    slope = sum((r - mean_rows) * (t - mean_s) for r, t in samples) / var
    if slope <= 0:
        return None
    fixed = min(max(0.0, mean_s - slope * mean_rows), mean_s)
    return EpochCost(fixed_s=fixed, rows_per_s=1.0 / slope)


def history_budget(
    *,
    allowance: int | None,
    interval_s: float,
    max_rows_per_epoch: int | None,
    measured_rows_per_s: float | None,
    last_epoch_s: float | None,
    paused: bool,
    epoch_cost: EpochCost | None = None,
    last_history_rows: int | None = None,
) -> int:
    """Offsets of history one epoch may read: the smallest of the rate limit, the cap and the adaptive.

    ``allowance``: what the rate limit lets be read now (:class:`RateAllowance`; None: no limit). Zero
    when paused, at allowance 0 (rate 0: nothing is lost, the targets keep moving, history resumes
    later), or when the last epoch ran over ``WAIT_EPOCH_MULTIPLE`` intervals. The adaptive budget
    keeps the epoch within its interval at the measured history throughput. With a fitted
    ``epoch_cost`` it is the rows that fill ``HISTORY_SHARE`` of the interval after the fixed cost, at
    most ``MAX_GROWTH`` times ``last_history_rows``: the same target, reached in a few epochs instead
    of a slow ramp.
    """
    if _reads_none(paused, allowance, last_epoch_s, interval_s):
        return 0
    if epoch_cost is not None:
        room_s = interval_s * HISTORY_SHARE - epoch_cost.fixed_s
        adaptive = max(MIN_ADAPTIVE_BUDGET, int(epoch_cost.rows_per_s * room_s))
        if last_history_rows:
            adaptive = min(adaptive, max(MIN_ADAPTIVE_BUDGET, int(last_history_rows * MAX_GROWTH)))
    elif measured_rows_per_s is None or measured_rows_per_s <= 0:
        adaptive = FIRST_EPOCH_BUDGET
    else:
        adaptive = max(MIN_ADAPTIVE_BUDGET, int(measured_rows_per_s * interval_s * HISTORY_SHARE))
    return _capped(adaptive, allowance, max_rows_per_epoch)


def budget_after_adopted(budget: int, adopted: int, *, max_rows_per_epoch: int | None) -> int:
    """History offsets an epoch may still read itself after adopting ``adopted`` offsets read ahead.

    The adopted offsets are this epoch's history: they count against the per-epoch cap. Not against
    the rate limit (they left its allowance when their read started) nor the adaptive share, which
    keeps the epoch's own reading within its interval: they were copied before the epoch, which only
    commits their files. So the epoch that adopts the last read ahead also reads the tail when it fits,
    and the job finishes there instead of one interval later.
    """
    if max_rows_per_epoch is None:
        return budget
    return max(0, min(budget, max_rows_per_epoch - adopted))


def read_ahead_budget(
    *,
    allowance: int | None,
    interval_s: float,
    max_rows_per_epoch: int | None,
    measured_rows_per_s: float | None,
    last_epoch_s: float | None,
    paused: bool,
    remaining: int | None = None,
    tail_budget: int = 0,
) -> int:
    """Offsets one history read ahead of the epochs may cover (0: start none now).

    Zero when paused, at rate 0, or when the last epoch ran over ``WAIT_EPOCH_MULTIPLE`` intervals (the
    live stream is struggling: reads wait). Otherwise ``READ_AHEAD_S`` seconds at the measured read
    throughput (``FIRST_READ_AHEAD`` before one was measured), at most the rate limit's ``allowance``
    (what accrued since the last read: the reads keep the limit's pace) and ``max_rows_per_epoch``.

    A read that would leave a tail of the ``remaining`` history small enough for one epoch to read
    itself (``tail_budget``, the epoch's own budget) takes the tail too, within the same limits: the
    epoch that adopts it then finishes the job by committing files, without a Spark read of its own
    (a read of a few thousand offsets costs that epoch ~0.5 s).
    """
    if _reads_none(paused, allowance, last_epoch_s, interval_s):
        return 0
    if measured_rows_per_s is None or measured_rows_per_s <= 0:
        budget = FIRST_READ_AHEAD
    else:
        budget = max(MIN_ADAPTIVE_BUDGET, int(measured_rows_per_s * READ_AHEAD_S))
    if remaining is not None and remaining - budget <= tail_budget:
        budget = max(budget, remaining)
    return _capped(budget, allowance, max_rows_per_epoch)


def table_budget(*, paused: bool, allowance: int | None, max_rows_per_epoch: int | None) -> int | None:
    """Rows a table-backfill job copies this epoch: None = no limit, 0 = none (paused or rate 0).

    The table modules read from the job's own table source, not the shared live stream, so there is no
    adaptive share to keep: only the rate limit's ``allowance`` (:class:`RateAllowance`: what accrued on
    the wall clock, so epochs slower than the interval still copy at the limit) and the cap.
    """
    if paused or allowance == 0:
        return 0
    if allowance is None and max_rows_per_epoch is None:
        return None
    return _capped(2**62, allowance, max_rows_per_epoch)


def _reads_none(paused: bool, allowance: int | None, last_epoch_s: float | None, interval_s: float) -> bool:
    """Paused, no allowance, or the last epoch ran over ``WAIT_EPOCH_MULTIPLE`` intervals (self-pause)."""
    if paused or allowance == 0:
        return True
    return last_epoch_s is not None and last_epoch_s > WAIT_EPOCH_MULTIPLE * interval_s


def _capped(budget: int, allowance: int | None, max_rows: int | None) -> int:
    """``budget`` within the rate limit's allowance and the row cap."""
    if allowance is not None:
        budget = min(budget, allowance)
    if max_rows is not None:
        budget = min(budget, max_rows)
    return budget
