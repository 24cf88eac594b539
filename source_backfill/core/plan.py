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

from source_backfill.core.batch import decide_live
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

    ``starts`` gives where ``Backfilling(None)`` splits begin (default 0). A split without a known
    target reads nothing: without it history could read rows the live stream then delivers too.
    """
    after: dict[SplitId, SplitState] = {}
    emit_above: dict[SplitId, int | None] = {}
    demand: list[tuple[int, SplitId, int]] = []
    for split, state in states.items():
        stats = live.get(split)
        if stats is not None and stats.count > 0:
            decision = decide_live(state, stats.first, stats.last)
            state = decision.state
            emit_above[split] = decision.emit_above
        else:
            emit_above[split] = -1 if state.stage is Stage.FINISHED else None
        after[split] = state
        if state.stage is Stage.BACKFILLING and state.target_offset is not None:
            lo = state.offset + 1 if state.offset is not None else (starts or {}).get(split, 0)
            want = state.target_offset - lo + 1
            if want > 0:
                demand.append((want, split, lo))
    return EpochPlan(after, emit_above, _share(demand, budget), dict(end))


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
    """``S(e)``: complete the ranges read (all of them whole) and apply the epoch-boundary rule."""
    ranges = {r.split: r for r in plan.history}
    out: dict[SplitId, SplitState] = {}
    for split, state in plan.states.items():
        r = ranges.get(split)
        if r is not None and state.stage is Stage.BACKFILLING:
            rows = state.num_consumed_rows + history_counts.get(split, 0)
            target = state.target_offset
            last = r.end - 1
            if target is not None and last >= target:
                state = SplitState(Stage.SOURCE_CACHING_UP, target, rows, target)
            else:
                state = SplitState(Stage.BACKFILLING, last, rows, target)
        elif (
            state.stage is Stage.BACKFILLING
            and state.offset is not None
            and state.target_offset is not None
            and state.offset >= state.target_offset
        ):
            state = state.with_stage(Stage.SOURCE_CACHING_UP, state.offset)
        if state.stage is Stage.SOURCE_CACHING_UP:
            nxt = plan.end.get(split)
            assert state.offset is not None  # noqa: S101
            if nxt is not None and nxt > state.offset:
                state = state.with_stage(Stage.FINISHED, state.offset)
        out[split] = state
    return out


def is_finish_reported(states: Mapping[SplitId, SplitState]) -> bool:
    """Every split is SourceCachingUp or Finished: the job reports its backfill finished."""
    return all(s.stage is not Stage.BACKFILLING for s in states.values())


def is_backfill_done(states: Mapping[SplitId, SplitState]) -> bool:
    """Every split is Finished: the job leaves backfill mode."""
    return all(s.stage is Stage.FINISHED for s in states.values())
