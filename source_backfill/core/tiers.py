"""Where a split's history comes from: the archive tier, Kafka, or nowhere (pure; issue 31's planner).

A split's history is the offsets ``[start, target)``. An **archive** (a Delta table of the topic's records
as Kafka gave them) holds some of them: a set of half-open offset ranges, exact (for an archive that is a
job of this service, its committed per-split state; for a foreign table, its offsets at a pinned
version). Kafka holds the offsets from the split's **log start** on. Each offset is classified by one
rule, and :func:`plan_tiers` returns the classification as contiguous segments, in order, covering
``[start, target)`` exactly once (no gap, no overlap):

========================  ===============================  ==================  ==================
offset ``o``              held by the archive              not held, ``o >=``   not held, ``o <``
                                                           log start           log start
========================  ===============================  ==================  ==================
``source = "auto"``       ``ARCHIVE``                      ``KAFKA``           ``GAP`` inside the
                                                                               archive's span,
                                                                               else ``LOSS``
``source = "archive"``    ``ARCHIVE``                      ``GAP`` inside the archive's span,
                                                           else ``LOSS``
``source = "kafka"``      (ignored)                        ``KAFKA``           ``LOSS``
========================  ===============================  ==================  ==================

The archive's **span** is from its first held offset to the end of its last held range. Inside it, an
offset the archive does not hold below the log start is a ``GAP``: Kafka no longer has it either, so
nothing is left to tell a transaction marker or an aborted record (which no reader ever returns) from a
record the archive lost; it is trusted as a marker, counted and reported, never guessed at. Outside the
span and below the log start, nothing holds the offset: ``LOSS``, handled as data loss is today
(``fail_on_data_loss``). Where the archive and Kafka both hold an offset, ``auto`` takes the archive (a
columnar read beats fetching from the broker); which archive offsets a job may read there at all is the
adapter's rule (:func:`usable`: an archive not known to equal Kafka is read only below the log start,
after the first offsets of its overlap with Kafka, :func:`overlap_window`, were compared with Kafka's).

A source may have **several archives**, in an order: an offset is read from the first of them that holds
it (``Segment.archive``: its index), and it is a ``GAP`` when below the log start it is inside the span of
any of them and held by none (:func:`plan_tiers_many`; :func:`plan_tiers` is the one-archive case).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Literal

HistorySource = Literal["auto", "archive", "kafka"]


class Tier(Enum):
    """Where a run of a split's history offsets is read from (or why it is not)."""

    ARCHIVE = "archive"
    KAFKA = "kafka"
    GAP = "gap"
    LOSS = "loss"


@dataclass(frozen=True, slots=True)
class Segment:
    """Offsets ``[start, end)`` of one split, all from the same tier."""

    tier: Tier
    start: int
    end: int
    #: ``ARCHIVE``: the index of the archive read (the first in the source's order that holds the offsets).
    archive: int = 0

    @property
    def size(self) -> int:
        """Offsets in the segment."""
        return self.end - self.start


def normalized(held: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    """The archive's held ranges sorted and merged (empty ranges dropped): disjoint, not touching."""
    out: list[tuple[int, int]] = []
    for lo, hi in sorted(r for r in held if r[1] > r[0]):
        if out and lo <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], hi))
        else:
            out.append((lo, hi))
    return out


def merged(helds: Iterable[Mapping[str, Iterable[tuple[int, int]]]]) -> dict[str, list[tuple[int, int]]]:
    """Several archives' holdings per split as one (:func:`normalized` per split): what all of them hold."""
    found: dict[str, list[tuple[int, int]]] = {}
    for held in helds:
        for split, ranges in held.items():
            found.setdefault(split, []).extend(ranges)
    return {split: normalized(ranges) for split, ranges in found.items()}


def plan_tiers(start: int, target: int, held: Iterable[tuple[int, int]], log_start: int,
               source: HistorySource = "auto") -> list[Segment]:
    """A split's history ``[start, target)`` as contiguous segments by tier (the module's table).

    Adjacent offsets of the same tier are one segment; no segment is empty. ``held``: the archive's
    half-open ranges (any order, may overlap); ``log_start``: the split's first offset in Kafka.
    """
    return plan_tiers_many(start, target, [held], log_start, source)


def plan_tiers_many(start: int, target: int, helds: Sequence[Iterable[tuple[int, int]]], log_start: int,
                    source: HistorySource = "auto") -> list[Segment]:
    """:func:`plan_tiers` with several archives, in order (an offset from the first that holds it)."""
    if target <= start:
        return []
    archives = [[] if source == "kafka" else normalized(h) for h in helds]
    spans = [(r[0][0], r[-1][1]) for r in archives if r]
    cuts = {start, target, log_start}
    for ranges in archives:
        for lo, hi in ranges:
            cuts.update((lo, hi))
    points = sorted(c for c in cuts if start <= c <= target)
    segments: list[Segment] = []
    for lo, hi in zip(points, points[1:], strict=False):
        tier, index = _tier_of(lo, archives, spans, log_start, source)  # constant on [lo, hi): no cut inside
        if segments and segments[-1].tier is tier and segments[-1].archive == index:
            segments[-1] = Segment(tier, segments[-1].start, hi, index)
        else:
            segments.append(Segment(tier, lo, hi, index))
    return segments


def usable(held: Iterable[tuple[int, int]], log_start: int, source: HistorySource, *,
           trusted: bool) -> list[tuple[int, int]]:
    """The archive's held ranges a job may read: an untrusted archive in ``auto`` only below the log start.

    Where Kafka still holds an offset, an archive not known to equal Kafka (``trusted``) is not read:
    Kafka's record is (nothing has to compare the two). ``archive`` asked for the archive alone: all of it.
    """
    ranges = normalized(held)
    if source == "auto" and not trusted:
        return [(lo, min(hi, log_start)) for lo, hi in ranges if lo < log_start]
    return ranges


def overlap_window(held: Iterable[tuple[int, int]], log_start: int, offsets: int) -> tuple[int, int] | None:
    """The offsets of a split where an archive not trusted is compared with Kafka (None: nothing to compare).

    From where the archive's span reaches the log start (``max(log_start, span start)``), the next
    ``offsets`` offsets inside its span: its records there must be Kafka's, and Kafka's records there must
    be in it (a hole of the archive where Kafka has a record is a difference too). None when the archive
    ends at or below the log start (it overlaps nothing Kafka holds) or ``offsets`` is 0 (no check).
    """
    ranges = normalized(held)
    if not ranges or offsets <= 0:
        return None
    lo = max(log_start, ranges[0][0])
    hi = min(ranges[-1][1], lo + offsets)
    return (lo, hi) if hi > lo else None


def earliest(log_start: int, held: Iterable[tuple[int, int]], source: HistorySource) -> int:
    """A split's first offset history can be read from (an ``earliest`` start's).

    ``kafka``: the log start; ``archive``: the archive's first held offset (the log start where it holds
    none of the split); ``auto``: the lower of the two. Several archives: ``held`` is all of theirs.
    """
    ranges = [] if source == "kafka" else normalized(held)
    if not ranges:
        return log_start
    return ranges[0][0] if source == "archive" else min(ranges[0][0], log_start)


def at_timestamp(kafka: Mapping[str, int], archives: Iterable[Mapping[str, int]]) -> dict[str, int]:
    """A timestamp start per split with archives: the first offset whose timestamp is at or after it.

    ``kafka``: Kafka's answer (ListOffsets for the timestamp: among the records it still holds);
    ``archives``: each archive's first such offset below the log start, per split that has one. Below the
    log start only the archives know the records, and their offsets are below all of Kafka's: the lowest
    answer is the start, else Kafka's.
    """
    chosen = dict(kafka)
    for firsts in archives:
        for split, offset in firsts.items():
            if split in chosen:
                chosen[split] = min(chosen[split], offset)
    return chosen


def tier_of(offset: int, held: Iterable[tuple[int, int]], log_start: int,
            source: HistorySource = "auto") -> Tier:
    """One offset's tier by the module's table (the reference :func:`plan_tiers` is checked against)."""
    return tier_of_many(offset, [held], log_start, source)[0]


def tier_of_many(offset: int, helds: Sequence[Iterable[tuple[int, int]]], log_start: int,
                 source: HistorySource = "auto") -> tuple[Tier, int]:
    """One offset's tier with several archives, and the archive's index (0 unless ``ARCHIVE``)."""
    archives = [[] if source == "kafka" else normalized(h) for h in helds]
    spans = [(r[0][0], r[-1][1]) for r in archives if r]
    return _tier_of(offset, archives, spans, log_start, source)


def _tier_of(offset: int, archives: Sequence[Sequence[tuple[int, int]]], spans: Sequence[tuple[int, int]],
             log_start: int, source: HistorySource) -> tuple[Tier, int]:
    for index, ranges in enumerate(archives):
        if any(lo <= offset < hi for lo, hi in ranges):
            return Tier.ARCHIVE, index
    if source != "archive" and offset >= log_start:
        return Tier.KAFKA, 0
    if any(lo <= offset < hi for lo, hi in spans):
        return Tier.GAP, 0
    return Tier.LOSS, 0


def tier_sizes(segments: Iterable[Segment]) -> dict[Tier, int]:
    """Offsets per tier (every tier present, 0 where none): what progress, the dry run and verify show."""
    sizes = dict.fromkeys(Tier, 0)
    for s in segments:
        sizes[s.tier] += s.size
    return sizes


#: An offset run of one split, half-open: ``(split, start, end)``.
Run = tuple[str, int, int]


def whole_runs(ranges: Iterable[Run], runs: Sequence[Run]) -> tuple[list[int], list[Run]]:
    """Which of ``runs`` lie wholly inside ``ranges``, and ``ranges`` less them.

    ``runs`` are the offsets of an archive's data files (each file one split's consecutive offsets); a
    file whose run is inside the history to copy can be taken whole instead of read. Returns the indices
    of the runs taken (in order; a run overlapping one taken before it is not taken, so each offset is
    taken at most once) and what is left of ``ranges`` once they are cut out, per split in offset order:
    the offsets of the taken runs and of the rest are those of ``ranges``, each once.
    """
    spans: dict[str, list[tuple[int, int]]] = {}
    for split, start, end in ranges:
        spans.setdefault(split, []).append((start, end))
    spans = {split: normalized(held) for split, held in spans.items()}
    taken: list[int] = []
    cut: dict[str, list[tuple[int, int]]] = {}
    for i, (split, lo, hi) in enumerate(runs):
        if hi <= lo or not any(a <= lo and hi <= b for a, b in spans.get(split, ())):
            continue
        if any(lo < b and a < hi for a, b in cut.get(split, ())):
            continue
        taken.append(i)
        cut.setdefault(split, []).append((lo, hi))
    rest: list[Run] = []
    for split, held in spans.items():
        holes = normalized(cut.get(split, ()))
        for a, b in held:
            at = a
            for lo, hi in holes:
                if a <= lo < b:  # taken runs lie inside one span each
                    if lo > at:
                        rest.append((split, at, lo))
                    at = hi
            if at < b:
                rest.append((split, at, b))
    return taken, rest
