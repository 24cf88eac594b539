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
    SinkPathError,
    SourceNotFoundError,
    StateWriteError,
    one_line,
)
from source_backfill.runtime.progress import JobProgress

logger = logging.getLogger(__name__)

LOG_NAME = "mutations.jsonl"
#: Format version written on every line; a reader refuses versions it does not know.
LOG_VERSION = 1

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
    ) -> None:
        self.state_root = Path(state_root)
        self.sources = frozenset(sources)
        #: Checks a new job against its source (a mode or strategy its kind has not): ConfigError.
        self.check_spec = check_spec
        #: When set, every job's sink path must resolve (symlinks followed) inside it.
        self.data_root = Path(data_root).resolve() if data_root is not None else None
        self.path = self.state_root / LOG_NAME
        self._lock = threading.RLock()
        self._jobs: dict[str, JobRecord] = {}
        #: Every mutation not yet marked applied (queued or handed to the epoch loop), by id.
        self._unapplied: dict[int, Mutation] = {}
        #: Ids not yet handed to the epoch loop, in log order.
        self._queue: list[int] = []
        self._progress: dict[str, JobProgress] = {}
        self._next_id = 1
        self.state_root.mkdir(parents=True, exist_ok=True)
        self._replay()
        self._log: IO[bytes] = self.path.open("ab")
        _fsync_dir(self.state_root)
        for record in self._jobs.values():
            if record.source not in self.sources:
                logger.warning('job reads a source that is not configured job="%s" source="%s"',
                               record.name, record.source)
        logger.info('job registry opened path="%s" jobs=%d unapplied=%d',
                    self.path, len(self._jobs), len(self._unapplied))

    def close(self) -> None:
        """Close the log file (further mutations fail)."""
        with self._lock:
            self._log.close()

    # -- API side ---------------------------------------------------------------------------------------
    def create(self, spec: JobSpec) -> JobRecord:
        """Register a new job; JobExistsError if its name is live, SourceNotFoundError for a bad source."""
        with self._lock:
            current = self._jobs.get(spec.name)
            if current is not None and not current.dropped:
                msg = f'job "{spec.name}" already exists'
                raise JobExistsError(msg)
            if spec.source not in self.sources:
                msg = f'unknown source "{spec.source}" (configured: {sorted(self.sources)})'
                raise SourceNotFoundError(msg)
            self._check_sink_path(spec.sink_path)
            if self.check_spec is not None:
                self.check_spec(spec)
            self._record("create", spec.name, spec.source, spec=spec, rate_limit=spec.rate_limit)
            return self._jobs[spec.name]

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
            try:
                self._append({"type": "failed", "job": name, "error": error,
                              "at": datetime.now(UTC).isoformat()})
            except StateWriteError as exc:  # the job is failed all the same; a restart rebuilds it
                logger.error('job failure not persisted job="%s" error="%s"', name, exc)
            self._jobs[name] = replace(record, error=error)
            logger.error('job failed job="%s" error="%s"', name, error)

    def failed(self) -> builtins.list[JobRecord]:
        """Every live job marked failed."""
        with self._lock:
            return [r for r in self._jobs.values() if r.error is not None and not r.dropped]

    # -- internals ---------------------------------------------------------------------------------------
    def _check_sink_path(self, sink_path: str) -> None:
        """A sink path must stay inside ``data_root`` (no ``..``, no symlink out of it), when one is set."""
        if self.data_root is None:
            return
        # The messages name the path as given, never what it resolves to nor the data root: they are API
        # answers, and the daemon's working directory (a relative path) or a symlink's target are not the
        # caller's to learn. The log has the details.
        try:
            resolved = Path(sink_path).resolve()
        except (OSError, ValueError) as exc:  # a NUL byte is a ValueError, not a path outside the root
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            msg = f"sink_path {sink_path!r} is not a usable path ({reason})"
            raise SinkPathError(msg) from None
        if not resolved.is_relative_to(self.data_root):
            logger.warning('sink path refused sink_path=%r resolved="%s" data_root="%s"', sink_path,
                           resolved, self.data_root)
            msg = (f"sink_path {sink_path!r} is outside daemon.data_root (resolved, with any '..' or "
                   "symlink in it followed)")
            raise SinkPathError(msg)

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
        return mutation

    def _append(self, line: dict[str, Any]) -> None:
        """Write one line durably, or raise StateWriteError with the log as it was (nothing half-done)."""
        text = json.dumps({"v": LOG_VERSION, **line}, separators=(",", ":"), allow_nan=False)
        data = (text + "\n").encode()
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
