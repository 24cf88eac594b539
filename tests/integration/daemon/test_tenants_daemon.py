"""Tenants on a real daemon process (a delta source: no Spark): SIGHUP rotates the principals' tokens.

The daemon reads ``api.principals_file`` at start; a token rotated in the file (the old hash replaced by
the new) is refused once the process gets SIGHUP, the new one accepted, without a restart; a file that
does not load on a later SIGHUP leaves the set in force. The probes, which need no credential, name no job.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import httpx
import pytest

from source_backfill.api.principals import hash_token
from source_backfill.testing.delta import ChangingTable
from source_backfill.testing.process import DaemonProcess, free_port
from tests.integration.daemon.conftest import table_daemon_config, wait_for

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[3]
OLD, NEW = "old-token-of-team-a-" + "o" * 20, "new-token-of-team-a-" + "n" * 20


def _write(path: Path, token: str) -> None:
    path.write_text(json.dumps({"principals": [
        {"name": "team-a-ci", "token_sha256": hash_token(token), "roles": {"team-a": "editor"}}]}))


def test_sighup_rotates_a_token_without_a_restart_and_the_probes_name_no_job(tmp_path):
    ChangingTable.create(str(tmp_path / "src"), 200, seed=3)
    principals = tmp_path / "principals.json"
    _write(principals, OLD)
    port = free_port()
    config = table_daemon_config(tmp_path, port)
    config.write_text(config.read_text().replace("[metrics]", f'principals_file = "{principals}"\n[metrics]'))
    env = {"PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    daemon = DaemonProcess(config, port, tmp_path / "daemon.log", env)
    daemon.start()

    def status(token: str) -> int:
        r = httpx.get(f"{daemon.url}/jobs", headers={"Authorization": f"Bearer {token}"}, timeout=5)
        return r.status_code

    try:
        daemon.wait_ready(60)
        body = {"name": "team-a.copy", "namespace": "team-a", "source": "tbl", "strategy": "snapshot",
                "sink_path": str(tmp_path / "copy")}
        r = httpx.post(f"{daemon.url}/jobs", json=body, headers={"Authorization": f"Bearer {OLD}"}, timeout=5)
        assert r.status_code == 201, r.text
        assert status(OLD) == 200 and status(NEW) == 401
        for probe in ("/health", "/ready"):
            answer = daemon.get(probe)
            assert answer is not None and "team-a" not in answer.text, (probe, answer and answer.text)

        _write(principals, NEW)
        pid = daemon.pid
        assert pid is not None
        os.kill(pid, signal.SIGHUP)
        wait_for(lambda: status(NEW) == 200, what="the new token accepted after SIGHUP")
        assert status(OLD) == 401 and daemon.pid == pid  # rotated, the same process

        principals.write_text("{half written")
        os.kill(pid, signal.SIGHUP)
        wait_for(lambda: "credentials reloaded ok=False" in daemon.tail(200), what="the bad file reported")
        assert status(NEW) == 200 and status(OLD) == 401  # the set in force holds
    finally:
        daemon.stop()
