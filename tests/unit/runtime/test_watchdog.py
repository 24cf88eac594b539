"""The watchdog's word for a dead JVM: the process's exit status when there is one, even when the gateway
failing is what it saw first (the socket closes as the process dies, before its status can be reaped)."""

from __future__ import annotations

import subprocess
import sys
from types import SimpleNamespace

from source_backfill.runtime.watchdog import JvmWatchdog


class _Gone:
    def isStopped(self) -> bool:  # noqa: N802 - the JVM's name
        raise ConnectionRefusedError("Connection refused")


def _watchdog(proc: object) -> JvmWatchdog:
    sc = SimpleNamespace(_jsc=SimpleNamespace(sc=_Gone), _gateway=SimpleNamespace(proc=proc))
    return JvmWatchdog(SimpleNamespace(sparkContext=sc), lambda _: None)


def test_a_killed_jvm_is_named_by_its_signal_when_the_gateway_fails_first() -> None:
    # a real process killed a moment after the gateway failed: poll() alone would still say "running"
    proc = subprocess.Popen([sys.executable, "-c", "import os, signal, time; time.sleep(0.3); "
                             "os.kill(os.getpid(), signal.SIGKILL)"])
    try:
        reason = _watchdog(proc).check()
    finally:
        proc.kill()
        proc.wait()
    assert reason is not None and "killed by signal SIGKILL (9)" in reason, reason


def test_a_running_jvm_whose_gateway_fails_is_said_so() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        reason = _watchdog(proc).check()
    finally:
        proc.kill()
        proc.wait()
    assert reason is not None and reason.startswith("the py4j gateway to Spark's JVM does not answer"), reason
