"""A job's state in its table's log: full snapshots now and then, the changes of each commit between.

A job's state is a few *sections*, each a mapping ``key -> JSON value`` (a Kafka job: ``splits``, the
per-split state rows, and ``end``, the live position each split is covered to). Writing all of it in
every commit costs the whole state per commit (1.3 MB at 10,000 splits) even when one split moved. So a
commit carries either

* a **snapshot**: every section whole; or
* a **delta**: per section the keys whose value changed since the previous commit of the job and the keys
  removed, plus ``base`` (the log version of the snapshot it builds on) and ``prev`` (the version of the
  job's previous state commit, snapshot or delta).

Recovery reads the newest commit, follows ``prev`` back to ``base`` and applies the deltas over the
snapshot in commit order (:func:`apply`). Rule and invariant, property-tested: for any sequence of
states ``s0, s1, ... sn`` and any choice of which commits are snapshots (the first always is),
``apply(s_b, diff(s_b, s_b+1), ..., diff(s_n-1, s_n)) == s_n`` where ``b`` is the last snapshot.

When to write a snapshot (:func:`snapshot_due`): the first commit; every ``every`` commits (the chain
recovery reads stays bounded); when the changes are more than ``max_fraction`` of the entries (a
snapshot is barely larger then); and when the last snapshot is older than ``max_age_s`` (half the
table's log retention, so Delta's log cleanup never removes the snapshot a live chain builds on).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

Sections = Mapping[str, Mapping[str, Any]]


@dataclass(frozen=True)
class Changes:
    """Per section: the entries whose value is new or changed, and the keys no longer there."""

    changed: dict[str, dict[str, Any]] = field(default_factory=dict)
    removed: dict[str, list[str]] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return any(self.changed.values()) or any(self.removed.values())

    @property
    def size(self) -> int:
        """How many entries the changes name (changed + removed)."""
        return sum(map(len, self.changed.values())) + sum(map(len, self.removed.values()))


def diff(prev: Sections, new: Sections) -> Changes:
    """The changes that turn ``prev`` into ``new`` (sections missing on one side count as empty)."""
    changed: dict[str, dict[str, Any]] = {}
    removed: dict[str, list[str]] = {}
    for name in sorted(set(prev) | set(new)):
        old, cur = prev.get(name, {}), new.get(name, {})
        moved = {k: v for k, v in cur.items() if k not in old or old[k] != v}
        gone = sorted(k for k in old if k not in cur)
        if moved:
            changed[name] = moved
        if gone:
            removed[name] = gone
    return Changes(changed, removed)


def apply(snapshot: Sections, *changes: Changes) -> dict[str, dict[str, Any]]:
    """``snapshot`` with ``changes`` applied in order (a new mapping; the inputs are not modified)."""
    out = {name: dict(entries) for name, entries in snapshot.items()}
    for change in changes:
        for name, gone in change.removed.items():
            section = out.setdefault(name, {})
            for key in gone:
                section.pop(key, None)
        for name, moved in change.changed.items():
            out.setdefault(name, {}).update(moved)
    return out


def size(sections: Sections) -> int:
    """How many entries the sections hold."""
    return sum(map(len, sections.values()))


@dataclass(frozen=True)
class SnapshotPolicy:
    """When a commit carries a full snapshot instead of its changes (see the module docstring)."""

    every: int = 1000
    max_fraction: float = 0.5
    max_age_s: float = 15 * 24 * 3600.0


def snapshot_due(
    policy: SnapshotPolicy, *, has_base: bool, deltas_since: int, changes: Changes, total: int,
    base_age_s: float,
) -> bool:
    """Whether this commit writes a snapshot.

    ``has_base``: a snapshot of the job is known to this writer (False: first commit, or a table of the
    previous format, whose commits are all snapshots); ``deltas_since``: deltas committed since it;
    ``total``: entries of the full new state; ``base_age_s``: how old that snapshot is.
    """
    return (
        not has_base
        or deltas_since + 1 >= policy.every
        or changes.size > policy.max_fraction * max(total, 1)
        or base_age_s >= policy.max_age_s
    )


@dataclass(frozen=True)
class Chain:
    """Where a writer stands in its log: the snapshot it builds on and its last state commit."""

    base: int
    prev: int
    deltas_since: int
    #: When the base snapshot was committed (seconds since the epoch, wall clock).
    base_time_s: float

    def after(self, version: int, *, snapshot: bool, now_s: float) -> Chain:
        """The chain once a commit at ``version`` landed."""
        if snapshot:
            return Chain(version, version, 0, now_s)
        return Chain(self.base, version, self.deltas_since + 1, self.base_time_s)
