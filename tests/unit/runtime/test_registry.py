"""The job registry: durable mutation log, replay after restart, queue semantics, thread safety."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from source_backfill.config import JobSpec, OffsetsStart
from source_backfill.errors import (
    ConfigError,
    JobExistsError,
    JobNotFoundError,
    MutationLogError,
    SourceNotFoundError,
    StateFormatError,
)
from source_backfill.runtime.progress import JobProgress, SplitProgress
from source_backfill.runtime.registry import LOG_NAME, JobRegistry

SOURCES = ["events", "orders"]


def spec(name: str = "j", source: str = "events", **kw) -> JobSpec:
    return JobSpec(name=name, source=source, sink_path=f"/tables/{name}", **kw)


@pytest.fixture
def registry_factory(tmp_path: Path):
    opened: list[JobRegistry] = []

    def make(sources=SOURCES) -> JobRegistry:
        reg = JobRegistry(tmp_path, sources)
        opened.append(reg)
        return reg

    yield make
    for reg in opened:
        reg.close()


def test_create_get_list(registry_factory) -> None:
    reg = registry_factory()
    rec = reg.create(spec("a", rate_limit=5.0))
    reg.create(spec("b", source="orders"))
    assert rec.name == "a" and rec.source == "events"
    assert (rec.paused, rec.rate_limit, rec.dropped, rec.error) == (False, 5.0, False, None)
    assert reg.get("a") == rec
    assert [r.name for r in reg.list()] == ["a", "b"]


def test_error_cases(registry_factory) -> None:
    reg = registry_factory()
    reg.create(spec("a"))
    with pytest.raises(JobExistsError):
        reg.create(spec("a"))
    with pytest.raises(SourceNotFoundError):
        reg.create(spec("x", source="nope"))
    for call in (reg.pause, reg.resume, reg.drop, reg.get):
        with pytest.raises(JobNotFoundError):
            call("missing")
    with pytest.raises(JobNotFoundError):
        reg.throttle("missing", 1.0)
    with pytest.raises(ConfigError):
        reg.throttle("a", -1.0)
    with pytest.raises(ConfigError):
        reg.throttle("a", float("nan"))
    # nothing but the one create reached the log
    assert len((reg.path).read_text().splitlines()) == 1


def test_flags_and_queue(registry_factory) -> None:
    reg = registry_factory()
    reg.create(spec("a"))
    reg.create(spec("b", source="orders"))
    assert reg.pause("a").paused
    assert reg.pause("a").paused  # already paused: no new mutation
    assert reg.throttle("a", 0.0).rate_limit == 0.0
    assert not reg.resume("a").paused
    events = reg.drain("events")
    assert [(m.kind, m.job) for m in events] == [("create", "a"), ("pause", "a"), ("throttle", "a"),
                                                  ("resume", "a")]
    assert events[0].spec == spec("a") and events[2].rate_limit == 0.0
    assert [m.id for m in events] == sorted(m.id for m in events)
    assert reg.drain("events") == []  # handed over once
    assert [(m.kind, m.job) for m in reg.drain("orders")] == [("create", "b")]
    assert reg.pending("a") == 4
    reg.mark_applied([m.id for m in events], epoch=3)
    assert reg.pending("a") == 0


def test_state_survives_restart(registry_factory) -> None:
    reg = registry_factory()
    reg.create(spec("a", start=OffsetsStart(offsets={"t:0": 5}), transform="SELECT value FROM {source}"))
    reg.create(spec("b", source="orders"))
    reg.pause("a")
    reg.throttle("b", 12.5)
    reg.create(spec("c"))
    reg.drop("c")
    before = {r.name: r for r in reg.list()}
    assert set(before) == {"a", "b"}  # "c" is dropped: not listed, still readable until applied
    dropped = reg.get("c")
    reg.close()

    again = registry_factory()
    after = {r.name: r for r in again.list()}
    assert after == before
    assert after["a"].paused and after["b"].rate_limit == 12.5
    assert again.get("c") == dropped and again.get("c").dropped


def test_unapplied_mutations_are_drained_again_after_restart(registry_factory) -> None:
    reg = registry_factory()
    reg.create(spec("a"))
    first = reg.drain("events")
    reg.mark_applied([m.id for m in first], epoch=1)
    reg.pause("a")
    drained = reg.drain("events")  # the epoch loop took it, then the process crashed before applying
    assert [m.kind for m in drained] == ["pause"]
    reg.close()

    again = registry_factory()
    redo = again.drain("events")
    assert [(m.id, m.kind) for m in redo] == [(drained[0].id, "pause")]  # applied create is not replayed
    again.mark_applied([m.id for m in redo], epoch=2)
    # new ids continue after the replayed ones
    again.resume("a")
    assert again.drain("events")[0].id == drained[0].id + 1
    again.close()

    third = registry_factory()
    assert [m.kind for m in third.drain("events")] == ["resume"]


def test_drop_frees_the_name_once_applied(registry_factory) -> None:
    reg = registry_factory()
    reg.create(spec("a"))
    reg.publish_progress("a", JobProgress(epoch=1, status="backfilling", rows_history=1, rows_live=0))
    assert reg.drop("a").dropped
    with pytest.raises(JobNotFoundError):
        reg.pause("a")
    assert reg.get("a").dropped  # visible until the loop applies the drop
    reg.mark_applied([m.id for m in reg.drain("events")], epoch=4)
    with pytest.raises(JobNotFoundError):
        reg.get("a")
    assert reg.progress("a") is None
    reg.create(spec("a", rate_limit=1.0))
    assert reg.get("a").rate_limit == 1.0
    reg.close()
    assert registry_factory().get("a").rate_limit == 1.0


def test_recreate_while_drop_pending(registry_factory) -> None:
    reg = registry_factory()
    reg.create(spec("a"))
    reg.drop("a")
    reg.create(spec("a", rate_limit=3.0))
    queued = reg.drain("events")
    assert [m.kind for m in queued] == ["create", "drop", "create"]
    reg.mark_applied([m.id for m in queued], epoch=1)
    rec = reg.get("a")  # the applied drop removed the old instance, not the new one
    assert not rec.dropped and rec.rate_limit == 3.0


def test_ensure_is_idempotent(registry_factory) -> None:
    reg = registry_factory()
    reg.ensure(spec("a"))
    reg.ensure(spec("a"))
    created = reg.drain("events")
    assert [m.kind for m in created] == ["create"]
    reg.mark_applied([created[0].id], epoch=0)
    reg.close()
    again = registry_factory()
    again.ensure(spec("a"))  # a restart with the same config file records nothing new
    assert again.drain("events") == []
    with pytest.raises(ConfigError, match="sink_path"):
        again.ensure(JobSpec(name="a", source="events", sink_path="/elsewhere"))


def test_torn_last_line_is_ignored_and_cut(registry_factory, tmp_path: Path, caplog) -> None:
    reg = registry_factory()
    reg.create(spec("a"))
    reg.pause("a")
    reg.close()
    log = tmp_path / LOG_NAME
    whole = log.read_bytes()
    log.write_bytes(whole + b'{"v":1,"type":"mutation","id":3,"kind":"dr')  # crash mid-write
    with caplog.at_level("WARNING"):
        again = registry_factory()
    assert "torn last line" in caplog.text
    assert again.get("a").paused and not again.get("a").dropped
    assert log.read_bytes() == whole  # the torn tail is cut, so new lines start clean
    again.resume("a")
    again.close()
    assert not registry_factory().get("a").paused


def test_complete_last_line_without_newline_is_kept(registry_factory, tmp_path: Path) -> None:
    reg = registry_factory()
    reg.create(spec("a"))
    reg.close()
    log = tmp_path / LOG_NAME
    log.write_bytes(log.read_bytes().rstrip(b"\n"))
    again = registry_factory()
    again.pause("a")
    again.close()
    assert registry_factory().get("a").paused


@pytest.mark.parametrize(
    "line",
    [
        b"not json",
        b'{"v":1,"type":"mutation","id":9,"kind":"explode","job":"a","source":"events","at":"2024-01-01T00:00:00+00:00"}',
        b'{"v":2,"type":"applied","ids":[1],"epoch":1}',
        b'{"v":1,"type":"applied","ids":"1","epoch":1}',
        b'{"v":1,"type":"mutation","id":1,"kind":"pause","job":"a","source":"events","at":"2024-01-01T00:00:00+00:00"}',
        b'{"v":1,"type":"mutation","id":9,"kind":"create","job":"b","source":"events","spec":{"name":"b"},'
        b'"at":"2024-01-01T00:00:00+00:00"}',
    ],
    ids=["not-json", "unknown-kind", "version", "ids-type", "id-not-increasing", "bad-spec"],
)
def test_malformed_line_in_the_middle_is_an_error(registry_factory, tmp_path: Path, line: bytes) -> None:
    reg = registry_factory()
    reg.create(spec("a"))
    reg.close()
    log = tmp_path / LOG_NAME
    log.write_bytes(log.read_bytes() + line + b"\n" + log.read_bytes())
    with pytest.raises(MutationLogError, match=rf"{LOG_NAME}:2: malformed") as info:
        JobRegistry(tmp_path, SOURCES)
    assert isinstance(info.value, StateFormatError)
    message = str(info.value)
    assert "\n" not in message and "Remove or fix that line" in message
    if b'"job":"' in line:  # the job the damaged line was about is named
        job = line.split(b'"job":"')[1].split(b'"')[0].decode()
        assert f'of job "{job}"' in message


def test_log_lines_are_versioned_json(registry_factory, tmp_path: Path) -> None:
    reg = registry_factory()
    reg.create(spec("a"))
    reg.mark_applied([1], epoch=7)
    lines = [json.loads(x) for x in (tmp_path / LOG_NAME).read_text().splitlines()]
    assert [(x["v"], x["type"]) for x in lines] == [(1, "mutation"), (1, "applied")]
    assert lines[0]["spec"]["sink_path"] == "/tables/a"
    assert lines[1] == {"v": 1, "type": "applied", "ids": [1], "epoch": 7}


def test_progress_and_failure(registry_factory) -> None:
    reg = registry_factory()
    reg.create(spec("a"))
    assert reg.progress("a") is None
    p = JobProgress(epoch=2, status="backfilling", rows_history=10, rows_live=3,
                    splits=[SplitProgress("t:0", "backfilling", 9, 99, 10, 90)], eta_seconds=4.0)
    reg.publish_progress("a", p)
    reg.publish_progress("ghost", p)  # unknown jobs are ignored
    assert reg.progress("a") == p and reg.progress("ghost") is None
    reg.set_failed("a", "boom")
    assert reg.get("a").error == "boom"
    reg.set_failed("ghost", "boom")


def test_a_failure_is_persisted_until_retry_or_drop(registry_factory) -> None:
    reg = registry_factory()
    reg.create(spec("a"))
    reg.create(spec("b"))
    reg.mark_applied([m.id for m in reg.drain("events")], 1)
    assert reg.retry("a").error is None and reg.pending("a") == 0  # not failed: no mutation
    reg.set_failed("a", "boom")
    reg.set_failed("b", "bang")
    assert [r.name for r in reg.failed()] == ["a", "b"]
    reg.close()
    reg = registry_factory()  # the failures come back from the log
    assert (reg.get("a").error, reg.get("b").error) == ("boom", "bang")
    assert reg.drain("events") == []  # a failure is no mutation: nothing to apply
    assert reg.retry("a").error is None
    [retry] = reg.drain("events")
    assert (retry.kind, retry.job) == ("retry", "a")
    reg.drop("b")
    reg.close()
    reg = registry_factory()  # the retry (even unapplied) cleared the error; the drop frees the name
    assert reg.get("a").error is None and [r.name for r in reg.failed()] == []
    assert [m.kind for m in reg.drain("events")] == ["retry", "drop"]
    reg.create(spec("b2"))
    reg.set_failed("b2", "x")
    reg.drop("b2")
    reg.create(spec("b2"))  # a re-created name starts without the old error
    assert reg.get("b2").error is None
    reg.close()
    assert registry_factory().get("b2").error is None


def test_concurrent_mutations_and_drains(registry_factory) -> None:
    reg = registry_factory()
    names = [f"j{i}" for i in range(8)]
    drained: list = []
    stop = threading.Event()
    errors: list[BaseException] = []

    def api(name: str) -> None:
        try:
            reg.create(spec(name))
            for _ in range(10):
                reg.pause(name)
                reg.throttle(name, 1.0)
                reg.resume(name)
                reg.throttle(name, None)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    def loop() -> None:
        epoch = 0
        while not stop.is_set():
            batch = reg.drain("events")
            drained.extend(batch)
            reg.mark_applied([m.id for m in batch], epoch)
            epoch += 1

    drainer = threading.Thread(target=loop)
    drainer.start()
    threads = [threading.Thread(target=api, args=(n,)) for n in names]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    stop.set()
    drainer.join()
    drained.extend(reg.drain("events"))
    assert not errors
    ids = [m.id for m in drained]
    assert ids == sorted(ids) and len(ids) == len(set(ids)) == len(names) * 41
    for n in names:
        assert [m.kind for m in drained if m.job == n][:2] == ["create", "pause"]
    reg.close()
    again = registry_factory()
    assert {r.name for r in again.list()} == set(names)
    assert all(not r.paused and r.rate_limit is None for r in again.list())


def test_an_unwritable_log_refuses_the_command_and_changes_nothing(registry_factory, monkeypatch) -> None:
    import errno

    from source_backfill.errors import StateWriteError
    from source_backfill.runtime import mutation_log

    reg = registry_factory()
    reg.create(spec("a"))
    size = reg.path.stat().st_size

    def full(_fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(mutation_log.os, "fsync", full)
    with pytest.raises(StateWriteError, match="No space left on device.*nothing was changed"):
        reg.pause("a")
    with pytest.raises(StateWriteError):
        reg.create(spec("b"))
    assert not reg.get("a").paused and [r.name for r in reg.list()] == ["a"]
    assert reg.path.stat().st_size == size  # the line that was not durable is gone
    reg.set_failed("a", "boom")  # the epoch loop goes on: the failure holds in memory
    assert reg.get("a").error == "boom"
    monkeypatch.undo()
    reg.pause("a")
    reg.close()
    again = registry_factory()
    assert again.get("a").paused and again.get("a").error is None and [r.name for r in again.list()] == ["a"]


def test_sink_paths_stay_inside_the_data_root(tmp_path: Path) -> None:
    from source_backfill.errors import SinkPathError

    data = tmp_path / "data"
    (data / "tables").mkdir(parents=True)
    (data / "tables" / "out").symlink_to(tmp_path)  # a symlink leading out of the data root
    reg = JobRegistry(tmp_path / "state", SOURCES, data_root=data)
    try:
        reg.create(JobSpec(name="ok", source="events", sink_path=str(data / "tables" / "ok")))
        for bad in (str(data / ".." / "escape"), "/etc/evil", str(data / "tables" / "out" / "t")):
            with pytest.raises(SinkPathError, match="outside daemon.data_root"):
                reg.create(JobSpec(name="bad", source="events", sink_path=bad))
        assert [r.name for r in reg.list()] == ["ok"]
    finally:
        reg.close()
    unconfined = JobRegistry(tmp_path / "state2", SOURCES)
    unconfined.create(JobSpec(name="anywhere", source="events", sink_path="/tmp/anywhere"))
    unconfined.close()


def test_a_sink_that_is_an_existing_file_is_refused_at_the_create(tmp_path: Path) -> None:
    """Accepted, it failed the job at its first epoch with delta-rs' "Generic LocalFileSystem error"."""
    from source_backfill.errors import SinkPathError

    (tmp_path / "a-file").write_text("not a table")
    reg = JobRegistry(tmp_path / "state", SOURCES)
    try:
        with pytest.raises(SinkPathError, match="is an existing file, not a folder"):
            reg.create(JobSpec(name="f", source="events", sink_path=str(tmp_path / "a-file")))
        reg.create(JobSpec(name="d", source="events", sink_path=str(tmp_path / "a-folder")))  # new: fine
        assert [r.name for r in reg.list()] == ["d"]
    finally:
        reg.close()


def test_a_job_error_served_by_the_api_names_no_path_of_the_daemon(tmp_path, monkeypatch):
    """Exception texts name the state root or the working directory; the stored (and served) error does
    not, the log keeps the text whole."""
    from source_backfill.daemon import _redacted

    monkeypatch.chdir(tmp_path)
    root = tmp_path / "state"
    reg = JobRegistry(root, ["events"])
    reg.create(spec("a"))
    reg.set_failed("a", f"IOError: {root}/mutations.jsonl and {tmp_path}/relative/x: denied")
    error = reg.get("a").error
    assert str(tmp_path) not in error
    assert "<state_root>/mutations.jsonl" in error and "<cwd>/relative/x" in error
    reg.close()
    health = {"sources": {"s": {"problems": [f"query failing: {root}/sources/s/checkpoint"]}}, "ok": False}
    assert _redacted(health, root) == {
        "sources": {"s": {"problems": ["query failing: <state_root>/sources/s/checkpoint"]}}, "ok": False}


# -- a job's transform changed, its rows repaired (issue 31) ------------------------------------------------
def test_a_new_transform_and_a_repair_are_durable_and_replayed_until_applied(registry_factory) -> None:
    from source_backfill.config import RepairSpec

    reg = registry_factory()
    reg.create(spec("a", transform="SELECT value FROM {source}"))
    reg.mark_applied([m.id for m in reg.drain("events")], epoch=1)
    new = "SELECT upper(CAST(value AS STRING)) AS value FROM {source}"
    assert reg.retransform("a", new).spec.transform == new
    record, rid = reg.repair("a", RepairSpec(splits=["t:0"], from_offset=5, to_offset=9))
    assert record.name == "a"
    assert [v["state"] for v in reg.repair_views("a")] == ["pending"]
    drained = reg.drain("events")
    assert [(m.kind, m.spec.transform if m.spec else None) for m in drained] == [("retransform", new),
                                                                                ("repair", None)]
    assert drained[1].id == rid
    assert drained[1].repair == RepairSpec(splits=["t:0"], from_offset=5, to_offset=9)
    reg.mark_applied([drained[0].id], epoch=2)  # the transform took effect; the repair is still to run
    reg.close()

    again = registry_factory()  # a crash before the repair ran: it comes back, the transform stays
    assert again.get("a").spec.transform == new
    assert [(m.id, m.kind) for m in again.drain("events")] == [(rid, "repair")]
    again.publish_repair("a", {"id": rid, "state": "done", "window": {}, "rows_added": 4})
    assert [v["state"] for v in again.repair_views("a")] == ["done"]  # finished, not pending as well
    again.mark_applied([rid], epoch=3)
    assert again.compact()
    again.close()

    third = registry_factory()  # the compacted log keeps the transform, and no applied repair
    assert third.get("a").spec.transform == new
    assert third.drain("events") == []


def test_a_new_transform_is_checked_like_a_create_s(tmp_path: Path) -> None:
    from source_backfill.errors import TransformError

    def check(s: JobSpec) -> None:
        if s.transform is not None and "reflect" in s.transform:
            raise TransformError("function reflect is not allowed")

    reg = JobRegistry(tmp_path, SOURCES, check_spec=check)
    try:
        reg.create(spec("a"))
        with pytest.raises(ConfigError, match="reflect"):
            reg.retransform("a", "SELECT reflect('java.lang.Runtime', 'getRuntime') FROM {source}")
        with pytest.raises(ConfigError, match="SELECT"):
            reg.retransform("a", "DROP TABLE x")
        with pytest.raises(ConfigError, match="source"):
            reg.retransform("a", "SELECT 1")
        with pytest.raises(JobNotFoundError):
            reg.retransform("nobody", None)
        assert reg.get("a").spec.transform is None and reg.pending("a") == 1  # the create alone
    finally:
        reg.close()
