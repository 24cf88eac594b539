"""The mutation log on its own: lines appended durably replay as they were written, a compacted log replays
to the same state, a torn last line is dropped and cut, any other damage refused (no registry involved)."""

from __future__ import annotations

import errno
import json
import logging
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from source_backfill.config import JobSpec
from source_backfill.errors import MutationLogError, StateFormatError, StateWriteError
from source_backfill.runtime import log_compaction, mutation_log
from source_backfill.runtime.log_compaction import LogCompactor, compact_entries
from source_backfill.runtime.mutation_log import (
    COMPACT_NAME,
    LOG_NAME,
    Accepted,
    Applied,
    Failed,
    LogEntry,
    Mutation,
    MutationLog,
    mutation_line,
    parse_mutation,
    replay_entries,
)

AT = datetime(2026, 1, 1, tzinfo=UTC)


def spec(name: str, rate_limit: float | None = None) -> JobSpec:
    return JobSpec(name=name, source="events", sink_path=f"/t/{name}", rate_limit=rate_limit)


def opened(root: Path) -> tuple[MutationLog, list[LogEntry], int]:
    """A log opened on ``root``: itself, what it replayed, the next mutation id."""
    seen: list[LogEntry] = []
    log = MutationLog(root)
    next_id = log.open(seen.append)
    return log, seen, next_id


class Model:
    """What the lines mean, kept small: each job's flags, the unapplied ids, the next id."""

    def __init__(self) -> None:
        self.jobs: dict[str, dict[str, Any]] = {}
        self.unapplied: dict[int, Mutation] = {}

    def apply(self, entry: LogEntry) -> None:
        if isinstance(entry, Accepted):
            m = entry.mutation
            record = self.jobs.get(m.job)
            if m.kind == "create":
                assert m.spec is not None
                self.jobs[m.job] = {"paused": False, "rate": m.spec.rate_limit, "dropped": False,
                                    "error": None}
            elif record is not None and not record["dropped"]:
                key, value = {"pause": ("paused", True), "resume": ("paused", False),
                              "throttle": ("rate", m.rate_limit), "drop": ("dropped", True),
                              "retry": ("error", None)}[m.kind]
                record[key] = value
            self.unapplied[m.id] = m
        elif isinstance(entry, Applied):
            for i in entry.ids:
                m = self.unapplied.pop(i, None)
                if m is not None and m.kind == "drop" and self.jobs.get(m.job, {}).get("dropped"):
                    del self.jobs[m.job]
        else:
            record = self.jobs.get(entry.job)
            if record is not None and not record["dropped"]:
                record["error"] = entry.error


def state_of(entries: list[dict[str, Any]]) -> tuple[Any, ...]:
    model = Model()
    next_id = replay_entries(entries, Path(LOG_NAME), model.apply)
    return model.jobs, sorted(model.unapplied), next_id


def fill(log: MutationLog, cycles: int, first_id: int = 1) -> int:
    """A job created and dropped over and over, a keeper paused, throttled and resumed: mostly dead lines.

    Returns the next mutation id.
    """
    next_id = first_id

    def accept(kind: Any, job: str, **kw: Any) -> int:
        nonlocal next_id
        log.append_mutation(Mutation(id=next_id, kind=kind, job=job, source="events", **kw), AT)
        next_id += 1
        return next_id - 1

    accept("create", "keeper", spec=spec("keeper", 3.0), rate_limit=3.0)
    for i in range(cycles):
        a = accept("create", "temp", spec=spec("temp"))
        b = accept("drop", "temp")
        c = accept("pause", "keeper")
        d = accept("throttle", "keeper", rate_limit=float(i))
        e = accept("resume", "keeper")
        log.append_applied([a, b, c, d, e], epoch=i)
    accept("pause", "keeper")  # left unapplied
    log.append_failed("keeper", "boom", AT)
    return next_id


# -- append, then replay ------------------------------------------------------------------------------------
def test_appended_lines_replay_as_they_were_written(tmp_path: Path) -> None:
    log, seen, next_id = opened(tmp_path)
    assert (seen, next_id, log.lines) == ([], 1, 0)
    create = Mutation(id=1, kind="create", job="a", source="events", spec=spec("a", 2.5), rate_limit=2.5)
    throttle = Mutation(id=2, kind="throttle", job="a", source="events", rate_limit=None)
    log.append_mutation(create, AT)
    log.append_mutation(throttle, AT)
    log.append_applied([1, 2], epoch=7)
    log.append_failed("a", "boom", AT)
    assert log.lines == 4
    log.close()

    again, seen, next_id = opened(tmp_path)
    try:
        assert seen == [Accepted(create, AT), Accepted(throttle, AT), Applied([1, 2]), Failed("a", "boom")]
        assert next_id == 3 and again.lines == 4
        assert again.entries()[2] == {"v": 1, "type": "applied", "ids": [1, 2], "epoch": 7}
        written = (tmp_path / LOG_NAME).read_bytes().splitlines()[2]
        assert written == b'{"v":1,"type":"applied","ids":[1,2],"epoch":7}'
    finally:
        again.close()


def test_a_mutation_line_parses_back_to_the_mutation() -> None:
    for m in (Mutation(id=4, kind="create", job="a", source="events", spec=spec("a"), rate_limit=None),
              Mutation(id=5, kind="throttle", job="a", source="events", rate_limit=0.0),
              Mutation(id=6, kind="drop", job="a", source="events")):
        line = json.loads(json.dumps(mutation_line(m, AT)))
        assert parse_mutation(line) == (m, AT)


def test_an_unwritable_log_keeps_no_half_line(tmp_path: Path, monkeypatch) -> None:
    log, _, _ = opened(tmp_path)
    log.append_applied([], epoch=0)
    size = log.path.stat().st_size

    def full(_fd: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(mutation_log.os, "fsync", full)
    with pytest.raises(StateWriteError, match="No space left on device.*nothing was changed"):
        log.append_applied([1], epoch=1)
    monkeypatch.undo()
    assert log.path.stat().st_size == size and log.lines == 1
    log.append_applied([2], epoch=2)
    log.close()
    assert [e["ids"] for e in opened(tmp_path)[0].entries()] == [[], [2]]


def test_the_log_is_private(tmp_path: Path) -> None:
    log, _, _ = opened(tmp_path)
    log.close()
    assert log.path.stat().st_mode & 0o777 == 0o600


# -- compaction ---------------------------------------------------------------------------------------------
def test_a_compacted_log_replays_to_the_same_state(tmp_path: Path) -> None:
    log, _, _ = opened(tmp_path)
    fill(log, 50)
    entries = log.entries()
    before = state_of(entries)
    assert before[0] == {"keeper": {"paused": True, "rate": 49.0, "dropped": False, "error": "boom"}}
    kept = compact_entries(entries)
    assert len(kept) < len(entries) // 10
    log.rewrite(kept)
    assert log.lines == len(kept)
    log.append_applied([], epoch=99)  # appends go to the new file
    log.close()

    again, seen, next_id = opened(tmp_path)
    again.close()
    model = Model()
    for entry in seen:
        model.apply(entry)
    assert (model.jobs, sorted(model.unapplied), next_id) == before
    assert next_id == before[2] == 1 + 1 + 50 * 5 + 1  # ids of removed lines are not handed out again
    assert not (tmp_path / COMPACT_NAME).exists()


def test_the_compactor_runs_when_the_log_has_grown(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(log_compaction, "COMPACT_SLACK", 10)
    log, _, _ = opened(tmp_path)
    try:
        compactor = LogCompactor(log, state_of)
        next_id = fill(log, 1)
        compactor.maybe(needed=5)  # 9 lines: not more than 2 x 5 + 10
        assert log.lines == 9
        fill(log, 10, first_id=next_id)
        before = state_of(log.entries())
        compactor.maybe(needed=5)
        assert log.lines < 9 and state_of(log.entries()) == before
    finally:
        log.close()


def test_a_failed_compaction_keeps_the_log_and_waits(tmp_path: Path, monkeypatch) -> None:
    log, _, _ = opened(tmp_path)
    try:
        fill(log, 5)
        data = log.path.read_bytes()
        compactor = LogCompactor(log, state_of)

        def full(*_args: object) -> None:
            raise OSError(errno.ENOSPC, "No space left on device")

        monkeypatch.setattr(mutation_log.os, "replace", full)
        assert not compactor.compact()
        monkeypatch.undo()
        assert log.path.read_bytes() == data and not (tmp_path / COMPACT_NAME).exists()
        assert compactor.floor == log.lines + log_compaction.COMPACT_SLACK
        log.append_applied([], epoch=1)  # the old file is still the one appended to
        assert log.path.read_bytes().startswith(data) and log.lines == len(log.entries())
    finally:
        log.close()


def test_a_compaction_that_changes_the_state_is_refused(tmp_path: Path) -> None:
    log, _, _ = opened(tmp_path)
    try:
        fill(log, 5)
        data = log.path.read_bytes()
        compactor = LogCompactor(log, lambda entries: len(entries))  # any removed line "changes" it
        assert not compactor.compact()
        assert log.path.read_bytes() == data and compactor.floor == log.lines + log_compaction.COMPACT_SLACK
    finally:
        log.close()


def test_a_compaction_cut_short_is_removed_at_open(tmp_path: Path, caplog) -> None:
    log, _, _ = opened(tmp_path)
    fill(log, 2)
    log.close()
    data = log.path.read_bytes()
    (tmp_path / COMPACT_NAME).write_bytes(data[:40])
    with caplog.at_level(logging.WARNING):
        again, seen, _ = opened(tmp_path)
    again.close()
    assert "unfinished log compaction removed" in caplog.text
    assert not (tmp_path / COMPACT_NAME).exists() and log.path.read_bytes() == data
    assert len(seen) == len(data.splitlines())


# -- damage -------------------------------------------------------------------------------------------------
def test_a_torn_last_line_is_ignored_and_cut(tmp_path: Path, caplog) -> None:
    log, _, _ = opened(tmp_path)
    log.append_mutation(Mutation(id=1, kind="create", job="a", source="events", spec=spec("a")), AT)
    log.append_mutation(Mutation(id=2, kind="pause", job="a", source="events"), AT)
    log.close()
    whole = log.path.read_bytes()
    log.path.write_bytes(whole + b'{"v":1,"type":"mutation","id":3,"kind":"dr')  # a crash mid-write
    with caplog.at_level(logging.WARNING):
        again, seen, next_id = opened(tmp_path)
    assert "torn last line ignored" in caplog.text and "line=3" in caplog.text
    assert [type(e) for e in seen] == [Accepted, Accepted] and next_id == 3 and again.lines == 2
    assert log.path.read_bytes() == whole  # cut, so the next line starts clean
    again.append_applied([1, 2], epoch=1)
    again.close()
    assert opened(tmp_path)[1][-1] == Applied([1, 2])


@pytest.mark.parametrize("tail", [b'{"v":1,"ty', b"123", b"[1, 2"], ids=["cut", "not-an-object", "cut-list"])
def test_a_log_that_is_only_a_torn_line_is_emptied(tmp_path: Path, tail: bytes) -> None:
    (tmp_path / LOG_NAME).write_bytes(tail)
    log, seen, next_id = opened(tmp_path)
    log.close()
    assert (seen, next_id, log.path.read_bytes()) == ([], 1, b"")


def test_a_complete_last_line_without_newline_is_kept(tmp_path: Path) -> None:
    log, _, _ = opened(tmp_path)
    log.append_applied([], epoch=1)
    log.close()
    last = b'{"v":1,"type":"applied","ids":[],"epoch":2}'  # complete, no newline; blank lines before it
    log.path.write_bytes(log.path.read_bytes() + b"\n  \n" + last)
    again, seen, _ = opened(tmp_path)
    again.append_applied([], epoch=3)
    again.close()
    assert seen == [Applied([]), Applied([])]
    assert [e["epoch"] for e in again.entries()] == [1, 2, 3]  # a newline was added before the new line


@pytest.mark.parametrize(
    ("line", "says"),
    [
        (b"not json", "malformed mutation log line (Expecting value"),
        (b'{"v":1,"type":"mutation","id":1,"kind":"pause","job":"a","source":"events","at":"2024-01-01"}',
         "mutation id 1 does not increase (next is 2)"),
        (b'{"v":2,"type":"applied","ids":[1],"epoch":1}', "unsupported log version 2"),
        (b'{"v":1,"type":"applied","ids":[],"next_id":"9"}', "next_id must be an integer"),
        (b'{"v":1,"type":"snapshot","job":"a"}', "unknown line type 'snapshot'"),
        (b'{"v":1,"type":"failed","job":"a","err', "malformed mutation log line (Unterminated string"),
    ],
    ids=["not-json", "id-not-increasing", "version", "next-id", "type", "torn-in-the-middle"],
)
def test_other_damage_is_refused_with_its_line_and_job(tmp_path: Path, line: bytes, says: str) -> None:
    first = b'{"v":1,"type":"mutation","id":1,"kind":"drop","job":"a","source":"events","at":"2024-01-01"}'
    (tmp_path / LOG_NAME).write_bytes(first + b"\n" + line + b"\n" + first[:20])
    with pytest.raises(MutationLogError) as info:
        opened(tmp_path)
    message = str(info.value)
    assert isinstance(info.value, StateFormatError) and "\n" not in message
    assert f"{tmp_path / LOG_NAME}:2: malformed mutation log line" in message and says in message
    assert ('of job "a"' in message) == (b'"job":"a"' in line)
    assert "Remove or fix that line" in message
    assert (tmp_path / LOG_NAME).read_bytes().endswith(first[:20])  # nothing is cut when refused


def test_a_failed_line_without_its_error_is_the_reader_s_to_judge(tmp_path: Path) -> None:
    """The line decodes with no error; a KeyError from the reader makes it damage, named like any other."""
    entries = [{"v": 1, "type": "failed", "job": "gone"}]
    seen: list[LogEntry] = []
    assert replay_entries(entries, Path(LOG_NAME), seen.append) == 1 and seen == [Failed("gone", None)]

    def live(entry: LogEntry) -> None:
        raise KeyError("error")

    with pytest.raises(MutationLogError, match=r'jsonl:1: malformed mutation log line of job "gone"'):
        replay_entries(entries, Path(LOG_NAME), live)
