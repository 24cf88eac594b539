"""Job progress derived from split states (pure): what the API, CLI and metrics show.

The rate is wall-clock throughput: history rows copied (committed, or copied by a read ahead whose commit
waits for an epoch) per second over the last :data:`RATE_WINDOW_S` seconds (:class:`Throughput`), so it is
above 0 whenever rows moved in that window, whichever path copied them. The ETA is the offsets left over
that rate, bounded by the job's rate limit (:func:`eta`); none while paused or at rate limit 0. The job's
fraction is the history copied over copied + left (:func:`copied_fraction`).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field

from source_backfill.core.columnar import SplitTable
from source_backfill.core.splits import SplitId, SplitState, Stage


@dataclass(frozen=True, slots=True)
class JobProgressSummary:
    """Splits finished/total, rows backfilled, offsets still to read, and an ETA at the measured rate."""

    splits_total: int
    splits_finished: int
    rows_backfilled: int
    remaining_offsets: int
    eta_seconds: float | None
    #: History rows/s the ETA was computed with (wall clock, recent window); None before any was measured.
    history_rows_per_s: float | None = None
    #: Fraction of the job's history copied (reads ahead counted), 1.0 once nothing is left.
    fraction: float = 0.0
    #: Paused (or rate limit 0): no ETA, the CLI and page say so.
    paused: bool = False


#: The wall-clock rate is measured over this many last seconds.
RATE_WINDOW_S = 60.0


@dataclass
class Throughput:
    """Rows/s of a running total (history rows copied) over the last ``window_s`` seconds, wall clock.

    :meth:`observe` the total at any moment (monotonic seconds); :meth:`rate` is the total's growth since
    the oldest sample of the window over the time since it: above 0 whenever the total grew in the window,
    falling towards 0 while it does not. A total that goes down (copies thrown away) restarts the window,
    and so does a window without any growth (a job waiting for its first epoch, or paused).
    """

    window_s: float = RATE_WINDOW_S
    samples: deque[tuple[float, int]] = field(default_factory=deque)
    #: The window's first sample is the idle point before the copy (re)started: its second is the first
    #: that grew, and the rate is taken from there once the total grew again (the first read's start-up,
    #: a Spark job's ~1 s, is not the copy's pace: it made the ETA 25-30 % long at a quarter of a copy).
    idle_start: bool = False

    def observe(self, now: float, total: int) -> None:
        """The total at ``now``."""
        if self.samples and (total < self.samples[-1][1] or total == self.samples[0][1]):
            # copies thrown away; or nothing moved in the whole window (not started yet, paused): the
            # window starts now, so a backfill starting or resuming is not averaged with the idle time
            self.samples.clear()
            self.idle_start = True
        self.samples.append((now, total))
        # keep one sample at or before the window's start: the rate spans the whole window
        while len(self.samples) > 1 and self.samples[1][0] <= now - self.window_s:
            self.samples.popleft()
            self.idle_start = False

    def rate(self, now: float) -> float | None:
        """Rows/s over the window (None until two samples span some time)."""
        if len(self.samples) < 2:  # noqa: PLR2004 - a rate needs two points
            return None
        if self.idle_start and len(self.samples) > 2:  # noqa: PLR2004 - idle point, first growth, more
            t1, grown = self.samples[1]
            if self.samples[-1][1] > grown and now > t1:  # grew since the first growth: that is the pace
                return (self.samples[-1][1] - grown) / (now - t1)
        t0, first = self.samples[0]
        span = now - t0
        if span <= 0:
            return None
        return (self.samples[-1][1] - first) / span


def eta(remaining: int, rate: float | None, rate_limit: float | None = None, *,
        paused: bool = False) -> float | None:
    """Seconds until ``remaining`` offsets are copied at ``rate`` rows/s, never faster than ``rate_limit``.

    0 when nothing is left; None while paused or at rate limit 0 (nothing moves), or with no rate (none
    measured yet and no limit to go by).
    """
    if remaining <= 0:
        return 0.0
    if paused or rate_limit == 0:
        return None
    speed = rate if rate else None
    if rate_limit is not None:
        speed = rate_limit if speed is None else min(speed, rate_limit)
    return remaining / speed if speed else None


def copied_fraction(copied: int, remaining: int) -> float:
    """The job's history copied over copied + still to copy (1.0 when nothing is left)."""
    if remaining <= 0:
        return 1.0
    return copied / (copied + remaining)


def split_lag(state: SplitState, read_ahead_to: int | None = None) -> int | None:
    """Offsets still to backfill (target - backfilled offset); 0 once past Backfilling; None if unknown.

    ``read_ahead_to``: the last offset a read ahead has copied for the split, not committed yet (it
    counts as read: the copy is done, only its commit waits for an epoch).
    """
    if state.stage is not Stage.BACKFILLING:
        return 0
    if state.target_offset is None:
        return None
    done = -1 if state.offset is None else state.offset
    if read_ahead_to is not None:
        done = max(done, read_ahead_to)
    return max(0, state.target_offset - done)


def job_progress(
    states: Mapping[SplitId, SplitState], history_rows_per_s: float | None = None,
    read_ahead_to: Mapping[SplitId, int] | None = None, *, rate_limit: float | None = None,
    paused: bool = False, rows_read_ahead: int = 0,
) -> JobProgressSummary:
    """Summarise ``states``; the ETA is remaining offsets over the history rate (:func:`eta`).

    ``read_ahead_to``: per split, the last offset read ahead and not committed yet (see
    :func:`split_lag`); the remaining offsets, the ETA and the fraction count it as read, with its
    ``rows_read_ahead``.
    """
    table = SplitTable.from_states(states)
    remaining = int(table.lags(read_ahead_to).sum())
    finished = table.count(Stage.FINISHED)
    backfilled = int(table.rows.sum())
    return JobProgressSummary(
        splits_total=len(table),
        splits_finished=finished,
        rows_backfilled=backfilled,
        remaining_offsets=remaining,
        eta_seconds=eta(remaining, history_rows_per_s, rate_limit, paused=paused),
        history_rows_per_s=history_rows_per_s,
        fraction=copied_fraction(backfilled + rows_read_ahead, remaining),
        paused=remaining > 0 and (paused or rate_limit == 0),
    )


def table_fraction(snapshot_done: bool, rows_copied: int, rows_total: int | None,
                   vnodes_completed: int, vnodes_total: int) -> float:
    """A table-backfill job's copy: rows copied of the snapshot's row count, 1.0 once the snapshot is done.

    Vnodes complete only near the end of a copy that reads every vnode a chunk at a time (0 of 256 while
    130,000 rows were copied): they count only while the row count is unknown. Below 1.0 until the
    snapshot phase ends.
    """
    if snapshot_done:
        return 1.0
    if rows_total:
        return max(0.0, min(rows_copied / rows_total, 0.999))
    return max(0.0, min(vnodes_completed / max(1, vnodes_total), 0.999))


def table_eta(snapshot_done: bool, rows_left: int | None, rows_per_s: float | None,
              lag_versions: int | None, versions_per_s: float | None, rate_limit: float | None = None, *,
              paused: bool = False) -> float | None:
    """Seconds until a table-backfill job follows its table live, in every phase.

    Snapshot: the rows left over the copy rate (bounded by the rate limit, :func:`eta`). Replay: the
    versions behind over the rate the lag shrinks at (``versions_per_s``: replayed minus arrived).
    Following live: 0. None while paused, or with no rate measured yet (or a lag that does not shrink).
    """
    if not snapshot_done:
        if rows_left is None:
            return None
        return eta(rows_left, rows_per_s, rate_limit, paused=paused)
    if not lag_versions:
        return 0.0
    if paused or rate_limit == 0 or not versions_per_s or versions_per_s <= 0:
        return None
    return lag_versions / versions_per_s
