"""Table backfill of a changing Delta table: the pure rules of the snapshot, arrangement and chain modules.

The upstream is a Delta table with change data feed, read as one live stream of its changes per source;
an epoch's live batch holds the changes of the table versions ``(a, b]`` (every change carries its
``_commit_version``). A job copies the table's rows and then follows its changes, exactly once, in one of
three ways (docs/architecture.md; RisingWave's snapshot backfill, arrangement backfill and rearranged chain):

* **arrangement** — no pinned version. Each vnode (``crc32(pk) % 256``) is ``NotStarted``,
  ``InProgress(pos)`` or ``Completed(pos)``. Each epoch reads, per unfinished vnode, the next chunk of
  rows with ``pk > pos`` in pk order from version ``a`` (the version the live stream had delivered when the
  epoch began) and raises ``pos`` to the chunk's last pk; a chunk shorter than asked completes the vnode.
  Then the epoch's live changes are forwarded only where ``pk <= pos`` of their vnode (Completed: all;
  NotStarted: none). A dropped change is not lost: a later chunk reads its row from a later version.
  Into a merged (copy-on-write) table, an epoch that would merge a chunk with changes to held keys
  copies at its cursor first and merges the changes the next epoch (:func:`arrangement_step`).
* **snapshot** — pin the version ``V`` delivered at attach; read the snapshot of ``V`` per vnode in chunks
  (``Consuming(last pk)`` / ``Consumed``), ignoring live changes; then replay the change feed from
  ``V + 1`` in bounded batches of versions, each epoch replaying more versions than arrived, so the
  pending lag shrinks every epoch; once the replay reaches the live stream, forward live changes with a
  version above the replay's cursor. The Delta log is the log store: nothing is buffered.
* **chain** — the snapshot of ``V`` in one read, then the changes after ``V`` (replay, then live); no
  per-vnode progress, so a restart reads the snapshot again.

Exactly once is by position, as for Kafka offsets: a vnode's ``pos`` splits its keys into those the job
has (``<= pos``) and those it will read later; the replay's ``cursor`` splits versions into those emitted
(``<= cursor``) and those to come. Everything here is pure: the runtime reads and writes, these functions
decide what to read and what to forward.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any

from source_backfill.core.vnode import VNODE_COUNT
from source_backfill.errors import StateFormatError

#: A primary key as a tuple of its column values, compared in pk order.
Key = tuple[Any, ...]


class VnodeStage(StrEnum):
    """Where one vnode's copy of the table stands."""

    NOT_STARTED = "not_started"
    IN_PROGRESS = "in_progress"
    COMPLETED = "completed"


@dataclass(frozen=True)
class VnodeProgress:
    """One vnode: its stage and the last pk copied (None before the first row)."""

    stage: VnodeStage = VnodeStage.NOT_STARTED
    pos: Key | None = None

    def forwards(self, pk: Key) -> bool:
        """Whether a live change of ``pk`` (in this vnode) is emitted now (arrangement's rule)."""
        if self.stage is VnodeStage.COMPLETED:
            return True
        if self.stage is VnodeStage.NOT_STARTED or self.pos is None:
            return False
        return pk <= self.pos

    def after_chunk(self, pks: Sequence[Key], asked: int) -> VnodeProgress:
        """The progress after a chunk read of ``asked`` rows returned rows with ``pks`` (in pk order).

        A chunk shorter than asked reached the end of the vnode's range: the vnode is complete.
        """
        if self.stage is VnodeStage.COMPLETED:
            msg = "a completed vnode reads no more chunks"
            raise ValueError(msg)
        if asked < 1 or len(pks) > asked:
            msg = f"a chunk asks for at least one row and returns at most that many ({len(pks)} > {asked})"
            raise ValueError(msg)
        pos = pks[-1] if pks else self.pos
        if pks and self.pos is not None and pks[0] <= self.pos:
            msg = f"chunk starts at {pks[0]!r}, not above the position {self.pos!r}"
            raise ValueError(msg)
        stage = VnodeStage.COMPLETED if len(pks) < asked else VnodeStage.IN_PROGRESS
        return VnodeProgress(stage, pos)


@dataclass(frozen=True)
class VnodeSet:
    """The progress of every vnode (only those not ``NotStarted`` are stored)."""

    vnodes: Mapping[int, VnodeProgress] = field(default_factory=dict)
    count: int = VNODE_COUNT

    def of(self, vnode: int) -> VnodeProgress:
        """One vnode's progress."""
        return self.vnodes.get(vnode, VnodeProgress())

    @property
    def done(self) -> bool:
        """Every vnode is complete."""
        return all(self.of(v).stage is VnodeStage.COMPLETED for v in range(self.count))

    def unfinished(self) -> list[int]:
        """The vnodes still to copy, in order."""
        return [v for v in range(self.count) if self.of(v).stage is not VnodeStage.COMPLETED]

    def with_chunks(self, chunks: Mapping[int, tuple[Sequence[Key], int]]) -> VnodeSet:
        """After this epoch's chunks: ``vnode -> (pks read in order, rows asked)``."""
        merged = dict(self.vnodes)
        for v, (pks, asked) in chunks.items():
            merged[v] = self.of(v).after_chunk(pks, asked)
        return VnodeSet(merged, self.count)

    def completed(self) -> int:
        """How many vnodes are complete (the job's progress)."""
        return sum(self.of(v).stage is VnodeStage.COMPLETED for v in range(self.count))


def plan_chunks(vnodes: VnodeSet, budget_rows: int | None, *, chunk_rows: int = 1024) -> dict[int, int]:
    """Rows to ask of each unfinished vnode this epoch.

    ``budget_rows``: the epoch's share of the rate limit (None: unlimited; 0: pause — nothing is read and
    nothing is lost). A positive budget is spread over the unfinished vnodes, at least one row each, so
    no vnode stalls behind the others (RisingWave #11007, #26421): with a budget below the number of
    unfinished vnodes, the first ``budget`` of them (in vnode order) get one row each.
    """
    todo = vnodes.unfinished()
    if not todo or budget_rows == 0:
        return {}
    if budget_rows is None:
        return dict.fromkeys(todo, chunk_rows)
    if budget_rows < len(todo):
        return dict.fromkeys(todo[:budget_rows], 1)
    share, extra = divmod(budget_rows, len(todo))
    return {v: min(chunk_rows, share + (1 if i < extra else 0)) for i, v in enumerate(todo)}


class ArrangementStep(StrEnum):
    """What an arrangement epoch does while it copies, when its table is merged (:func:`arrangement_step`)."""

    #: read the planned chunks and forward the live changes (the default, and every changelog epoch)
    FOLLOW = "follow"
    #: read the planned chunks at the job's version, and leave the live changes to the next epoch
    COPY_AT_CURSOR = "copy_at_cursor"
    #: forward the live changes, with one row per unfinished vnode
    FOLLOW_MERGED = "follow_merged"


def arrangement_step(*, merged: bool, changes_held: bool, copied_last: bool,
                     budget_rows: int | None) -> ArrangementStep:
    """How an arrangement epoch splits its work so a chunk is never merged into the job's table.

    A job whose output is merged by key into a copy-on-write Delta table rewrites every file a merge
    touches, so an epoch that copies a chunk and also forwards a change to a key the job's table holds
    (``changes_held``) would pay for a merge of the whole chunk. Such an epoch is split in two: first the
    chunks, read at the job's version (its cursor does not move: the live changes wait in the source
    table's log, nothing is dropped), appended; then the live changes, merged with one row per unfinished
    vnode — every epoch still reads from every unfinished vnode, so the copy never stalls. Epochs with no
    change to a held key, changelog output (always appended) and paused copies (``budget_rows == 0``) just
    follow.
    """
    if not merged or not changes_held or budget_rows == 0:
        return ArrangementStep.FOLLOW
    return ArrangementStep.FOLLOW_MERGED if copied_last else ArrangementStep.COPY_AT_CURSOR


def step_budget(step: ArrangementStep, vnodes: VnodeSet, budget_rows: int | None) -> int | None:
    """The rows an arrangement epoch of ``step`` may copy: one per unfinished vnode when it merges."""
    if step is not ArrangementStep.FOLLOW_MERGED:
        return budget_rows
    todo = len(vnodes.unfinished())
    return todo if budget_rows is None else min(budget_rows, todo)


# -- versions: the replay of the log store and the hand-over to the live stream --------------------------
def replay_end(cursor: int, delivered: int, arrived: int, max_versions: int) -> int:
    """The last version to replay this epoch, from ``cursor + 1``.

    ``delivered``: the newest version the live stream has delivered; ``arrived``: how many versions it
    delivered in the last epoch. At most ``max(max_versions, arrived + 1)`` versions are replayed, so the
    pending lag ``delivered - cursor`` shrinks by at least one every epoch while versions keep arriving
    (the lag bound of the snapshot module), and never past ``delivered``.
    """
    if max_versions < 1:
        msg = f"max_versions must be >= 1, got {max_versions}"
        raise ValueError(msg)
    if cursor >= delivered:
        return cursor
    return min(delivered, cursor + max(max_versions, arrived + 1))


def forwards_version(cursor: int, version: int) -> bool:
    """Whether a live change of ``version`` is emitted: only versions the replay has not emitted."""
    return version > cursor


# -- the copy by files (Spark): a large pinned version ---------------------------------------------------
def copies_by_files(strategy: str, rows: int | None, min_rows: int | None, *, spark: bool) -> bool:
    """Whether a copy of a version of ``rows`` rows (None: unknown) goes by files.

    Only snapshot and chain (arrangement forwards live changes by key position, which needs the key
    order), only with Spark at hand, and only from ``min_rows`` rows (None: never).
    """
    return (spark and strategy != Strategy.ARRANGEMENT and min_rows is not None and rows is not None
            and rows >= min_rows)


def plan_files(rows: Sequence[int], done: int, budget_rows: int | None, *, max_rows: int) -> int:
    """The files a copy by files takes this epoch: ``rows[done:end]``, returns ``end``.

    ``rows``: each data file's row count, the pinned version's files in path order (fixed for a version,
    so the same list after a restart); ``done``: how many are copied. The epoch takes whole files while
    their rows stay within ``budget_rows`` (the rate limit's share; None: unlimited) and ``max_rows``
    (what one epoch copies at most: the unit a crash redoes), and at least one file unless the budget is
    0 (paused). A file larger than the budget is still taken whole: a file is the unit of progress, so
    over time the copy spends its allowance (the rate limit then waits for it to accrue again).
    """
    if not 0 <= done <= len(rows):
        msg = f"{done} files copied of {len(rows)}"
        raise ValueError(msg)
    if max_rows < 1:
        msg = f"max_rows must be >= 1, got {max_rows}"
        raise ValueError(msg)
    if budget_rows == 0 or done == len(rows):
        return done
    limit = max_rows if budget_rows is None else min(budget_rows, max_rows)
    end, taken = done + 1, rows[done]
    while end < len(rows) and taken + rows[end] <= limit:
        taken += rows[end]
        end += 1
    return end


# -- the modules' persisted state ---------------------------------------------------------------------------
class Strategy(StrEnum):
    """The three table-backfill modules."""

    SNAPSHOT = "snapshot"
    ARRANGEMENT = "arrangement"
    CHAIN = "chain"


class Phase(StrEnum):
    """Stages of a table-backfill job (the metric's ``stage`` label)."""

    CONSUMING_SNAPSHOT = "consuming_snapshot"
    CONSUMING_LOG_STORE = "consuming_log_store"
    CONSUME_UPSTREAM = "consume_upstream"


@dataclass(frozen=True)
class TableBackfillState:
    """What a job commits with each epoch.

    ``pinned``: the snapshot's version (snapshot and chain; None for arrangement); ``cursor``: versions up
    to it are emitted (replay and live); ``vnodes``: per-vnode copy progress (snapshot of ``pinned`` for
    the snapshot module, the moving table for arrangement; unused by chain); ``files``: the snapshot or
    chain copy by files instead (:func:`plan_files`, by Spark): how many of ``pinned``'s data files, in
    path order, are copied (None: not a copy by files).
    """

    strategy: Strategy
    phase: Phase = Phase.CONSUMING_SNAPSHOT
    pinned: int | None = None
    cursor: int | None = None
    vnodes: VnodeSet = field(default_factory=VnodeSet)
    files: int | None = None

    def __post_init__(self) -> None:
        if self.strategy is not Strategy.ARRANGEMENT and self.pinned is None:
            msg = f"a {self.strategy} backfill pins a version"
            raise ValueError(msg)
        if self.files is not None and (self.strategy is Strategy.ARRANGEMENT or self.files < 0):
            msg = f"a copy by files is of a pinned version, {self.files} files copied ({self.strategy})"
            raise ValueError(msg)

    def by_files(self) -> TableBackfillState:
        """The snapshot copy goes by files (:func:`plan_files`), from the first; only before it started."""
        if self.phase is not Phase.CONSUMING_SNAPSHOT or self.vnodes.vnodes or self.files is not None:
            msg = "a copy turns to files only before it copied anything"
            raise ValueError(msg)
        return replace(self, files=0)

    @classmethod
    def attach(cls, strategy: Strategy, delivered: int) -> TableBackfillState:
        """A new job attached when the live stream had delivered version ``delivered``.

        Every strategy starts its ``cursor`` there: the live changes a job takes next are those of the
        versions after it. Arrangement pins nothing; it moves its cursor with every epoch
        (:meth:`followed`).
        """
        if strategy is Strategy.ARRANGEMENT:
            return cls(strategy, cursor=delivered)
        return cls(strategy, pinned=delivered, cursor=delivered)

    def followed(self, delivered: int) -> TableBackfillState:
        """Arrangement: the epoch read its chunks and forwarded the live changes up to ``delivered``."""
        return replace(self, cursor=delivered)

    def snapshot_done(self, vnodes: VnodeSet | None = None, *,
                      delivered: int | None = None) -> TableBackfillState:
        """The snapshot is copied (for arrangement: every vnode complete, so upstream flows through).

        Snapshot and chain then replay the versions after the pinned one, unless the live stream has
        delivered none (``delivered``, this epoch's, at the cursor): nothing waits in the log store, and
        the job follows the live stream from the next epoch (the empty replay's epoch saved).
        """
        if self.strategy is Strategy.ARRANGEMENT:
            return replace(self, phase=Phase.CONSUME_UPSTREAM, vnodes=vnodes or self.vnodes)
        assert self.cursor is not None
        caught_up = delivered is not None and delivered <= self.cursor
        return replace(self, phase=Phase.CONSUME_UPSTREAM if caught_up else Phase.CONSUMING_LOG_STORE,
                       vnodes=vnodes or self.vnodes)

    def replayed(self, end: int, delivered_end: int) -> TableBackfillState:
        """The replay emitted versions up to ``end``; caught up once it reaches ``delivered_end``."""
        phase = Phase.CONSUME_UPSTREAM if end >= delivered_end else Phase.CONSUMING_LOG_STORE
        return replace(self, cursor=end, phase=phase)

    # -- JSON ------------------------------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        """The state as a JSON object (pks as lists; ``files`` only for a copy by files)."""
        files = {} if self.files is None else {"files": self.files}
        return files | {
            "strategy": self.strategy.value,
            "phase": self.phase.value,
            "pinned": self.pinned,
            "cursor": self.cursor,
            "vnode_count": self.vnodes.count,
            "vnodes": {str(v): [p.stage.value, None if p.pos is None else list(p.pos)]
                       for v, p in sorted(self.vnodes.vnodes.items())},
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> TableBackfillState:
        """Parse :meth:`to_json`'s output; :class:`StateFormatError` on anything else."""
        try:
            vnodes = {int(v): VnodeProgress(VnodeStage(stage), None if pos is None else tuple(pos))
                      for v, (stage, pos) in data["vnodes"].items()}
            count = int(data["vnode_count"])
            if any(not 0 <= v < count for v in vnodes):
                msg = f"vnode out of range 0..{count - 1}"
                raise ValueError(msg)
            return cls(Strategy(data["strategy"]), Phase(data["phase"]), _opt_int(data["pinned"]),
                       _opt_int(data["cursor"]), VnodeSet(vnodes, count), _opt_int(data.get("files")))
        except (KeyError, TypeError, ValueError) as exc:
            msg = f"table backfill state is malformed: {exc}"
            raise StateFormatError(msg) from exc


def _opt_int(value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        msg = f"expected an integer version, got {value!r}"
        raise TypeError(msg)
    return value
