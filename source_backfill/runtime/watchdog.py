"""Notice a dead Spark JVM (or py4j gateway) within seconds, so the daemon exits and is restarted.

Without it a daemon whose JVM died (killed, out of memory) loops on ``Connection refused`` forever while
``/live`` answers 200: nothing restarts it. :class:`JvmWatchdog` checks every ``interval_s``:

* the JVM process pyspark launched (the gateway's ``Popen``; our child, so ``poll()`` reaps it): exited?
* one py4j call (``SparkContext.isStopped``): refused (gateway gone), or the context stopped (Spark's own
  handler stops it when the JVM runs out of memory, before the process exits)?

The first failing check calls ``on_death(reason)`` once. A check that hangs (a gateway that accepts and
never answers) is seen by :meth:`stalled_s`, which the daemon's main loop watches. Each tick also runs
``tick()`` callbacks (the deadlines of jobs' Spark work).
"""

from __future__ import annotations

import logging
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from typing import Any

from source_backfill.errors import one_line

logger = logging.getLogger(__name__)

#: A check that has not come back for this long means the gateway no longer answers.
STALL_S = 60.0
#: After the gateway fails: how long to wait for the JVM process's exit status (a signal says why).
EXIT_WAIT_S = 2.0


class JvmWatchdog:
    """A thread checking Spark's JVM every ``interval_s``; ``on_death(reason)`` once it is gone."""

    def __init__(self, spark: Any, on_death: Callable[[str], None], *, interval_s: float = 1.0,
                 ticks: tuple[Callable[[], None], ...] = ()) -> None:
        sc = spark.sparkContext
        self._jsc = sc._jsc  # noqa: SLF001 - the JVM side has the liveness we need
        self._proc = getattr(sc._gateway, "proc", None)  # noqa: SLF001 - None when pyspark did not launch it
        self.pid: int | None = getattr(self._proc, "pid", None)
        self._on_death = on_death
        self._interval_s = interval_s
        self.ticks = ticks
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._last_ok = time.monotonic()
        #: Why the JVM is considered gone (None while it answers).
        self.dead: str | None = None

    def start(self) -> None:
        """Start checking (a daemon thread)."""
        self._thread = threading.Thread(target=self._run, name="jvm-watchdog", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop checking (the daemon stops; Spark may be stopped after this)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)

    def check(self) -> str | None:
        """Why the JVM is gone, or None while it answers."""
        if self.dead is not None:
            return self.dead
        exited = self._exited(0.0)
        if exited is not None:
            return exited
        try:
            stopped = bool(self._jsc.sc().isStopped())
        except Exception as exc:  # noqa: BLE001 - py4j: refused, reset, closed
            # the gateway's socket closes as the process dies: its exit status (a signal) says more
            return self._exited(EXIT_WAIT_S) or \
                f"the py4j gateway to Spark's JVM does not answer: {one_line(exc, 200)}"
        if stopped:
            return "the SparkContext was stopped under the daemon (the JVM is shutting down: out of memory?)"
        return None

    def _exited(self, wait_s: float) -> str | None:
        """How the JVM process ended, waiting up to ``wait_s`` for it; None while it runs."""
        if self._proc is None:
            return None
        try:
            code = self._proc.wait(wait_s) if wait_s > 0 else self._proc.poll()
        except subprocess.TimeoutExpired:
            return None
        if code is None:
            return None
        how = f"killed by signal {_signal_name(-code)}" if code < 0 else f"exited with code {code}"
        return f"Spark's JVM (pid {self.pid}) {how}"

    def alive(self) -> bool:
        """Whether the JVM answers now."""
        return self.check() is None

    def stalled_s(self) -> float:
        """Seconds since the last check that came back (grows while a check hangs)."""
        return time.monotonic() - self._last_ok

    def declare_dead(self, reason: str) -> None:
        """The JVM is gone (a check failed, or one hangs): ``on_death(reason)``, once."""
        if self.dead is not None:
            return
        self.dead = reason
        self._on_death(reason)

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            reason = self.check()
            if self._stop.is_set():
                return
            if reason is not None:
                self.declare_dead(reason)
                return
            self._last_ok = time.monotonic()
            for tick in self.ticks:
                try:
                    tick()
                except Exception as exc:  # noqa: BLE001 - the next check decides whether the JVM is gone
                    logger.warning('watchdog tick failed error="%s"', one_line(exc))


def _signal_name(number: int) -> str:
    try:
        return f"{signal.Signals(number).name} ({number})"
    except ValueError:
        return str(number)
