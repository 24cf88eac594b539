"""JSON round-trip of a job's split states, refusing malformed input with a clear error.

Format version 2 (:mod:`source_backfill.core.state_log` says why and when each kind is written)::

    {"version": 2, "kind": "snapshot", "splits": {split: row, ...}, "end": {split: position, ...}}
    {"version": 2, "kind": "delta", "base": <log version of the snapshot>, "prev": <log version of the
     job's previous state commit>, "splits": {changed rows}, "end": {changed positions},
     "removed": {"splits": [...], "end": [...]}}

A row is ``{"stage", "offset", "num_consumed_rows", "target_offset"}``. Version 1 (``{"version": 1,
"splits": {...}}``, every split in every commit, the positions in the commit's plan) is still read: it is
a snapshot without ``end``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from source_backfill.core.columnar import SplitTable
from source_backfill.core.splits import SplitId, SplitState, Stage, parse_split_id
from source_backfill.core.state_log import Changes
from source_backfill.errors import StateFormatError

FORMAT_VERSION = 2
#: Versions :func:`decode_state` reads (1: every commit a snapshot of the splits alone).
READ_VERSIONS = (1, 2)
SPLITS, END = "splits", "end"


@dataclass(frozen=True)
class LoggedState:
    """One commit's state as written: a snapshot (every entry) or a delta (the changes since ``prev``)."""

    kind: Literal["snapshot", "delta"]
    #: ``splits``: rows (checked), ``end``: positions; a delta holds the changed entries only.
    sections: dict[str, dict[str, Any]]
    removed: dict[str, list[str]] = field(default_factory=dict)
    base: int | None = None
    prev: int | None = None
    version: int = FORMAT_VERSION

    @property
    def changes(self) -> Changes:
        """A delta's changes (for :func:`source_backfill.core.state_log.apply`)."""
        return Changes({k: dict(v) for k, v in self.sections.items() if v}, dict(self.removed))


def states_to_json(states: Mapping[SplitId, SplitState]) -> dict[str, Any]:
    """A JSON-able snapshot of ``states`` alone (sorted by split)."""
    return snapshot_to_json({SPLITS: SplitTable.from_states(states).to_json_rows()})


def snapshot_to_json(sections: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """A snapshot commit's state: every section whole (``splits`` rows as :meth:`SplitTable.to_json_rows`)."""
    return {"version": FORMAT_VERSION, "kind": "snapshot", **{k: dict(v) for k, v in sections.items()}}


def delta_to_json(changes: Changes, *, base: int, prev: int) -> dict[str, Any]:
    """A delta commit's state: the changes since the commit at ``prev``, building on the snapshot ``base``."""
    out: dict[str, Any] = {"version": FORMAT_VERSION, "kind": "delta", "base": base, "prev": prev,
                           SPLITS: {}, END: {}}
    for name, moved in changes.changed.items():
        out[name] = dict(moved)
    if changes.removed:
        out["removed"] = {k: list(v) for k, v in changes.removed.items() if v}
    return out


def decode_state(obj: Any) -> LoggedState:
    """Parse a commit's state (a dict or its JSON text), either kind, either version; checked throughout."""
    obj = _object(obj)
    version = obj.get("version")
    if version not in READ_VERSIONS:
        msg = f"backfill state version {version!r} is not supported (expected one of {READ_VERSIONS})"
        raise StateFormatError(msg)
    kind = "snapshot" if version == 1 else obj.get("kind")
    if kind not in ("snapshot", "delta"):
        msg = f'backfill state kind {kind!r} is neither "snapshot" nor "delta"'
        raise StateFormatError(msg)
    splits = obj.get(SPLITS)
    if not isinstance(splits, dict):
        msg = 'backfill state has no "splits" object'
        raise StateFormatError(msg)
    for split, value in splits.items():
        _split(split, value)  # checked now: a torn or garbled row fails here, not in the planner
    sections: dict[str, dict[str, Any]] = {SPLITS: dict(splits)}
    end = obj.get(END)
    if end is not None:
        if not isinstance(end, dict) or not all(
            isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in end.values()
        ):
            msg = 'backfill state "end" must map splits to positions >= 0'
            raise StateFormatError(msg)
        sections[END] = dict(end)
    if kind == "snapshot":
        return LoggedState("snapshot", sections, version=version)
    base, prev = obj.get("base"), obj.get("prev")
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in (base, prev)) \
            or prev < base:
        msg = f"backfill state delta has no valid base/prev versions (base={base!r}, prev={prev!r})"
        raise StateFormatError(msg)
    removed = obj.get("removed", {})
    if not isinstance(removed, dict) or not all(
        isinstance(v, list) and all(isinstance(k, str) for k in v) for v in removed.values()
    ):
        msg = 'backfill state delta "removed" must map sections to lists of keys'
        raise StateFormatError(msg)
    return LoggedState("delta", sections, {k: list(v) for k, v in removed.items()}, base, prev, version)


def splits_from_rows(rows: Mapping[str, Any]) -> dict[SplitId, SplitState]:
    """The split states of a ``splits`` section (rows checked)."""
    return {split: _split(split, value) for split, value in rows.items()}


def _object(obj: Any) -> dict[str, Any]:
    if isinstance(obj, (str, bytes)):
        try:
            obj = json.loads(obj)
        except ValueError as exc:
            msg = f"backfill state is not valid JSON: {exc}"
            raise StateFormatError(msg) from exc
    if not isinstance(obj, dict):
        msg = f"backfill state must be an object, got {type(obj).__name__}"
        raise StateFormatError(msg)
    return obj


def states_from_json(obj: Any) -> dict[SplitId, SplitState]:
    """The split states of a snapshot (a dict or its JSON text); StateFormatError otherwise.

    A delta is refused: its states need its snapshot and the deltas before it (the sink's recovery).
    """
    logged = decode_state(obj)
    if logged.kind != "snapshot":
        msg = "backfill state is a delta: it needs its snapshot (read the job's state chain from its table)"
        raise StateFormatError(msg)
    return splits_from_rows(logged.sections[SPLITS])


def _split(split: str, value: Any) -> SplitState:
    parse_split_id(split)
    if not isinstance(value, dict):
        msg = f'split "{split}": state must be an object'
        raise StateFormatError(msg)
    missing = {"stage", "offset", "num_consumed_rows", "target_offset"} - value.keys()
    if missing:
        msg = f'split "{split}": missing field(s) {sorted(missing)}'
        raise StateFormatError(msg)
    try:
        stage = Stage(value["stage"])
    except ValueError:
        msg = f'split "{split}": unknown stage {value["stage"]!r}'
        raise StateFormatError(msg) from None
    offset = _int(split, "offset", value["offset"], optional=True, minimum=-1)
    rows = _int(split, "num_consumed_rows", value["num_consumed_rows"], optional=False, minimum=0)
    target = _int(split, "target_offset", value["target_offset"], optional=True, minimum=-1)
    try:
        return SplitState(stage, offset, rows if rows is not None else 0, target)
    except StateFormatError as exc:
        msg = f'split "{split}": {exc}'
        raise StateFormatError(msg) from exc


def _int(split: str, field: str, value: Any, *, optional: bool, minimum: int) -> int | None:
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        msg = f'split "{split}": field "{field}" must be an integer, got {value!r}'
        raise StateFormatError(msg)
    if value < minimum:
        msg = f'split "{split}": field "{field}" must be >= {minimum}, got {value}'
        raise StateFormatError(msg)
    return value


def rebuild(head: LoggedState, read: Any, *, where: str = "the table") -> dict[str, dict[str, Any]]:
    """The full state a chain of commits ends in: the snapshot ``head`` builds on, its deltas applied.

    ``head``: the job's newest state commit. ``read(version)`` returns the state of the job's commit at
    that log version, or None when the log no longer has it. Deltas are followed back by ``prev`` to the
    snapshot ``base`` names, then applied oldest first. A link that is missing, not a commit of the job,
    or not where the chain says (a snapshot other than ``base``, a delta of another base) raises
    :class:`StateFormatError`: recovery never guesses a state.
    """
    from source_backfill.core.state_log import apply

    deltas: list[LoggedState] = []
    current = head
    while current.kind == "delta":
        deltas.append(current)
        assert current.prev is not None and current.base is not None  # noqa: S101 - checked by decode
        nxt = read(current.prev)
        if nxt is None:
            msg = (f"{where}: the job's state commit at version {current.prev} (part of the chain from "
                   f"snapshot version {current.base}) is missing from the log; restore _delta_log from a "
                   "backup, or drop the job and re-create it on a new sink path")
            raise StateFormatError(msg)
        if nxt.kind == "snapshot" and current.prev != current.base:
            msg = (f"{where}: version {current.prev} holds a snapshot, but the chain's snapshot is at "
                   f"version {current.base}: the log is inconsistent")
            raise StateFormatError(msg)
        if nxt.kind == "delta" and nxt.base != current.base:
            msg = (f"{where}: the delta at version {current.prev} builds on snapshot {nxt.base}, not "
                   f"{current.base}: the log is inconsistent")
            raise StateFormatError(msg)
        current = nxt
    return apply(current.sections, *(d.changes for d in reversed(deltas)))
