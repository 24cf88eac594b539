"""The registry keeps the daemon's own state safe: sinks may not overlap it, its files are private, and the
mutation log is compacted so it stays bounded while replaying to the same state."""

from __future__ import annotations

import json
import logging
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from source_backfill.config import JobSpec
from source_backfill.errors import ConfigError, JobError, SinkPathError
from source_backfill.runtime import log_compaction, mutation_log
from source_backfill.runtime.log_compaction import compact_entries
from source_backfill.runtime.mutation_log import COMPACT_NAME, LOG_NAME
from source_backfill.runtime.registry import JobRegistry
from tests.budget import examples

SOURCES = ["events", "orders"]


def entries_of(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_bytes().splitlines() if line.strip()]


def replayed(entries: list[dict]) -> tuple:
    return JobRegistry._replayed(entries, Path("mutations.jsonl"))._fingerprint()


# -- sink paths ---------------------------------------------------------------------------------------------
@pytest.fixture
def laid_out(tmp_path: Path) -> Iterator[tuple[JobRegistry, Path, Path]]:
    """The image's layout: one data root holding the state root and the tables; job "a" has a table."""
    data = tmp_path / "data"
    state = data / "state"
    (data / "tables" / "a" / "_delta_log").mkdir(parents=True)
    reg = JobRegistry(state, SOURCES, data_root=data)
    reg.create(JobSpec(name="a", source="events", sink_path=str(data / "tables" / "a")))
    (state / "sources" / "events" / "checkpoint").mkdir(parents=True)
    (state / "kafka" / "data").mkdir(parents=True)
    (data / "tables" / "into-state").symlink_to(state)  # a symlink from the tables into the state
    try:
        yield reg, data, state
    finally:
        reg.close()


def hostile_sinks(data: Path, state: Path) -> dict[str, str]:
    tables = data / "tables"
    return {
        "the state root": str(state),
        "the state root, trailing slash": f"{state}/",
        "the state root, trailing /.": f"{state}/.",
        "the state root, doubled slashes": str(state).replace("/", "//"),
        "a .. trick into the state": f"{tables}/../state/sources",
        "a .. trick after a symlink": f"{tables}/into-state/../state",
        "a symlink into the state": f"{tables}/into-state/t",
        "the mutation log": str(state / LOG_NAME),
        "the compaction temp file": str(state / COMPACT_NAME),
        "a source's checkpoint": str(state / "sources" / "events" / "checkpoint"),
        "inside a checkpoint": str(state / "sources" / "events" / "checkpoint" / "offsets"),
        "a checkpoint of a source with no folder yet": str(state / "sources" / "orders" / "checkpoint"),
        "the broker's log folder": str(state / "kafka" / "data"),
        "a table in the broker's log folder": str(state / "kafka" / "data" / "t"),
        "the state root's parent (the data root)": str(data),
        "another job's table": str(tables / "a"),
        "another job's table, trailing slash": f"{tables}/a/",
        "another job's _delta_log": str(tables / "a" / "_delta_log"),
        "inside another job's table": str(tables / "a" / "nested"),
        "the parent of another job's table": str(tables),
        "a file:// URI of the state root": f"file://{state}",
        "a file: URI of a table": f"file:{tables}/b",
        "a NUL byte": f"{tables}/b\x00c",
    }


def test_hostile_sinks_are_refused(laid_out) -> None:
    reg, data, state = laid_out
    for what, sink in hostile_sinks(data, state).items():
        with pytest.raises(SinkPathError):
            reg.create(JobSpec(name="bad", source="events", sink_path=sink))
            pytest.fail(f"{what} was accepted: {sink!r}")
    assert [r.name for r in reg.list()] == ["a"]
    assert len(entries_of(reg.path)) == 1  # nothing refused reached the log


def test_sinks_beside_the_state_stay_allowed(laid_out) -> None:
    reg, data, _ = laid_out
    for name, sink in [("b", data / "tables" / "b"), ("ab", data / "tables" / "ab"),  # a prefix of "a"
                       ("state-copy", data / "state-copy"), ("statefoo", data / "statefoo")]:
        reg.create(JobSpec(name=name, source="events", sink_path=str(sink)))
    reg.drop("a")  # the same name re-created on its own table after a drop resumes from it
    reg.create(JobSpec(name="a", source="events", sink_path=str(data / "tables" / "a")))
    assert sorted(r.name for r in reg.list()) == ["a", "ab", "b", "state-copy", "statefoo"]


def test_a_table_whose_drop_is_pending_stays_protected(laid_out) -> None:
    reg, data, _ = laid_out
    reg.drop("a")  # its epoch loop has not applied the drop: it may still write there
    with pytest.raises(SinkPathError, match='job "a"'):
        reg.create(JobSpec(name="other", source="events", sink_path=str(data / "tables" / "a")))


def test_case_variants_of_the_state_are_refused(tmp_path: Path) -> None:
    # same folder on a case-insensitive file system: refused rather than risked (no data root here)
    reg = JobRegistry(tmp_path / "state", SOURCES)
    try:
        reg.create(JobSpec(name="a", source="events", sink_path=str(tmp_path / "tables" / "a")))
        for sink in (tmp_path / "STATE", tmp_path / "State" / "sources",
                     tmp_path / "state" / "MUTATIONS.JSONL", tmp_path / "TABLES" / "A"):
            with pytest.raises(SinkPathError):
                reg.create(JobSpec(name="bad", source="events", sink_path=str(sink)))
    finally:
        reg.close()


def test_symlinks_inside_and_around_the_state_root(tmp_path: Path) -> None:
    real = tmp_path / "real-state"
    (tmp_path / "broker-elsewhere").mkdir()
    real.mkdir()
    (real / "kafka").symlink_to(tmp_path / "broker-elsewhere")  # state that lives outside the state root
    (tmp_path / "state-link").symlink_to(real)  # the daemon is given a symlink as its state root
    reg = JobRegistry(tmp_path / "state-link", SOURCES)
    try:
        for sink in (real, real / "t", tmp_path / "broker-elsewhere", tmp_path / "broker-elsewhere" / "data"):
            with pytest.raises(SinkPathError):
                reg.create(JobSpec(name="bad", source="events", sink_path=str(sink)))
        reg.create(JobSpec(name="ok", source="events", sink_path=str(tmp_path / "tables" / "ok")))
    finally:
        reg.close()


def test_protected_paths_are_refused(tmp_path: Path) -> None:
    source_table = tmp_path / "source-table"  # e.g. a delta source's table
    reg = JobRegistry(tmp_path / "state", SOURCES, protected_paths=[source_table])
    try:
        for sink in (source_table, source_table / "_delta_log", tmp_path):
            with pytest.raises(SinkPathError):
                reg.create(JobSpec(name="bad", source="events", sink_path=str(sink)))
    finally:
        reg.close()


def test_a_job_in_the_state_from_an_old_log_still_replays(tmp_path: Path, caplog) -> None:
    state = tmp_path / "state"
    state.mkdir()
    line = {"v": 1, "type": "mutation", "id": 1, "kind": "create", "job": "old", "source": "events",
            "spec": {"name": "old", "source": "events", "sink_path": str(state / "tables" / "old")},
            "rate_limit": None, "at": "2026-01-01T00:00:00+00:00"}
    (state / LOG_NAME).write_text(json.dumps(line) + "\n")
    with caplog.at_level(logging.WARNING):
        reg = JobRegistry(state, SOURCES)  # registered before sinks were checked: kept, not a brick
    try:
        assert [r.name for r in reg.list()] == ["old"]
        assert "overlaps the daemon state" in caplog.text
    finally:
        reg.close()


# -- file modes ---------------------------------------------------------------------------------------------
@pytest.fixture
def umask_022() -> Iterator[None]:
    old = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(old)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_state_root_and_log_are_private_whatever_the_umask(tmp_path: Path, umask_022) -> None:
    reg = JobRegistry(tmp_path / "new" / "state", SOURCES)
    try:
        reg.create(JobSpec(name="a", source="events", sink_path=str(tmp_path / "t")))
        assert mode(reg.state_root) == 0o700
        assert mode(reg.path) == 0o600
        assert reg.compact()
        assert mode(reg.path) == 0o600  # the compacted log replaces it with the same mode
        for path in reg.state_root.rglob("*"):
            assert mode(path) & 0o077 == 0, path
    finally:
        reg.close()


def test_an_existing_open_state_root_and_log_are_narrowed(tmp_path: Path, umask_022) -> None:
    state = tmp_path / "state"
    state.mkdir(mode=0o755)  # what the daemon's own mkdir, or an older version, left
    (state / LOG_NAME).write_text("")
    os.chmod(state / LOG_NAME, 0o644)
    reg = JobRegistry(state, SOURCES)
    try:
        assert (mode(state), mode(state / LOG_NAME)) == (0o700, 0o600)
    finally:
        reg.close()


# -- compaction ---------------------------------------------------------------------------------------------
@pytest.fixture
def no_fsync(monkeypatch) -> None:
    """Tens of thousands of appends: durability is not what these tests measure."""
    monkeypatch.setattr(mutation_log.os, "fsync", lambda fd: None)


def test_create_drop_cycles_keep_the_log_bounded(tmp_path: Path, no_fsync) -> None:
    reg = JobRegistry(tmp_path / "state", SOURCES)
    try:
        reg.create(JobSpec(name="keeper", source="orders", sink_path=str(tmp_path / "keeper"), rate_limit=3))
        reg.pause("keeper")
        biggest = 0
        for i in range(1_000):  # ~3,000 lines: compacted every COMPACT_SLACK (1,000) lines, three times
            reg.create(JobSpec(name=f"j{i % 7}", source="events", sink_path=str(tmp_path / f"t{i}")))
            reg.drop(f"j{i % 7}")
            ids = [m.id for m in reg.drain("events")]
            reg.mark_applied(ids, epoch=i)
            biggest = max(biggest, len(reg.path.read_bytes().splitlines()) if i % 200 == 0 else 0)
        lines = len(reg.path.read_bytes().splitlines())
        bound = 2 * (4 * 1 + 2 + 1) + log_compaction.COMPACT_SLACK + 1
        assert lines <= bound and biggest <= bound
        before = reg._fingerprint()
        assert replayed(entries_of(reg.path)) == before
        next_id = reg._next_id
    finally:
        reg.close()
    again = JobRegistry(tmp_path / "state", SOURCES)
    try:
        assert again._fingerprint() == before
        assert again._next_id == next_id  # ids of removed lines are never handed out again
        assert again.get("keeper").paused and again.get("keeper").rate_limit == 3
    finally:
        again.close()


def test_pause_resume_cycles_keep_the_log_bounded(tmp_path: Path, no_fsync) -> None:
    reg = JobRegistry(tmp_path / "state", SOURCES)
    try:
        reg.create(JobSpec(name="a", source="events", sink_path=str(tmp_path / "a")))
        for i in range(3_000):
            reg.pause("a")
            reg.throttle("a", float(i))
            reg.resume("a")
            reg.mark_applied([m.id for m in reg.drain("events")], epoch=i)
        reg.set_failed("a", "boom")
        assert len(reg.path.read_bytes().splitlines()) <= 2 * 6 + log_compaction.COMPACT_SLACK + 1
        before = reg._fingerprint()
    finally:
        reg.close()
    again = JobRegistry(tmp_path / "state", SOURCES)
    try:
        assert again._fingerprint() == before and again.get("a").error == "boom"
    finally:
        again.close()


def test_a_compaction_cut_short_replays_the_log_as_it_was(tmp_path: Path, monkeypatch) -> None:
    reg = JobRegistry(tmp_path / "state", SOURCES)
    reg.create(JobSpec(name="a", source="events", sink_path=str(tmp_path / "a")))
    reg.drop("a")
    reg.mark_applied([m.id for m in reg.drain("events")], epoch=1)
    reg.create(JobSpec(name="b", source="events", sink_path=str(tmp_path / "b")))
    before = reg._fingerprint()

    def crash(*_args) -> None:
        raise KeyboardInterrupt  # the process dies between the temp file and the rename

    monkeypatch.setattr(mutation_log.os, "replace", crash)
    with pytest.raises(KeyboardInterrupt):
        reg.compact()
    monkeypatch.undo()
    reg._log.close()
    temp = reg.state_root / COMPACT_NAME
    assert temp.exists()
    temp.write_bytes(temp.read_bytes()[:40])  # and a torn one at that
    again = JobRegistry(tmp_path / "state", SOURCES)
    try:
        assert again._fingerprint() == before and not temp.exists()
    finally:
        again.close()


def test_a_failed_compaction_keeps_the_log_and_the_registry_working(tmp_path: Path, monkeypatch) -> None:
    reg = JobRegistry(tmp_path / "state", SOURCES)
    try:
        reg.create(JobSpec(name="a", source="events", sink_path=str(tmp_path / "a")))
        log = reg.path.read_bytes()

        def full(*_args) -> None:
            raise OSError(28, "No space left on device")

        monkeypatch.setattr(mutation_log.os, "replace", full)
        assert not reg.compact()
        monkeypatch.undo()
        assert reg.path.read_bytes() == log and not (reg.state_root / COMPACT_NAME).exists()
        reg.pause("a")
        assert replayed(entries_of(reg.path)) == reg._fingerprint()
    finally:
        reg.close()


def test_compaction_runs_at_open_and_old_logs_replay(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(log_compaction, "COMPACT_SLACK", 10)
    state = tmp_path / "state"
    state.mkdir()
    lines = []  # a log written before compaction existed: no next_id anywhere
    for i in range(1, 41, 2):
        lines.append({"v": 1, "type": "mutation", "id": i, "kind": "create", "job": "a", "source": "events",
                      "spec": {"name": "a", "source": "events", "sink_path": "/t/a"}, "rate_limit": None,
                      "at": AT})
        lines.append({"v": 1, "type": "mutation", "id": i + 1, "kind": "drop", "job": "a",
                      "source": "events", "spec": None, "rate_limit": None, "at": AT})
        lines.append({"v": 1, "type": "applied", "ids": [i, i + 1], "epoch": i})
    (state / LOG_NAME).write_text("".join(json.dumps(e) + "\n" for e in lines))
    before = replayed(lines)
    reg = JobRegistry(state, SOURCES)
    try:
        assert reg._fingerprint() == before
        assert len(entries_of(reg.path)) == 1  # only the marker carrying next_id
        assert reg.create(JobSpec(name="a", source="events", sink_path="/t/a")) and reg._next_id == 42
    finally:
        reg.close()


# -- property: replay(compact(log)) == replay(log) -----------------------------------------------------
NAMES = ["a", "b", "c"]
AT = "2026-01-01T00:00:00+00:00"


@st.composite
def raw_logs(draw) -> list[dict]:
    """Any sequence of valid lines, including ones the API never writes (create over a live job, markers of
    unknown or not yet written ids, failures of dropped jobs), with increasing mutation ids."""
    out: list[dict] = []
    next_id = 1
    for _ in range(draw(st.integers(0, 40))):
        kind = draw(st.sampled_from(["create", "pause", "resume", "throttle", "drop", "retry", "failed",
                                     "applied", "applied"]))
        job = draw(st.sampled_from(NAMES))
        if kind == "failed":
            out.append({"v": 1, "type": "failed", "job": job, "error": draw(st.sampled_from(["x", "y"])),
                        "at": AT})
        elif kind == "applied":
            ids = draw(st.lists(st.integers(1, next_id + 1), max_size=4))
            out.append({"v": 1, "type": "applied", "ids": ids, "epoch": len(out)})
        else:
            next_id += draw(st.integers(0, 2))  # gaps, as a compacted log leaves
            spec = {"name": job, "source": "events", "sink_path": f"/t/{job}",
                    "rate_limit": draw(st.sampled_from([None, 1.0]))} if kind == "create" else None
            out.append({"v": 1, "type": "mutation", "id": next_id, "kind": kind, "job": job,
                        "source": "events", "spec": spec,
                        "rate_limit": draw(st.sampled_from([None, 2.0, 0.0])) if kind == "throttle" else None,
                        "at": f"2026-01-01T00:00:{len(out) % 60:02d}+00:00"})
            next_id += 1
    return out


@settings(max_examples=examples(400), deadline=None)
@given(log=raw_logs())
def test_compaction_replays_to_the_same_state(log: list[dict]) -> None:
    compacted = compact_entries(log)
    assert replayed(compacted) == replayed(log)
    assert compact_entries(compacted)[:-1] == compacted[:-1]  # nothing more to remove the second time
    assert len(compacted) <= len(log) + 1


operations = st.lists(st.tuples(
    st.sampled_from(["create", "pause", "resume", "throttle", "drop", "retry", "fail", "apply", "drain",
                     "compact", "restart"]),
    st.sampled_from(NAMES), st.integers(0, 3)), max_size=40)


@settings(max_examples=examples(60), deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=operations)
def test_the_registry_compacts_to_its_own_state(tmp_path_factory, ops) -> None:
    """Random API and epoch-loop calls, compactions and restarts in between: the state never changes."""
    state = tmp_path_factory.mktemp("state")
    reg = JobRegistry(state, SOURCES)
    drained: list[int] = []
    try:
        for op, job, n in ops:
            try:
                if op == "create":
                    reg.create(JobSpec(name=job, source=SOURCES[n % 2], sink_path=f"/t/{job}{n}"))
                elif op in ("pause", "resume", "drop", "retry"):
                    getattr(reg, op)(job)
                elif op == "throttle":
                    reg.throttle(job, float(n) if n else None)
                elif op == "fail":
                    reg.set_failed(job, f"error {n}")
            except (JobError, ConfigError):
                pass  # not found, exists, overlaps: refused, as the API would
            if op == "drain":
                drained += [m.id for m in reg.drain(SOURCES[n % 2])]
            elif op == "apply" and drained:
                reg.mark_applied(drained[: n + 1], epoch=n)
                drained = drained[n + 1:]
            elif op == "compact":
                before = reg._fingerprint()
                assert reg.compact()
                assert reg._fingerprint() == before == replayed(entries_of(reg.path))
            elif op == "restart":
                before = reg._fingerprint()
                reg.close()
                reg = JobRegistry(state, SOURCES)
                drained = []
                assert reg._fingerprint() == before
            assert replayed(compact_entries(entries_of(reg.path))) == replayed(entries_of(reg.path))
    finally:
        reg.close()


# -- a table another job wrote ------------------------------------------------------------------------------
def _table_of(path: Path, job: str | None) -> None:
    import pyarrow as pa
    from deltalake import CommitProperties, write_deltalake

    from connectors.delta.log import KEY_JOB

    meta = {KEY_JOB: job} if job is not None else {}
    write_deltalake(str(path), pa.table({"x": [1]}), commit_properties=CommitProperties(custom_metadata=meta))


def test_a_sink_holding_a_table_another_job_wrote_is_refused_at_create(tmp_path: Path) -> None:
    from source_backfill.errors import SinkConflictError

    reg = JobRegistry(tmp_path / "state", SOURCES)
    try:
        _table_of(tmp_path / "old", "dropped-long-ago")  # its job is not registered any more
        with pytest.raises(SinkConflictError, match='written by job "dropped-long-ago"'):
            reg.create(JobSpec(name="new", source="events", sink_path=str(tmp_path / "old")))
        with pytest.raises(SinkConflictError, match="inside an existing Delta table"):
            reg.create(JobSpec(name="new", source="events", sink_path=str(tmp_path / "old" / "sub")))
        assert reg.list() == [] and not (tmp_path / "old" / "sub").exists()
        # the same name resumes its own table; a table no job wrote is left to the sink's schema check
        reg.create(JobSpec(name="dropped-long-ago", source="events", sink_path=str(tmp_path / "old")))
        _table_of(tmp_path / "plain", None)
        reg.create(JobSpec(name="plain", source="events", sink_path=str(tmp_path / "plain")))
        # another registered job's table is a conflict too (409), not only a bad path
        with pytest.raises(SinkConflictError, match='job "plain"'):
            reg.create(JobSpec(name="third", source="events", sink_path=str(tmp_path / "plain")))
    finally:
        reg.close()


def test_a_dead_letter_table_is_a_table_of_its_job_no_other_job_may_overlap(tmp_path: Path) -> None:
    """A job's dead-letter table (``<sink_path>_dead_letters``) is protected like its own table, both ways."""
    from source_backfill.errors import SinkConflictError

    avro = {"value": "avro", "on_decode_error": "dead_letter"}
    reg = JobRegistry(tmp_path / "state", SOURCES)
    try:
        reg.create(JobSpec(name="typed", source="events", sink_path=str(tmp_path / "t"), format=avro))
        with pytest.raises(SinkConflictError, match='job "typed"'):
            reg.create(JobSpec(name="thief", source="events", sink_path=str(tmp_path / "t_dead_letters")))
        with pytest.raises(SinkConflictError, match='job "typed"'):
            reg.create(JobSpec(name="in", source="events", sink_path=str(tmp_path / "t_dead_letters" / "x")))
        reg.create(JobSpec(name="raw", source="events", sink_path=str(tmp_path / "r_dead_letters")))
        with pytest.raises(SinkConflictError, match='job "raw"'):  # its dead letters would be raw's table
            reg.create(JobSpec(name="late", source="events", sink_path=str(tmp_path / "r"), format=avro))
        assert sorted(r.name for r in reg.list()) == ["raw", "typed"]
    finally:
        reg.close()
