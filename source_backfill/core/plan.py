"""The per-epoch planner of a source backfill job (docs/architecture.md, "How it works"). Pure: no I/O.

One epoch of one job, in three steps:

1. :func:`plan_epoch` applies the live batch to the committed states ``S(e-1)`` (per split only its
   first/last offset matter: offsets increase, so the live rows emitted are a suffix) and plans the history
   ranges ``[b+1, min(target, b+share)]``, the job's budget shared fairly over the splits;
2. the I/O layer filters the live batch with ``emit_above``, reads every planned range whole (each of
   its records is emitted: a range never passes the target, so no history row is read only to be
   dropped) and counts the rows per split;
3. :func:`finish_epoch` completes the ranges and applies the epoch-boundary rule, giving ``S(e)``.

Range completion: a range read up to the target moves the split to ``SourceCachingUp(target)`` even
when the last offsets were transaction markers or compacted away (the reader stops on its position,
not on a record); a range ending before the target leaves ``Backfilling(range end)``.

Boundary rule: ``SourceCachingUp(b)`` with the live stream's next position ``end > b`` is Finished —
every future live row is above ``b``, where the row rules would emit it anyway. This is the exact
handoff at the live position, and it lets a job finish on an idle topic.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from functools import cached_property
from operator import attrgetter
from typing import NamedTuple

import numpy as np
import numpy.typing as npt

from source_backfill.core.columnar import BACKFILLING, CACHING_UP, FINISHED, I64, NONE, SplitTable
from source_backfill.core.splits import SplitId, SplitState, Stage


@dataclass(frozen=True, slots=True)
class LiveStats:
    """One split's share of a live batch: first and last offset, row count, next live position.

    ``ts_min_ms``/``ts_max_ms``: the smallest and largest record timestamp of the split's rows (ms since
    the epoch) and ``ts_type`` the largest ``timestampType``, for the live latency (core.latency) when the
    rows themselves stay on the executors; None when not known. ``fingerprint``: the content fingerprint
    of the record at ``last`` (``core/anchors.py``), the source's anchor for the split; None when not known.
    """

    first: int
    last: int
    count: int
    end: int
    ts_min_ms: float | None = None
    ts_max_ms: float | None = None
    ts_type: int | None = None
    fingerprint: str | None = None


class HistoryRange(NamedTuple):
    """History to read for one split: offsets ``[start, end)`` (a tuple: an epoch may plan thousands)."""

    split: SplitId
    start: int
    end: int

    @property
    def size(self) -> int:
        """Offsets the range covers (records read may be fewer: markers, compaction)."""
        return self.end - self.start


@dataclass(frozen=True, slots=True)
class SplitChange:
    """A split added to or removed from a job's source."""

    split: SplitId
    kind: str  # "added" | "removed"


@dataclass(frozen=True, eq=False)
class EpochPlan:
    """What one epoch does, per split (columns aligned with ``states.splits``).

    ``states``: after the live rows; ``emit_at``: the live threshold (``-1`` emit all, ``NONE`` none);
    ``[history_start, history_end)``: the history to read (empty: none); ``end_at``: the live stream's
    next position (``end`` as given).
    """

    states: SplitTable
    emit_at: I64
    history_start: I64
    history_end: I64
    end_at: I64
    end: Mapping[SplitId, int]

    @cached_property
    def emit_above(self) -> dict[SplitId, int | None]:
        """Per split: emit its live rows above this offset (``-1``: all; None: none)."""
        return {s: None if e == NONE else e for s, e in zip(self.states.splits, self.emit_at.tolist(),
                                                             strict=True)}

    @cached_property
    def history(self) -> tuple[HistoryRange, ...]:
        """The history ranges to read, in split order."""
        at = np.flatnonzero(self.history_end > self.history_start)
        if at.size == 0:
            return ()
        splits = self.states.splits
        names = splits if at.size == len(splits) else [splits[i] for i in at.tolist()]
        return tuple(map(HistoryRange._make, zip(names, self.history_start[at].tolist(),
                                                 self.history_end[at].tolist(), strict=True)))

    def without_history(self) -> EpochPlan:
        """The same plan reading no history (a read that failed: no range may complete)."""
        return replace(self, history_end=self.history_start)


def attach(
    splits: Iterable[SplitId], positions: Mapping[SplitId, int], starts: Mapping[SplitId, int]
) -> dict[SplitId, SplitState]:
    """Initial states of a job attaching where the live stream stands at ``positions`` (``P``).

    History must cover ``[start, P)``: ``Backfilling(start - 1)`` with ``target = P - 1``. A split with
    nothing before ``P`` (an empty partition, or a start at or past ``P``) is Finished at once.
    """
    states: dict[SplitId, SplitState] = {}
    for split in splits:
        p = positions[split]
        start = starts.get(split, 0)
        if start >= p:
            states[split] = SplitState.finished(None, None)
        else:
            states[split] = SplitState.backfilling(start - 1, p - 1)
    return states


def rejoin(
    states: Mapping[SplitId, SplitState],
    covered_to: Mapping[SplitId, int],
    positions: Mapping[SplitId, int],
) -> dict[SplitId, SplitState]:
    """States of a job that missed epochs, rejoining where the live stream stands at ``positions``.

    ``covered_to[s]`` is the live position after the last epoch the job processed: everything below it
    was emitted or left to history. Finished and caught-up splits go back to Backfilling from there, and
    every target rises to ``P - 1``, so history covers the epochs the job did not see (a job whose lane
    was busy while its source's epochs went by, or one restarted from an older commit).

    The other way round, a batch that starts *below* ``covered_to`` (it overlaps what a Finished split
    emitted already): the split is SourceCachingUp at ``covered_to - 1``, so the row rules drop the
    batch's rows up to there and emit the rest. A Finished split emits a batch whole only when the batch
    starts exactly where the split's output ends.
    """
    out: dict[SplitId, SplitState] = {}
    for split, state in states.items():
        p = positions.get(split)
        if p is None:
            out[split] = state
            continue
        rows, target = state.num_consumed_rows, max(p - 1, state.target_offset or -1)
        if state.stage is Stage.BACKFILLING:
            b = state.offset
            out[split] = SplitState.backfilling(b, target, rows) if (b is None or b < p - 1) else state
        elif state.stage is Stage.SOURCE_CACHING_UP:
            b = state.offset
            assert b is not None  # noqa: S101
            out[split] = SplitState.backfilling(b, target, rows) if b < p - 1 else state
        else:
            done = covered_to.get(split, p) - 1
            if done < p - 1:
                out[split] = SplitState.backfilling(done, target, rows)
            elif done > p - 1:
                out[split] = SplitState.caching_up(done, state.target_offset, rows)
            else:
                out[split] = state
    return out


def reconcile_splits(
    states: Mapping[SplitId, SplitState], current: Iterable[SplitId]
) -> tuple[Mapping[SplitId, SplitState], list[SplitChange]]:
    """Follow the source's split set: new splits are Finished, vanished ones trimmed, others resumed.

    A new partition is read by the live stream from its earliest offset, so it needs no backfill.
    """
    current = list(current)
    if current == list(states):
        return states, []  # the same splits in the same order: the hot path, the states as they are
    out: dict[SplitId, SplitState] = {}
    changes: list[SplitChange] = []
    for split in current:
        state = states.get(split)
        if state is None:
            out[split] = SplitState.finished()
            changes.append(SplitChange(split, "added"))
        else:
            out[split] = state
    keep = set(current)
    changes.extend(SplitChange(s, "removed") for s in states if s not in keep)
    return out, changes


def plan_epoch(
    states: Mapping[SplitId, SplitState],
    live: Mapping[SplitId, LiveStats],
    budget: int,
    end: Mapping[SplitId, int],
    starts: Mapping[SplitId, int] | None = None,
) -> EpochPlan:
    """Apply the live batch to ``states`` and plan at most ``budget`` offsets of history reads.

    Per split, the live rule over a batch from ``first`` to ``last`` (the row rules folded: Finished
    emits all; Backfilling(None), or Backfilling(b) with ``first > b``, emits none and moves the target
    to ``last``; otherwise ``last >= b`` emits the rows above ``b`` and finishes, ``last < b`` emits none
    and caches up) gives ``emit_above`` and the state after the live rows; a split still Backfilling(b)
    with a target wants the history ``[b+1, target]``, and gets the part of it its fair share of
    ``budget`` allows (water-filling). ``starts`` gives where ``Backfilling(None)`` splits begin
    (default 0). A split without a known target reads nothing: without it history could read rows the
    live stream then delivers too. Splits absent from ``live`` (no rows this epoch) are planned all the same.

    Invariant: every planned range ends at or before the split's target, which is at most the last
    live offset seen, so each of its records is emitted by the history rule.
    """
    table = SplitTable.from_states(states)
    first, last, has = _live_columns(table, live)
    stage, b, target = table.stage, table.offset, table.target
    fin = stage == FINISHED
    drop_all = has & (stage == BACKFILLING) & (first > b)  # NONE is below every offset: B(None) drops too
    moved = has & ~fin & ~drop_all
    reach = moved & (last >= b)
    below = moved & (last < b)
    new_stage = np.where(reach, FINISHED, np.where(below, CACHING_UP, stage)).astype(np.int8)
    new_target = np.where(drop_all, last, target)
    emit_at = np.where(fin, -1, np.where(reach, b, NONE))
    after = SplitTable(table.splits, new_stage, b, table.rows, new_target)

    lo = np.where(b == NONE, table.column(starts or {}, 0), b + 1)
    want = np.where((new_stage == BACKFILLING) & (new_target != NONE), new_target - lo + 1, 0)
    want = np.maximum(want, 0)
    give = np.minimum(want, _water_level(want[want > 0], budget))
    return EpochPlan(after, emit_at, lo, lo + give, table.column(end), end)


def _live_columns(
    table: SplitTable, live: Mapping[SplitId, LiveStats]
) -> tuple[I64, I64, npt.NDArray[np.bool_]]:
    """First and last live offset per split of ``table``, and which splits had live rows."""
    stats = list(live.values())

    def field(name: str) -> I64:
        return table.scatter(live, np.fromiter(map(attrgetter(name), stats), np.int64, len(stats)), 0)

    return field("first"), field("last"), field("count") > 0


def _water_level(wants: I64, budget: int) -> int:
    """The largest ``L`` with ``sum(min(w, L)) <= budget`` over ``wants`` (all > 0).

    Every split gets ``min(want, L)``: what small splits do not need goes to the others; at most
    ``len(wants) - 1`` offsets of the budget stay unused.
    """
    if budget <= 0 or wants.size == 0:
        return 0
    if int(wants.sum()) <= budget:
        return int(wants.max())
    ordered = np.sort(wants)
    k = ordered.size
    prefix = np.concatenate(([0], np.cumsum(ordered)[:-1]))
    levels = (budget - prefix) // (k - np.arange(k))
    return int(levels[int(np.argmax(levels < ordered))])


def ahead_of(
    states: Mapping[SplitId, SplitState], ranges: Iterable[HistoryRange]
) -> Mapping[SplitId, SplitState]:
    """``states`` as they will be once ``ranges`` (read but not committed yet) are committed.

    Each range completes its split (:func:`complete_range`, no rows counted, no boundary rule): what a
    history read started now plans from, to continue where the reads still in flight end. A range that
    does not continue its split is ignored here; :func:`adopt_history` refuses it later.
    """
    changed: dict[SplitId, SplitState] = {}
    for r in ranges:
        state = changed.get(r.split) or states.get(r.split)
        if state is not None and state.stage is Stage.BACKFILLING and _next_offset(state) == r.start:
            changed[r.split] = complete_range(state, r.end - 1, 0)
    return _with(states, changed)


def adopt_history(
    states: Mapping[SplitId, SplitState], ranges: Iterable[HistoryRange], counts: Mapping[SplitId, int]
) -> Mapping[SplitId, SplitState] | None:
    """``states`` after history ``ranges`` read ahead of this epoch, or None when they no longer fit.

    The ranges were planned from older states of the job (they may chain: one split's ranges follow each
    other) and read before this epoch's live batch, so they apply before it: the result is what
    :func:`plan_epoch` takes (with no budget) for the live batch. That order lets a split catch up with
    a live stream that never pauses: the reads reach the target the previous batch set, and the live
    rule then finishes the split on this batch's rows above it.

    They fit when, per split and in order, each begins right after where the split stands in ``states``
    (or after the range before it) and none passes the split's target — the invariant of
    :func:`plan_epoch`, so every record of the ranges is emitted by the history rule. ``counts`` holds
    the records read per split (absent: 0).
    """
    last: dict[SplitId, int] = {}
    for r in ranges:
        state = states.get(r.split)
        if state is None or r.end <= r.start:
            return None
        expected = last[r.split] + 1 if r.split in last else _next_offset(state)
        if state.stage is not Stage.BACKFILLING or r.start != expected:
            return None
        if state.target_offset is None or r.end - 1 > state.target_offset:
            return None
        last[r.split] = r.end - 1
    if not last:
        return None
    return _with(states, {split: complete_range(states[split], offset, counts.get(split, 0))
                          for split, offset in last.items()})


def _with(states: Mapping[SplitId, SplitState], changed: Mapping[SplitId, SplitState]
          ) -> Mapping[SplitId, SplitState]:
    """``states`` with the splits of ``changed`` replaced (a table stays a table)."""
    if isinstance(states, SplitTable):
        return states.with_states(changed)
    return {**states, **changed}


def _next_offset(state: SplitState) -> int:
    """The first offset a Backfilling split's history still has to read (``Backfilling(None)``: 0)."""
    return state.offset + 1 if state.offset is not None else 0


def finish_epoch(plan: EpochPlan, history_counts: Mapping[SplitId, int]) -> SplitTable:
    """``S(e)``: complete the ranges read (each of them whole) and apply the epoch-boundary rule.

    ``history_counts`` holds the records read per split (absent: 0); they all count as consumed. The
    rules are :func:`complete_range` and :func:`at_boundary`, over columns.
    """
    t = plan.states
    stage, b, target = t.stage.copy(), t.offset.copy(), t.target
    read = (plan.history_end > plan.history_start) & (stage == BACKFILLING)
    rows = np.where(read, t.rows + t.column(history_counts, 0), t.rows)
    last = plan.history_end - 1
    complete = read & (target != NONE) & (last >= target)
    partial = read & ~complete
    stage[complete] = CACHING_UP
    b[complete] = target[complete]
    b[partial] = last[partial]
    passed = (stage == BACKFILLING) & (b != NONE) & (target != NONE) & (b >= target)
    stage[passed] = CACHING_UP
    stage[(stage == CACHING_UP) & (plan.end_at != NONE) & (plan.end_at > b)] = FINISHED
    return SplitTable(t.splits, stage, b, rows, target)


def complete_range(state: SplitState, last: int, count: int) -> SplitState:
    """A Backfilling split whose history range ``[b+1, last]`` was read whole (``count`` records).

    Read up to the target: ``SourceCachingUp(target)``, even when the last offsets were transaction
    markers or compacted away. Ending before it: ``Backfilling(last)``. Either way ``count`` rows are
    consumed. With a record at ``last`` this is the state the history rule reaches row by row; without
    one the reader's position proves the log holds nothing more up to ``last``, so the same state holds.
    """
    rows = state.num_consumed_rows + count
    target = state.target_offset
    if target is not None and last >= target:
        return SplitState(Stage.SOURCE_CACHING_UP, target, rows, target)
    return SplitState(Stage.BACKFILLING, last, rows, target)


def at_boundary(state: SplitState, end: int | None) -> SplitState:
    """The epoch-boundary rule, given the live stream's next position ``end`` (None: unknown).

    * ``Backfilling(b)`` with ``b >= target``: history has nothing left to read, so
      ``SourceCachingUp(b)`` (what the history rule gives on reaching the target);
    * ``SourceCachingUp(b)`` with ``end > b``: every future live row is above ``b``, where the live rule
      would emit it and finish the split, so ``Finished`` now — exact handoff even on an idle topic.
    """
    b = state.offset
    if state.stage is Stage.BACKFILLING:
        target = state.target_offset
        if b is None or target is None or b < target:
            return state
        state = state.with_stage(Stage.SOURCE_CACHING_UP, b)
    if state.stage is Stage.SOURCE_CACHING_UP and end is not None and b is not None and end > b:
        return state.with_stage(Stage.FINISHED, b)
    return state


def is_finish_reported(states: Mapping[SplitId, SplitState]) -> bool:
    """Every split is SourceCachingUp or Finished: the job reports its backfill finished."""
    return SplitTable.from_states(states).count(Stage.BACKFILLING) == 0


def is_backfill_done(states: Mapping[SplitId, SplitState]) -> bool:
    """Every split is Finished: the job leaves backfill mode."""
    return SplitTable.from_states(states).count(Stage.FINISHED) == len(states)
