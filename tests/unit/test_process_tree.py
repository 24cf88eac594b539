"""processes_below: the one walk of /proc the test kit, the load bench and the JVM tests share."""

from __future__ import annotations

import subprocess
import time

from source_backfill.testing.process import processes_below


def test_the_processes_below_a_root_are_found_and_a_zombie_is_not():
    shell = subprocess.Popen(["bash", "-c", "sleep 30 & sleep 30 & wait"])
    try:
        deadline = time.monotonic() + 5
        while len(processes_below(shell.pid)) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        below = processes_below(shell.pid)
        assert sorted(name for _, name in below) == ["sleep", "sleep"]
        assert shell.pid not in [pid for pid, _ in below]
        victim = below[0][0]
        subprocess.run(["kill", "-STOP", str(shell.pid)], check=True)  # the shell cannot reap it now
        subprocess.run(["kill", "-9", str(victim)], check=True)
        deadline = time.monotonic() + 5
        while victim in [pid for pid, _ in processes_below(shell.pid)] and time.monotonic() < deadline:
            time.sleep(0.05)
        assert victim not in [pid for pid, _ in processes_below(shell.pid)]  # a zombie is gone already
    finally:
        subprocess.run(["kill", "-9", str(shell.pid)], check=False)
        shell.wait()
