"""A log truncated below what a source copied: told by anchors (pure; issue 49).

With an unclean leader election (or a lost disk) a partition's log can lose records the jobs already
copied, and new records then take the same offsets. Offsets alone cannot tell (Spark's Kafka rows carry no
leader epoch), so a source keeps an *anchor* per split: the offset of the last record of its newest
completed epoch and a fingerprint of that record's content. Checking an anchor reads the record at its
offset again; the log ending at or below it, or another record there, is a truncation.

The fingerprint is SHA-256 (lowercase hex) of the UTF-8 text ``k<KEY>v<VALUE>t<MS>``: ``KEY`` and
``VALUE`` the bytes in uppercase hex, or ``-`` for a null; ``MS`` the timestamp in milliseconds since the
epoch, in decimal. Hex holds no ``k``, ``v``, ``t`` or ``-``, so the framing is unambiguous, and Spark
computes it alike (``sha2(concat('k', coalesce(hex(key), '-'), 'v', ...), 256)``,
``runtime/source.py``). Headers are not in it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from source_backfill.core.splits import SplitId, parse_split_id


def framing(key: bytes | None, value: bytes | None, timestamp_ms: int) -> str:
    """The text a record's fingerprint hashes (see the module)."""
    k = "-" if key is None else key.hex().upper()
    v = "-" if value is None else value.hex().upper()
    return f"k{k}v{v}t{timestamp_ms}"


def fingerprint(key: bytes | None, value: bytes | None, timestamp_ms: int) -> str:
    """A record's content fingerprint: SHA-256 of :func:`framing`, lowercase hex (Spark's ``sha2``)."""
    return hashlib.sha256(framing(key, value, timestamp_ms).encode()).hexdigest()


@dataclass(frozen=True, order=True)
class Anchor:
    """The last record a completed epoch gave of ``split``: its offset and content fingerprint."""

    split: SplitId
    offset: int
    fingerprint: str

    def to_json(self) -> dict[str, object]:
        """The anchor as ``anchors.json`` keeps it (under its split)."""
        return {"offset": self.offset, "fingerprint": self.fingerprint}


def newest(kept: Mapping[SplitId, Anchor], new: Iterable[Anchor]) -> dict[SplitId, Anchor]:
    """``kept`` with each split's anchor replaced by a newer one of ``new`` (a higher offset).

    A lower or equal offset leaves the kept one (a replayed epoch, or a batch read again after a restart
    of the live query).
    """
    out = dict(kept)
    for anchor in new:
        old = out.get(anchor.split)
        if old is None or anchor.offset > old.offset:
            out[anchor.split] = anchor
    return dict(sorted(out.items()))


@dataclass(frozen=True)
class Found:
    """What the log holds at an anchor's offset now.

    ``log_start``/``log_end``: the split's first offset and its end (the next offset to be written, the
    last stable one under ``read_committed``). ``offset``/``fingerprint``: the first record read from the
    anchor's offset on (its offset, its fingerprint), None when none was read.
    """

    log_start: int
    log_end: int
    offset: int | None = None
    fingerprint: str | None = None


@dataclass(frozen=True)
class Truncation:
    """A split whose log no longer holds the anchor's record: it was truncated below what was copied."""

    anchor: Anchor
    found: Found

    def __str__(self) -> str:
        topic, partition = parse_split_id(self.anchor.split)
        if self.found.log_end <= self.anchor.offset:
            there = f"the log now ends at offset {self.found.log_end}"
        else:
            there = f"another record is at offset {self.anchor.offset} (fingerprint {self.found.fingerprint})"
        return (f"topic {topic} partition {partition} was truncated below what was copied: offset "
                f"{self.anchor.offset} held the record of fingerprint {self.anchor.fingerprint}, and {there} "
                "(an unclean leader election or a lost disk)")


def check(anchor: Anchor, found: Found) -> Truncation | None:
    """The verdict on one anchor: a :class:`Truncation`, or None (it holds, or nothing can be said).

    Truncated: the log ends at or below the anchor's offset, or a record of another fingerprint is at
    it. Nothing can be said when retention removed the offset (the log starts after it), or when the
    first record read from it lies after it (the offset holds no record now: compacted away; a marker).
    """
    if found.log_start > anchor.offset:
        return None
    if found.log_end <= anchor.offset:
        return Truncation(anchor, found)
    if found.offset == anchor.offset and found.fingerprint is not None \
            and found.fingerprint != anchor.fingerprint:
        return Truncation(anchor, found)
    return None


KINDS = frozenset({"checked", "newest"})
#: How many passed anchors a split keeps between two checks (the oldest are let go first).
MAX_PASSED = 64


@dataclass(frozen=True)
class Anchors:
    """A source's anchors per split: the newest, the last verified, and those epochs *passed*.

    The newest is the one an epoch gave last; the verified one the last check read; the passed ones were
    newest once and replaced before a check read them. A check reads all of them again.

    The verified one keeps a truncation found even when the live stream has since read past the old log's
    end in the new log (the newest anchor then lies in the new log, and holds); the passed ones find a
    truncation of records copied since the previous check and refilled past them before this one (the
    last anchor the old log gave is among them). What a check cannot see: such a truncation when more than
    :data:`MAX_PASSED` epochs anchored the split between two checks (the oldest passed ones go first).
    """

    checked: dict[SplitId, Anchor] = field(default_factory=dict)
    newest: dict[SplitId, Anchor] = field(default_factory=dict)
    passed: dict[SplitId, tuple[Anchor, ...]] = field(default_factory=dict)

    def advanced(self, new: Iterable[Anchor]) -> Anchors:
        """With an epoch's anchors (:func:`newest`); a replaced newest one not verified is passed."""
        now = newest(self.newest, new)
        passed = dict(self.passed)
        for split, old in self.newest.items():
            if now[split] != old and self.checked.get(split) != old:
                passed[split] = (*passed.get(split, ()), old)[-MAX_PASSED:]
        return Anchors(self.checked, now, dict(sorted(passed.items())))

    def to_check(self) -> list[Anchor]:
        """Every anchor a check reads again: each split's verified one, its passed ones and its newest."""
        return sorted({*self.checked.values(), *self.newest.values(),
                       *(a for kept in self.passed.values() for a in kept)})

    def after_check(self, now: Anchors, truncated: Iterable[Truncation], read: Iterable[Anchor]) -> Anchors:
        """``now`` (the anchors as epochs left them since ``self`` was checked) after the check's verdicts.

        A truncated split loses its anchors (the next epoch anchors it in the log as it is now); every
        other split whose newest anchor at the check was ``read`` (a verdict was reached) has it verified,
        and its passed anchors that were read are let go (those not read are read again next time).
        """
        bad = {t.anchor.split for t in truncated}
        done = set(read)
        checked = {**{s: a for s, a in now.checked.items() if s not in bad},
                   **{s: a for s, a in self.newest.items() if s not in bad and a in done}}
        kept = {s: a for s, a in now.newest.items() if s not in bad}
        passed = {s: left for s, was in now.passed.items()
                  if s not in bad and (left := tuple(a for a in was if a not in done))}
        return Anchors(dict(sorted(checked.items())), kept, passed)


def first_per_split(found: Iterable[Truncation]) -> list[Truncation]:
    """One truncation per split, its lowest anchor's (the one naming the most records lost)."""
    out: dict[SplitId, Truncation] = {}
    for t in sorted(found, key=lambda t: t.anchor):
        out.setdefault(t.anchor.split, t)
    return list(out.values())


def anchors_to_json(anchors: Anchors) -> dict[str, dict[str, Any]]:
    """The record of ``anchors.json``.

    ``{"checked"|"newest": {split: {"offset": o, "fingerprint": f}}}``, and ``"passed": {split: [{"offset":
    o, "fingerprint": f}, ...]}`` (oldest first) when an epoch passed an anchor no check has read yet
    (absent otherwise, as the release before wrote it).
    """
    out: dict[str, dict[str, Any]] = {
        kind: {split: a.to_json() for split, a in sorted(kept.items())}
        for kind, kept in (("checked", anchors.checked), ("newest", anchors.newest))}
    if anchors.passed:
        out["passed"] = {split: [a.to_json() for a in kept] for split, kept in sorted(anchors.passed.items())}
    return out


def anchors_from_json(data: object) -> Anchors:
    """The anchors of :func:`anchors_to_json`'s record; ValueError on anything else."""
    if not isinstance(data, dict) or not KINDS <= set(data) <= {*KINDS, "passed"}:
        msg = "not an object of checked, newest and passed anchors"
        raise ValueError(msg)
    passed = data.get("passed", {})
    if not isinstance(passed, dict) or not all(isinstance(v, list) and v for v in passed.values()):
        msg = "passed anchors are not lists by split"
        raise ValueError(msg)
    by_split = {split: tuple(_split_anchors({split: entry})[split] for entry in entries)
                for split, entries in passed.items()}
    return Anchors(_split_anchors(data["checked"]), _split_anchors(data["newest"]),
                   dict(sorted(by_split.items())))


def _split_anchors(data: object) -> dict[SplitId, Anchor]:
    if not isinstance(data, dict):
        msg = "not an object of splits"
        raise ValueError(msg)  # noqa: TRY004 - one error kind for a malformed record
    out: dict[SplitId, Anchor] = {}
    for split, entry in data.items():
        if not isinstance(split, str) or not isinstance(entry, dict):
            msg = f"entry {split!r} is not a split's anchor"
            raise ValueError(msg)  # noqa: TRY004
        offset, fp = entry.get("offset"), entry.get("fingerprint")
        if not isinstance(offset, int) or isinstance(offset, bool) or not isinstance(fp, str):
            msg = f"anchor of {split} lacks an integer offset or a fingerprint"
            raise ValueError(msg)
        parse_split_id(split)
        out[split] = Anchor(split, offset, fp)
    return out
