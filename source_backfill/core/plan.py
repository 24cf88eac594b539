"""The per-epoch planner of a source backfill job (DESIGN 5.3-5.5). Pure: no I/O.

One epoch of one job, in three steps:

1. :func:`plan_epoch` applies the live batch to the committed states ``S(e-1)`` (per split only its
   first/last offset matter, see :func:`~source_backfill.core.batch.decide_live`) and plans the history
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
from dataclasses import dataclass

from source_backfill.core.batch import live_threshold
from source_backfill.core.splits import SplitId, SplitState, Stage


@dataclass(frozen=True, slots=True)
class LiveStats:
    """One split's share of a live batch: first and last offset, row count, next live position."""

    first: int
    last: int
    count: int
    end: int


@dataclass(frozen=True, slots=True)
class HistoryRange:
    """History to read for one split: offsets ``[start, end)``."""

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


@dataclass(frozen=True)
class EpochPlan:
    """What one epoch does: live thresholds, history ranges, and the states after the live rows."""

    states: Mapping[SplitId, SplitState]
    emit_above: Mapping[SplitId, int | None]
    history: tuple[HistoryRange, ...]
    end: Mapping[SplitId, int]


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

    ``covered_to[s]`` is the live position after the job's last committed epoch: everything below it was
    emitted or left to history. Finished and caught-up splits go back to Backfilling from there, and
    every target rises to ``P - 1``, so history covers the epochs the job did not see.
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
            out[split] = SplitState.backfilling(done, target, rows) if done < p - 1 else state
    return out


def reconcile_splits(
    states: Mapping[SplitId, SplitState], current: Iterable[SplitId]
) -> tuple[dict[SplitId, SplitState], list[SplitChange]]:
    """Follow the source's split set: new splits are Finished, vanished ones trimmed, others resumed.

    A new partition is read by the live stream from its earliest offset, so it needs no backfill.
    """
    current = list(current)
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
    if not changes:
        return dict(states), changes
    return out, changes


def plan_epoch(
    states: Mapping[SplitId, SplitState],
    live: Mapping[SplitId, LiveStats],
    budget: int,
    end: Mapping[SplitId, int],
    starts: Mapping[SplitId, int] | None = None,
) -> EpochPlan:
    """Apply the live batch to ``states`` and plan at most ``budget`` offsets of history reads.

    Per split: the live rule (:func:`~source_backfill.core.batch.live_threshold`) gives ``emit_above``
    and the state after the live rows; a split still Backfilling(b) with a target wants the history
    ``[b+1, target]``, and gets the part of it its fair share of ``budget`` allows. ``starts`` gives
    where ``Backfilling(None)`` splits begin (default 0). A split without a known target reads nothing:
    without it history could read rows the live stream then delivers too. Splits absent from ``live``
    (no rows this epoch) are planned all the same.

    Invariant: every planned range ends at or before the split's target, which is at most the last
    live offset seen, so each of its records is emitted by the history rule.
    """
    after: dict[SplitId, SplitState] = {}
    emit_above: dict[SplitId, int | None] = {}
    demand: list[tuple[int, SplitId, int]] = []
    first_offsets = starts or {}
    for split, state in states.items():
        if state.stage is Stage.FINISHED:  # the hot path of a caught-up job: emit all, read nothing
            after[split] = state
            emit_above[split] = -1
            continue
        stats = live.get(split)
        if stats is not None and stats.count > 0:
            emit_above[split], state = live_threshold(state, stats.first, stats.last)
        else:
            emit_above[split] = None
        after[split] = state
        target = state.target_offset
        if state.stage is Stage.BACKFILLING and target is not None:
            lo = state.offset + 1 if state.offset is not None else first_offsets.get(split, 0)
            if target >= lo:
                demand.append((target - lo + 1, split, lo))
    return EpochPlan(after, emit_above, _share(demand, budget), dict(end))


def ahead_of(
    states: Mapping[SplitId, SplitState], ranges: Iterable[HistoryRange]
) -> dict[SplitId, SplitState]:
    """``states`` as they will be once ``ranges`` (read but not committed yet) are committed.

    Each range completes its split (:func:`complete_range`, no rows counted, no boundary rule): what a
    history read started now plans from, to continue where the reads still in flight end. A range that
    does not continue its split is ignored here; :func:`adopt_history` refuses it later.
    """
    out = dict(states)
    for r in ranges:
        state = out.get(r.split)
        if state is not None and state.stage is Stage.BACKFILLING and _next_offset(state) == r.start:
            out[r.split] = complete_range(state, r.end - 1, 0)
    return out


def adopt_history(
    states: Mapping[SplitId, SplitState], ranges: Iterable[HistoryRange], counts: Mapping[SplitId, int]
) -> dict[SplitId, SplitState] | None:
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
    out = dict(states)
    last: dict[SplitId, int] = {}
    for r in ranges:
        state = out.get(r.split)
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
    for split, offset in last.items():
        out[split] = complete_range(out[split], offset, counts.get(split, 0))
    return out


def _next_offset(state: SplitState) -> int:
    """The first offset a Backfilling split's history still has to read (``Backfilling(None)``: 0)."""
    return state.offset + 1 if state.offset is not None else 0


def _share(demand: list[tuple[int, SplitId, int]], budget: int) -> tuple[HistoryRange, ...]:
    """Water-filling: every split gets ``min(want, L)`` for the largest equal cap ``L`` within budget.

    What small splits do not need goes to the others; at most ``len(demand) - 1`` offsets stay unused.
    """
    if budget <= 0 or not demand:
        return ()
    level = water_level(sorted(d[0] for d in demand), budget)
    return tuple(HistoryRange(split, lo, lo + min(want, level)) for want, split, lo in demand
                 if min(want, level) > 0)


def water_level(wants_sorted: list[int], budget: int) -> int:
    """The largest ``L`` with ``sum(min(w, L)) <= budget`` (``wants_sorted`` ascending, all > 0)."""
    if sum(wants_sorted) <= budget:
        return wants_sorted[-1] if wants_sorted else 0
    prefix = 0
    k = len(wants_sorted)
    for j, want in enumerate(wants_sorted):
        level = (budget - prefix) // (k - j)
        if level < want:
            return level
        prefix += want
    return wants_sorted[-1]  # pragma: no cover - the total exceeds the budget, so the loop returns


def finish_epoch(plan: EpochPlan, history_counts: Mapping[SplitId, int]) -> dict[SplitId, SplitState]:
    """``S(e)``: complete the ranges read (each of them whole) and apply the epoch-boundary rule.

    ``history_counts`` holds the records read per split (absent: 0); they all count as consumed.
    States that no rule changes are returned as the same objects.
    """
    out = dict(plan.states)
    for r in plan.history:
        state = out.get(r.split)
        if state is not None and state.stage is Stage.BACKFILLING:
            out[r.split] = complete_range(state, r.end - 1, history_counts.get(r.split, 0))
    for split, state in out.items():
        if state.stage is not Stage.FINISHED:
            new = at_boundary(state, plan.end.get(split))
            if new is not state:
                out[split] = new  # same keys: updating while iterating is safe
    return out


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
    return all(s.stage is not Stage.BACKFILLING for s in states.values())


def is_backfill_done(states: Mapping[SplitId, SplitState]) -> bool:
    """Every split is Finished: the job leaves backfill mode."""
    return all(s.stage is Stage.FINISHED for s in states.values())
