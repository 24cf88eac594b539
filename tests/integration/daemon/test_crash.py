"""Exactly once after real crashes: the daemon process is SIGKILLed mid-backfill, twice, and restarted.

The daemon runs as users run it (``source-backfill run --config``), a producer keeps writing, and the
kills land wherever the process happens to be (writing files, committing, between epochs). After the
last restart the job must finish and its table must hold every offset exactly once.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from deltalake import DeltaTable

from tests.integration.daemon.conftest import exactly_once, wait_for

pytestmark = pytest.mark.integration


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _start(config: Path, log: Path) -> subprocess.Popen:
    exe = Path(sys.executable).with_name("source-backfill")
    return subprocess.Popen(  # noqa: S603 - our own console script
        [str(exe), "run", "--config", str(config)],
        stdout=log.open("ab"), stderr=subprocess.STDOUT, start_new_session=True,
    )


def _commits(table: Path) -> int:
    try:
        return DeltaTable(str(table)).version()
    except Exception:  # noqa: BLE001 - not created yet
        return -1


def _still_backfilling(table: Path) -> bool:
    import json

    for commit in DeltaTable(str(table)).history(50):
        if "source_backfill.state" in commit:
            splits = json.loads(commit["source_backfill.state"])["splits"]
            return any(s["stage"] != "finished" for s in splits.values())
    return True  # nothing committed yet: certainly not finished


def test_sigkill_mid_backfill_twice_then_exactly_once(new_topic, producer_for, kafka_bootstrap, tmp_path):
    topic = new_topic(3)
    p = producer_for(topic)
    p.send(6000, 3, weights=[3, 2, 1])
    p.stream(3, per_second=100)
    port = _free_port()
    table = tmp_path / "tables" / "crashy"
    config = tmp_path / "config.toml"
    config.write_text(f"""
[daemon]
state_root = "{tmp_path / 'state'}"
[spark]
master = "local[2]"
[api]
port = {port}
[metrics]
port = {_free_port()}
[[sources]]
name = "src"
bootstrap_servers = "{kafka_bootstrap}"
topics = ["{topic}"]
trigger_interval_s = 0.5
[[jobs]]
name = "crashy"
source = "src"
sink_path = "{table}"
max_rows_per_epoch = 400
rate_limit = 400  # the backfill lasts >= 15 s: both kills land mid-backfill
""")
    log = tmp_path / "daemon.log"
    proc = _start(config, log)
    try:
        for kill_after in (3, 6):  # commits of the job's table before each kill
            base = _commits(table)
            wait_for(lambda b=base, k=kill_after: _commits(table) >= max(b, 0) + k, timeout=240,
                     what=f"{kill_after} more commits")
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)
            assert _still_backfilling(table), "the kill must land mid-backfill"
            proc = _start(config, log)

        def status() -> str | None:
            try:
                return httpx.get(f"http://127.0.0.1:{port}/jobs/crashy", timeout=5).json().get("status")
            except httpx.HTTPError:
                return None

        wait_for(lambda: status() == "finished", timeout=300, what="finished after two crashes")
        p.stop()
        exactly_once(table, kafka_bootstrap, [topic])
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
        sys.stdout.write(log.read_text(errors="replace")[-3000:] if log.exists() else "")
