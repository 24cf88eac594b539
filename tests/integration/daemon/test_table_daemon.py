"""Table backfill in the daemon as users run it: a ``delta`` source in the config, jobs from the config
and the API, progress in ``/jobs`` and ``/metrics``, and ``kill -9`` mid-snapshot and mid-replay.

A daemon with only delta sources starts no Spark (the table modules read with delta-rs), so each start
here takes seconds.
"""

from __future__ import annotations

import time

import pytest
from deltalake import DeltaTable

from source_backfill.testing.delta import ChangingTable, as_rows, replay_changelog
from source_backfill.testing.metrics import scrape, total
from source_backfill.testing.process import DaemonProcess, free_port
from tests.integration.daemon.conftest import table_daemon_config

pytestmark = pytest.mark.integration


def _config(tmp_path, port):
    return table_daemon_config(tmp_path, port, f"""chunk_rows = 4
replay_versions_per_epoch = 8
[[jobs]]
name = "snap"
source = "tbl"
sink_path = "{tmp_path / 'snap'}"
strategy = "snapshot"
mode = "changelog"
rate_limit = 2500
""")


def _table(daemon, job):
    r = daemon.get(f"/jobs/{job}")
    assert r is not None and r.status_code == 200, r
    return r.json()


def _wait(daemon, job, predicate, timeout_s=120):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        view = _table(daemon, job)
        if view["table"] is not None and predicate(view):
            return view
        time.sleep(0.2)
    pytest.fail(f"{job} never got there: {_table(daemon, job)}\n{daemon.tail()}")


def test_kill_9_mid_snapshot_and_mid_replay_then_equal_to_the_source(tmp_path):
    up = ChangingTable.create(str(tmp_path / "src"), 10_000, seed=11)
    port = free_port()
    daemon = DaemonProcess(_config(tmp_path, port), port, tmp_path / "daemon.log")
    daemon.start()
    thread, stop = up.writer_thread(0.05)
    try:
        daemon.wait_ready(60)
        body = {"name": "arr", "source": "tbl", "sink_path": str(tmp_path / "arr"), "strategy": "arrangement",
                "rate_limit": 3000}
        r = daemon.request("POST", "/jobs", body)
        assert r is not None and r.status_code == 201, r.text
        bad = daemon.request("POST", "/jobs", body | {"name": "x", "strategy": None})
        assert bad is not None and bad.status_code == 422 and "strategy" in bad.text
        mid = _wait(daemon, "snap", lambda v: v["table"]["phase"] == "consuming_snapshot"
                    and 0.1 < v["table"]["progress"] < 0.9)
        daemon.kill()  # mid-snapshot
        daemon.start()
        daemon.wait_ready(60)
        again = _wait(daemon, "snap", lambda v: v["epoch"] is not None)
        # resumed from its committed vnodes, not started over
        assert again["table"]["vnodes_completed"] >= mid["table"]["vnodes_completed"]
        _wait(daemon, "snap", lambda v: v["table"]["phase"] == "consuming_log_store"
              and v["table"]["lag_versions"] > 3)
        daemon.kill()  # mid-replay
        daemon.start()
        daemon.wait_ready(60)
    finally:
        stop.set()
        thread.join()
    latest = DeltaTable(str(tmp_path / "src")).version()
    try:
        for job in ("snap", "arr"):
            _wait(daemon, job, lambda v: v["status"] == "finished" and v["table"]["lag_versions"] == 0
                  and v["table"]["cursor_version"] == latest)
        want = up.expected()
        assert replay_changelog(DeltaTable(str(tmp_path / "snap")).to_pyarrow_table()) == want
        assert as_rows(DeltaTable(str(tmp_path / "arr")).to_pyarrow_table()) == want
        assert _table(daemon, "arr")["table"]["rows"]["consuming_snapshot"] >= 10_000  # persisted counts
        metrics = scrape(daemon.url)  # counted since the last start: the replay went on after it
        assert total(metrics, "table_backfill_rows_total", job="snap", stage="consuming_log_store") > 0
        assert total(metrics, "table_backfill_lag_versions", job="snap") == 0
        # a dry run of one more job: the version it would copy now, and how (no Spark here: by vnode)
        body = {"name": "more", "source": "tbl", "sink_path": str(tmp_path / "more"), "strategy": "chain",
                "rate_limit": 1000}
        r = daemon.request("POST", "/jobs?dry_run=true", body)
        assert r is not None and r.status_code == 200, r.text
        plan = r.json()
        assert plan["table"]["version"] == DeltaTable(str(tmp_path / "src")).version()
        assert plan["table"]["rows"] == len(want) and plan["table"]["copy_by"] == "vnodes"
        assert "runs no Spark" in plan["table"]["why"]
        assert plan["seconds_at_rate_limit"] == pytest.approx(len(want) / 1000)
        from source_backfill.cli.render import render_plan

        text = render_plan(plan)
        assert f"{len(want):,} rows" in text and "copied by vnodes with delta-rs" in text
        assert _table(daemon, "snap")["status"] == "finished" and daemon.get("/jobs/more").status_code == 404
    finally:
        daemon.stop()


@pytest.mark.slow  # two starts of a daemon with Spark (~40 s): make test-slow, so make test stays < 20 min
def test_kill_9_mid_copy_by_files_then_equal_to_the_source(tmp_path):
    """A daemon that runs Spark for its tables (``spark.tables``) copies a 12-file table by files, one
    file an epoch at its rate limit; ``kill -9`` with some files committed, a restart: the copy goes on
    from the committed count (not from the start), and the job's changelog, replayed strictly (a file
    copied twice inserts its keys twice), equals the source after the writer's changes."""
    up = ChangingTable.create(str(tmp_path / "src"), 24_000, seed=13, files=12)
    port = free_port()
    config = table_daemon_config(tmp_path, port, f"""spark_copy_rows = 0
spark_copy_epoch_rows = 2000
[spark]
master = "local[2]"
tables = true
[[jobs]]
name = "files"
source = "tbl"
sink_path = "{tmp_path / 'files'}"
strategy = "snapshot"
mode = "changelog"
rate_limit = 4000
""")
    daemon = DaemonProcess(config, port, tmp_path / "daemon.log")
    daemon.start()
    try:
        daemon.wait_ready(240)
        mid = _wait(daemon, "files", lambda v: 2 <= (v["table"]["files_copied"] or 0) <= 8, timeout_s=240)
        daemon.kill()
        for _ in range(3):
            up.commit()  # changes after the pinned version: replayed once the copy is done
        daemon.start()
        daemon.wait_ready(240)
        again = _wait(daemon, "files", lambda v: v["epoch"] is not None and v["table"]["files_copied"]
                      is not None, timeout_s=240)
        assert again["table"]["files_copied"] >= mid["table"]["files_copied"]  # resumed, not restarted
        latest = DeltaTable(str(tmp_path / "src")).version()
        done = _wait(daemon, "files", lambda v: v["status"] == "finished"
                     and v["table"]["cursor_version"] == latest, timeout_s=240)
        assert done["table"]["files_copied"] == done["table"]["files_total"] == 12
        assert replay_changelog(DeltaTable(str(tmp_path / "files")).to_pyarrow_table()) == up.expected()
    finally:
        daemon.stop()
