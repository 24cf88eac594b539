"""Vectorized forms of the row rules: one split, one batch of increasing offsets, one decision.

Per split, offsets of a batch increase, so the row rules collapse to thresholds: the live rows emitted
are always a suffix (``offset > emit_above``), the history rows emitted always a prefix. The property
tests prove these equal to folding :func:`on_live_row` / :func:`on_history_row` over the batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from source_backfill.core.splits import SplitState, Stage

Offsets = npt.NDArray[np.int64]


@dataclass(frozen=True, slots=True)
class LiveDecision:
    """The live rows to emit (``offset > emit_above``; None: none) and the state after the batch."""

    emit_above: int | None
    state: SplitState


@dataclass(frozen=True, slots=True)
class LiveBatchResult:
    """:class:`LiveDecision` plus the exact number of emitted rows."""

    emit_above: int | None
    emitted: int
    state: SplitState


@dataclass(frozen=True, slots=True)
class HistoryBatchResult:
    """The history rows to emit (the first ``emit_count``) and the state after the batch."""

    emit_count: int
    state: SplitState


def live_threshold(state: SplitState, first: int, last: int) -> tuple[int | None, SplitState]:
    """The live rule for a non-empty batch whose offsets run from ``first`` to ``last``.

    Returns ``(emit_above, state after the batch)``: the batch's rows ``> emit_above`` are emitted
    (None: none). Only the ends of the batch matter:

    * Finished: every row (``-1``), state unchanged;
    * Backfilling(None), or Backfilling(b) with ``first > b``: none; the target moves to ``last``;
    * Backfilling(b) or SourceCachingUp(b) with ``last >= b``: the rows above ``b``; Finished;
    * Backfilling(b) or SourceCachingUp(b) with ``last < b``: none; SourceCachingUp(b).

    Invariant: equal to folding :func:`~source_backfill.core.splits.on_live_row` over any increasing
    batch with these ends (property-tested).
    """
    stage, b = state.stage, state.offset
    if stage is Stage.FINISHED:
        return -1, state
    if stage is Stage.BACKFILLING and (b is None or first > b):
        if state.target_offset == last:
            return None, state
        return None, SplitState(stage, b, state.num_consumed_rows, last)
    assert b is not None  # noqa: S101 - Backfilling(None) handled above; CachingUp always has b
    if last >= b:
        return b, state.with_stage(Stage.FINISHED, b)
    if stage is Stage.SOURCE_CACHING_UP:
        return None, state
    return None, state.with_stage(Stage.SOURCE_CACHING_UP, b)


def decide_live(state: SplitState, first: int, last: int) -> LiveDecision:
    """:func:`live_threshold` as a :class:`LiveDecision`."""
    above, new = live_threshold(state, first, last)
    return LiveDecision(above, new)


def apply_live_batch(state: SplitState, offsets: Offsets) -> LiveBatchResult:
    """Apply a whole live batch of one split (sorted offsets)."""
    n = int(offsets.shape[0])
    if n == 0:
        return LiveBatchResult(None, 0, state)
    above, new = live_threshold(state, int(offsets[0]), int(offsets[-1]))
    emitted = 0 if above is None else n - int(np.searchsorted(offsets, above, side="right"))
    return LiveBatchResult(above if emitted else None, emitted, new)


def apply_history_batch(state: SplitState, offsets: Offsets) -> HistoryBatchResult:
    """Apply a whole history batch of one split (sorted offsets): emit a prefix, count every row."""
    n = int(offsets.shape[0])
    if n == 0:
        return HistoryBatchResult(0, state)
    rows = state.num_consumed_rows + n
    target = state.target_offset
    if state.stage is not Stage.BACKFILLING:
        return HistoryBatchResult(0, SplitState(state.stage, state.offset, rows, target))
    if target is not None:
        idx = int(np.searchsorted(offsets, target, side="left"))
        if idx < n:
            reached = SplitState(Stage.SOURCE_CACHING_UP, int(offsets[idx]), rows, target)
            return HistoryBatchResult(idx + 1, reached)
    return HistoryBatchResult(n, SplitState(Stage.BACKFILLING, int(offsets[-1]), rows, target))
