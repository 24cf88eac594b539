"""A job's split states as columns: what the planner computes on, one numpy array per field.

A source may have thousands of splits; the planner (:mod:`~source_backfill.core.plan`) decides every
epoch for all of them, so per-split Python (a :class:`SplitState` built per split and per step) would
cost tens of milliseconds an epoch. :class:`SplitTable` keeps the states as arrays aligned with
``splits`` and is, for everything else (the API, the tests, the per-split rules of reads ahead), a
read-only ``Mapping[SplitId, SplitState]`` whose values are built on access. ``NONE`` stands for a
missing offset.
"""

from __future__ import annotations

import itertools
from collections.abc import ItemsView, Iterator, Mapping, ValuesView
from typing import Any

import numpy as np
import numpy.typing as npt

from source_backfill.core.splits import SplitId, SplitState, Stage

I64 = npt.NDArray[np.int64]
I8 = npt.NDArray[np.int8]
#: A missing offset (``None`` in :class:`SplitState`): below every real offset, -1 included.
NONE = np.iinfo(np.int64).min
BACKFILLING, CACHING_UP, FINISHED = 0, 1, 2
CODES = {Stage.BACKFILLING: BACKFILLING, Stage.SOURCE_CACHING_UP: CACHING_UP, Stage.FINISHED: FINISHED}
STAGES = (Stage.BACKFILLING, Stage.SOURCE_CACHING_UP, Stage.FINISHED)


def _opt(value: int | None) -> int:
    return NONE if value is None else value


class SplitTable(Mapping[SplitId, SplitState]):
    """Split states as columns: stage code, backfilled offset, consumed rows, target offset.

    Immutable by convention: every operation returns a new table (the arrays are never written after
    construction). As a mapping it iterates ``splits`` in order and builds a :class:`SplitState` per
    lookup; :meth:`to_states` builds them all once.
    """

    __slots__ = ("_index", "_states", "offset", "rows", "splits", "stage", "target")

    def __init__(self, splits: tuple[SplitId, ...], stage: I8, offset: I64, rows: I64, target: I64) -> None:
        self.splits = splits
        self.stage = stage
        self.offset = offset
        self.rows = rows
        self.target = target
        self._index: dict[SplitId, int] | None = None
        self._states: dict[SplitId, SplitState] | None = None

    @classmethod
    def from_states(cls, states: Mapping[SplitId, SplitState]) -> SplitTable:
        """Columns of ``states`` (in its iteration order); a table is returned as it is."""
        if isinstance(states, SplitTable):
            return states
        values = list(states.values())
        return cls(
            tuple(states),
            np.array([CODES[s.stage] for s in values], dtype=np.int8),
            np.array([_opt(s.offset) for s in values], dtype=np.int64),
            np.array([s.num_consumed_rows for s in values], dtype=np.int64),
            np.array([_opt(s.target_offset) for s in values], dtype=np.int64),
        )

    @property
    def index(self) -> dict[SplitId, int]:
        """Position of each split in the columns."""
        if self._index is None:
            self._index = {s: i for i, s in enumerate(self.splits)}
        return self._index

    def _row(self, i: int) -> SplitState:
        offset, target = int(self.offset[i]), int(self.target[i])
        return SplitState(STAGES[self.stage[i]], None if offset == NONE else offset, int(self.rows[i]),
                          None if target == NONE else target)

    def __getitem__(self, split: SplitId) -> SplitState:
        if self._states is not None:
            return self._states[split]
        return self._row(self.index[split])

    def __iter__(self) -> Iterator[SplitId]:
        return iter(self.splits)

    def __len__(self) -> int:
        return len(self.splits)

    def __contains__(self, split: object) -> bool:
        return split in self.index

    def items(self) -> ItemsView[SplitId, SplitState]:
        """``(split, state)`` pairs, from :meth:`to_states`."""
        return self.to_states().items()

    def values(self) -> ValuesView[SplitState]:
        """The states, from :meth:`to_states`."""
        return self.to_states().values()

    def __repr__(self) -> str:
        return f"SplitTable({self.to_states()!r})"

    def to_states(self) -> dict[SplitId, SplitState]:
        """One :class:`SplitState` per split (built once per table)."""
        if self._states is None:
            offsets, targets = self.offset.tolist(), self.target.tolist()
            self._states = {
                split: SplitState(STAGES[st], None if o == NONE else o, r, None if t == NONE else t)
                for split, st, o, r, t in zip(self.splits, self.stage.tolist(), offsets, self.rows.tolist(),
                                              targets, strict=True)
            }
        return self._states

    def with_states(self, changed: Mapping[SplitId, SplitState]) -> SplitTable:
        """A new table: these states, those of ``changed`` (splits it has) replaced."""
        if not changed:
            return self
        stage, offset = self.stage.copy(), self.offset.copy()
        rows, target = self.rows.copy(), self.target.copy()
        for split, s in changed.items():
            i = self.index[split]
            stage[i], offset[i] = CODES[s.stage], _opt(s.offset)
            rows[i], target[i] = s.num_consumed_rows, _opt(s.target_offset)
        return SplitTable(self.splits, stage, offset, rows, target)

    def column(self, values: Mapping[SplitId, int], default: int = NONE) -> I64:
        """``values`` as an array aligned with ``splits`` (``default`` for splits it lacks)."""
        return self.scatter(values, np.fromiter(values.values(), np.int64, len(values)), default)

    def scatter(self, keys: Mapping[SplitId, Any], values: I64, default: int = NONE) -> I64:
        """``values`` (one per key of ``keys``, in its order) placed at their splits' positions.

        Splits ``keys`` lacks get ``default``; keys the table lacks are dropped. Keys in the table's own
        order (the usual case) are ``values`` as they are.
        """
        if len(keys) == len(self.splits) and tuple(keys) == self.splits:
            return values
        out = np.full(len(self.splits), default, dtype=np.int64)
        if keys:
            at = np.fromiter(map(self.index.get, keys, itertools.repeat(-1)), np.intp, len(keys))
            known = at >= 0
            out[at[known]] = values[known]
        return out

    def lags(self, read_ahead_to: Mapping[SplitId, int] | None = None) -> I64:
        """Per split :func:`~source_backfill.core.progress.split_lag` (an unknown lag counts 0)."""
        done = np.where(self.offset == NONE, -1, self.offset)
        if read_ahead_to:
            done = np.maximum(done, self.column(read_ahead_to))
        known = (self.stage == BACKFILLING) & (self.target != NONE)
        return np.where(known, np.maximum(0, self.target - done), 0)

    def count(self, stage: Stage) -> int:
        """How many splits are in ``stage``."""
        return int(np.count_nonzero(self.stage == CODES[stage]))

    def to_json_rows(self) -> dict[SplitId, dict[str, Any]]:
        """The codec's per-split objects, sorted by split."""
        offsets, targets = self.offset.tolist(), self.target.tolist()
        rows = zip(self.splits, self.stage.tolist(), offsets, self.rows.tolist(), targets, strict=True)
        return {
            split: {"stage": STAGES[st].value, "offset": None if o == NONE else o, "num_consumed_rows": r,
                    "target_offset": None if t == NONE else t}
            for split, st, o, r, t in sorted(rows)
        }

    def only_targets_moved(self, before: SplitTable) -> bool:
        """Whether the only difference from ``before`` is the target of splits not Finished.

        The same splits in the same order, every stage, backfilled offset and row count equal: what moved
        is where history must reach, which a job that missed epochs rebuilds on its own (``core.plan.rejoin``
        raises every target to the live position), so such a change alone need not be committed.
        """
        if before.splits != self.splits:
            return False
        if not (np.array_equal(before.stage, self.stage) and np.array_equal(before.offset, self.offset)
                and np.array_equal(before.rows, self.rows)):
            return False
        moved = before.target != self.target
        return not bool(np.any(moved & (self.stage == FINISHED)))

    def changed_rows(self, before: SplitTable | None) -> tuple[dict[SplitId, dict[str, Any]], list[SplitId]]:
        """The codec rows of splits whose state differs from ``before`` (new ones too), and removed splits.

        Compares the columns when both tables hold the same splits in the same order (every epoch but
        one that changes the split set): one vectorized pass, rows built only for the splits that moved.
        """
        if before is None:
            return self.to_json_rows(), []
        if before.splits == self.splits:
            moved = np.flatnonzero((before.stage != self.stage) | (before.offset != self.offset)
                                   | (before.rows != self.rows) | (before.target != self.target))
            if not len(moved):
                return {}, []
            sub = SplitTable(tuple(self.splits[i] for i in moved), self.stage[moved], self.offset[moved],
                             self.rows[moved], self.target[moved])
            return sub.to_json_rows(), []
        old = before.to_json_rows()
        rows = {s: r for s, r in self.to_json_rows().items() if old.get(s) != r}
        return rows, sorted(s for s in before.splits if s not in self.index)
