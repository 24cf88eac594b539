"""The audit table: one row per accepted mutation id, with its principal, also across a crash between a
mutation's line and its row, and for a log written before principals were recorded."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from source_backfill.config import JobSpec, RepairSpec
from source_backfill.runtime import audit as audit_module
from source_backfill.runtime.audit import AuditTable
from source_backfill.runtime.registry import JobRegistry


def _spec(name: str, tmp: Path, **kw) -> JobSpec:
    return JobSpec(name=name, source="events", sink_path=str(tmp / "tables" / name), **kw)


def _mutate(registry: JobRegistry, tmp: Path) -> None:
    registry.create(_spec("a", tmp), by="alice")
    registry.create(_spec("team-b.x", tmp, namespace="team-b"), by="bob")
    registry.pause("a", by="carol")
    registry.throttle("a", 5.0, by="carol")
    registry.repair("a", RepairSpec(from_offset=0, to_offset=10), by="dave")
    registry.retransform("a", "SELECT * FROM {source}", by="alice")
    registry.drop("team-b.x", by="bob")


def test_each_accepted_mutation_is_one_row_naming_who_asked(tmp_path):
    registry = JobRegistry(tmp_path / "state", ["events"], audit=True)
    _mutate(registry, tmp_path)
    rows = registry.audit_rows()
    assert [(r["id"], r["kind"], r["job"], r["namespace"], r["by"]) for r in rows] == [
        (1, "create", "a", "default", "alice"), (2, "create", "team-b.x", "team-b", "bob"),
        (3, "pause", "a", "default", "carol"), (4, "throttle", "a", "default", "carol"),
        (5, "repair", "a", "default", "dave"), (6, "retransform", "a", "default", "alice"),
        (7, "drop", "team-b.x", "team-b", "bob")]
    assert json.loads(rows[3]["detail"]) == {"rate_limit": 5.0}
    assert json.loads(rows[5]["detail"]) == {"transform": "SELECT * FROM {source}"}
    registry.close()
    # reopened: nothing copied twice
    again = JobRegistry(tmp_path / "state", ["events"], audit=True)
    assert [r["id"] for r in again.audit_rows()] == list(range(1, 8))
    again.close()


def test_rows_a_crash_cut_are_copied_at_the_next_open_each_once(tmp_path, monkeypatch):
    registry = JobRegistry(tmp_path / "state", ["events"], audit=True)
    registry.create(_spec("a", tmp_path), by="alice")
    real = audit_module.AuditTable.flush

    def failing(self: AuditTable) -> bool:  # the rows' writes never happen: as a kill right after the line
        return False

    monkeypatch.setattr(audit_module.AuditTable, "flush", failing)
    registry.pause("a", by="carol")
    registry.resume("a", by="carol")
    assert [r["id"] for r in registry.audit_rows()] == [1]  # the lines are durable, their rows not
    registry.close()  # the process dies with the rows pending
    monkeypatch.setattr(audit_module.AuditTable, "flush", real)
    reopened = JobRegistry(tmp_path / "state", ["events"], audit=True)
    rows = reopened.audit_rows()
    assert [(r["id"], r["kind"], r["by"]) for r in rows] == [(1, "create", "alice"), (2, "pause", "carol"),
                                                             (3, "resume", "carol")]
    reopened.close()


def test_a_failed_row_write_is_retried_with_the_next_and_compaction_waits(tmp_path, monkeypatch):
    registry = JobRegistry(tmp_path / "state", ["events"], audit=True)
    registry.create(_spec("a", tmp_path), by="alice")
    calls = {"n": 0}
    import deltalake

    original = deltalake.write_deltalake

    def full_disk(*a, **kw):
        calls["n"] += 1
        if calls["n"] == 1:
            raise OSError(28, "No space left on device")
        return original(*a, **kw)

    monkeypatch.setattr(deltalake, "write_deltalake", full_disk)
    registry.pause("a", by="carol")  # its row fails: pending
    compactions = []
    monkeypatch.setattr(registry._compactor, "maybe", lambda needed: compactions.append(needed))  # noqa: SLF001
    registry._maybe_compact()  # noqa: SLF001
    assert compactions == []  # not while a row is pending
    registry.resume("a", by="carol")  # written with the pending one, in one commit
    assert [r["id"] for r in registry.audit_rows()] == [1, 2, 3]
    registry.close()


def test_a_log_written_before_principals_were_recorded_recovers_with_no_principal(tmp_path):
    state = tmp_path / "state"
    state.mkdir()
    spec = _spec("old", tmp_path).model_dump(mode="json")
    spec.pop("namespace")  # the previous release's spec had no namespace
    lines = [
        {"v": 1, "type": "mutation", "id": 1, "kind": "create", "job": "old", "source": "events",
         "spec": spec, "rate_limit": None, "at": "2026-11-27T10:00:00+00:00"},
        {"v": 1, "type": "applied", "ids": [1], "epoch": 3},
        {"v": 1, "type": "mutation", "id": 2, "kind": "pause", "job": "old", "source": "events",
         "spec": None, "rate_limit": None, "at": "2026-11-27T10:01:00+00:00"},
    ]
    (state / "mutations.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    registry = JobRegistry(state, ["events"], audit=True)
    assert registry.get("old").paused and registry.get("old").spec.namespace == "default"
    assert [(r["id"], r["kind"], r["by"], r["namespace"]) for r in registry.audit_rows()] == [
        (1, "create", None, "default"), (2, "pause", None, "default")]
    registry.pause("old", by="alice")  # no-op: already paused
    registry.resume("old", by="alice")
    assert registry.audit_rows()[-1]["by"] == "alice"
    registry.close()


@pytest.mark.parametrize("audit", [False, True])
def test_the_audit_table_is_state_no_sink_may_take(tmp_path, audit):
    from source_backfill.errors import SinkPathError

    registry = JobRegistry(tmp_path / "state", ["events"], audit=audit)
    with pytest.raises(SinkPathError):
        registry.create(JobSpec(name="x", source="events", sink_path=str(tmp_path / "state" / "audit")))
    registry.close()


def test_refusals_are_written_in_batches_and_a_flood_is_counted_not_kept(tmp_path, monkeypatch):
    from source_backfill import metrics
    from source_backfill.runtime.audit import RefusalTable

    monkeypatch.setattr(RefusalTable, "MAX_PENDING", 3)
    table = RefusalTable(tmp_path, flush_every_s=3600)  # written only when asked here
    before = metrics.AUDIT_REFUSALS_DROPPED._value.get()
    for i in range(5):
        table.record({"at": f"2026-11-29T00:00:0{i}", "by": None, "status": 401,
                      "reason": "missing bearer token", "method": "GET", "path": "/jobs",
                      "secret": "never a column"})
    assert metrics.AUDIT_REFUSALS_DROPPED._value.get() - before == 2
    rows = table.rows()  # the waiting ones written first, in one commit
    assert [r["at"][-1] for r in rows] == ["0", "1", "2"] and "secret" not in rows[0]
    table.record({"at": "2026-11-29T00:00:09", "status": 403, "reason": "r", "method": "GET", "path": "/"})
    table.close()  # what waits is written at close
    assert len(RefusalTable(tmp_path).rows()) == 4
    from deltalake import DeltaTable

    assert DeltaTable(str(tmp_path / "audit_refused")).version() == 1  # two commits: two batches
