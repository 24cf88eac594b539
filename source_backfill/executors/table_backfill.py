"""A table-backfill job: copy a changing Delta table into the job's table, then follow its changes.

One job, one strategy (``snapshot``, ``arrangement`` or ``chain``; docs/architecture.md and the rules in
:mod:`source_backfill.core.table_backfill`). Every epoch the source hands the job the versions the live
stream delivered (``delivered``) and the change feed rows after the slowest job's cursor; the job decides
what to emit with the pure rules, reads what they ask for (snapshot chunks, a bounded replay) with
delta-rs on the driver (or, for a large pinned version, by data file with Spark's executors: the copy by
files), and commits its output and its new state in one Delta commit
(``Transaction(job, epoch)``, the Kafka jobs' exactly-once protocol). A restarted job resumes from the
state in its table's last commit: nothing is buffered in memory, the source table's log is the log store.

No commit without a change: an epoch that emits no row and leaves the state as it was (a live job on a
quiet table) commits nothing. Only before half the table's log retention has passed since the job's last
commit is one written anyway, so that Delta's log cleanup never takes the state of an idle job.

Output: ``merge`` applies the changes to the job's table by primary key (a copy of the source table);
``changelog`` appends every change with ``_change_type``, ``_epoch`` and ``_seq`` (replayed in
``(_epoch, _seq)`` order it rebuilds the table).
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from contextlib import nullcontext
from dataclasses import replace
from typing import TYPE_CHECKING, Any, NamedTuple

from connectors.delta.merge import CHANGE_TYPE
from source_backfill import metrics
from source_backfill.core.budget import RateAllowance, table_budget
from source_backfill.core.progress import Throughput
from source_backfill.core.table_backfill import (
    ArrangementStep,
    Phase,
    Strategy,
    TableBackfillState,
    VnodeSet,
    arrangement_step,
    plan_chunks,
    replay_end,
    step_budget,
)
from source_backfill.core.vnode import VNODE_COUNT, key_vnode
from source_backfill.executors.commit_gate import CommitGate
from source_backfill.executors.job import HeldByQuota
from source_backfill.executors.table_files import FileChunk, FileCopy

if TYPE_CHECKING:
    from collections.abc import Sequence

    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession

    from connectors.delta.spill import SpilledIndex
    from connectors.delta.table_source import DeltaTableSource, VersionIndex
    from source_backfill.config import JobSpec, SourceConfig
    from source_backfill.executors.job import ByteQuota

logger = logging.getLogger(__name__)

COMMIT_VERSION = "_commit_version"
#: Key of the table-backfill state in the job's commit metadata; ``rows`` holds the per-stage counts.
STATE_KEY = "table_backfill"
#: Arrangement indexes the table again (at its cursor) once this many changes wait for a chunk to cover
#: their keys (they are held in memory; the index of an earlier version serves until then).
UNSENT_MAX_ROWS = 100_000


class TableBackfillJob(HeldByQuota):
    """One job on a ``delta`` source: its sink, its committed state and its control flags."""

    def __init__(self, spec: JobSpec, source: SourceConfig, table: DeltaTableSource,
                 *, vnode_count: int = VNODE_COUNT, spark: SparkSession | None = None) -> None:
        import pyarrow as pa

        from connectors.delta.sink import DeltaEpochSink

        if spec.strategy is None:
            msg = f'job "{spec.name}" on delta source "{source.name}" has no strategy'
            raise ValueError(msg)
        self.spec = spec
        self.name = spec.name
        self.strategy = Strategy(spec.strategy)
        self.mode = spec.mode or "merge"
        self.primary_key = tuple(source.primary_key)
        self.chunk_rows = source.chunk_rows
        self.index_rows = source.table_index_rows
        self.replay_versions = source.replay_versions_per_epoch
        #: The copy by files of a large pinned version (Spark), and the epoch's files.
        self.file_copy = FileCopy(spec.name, table, spark, min_rows=source.spark_copy_rows,
                                  epoch_rows=source.spark_copy_epoch_rows)
        self._bulk: FileChunk | None = None
        self.interval_s = source.trigger_interval_s
        self.vnode_count = vnode_count
        self.table = table
        columns = table.arrow_schema()
        change = pa.field(CHANGE_TYPE, pa.string())
        if self.mode == "merge":
            schema = pa.schema([*columns, change])
            self.sink = DeltaEpochSink(spec.sink_path, spec.name, schema, mode="merge",
                                       key_columns=self.primary_key, on_conflict=self._conflict)
        else:
            order = [pa.field("_epoch", pa.int64()), pa.field("_seq", pa.int64())]
            schema = pa.schema([*columns, change, *order])
            self.sink = DeltaEpochSink(spec.sink_path, spec.name, schema, on_conflict=self._conflict)
        self.state: TableBackfillState | None = None
        self.committed_epoch: int | None = None
        #: The last epoch processed: committed, or with nothing to commit.
        self.processed_epoch: int | None = None
        #: When the job's last commit was made (wall clock seconds; its state's age in the log).
        self._last_commit_s: float | None = None
        self._max_state_age_s = self.sink.log_retention_s() / 2
        self.rows: Counter[str] = Counter()
        self._recover()
        #: Stopped by a drop, a retry, a failure or the daemon stopping: no commit of the job lands after.
        self._gate = CommitGate(self.name)
        self.paused = False
        #: The namespace's table bytes of the day (None: its namespace bounds none): counted after each
        #: commit; while held, the copy and the replay wait as if paused (live changes still commit).
        self.quota: ByteQuota | None = None
        self.rate_limit: float | None = spec.rate_limit
        #: The rate limit's allowance on the wall clock: the snapshot's chunks spend the rows they copy.
        self._allowance = RateAllowance()
        #: Set by the source for an epoch run alone (:class:`~source_backfill.executors.job.Job`); nothing
        #: of a table-backfill job runs beside its epochs, so it changes nothing here.
        self.alone = False
        #: The newest version the live stream delivered, as of the last epoch (for the lag).
        self.delivered: int | None = None
        self.last_error: str | None = None
        self._index: tuple[int, VersionIndex | SpilledIndex] | None = None
        #: Arrangement: the changes after the index's version of keys no chunk covered yet (None: the
        #: index is of the cursor's version, or there is none), and what the epoch being committed holds.
        self._unsent: pa.Table | None = None
        self._unsent_next: pa.Table | None = None
        #: Arrangement into a merged table: the last committed epoch copied at its cursor
        #: (:func:`arrangement_step`; in memory only, a restart starts over with a plain epoch).
        self._copied_last = False
        self._step = ArrangementStep.FOLLOW
        #: Rows of the table version the snapshot phase copies (the pinned one; arrangement: the cursor's),
        #: counted when it is indexed; None before.
        self.snapshot_rows: int | None = None
        #: Wall-clock rates for the progress and ETA: rows copied, versions replayed, versions delivered.
        now = time.monotonic()
        self.copied_rate, self.replayed_rate, self.arrived_rate = Throughput(), Throughput(), Throughput()
        self.copied_rate.observe(now, self.rows[Phase.CONSUMING_SNAPSHOT.value])

    def _conflict(self) -> None:
        metrics.COMMIT_CONFLICTS.labels(self.name).inc()

    def _recover(self) -> None:
        recovered = self.sink.recover()
        if recovered is None:
            return
        self.committed_epoch = recovered.epoch
        stamp = recovered.timestamp_ms
        self._last_commit_s = time.time() if stamp is None else stamp / 1000
        data = recovered.state.get(STATE_KEY)
        if data is not None:
            self.state = TableBackfillState.from_json(data)
            # replaced, not added to: a replayed epoch recovers again into a job that counted already
            self.rows = Counter({k: int(v) for k, v in recovered.state.get("rows", {}).items()})

    def close(self) -> None:
        """Nothing runs beside the epochs: the cached snapshot is released (a spill removed); no commit after.

        A step still running on the job's lane ends at its commit (:meth:`stop_lane`).
        """
        self._gate.close("closed")
        self._drop_index()
        self._unsent = None

    def stop_lane(self, why: str, timeout_s: float = 30.0) -> bool:
        """No commit of the job lands from now on: its copy by files in flight is cancelled (its job group).

        Returns once a commit in flight has ended, False if that took more than ``timeout_s``.
        """
        return self._gate.stop(why, timeout_s, lambda _why: self.file_copy.cancel())

    def _drop_index(self) -> None:
        """Let the cached snapshot go (a spilled one's files removed)."""
        if self._index is not None:
            self._index[1].close()
        self._index = None

    # -- what the source asks ----------------------------------------------------------------------
    @property
    def cursor(self) -> int | None:
        """Versions up to this one are emitted (None before the job's first epoch)."""
        return None if self.state is None else self.state.cursor

    def needs_live(self) -> bool:
        """Whether this epoch's live changes matter to the job (else it reads its own versions)."""
        state = self.state
        if state is None or state.strategy is Strategy.ARRANGEMENT:
            return True
        return state.phase is Phase.CONSUME_UPSTREAM

    @property
    def backfill_done(self) -> bool:
        """The job follows the live stream (its status is ``finished``)."""
        return self.state is not None and self.state.phase is Phase.CONSUME_UPSTREAM

    @property
    def lag_versions(self) -> int | None:
        """Delivered versions not emitted yet."""
        if self.state is None or self.delivered is None or self.state.cursor is None:
            return None
        return max(0, self.delivered - self.state.cursor)

    # -- the epoch ---------------------------------------------------------------------------------
    def run_epoch(self, epoch: int, before: int, delivered: int, live: pa.Table | None) -> bool:
        """Emit and commit epoch ``epoch`` over the versions ``(before, delivered]``.

        ``live``: the change feed rows of at least the versions after this job's cursor up to
        ``delivered`` when :meth:`needs_live` (rows at or below the cursor are ignored). Returns whether
        the epoch was committed (False: it was committed before, a replay, or nothing changed).
        """
        state = self.state or TableBackfillState.attach(self.strategy, before)
        self._bulk = None
        allowance = self._allowance.available(self.rate_limit, self.interval_s, time.monotonic())
        budget = table_budget(paused=self.history_waits, allowance=allowance,
                              max_rows_per_epoch=self.spec.max_rows_per_epoch)
        parts: list[_Part] = []
        self._step = ArrangementStep.FOLLOW
        if state.phase is Phase.CONSUMING_SNAPSHOT:
            state = self._copy(state, budget, delivered, live, parts)
        elif state.strategy is Strategy.ARRANGEMENT:
            parts.append(_Part(Phase.CONSUME_UPSTREAM.value, self._after(live, state.cursor, delivered)))
            state = state.followed(delivered)
        elif state.phase is Phase.CONSUMING_LOG_STORE:
            if budget != 0:  # paused: the replay waits with the copy; the log store loses nothing
                assert state.cursor is not None
                end = replay_end(state.cursor, delivered, delivered - before, self.replay_versions)
                if end > state.cursor:
                    parts.append(_Part(Phase.CONSUMING_LOG_STORE.value,
                                       _ordered(self.table.changes_arrow(state.cursor + 1, end))))
                state = state.replayed(end, delivered)
        else:
            parts.append(_Part(Phase.CONSUME_UPSTREAM.value, self._after(live, state.cursor, delivered)))
            state = state.replayed(delivered, delivered)
        outcome = self._commit(epoch, state, parts, delivered)
        committed = outcome != "replay"  # an unchanged epoch stands as if committed: it holds nothing new
        self.processed_epoch = epoch
        # arrangement's held changes move on with the commit; a replayed epoch starts them over
        self._unsent = self._unsent_next if committed else None
        self._copied_last = committed and self._step is ArrangementStep.COPY_AT_CURSOR
        if not committed:
            self._drop_index()
        self._unsent_next = None
        return outcome == "committed"

    def _copy(self, state: TableBackfillState, budget: int | None, delivered: int, live: pa.Table | None,
              parts: list[_Part]) -> TableBackfillState:
        """The snapshot phase, by strategy: chain reads in one pass, snapshot and arrangement by vnode.

        A snapshot or chain copy of a large pinned version goes by files instead (:class:`FileCopy`),
        chosen before it copies anything and kept in its state.
        """
        if self.file_copy.takes(state):
            state = state.by_files()
        if state.files is not None:
            return self._copy_files(state, budget, delivered)
        if state.strategy is Strategy.CHAIN:
            return self._copy_chain(state, budget, delivered, parts)
        if state.strategy is Strategy.SNAPSHOT:
            return self._copy_snapshot(state, budget, delivered, parts)
        return self._copy_arrangement(state, budget, delivered, live, parts)

    def _copy_chain(self, state: TableBackfillState, budget: int | None, delivered: int,
                    parts: list[_Part]) -> TableBackfillState:
        """Chain: the pinned version's rows in one read (no per-vnode progress), unless paused."""
        if budget == 0:
            return state
        assert state.pinned is not None
        from connectors.delta.table_source import VersionIndex

        # chain copies its snapshot in one epoch, in the driver's memory (Known limits)
        index = VersionIndex(self.table.rows_arrow(state.pinned), self.primary_key, self.vnode_count)
        self.snapshot_rows = index.num_rows
        parts.append(_Part(Phase.CONSUMING_SNAPSHOT.value, _inserts(index.rows), new_keys=True))
        self._drop_index()
        return state.snapshot_done(delivered=delivered)

    def _copy_files(self, state: TableBackfillState, budget: int | None,
                    delivered: int) -> TableBackfillState:
        """The copy by files (:mod:`source_backfill.executors.table_files`): the epoch's next files."""
        step = self.file_copy.step(state, budget)
        self.snapshot_rows = self.file_copy.total_rows
        if step.chunk is not None:
            self._bulk = step.chunk
            self._allowance.spend(step.chunk.rows)
        state = replace(state, files=step.files)
        return state.snapshot_done(delivered=delivered) if step.done else state

    def _copy_snapshot(self, state: TableBackfillState, budget: int | None, delivered: int,
                       parts: list[_Part]) -> TableBackfillState:
        """Snapshot: the next chunk of each unfinished vnode of the pinned version; live changes wait."""
        assert state.pinned is not None
        index = self._snapshot(state.pinned)
        self._step = ArrangementStep.FOLLOW
        vnodes = self._read_chunks(state, index, budget, parts)
        return self._copied(replace(state, vnodes=vnodes), delivered)

    def _copy_arrangement(self, state: TableBackfillState, budget: int | None, delivered: int,
                          live: pa.Table | None, parts: list[_Part]) -> TableBackfillState:
        """Arrangement: chunks of the moving table (:meth:`_arranged`), and the live changes it forwards.

        Forwarded: changes of keys at or below their vnode's position after this epoch's chunks; those
        above the position before them are keys the job's table does not hold yet. The others wait with
        the index's version (their rows are read from it, the changes after it are applied over them once
        a chunk covers their keys). An epoch that copies at its cursor takes no live change: they wait in
        the source table's log for the next epoch.
        """
        import pyarrow as pa

        live_changes = self._after(live, state.cursor, delivered)
        held = any(state.vnodes.of(key_vnode(k, self.vnode_count)).forwards(k)
                   for k in self._keys(live_changes))
        step = arrangement_step(merged=self.mode == "merge", changes_held=held,
                                copied_last=self._copied_last, budget_rows=budget)
        index = self._arranged(state)
        self._step = step
        vnodes = self._read_chunks(state, index, step_budget(step, state.vnodes, budget), parts)
        changes = live_changes.slice(0, 0) if step is ArrangementStep.COPY_AT_CURSOR else live_changes
        if self._unsent is not None:
            changes = _ordered(pa.concat_tables([self._unsent, changes], promote_options="permissive"))
        old, new, wait = [], [], []
        for k in self._keys(changes):
            vn = key_vnode(k, self.vnode_count)
            was, now = state.vnodes.of(vn).forwards(k), vnodes.of(vn).forwards(k)
            old.append(was)
            new.append(now and not was)
            wait.append(not now)
        stage = Phase.CONSUME_UPSTREAM.value
        parts.append(_Part(stage, changes.filter(pa.array(old, pa.bool_()))))
        parts.append(_Part(stage, changes.filter(pa.array(new, pa.bool_())), new_keys=True))
        self._unsent_next = changes.filter(pa.array(wait, pa.bool_()))
        state = replace(state, vnodes=vnodes)
        if step is not ArrangementStep.COPY_AT_CURSOR:
            state = state.followed(delivered)
        return self._copied(state, delivered)

    def _read_chunks(self, state: TableBackfillState, index: VersionIndex | SpilledIndex, budget: int | None,
                     parts: list[_Part]) -> VnodeSet:
        """Read the epoch's chunks from ``index`` (into ``parts``): the vnodes' progress after them."""
        import pyarrow as pa

        runs = []
        chunks = {}
        for vn, asked in plan_chunks(state.vnodes, budget, chunk_rows=self.chunk_rows).items():
            rows, keys = index.read_chunk(vn, state.vnodes.of(vn).pos, asked)
            if rows.num_rows:
                runs.append(rows)
            chunks[vn] = (keys, asked)
        self._allowance.spend(sum(r.num_rows for r in runs))
        if runs:
            parts.append(_Part(Phase.CONSUMING_SNAPSHOT.value, _inserts(pa.concat_tables(runs)),
                               new_keys=True))
        return state.vnodes.with_chunks(chunks)

    def _copied(self, state: TableBackfillState, delivered: int) -> TableBackfillState:
        """After an epoch's chunks: the snapshot phase ends once every vnode is complete."""
        if state.vnodes.done:
            self._drop_index()
            return state.snapshot_done(delivered=delivered)
        return state

    def _arranged(self, state: TableBackfillState) -> VersionIndex | SpilledIndex:
        """Arrangement's index: of an earlier version ``V0``, or of the cursor's version.

        ``V0``'s serves while the changes after it that no chunk covered yet are held (``_unsent``, at
        most ``UNSENT_MAX_ROWS``).
        Reading chunks of ``V0`` and applying the held changes to their keys gives the rows of the
        cursor's version, without indexing the table again every epoch.
        """
        unsent = self._unsent
        kept = self._index is not None and unsent is not None and unsent.num_rows <= UNSENT_MAX_ROWS
        if not kept:
            assert state.cursor is not None
            self._drop_index()
            self._unsent = None
            return self._snapshot(state.cursor)
        assert self._index is not None
        return self._index[1]

    def _snapshot(self, version: int) -> VersionIndex | SpilledIndex:
        """The table at ``version``, indexed by vnode and key (kept while the version is the same).

        In the driver's memory up to ``table_index_rows`` rows (by the log's statistics); a larger version
        is spilled to local disk by vnode (:mod:`connectors.delta.spill`: one vnode's rows in memory at a
        time), in the system's temporary folder, removed when the job lets the version go.
        """
        import tempfile
        from pathlib import Path

        from connectors.delta.spill import SpilledIndex
        from connectors.delta.table_source import VersionIndex

        if self._index is None or self._index[0] != version:
            self._drop_index()
            t0 = time.monotonic()
            counted = self.table.row_count(version)
            index: VersionIndex | SpilledIndex
            if counted is not None and counted > self.index_rows:
                folder = Path(tempfile.mkdtemp(prefix=f"source-backfill-spill-{self.name}-v{version}-"))
                index = SpilledIndex(self.table.batches(version), self.table.arrow_schema(version),
                                     self.primary_key, self.vnode_count, folder)
            else:
                index = VersionIndex(self.table.rows_arrow(version), self.primary_key, self.vnode_count)
            self.snapshot_rows = index.num_rows  # the copy's total: its progress and ETA
            logger.info('table snapshot indexed job="%s" version=%d rows=%d spilled=%s seconds=%.2f',
                        self.name, version, index.num_rows, isinstance(index, SpilledIndex),
                        time.monotonic() - t0)
            self._index = (version, index)
        return self._index[1]

    def _after(self, live: pa.Table | None, cursor: int | None, delivered: int) -> pa.Table:
        """The live changes of versions in ``(cursor, delivered]``, in version order.

        :func:`~source_backfill.core.table_backfill.forwards_version`'s rule (``version > cursor``) over
        the whole column at once, bounded by what the live stream delivered.
        """
        import pyarrow.compute as pc

        if live is None:
            msg = f'job "{self.name}" needs the live changes but the source gave none'
            raise RuntimeError(msg)
        version = live.column(COMMIT_VERSION)
        after = -1 if cursor is None else cursor
        mask = pc.and_(pc.greater(version, after), pc.less_equal(version, delivered))
        return _ordered(live.filter(mask))

    def _keys(self, changes: pa.Table) -> list[tuple[Any, ...]]:
        return list(zip(*(changes.column(k).to_pylist() for k in self.primary_key), strict=True))

    def _unchanged(self, state: TableBackfillState, rows: Counter[str]) -> bool:
        """No row, the same state as committed, and the committed one young enough to stay in the log."""
        if rows or self.state is None or self.committed_epoch is None or self._last_commit_s is None:
            return False
        if time.time() - self._last_commit_s >= self._max_state_age_s:
            return False
        return state.to_json() == self.state.to_json()

    def _commit(self, epoch: int, state: TableBackfillState, parts: list[_Part], delivered: int) -> str:
        """Commit the epoch: ``"committed"``, ``"unchanged"`` (nothing to commit) or ``"replay"``."""
        import pyarrow as pa

        rows: Counter[str] = Counter()
        for part in parts:
            rows[part.stage] += part.rows.num_rows
        bulk, self._bulk = self._bulk, None
        if bulk is not None:
            rows[Phase.CONSUMING_SNAPSHOT.value] += bulk.rows
        rows = +rows
        if self._unchanged(state, rows):
            self.delivered = delivered
            return "unchanged"
        out: pa.Table | DataFrame | None = None
        kept = [p for p in parts if p.rows.num_rows]
        # every change is of a key the job's table does not hold yet (chunk rows and the changes after
        # them): in merge mode they are folded into the rows' last values and appended, not merged
        new_keys_only = self.mode == "merge" and all(p.new_keys for p in kept)
        if bulk is not None:  # a copy by files' epoch emits its files' rows alone
            assert not kept
            out = FileCopy.output(bulk.frame, self.columns, epoch, changelog=self.mode == "changelog")
        elif kept:
            columns = [*self.columns, CHANGE_TYPE]
            table = pa.concat_tables([p.rows.select(columns) for p in kept], promote_options="permissive")
            if new_keys_only:
                table = _folded(table, self.primary_key)
            if self.mode == "changelog":
                table = table.append_column("_epoch", pa.array([epoch] * table.num_rows, pa.int64()))
                table = table.append_column("_seq", pa.array(range(table.num_rows), pa.int64()))
            out = table
        total = self.rows + rows
        with self._gate.committing(), self.file_copy.spark_jobs() if bulk is not None else nullcontext():
            result = self.sink.commit_epoch(epoch, out, {STATE_KEY: state.to_json(), "rows": dict(total)},
                                            new_keys_only=new_keys_only)
        self.delivered = delivered
        if not result.committed:  # committed before (a replay): the table's state is the truth
            self._recover()
            return "replay"
        for stage, n in rows.items():
            metrics.TABLE_BACKFILL_ROWS.labels(self.name, stage).inc(n)
        metrics.COMMITS.labels(self.name).inc()
        if self.quota is not None:
            self.quota.count(self.name, self.spec.namespace, self.spec.sink_path, result.version)
        self.rows = total
        self.state = state
        self.committed_epoch = epoch
        now = time.monotonic()
        self.copied_rate.observe(now, total[Phase.CONSUMING_SNAPSHOT.value])
        if state.cursor is not None:
            self.replayed_rate.observe(now, state.cursor)
        self.arrived_rate.observe(now, delivered)
        self._last_commit_s = time.time()
        lag = self.lag_versions
        if lag is not None:
            metrics.TABLE_BACKFILL_LAG.labels(self.name).set(lag)
        return "committed"

    @property
    def columns(self) -> list[str]:
        """The source table's columns, as the job's table holds them."""
        return [n for n in self.sink.arrow_schema.names if n not in (CHANGE_TYPE, "_epoch", "_seq")]


class _Part(NamedTuple):
    """Rows one stage of an epoch emits; ``new_keys``: only keys the job's table does not hold yet."""

    stage: str
    rows: pa.Table
    new_keys: bool = False


def _folded(changes: pa.Table, keys: Sequence[str]) -> pa.Table:
    """Changes of keys new to the job's table as the rows they leave, each an ``insert``.

    Each key's last change counts (a delete leaves nothing); when every change is an insert, each key
    has one and the rows are kept as they are.
    """
    import pyarrow as pa
    import pyarrow.compute as pc

    from connectors.delta.merge import last_per_key

    changes = changes.filter(pc.not_equal(changes.column(CHANGE_TYPE), "update_preimage"))
    if pc.any(pc.not_equal(changes.column(CHANGE_TYPE), "insert")).as_py():
        changes = last_per_key(changes, keys)
        changes = changes.filter(pc.not_equal(changes.column(CHANGE_TYPE), "delete"))
    return changes.set_column(changes.schema.get_field_index(CHANGE_TYPE), CHANGE_TYPE,
                              pa.array(["insert"] * changes.num_rows, pa.string()))


def _inserts(rows: pa.Table) -> pa.Table:
    """Snapshot rows as changes: each an ``insert``."""
    import pyarrow as pa

    return rows.append_column(CHANGE_TYPE, pa.array(["insert"] * rows.num_rows, pa.string()))


def _ordered(changes: pa.Table) -> pa.Table:
    """Change feed rows in commit order (a stable sort: a version's own order is kept)."""
    import pyarrow.compute as pc

    if changes.num_rows == 0:
        return changes
    return changes.take(pc.sort_indices(changes, sort_keys=[(COMMIT_VERSION, "ascending")]))
