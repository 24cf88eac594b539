"""``make run``'s demo in its quick mode, as a user runs it (its own process), to its verdict line."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from source_backfill.testing.process import free_port

pytestmark = [pytest.mark.integration, pytest.mark.slow]  # its own broker and Spark JVM: ~1 min

ROOT = Path(__file__).resolve().parents[2]


def test_the_demo_backfills_the_late_job_shows_it_and_verifies_it_exactly_once(tmp_path):
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "PYTHONPATH": path}
    run = subprocess.run(
        [sys.executable, "-m", "source_backfill.demo", "--quick", "--state-root", str(tmp_path / "demo"),
         "--api-port", str(free_port()), "--metrics-port", str(free_port()), "--duration", "400"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=480, check=False,
    )
    out, err = run.stdout, run.stderr
    assert run.returncode == 0, out + err
    lines = out.splitlines()
    attached = next(line for line in lines if line.startswith("attached late-copy mid-stream"))
    assert "rate limit" in attached and "jobs throttle late-copy unlimited" in attached
    assert any(line.startswith("live-copy live latency before late-copy: ") for line in lines)
    # progress that moves: the late job's line with a percentage below 100 while it backfills, its bars
    moving = [line for line in lines if line.strip().startswith("late-copy  backfilling")]
    assert moving and any("%" in line and "eta " in line for line in moving), out
    assert any(f"demo-events:{p}" in line and "[" in line for line in lines for p in range(4))
    verdict = next(line for line in lines if line.startswith("late-copy: "))
    assert verdict.startswith("late-copy: exactly once, ") and verdict.endswith(" 0 missing, 0 duplicated")
    assert int(verdict.split(", ")[1].split()[0]) >= 6000
    assert lines[-1] == "demo stopped"
    # Ctrl-C's path closed every client before the broker stopped: no librdkafka line anywhere
    assert "Connection refused" not in out + err and "rdkafka" not in out + err
