"""A job with nothing to do commits nothing, and what it commits is what moved (issue 27).

Checked end to end on a live source: no table version while the topic is idle (the epochs still run), the
state of a commit is the delta of what moved over the job's last snapshot, and a restart after epochs that
were skipped for no change (so the replayed epoch is far above the committed one) is exactly once.
"""

from __future__ import annotations

import json
import logging
import time

import pytest

from connectors.delta.log import KEY_STATE
from source_backfill.errors import KafkaConnectorError
from tests.integration.daemon.conftest import INTERVAL_S, exactly_once, finished, job_of, job_spec, wait_for

pytestmark = pytest.mark.integration


def _version(table) -> int:
    from deltalake import DeltaTable

    return DeltaTable(str(table)).version()


def _settled(table, quiet_s: float = 4 * INTERVAL_S) -> int:
    """The table's version once no version was added for ``quiet_s`` (the last live rows committed)."""
    last, since = _version(table), time.monotonic()
    while time.monotonic() - since < quiet_s:
        time.sleep(INTERVAL_S / 2)
        now = _version(table)
        if now != last:
            last, since = now, time.monotonic()
    return last


def test_an_idle_finished_job_adds_no_version_while_its_epochs_run(
    daemon_factory, new_topic, producer_for, kafka_bootstrap, tmp_path, caplog
):
    topic = new_topic(4)
    p = producer_for(topic)
    p.send(400, 4)
    d = daemon_factory([topic], [job_spec("j", tmp_path)])
    wait_for(lambda: finished(d, "j"), what="finished")
    exactly_once(tmp_path / "j", kafka_bootstrap, [topic])
    before = _settled(tmp_path / "j")
    epoch = d.sources["src"].last_epoch
    caplog.set_level(logging.INFO, logger="source_backfill.executors.source_backfill")
    time.sleep(12 * INTERVAL_S)
    assert d.sources["src"].last_epoch >= epoch + 5  # the epochs go on ...
    assert _version(tmp_path / "j") == before  # ... and commit nothing
    assert job_of(d, "j").processed_epoch >= epoch + 5
    # epochs skipped for no change are not missed ones: new rows commit without a rejoin
    p.send(40, 4)
    exactly_once(tmp_path / "j", kafka_bootstrap, [topic])
    assert _version(tmp_path / "j") > before
    assert "job rejoins" not in caplog.text


def test_a_commit_carries_what_moved_over_a_snapshot(
    daemon_factory, new_topic, producer_for, kafka_bootstrap, tmp_path
):
    from deltalake import DeltaTable

    topic = new_topic(6)
    p = producer_for(topic)
    p.send(60, 6)
    d = daemon_factory([topic], [job_spec("j", tmp_path)])
    wait_for(lambda: finished(d, "j"), what="finished")
    exactly_once(tmp_path / "j", kafka_bootstrap, [topic])
    before = _settled(tmp_path / "j")
    p.send(5, 6, weights=[1, 0, 0, 0, 0, 0])  # one partition moves
    exactly_once(tmp_path / "j", kafka_bootstrap, [topic])
    history = DeltaTable(str(tmp_path / "j")).history()
    commits = [c for c in history if c["version"] > before and KEY_STATE in c]
    assert commits
    states = [json.loads(c[KEY_STATE]) for c in commits]
    assert all(s["kind"] == "delta" for s in states), states
    assert all(len(s["end"]) == 1 and len(s["splits"]) <= 1 for s in states), states
    plans = [json.loads(c["source_backfill.plan"]) for c in commits]
    assert all(len(pl["end"]) == 1 for pl in plans), plans


def test_restart_after_skipped_epochs_is_exactly_once(
    daemon_factory, new_topic, producer_for, kafka_bootstrap, tmp_path
):
    topic = new_topic(3)
    p = producer_for(topic)
    p.send(300, 3)
    state = tmp_path / "state"
    d = daemon_factory([topic], [job_spec("j", tmp_path)], state_root=state)
    wait_for(lambda: finished(d, "j"), what="finished")
    exactly_once(tmp_path / "j", kafka_bootstrap, [topic])
    _settled(tmp_path / "j")
    committed = job_of(d, "j").committed_epoch
    wait_for(lambda: d.sources["src"].last_epoch >= committed + 4, what="idle epochs")
    d.stop()
    p.send(90, 3)  # arrives while the daemon is down: the first epoch after restart is far above
    d2 = daemon_factory([topic], [job_spec("j", tmp_path)], state_root=state)
    assert job_of(d2, "j").committed_epoch == committed
    p.send(30, 3)
    report = exactly_once(tmp_path / "j", kafka_bootstrap, [topic])
    assert sum(s.log_records for s in report.splits.values()) == 420


def _log_versions(table) -> list[int]:
    return sorted(int(p.name.split(".")[0]) for p in (table / "_delta_log").glob("*.json"))


def test_an_idle_job_past_the_log_retention_restarts_with_its_exact_state(
    daemon_factory, new_topic, producer_for, kafka_bootstrap, tmp_path
):
    from deltalake import DeltaTable

    topic = new_topic(3)
    p = producer_for(topic)
    p.send(60, 3)
    state, table = tmp_path / "state", tmp_path / "j"
    d = daemon_factory([topic], [job_spec("j", tmp_path)], state_root=state)
    wait_for(lambda: finished(d, "j"), what="finished")
    exactly_once(table, kafka_bootstrap, [topic])
    _settled(table)
    d.stop()
    retention_s = 4
    DeltaTable(str(table)).alter.set_table_properties(
        {"delta.logRetentionDuration": f"interval {retention_s} seconds", "delta.checkpointInterval": "1000"})
    d = daemon_factory([topic], [job_spec("j", tmp_path)], state_root=state)  # refreshes after 2 s idle
    log = DeltaTable(str(table))
    log.create_checkpoint()  # covers every commit so far
    first = log.version()
    time.sleep(retention_s + 2.5)  # idle past the retention
    assert DeltaTable(str(table)).version() - first <= 6  # a fresh snapshot per half retention at most
    DeltaTable(str(table)).cleanup_metadata()
    assert min(_log_versions(table)) >= first  # the commits the retention expired are gone
    held = job_of(d, "j")
    states, covered = dict(held.states.to_states()), dict(held.log.covered_to)
    d.stop()
    d = daemon_factory([topic], [job_spec("j", tmp_path)], state_root=state)
    job = job_of(d, "j")
    assert job is not None, "the job did not recover"
    assert dict(job.states.to_states()) == states and job.log.covered_to == covered
    p.send(30, 3)
    report = exactly_once(table, kafka_bootstrap, [topic])
    assert sum(s.log_records for s in report.splits.values()) == 90


def _as_previous_format(table) -> int:
    """Rewrite the job's newest state commit in place as the code before issue 27 wrote it: version 1.

    Version 1 kept every split's state in every commit and each split's live position in the commit's
    plan (``end``). The full state is the chain's (snapshot + deltas) as the daemon wrote it, so the
    rewritten commit says exactly what the table and the live query's checkpoint hold. Returns its version.
    """
    from deltalake import DeltaTable

    from connectors.delta.log import KEY_JOB, KEY_PLAN, read_commit
    from source_backfill.core.codec import END, SPLITS, decode_state, rebuild

    head = next(c for c in DeltaTable(str(table)).history() if KEY_STATE in c)
    version = head["version"]

    def read(v: int):
        commit = read_commit(str(table), v)
        return None if commit is None or KEY_STATE not in commit else decode_state(commit[KEY_STATE])

    sections = rebuild(decode_state(head[KEY_STATE]), read)
    path = table / "_delta_log" / f"{version:020d}.json"
    actions = [json.loads(line) for line in path.read_text().splitlines()]
    for action in actions:
        info = action.get("commitInfo")
        if info is not None and KEY_JOB in info:
            plan = json.loads(info.get(KEY_PLAN) or "{}")
            info[KEY_STATE] = json.dumps({"version": 1, "splits": sections[SPLITS]})
            info[KEY_PLAN] = json.dumps({**plan, "end": sections[END]})
    path.write_text("\n".join(json.dumps(a) for a in actions) + "\n")
    return version


def test_a_table_written_by_the_previous_format_recovers(
    daemon_factory, new_topic, producer_for, kafka_bootstrap, tmp_path
):
    """A job's table whose newest state commit is version 1 goes on exactly once; its next commit is v2."""
    from deltalake import DeltaTable

    topic = new_topic(3)
    state, table = tmp_path / "state", tmp_path / "j"
    p = producer_for(topic)
    p.send(30, 3)
    d = daemon_factory([topic], [job_spec("j", tmp_path)], state_root=state)
    wait_for(lambda: finished(d, "j"), what="finished")
    exactly_once(table, kafka_bootstrap, [topic])
    _settled(table)
    epoch = job_of(d, "j").committed_epoch
    source = d.sources["src"]
    d.stop()
    # a stopped source closed its Kafka client (py4j keeps the source alive: it would poll a gone broker)
    with pytest.raises(KafkaConnectorError, match="is closed"):
        source.admin.list_splits([topic])
    v1 = _as_previous_format(table)
    d = daemon_factory([topic], [job_spec("j", tmp_path)], state_root=state)
    job = job_of(d, "j")
    assert job is not None and job.committed_epoch == epoch and finished(d, "j")
    p.send(30, 3)
    report = exactly_once(table, kafka_bootstrap, [topic])
    assert sum(s.log_records for s in report.splits.values()) == 60
    after = [c for c in DeltaTable(str(table)).history() if c["version"] > v1 and KEY_STATE in c]
    first = min(after, key=lambda c: c["version"])
    assert json.loads(first[KEY_STATE])["kind"] == "snapshot"  # the next commit starts a v2 chain


def test_an_epoch_lost_after_skipped_ones_is_read_again_exactly_once(
    daemon_factory, new_topic, producer_for, kafka_bootstrap, tmp_path, caplog
):
    """The first epoch with rows after idle ones fails: the job is rebuilt from its table, far behind.

    Its committed epoch is below the next one by the skipped epochs and the lost one; the rejoin must read
    the lost epoch's rows from history (its live position moved) and nothing else (the skipped ones moved
    none), each row once.
    """
    topic = new_topic(2)
    p = producer_for(topic)
    p.send(40, 2)
    d = daemon_factory([topic], [job_spec("j", tmp_path)])
    wait_for(lambda: finished(d, "j"), what="finished")
    exactly_once(tmp_path / "j", kafka_bootstrap, [topic])
    _settled(tmp_path / "j")
    job = job_of(d, "j")
    wait_for(lambda: d.sources["src"].last_epoch >= job.committed_epoch + 3, what="idle epochs")

    def lost(*args, **kwargs):
        msg = "injected: the epoch's commit is lost"
        raise RuntimeError(msg)

    job.sink.commit_epoch = lost  # this job object only: its rebuilt successor commits
    caplog.set_level(logging.INFO, logger="source_backfill.executors.source_backfill")
    p.send(20, 2)
    wait_for(lambda: job_of(d, "j") is not job, what="the job rebuilt from its table")
    report = exactly_once(tmp_path / "j", kafka_bootstrap, [topic])
    assert sum(s.log_records for s in report.splits.values()) == 60
    assert "job rejoins" in caplog.text
