"""Bytes each namespace's jobs wrote to their tables per UTC day, counted by table version (pure).

A namespace's ``max_bytes_per_day`` (issue 50) bounds what its jobs add to their Delta tables in a UTC day.
The count is kept by table version, not by commit call: each job's ledger entry is the last version of its
table counted, and a count takes every version above it up to the one just committed, so the versions a
repair or another attempt committed in between are counted too, each once. The entries and the counts are
saved together (``runtime/quotas.py``): after a crash, a job's first commit counts from the saved
version on, so nothing committed is counted twice or missed, whatever the moment of the kill.

A version committed on another day than the ledger's (by its commit's timestamp) counts toward that day
only if it is today's: the count of a day starts at 0 when the first version of it is counted.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

#: Seconds in a day: days are numbered from the Unix epoch, in UTC.
DAY_S = 86_400


def day_of(seconds: float) -> int:
    """The UTC day (days since 1970-01-01) that a Unix timestamp in seconds falls in."""
    return int(seconds // DAY_S)


@dataclass
class DayLedger:
    """Bytes written per namespace on ``day``, and the last table version counted per job."""

    day: int = 0
    #: Bytes the namespaces' jobs added to their tables on ``day``.
    written: dict[str, int] = field(default_factory=dict)
    #: The last version of each job's table counted (any day): the next count starts above it.
    versions: dict[str, int] = field(default_factory=dict)

    def roll(self, today: int) -> None:
        """A new day: its counts start at 0 (the versions counted stay counted)."""
        if today != self.day:
            self.day = today
            self.written = {}

    def count(self, job: str, namespace: str, version: int, today: int,
              added: Callable[[int], tuple[int, int | None] | None]) -> int:
        """Count ``job``'s table versions up to ``version``: the bytes added to ``namespace``'s today.

        ``added(v)`` gives version ``v``'s bytes added and its commit's timestamp in ms (None: unknown),
        or None when the log no longer holds it. A job not in the ledger yet starts at ``version``
        (what it wrote before the ledger knew it is not counted). Returns the bytes counted for today.
        """
        self.roll(today)
        last = self.versions.get(job)
        first = version if last is None else last + 1
        counted = 0
        for v in range(first, version + 1):
            found = added(v)
            if found is None:
                continue
            size, ts_ms = found
            if ts_ms is not None and day_of(ts_ms / 1000) != today:
                continue  # another day's write
            counted += size
        if version > (last if last is not None else -1):
            self.versions[job] = version
        if counted:
            self.written[namespace] = self.written.get(namespace, 0) + counted
        return counted

    def used(self, namespace: str, today: int) -> int:
        """Bytes ``namespace``'s jobs added to their tables on ``today``."""
        return self.written.get(namespace, 0) if today == self.day else 0

    def over(self, namespace: str, limit: int | None, today: int) -> bool:
        """Whether ``namespace`` has written its ``limit`` of bytes today (None: no limit)."""
        return limit is not None and self.used(namespace, today) >= limit

    def forget(self, jobs: Iterable[str]) -> None:
        """Jobs dropped: their versions leave the ledger (a job of the same name starts anew)."""
        for job in jobs:
            self.versions.pop(job, None)

    def to_json(self) -> dict[str, object]:
        """The ledger as JSON (:meth:`from_json` reads it)."""
        return {"day": self.day, "written": dict(self.written), "versions": dict(self.versions)}

    @classmethod
    def from_json(cls, data: Mapping[str, object]) -> DayLedger:
        """The ledger :meth:`to_json` wrote; ValueError naming what is wrong with it."""
        day, written, versions = data.get("day"), data.get("written"), data.get("versions")
        if not isinstance(day, int) or not isinstance(written, dict) or not isinstance(versions, dict):
            msg = "not a ledger: day, written and versions are required"
            raise ValueError(msg)
        for mapping in (written, versions):
            if not all(isinstance(k, str) and isinstance(v, int) and v >= -1 for k, v in mapping.items()):
                msg = "written and versions map names to whole numbers"
                raise ValueError(msg)
        return cls(day=day, written=dict(written), versions=dict(versions))


__all__ = ["DAY_S", "DayLedger", "day_of"]
