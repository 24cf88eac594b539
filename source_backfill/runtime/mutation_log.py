"""The mutation log: ``state_root/mutations.jsonl``, the registry's durable record of control commands.

One JSON object a line, each with the format version ``v`` (:data:`LOG_VERSION`; a reader refuses one it
does not know) and a ``type``:

- ``mutation``: an accepted command (:class:`Mutation`: id, kind, job, source, spec, rate limit, a
  repair's window, ``by``: the principal that asked, absent in lines of releases before tenants) and when
  it was accepted; ids increase with log order. A ``retry`` line carries a ``spec`` when it runs the job
  into a new table (lines of releases before that have ``"spec": null``: a plain retry, as they meant); a
  ``reset`` line is a source's (``job`` empty);
- ``applied``: the ids the epoch loop applied, at which epoch; a compacted log's last one also carries
  ``next_id`` (ids of removed lines are never handed out again);
- ``failed``: a job's failure and its error.

:class:`MutationLog` owns the file: it replays it at open (a torn last line, a write cut short by a crash,
is dropped and cut from the file; any other damage is refused with the line's number and job), appends a
line durably (write + fsync, or nothing at all) and rewrites it whole for compaction (a temp file
fsynced and renamed over the log; a temp file left by a crash is removed at the next open). What the
lines mean for the job table is the registry's (:mod:`source_backfill.runtime.registry`), which lines a
compaction keeps :mod:`source_backfill.runtime.log_compaction`'s. The log is ``0600`` whatever the umask.
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import IO, Any, Literal, get_args

from pydantic import ValidationError

from source_backfill.config import JobSpec, RepairSpec
from source_backfill.errors import MutationLogError, StateWriteError, one_line
from source_backfill.runtime.paths import open_private

logger = logging.getLogger(__name__)

LOG_NAME = "mutations.jsonl"
#: Format version written on every line; a reader refuses versions it does not know.
LOG_VERSION = 1
#: The compaction's temp file, next to the log (renamed over it when complete).
COMPACT_NAME = LOG_NAME + ".compact"

#: ``retransform``: the job's transform changed (``spec`` is the job's whole new spec); ``repair``: a
#: window of the job's rows to replace (``repair``), applied once the job has committed it; ``retry``: a
#: failed job run again, from its table, or (with a ``spec``: its new table and start) from the start into
#: a new table; ``reset``: a source stopped for good started over (its folder moved aside,
#: ``runtime/source_reset.py``), a source's and no job's (``job`` is empty).
MutationKind = Literal["create", "pause", "resume", "throttle", "drop", "retry", "retransform", "repair",
                       "reset"]


# -- what a line holds ------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Mutation:
    """One control command, recorded durably before it takes effect; ``id`` increases with log order."""

    id: int
    kind: MutationKind
    job: str
    source: str
    #: The job's spec (``create``; ``retransform``: the spec with its new transform; ``retry`` into a new
    #: table: the spec with its new table and start; a plain ``retry`` has none).
    spec: JobSpec | None = None
    #: The new rate limit (``throttle``; ``create`` carries the spec's). ``None`` = unlimited.
    rate_limit: float | None = None
    #: The window to replace (``repair`` only).
    repair: RepairSpec | None = None
    #: The principal that asked (the API's); ``None``: the daemon itself (a job of the config file), or a
    #: line written before principals were recorded.
    by: str | None = None
    #: The API request that asked (its ``X-Request-Id``, given or made), to find it in the daemon's log.
    request_id: str | None = None


@dataclass(frozen=True, slots=True)
class Actor:
    """Who asked for a mutation: the principal's name and the request's id (the API's)."""

    principal: str
    request_id: str | None = None


#: ``by=`` of the registry's mutations: an :class:`Actor`, or a principal's name alone.
By = Actor | str


@dataclass(frozen=True, slots=True)
class Accepted:
    """A ``mutation`` line: the command and when it was accepted."""

    mutation: Mutation
    at: datetime


@dataclass(frozen=True, slots=True)
class Applied:
    """An ``applied`` line: mutation ids that took effect; a compacted log's last one has ``next_id``."""

    ids: list[int]
    next_id: int | None = None


@dataclass(frozen=True, slots=True)
class Failed:
    """A ``failed`` line: the job failed with ``error``.

    ``error`` is ``None`` when the line has none: that is damage only for a live job (the reader of the
    line raises ``KeyError("error")`` then), a line about a job no longer there is ignored whole.
    """

    job: str
    error: str | None


LogEntry = Accepted | Applied | Failed
#: Takes one replayed line's effect; a KeyError, TypeError or ValueError it raises is that line's damage.
Apply = Callable[[LogEntry], None]


# -- the file -----------------------------------------------------------------------------------------------
class MutationLog:
    """The log file of ``state_root``: :meth:`open` replays it, then lines are appended durably.

    Not thread-safe on its own: the registry calls it under its lock.
    """

    def __init__(self, state_root: Path) -> None:
        self.state_root = Path(state_root)
        self.path = self.state_root / LOG_NAME
        #: Non-empty lines in the file (what compaction is measured against).
        self.lines = 0
        self._file: IO[bytes] | None = None

    def open(self, apply: Apply) -> int:
        """Replay the file into ``apply`` and open it for appending; the next mutation id is returned.

        A compaction's temp file left by a crash before its rename is removed first (the log is whole).
        """
        stale = self.state_root / COMPACT_NAME
        if stale.exists():
            logger.warning('unfinished log compaction removed path="%s"', stale)
            stale.unlink()
        next_id = self._replay(apply)
        self._file = os.fdopen(open_private(self.path, os.O_WRONLY | os.O_APPEND), "ab")
        fsync_dir(self.state_root)
        return next_id

    def close(self) -> None:
        """Close the file (further appends fail)."""
        if self._file is not None:
            self._file.close()

    def append_mutation(self, m: Mutation, at: datetime) -> None:
        """Record an accepted command durably (see :meth:`append`)."""
        self.append(mutation_line(m, at))

    def append_applied(self, ids: list[int], epoch: int) -> None:
        """Record durably that ``ids`` took effect at ``epoch`` (see :meth:`append`)."""
        self.append({"type": "applied", "ids": ids, "epoch": epoch})

    def append_failed(self, job: str, error: str, at: datetime) -> None:
        """Record durably that ``job`` failed with ``error`` (see :meth:`append`)."""
        self.append({"type": "failed", "job": job, "error": error, "at": at.isoformat()})

    def append(self, line: dict[str, Any]) -> None:
        """Write one line durably, or raise StateWriteError with the log as it was (nothing half-done)."""
        f = self._opened()
        data = line_bytes({"v": LOG_VERSION, **line})
        at = f.tell()
        try:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        except OSError as exc:
            try:  # a line that is not durable must not come back at the next start
                f.seek(at)
                f.truncate(at)
                f.flush()
            except (OSError, ValueError):
                pass
            msg = (f"cannot write the mutation log {self.path} ({exc.strerror or exc}); "
                   "nothing was changed: free space or fix permissions under state_root, then retry")
            raise StateWriteError(msg) from exc
        self.lines += 1

    def entries(self) -> list[dict[str, Any]]:
        """Every line of the file, parsed (OSError or ValueError when it cannot be read whole)."""
        raw = self.path.read_bytes().split(b"\n")
        return [json.loads(line) for line in raw if line.strip()]

    def rewrite(self, entries: list[dict[str, Any]]) -> None:
        """Replace the file by ``entries``, appended to from then on; OSError leaves it as it was.

        Written to a temp file, fsynced, renamed over the log, and the folder fsynced.
        """
        data = b"".join(line_bytes(e) for e in entries)
        tmp = self.state_root / COMPACT_NAME
        handle: IO[bytes] | None = None
        try:
            handle = os.fdopen(open_private(tmp, os.O_WRONLY | os.O_TRUNC | os.O_APPEND), "ab")
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
            os.replace(tmp, self.path)
        except OSError:
            if handle is not None:
                handle.close()
            tmp.unlink(missing_ok=True)
            raise
        fsync_dir(self.state_root)
        old, self._file = self._opened(), handle
        old.close()
        self.lines = len(entries)

    def _opened(self) -> IO[bytes]:
        assert self._file is not None, "the mutation log is not open"  # open() comes first
        return self._file

    def _replay(self, apply: Apply) -> int:
        """Replay the file; drop a torn last line (cut from the file), refuse any other damage."""
        next_id = 1
        if not self.path.exists():
            return next_id
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
            next_id = replay_entry(entry, f"{self.path}:{number}", next_id, apply)
            self.lines += 1
            good_end += len(line) + (0 if is_last else 1)
        if good_end < len(raw) or (raw and not raw.endswith(b"\n")):
            with self.path.open("r+b") as f:  # cut the torn tail so new lines do not follow garbage
                f.truncate(good_end)
                if good_end and not raw[:good_end].endswith(b"\n"):
                    f.seek(good_end)
                    f.write(b"\n")
                f.flush()
                os.fsync(f.fileno())
        return next_id


# -- replay -----------------------------------------------------------------------------------------------
def replay_entries(entries: Iterable[dict[str, Any]], path: Path, apply: Apply) -> int:
    """Replay parsed lines (numbered from 1 in errors, as lines of ``path``); the next mutation id."""
    next_id = 1
    for number, entry in enumerate(entries, start=1):
        next_id = replay_entry(entry, f"{path}:{number}", next_id, apply)
    return next_id


def replay_entry(entry: dict[str, Any], where: str, next_id: int, apply: Apply) -> int:
    """Check one parsed line and hand it to ``apply``; the next mutation id after it.

    MutationLogError, naming ``where`` and the line's job, when the line or its effect is malformed.
    """
    try:
        decoded, next_id = _decode(entry, next_id)
        apply(decoded)
    except (KeyError, TypeError, ValueError, ValidationError) as exc:
        job = f' of job "{entry["job"]}"' if isinstance(entry.get("job"), str) else ""
        msg = f"{where}: malformed mutation log line{job} ({one_line(exc)})"
        raise MutationLogError(msg + _REPAIR) from exc
    return next_id


def _decode(entry: dict[str, Any], next_id: int) -> tuple[LogEntry, int]:
    if entry.get("v") != LOG_VERSION:
        msg = f"unsupported log version {entry.get('v')!r} (expected {LOG_VERSION})"
        raise ValueError(msg)
    kind = entry.get("type")
    if kind == "mutation":
        m, at = parse_mutation(entry)
        if m.id < next_id:
            msg = f"mutation id {m.id} does not increase (next is {next_id})"
            raise ValueError(msg)
        return Accepted(m, at), m.id + 1
    if kind == "failed":
        return Failed(str(entry["job"]), str(entry["error"]) if "error" in entry else None), next_id
    if kind == "applied":
        ids = entry["ids"]
        if not isinstance(ids, list) or not all(isinstance(i, int) for i in ids):
            msg = "applied ids must be a list of integers"
            raise ValueError(msg)
        marked = entry.get("next_id")  # written by compaction: ids of removed lines stay used
        if marked is not None:
            if not isinstance(marked, int) or isinstance(marked, bool):
                msg = f"next_id must be an integer, got {marked!r}"
                raise ValueError(msg)
            next_id = max(next_id, marked)
        return Applied(ids, marked), next_id
    msg = f"unknown line type {kind!r}"
    raise ValueError(msg)


_REPAIR = ("; the daemon did not start. Remove or fix that line (the jobs' tables are not affected: a job "
           "re-created on the same sink path resumes from its table), or move the file aside to start "
           "with no registered jobs")


def _job_hint(line: bytes) -> str:
    """`` of job "x"`` when a damaged line still shows which job it was about, else empty."""
    found = re.search(rb'"job"\s*:\s*"([^"\\]{1,128})"', line)
    return f' of job "{found.group(1).decode("utf-8", "replace")}"' if found else ""


# -- line encoding ------------------------------------------------------------------------------------------
def line_bytes(entry: dict[str, Any]) -> bytes:
    """One log line as written: compact JSON, no NaN, a newline."""
    return (json.dumps(entry, separators=(",", ":"), allow_nan=False) + "\n").encode()


def mutation_line(m: Mutation, at: datetime) -> dict[str, Any]:
    """The ``mutation`` line of ``m`` accepted at ``at`` (:meth:`MutationLog.append` adds ``v``)."""
    return {
        "type": "mutation",
        "id": m.id,
        "kind": m.kind,
        "job": m.job,
        "source": m.source,
        "spec": m.spec.model_dump(mode="json") if m.spec is not None else None,
        "rate_limit": m.rate_limit,
        **({"repair": m.repair.model_dump(mode="json")} if m.repair is not None else {}),
        **({"by": m.by} if m.by is not None else {}),
        **({"request_id": m.request_id} if m.request_id is not None else {}),
        "at": at.isoformat(),
    }


def parse_mutation(entry: dict[str, Any]) -> tuple[Mutation, datetime]:
    """The command of a ``mutation`` line and when it was accepted (KeyError, ValueError, ValidationError)."""
    kind = entry["kind"]
    if kind not in get_args(MutationKind):
        msg = f"unknown mutation kind {kind!r}"
        raise ValueError(msg)
    spec = JobSpec.model_validate(entry["spec"]) if entry.get("spec") is not None else None
    if kind in ("create", "retransform") and spec is None:
        msg = f"{kind} without a spec"
        raise ValueError(msg)
    repair = RepairSpec.model_validate(entry["repair"]) if entry.get("repair") is not None else None
    if kind == "repair" and repair is None:
        msg = "repair without its window"
        raise ValueError(msg)
    rate = entry.get("rate_limit")
    if rate is not None and (not isinstance(rate, int | float) or isinstance(rate, bool)):
        msg = f"rate_limit must be a number, got {rate!r}"
        raise ValueError(msg)
    mid = entry["id"]
    if not isinstance(mid, int) or isinstance(mid, bool):
        msg = f"id must be an integer, got {mid!r}"
        raise ValueError(msg)
    by, request_id = entry.get("by"), entry.get("request_id")
    if any(v is not None and not isinstance(v, str) for v in (by, request_id)):
        msg = f"by and request_id must be strings, got {by!r}, {request_id!r}"
        raise ValueError(msg)
    m = Mutation(id=mid, kind=kind, job=str(entry["job"]), source=str(entry["source"]), spec=spec,
                 rate_limit=None if rate is None else float(rate), repair=repair, by=by,
                 request_id=request_id)
    return m, datetime.fromisoformat(entry["at"])


def fsync_dir(path: Path) -> None:
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
