"""What ``verify`` found for a Kafka job: per split counts, a few offsets as examples, one summary line."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from source_backfill.verify.common import EXAMPLES


@dataclass
class SplitTally:
    """One split's comparison, counted (a few offsets kept as examples), as the table is streamed."""

    split: str
    #: The offsets checked: ``[lo, hi)`` of the log, ``hi`` the job's committed position.
    lo: int
    hi: int
    records: int = 0
    missing: int = 0
    duplicated: int = 0
    unexpected: int = 0
    #: Rows below the log start (retention removed those records: they cannot be checked).
    below_log_start: int = 0
    #: Where the Kafka log is read from (the log start when ``lo`` is below it: the archive's part).
    kafka_from: int | None = None
    examples: dict[str, list[int]] = field(default_factory=lambda: {"missing": [], "duplicated": [],
                                                                     "unexpected": []})
    #: Offset ranges whose records' contents in the table are not the log's (:mod:`.content`): a log
    #: truncated and written again since the copy. Compared only where every offset is there once.
    content_differs: list[tuple[int, int]] = field(default_factory=list)

    def note(self, kind: str, offsets: Iterable[int], n: int) -> None:
        """Count ``n`` differences of ``kind``, keeping the first few offsets."""
        setattr(self, kind, getattr(self, kind) + n)
        room = EXAMPLES - len(self.examples[kind])
        if room > 0:
            self.examples[kind].extend(int(o) for o in list(offsets)[:room])

    @property
    def ok(self) -> bool:
        """No offset missing, duplicated or unknown to the log, and no content other than the log's."""
        return not (self.missing or self.duplicated or self.unexpected or self.content_differs)


@dataclass
class VerifyResult:
    """What ``verify`` found for a job: per split tallies, the table version checked, one summary line."""

    job: str
    version: int
    splits: dict[str, SplitTally]
    #: Whether the records' contents were compared too (the tables keep ``key``, ``value``, ``timestamp``).
    contents_compared: bool = False

    @property
    def ok(self) -> bool:
        """Every split exactly once up to the job's committed positions."""
        return all(s.ok for s in self.splits.values())

    def totals(self) -> dict[str, int]:
        """Records checked and differences, summed over the splits."""
        keys = ("records", "missing", "duplicated", "unexpected", "below_log_start")
        return {k: sum(getattr(s, k) for s in self.splits.values()) for k in keys}

    def summary(self) -> str:
        """``late-copy: exactly once, N records, 0 missing, 0 duplicated``, or the differences counted."""
        t = self.totals()
        head = (f"{self.job}: {'exactly once' if self.ok else 'NOT exactly once'}, {t['records']} records, "
                f"{t['missing']} missing, {t['duplicated']} duplicated")
        if t["unexpected"]:
            head += f", {t['unexpected']} not in the log"
        differs = sum(len(s.content_differs) for s in self.splits.values())
        if differs:
            plural = "s" if differs > 1 else ""
            head += (f", contents differ in {differs} offset range{plural} (the log holds other records "
                     "there than those copied: truncated and written again?)")
        if t["below_log_start"]:
            head += f" ({t['below_log_start']} rows below the log start not checked)"
        if self.ok:
            return head
        lines = [head]
        for s in self.splits.values():
            if not s.ok:
                parts = [f"{k} {s.examples[k]}" for k in ("missing", "duplicated", "unexpected")
                         if getattr(s, k)]
                if s.content_differs:
                    ranges = ", ".join(f"[{a}, {b})" for a, b in s.content_differs[:EXAMPLES])
                    parts.append(f"contents differ at offsets {ranges}")
                lines.append(f"  {s.split} [{s.lo}, {s.hi}): {'; '.join(parts)}")
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        """The API's view of the result."""
        return {
            "job": self.job, "ok": self.ok, "summary": self.summary(), "table_version": self.version,
            **self.totals(), "contents_compared": self.contents_compared,
            "splits": {s.split: {"from": s.lo, "to": s.hi, "records": s.records, "missing": s.missing,
                                 "duplicated": s.duplicated, "unexpected": s.unexpected,
                                 "below_log_start": s.below_log_start, "examples": s.examples,
                                 "content_differs": [list(r) for r in s.content_differs[:EXAMPLES]]}
                       for s in self.splits.values()},
        }
