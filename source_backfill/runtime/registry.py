"""The job registry: every job the daemon knows, its control flags, and the durable mutation log.

Control commands (create, pause, resume, throttle, drop) arrive on the API thread and take effect at the
next epoch boundary of the job's source (DESIGN 6, step 1). The protocol, in order:

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

The log is compacted so it does not grow without bound: when it holds more than ``2 x`` the lines its
state needs plus :data:`COMPACT_SLACK` (checked after every append and at open), it is rewritten as the
subset of its lines that replays to the same state (:func:`compact_entries`: the lines of live jobs'
current incarnations that still decide a flag, every unapplied mutation with its id, the ``applied``
markers that matter, in their order), through a temp file that is fsynced and renamed over the log; a
crash before the rename leaves the old log whole (the temp file is removed at the next open). The
rewritten log uses only the line types above, plus an optional ``next_id`` on its last ``applied`` line
(so ids are never reused); a log written before compaction existed replays as before.

The state root is made ``0700`` and the log ``0600`` whatever the umask; nothing but job specs, ids,
times and errors is written (never the API token). A job's ``sink_path`` must not overlap the state root,
what is under it or another job's table (:mod:`source_backfill.runtime.paths`).
"""

from __future__ import annotations

import builtins
import json
import logging
import math
import os
import re
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any, Literal, get_args

from pydantic import ValidationError

from source_backfill.config import JobSpec
from source_backfill.errors import (
    ConfigError,
    JobExistsError,
    JobNotFoundError,
    MutationLogError,
    SourceNotFoundError,
    StateWriteError,
    one_line,
)
from source_backfill.runtime.paths import (
    check_sink_owner,
    check_sink_path,
    make_private_dir,
    open_private,
    overlaps,
    redact,
    resolve,
    state_paths,
)
from source_backfill.runtime.progress import JobProgress

logger = logging.getLogger(__name__)

LOG_NAME = "mutations.jsonl"
#: Format version written on every line; a reader refuses versions it does not know.
LOG_VERSION = 1
#: The compaction's temp file, next to the log (renamed over it when complete).
COMPACT_NAME = LOG_NAME + ".compact"
#: Lines a log may hold beyond twice what its state needs before it is compacted.
COMPACT_SLACK = 1000

MutationKind = Literal["create", "pause", "resume", "throttle", "drop", "retry"]


# -- data types -----------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Mutation:
    """One control command, recorded durably before it takes effect; ``id`` increases with log order."""

    id: int
    kind: MutationKind
    job: str
    source: str
    #: The job's spec (``create`` only).
    spec: JobSpec | None = None
    #: The new rate limit (``throttle``; ``create`` carries the spec's). ``None`` = unlimited.
    rate_limit: float | None = None


@dataclass(frozen=True, slots=True)
class JobRecord:
    """A registered job and its accepted control state."""

    spec: JobSpec
    paused: bool
    rate_limit: float | None
    #: True from the accepted drop until the drop is applied (then the record disappears).
    dropped: bool
    created_at: datetime
    #: Why the job failed (set by the epoch loop, persisted), else ``None``; a retry clears it.
    error: str | None = None

    @property
    def name(self) -> str:
        """The job's name."""
        return self.spec.name

    @property
    def source(self) -> str:
        """The name of the source the job reads."""
        return self.spec.source


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
    ) -> None:
        self.state_root = Path(state_root)
        self.sources = frozenset(sources)
        #: Checks a new job against its source (a mode or strategy its kind has not): ConfigError.
        self.check_spec = check_spec
        #: When set, every job's sink path must resolve (symlinks followed) inside it.
        self.data_root = resolve(data_root) if data_root is not None else None
        #: Paths besides the state root no sink may overlap (a delta source's table).
        self.protected_paths = [resolve(p) for p in protected_paths]
        self.path = self.state_root / LOG_NAME
        self._lock = threading.RLock()
        self._init_state()
        try:
            make_private_dir(self.state_root)
        except PermissionError as exc:  # not ours to chmod: it still works, but others may read it
            logger.warning('state root mode not narrowed to 0700 path="%s" error="%s"', self.state_root, exc)
        stale = self.state_root / COMPACT_NAME
        if stale.exists():  # a compaction cut short before its rename: the log itself is whole
            logger.warning('unfinished log compaction removed path="%s"', stale)
            stale.unlink()
        self._replay()
        self._log: IO[bytes] = os.fdopen(open_private(self.path, os.O_WRONLY | os.O_APPEND), "ab")
        _fsync_dir(self.state_root)
        self._maybe_compact()
        for record in self._jobs.values():
            if record.source not in self.sources:
                logger.warning('job reads a source that is not configured job="%s" source="%s"',
                               record.name, record.source)
            overlap = self._protected_overlap(record.spec.sink_path, record.name)
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
        self._next_id = 1
        #: Non-empty lines in the log file (what compaction is measured against).
        self._lines = 0
        #: After a compaction that failed or was refused: not tried again below this many lines.
        self._compact_floor = 0

    def close(self) -> None:
        """Close the log file (further mutations fail)."""
        with self._lock:
            self._log.close()

    # -- API side ---------------------------------------------------------------------------------------
    def create(self, spec: JobSpec) -> JobRecord:
        """Register a new job; JobExistsError if its name is live, SourceNotFoundError for a bad source."""
        self.check_create(spec)
        with self._lock:
            self._check_new(spec)  # again under the lock: another create may have taken the name or path
            self._record("create", spec.name, spec.source, spec=spec, rate_limit=spec.rate_limit)
            return self._jobs[spec.name]

    def check_create(self, spec: JobSpec) -> None:
        """Every check :meth:`create` makes, changing nothing (a dry run's validation).

        The spec's check (kind, transform) and the table-ownership check read outside the lock (they may
        take seconds); the path rules come first, so no table is looked for outside the data root.
        """
        if self.check_spec is not None and spec.source in self.sources:
            self.check_spec(spec)
        with self._lock:
            self._check_new(spec)
        check_sink_owner(spec.sink_path, spec.name)

    def _check_new(self, spec: JobSpec) -> None:
        current = self._jobs.get(spec.name)
        if current is not None and not current.dropped:
            msg = f'job "{spec.name}" already exists'
            raise JobExistsError(msg)
        if spec.source not in self.sources:
            msg = f'unknown source "{spec.source}" (configured: {sorted(self.sources)})'
            raise SourceNotFoundError(msg)
        self._check_sink_path(spec.sink_path, spec.name)

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

    def pause(self, name: str) -> JobRecord:
        """Stop reading history for the job (its live rows keep flowing); no-op if already paused."""
        with self._lock:
            record = self._live(name)
            if not record.paused:
                self._record("pause", name, record.source)
            return self._jobs[name]

    def resume(self, name: str) -> JobRecord:
        """Read history again after :meth:`pause`; no-op if not paused."""
        with self._lock:
            record = self._live(name)
            if record.paused:
                self._record("resume", name, record.source)
            return self._jobs[name]

    def throttle(self, name: str, rate_limit: float | None) -> JobRecord:
        """Set the job's history rate limit in rows/s (``None`` unlimited, ``0`` read none, lose nothing)."""
        if rate_limit is not None and (not math.isfinite(rate_limit) or rate_limit < 0):
            msg = f"rate_limit must be a finite number >= 0 or None, got {rate_limit!r}"
            raise ConfigError(msg)
        with self._lock:
            record = self._live(name)
            if record.rate_limit != rate_limit:
                self._record("throttle", name, record.source, rate_limit=rate_limit)
            return self._jobs[name]

    def drop(self, name: str) -> JobRecord:
        """Detach the job at the next epoch boundary (its table is left as is); the name becomes free."""
        with self._lock:
            record = self._live(name)
            self._record("drop", name, record.source)
            return self._jobs[name]

    def retry(self, name: str) -> JobRecord:
        """Run a failed job again: its error is cleared and the epoch loop rebuilds it from its table.

        A job that has not failed is left as it is (no mutation).
        """
        with self._lock:
            record = self._live(name)
            if record.error is not None:
                self._record("retry", name, record.source)
            return self._jobs[name]

    def get(self, name: str) -> JobRecord:
        """The job called ``name`` (also while its drop is pending); JobNotFoundError when unknown."""
        with self._lock:
            record = self._jobs.get(name)
            if record is None:
                msg = f'job "{name}" not found'
                raise JobNotFoundError(msg)
            return record

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
            taken = [self._unapplied[i] for i in self._queue if self._unapplied[i].source == source]
            if taken:
                ids = {m.id for m in taken}
                self._queue = [i for i in self._queue if i not in ids]
            return taken

    def mark_applied(self, mutation_ids: Iterable[int], epoch: int) -> None:
        """Record durably that ``mutation_ids`` took effect at ``epoch``; applied drops free their records."""
        ids = sorted(set(mutation_ids))
        if not ids:
            return
        with self._lock:
            unknown = [i for i in ids if i not in self._unapplied]
            if unknown:
                logger.warning("marking unknown or already applied mutations ids=%s", unknown)
            self._append({"type": "applied", "ids": ids, "epoch": epoch})
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
                self._append({"type": "failed", "job": name, "error": error,
                              "at": datetime.now(UTC).isoformat()})
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
    def _check_sink_path(self, sink_path: str, name: str) -> None:
        """A sink path must be inside ``data_root`` (if set) and disjoint from state and other tables.

        Allow-list reasoning (:mod:`source_backfill.runtime.paths`): the path is resolved as the sink
        opens it, then must be under the data root and overlap none of the protected paths: the state
        root, each state folder and file under it (resolved on its own), the configured protected paths,
        and every other registered job's table (one whose drop is pending too: it writes until then).
        """
        check_sink_path(sink_path, data_root=self.data_root, protected=self._protected(name))

    def _protected(self, name: str) -> builtins.list[tuple[str, Path]]:
        found = state_paths(self.state_root, self.sources, LOG_NAME)
        found += [("a protected path", p) for p in self.protected_paths]
        for record in self._jobs.values():
            if record.name != name:
                try:
                    found.append((f'job "{record.name}"\'s table', resolve(record.spec.sink_path)))
                except (OSError, ValueError):
                    continue
        return found

    def _protected_overlap(self, sink_path: str, name: str) -> str | None:
        """What a registered job's sink overlaps among the daemon's state (not other jobs), else None."""
        try:
            sink = resolve(sink_path)
        except (OSError, ValueError):
            return None
        for what, path in self._protected(name):
            if not what.startswith("job ") and overlaps(sink, path):
                return f"{what} ({path})"
        return None

    def _live(self, name: str) -> JobRecord:
        record = self._jobs.get(name)
        if record is None or record.dropped:
            msg = f'job "{name}" not found'
            raise JobNotFoundError(msg)
        return record

    def _record(
        self, kind: MutationKind, job: str, source: str, *, spec: JobSpec | None = None,
        rate_limit: float | None = None,
    ) -> Mutation:
        """Append + fsync the mutation, then let it take effect in the table and the queue (lock held)."""
        mutation = Mutation(id=self._next_id, kind=kind, job=job, source=source, spec=spec,
                            rate_limit=rate_limit)
        now = datetime.now(UTC)
        self._append(_mutation_line(mutation, now))
        self._next_id += 1
        self._apply_mutation(mutation, now)
        logger.info('mutation accepted id=%d kind="%s" job="%s" source="%s"', mutation.id, kind, job, source)
        self._maybe_compact()
        return mutation

    def _append(self, line: dict[str, Any]) -> None:
        """Write one line durably, or raise StateWriteError with the log as it was (nothing half-done)."""
        data = _line_bytes({"v": LOG_VERSION, **line})
        at = self._log.tell()
        try:
            self._log.write(data)
            self._log.flush()
            os.fsync(self._log.fileno())
        except OSError as exc:
            try:  # a line that is not durable must not come back at the next start
                self._log.seek(at)
                self._log.truncate(at)
                self._log.flush()
            except (OSError, ValueError):
                pass
            msg = (f"cannot write the mutation log {self.path} ({exc.strerror or exc}); "
                   "nothing was changed: free space or fix permissions under state_root, then retry")
            raise StateWriteError(msg) from exc
        self._lines += 1

    # -- compaction ---------------------------------------------------------------------------------------
    def _maybe_compact(self) -> None:
        """Compact when the log holds more than twice the lines its state needs plus COMPACT_SLACK."""
        needed = 4 * len(self._jobs) + len(self._unapplied) + 1
        if self._lines > max(2 * needed + COMPACT_SLACK, self._compact_floor):
            self.compact()

    def compact(self) -> bool:
        """Rewrite the log as the lines that replay to the current state; False if it was left as it is.

        The new log is checked first: replayed, it must give the state the old one gives (else the log
        is kept, an error logged, and compaction not tried again before COMPACT_SLACK more lines). It is
        written to a temp file, fsynced, renamed over the log, and the folder
        fsynced; a failure before the rename leaves the log as it was. Never raises for a failed write.
        """
        with self._lock:
            try:
                raw = self.path.read_bytes().split(b"\n")
                entries = [json.loads(line) for line in raw if line.strip()]
            except (OSError, ValueError) as exc:
                logger.error('log compaction skipped, the log cannot be read path="%s" error="%s"',
                             self.path, one_line(exc))
                return False
            kept = compact_entries(entries)
            try:
                same = (JobRegistry._replayed(kept, self.path)._fingerprint()
                        == JobRegistry._replayed(entries, self.path)._fingerprint())
            except MutationLogError as exc:
                same = False
                logger.error('log compaction check failed error="%s"', exc)
            if not same:
                logger.error('log compaction skipped, its result replays to another state path="%s"',
                             self.path)
                self._compact_floor = self._lines + COMPACT_SLACK
                return False
            data = b"".join(_line_bytes(e) for e in kept)
            tmp = self.state_root / COMPACT_NAME
            handle: IO[bytes] | None = None
            try:
                handle = os.fdopen(open_private(tmp, os.O_WRONLY | os.O_TRUNC | os.O_APPEND), "ab")
                handle.write(data)
                handle.flush()
                os.fsync(handle.fileno())
                os.replace(tmp, self.path)
            except OSError as exc:
                if handle is not None:
                    handle.close()
                tmp.unlink(missing_ok=True)
                self._compact_floor = self._lines + COMPACT_SLACK
                logger.warning('log compaction failed, the log is kept as it was path="%s" error="%s"',
                               self.path, exc.strerror or exc)
                return False
            _fsync_dir(self.state_root)
            old, self._log = self._log, handle
            old.close()
            logger.info('mutation log compacted path="%s" lines_before=%d lines_after=%d', self.path,
                        self._lines, len(kept))
            self._lines = len(kept)
            return True

    @classmethod
    def _replayed(cls, entries: builtins.list[dict[str, Any]], path: Path) -> JobRegistry:
        """A registry holding only the state ``entries`` replay to (no file opened)."""
        shadow = cls.__new__(cls)
        shadow.path = path
        shadow._init_state()
        for number, entry in enumerate(entries, start=1):
            shadow._replay_entry(entry, number)
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
        elif m.kind == "retry":
            self._jobs[m.job] = replace(record, error=None)
        self._unapplied[m.id] = m
        self._queue.append(m.id)

    def _apply_applied(self, ids: Iterable[int]) -> None:
        for i in ids:
            m = self._unapplied.pop(i, None)
            if m is None:
                continue
            if i in self._queue:
                self._queue.remove(i)
            record = self._jobs.get(m.job)
            if m.kind == "drop" and record is not None and record.dropped:
                del self._jobs[m.job]
                self._progress.pop(m.job, None)

    def _replay(self) -> None:
        """Rebuild the table and the queue from the log; drop a torn last line, refuse any other damage."""
        if not self.path.exists():
            return
        raw = self.path.read_bytes()
        lines = raw.split(b"\n")
        good_end = 0
        for number, line in enumerate(lines, start=1):
            is_last = number == len(lines)
            if not line.strip():
                good_end += len(line) + (0 if is_last else 1)
                continue
            try:
                entry = json.loads(line)
                if not isinstance(entry, dict):
                    msg = "not a JSON object"
                    raise ValueError(msg)
            except ValueError as exc:
                if is_last:  # no newline after it: the write was cut short by a crash
                    logger.warning('torn last line ignored path="%s" line=%d bytes=%d', self.path, number,
                                   len(line))
                    break
                msg = f"{self.path}:{number}: malformed mutation log line ({exc}){_job_hint(line)}"
                raise MutationLogError(msg + _REPAIR) from exc
            self._replay_entry(entry, number)
            self._lines += 1
            good_end += len(line) + (0 if is_last else 1)
        if good_end < len(raw) or (raw and not raw.endswith(b"\n")):
            with self.path.open("r+b") as f:  # cut the torn tail so new lines do not follow garbage
                f.truncate(good_end)
                if good_end and not raw[:good_end].endswith(b"\n"):
                    f.seek(good_end)
                    f.write(b"\n")
                f.flush()
                os.fsync(f.fileno())

    def _replay_entry(self, entry: dict[str, Any], number: int) -> None:
        where = f"{self.path}:{number}"
        try:
            if entry.get("v") != LOG_VERSION:
                msg = f"unsupported log version {entry.get('v')!r} (expected {LOG_VERSION})"
                raise ValueError(msg)
            kind = entry.get("type")
            if kind == "mutation":
                m, at = _parse_mutation(entry)
                if m.id < self._next_id:
                    msg = f"mutation id {m.id} does not increase (next is {self._next_id})"
                    raise ValueError(msg)
                self._next_id = m.id + 1
                self._apply_mutation(m, at)
            elif kind == "failed":
                record = self._jobs.get(str(entry["job"]))
                if record is not None and not record.dropped:
                    self._jobs[record.name] = replace(record, error=str(entry["error"]))
            elif kind == "applied":
                ids = entry["ids"]
                if not isinstance(ids, list) or not all(isinstance(i, int) for i in ids):
                    msg = "applied ids must be a list of integers"
                    raise ValueError(msg)
                self._apply_applied(ids)
                next_id = entry.get("next_id")  # written by compaction: ids of removed lines stay used
                if next_id is not None:
                    if not isinstance(next_id, int) or isinstance(next_id, bool):
                        msg = f"next_id must be an integer, got {next_id!r}"
                        raise ValueError(msg)
                    self._next_id = max(self._next_id, next_id)
            else:
                msg = f"unknown line type {kind!r}"
                raise ValueError(msg)
        except (KeyError, TypeError, ValueError, ValidationError) as exc:
            job = f' of job "{entry["job"]}"' if isinstance(entry.get("job"), str) else ""
            msg = f"{where}: malformed mutation log line{job} ({one_line(exc)})"
            raise MutationLogError(msg + _REPAIR) from exc


_REPAIR = ("; the daemon did not start. Remove or fix that line (the jobs' tables are not affected: a job "
           "re-created on the same sink path resumes from its table), or move the file aside to start "
           "with no registered jobs")


def _as_declared(spec: JobSpec) -> JobSpec:
    """``spec`` with an unset Kafka mode spelled out as ``append``.

    A log line from before modes were optional says ``mode = "append"``; the same declaration today
    leaves it unset.
    """
    if spec.mode is None and spec.strategy is None:
        return spec.model_copy(update={"mode": "append"})
    return spec


def _job_hint(line: bytes) -> str:
    """`` of job "x"`` when a damaged line still shows which job it was about, else empty."""
    found = re.search(rb'"job"\s*:\s*"([^"\\]{1,128})"', line)
    return f' of job "{found.group(1).decode("utf-8", "replace")}"' if found else ""


def _line_bytes(entry: dict[str, Any]) -> bytes:
    return (json.dumps(entry, separators=(",", ":"), allow_nan=False) + "\n").encode()


def compact_entries(entries: builtins.list[dict[str, Any]]) -> builtins.list[dict[str, Any]]:
    """The subset of a log's lines (parsed, in order) that replays to the same registry state.

    Jobs do not touch each other's state, so each job name is reduced on its own, to a suffix of its
    lines that starts where its state does not depend on what came before: at a ``create`` (which
    replaces the record) or where it had no record, and before which no mutation is left unapplied or
    marked applied after that point (a marker of a drop deletes the record current at the marker). Inside
    that suffix, creates, drops and unapplied mutations are kept; of the other lines only the last one
    setting each flag (paused, rate limit, error) of the job's live record. ``applied`` markers stay in
    place, holding only ids still in the log; a last marker carries ``next_id``. Lines are kept verbatim.
    """
    mutation_at: dict[int, int] = {}  # id -> line index
    marked_at: dict[int, int] = {}  # id -> index of the first marker naming it
    by_job: dict[str, builtins.list[int]] = {}  # job -> indices of its mutation and failed lines
    next_id = 1
    for i, e in enumerate(entries):
        kind = e.get("type")
        if kind == "mutation":
            mutation_at[e["id"]] = i
            next_id = max(next_id, e["id"] + 1)
            by_job.setdefault(str(e["job"]), []).append(i)
        elif kind == "failed":
            by_job.setdefault(str(e["job"]), []).append(i)
        elif kind == "applied":
            for mid in e["ids"]:
                if mid in mutation_at and mid not in marked_at:
                    marked_at[mid] = i
            if isinstance(e.get("next_id"), int):
                next_id = max(next_id, e["next_id"])
    keep: set[int] = set()
    for lines in by_job.values():
        keep |= _compact_job(entries, lines, marked_at)
    kept_ids = {entries[i]["id"] for i in keep if entries[i].get("type") == "mutation"}
    out: builtins.list[dict[str, Any]] = []
    for i, e in enumerate(entries):
        if i in keep:
            out.append(e)
        elif e.get("type") == "applied":
            ids = [mid for mid in e["ids"] if mid in kept_ids and marked_at.get(mid) == i]
            if ids:
                out.append({**e, "ids": ids})
    out.append({"v": LOG_VERSION, "type": "applied", "ids": [], "epoch": None, "next_id": next_id,
                "compacted_at": datetime.now(UTC).isoformat()})
    return out


def _compact_job(
    entries: builtins.list[dict[str, Any]], lines: builtins.list[int], marked_at: dict[int, int],
) -> set[int]:
    """The indices to keep of one job's lines (see :func:`compact_entries`)."""
    n = len(entries)
    # where the job's state does not depend on earlier lines: before a create, or where it has no record
    starts: builtins.list[int] = []
    record = False  # the job has a record (dropped or not) just before the line being looked at
    dropped = False
    pending_drops: set[int] = set()
    marker_of: dict[int, builtins.list[int]] = {}  # marker index -> this job's drop ids it names
    for i in lines:
        e = entries[i]
        if e.get("type") == "mutation" and e["kind"] == "drop":
            at = marked_at.get(e["id"])
            if at is not None:
                marker_of.setdefault(at, []).append(e["id"])
    events = sorted([(i, "line") for i in lines] + [(m, "marker") for m in marker_of])
    for i, what in events:
        if what == "marker":
            if record and dropped and any(d in pending_drops for d in marker_of[i]):
                record = dropped = False
            pending_drops.difference_update(marker_of[i])
            continue
        e = entries[i]
        if e.get("type") == "mutation" and e["kind"] == "create":
            starts.append(i)
            record, dropped = True, False
        elif not record:
            starts.append(i)
        elif e.get("type") == "mutation" and e["kind"] == "drop" and not dropped:
            dropped = True
        if e.get("type") == "mutation" and e["kind"] == "drop":
            pending_drops.add(e["id"])
    alive = record
    if not alive:
        starts.append(n)
    # the latest start that no unapplied mutation, and no drop marked after it, reaches across
    spans = sorted(
        ((i, marked_at.get(entries[i]["id"], n + 1)) for i in lines
         if entries[i].get("type") == "mutation"
         and (entries[i]["kind"] == "drop" or entries[i]["id"] not in marked_at)),
        key=lambda span: -span[1],
    )
    first_line = n + 1
    k = 0
    start = lines[0]
    for s in sorted(set(starts), reverse=True):
        while k < len(spans) and spans[k][1] > s:
            first_line = min(first_line, spans[k][0])
            k += 1
        if first_line >= s:
            start = s
            break
    keep: set[int] = set()
    last: dict[str, int] = {}  # flag -> the line that last set it on the live record
    record = dropped = False
    for i in lines:
        if i < start:
            continue
        e = entries[i]
        if e.get("type") == "failed":
            if record and not dropped:
                last["error"] = i
            continue
        kind, mid = e["kind"], e["id"]
        if mid not in marked_at:
            keep.add(i)
        if kind == "create":
            keep.add(i)
            record, dropped, last = True, False, {}
        elif kind == "drop":
            keep.add(i)
            if record:
                dropped = True
        elif record and not dropped:
            flag = {"pause": "paused", "resume": "paused", "throttle": "rate", "retry": "error"}[kind]
            last[flag] = i
    if alive:
        keep.update(last.values())
    return keep


def _mutation_line(m: Mutation, at: datetime) -> dict[str, Any]:
    return {
        "type": "mutation",
        "id": m.id,
        "kind": m.kind,
        "job": m.job,
        "source": m.source,
        "spec": m.spec.model_dump(mode="json") if m.spec is not None else None,
        "rate_limit": m.rate_limit,
        "at": at.isoformat(),
    }


def _parse_mutation(entry: dict[str, Any]) -> tuple[Mutation, datetime]:
    kind = entry["kind"]
    if kind not in get_args(MutationKind):
        msg = f"unknown mutation kind {kind!r}"
        raise ValueError(msg)
    spec = JobSpec.model_validate(entry["spec"]) if entry.get("spec") is not None else None
    if kind == "create" and spec is None:
        msg = "create without a spec"
        raise ValueError(msg)
    rate = entry.get("rate_limit")
    if rate is not None and (not isinstance(rate, int | float) or isinstance(rate, bool)):
        msg = f"rate_limit must be a number, got {rate!r}"
        raise ValueError(msg)
    mid = entry["id"]
    if not isinstance(mid, int) or isinstance(mid, bool):
        msg = f"id must be an integer, got {mid!r}"
        raise ValueError(msg)
    m = Mutation(id=mid, kind=kind, job=str(entry["job"]), source=str(entry["source"]), spec=spec,
                 rate_limit=None if rate is None else float(rate))
    return m, datetime.fromisoformat(entry["at"])


def _fsync_dir(path: Path) -> None:
    """Make a newly created file's directory entry durable (POSIX; a no-op where unsupported)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
