"""The audit table: one row per accepted mutation, by id, in a Delta table under the state root.

The mutation log is compacted (a drop's and a pause's lines go once they decide nothing), so it cannot be
the audit. Each mutation line records the principal that asked (``by``); :class:`AuditTable` copies every
accepted mutation into ``state_root/audit`` (who, what, which job and namespace, when), one Delta commit
per copy, right after the line is durable. A crash between the two leaves the row missing: at the next
open the registry copies every line above the table's highest id before anything can compact the log
(:meth:`catch_up`), so each accepted id is in the table exactly once, whatever the crashes. A copy that
fails (a full disk) is kept pending and retried with the next one; compaction waits for it.

Refused requests (401, 403, and the 404 of a job of another namespace) are log lines, with the principal
and the reason (:mod:`source_backfill.api.access`), and rows of ``state_root/audit_refused``
(:class:`RefusalTable`): kept in memory and appended in one commit every ``flush_every_s`` (a flood of
refusals is not a flood of commits), at most ``MAX_PENDING`` waiting (past that they are counted, not
kept); the rows of the last seconds before a crash are lost, their log lines are not.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Iterable
from datetime import datetime
from pathlib import Path
from typing import Any

import pyarrow as pa

from source_backfill import metrics
from source_backfill.core.start_over import reset_folder_name
from source_backfill.runtime.mutation_log import Mutation

logger = logging.getLogger(__name__)

AUDIT_DIR = "audit"
#: The audit table's columns.
SCHEMA = pa.schema([
    ("id", pa.int64()), ("at", pa.string()), ("kind", pa.string()), ("job", pa.string()),
    ("namespace", pa.string()), ("source", pa.string()), ("by", pa.string()), ("request_id", pa.string()),
    ("detail", pa.string()),
])


REFUSALS_DIR = "audit_refused"
#: The refusals table's columns (``by``: the principal, null when no credential authenticated).
REFUSAL_SCHEMA = pa.schema([
    ("at", pa.string()), ("by", pa.string()), ("status", pa.int32()), ("reason", pa.string()),
    ("method", pa.string()), ("path", pa.string()), ("job", pa.string()), ("namespace", pa.string()),
    ("client", pa.string()), ("request_id", pa.string()),
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


class RefusalTable:
    """``state_root/audit_refused``: refused requests, appended in batches by a thread of its own.

    Thread-safe: the API's requests record, the thread writes.
    """

    #: Refusals waiting for their commit at most; past it they are counted (metric), not kept.
    MAX_PENDING = 10_000

    def __init__(self, state_root: Path, flush_every_s: float = 2.0) -> None:
        self.path = Path(state_root) / REFUSALS_DIR
        self._pending: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._write_lock = threading.Lock()
        self._stop = threading.Event()
        self._every = flush_every_s
        self._thread = threading.Thread(target=self._run, name="audit-refusals", daemon=True)
        self._thread.start()

    def record(self, row: dict[str, Any]) -> None:
        """Keep a refusal's row for the next commit (dropped, and counted, past ``MAX_PENDING``)."""
        with self._lock:
            if len(self._pending) >= self.MAX_PENDING:
                metrics.AUDIT_REFUSALS_DROPPED.inc()
                return
            self._pending.append({name: row.get(name) for name in REFUSAL_SCHEMA.names})

    def flush(self) -> bool:
        """Write the waiting rows in one commit; False (kept, logged) if the write failed."""
        from deltalake import write_deltalake

        with self._write_lock:
            with self._lock:
                rows, self._pending = self._pending, []
            if not rows:
                return True
            try:
                write_deltalake(str(self.path), pa.Table.from_pylist(rows, schema=REFUSAL_SCHEMA),
                                mode="append")
            except Exception as exc:  # noqa: BLE001 - kept for the next flush (bounded), logged
                logger.error('refusal rows not written, kept count=%d error="%s"', len(rows),
                             f"{type(exc).__name__}: {exc}"[:300])
                with self._lock:
                    self._pending = (rows + self._pending)[-self.MAX_PENDING:]
                return False
            return True

    def rows(self) -> list[dict[str, Any]]:
        """Every row written, oldest first (those waiting for their commit are written first)."""
        from deltalake import DeltaTable

        self.flush()
        if not (self.path / "_delta_log").exists():
            return []
        return sorted(DeltaTable(str(self.path)).to_pyarrow_table().to_pylist(), key=lambda r: r["at"])

    def close(self) -> None:
        """Stop the thread; what waits is written."""
        self._stop.set()
        self._thread.join(timeout=30)
        self.flush()

    def _run(self) -> None:
        while not self._stop.wait(self._every):
            try:
                self.flush()
            except Exception:  # noqa: BLE001 - the thread goes on; the rows stay pending
                logger.exception("refusal rows not flushed")


def _row(m: Mutation, at: datetime, namespace: str) -> dict[str, Any]:
    detail: dict[str, Any] = {}
    if m.kind in ("create", "throttle"):
        detail["rate_limit"] = m.rate_limit
    if m.kind == "retransform" and m.spec is not None:
        detail["transform"] = m.spec.transform
    if m.repair is not None:
        detail["repair"] = m.repair.model_dump(mode="json", exclude_none=True)
    if m.kind == "retry" and m.spec is not None:  # from the start into a new table
        detail["new_table"] = m.spec.sink_path
        detail["from"] = m.spec.start.kind
    if m.kind == "reset":  # where the source's folder was moved, under the state root
        detail["moved_to"] = f"sources/{reset_folder_name(m.source, at, m.id)}"
    return {"id": m.id, "at": at.isoformat(), "kind": m.kind, "job": m.job, "namespace": namespace,
            "source": m.source, "by": m.by, "request_id": m.request_id,
            "detail": json.dumps(detail, separators=(",", ":"))}
