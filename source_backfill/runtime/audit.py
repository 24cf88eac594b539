"""The audit table: one row per accepted mutation, by id, in a Delta table under the state root.

The mutation log is compacted (a drop's and a pause's lines go once they decide nothing), so it cannot be
the audit. Each mutation line records the principal that asked (``by``); :class:`AuditTable` copies every
accepted mutation into ``state_root/audit`` (who, what, which job and namespace, when), one Delta commit
per copy, right after the line is durable. A crash between the two leaves the row missing: at the next
open the registry copies every line above the table's highest id before anything can compact the log
(:meth:`catch_up`), so each accepted id is in the table exactly once, whatever the crashes. A copy that
fails (a full disk) is kept pending and retried with the next one; compaction waits for it.

Refused requests are not rows (a flood of them would be a flood of commits): they are log lines, with
the principal and the reason (:mod:`source_backfill.api.access`).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from datetime import datetime
from pathlib import Path
from typing import Any

import pyarrow as pa

from source_backfill.runtime.mutation_log import Mutation

logger = logging.getLogger(__name__)

AUDIT_DIR = "audit"
#: The audit table's columns.
SCHEMA = pa.schema([
    ("id", pa.int64()), ("at", pa.string()), ("kind", pa.string()), ("job", pa.string()),
    ("namespace", pa.string()), ("source", pa.string()), ("by", pa.string()), ("request_id", pa.string()),
    ("detail", pa.string()),
])


class AuditTable:
    """``state_root/audit``: appends rows of accepted mutations, each id once.

    Not thread-safe: the registry calls it under its lock.
    """

    def __init__(self, state_root: Path) -> None:
        self.path = Path(state_root) / AUDIT_DIR
        self._high: int | None = None
        #: Accepted, not copied yet (a write failed): retried with the next copy.
        self.pending: list[tuple[Mutation, datetime, str]] = []

    def high_id(self) -> int:
        """The highest mutation id the table holds (0 when it holds none)."""
        if self._high is None:
            from deltalake import DeltaTable

            if not (self.path / "_delta_log").exists():
                self._high = 0
            else:
                ids = DeltaTable(str(self.path)).to_pyarrow_table(columns=["id"]).column("id")
                self._high = max(ids.to_pylist(), default=0)
        return self._high

    def record(self, mutation: Mutation, at: datetime, namespace: str) -> None:
        """Copy an accepted mutation (and any pending before it); a failed write keeps them pending."""
        self.pending.append((mutation, at, namespace))
        self.flush()

    def catch_up(self, accepted: Iterable[tuple[Mutation, datetime, str]]) -> int:
        """Copy the accepted mutations the table lacks (a crash came between a line and its row)."""
        high = self.high_id()
        missing = [a for a in accepted if a[0].id > high]
        if missing:
            logger.warning("audit rows missing after a crash, copied from the mutation log ids=%d..%d",
                           missing[0][0].id, missing[-1][0].id)
            self.pending.extend(missing)
            self.flush()
        return len(missing)

    def flush(self) -> bool:
        """Write the pending rows in one commit; False (kept pending, logged) if the write failed."""
        if not self.pending:
            return True
        from deltalake import write_deltalake

        rows = [_row(m, at, ns) for m, at, ns in self.pending if m.id > self.high_id()]
        try:
            if rows:
                write_deltalake(str(self.path), pa.Table.from_pylist(rows, schema=SCHEMA), mode="append")
        except Exception as exc:  # noqa: BLE001 - any failure of the copy: kept, retried, never lost
            logger.error('audit row not written, kept pending count=%d error="%s"', len(self.pending),
                         f"{type(exc).__name__}: {exc}"[:300])
            return False
        self._high = max([self.high_id(), *(r["id"] for r in rows)])
        self.pending.clear()
        return True

    def rows(self) -> list[dict[str, Any]]:
        """Every row, by id."""
        from deltalake import DeltaTable

        if not (self.path / "_delta_log").exists():
            return []
        return sorted(DeltaTable(str(self.path)).to_pyarrow_table().to_pylist(), key=lambda r: r["id"])


def _row(m: Mutation, at: datetime, namespace: str) -> dict[str, Any]:
    detail: dict[str, Any] = {}
    if m.kind in ("create", "throttle"):
        detail["rate_limit"] = m.rate_limit
    if m.kind == "retransform" and m.spec is not None:
        detail["transform"] = m.spec.transform
    if m.repair is not None:
        detail["repair"] = m.repair.model_dump(mode="json", exclude_none=True)
    return {"id": m.id, "at": at.isoformat(), "kind": m.kind, "job": m.job, "namespace": namespace,
            "source": m.source, "by": m.by, "request_id": m.request_id,
            "detail": json.dumps(detail, separators=(",", ":"))}
