"""Per-split source backfill state and the row rules (RisingWave's SourceBackfillExecutor).

A split (one Kafka topic-partition) is in one of three stages:

* ``Backfilling(b)``: history rows up to offset ``b`` have been emitted (``b`` None: none yet);
* ``SourceCachingUp(b)``: history is done up to ``b``; the live stream has not yet passed ``b``;
* ``Finished``: every later live row is emitted as it comes.

Invariant (checked by the simulation test): for every split, the rows emitted by history and by the live
stream together are the log's records from the job's start, each exactly once — history emits a prefix
``<= B``, the live stream the suffix ``> B``.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from source_backfill.errors import StateFormatError

SplitId = str


def split_id(topic: str, partition: int) -> SplitId:
    """The id of a Kafka topic-partition: ``"{topic}:{partition}"``."""
    return f"{topic}:{partition}"


def parse_split_id(split: SplitId) -> tuple[str, int]:
    """``"topic:3"`` -> ``("topic", 3)``; topics may contain ``:`` (the last one separates).

    The partition is ASCII digits (``"²".isdigit()`` is true too); anything else raises
    :class:`StateFormatError`.
    """
    topic, sep, partition = split.rpartition(":")
    if not sep or not topic or not (partition.isascii() and partition.isdigit()):
        msg = f'split id "{split}" is not "topic:partition"'
        raise StateFormatError(msg)
    return topic, int(partition)


def split_topic(split: SplitId) -> str:
    """The topic of a split id: ``"a:b:3"`` -> ``"a:b"`` (checked as :func:`parse_split_id` checks it)."""
    return parse_split_id(split)[0]


class Stage(StrEnum):
    """The three stages of a split's backfill."""

    BACKFILLING = "backfilling"
    SOURCE_CACHING_UP = "source_caching_up"
    FINISHED = "finished"


@dataclass(frozen=True, slots=True)
class SplitState:
    """The persisted state of one split.

    ``offset`` is the backfilled offset ``b`` (for Finished, the last one, kept for observability; -1
    means "before offset 0"). ``target_offset`` is the offset history must reach: the live position at
    attach minus one, then the last live row seen while backfilling. Only ``stage`` and ``offset`` are
    needed for fail-over; the rest is observability and persisted too.
    """

    stage: Stage
    offset: int | None = None
    num_consumed_rows: int = 0
    target_offset: int | None = None

    def __post_init__(self) -> None:
        if self.stage is Stage.SOURCE_CACHING_UP and self.offset is None:
            msg = "SourceCachingUp needs the backfilled offset"
            raise StateFormatError(msg)
        if self.offset is not None and self.offset < -1:
            msg = f"offset {self.offset} is below -1"
            raise StateFormatError(msg)
        if self.num_consumed_rows < 0:
            msg = f"num_consumed_rows {self.num_consumed_rows} is negative"
            raise StateFormatError(msg)

    @classmethod
    def backfilling(cls, offset: int | None = None, target: int | None = None, rows: int = 0) -> SplitState:
        """``Backfilling(offset)``."""
        return cls(Stage.BACKFILLING, offset, rows, target)

    @classmethod
    def caching_up(cls, offset: int, target: int | None = None, rows: int = 0) -> SplitState:
        """``SourceCachingUp(offset)``."""
        return cls(Stage.SOURCE_CACHING_UP, offset, rows, target)

    @classmethod
    def finished(cls, offset: int | None = None, target: int | None = None, rows: int = 0) -> SplitState:
        """``Finished`` (``offset``: the last backfilled offset, informational)."""
        return cls(Stage.FINISHED, offset, rows, target)

    def with_stage(self, stage: Stage, offset: int | None) -> SplitState:
        """The same split moved to ``stage`` at ``offset``, progress fields kept."""
        return SplitState(stage, offset, self.num_consumed_rows, self.target_offset)


def on_live_row(state: SplitState, offset: int) -> tuple[bool, SplitState]:
    """Apply one live (upstream) row at ``offset``; return (emit it?, new state).

    | state               | b < o                          | b == o          | b > o                   |
    |---------------------|--------------------------------|-----------------|-------------------------|
    | Backfilling(None)   | drop                           |                 |                         |
    | Backfilling(b)      | drop, keep backfilling         | Finished, drop  | SourceCachingUp(b), drop|
    | SourceCachingUp(b)  | Finished, emit (log compacted) | Finished, drop  | drop                    |
    | Finished            | emit                           | emit            | emit                    |

    While the state is Backfilling after the row, ``target_offset = o``.
    """
    b = state.offset
    emit = False
    if state.stage is Stage.FINISHED:
        return True, state
    if state.stage is Stage.BACKFILLING:
        if b is None or b < offset:
            new = state
        elif b == offset:
            new = state.with_stage(Stage.FINISHED, b)
        else:
            new = state.with_stage(Stage.SOURCE_CACHING_UP, b)
    else:  # SourceCachingUp(b)
        assert b is not None  # noqa: S101 - enforced by SplitState
        if b < offset:
            new, emit = state.with_stage(Stage.FINISHED, b), True
        elif b == offset:
            new = state.with_stage(Stage.FINISHED, b)
        else:
            new = state
    if new.stage is Stage.BACKFILLING:
        new = SplitState(new.stage, new.offset, new.num_consumed_rows, offset)
    return emit, new


def on_history_row(state: SplitState, offset: int) -> tuple[bool, SplitState]:
    """Apply one history (backfill) row at ``offset``; return (emit it?, new state).

    Every history row counts in ``num_consumed_rows``. In Backfilling it is emitted, and the split moves
    to ``SourceCachingUp(o)`` once ``o >= target_offset`` (else ``Backfilling(o)``); in any other stage
    it is dropped.
    """
    rows = state.num_consumed_rows + 1
    if state.stage is not Stage.BACKFILLING:
        return False, SplitState(state.stage, state.offset, rows, state.target_offset)
    target = state.target_offset
    if target is not None and offset >= target:
        return True, SplitState(Stage.SOURCE_CACHING_UP, offset, rows, target)
    return True, SplitState(Stage.BACKFILLING, offset, rows, target)
