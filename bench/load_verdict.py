"""The load benchmark's verdict: epochs run against the epochs its window should hold, and a dead JVM.

Pure (no daemon, no Spark): ``bench_load`` measures, this judges; ``tests/unit/bench`` tests it.

A run that looks healthy by its epochs' durations can still have failed: in the issue's run 94 % of the
epochs were within the interval and no job failed, yet only 68 epochs ran in 360 s at a 1 s trigger
(the Spark JVM had died of ``OutOfMemoryError`` ~70 s in, and the daemon stayed up doing nothing). So
the verdict counts the epochs the window should have held, and any sign of a dead JVM fails the run.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

#: A run fails when fewer epochs ran than this share of the window's trigger intervals.
MIN_EPOCHS_RATIO = 0.9

#: Lines of the daemon's log that say the Spark JVM is gone or broken (py4j: the gateway is dead).
JVM_DEATH_MARKERS = (
    "java.lang.OutOfMemoryError",
    "ConnectionRefusedError",  # py4j: the JVM's gateway no longer answers
    "Py4JNetworkError",
    "Answer from Java side is empty",
    "Error while sending or receiving",
    "SparkContext was shut down",
    "Cannot call methods on a stopped SparkContext",
)


def window_intervals(window_s: float, interval_s: float) -> float:
    """The trigger intervals a window of ``window_s`` holds: the epochs it should run."""
    if window_s <= 0 or interval_s <= 0:
        msg = f"window and interval must be positive (window {window_s} s, interval {interval_s} s)"
        raise ValueError(msg)
    return window_s / interval_s


def epochs_ratio(epochs: float, window_s: float, interval_s: float) -> float:
    """Epochs run over the epochs the window should hold (1.0: one epoch every interval)."""
    return max(0.0, epochs) / window_intervals(window_s, interval_s)


def death_markers(log_lines: Iterable[str]) -> list[str]:
    """The JVM-death markers found in ``log_lines``, each once, in the order of ``JVM_DEATH_MARKERS``."""
    found: set[str] = set()
    for line in log_lines:
        found.update(m for m in JVM_DEATH_MARKERS if m in line)
    return [m for m in JVM_DEATH_MARKERS if m in found]


@dataclass(frozen=True)
class LoadVerdict:
    """``ok`` or not, and why (one reason per failed check)."""

    ratio: float
    expected: float
    reasons: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.reasons

    def line(self) -> str:
        """One line for the console: ``load: OK ...`` or ``load: FAILED: reason; reason``."""
        if self.ok:
            return f"load: OK (epochs run / window intervals = {self.ratio:.3f})"
        return "load: FAILED: " + "; ".join(self.reasons)


def judge(
    *, epochs: float, window_s: float, interval_s: float, dead: Sequence[str] = (), errors: float = 0,
    failed_jobs: float = 0, min_ratio: float = MIN_EPOCHS_RATIO,
) -> LoadVerdict:
    """The verdict of a load run.

    ``dead``: signs of a dead JVM seen during the run (the JVM process gone, ``/live`` failing, a
    death marker in the log); any fails the run. Fewer epochs than ``min_ratio`` of the window's
    intervals fail it, with one epoch of slack for the window's edges (an epoch running across the
    first or last scrape is not counted). Errors and failed jobs fail it too.
    """
    expected = window_intervals(window_s, interval_s)
    ratio = epochs_ratio(epochs, window_s, interval_s)
    reasons = [f"Spark JVM dead: {d}" for d in dict.fromkeys(dead)]
    if ratio < min_ratio and epochs < expected - 1:
        reasons.append(f"{epochs:g} epochs in {window_s:g} s at a {interval_s:g} s trigger: {ratio:.3f} of "
                       f"the {expected:g} intervals (< {min_ratio:g})")
    if errors:
        reasons.append(f"{errors:g} source errors")
    if failed_jobs:
        reasons.append(f"{failed_jobs:g} failed jobs")
    return LoadVerdict(ratio=ratio, expected=expected, reasons=reasons)
