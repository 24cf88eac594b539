"""A source's reset (``runtime/source_reset.py``) with stand-in sources: only one stopped for good is reset,
its folder is moved aside whole and kept, a new source is started in its place, and a crash between the
reset's line and its move is finished at the next start (never a half-moved folder)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from source_backfill.config import JobSpec, SourceConfig
from source_backfill.errors import SourceNotFoundError, SourceRunningError, StateMoveError
from source_backfill.runtime import source_reset
from source_backfill.runtime.registry import JobRegistry
from source_backfill.runtime.source_reset import MARKER, SourceResets, read_marker


class Crash(BaseException):
    """The process killed at that point (nothing after it runs)."""


class FakeSource:
    """What a reset asks of a source: why it stopped for good, stop, start."""

    def __init__(self, name: str, stopped_for_good: str | None = None, fail_start: bool = False) -> None:
        self.name = name
        self.stopped_for_good = stopped_for_good
        self.error: str | None = None
        self.fail_start = fail_start
        self.calls: list[str] = []

    def stop(self, _timeout_s: float = 0) -> None:
        self.calls.append("stop")

    def start(self) -> None:
        self.calls.append("start")
        if self.fail_start:
            msg = "broker unreachable"
            raise RuntimeError(msg)


CONFIGS = {
    "src": SourceConfig(name="src", bootstrap_servers="localhost:9092", topics=["t"]),
    "tbl": SourceConfig(name="tbl", kind="delta", table_path="/x/t", primary_key=["id"]),
}


class Daemon:
    """The parts of a daemon a reset uses: the registry, the sources, a builder of new ones."""

    def __init__(self, root: Path, *, fail_start: bool = False) -> None:
        self.root = root
        self.registry = JobRegistry(root, list(CONFIGS), audit=True)
        self.sources: dict[str, Any] = {"src": FakeSource("src", "topic t was deleted and created again"),
                                        "tbl": FakeSource("tbl")}
        self.built: list[FakeSource] = []
        self.fail_start = fail_start
        self.resets = SourceResets(self.registry, root, CONFIGS, self.sources, self.build)

    def build(self, config: SourceConfig) -> FakeSource:
        self.built.append(FakeSource(config.name, fail_start=self.fail_start))
        return self.built[-1]

    def close(self) -> None:
        self.registry.close()


@pytest.fixture
def state(tmp_path: Path) -> Path:
    folder = tmp_path / "state" / "sources" / "src"
    (folder / "checkpoint" / "offsets").mkdir(parents=True)
    (folder / "checkpoint" / "offsets" / "41").write_text("old log's offsets")
    (folder / "topic_ids.json").write_text('{"t": "old-id"}')
    (folder / "anchors.json").write_text("{}")
    return tmp_path / "state"


def test_a_source_stopped_for_good_is_moved_aside_whole_and_started_anew(state):
    d = Daemon(state)
    d.registry.create(JobSpec(name="a", source="src", sink_path=str(state.parent / "tables" / "a")))
    d.registry.create(JobSpec(name="b", source="tbl", sink_path=str(state.parent / "tables" / "b"),
                              strategy="snapshot"))  # another source's
    old = d.sources["src"]
    done = d.resets.reset("src", by="root")
    assert done.error is None and done.moved_to.startswith("sources/src.reset-")
    kept = state / done.moved_to
    assert (kept / "checkpoint" / "offsets" / "41").read_text() == "old log's offsets"  # kept, not deleted
    assert json.loads((kept / "topic_ids.json").read_text()) == {"t": "old-id"}
    new_folder = state / "sources" / "src"
    assert sorted(p.name for p in new_folder.iterdir()) == [MARKER]  # no checkpoint, ids or anchors of old
    marker = read_marker(new_folder)
    assert marker == {"reset_id": done.id, "at": marker["at"], "moved_to": done.moved_to,
                      "old_tables": [str(state.parent / "tables" / "a")]}  # its jobs', of the old log
    assert old.calls == ["stop"] and d.sources["src"] is d.built[0] and d.built[0].calls == ["start"]
    [row] = [r for r in d.registry.audit_rows() if r["kind"] == "reset"]
    assert (row["id"], row["source"], row["by"]) == (done.id, "src", "root")
    assert json.loads(row["detail"]) == {"moved_to": done.moved_to}
    d.close()


def test_a_running_source_is_not_reset_and_nothing_changes(state):
    d = Daemon(state)
    d.sources["src"].stopped_for_good = None
    log = d.registry.path.read_bytes()
    for name in ("src", "tbl"):
        with pytest.raises(SourceRunningError, match="is running: a reset is for a source stopped for good"):
            d.resets.reset(name)
    with pytest.raises(SourceNotFoundError):
        d.resets.reset("nope")
    assert d.registry.path.read_bytes() == log and d.built == []
    assert sorted(p.name for p in (state / "sources").iterdir()) == ["src"]
    assert d.sources["src"].calls == []
    d.close()


def test_a_crash_between_the_line_and_the_move_is_finished_at_the_next_start(state, monkeypatch):
    d = Daemon(state)

    def crash(*_args: Any) -> None:
        raise Crash  # the process dies here: the line is durable, the folder not moved

    monkeypatch.setattr(source_reset, "rename", crash)
    with pytest.raises(Crash):
        d.resets.reset("src")
    assert (state / "sources" / "src" / "topic_ids.json").exists()  # the old folder, whole
    [(m, at)] = d.registry.pending_resets("src")
    d.close()
    monkeypatch.setattr(source_reset, "rename", os.rename)

    again = Daemon(state)  # the next start: the move is finished before any source starts
    again.resets.finish_pending()
    kept = state / "sources" / f"src.reset-{at:%Y%m%dT%H%M%SZ}-{m.id}"
    assert (kept / "topic_ids.json").exists() and (kept / "checkpoint" / "offsets" / "41").exists()
    assert read_marker(state / "sources" / "src")["reset_id"] == m.id
    again.resets.finish_pending()  # done: a second look changes nothing
    assert sorted(p.name for p in (state / "sources").iterdir()) == ["src", kept.name]
    again.close()


def test_a_crash_between_the_move_and_the_marker_writes_the_marker_only(state, monkeypatch):
    d = Daemon(state)
    real = source_reset.write_record

    def crash(*_args: Any) -> None:
        raise Crash

    monkeypatch.setattr(source_reset, "write_record", crash)
    with pytest.raises(Crash):
        d.resets.reset("src")
    assert not (state / "sources" / "src").exists()  # moved: the next start makes a new folder
    d.close()
    monkeypatch.setattr(source_reset, "write_record", real)
    again = Daemon(state)
    again.resets.finish_pending()
    [(m, _)] = again.registry.pending_resets("src")
    assert read_marker(state / "sources" / "src")["reset_id"] == m.id
    assert len([p for p in (state / "sources").iterdir() if p.name.startswith("src.reset-")]) == 1
    again.close()


def test_a_source_stopped_again_before_its_first_epoch_is_reset_again(state):
    d = Daemon(state)
    first = d.resets.reset("src")
    d.sources["src"].stopped_for_good = "created again, again"  # before any epoch applied the first
    (state / "sources" / "src" / "topic_ids.json").write_text('{"t": "second-id"}')
    second = d.resets.reset("src")
    assert second.id != first.id and second.moved_to != first.moved_to
    assert json.loads((state / second.moved_to / "topic_ids.json").read_text()) == {"t": "second-id"}
    assert read_marker(state / "sources" / "src")["reset_id"] == second.id
    d.close()
    again = Daemon(state)  # both lines still unapplied: nothing is moved again at the next start
    again.resets.finish_pending()
    assert read_marker(state / "sources" / "src")["reset_id"] == second.id
    assert len([p for p in (state / "sources").iterdir() if p.name.startswith("src.reset-")]) == 2
    again.close()


def test_a_source_that_does_not_start_again_says_why_and_may_be_reset_again(state):
    d = Daemon(state, fail_start=True)
    done = d.resets.reset("src")
    assert done.error is not None and "broker unreachable" in done.error
    fresh = d.sources["src"]
    assert fresh.calls == ["start", "stop"] and "broker unreachable" in (fresh.stopped_for_good or "")
    d.fail_start = False
    assert d.resets.reset("src").error is None
    d.close()


def test_a_folder_that_cannot_be_moved_is_a_state_move_error_and_stays_whole(state, monkeypatch):
    d = Daemon(state)

    def refused(*_args: Any) -> None:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(source_reset, "rename", refused)
    with pytest.raises(StateMoveError, match="Permission denied") as caught:
        d.resets.reset("src")
    assert str(state) not in str(caught.value)  # the API answers with it: no path of the daemon's
    assert (state / "sources" / "src" / "topic_ids.json").exists()
    d.close()


def test_after_a_reset_a_table_of_the_old_log_without_topic_ids_is_refused_not_resumed(tmp_path):
    """Its commits name no topic id (a release before they were recorded): resumed, its committed epochs
    (the old checkpoint's) would make it skip the new checkpoint's epochs up to them."""
    from types import SimpleNamespace

    from source_backfill.errors import JobError
    from source_backfill.runtime.source import LiveSource

    old, new = tmp_path / "old", tmp_path / "new"
    source = SimpleNamespace(name="src", topic_ids={"t": "new-id"},
                             reset_marker={"reset_id": 3, "old_tables": [str(old)]})

    def job(table: Path, committed: int | None, ids: dict[str, str] | None) -> Any:
        return SimpleNamespace(name="j", spec=SimpleNamespace(sink_path=str(table)),
                               committed_epoch=committed, recorded_topic_ids=ids,
                               check_topics=lambda _ids: None)

    with pytest.raises(JobError, match="written before its source src was reset"):
        LiveSource._check_topics(source, job(old, 812, None))  # type: ignore[arg-type]
    LiveSource._check_topics(source, job(old, None, None))  # type: ignore[arg-type]  # never committed
    LiveSource._check_topics(source, job(new, 5, None))  # type: ignore[arg-type]  # written after the reset
    LiveSource._check_topics(source, job(old, 812, {"t": "new-id"}))  # type: ignore[arg-type]  # ids: checked
    never_reset = SimpleNamespace(name="src", topic_ids={}, reset_marker=None)
    LiveSource._check_topics(never_reset, job(old, 812, None))  # type: ignore[arg-type]  # taken as it is
