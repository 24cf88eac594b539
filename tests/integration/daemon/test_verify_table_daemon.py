"""``source-backfill verify`` of a table job (a delta source) against a real daemon process (no Spark)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from source_backfill import cli
from source_backfill.testing.delta import ChangingTable
from source_backfill.testing.process import DaemonProcess, free_port
from tests.integration.daemon.conftest import table_daemon_config

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[3]


def test_a_merged_table_job_is_verified_row_for_row_and_a_changelog_refused(tmp_path, capsys):
    ChangingTable.create(str(tmp_path / "src"), 2000, seed=5)
    port = free_port()
    config = table_daemon_config(tmp_path, port)
    env = {"PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    daemon = DaemonProcess(config, port, tmp_path / "daemon.log", env)
    daemon.start()
    try:
        daemon.wait_ready(60)
        for name, mode in (("copy", "merge"), ("log", "changelog")):
            body = {"name": name, "source": "tbl", "sink_path": str(tmp_path / name), "strategy": "snapshot",
                    "mode": mode}
            r = daemon.request("POST", "/jobs", body)
            assert r is not None and r.status_code == 201, r.text
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            r = daemon.get("/jobs/copy")
            if r is not None and r.json()["status"] == "finished":
                break
            time.sleep(0.3)
        assert cli.main(["--api", daemon.url, "verify", "copy"]) == 0
        assert capsys.readouterr().out.strip() == "copy: exactly once, 2000 records, 0 missing, 0 duplicated"
        assert cli.main(["--api", daemon.url, "verify", "log"]) == 1
        assert "writes a changelog" in capsys.readouterr().err
    finally:
        daemon.stop()
