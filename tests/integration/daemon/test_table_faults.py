"""Faults in a job's table: damaged state fails that job alone, with an error naming its table, while the
others go on; another writer committing to the table concurrently is retried around, never doubled."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from connectors.delta.log import KEY_STATE
from tests.integration.daemon.conftest import exactly_once, finished, job_of, job_spec, metric_total, wait_for

pytestmark = pytest.mark.integration


def _latest_commit(table: Path) -> Path:
    return max((table / "_delta_log").glob("*.json"), key=lambda p: int(p.stem))


def _garble_state(table: Path) -> None:
    """Replace the job's state in its newest commit with text that is not JSON (the log stays valid)."""
    commit = _latest_commit(table)
    lines = commit.read_text().splitlines()
    for i, line in enumerate(lines):
        action = json.loads(line)
        if KEY_STATE in action.get("commitInfo", {}):
            action["commitInfo"][KEY_STATE] = '{"splits": [torn'
            lines[i] = json.dumps(action)
            break
    else:
        pytest.fail(f"no job state in {commit}")
    commit.write_text("\n".join(lines) + "\n")


def _truncate_log(table: Path) -> Path:
    """Cut the newest commit file of the Delta log in half (a disk or copy gone wrong)."""
    commit = _latest_commit(table)
    data = commit.read_bytes()
    commit.write_bytes(data[: len(data) // 2])
    return commit


def test_damaged_table_state_fails_only_that_job_naming_its_table(
    daemon_factory, new_topic, producer_for, kafka_bootstrap, tmp_path
):
    import httpx

    topic = new_topic(2)
    p = producer_for(topic)
    p.send(600, 2)
    p.stream(2, per_second=40)
    state = tmp_path / "state"
    jobs = [job_spec(name, tmp_path) for name in ("good", "garbled", "torn")]
    d = daemon_factory([topic], jobs, state_root=state)
    wait_for(lambda: all(finished(d, j["name"]) for j in jobs), what="all three finished")
    d.stop()
    _garble_state(tmp_path / "garbled")
    _truncate_log(tmp_path / "torn")

    d = daemon_factory([topic], jobs, state_root=state)
    wait_for(lambda: d.registry.get("garbled").error and d.registry.get("torn").error,
             what="both damaged jobs failed")
    garbled = d.registry.get("garbled").error
    assert str(tmp_path / "garbled") in garbled and "source_backfill.state" in garbled, garbled
    torn_error = d.registry.get("torn").error
    assert str(tmp_path / "torn") in torn_error and "transaction log cannot be read" in torn_error, torn_error
    for name in ("garbled", "torn"):
        assert job_of(d, name) is None
        view = httpx.get(f"{d.api_url}/jobs/{name}").json()
        assert view["status"] == "failed", view
    # the healthy job and the live stream go on; the daemon is healthy (failed jobs are listed)
    epoch = wait_for(lambda: d.sources["src"].last_epoch, what="an epoch after the restart")
    wait_for(lambda: d.sources["src"].last_epoch >= epoch + 3, what="epochs go on")
    assert job_of(d, "good") is not None and finished(d, "good")
    health = httpx.get(f"{d.api_url}/health").json()
    assert health["ok"] and sorted(health["sources"]["src"]["failed_jobs"]) == ["garbled", "torn"]
    p.stop()
    exactly_once(tmp_path / "good", kafka_bootstrap, [topic])


def test_another_writer_committing_to_the_table_is_retried_around_and_never_doubles_a_row(
    daemon_factory, new_topic, producer_for, kafka_bootstrap, tmp_path
):
    import threading

    from deltalake import DeltaTable

    from source_backfill import metrics

    topic = new_topic(2)
    p = producer_for(topic)
    p.send(6000, 2)
    p.stream(2, per_second=60)
    d = daemon_factory([topic], [job_spec("j", tmp_path, max_rows_per_epoch=500)])
    table = tmp_path / "j"
    wait_for(lambda: (table / "_delta_log").exists() and job_of(d, "j").rows[0] > 0, what="first commits")
    stop = threading.Event()
    changes = {"n": 0}

    def other_writer() -> None:  # a user's maintenance job: table property changes, each one a commit
        while not stop.wait(0.05):
            try:
                props = {"delta.logRetentionDuration": f"interval {30 + changes['n'] % 7} days"}
                DeltaTable(str(table)).alter.set_table_properties(props)
                changes["n"] += 1
            except Exception:  # noqa: BLE001, S110 - it may lose races to the job's commits: that is the point
                pass

    writer = threading.Thread(target=other_writer, daemon=True)
    writer.start()
    try:
        wait_for(lambda: metric_total(metrics.COMMIT_CONFLICTS, job="j") > 0, timeout=240,
                 what="a commit of the job conflicting with the other writer")
        wait_for(lambda: finished(d, "j"), timeout=240, what="finished under the other writer")
    finally:
        stop.set()
        writer.join(10)
    assert changes["n"] > 0
    assert d.registry.get("j").error is None
    p.stop()
    exactly_once(table, kafka_bootstrap, [topic])
