"""Meters the benchmarks read from inside the daemon's process (in-process daemons only)."""

from __future__ import annotations

from typing import Any


class ReadSeconds:
    """Seconds the jobs' history reads ahead took, summed (``Rates.read_ahead`` wrapped while a copy runs).

    A copy timed from create to Finished also waits for epoch boundaries (the attach, the adoption of each
    read ahead): at 1M records and a 1 s trigger that quantizes copies alike; the reads' own seconds say
    what a change of tier or width does to the copy itself.
    """

    def __init__(self) -> None:
        from source_backfill.executors.accounting import Rates

        self._rates = Rates
        self._original = Rates.read_ahead
        self.total = 0.0
        meter = self

        def read_ahead(rates: Any, rows: int, seconds: float) -> None:  # noqa: ANN401
            meter.total += seconds
            meter._original(rates, rows, seconds)  # noqa: SLF001

        Rates.read_ahead = read_ahead  # type: ignore[method-assign]

    def start(self) -> None:
        self.total = 0.0

    def stop(self) -> None:
        self._rates.read_ahead = self._original  # type: ignore[method-assign]
