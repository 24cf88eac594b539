"""The per-epoch history budget: prefer the live stream (DESIGN 5.4)."""

from __future__ import annotations

import math

#: An epoch that ran over this many intervals makes the next one read no history (self-pause).
WAIT_EPOCH_MULTIPLE = 5
#: Budget of an epoch before any history throughput was measured.
FIRST_EPOCH_BUDGET = 50_000
#: The adaptive budget never drops below this, so history always progresses when allowed.
MIN_ADAPTIVE_BUDGET = 1_000
#: Share of the interval the adaptive budget plans to spend on history.
HISTORY_SHARE = 0.8


def history_budget(
    *,
    rate_limit_rows_per_s: float | None,
    interval_s: float,
    max_rows_per_epoch: int | None,
    measured_rows_per_s: float | None,
    last_epoch_s: float | None,
    paused: bool,
) -> int:
    """Offsets of history one epoch may read: the smallest of the rate limit, the cap and the adaptive.

    Zero when paused, at rate 0 (nothing is lost: the targets keep moving, history resumes later), or
    when the last epoch ran over ``WAIT_EPOCH_MULTIPLE`` intervals. The adaptive budget keeps the epoch
    within its interval at the measured history throughput.
    """
    if paused or rate_limit_rows_per_s == 0:
        return 0
    if last_epoch_s is not None and last_epoch_s > WAIT_EPOCH_MULTIPLE * interval_s:
        return 0
    if measured_rows_per_s is None or measured_rows_per_s <= 0:
        adaptive = FIRST_EPOCH_BUDGET
    else:
        adaptive = max(MIN_ADAPTIVE_BUDGET, int(measured_rows_per_s * interval_s * HISTORY_SHARE))
    budget = adaptive
    if rate_limit_rows_per_s is not None:
        budget = min(budget, max(1, math.ceil(rate_limit_rows_per_s * interval_s)))
    if max_rows_per_epoch is not None:
        budget = min(budget, max_rows_per_epoch)
    return budget
