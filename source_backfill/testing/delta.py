"""A keyed Delta table that keeps changing: the upstream of table-backfill tests, the demo and the bench.

``ChangingTable.create(path, rows)`` writes ``rows`` rows ``(id, v, note)`` with change data feed on;
``commit()`` makes one new version of random inserts, updates and deletes (of any key: rows a job has
copied already, rows it has not reached, rows right at its position); ``run(stop)`` keeps committing
until ``stop`` is set. ``expected()`` is the latest version as ``{id: (v, note)}``.
"""

from __future__ import annotations

import random
import threading
from typing import Any

import pyarrow as pa

SCHEMA = pa.schema([("id", pa.int64()), ("v", pa.int64()), ("note", pa.string())])


class ChangingTable:
    """The writer of one keyed table (``id`` is the primary key)."""

    def __init__(self, path: str, seed: int = 0) -> None:
        self.path = path
        self.rng = random.Random(seed)  # noqa: S311 - test data, reproducible by seed
        self.next_id = 0
        self.versions = 0

    @classmethod
    def create(cls, path: str, rows: int, seed: int = 0, *, files: int = 1) -> ChangingTable:
        """A new table of ``rows`` rows (even ids, so inserts can land between them), CDF on.

        ``files``: written in that many slices, a data file each (one version per slice).
        """
        from deltalake import write_deltalake

        table = cls(path, seed)
        ids = list(range(0, rows * 2, 2))
        size = -(-len(ids) // files)
        for i in range(0, max(1, len(ids)), size or 1):
            write_deltalake(path, _rows(ids[i:i + size], 0), mode="append" if i else "error",
                            configuration=None if i else {"delta.enableChangeDataFeed": "true"})
        table.next_id = rows * 2
        return table

    def _keys(self, n: int) -> list[int]:
        return sorted({self.rng.randrange(max(1, self.next_id)) for _ in range(n)})

    def commit(self) -> str:
        """One version: an insert batch, an update, a delete or an upsert; returns which."""
        from deltalake import DeltaTable, write_deltalake

        roll = self.rng.random()
        if roll < 0.3:
            fresh = [self.next_id + i for i in range(self.rng.randint(1, 20))]
            gaps = [k | 1 for k in self._keys(5)]  # odd ids fill the gaps between the first rows
            self.next_id += len(fresh)
            present = set(DeltaTable(self.path).to_pyarrow_table(columns=["id"]).column("id").to_pylist())
            write_deltalake(self.path, _rows(sorted(set(fresh + gaps) - present), self.versions + 1),
                            mode="append")
            kind = "insert"
        elif roll < 0.6:
            keys = self._keys(self.rng.randint(1, 30))
            DeltaTable(self.path).update(updates={"v": f"v + {self.rng.randint(1, 9)}",
                                                  "note": f"'u{self.versions + 1}'"},
                                         predicate=f"id IN ({','.join(map(str, keys))})")
            kind = "update"
        elif roll < 0.85:
            keys = self._keys(self.rng.randint(1, 20))
            DeltaTable(self.path).delete(f"id IN ({','.join(map(str, keys))})")
            kind = "delete"
        else:  # an upsert: some keys updated, some inserted, in one version
            keys = self._keys(self.rng.randint(1, 20))
            (DeltaTable(self.path).merge(_rows(keys, self.versions + 1), predicate="t.id = s.id",
                                         source_alias="s", target_alias="t")
             .when_matched_update_all().when_not_matched_insert_all().execute())
            kind = "upsert"
        self.versions += 1
        return kind

    def run(self, stop: threading.Event, pause_s: float = 0.05) -> None:
        """Commit until ``stop`` is set."""
        while not stop.is_set():
            self.commit()
            stop.wait(pause_s)

    def expected(self) -> dict[int, tuple[Any, Any]]:
        """The latest version: ``{id: (v, note)}``."""
        from deltalake import DeltaTable

        return as_rows(DeltaTable(self.path).to_pyarrow_table())

    def writer_thread(self, pause_s: float = 0.05) -> tuple[threading.Thread, threading.Event]:
        """A started thread running :meth:`run`, and the event that stops it."""
        stop = threading.Event()
        thread = threading.Thread(target=self.run, args=(stop, pause_s), name="changing-table", daemon=True)
        thread.start()
        return thread, stop


def as_rows(table: pa.Table) -> dict[int, tuple[Any, Any]]:
    """``{id: (v, note)}`` of a table with the writer's columns (duplicated ids raise)."""
    out: dict[int, tuple[Any, Any]] = {}
    for r in table.select(["id", "v", "note"]).to_pylist():
        if r["id"] in out:
            msg = f"id {r['id']} appears twice"
            raise AssertionError(msg)
        out[r["id"]] = (r["v"], r["note"])
    return out


def replay_changelog(table: pa.Table) -> dict[int, tuple[Any, Any]]:
    """A changelog (``_change_type``, ordered by ``_epoch``, ``_seq``) replayed strictly into rows.

    An insert of a key already there, or an update or delete of a missing one, is a duplicate or a loss
    and raises.
    """
    rows: dict[int, tuple[Any, Any]] = {}
    ordered = sorted(table.to_pylist(), key=lambda r: (r["_epoch"], r["_seq"]))
    for r in ordered:
        kind, key = r["_change_type"], r["id"]
        if kind == "insert":
            if key in rows:
                msg = f"key {key} inserted twice (epoch {r['_epoch']})"
                raise AssertionError(msg)
            rows[key] = (r["v"], r["note"])
        elif kind == "update_postimage":
            if key not in rows:
                msg = f"update of key {key} the changelog lacks (epoch {r['_epoch']})"
                raise AssertionError(msg)
            rows[key] = (r["v"], r["note"])
        elif kind == "delete":
            if key not in rows:
                msg = f"delete of key {key} the changelog lacks (epoch {r['_epoch']})"
                raise AssertionError(msg)
            del rows[key]
    return rows


def _rows(ids: list[int], version: int) -> pa.Table:
    notes = [f"r{version}"] * len(ids)
    return pa.table({"id": ids, "v": [i % 97 for i in ids], "note": notes}, schema=SCHEMA)
