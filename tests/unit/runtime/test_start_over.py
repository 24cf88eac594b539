"""Starting over after a recreated topic, the registry's part (issue 49): a failed job retried from the
earliest offsets into a new table, recorded in its ``retry`` line; a source's reset recorded in a
``reset`` line.

Every path of a new table is untrusted input: each attack the registry refuses is kept here (outside the
data root, ``..``, another namespace's folder, another job's table, the old table, an existing table, a
job that has not failed, an unknown or dropped job). A log written by the previous code (a plain ``retry``
line, no new field) is recovered as it meant.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest

from source_backfill.config import JobSpec, NamespaceConfig, RetrySpec
from source_backfill.errors import (
    ConfigError,
    JobNotFailedError,
    JobNotFoundError,
    SinkConflictError,
    SinkPathError,
    SourceNotFoundError,
)
from source_backfill.runtime.progress import JobProgress
from source_backfill.runtime.registry import LOG_NAME, JobRegistry

SOURCES = ["events", "orders"]
NEW = RetrySpec.model_validate({"from": "earliest", "new_table": True})


def into(sink: str) -> RetrySpec:
    return RetrySpec.model_validate({"from": "earliest", "new_table": True, "sink": sink})


@pytest.fixture
def data(tmp_path: Path) -> Path:
    root = tmp_path / "data"
    (root / "team-a").mkdir(parents=True)
    (root / "team-b").mkdir(parents=True)
    return root


@pytest.fixture
def opened(tmp_path: Path, data: Path):
    made: list[JobRegistry] = []

    def make(**kw) -> JobRegistry:
        reg = JobRegistry(tmp_path / "state", SOURCES, data_root=data,
                          namespaces=[NamespaceConfig(name="team-a"), NamespaceConfig(name="team-b")], **kw)
        made.append(reg)
        return reg

    yield make
    for reg in made:
        reg.close()


def failed_job(reg: JobRegistry, data: Path, name: str = "a", **kw) -> JobSpec:
    spec = JobSpec(name=name, source="events", sink_path=str(data / name),
                   start={"kind": "offsets", "offsets": {"t:0": 5}}, **kw)
    reg.create(spec)
    reg.mark_applied([m.id for m in reg.drain("events")], 1)
    reg.set_failed(name, "topic t was deleted and created again")
    return spec


def test_a_failed_job_retried_into_a_new_table_gets_the_next_free_path_and_the_earliest_start(opened, data):
    reg = opened()
    old = failed_job(reg, data)
    reg.publish_progress("a", JobProgress(epoch=9, status="failed", rows_history=5, rows_live=0, splits=[]))
    record = reg.retry("a", new_table=NEW, by="alice")
    assert record.error is None
    assert record.spec.sink_path == str(data / "a-2") and record.spec.start.kind == "earliest"
    same = {"sink_path", "start"}
    assert record.spec.model_dump(exclude=same) == old.model_dump(exclude=same)
    assert reg.progress("a") is None  # the old table's progress is not the new one's
    [m] = reg.drain("events")
    assert (m.kind, m.job, m.spec) == ("retry", "a", record.spec)
    assert not (data / "a-2").exists()  # the table is the job's to write, at its first epoch
    reg.close()
    again = opened()  # the line carries the new spec: it survives a restart, and the queue holds it again
    assert again.get("a").spec == record.spec and again.get("a").error is None
    assert [m.kind for m in again.drain("events")] == ["retry"]


def test_the_default_path_skips_what_exists_and_other_jobs_tables(opened, data):
    reg = opened()
    failed_job(reg, data)
    (data / "a-2").mkdir()  # something is there: not a new table
    reg.create(JobSpec(name="b", source="events", sink_path=str(data / "a-3")))  # another job's
    assert reg.retry("a", new_table=NEW).spec.sink_path == str(data / "a-4")


def test_a_second_start_over_numbers_on(opened, data):
    reg = opened()
    failed_job(reg, data)
    reg.retry("a", new_table=NEW)
    (data / "a-2").mkdir()  # its table was written
    reg.set_failed("a", "again")
    assert reg.retry("a", new_table=NEW).spec.sink_path == str(data / "a-2-2")


def test_a_given_sink_is_used_as_it_is_given(opened, data):
    reg = opened()
    failed_job(reg, data)
    (data / "fresh").mkdir()  # an empty folder made for it is fine
    assert reg.retry("a", new_table=into(str(data / "fresh"))).spec.sink_path == str(data / "fresh")


@pytest.mark.parametrize(("sink", "error"), [
    ("/etc/evil", SinkPathError),  # outside the data root
    ("{data}/../escape", SinkPathError),  # '..' out of it
    ("{data}/team-a/../../escape", SinkPathError),
    ("{data}/a", SinkConflictError),  # the old table itself
    ("{data}/a/inside", SinkConflictError),  # inside the old table
    ("{data}/b", SinkConflictError),  # another job's table
    ("{data}/b/x", SinkConflictError),  # inside it
    ("{data}", SinkConflictError),  # containing the tables
    ("{data}/done", SinkConflictError),  # an existing Delta table: not new
    ("{state}", SinkPathError),  # the daemon's state
    ("{state}/sources/events", SinkPathError),
    ("s3://bucket/t", SinkPathError),  # a URI
    ("{data}/nul\x00byte", SinkPathError),
    ("{data}/file", SinkPathError),  # an existing file
])
def test_attacks_on_the_new_tables_path_are_refused_and_change_nothing(opened, data, tmp_path, sink, error):
    reg = opened()
    failed_job(reg, data)
    reg.create(JobSpec(name="b", source="events", sink_path=str(data / "b")))
    (data / "done" / "_delta_log").mkdir(parents=True)
    (data / "file").write_text("x")
    before = (reg.path.read_bytes(), reg.get("a"))
    with pytest.raises(error):
        reg.retry("a", new_table=into(sink.format(data=data, state=tmp_path / "state")))
    assert (reg.path.read_bytes(), reg.get("a")) == before


def test_a_job_of_a_namespace_gets_its_new_table_in_its_folder_only(opened, data):
    reg = opened()
    spec = JobSpec(name="team-a.j", namespace="team-a", source="events", sink_path=str(data / "team-a" / "j"))
    reg.create(spec)
    reg.set_failed("team-a.j", "boom")
    with pytest.raises(SinkPathError, match="namespace 'team-a'"):
        reg.retry("team-a.j", new_table=into(str(data / "team-b" / "j")))  # another namespace's folder
    with pytest.raises(SinkPathError, match="namespace 'team-a'"):
        reg.retry("team-a.j", new_table=into(str(data / "team-a" / ".." / "team-b" / "j")))
    assert reg.get("team-a.j").error == "boom"
    assert reg.retry("team-a.j", new_table=NEW).spec.sink_path == str(data / "team-a" / "j-2")


def test_only_a_failed_live_job_is_retried_into_a_new_table(opened, data):
    reg = opened()
    reg.create(JobSpec(name="running", source="events", sink_path=str(data / "running")))
    with pytest.raises(JobNotFailedError, match="has not failed"):
        reg.retry("running", new_table=NEW)
    with pytest.raises(JobNotFoundError):
        reg.retry("ghost", new_table=NEW)
    failed_job(reg, data, "gone")
    reg.drop("gone")
    with pytest.raises(JobNotFoundError):
        reg.retry("gone", new_table=NEW)
    assert reg.get("running").spec.sink_path == str(data / "running")


def test_the_create_checks_run_on_the_new_spec(opened, data):
    seen: list[JobSpec] = []

    def check(spec: JobSpec) -> None:
        seen.append(spec)
        if spec.name == "bad" and spec.start.kind == "earliest":  # its retry's spec, not its create's
            msg = "transform refused"
            raise ConfigError(msg)

    reg = opened(check_spec=check)
    failed_job(reg, data)
    failed_job(reg, data, "bad")
    seen.clear()
    with pytest.raises(ConfigError, match="transform refused"):
        reg.retry("bad", new_table=NEW)
    assert reg.get("bad").error is not None
    reg.retry("a", new_table=NEW)
    assert [s.sink_path for s in seen] == [str(data / "bad-2"), str(data / "a-2")]


def test_a_dead_letter_table_moves_with_the_new_table(opened, data):
    reg = opened()
    failed_job(reg, data, format={"value": "avro", "on_decode_error": "dead_letter"})
    (data / "a-2_dead_letters").mkdir()  # its dead-letter path taken: the next number
    record = reg.retry("a", new_table=NEW)
    assert record.spec.tables == [str(data / "a-3"), str(data / "a-3_dead_letters")]


# -- the log: the previous code's lines, compaction --------------------------------------------------------
def test_a_log_of_the_previous_code_with_a_plain_retry_line_is_recovered_as_it_meant(tmp_path):
    """Lines exactly as the code before this change wrote them: a retry has ``"spec": null``, no new field."""
    at = "2026-11-28T10:00:00+00:00"
    spec = JobSpec(name="a", source="events", sink_path="/tables/a").model_dump(mode="json")
    lines = [
        {"v": 1, "type": "mutation", "id": 1, "kind": "create", "job": "a", "source": "events", "spec": spec,
         "rate_limit": None, "by": "alice", "request_id": "r1", "at": at},
        {"v": 1, "type": "applied", "ids": [1], "epoch": 3},
        {"v": 1, "type": "failed", "job": "a", "error": "boom", "at": at},
        {"v": 1, "type": "mutation", "id": 2, "kind": "retry", "job": "a", "source": "events", "spec": None,
         "rate_limit": None, "at": at},
    ]
    state = tmp_path / "state"
    state.mkdir()
    (state / LOG_NAME).write_text("".join(json.dumps(line) + "\n" for line in lines))
    reg = JobRegistry(state, SOURCES)
    record = reg.get("a")
    assert record.error is None and record.spec.sink_path == "/tables/a"
    [m] = reg.drain("events")
    assert (m.id, m.kind, m.spec) == (2, "retry", None)  # a plain retry: rebuilt from its own table
    assert reg.compact()
    reg.close()
    again = JobRegistry(state, SOURCES)
    assert again.get("a").spec.sink_path == "/tables/a" and again.get("a").error is None
    again.close()


def test_compaction_keeps_the_new_table_after_later_failures_and_retries(opened, data):
    reg = opened()
    failed_job(reg, data)
    reg.retry("a", new_table=NEW)
    reg.mark_applied([m.id for m in reg.drain("events")], 2)
    reg.set_failed("a", "again")  # a later failure and a plain retry set the error: not the spec
    reg.retry("a")
    reg.mark_applied([m.id for m in reg.drain("events")], 3)
    for _ in range(3):
        reg.pause("a")
        reg.resume("a")
    reg.mark_applied([m.id for m in reg.drain("events")], 4)
    before = reg.get("a")
    assert reg.compact()
    reg.close()
    again = opened()
    assert again.get("a") == before and again.get("a").spec.sink_path == str(data / "a-2")


# -- a source's reset ------------------------------------------------------------------------------------
def test_a_reset_is_a_durable_line_of_the_source_pending_until_applied(opened, data):
    reg = opened(audit=True)
    failed_job(reg, data)
    m, at = reg.reset_source("events", by="root")
    assert (m.kind, m.job, m.source, m.by) == ("reset", "", "events", "root")
    assert at.tzinfo is not None and abs((datetime.now(UTC) - at).total_seconds()) < 60
    assert reg.pending_resets("events") == [(m, at)] and reg.pending_resets("orders") == []
    assert reg.get("a").error is not None  # a job's state is not the reset's to change
    [row] = [r for r in reg.audit_rows() if r["kind"] == "reset"]
    assert (row["job"], row["namespace"], row["source"], row["by"]) == ("", "*", "events", "root")
    assert json.loads(row["detail"])["moved_to"].startswith("sources/events.reset-")
    assert reg.compact()  # a compaction keeps it, with its time
    reg.close()
    again = opened(audit=True)  # replayed: still pending, at the same time (its folder's name)
    assert again.pending_resets("events") == [(m, at)]
    [drained] = again.drain("events")  # the source's first epoch after it marks it applied
    again.mark_applied([drained.id], 0)
    assert again.pending_resets("events") == []
    assert again.compact()
    again.close()
    assert opened(audit=True).pending_resets("events") == []


def test_a_reset_of_an_unknown_source_is_refused(opened):
    reg = opened()
    before = reg.path.read_bytes()
    with pytest.raises(SourceNotFoundError):
        reg.reset_source("nope")
    assert reg.path.read_bytes() == before
