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
