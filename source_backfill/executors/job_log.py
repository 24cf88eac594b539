"""What a source backfill job's commits carry of its state, and reading it back from the job's table.

A commit carries the job's split states and the live position each split is covered to (``end``), as a
full snapshot or as the delta over the job's previous state commit (:mod:`source_backfill.core.state_log`:
the rule, when a snapshot is due); and a summary of the epoch's plan (its budget, the history ranges it
committed, the live positions that moved). :class:`JobLog` keeps where the job stands in that chain (the
snapshot it builds on, its last state commit) and the positions its last commit covered; recovery
(:func:`read_state_chain`) rebuilds the state from the newest commit and those it names.

No commit without a change: :meth:`JobLog.idle` says when an epoch would commit nothing new (no row, no
split state, no live position moved, no snapshot due by age), so a Finished job on an idle topic writes
no table version.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from source_backfill.core import EpochPlan, HistoryRange
from source_backfill.core.codec import (
    END,
    SPLITS,
    LoggedState,
    decode_state,
    delta_to_json,
    rebuild,
    snapshot_to_json,
    splits_from_rows,
)
from source_backfill.core.columnar import SplitTable
from source_backfill.core.state_log import Chain, Changes, SnapshotPolicy, snapshot_due
from source_backfill.errors import StateFormatError

if TYPE_CHECKING:
    from connectors.delta.sink import DeltaEpochSink, Recovered


class JobLog:
    """Where a job's state commits stand in its table's log, and the live positions it has covered.

    ``committed``: the split states of the job's last commit, handed in by the job (the delta of the
    next commit is taken against them).
    """

    def __init__(self, policy: SnapshotPolicy) -> None:
        self.policy = policy
        #: Where the job's state commits stand (None: the next commit writes a snapshot).
        self.chain: Chain | None = None
        #: Live positions after the job's last committed epoch (what it has covered), for rejoining.
        self.covered_to: dict[str, int] = {}
        #: Whether the commit being made carries a snapshot (set with its state).
        self._snapshot_pending = False

    def recover(self, sink: DeltaEpochSink, recovered: Recovered) -> SplitTable:
        """The split states of the job's newest commit ``recovered``; the chain and covered positions too."""
        sections, self.chain = read_state_chain(sink, recovered)
        if END in sections:
            self.covered_to = dict(sections[END])
        else:  # version 1: the positions are in the commit's plan
            self.covered_to = dict((recovered.plan or {}).get("end", {}))
        return SplitTable.from_states(splits_from_rows(sections[SPLITS]))

    def changes(self, committed: SplitTable | None, new: SplitTable, end: Mapping[str, int]) -> Changes:
        """What moved since the job's last commit: split rows and live positions."""
        rows, removed = new.changed_rows(committed if self.chain is not None else None)
        ends = {s: p for s, p in end.items() if self.covered_to.get(s) != p}
        gone = sorted(s for s in self.covered_to if s not in end)
        changed = {k: v for k, v in ((SPLITS, rows), (END, ends)) if v}
        return Changes(changed, {k: v for k, v in ((SPLITS, removed), (END, gone)) if v})

    def idle(self, committed: SplitTable | None, new: SplitTable, end: Mapping[str, int]) -> bool:
        """No split state or live position moved and no snapshot is due by age: nothing new to record.

        Only once the job's state is in its log in the current format (``chain``): the first commit, and
        the first after a previous-format table, are written whatever the epoch holds. A snapshot due by
        age is committed even by an idle job, so the log cleanup never takes its state.
        """
        if self.chain is None or committed is None or self.changes(committed, new, end):
            return False
        return time.time() - self.chain.base_time_s < self.policy.max_age_s

    def unrecorded(self, committed: SplitTable | None, new: SplitTable, end: Mapping[str, int]) -> bool:
        """Nothing the job's log must record: :meth:`idle`, or only what a rejoin rebuilds moved.

        That is: the same splits, each with its stage, backfilled offset and rows of ``committed``, only
        targets of splits not Finished moved (``SplitTable.only_targets_moved``), and live positions
        moved for the splits the last commit covered (none added or gone); no snapshot due by age.
        """
        if self.idle(committed, new, end):
            return True
        if self.chain is None or committed is None or set(end) != set(self.covered_to):
            return False
        if not new.only_targets_moved(committed):
            return False
        return time.time() - self.chain.base_time_s < self.policy.max_age_s

    def state_doc(self, committed: SplitTable | None, new: SplitTable,
                  end: Mapping[str, int]) -> dict[str, Any]:
        """The state the commit carries: a snapshot, or the delta since the job's previous commit."""
        changes = self.changes(committed, new, end)
        snapshot = self.chain is None or snapshot_due(
            self.policy, has_base=True, deltas_since=self.chain.deltas_since, changes=changes,
            total=2 * len(new), base_age_s=time.time() - self.chain.base_time_s)
        self._snapshot_pending = snapshot
        if snapshot:
            return snapshot_to_json({SPLITS: new.to_json_rows(), END: dict(sorted(end.items()))})
        assert self.chain is not None  # noqa: S101
        return delta_to_json(changes, base=self.chain.base, prev=self.chain.prev)

    def landed(self, version: int | None, end: Mapping[str, int]) -> None:
        """The commit whose state was taken last landed at ``version`` (unknown: the next is a snapshot)."""
        self.covered_to = dict(end)
        if version is None:
            self.chain = None
        elif self._snapshot_pending or self.chain is None:
            self.chain = Chain(version, version, 0, time.time())
        else:
            self.chain = self.chain.after(version, snapshot=False, now_s=time.time())

    def plan_summary(self, plan: EpochPlan, budget: int,
                     history: Iterable[HistoryRange] = ()) -> dict[str, Any]:
        """What the commit records of the epoch's plan: its budget, ranges read, positions that moved."""
        return plan_summary(plan, budget, history, self.covered_to)


def plan_summary(plan: EpochPlan, budget: int, history: Iterable[HistoryRange] = (),
                 covered_to: Mapping[str, int] | None = None) -> dict[str, Any]:
    """What the commit records of the epoch's plan; ``history``: ranges read ahead and adopted.

    ``end``: the live positions that moved since ``covered_to`` (all without it); the state holds them
    all (its ``end`` section).
    """
    before = covered_to or {}
    return {
        "budget": budget,
        "history": [[r.split, r.start, r.end] for r in (*history, *plan.history)],
        "end": {s: p for s, p in plan.end.items() if before.get(s) != p},
    }


def read_state_chain(
    sink: DeltaEpochSink, recovered: Recovered
) -> tuple[dict[str, dict[str, Any]], Chain | None]:
    """A job's full state sections and its log chain, from its newest commit ``recovered``.

    A delta's snapshot and the deltas between are read one commit file each (``prev`` links back to
    ``base``, :func:`source_backfill.core.codec.rebuild`); a link missing, torn or misplaced raises
    :class:`StateFormatError` naming the table. A previous-format table (every commit a full state, no
    ``end`` section) gives no chain: the job's next commit starts one with a snapshot.
    """
    from connectors.delta.log import KEY_JOB, KEY_STATE

    where = f'Delta table {sink.path} (job "{sink.job_id}")'
    seen: dict[int, tuple[LoggedState, Any]] = {}

    def decode(state: Any, version: int) -> LoggedState:
        try:
            return decode_state(state)
        except StateFormatError as exc:
            msg = (f"{where}: the state of the commit at version {version} is damaged ({exc}); restore "
                   "_delta_log from a backup, or drop the job and re-create it on a new sink path")
            raise StateFormatError(msg) from exc

    def read(version: int) -> LoggedState | None:
        commit = sink.read_commit(version)
        if commit is None or commit.get(KEY_JOB) != sink.job_id or KEY_STATE not in commit:
            return None
        logged = decode(commit[KEY_STATE], version)
        seen[version] = (logged, commit.get("timestamp"))
        return logged

    head = decode(recovered.state, recovered.version)
    sections = rebuild(head, read, where=where)
    if END not in sections:
        return sections, None
    if head.kind == "snapshot":
        stamp = recovered.timestamp_ms
        return sections, Chain(recovered.version, recovered.version, 0,
                               time.time() if stamp is None else stamp / 1000)
    assert head.base is not None  # noqa: S101 - a delta names its base
    stamp = seen[head.base][1]
    return sections, Chain(head.base, recovered.version, len(seen),
                           time.time() if stamp is None else int(stamp) / 1000)
