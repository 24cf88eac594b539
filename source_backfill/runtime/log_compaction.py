"""Compacting the mutation log: the subset of its lines that replays to the same registry state.

The registry's log (:mod:`source_backfill.runtime.mutation_log`) is compacted so it does not grow without
bound: when it holds more than ``2 x`` the lines the registry's state needs plus :data:`COMPACT_SLACK`
(checked after every append and at open), it is rewritten as :func:`compact_entries` of its lines (the
lines of live jobs' current incarnations that still decide a flag, every unapplied mutation with its id,
the ``applied`` markers that matter, in their order), through a temp file that is fsynced and renamed
over the log; a crash before the rename leaves the old log whole (the temp file is removed at the next
open). The rewritten log uses only the usual line types, plus an optional ``next_id`` on its last
``applied`` line (so ids are never reused); a log written before compaction existed replays as before.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from source_backfill.errors import MutationLogError, one_line
from source_backfill.runtime.mutation_log import LOG_VERSION, MutationLog

logger = logging.getLogger(__name__)

#: Lines a log may hold beyond twice what its state needs before it is compacted.
COMPACT_SLACK = 1000

#: The state a list of parsed log lines replays to (comparable with ``==``); MutationLogError if it
#: does not replay.
StateOf = Callable[[list[dict[str, Any]]], object]


class LogCompactor:
    """Compacts one :class:`MutationLog` when it has grown; its owner's lock is held around each call."""

    def __init__(self, log: MutationLog, state_of: StateOf) -> None:
        self.log = log
        self.state_of = state_of
        #: After a compaction that failed or was refused: not tried again below this many lines.
        self.floor = 0

    def maybe(self, needed: int) -> None:
        """Compact when the log holds more than twice the ``needed`` lines plus COMPACT_SLACK."""
        if self.log.lines > max(2 * needed + COMPACT_SLACK, self.floor):
            self.compact()

    def compact(self) -> bool:
        """Rewrite the log as the lines that replay to its state; False if it was left as it is.

        The new log is checked first: replayed, it must give the state the old one gives (else the log
        is kept, an error logged, and compaction not tried again before COMPACT_SLACK more lines). It is
        written to a temp file, fsynced, renamed over the log, and the folder
        fsynced; a failure before the rename leaves the log as it was. Never raises for a failed write.
        """
        log = self.log
        try:
            entries = log.entries()
        except (OSError, ValueError) as exc:
            logger.error('log compaction skipped, the log cannot be read path="%s" error="%s"',
                         log.path, one_line(exc))
            return False
        kept = compact_entries(entries)
        try:
            same = self.state_of(kept) == self.state_of(entries)
        except MutationLogError as exc:
            same = False
            logger.error('log compaction check failed error="%s"', exc)
        if not same:
            logger.error('log compaction skipped, its result replays to another state path="%s"', log.path)
            self.floor = log.lines + COMPACT_SLACK
            return False
        before = log.lines
        try:
            log.rewrite(kept)
        except OSError as exc:
            self.floor = log.lines + COMPACT_SLACK
            logger.warning('log compaction failed, the log is kept as it was path="%s" error="%s"',
                           log.path, exc.strerror or exc)
            return False
        logger.info('mutation log compacted path="%s" lines_before=%d lines_after=%d', log.path,
                    before, len(kept))
        return True


#: What each kind of mutation sets on a live record (the last line setting a flag is kept). A retry into a
#: new table sets the job's spec too (its table and start), as a retransform does (its whole spec).
_FLAGS: dict[str, tuple[str, ...]] = {"pause": ("paused",), "resume": ("paused",), "throttle": ("rate",),
                                      "retry": ("error",), "retransform": ("spec",)}


def _flags(entry: dict[str, Any]) -> tuple[str, ...]:
    """The flags a mutation line sets on its job's live record (none: an applied repair, a reset)."""
    if entry["kind"] == "retry" and entry.get("spec") is not None:
        return ("error", "spec")
    return _FLAGS.get(entry["kind"], ())


def compact_entries(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The subset of a log's lines (parsed, in order) that replays to the same registry state.

    Jobs do not touch each other's state, so each job name is reduced on its own, to a suffix of its
    lines that starts where its state does not depend on what came before: at a ``create`` (which
    replaces the record) or where it had no record, and before which no mutation is left unapplied or
    marked applied after that point (a marker of a drop deletes the record current at the marker). Inside
    that suffix, creates, drops and unapplied mutations are kept; of the other lines only the last one
    setting each flag (paused, rate limit, error, spec) of the job's live record (an applied repair
    sets none: it is gone). ``applied`` markers stay in place, holding only ids still in the log; a last
    marker carries ``next_id``. Lines are kept verbatim.
    """
    mutation_at: dict[int, int] = {}  # id -> line index
    marked_at: dict[int, int] = {}  # id -> index of the first marker naming it
    by_job: dict[str, list[int]] = {}  # job -> indices of its mutation and failed lines
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
    out: list[dict[str, Any]] = []
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
    entries: list[dict[str, Any]], lines: list[int], marked_at: dict[int, int],
) -> set[int]:
    """The indices to keep of one job's lines (see :func:`compact_entries`)."""
    n = len(entries)
    # where the job's state does not depend on earlier lines: before a create, or where it has no record
    starts: list[int] = []
    record = False  # the job has a record (dropped or not) just before the line being looked at
    dropped = False
    pending_drops: set[int] = set()
    marker_of: dict[int, list[int]] = {}  # marker index -> this job's drop ids it names
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
            for flag in _flags(e):  # an applied repair sets nothing: it is in the job's table
                last[flag] = i
    if alive:
        keep.update(last.values())
    return keep
