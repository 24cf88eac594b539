"""Meters the benchmarks read: inside an in-process daemon (`ReadSeconds`), and from outside any daemon
(its Delta tables, its process tree)."""

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


# -- read from outside the daemon: its tables, its process tree (daemon processes too) ------------------


def pct(values: list[float], q: float) -> float:
    """The ``q`` quantile of ``values`` (nearest rank; NaN when empty)."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def live_latencies_s(table: str, since_ms: float, until_ms: float, from_version: int = 0) -> list[float]:
    """Per row a job committed whose Kafka timestamp is in ``[since_ms, until_ms]``: the seconds from that
    timestamp to the Delta commit of the version that added it (the definition of ``live_latency_seconds``,
    docs/guides/live-latency.md, read from the table: exact per row, where the metric has buckets)."""
    import pyarrow as pa
    import pyarrow.compute as pc
    from deltalake import DeltaTable

    dt = DeltaTable(table)
    committed = {h["version"]: h["timestamp"] for h in dt.history()}
    cdf = pa.table(dt.load_cdf(starting_version=from_version).read_all())
    versions = cdf.column("_commit_version").to_pylist()
    stamps = pc.cast(cdf.column("timestamp"), "int64").to_pylist()  # microseconds
    return [(committed[v] - ts / 1000.0) / 1000.0 for v, ts in zip(versions, stamps, strict=True)
            if since_ms <= ts / 1000.0 <= until_ms]


def commit_times_ms(table: str) -> list[float]:
    """The commit time (ms since the epoch) of every version of the Delta table at ``table``, in order."""
    from deltalake import DeltaTable

    return sorted(float(h["timestamp"]) for h in DeltaTable(table).history())


def tree_cpu_s(root: int) -> float:
    """CPU seconds (user + system) the process ``root`` and every live process below it have used."""
    import os
    from pathlib import Path

    from source_backfill.testing.process import processes_below

    total = 0.0
    for pid in [root, *(p for p, _ in processes_below(root))]:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total
