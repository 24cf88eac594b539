"""The job registry: every job the daemon knows, its control flags, and the durable mutation log.

Control commands (create, pause, resume, throttle, drop) arrive on the API thread and take effect at the
next epoch boundary of the job's source (docs/architecture.md, step 2). The protocol, in order:

1. the API thread calls a mutating method; the registry validates it, appends one ``mutation`` line to
   ``state_root/mutations.jsonl`` and fsyncs it — only then does the job table change, the mutation get
   queued, and the call return (so an accepted command is never lost);
2. the epoch loop of the source calls :meth:`JobRegistry.drain` at the boundary and applies what it gets;
3. once the epoch is done it calls :meth:`JobRegistry.mark_applied`, which appends an ``applied`` line.

On construction the log is replayed: the job table is rebuilt and every mutation without an ``applied``
record is queued again, so a crash anywhere between 1 and 3 replays the command at the next boundary
(applying one twice is harmless: each is a set-to-value, create and drop are idempotent in the loop).

The job table holds the *accepted* control state (what the operator asked for); the epoch loop catches up
at its next boundary. Progress (:class:`~source_backfill.runtime.progress.JobProgress`) is derived, in
memory only: after a restart it comes back from the jobs' own tables as the epoch loop recovers them.
A job's failure is a ``failed`` line in the log: a failed job stays failed across restarts (it is not
even constructed) until it is retried (a ``retry`` mutation clears the error and the epoch loop builds
the job anew from its table) or dropped.

The log's file, line format and replay live in :mod:`~source_backfill.runtime.mutation_log`; once it has
grown it is compacted, rewritten as the lines that replay to the same state
(:mod:`~source_backfill.runtime.log_compaction`). What each line means for the table is the registry's.

The state root is made ``0700`` and the log ``0600`` whatever the umask; nothing but job specs, ids,
times and errors is written (never the API token). A job's ``sink_path`` must not overlap the state root,
what is under it or another job's table (:mod:`source_backfill.runtime.paths`).
"""

from __future__ import annotations

import builtins
import logging
import math
import threading
from collections.abc import Callable, Iterable
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from source_backfill.config import DEFAULT_NAMESPACE, JobSpec, NamespaceConfig, RepairSpec, RetrySpec
from source_backfill.core.access import ALL_NAMESPACES
from source_backfill.errors import (
    ConfigError,
    JobNotFailedError,
    JobNotFoundError,
    SourceNotFoundError,
    StateWriteError,
)
from source_backfill.runtime.admission import Admission, check_rate_ceiling
from source_backfill.runtime.audit import AuditTable, RefusalTable
from source_backfill.runtime.job_record import JobRecord
from source_backfill.runtime.log_compaction import LogCompactor
from source_backfill.runtime.mutation_log import (
    LOG_NAME,
    Accepted,
    Actor,
    Applied,
    By,
    LogEntry,
    Mutation,
    MutationKind,
    MutationLog,
    replay_entries,
)
from source_backfill.runtime.new_table import choose_new_table, new_table_spec
from source_backfill.runtime.paths import (
    check_sink_owner,
    make_private_dir,
    redact,
    resolve,
)
from source_backfill.runtime.progress import JobProgress
from source_backfill.runtime.quotas import TableBytes

__all__ = ["LOG_NAME", "JobRecord", "JobRegistry", "Mutation"]  # what the API, the loops and tests import

logger = logging.getLogger(__name__)

#: Finished repairs kept per job for the API.
REPAIRS_KEPT = 20


# -- the registry ---------------------------------------------------------------------------------------
class JobRegistry:
    """The job table, the durable mutation log and the queue of unapplied mutations; thread-safe."""

    def __init__(
        self,
        state_root: Path,
        sources: Iterable[str],
        data_root: Path | None = None,
        check_spec: Callable[[JobSpec], None] | None = None,
        protected_paths: Iterable[Path] = (),
        check_repair: Callable[[JobSpec, RepairSpec], None] | None = None,
        check_retransform: Callable[[JobSpec], None] | None = None,
        namespaces: Iterable[NamespaceConfig] = (),
        audit: bool = False,
    ) -> None:
        self.state_root = Path(state_root)
        self.sources = frozenset(sources)
        #: What each declared namespace's jobs may use (sources, folder, quota); others bind nothing.
        self.namespaces = {n.name: n for n in namespaces}
        #: Checks a new job against its source (a mode or strategy its kind has not): ConfigError.
        self.check_spec = check_spec
        #: Checks a repair against the job (its source's kind, its table's columns): ConfigError.
        self.check_repair = check_repair
        #: Checks a job's new spec of a transform change (the create's checks, and the table's columns).
        self.check_retransform = check_retransform or check_spec
        #: When set, every job's sink path must resolve (symlinks followed) inside it.
        self.data_root = resolve(data_root) if data_root is not None else None
        #: Paths besides the state root no sink may overlap (a delta source's table).
        self.protected_paths = [resolve(p) for p in protected_paths]
        self._log = MutationLog(self.state_root)
        self.path = self._log.path
        self._lock = threading.RLock()
        self._init_state()
        try:
            make_private_dir(self.state_root)
        except PermissionError as exc:  # not ours to chmod: it still works, but others may read it
            logger.warning('state root mode not narrowed to 0700 path="%s" error="%s"', self.state_root, exc)
        #: Every accepted mutation copied to ``state_root/audit`` by id (the daemon's registry has one).
        self._audit = AuditTable(self.state_root) if audit else None
        #: Refused API requests, written in batches (``state_root/audit_refused``; with the audit table).
        self.refusals = RefusalTable(self.state_root) if audit else None
        #: The bytes of the day of the namespaces that bound them (``max_bytes_per_day``); None: none does.
        bounded = any(n.max_bytes_per_day is not None for n in self.namespaces.values())
        self.table_bytes = TableBytes(self.state_root, self.namespaces) if bounded else None
        #: The checks a create, a throttle and a retry into a new table pass (called under the lock).
        self._admission = Admission(self.state_root, self.sources, self.namespaces, self.data_root,
                                    self.protected_paths, self.table_bytes)
        accepted: builtins.list[tuple[Mutation, datetime, str]] = []

        def replay(entry: LogEntry) -> None:
            self._apply_entry(entry)
            if isinstance(entry, Accepted):
                accepted.append((entry.mutation, entry.at, self._namespace_of(entry.mutation)))

        self._next_id = self._log.open(replay)
        if self._audit is not None:  # before any compaction: a line whose row a crash cut is still here
            self._audit.catch_up(accepted)
        self._compactor = LogCompactor(self._log, self._state_of)
        self._maybe_compact()
        for record in self._jobs.values():
            if record.source not in self.sources:
                logger.warning('job reads a source that is not configured job="%s" source="%s"',
                               record.name, record.source)
            overlap = self._admission.protected_overlap(record.spec.sink_path, record.name, self._jobs)
            if overlap is not None:  # registered before sinks were checked so: kept, but said loudly
                logger.warning('job table overlaps the daemon state job="%s" sink="%s" overlaps="%s"; drop '
                               'it and re-create it on a sink path outside the state root', record.name,
                               record.spec.sink_path, overlap)
        logger.info('job registry opened path="%s" jobs=%d unapplied=%d',
                    self.path, len(self._jobs), len(self._unapplied))

    def _init_state(self) -> None:
        self._jobs: dict[str, JobRecord] = {}
        #: Every mutation not yet marked applied (queued or handed to the epoch loop), by id.
        self._unapplied: dict[int, Mutation] = {}
        #: Ids not yet handed to the epoch loop, in log order.
        self._queue: list[int] = []
        self._progress: dict[str, JobProgress] = {}
        #: The last finished repairs per job (memory only: the repairs' commits are in the job's table).
        self._repairs_done: dict[str, builtins.list[dict[str, Any]]] = {}
        self._next_id = 1
        #: Per source, called (under the lock: it must not block) when a mutation of its jobs is queued.
        self._wakers: dict[str, Callable[[], None]] = {}
        #: When each unapplied ``reset`` was accepted (its folder's name is made from it).
        self._reset_at: dict[int, datetime] = {}

    def on_mutation(self, source: str, wake: Callable[[], None]) -> None:
        """Have ``wake()`` called whenever a mutation of ``source``'s jobs is queued.

        Its epoch loop may then run at once instead of at its next trigger.
        """
        with self._lock:
            self._wakers[source] = wake

    def close(self) -> None:
        """Close the log file (further mutations fail)."""
        with self._lock:
            self._log.close()
        if self.refusals is not None:
            self.refusals.close()
        if self.table_bytes is not None:
            self.table_bytes.save(force=True)

    # -- API side ---------------------------------------------------------------------------------------
    def create(self, spec: JobSpec, *, by: By | None = None) -> JobRecord:
        """Register a new job; JobExistsError if its name is live, SourceNotFoundError for a bad source."""
        self.check_create(spec)
        with self._lock:
            # again under the lock: another create may have taken the name or path
            self._admission.check_new(spec, self._jobs)
            self._record("create", spec.name, spec.source, spec=spec, rate_limit=spec.rate_limit, by=by)
            return self._jobs[spec.name]

    def check_create(self, spec: JobSpec) -> None:
        """Every check :meth:`create` makes, changing nothing (a dry run's validation).

        The spec's check (kind, transform) and the table-ownership check read outside the lock (they may
        take seconds); the path rules come first, so no table is looked for outside the data root.
        """
        if self.check_spec is not None and spec.source in self.sources:
            self.check_spec(spec)
        with self._lock:
            self._admission.check_new(spec, self._jobs)
        check_sink_owner(spec.sink_path, spec.name)

    def ensure(self, spec: JobSpec) -> JobRecord:
        """Create a job declared in the config file, unless it is registered already with the same spec.

        A live job of that name with a different spec is a ConfigError: the registered job keeps its sink
        and progress, so a changed declaration must be dropped (or renamed) explicitly.
        """
        with self._lock:
            current = self._jobs.get(spec.name)
            if current is None or current.dropped:
                return self.create(spec)
            old, new = _as_declared(current.spec), _as_declared(spec)
            if old != new:
                changed = sorted(
                    k for k in type(spec).model_fields if getattr(new, k) != getattr(old, k)
                )
                msg = (f'job "{spec.name}" is registered with a different spec'
                       f' (changed: {", ".join(changed)}); drop it first or rename the declaration')
                raise ConfigError(msg)
            return current

    def pause(self, name: str, *, by: By | None = None) -> JobRecord:
        """Stop reading history for the job (its live rows keep flowing); no-op if already paused."""
        with self._lock:
            record = self._live(name)
            if not record.paused:
                self._record("pause", name, record.source, by=by)
            return self._jobs[name]

    def resume(self, name: str, *, by: By | None = None) -> JobRecord:
        """Read history again after :meth:`pause`; no-op if not paused."""
        with self._lock:
            record = self._live(name)
            if record.paused:
                self._record("resume", name, record.source, by=by)
            return self._jobs[name]

    def throttle(self, name: str, rate_limit: float | None, *, by: By | None = None) -> JobRecord:
        """Set the job's history rate limit in rows/s (``None`` unlimited, ``0`` read none, lose nothing)."""
        if rate_limit is not None and (not math.isfinite(rate_limit) or rate_limit < 0):
            msg = f"rate_limit must be a finite number >= 0 or None, got {rate_limit!r}"
            raise ConfigError(msg)
        with self._lock:
            record = self._live(name)
            namespace = self.namespaces.get(record.spec.namespace)
            if namespace is not None:
                check_rate_ceiling(namespace, rate_limit)
            if record.rate_limit != rate_limit:
                self._record("throttle", name, record.source, rate_limit=rate_limit, by=by)
            return self._jobs[name]

    def drop(self, name: str, *, by: By | None = None) -> JobRecord:
        """Detach the job at the next epoch boundary (its table is left as is); the name becomes free."""
        with self._lock:
            record = self._live(name)
            self._record("drop", name, record.source, by=by)
            if self.table_bytes is not None:  # a job of that name later writes a new table
                self.table_bytes.forget([name])
            return self._jobs[name]

    def retry(self, name: str, *, by: By | None = None, new_table: RetrySpec | None = None) -> JobRecord:
        """Run a failed job again: its error is cleared and the epoch loop rebuilds it from its table.

        A job that has not failed is left as it is (no mutation). ``new_table``: from the earliest offsets
        into a new table instead (:meth:`_retry_into_new_table`).
        """
        if new_table is not None:
            return self._retry_into_new_table(name, new_table, by)
        with self._lock:
            record = self._live(name)
            if record.error is not None:
                self._record("retry", name, record.source, by=by)
            return self._jobs[name]

    def _retry_into_new_table(self, name: str, ask: RetrySpec, by: By | None) -> JobRecord:
        """Run a failed job again from the earliest offsets into a new table; its old table is left as is.

        The job's spec changes (its ``sink_path`` and ``start``) in the ``retry`` line itself. The new table
        is checked like a create's (:meth:`.Admission.check_new_table`); JobNotFailedError for a job that
        has not failed (its lane would go on writing the table it leaves).
        """
        with self._lock:
            record = self._failed(name)
            spec = choose_new_table(
                record.spec, ask.sink,
                lambda new, free: self._admission.check_new_table(new, record, free, self._jobs))
        if self.check_spec is not None and spec.source in self.sources:
            self.check_spec(spec)  # a create's checks (its transform, its kind), outside the lock: slow
        for table in spec.tables:
            check_sink_owner(table, name)  # not a folder inside another Delta table
        with self._lock:  # again: the job and the tables may have changed meanwhile
            record = self._failed(name)
            spec = new_table_spec(record.spec, spec.sink_path)
            self._admission.check_new_table(spec, record, ask.sink is None, self._jobs)
            self._record("retry", name, record.source, spec=spec, by=by)
            return self._jobs[name]

    def _failed(self, name: str) -> JobRecord:
        """The live job ``name`` if it has failed, else JobNotFailedError (the lock is held)."""
        record = self._live(name)
        if record.error is None:
            msg = (f'job "{name}" has not failed: a retry into a new table is for a failed job (pause it, or '
                   "drop it and create a job on a new table)")
            raise JobNotFailedError(msg)
        return record

    def reset_source(self, source: str, *, by: By | None = None) -> tuple[Mutation, datetime]:
        """Record a source's reset durably (a ``reset`` line, its audit row); the mutation and its time.

        The caller (``runtime/source_reset.py``) then moves the source's folder aside and starts it
        again; the line stays unapplied until the source's first epoch after it, so that a daemon that
        crashed in between finishes the move at its next start (:meth:`pending_resets`).
        """
        with self._lock:
            if source not in self.sources:
                msg = f'unknown source "{source}"'
                raise SourceNotFoundError(msg)
            m = self._record("reset", "", source, by=by)
            return m, self._reset_at[m.id]

    def pending_resets(self, source: str) -> builtins.list[tuple[Mutation, datetime]]:
        """The resets of ``source`` accepted and not yet applied, oldest first, each with its time."""
        with self._lock:
            return [(m, self._reset_at[i]) for i, m in sorted(self._unapplied.items())
                    if m.kind == "reset" and m.source == source and i in self._reset_at]

    def retransform(self, name: str, transform: str | None, *, by: By | None = None) -> JobRecord:
        """Change the job's transform from its next epoch on (``None``: identity), checked like a create's.

        The new transform must pass the transform check and give the job's table the columns it has
        (:attr:`check_retransform`): ConfigError (TransformError) saying why.
        """
        record = self.get(name)
        try:  # the field's own rules (a SELECT reading {source}, its length)
            spec = JobSpec.model_validate({**record.spec.model_dump(), "transform": transform})
        except ValidationError as exc:
            msg = f"transform: {exc.errors()[0]['msg']}"
            raise ConfigError(msg) from None
        if self.check_retransform is not None and spec.source in self.sources:
            self.check_retransform(spec)
        with self._lock:
            record = self._live(name)
            if record.spec.transform != transform:
                self._record("retransform", name, record.source, spec=spec, by=by)
            return self._jobs[name]

    def repair(self, name: str, repair: RepairSpec, *, by: By | None = None) -> tuple[JobRecord, int]:
        """Accept a repair of the job's rows in ``repair``'s window; its id (the mutation's) with the job.

        Checked first (:attr:`check_repair`: a Kafka job whose table keeps the partition and offset
        columns); it runs at an epoch boundary once the job can (:mod:`source_backfill.executors.repair`).
        """
        record = self.get(name)
        if self.check_repair is not None and not record.dropped:
            self.check_repair(record.spec, repair)
        with self._lock:
            record = self._live(name)
            m = self._record("repair", name, record.source, repair=repair, by=by)
            return self._jobs[name], m.id

    def publish_repair(self, name: str, outcome: dict[str, Any]) -> None:
        """A repair of the job finished (``RepairOutcome.to_json``): kept, the last few, for the API."""
        with self._lock:
            if name in self._jobs:
                done = self._repairs_done.setdefault(name, [])
                done.append(outcome)
                del done[:-REPAIRS_KEPT]

    def repair_views(self, name: str) -> builtins.list[dict[str, Any]]:
        """The job's repairs: those accepted and not finished (``pending``), then the last finished."""
        with self._lock:
            done = self._repairs_done.get(name, [])
            finished = {r["id"] for r in done}
            pending = [{"id": m.id, "state": "pending", "window": m.repair.model_dump(mode="json")}
                       for _, m in sorted(self._unapplied.items())
                       if m.job == name and m.kind == "repair" and m.repair is not None
                       and m.id not in finished]
            return pending + list(reversed(done))

    def get(self, name: str) -> JobRecord:
        """The job called ``name`` (also while its drop is pending); JobNotFoundError when unknown."""
        with self._lock:
            record = self._jobs.get(name)
            if record is None:
                msg = f'job "{name}" not found'
                raise JobNotFoundError(msg)
            return record

    def width_shares(self) -> dict[str, float]:
        """Each declared namespace's share of a source's history width."""
        return {name: n.width_share for name, n in self.namespaces.items()}

    def list(self) -> list[JobRecord]:
        """Every live job in creation order; a job whose drop is accepted is left out (see :meth:`get`)."""
        with self._lock:
            return [r for r in self._jobs.values() if not r.dropped]

    def pending(self, name: str) -> int:
        """How many of the job's mutations are accepted but not yet applied by its epoch loop."""
        with self._lock:
            return sum(1 for m in self._unapplied.values() if m.job == name)

    # -- epoch-loop side ---------------------------------------------------------------------------------
    def drain(self, source: str) -> builtins.list[Mutation]:
        """Hand the queued mutations of ``source``'s jobs to its epoch loop, in log order.

        They stay unapplied (and are queued again after a restart) until :meth:`mark_applied`.
        """
        with self._lock:
            taken = self._queued_of(source)
            if taken:
                ids = {m.id for m in taken}
                self._queue = [i for i in self._queue if i not in ids]
            return taken

    def queued(self, source: str) -> builtins.list[Mutation]:
        """The mutations of ``source``'s jobs queued and not drained yet, in log order (nothing changes)."""
        with self._lock:
            return self._queued_of(source)

    def _queued_of(self, source: str) -> builtins.list[Mutation]:
        """The queue's mutations of ``source``'s jobs, in log order (the caller holds the lock)."""
        return [self._unapplied[i] for i in self._queue if self._unapplied[i].source == source]

    def mark_applied(self, mutation_ids: Iterable[int], epoch: int) -> None:
        """Record durably that ``mutation_ids`` took effect at ``epoch``; applied drops free their records."""
        ids = sorted(set(mutation_ids))
        if not ids:
            return
        with self._lock:
            unknown = [i for i in ids if i not in self._unapplied]
            if unknown:
                logger.warning("marking unknown or already applied mutations ids=%s", unknown)
            self._log.append_applied(ids, epoch)
            self._apply_applied(ids)
            logger.info("mutations applied ids=%s epoch=%d", ids, epoch)
            self._maybe_compact()

    def publish_progress(self, name: str, progress: JobProgress) -> None:
        """Store the job's latest progress (ignored for jobs no longer registered)."""
        with self._lock:
            if name not in self._jobs:
                logger.debug('progress for an unregistered job ignored job="%s"', name)
                return
            self._progress[name] = progress

    def progress(self, name: str) -> JobProgress | None:
        """The job's latest published progress, ``None`` before the first."""
        with self._lock:
            return self._progress.get(name)

    def set_failed(self, name: str, error: str) -> None:
        """Mark the job failed with ``error``, durably: it stays failed until :meth:`retry` or a drop."""
        with self._lock:
            record = self._jobs.get(name)
            if record is None or record.dropped:
                logger.warning('set_failed for an unregistered job ignored job="%s"', name)
                return
            logger.error('job failed job="%s" error="%s"', name, error)  # whole: the log may name paths
            error = redact(error, self.state_root)  # the API serves it: no path of the daemon's own
            try:
                self._log.append_failed(name, error, datetime.now(UTC))
            except StateWriteError as exc:  # the job is failed all the same; a restart rebuilds it
                logger.error('job failure not persisted job="%s" error="%s"', name, exc)
                self._jobs[name] = replace(record, error=error)
                return
            self._jobs[name] = replace(record, error=error)
            self._maybe_compact()

    def failed(self) -> builtins.list[JobRecord]:
        """Every live job marked failed."""
        with self._lock:
            return [r for r in self._jobs.values() if r.error is not None and not r.dropped]

    # -- internals ---------------------------------------------------------------------------------------
    def _live(self, name: str) -> JobRecord:
        record = self._jobs.get(name)
        if record is None or record.dropped:
            msg = f'job "{name}" not found'
            raise JobNotFoundError(msg)
        return record

    def _record(
        self, kind: MutationKind, job: str, source: str, *, spec: JobSpec | None = None,
        rate_limit: float | None = None, repair: RepairSpec | None = None, by: By | None = None,
    ) -> Mutation:
        """Append + fsync the mutation, then let it take effect in the table and the queue (lock held).

        ``by``: the principal that asked (the API's), recorded in the line and copied to the audit table.
        """
        actor = Actor(by) if isinstance(by, str) else by
        mutation = Mutation(id=self._next_id, kind=kind, job=job, source=source, spec=spec,
                            rate_limit=rate_limit, repair=repair,
                            by=actor.principal if actor is not None else None,
                            request_id=actor.request_id if actor is not None else None)
        now = datetime.now(UTC)
        self._log.append_mutation(mutation, now)
        self._next_id += 1
        self._apply_mutation(mutation, now)
        if self._audit is not None:
            self._audit.record(mutation, now, self._namespace_of(mutation))
        logger.info('mutation accepted id=%d kind="%s" job="%s" source="%s"', mutation.id, kind, job, source)
        wake = self._wakers.get(source)
        if wake is not None:
            wake()
        self._maybe_compact()
        return mutation

    # -- compaction ---------------------------------------------------------------------------------------
    def _maybe_compact(self) -> None:
        """Compact when the log holds more than twice the lines the state needs plus COMPACT_SLACK.

        Not while audit rows are pending: their lines are what a retry copies from after a crash.
        """
        if self._audit is not None and self._audit.pending:
            return
        self._compactor.maybe(4 * len(self._jobs) + len(self._unapplied) + 1)

    def _namespace_of(self, mutation: Mutation) -> str:
        if mutation.kind == "reset":  # a source's, shared by namespaces: the daemon's own
            return ALL_NAMESPACES
        if mutation.spec is not None:
            return mutation.spec.namespace
        record = self._jobs.get(mutation.job)
        return record.spec.namespace if record is not None else DEFAULT_NAMESPACE

    def audit_rows(self) -> builtins.list[dict[str, Any]]:
        """The audit table's rows, by id (none without an audit table)."""
        with self._lock:
            return self._audit.rows() if self._audit is not None else []

    def compact(self) -> bool:
        """Rewrite the log as the lines that replay to the current state; False if it was left as it is.

        See :meth:`~source_backfill.runtime.log_compaction.LogCompactor.compact`.
        """
        with self._lock:
            return self._compactor.compact()

    def _state_of(self, entries: builtins.list[dict[str, Any]]) -> tuple[Any, ...]:
        """What ``entries`` replay to (compaction checks its result with it); MutationLogError if damaged."""
        return JobRegistry._replayed(entries, self.path)._fingerprint()

    @classmethod
    def _replayed(cls, entries: builtins.list[dict[str, Any]], path: Path) -> JobRegistry:
        """A registry holding only the state ``entries`` replay to (no file opened)."""
        shadow = cls.__new__(cls)
        shadow._init_state()
        shadow._next_id = replay_entries(entries, path, shadow._apply_entry)
        return shadow

    def _fingerprint(self) -> tuple[Any, ...]:
        """The replayable state: jobs in order, unapplied mutations (replay queues them all), the next id."""
        return (list(self._jobs.items()), sorted(self._unapplied.items()), self._next_id)

    def _apply_mutation(self, m: Mutation, at: datetime) -> None:
        """The mutation's effect on the job table, and its place in the queue (lock held)."""
        record = self._jobs.get(m.job)
        if m.kind == "create":
            assert m.spec is not None  # guaranteed by _record and by replay's parser
            self._jobs.pop(m.job, None)  # a re-created name goes to the end, like a new job
            self._jobs[m.job] = JobRecord(spec=m.spec, paused=False, rate_limit=m.spec.rate_limit,
                                          dropped=False, created_at=at)
            self._progress.pop(m.job, None)
            self._repairs_done.pop(m.job, None)
        elif m.kind == "reset":  # a source's: no job's record changes
            self._reset_at[m.id] = at
        elif record is None or record.dropped:
            logger.warning('mutation for an unknown job ignored id=%d kind="%s" job="%s"',
                           m.id, m.kind, m.job)
        elif m.kind == "pause":
            self._jobs[m.job] = replace(record, paused=True)
        elif m.kind == "resume":
            self._jobs[m.job] = replace(record, paused=False)
        elif m.kind == "throttle":
            self._jobs[m.job] = replace(record, rate_limit=m.rate_limit)
        elif m.kind == "drop":
            self._jobs[m.job] = replace(record, dropped=True)
        elif m.kind == "retry" and m.spec is not None:  # into a new table: what was of the old one goes
            self._jobs[m.job] = replace(record, error=None, spec=m.spec)
            self._progress.pop(m.job, None)
            self._repairs_done.pop(m.job, None)
        elif m.kind == "retry":
            self._jobs[m.job] = replace(record, error=None)
        elif m.kind == "retransform" and m.spec is not None:
            self._jobs[m.job] = replace(record, spec=m.spec)
        self._unapplied[m.id] = m
        self._queue.append(m.id)

    def _apply_applied(self, ids: Iterable[int]) -> None:
        for i in ids:
            m = self._unapplied.pop(i, None)
            self._reset_at.pop(i, None)
            if m is None:
                continue
            if i in self._queue:
                self._queue.remove(i)
            record = self._jobs.get(m.job)
            if m.kind == "drop" and record is not None and record.dropped:
                del self._jobs[m.job]
                self._progress.pop(m.job, None)
                self._repairs_done.pop(m.job, None)

    def _apply_entry(self, entry: LogEntry) -> None:
        """One replayed log line's effect on the table and the queue (at open, and for compaction's check)."""
        if isinstance(entry, Accepted):
            self._apply_mutation(entry.mutation, entry.at)
        elif isinstance(entry, Applied):
            self._apply_applied(entry.ids)
        else:
            record = self._jobs.get(entry.job)
            if record is not None and not record.dropped:
                if entry.error is None:  # a failed line without its error, about a live job
                    key = "error"
                    raise KeyError(key)
                self._jobs[record.name] = replace(record, error=entry.error)


def _as_declared(spec: JobSpec) -> JobSpec:
    """``spec`` with an unset Kafka mode spelled out as ``append``.

    A log line from before modes were optional says ``mode = "append"``; the same declaration today
    leaves it unset.
    """
    if spec.mode is None and spec.strategy is None:
        return spec.model_copy(update={"mode": "append"})
    return spec
