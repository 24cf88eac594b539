"""Table backfill: each strategy copying a changing 1M-row Delta table, against a plain Spark read.

Baseline, measured in the same run: Spark (delta-spark) reads the source table at the version the jobs
pin and writes it into a new Delta table — what a user does once by hand. Then, per strategy, one job
(merge mode) attaches while a writer keeps changing the table (a new version every ~0.1 s) and the
source's epochs run back to back:

* ``table_backfill.<strategy>.ratio_vs_plain_read`` = plain-read seconds ÷ the job's copy seconds (attach
  until its snapshot phase is done), i.e. its rows/s as a share of Spark's (goal ≥ 0.7);
* ``table_backfill.<strategy>.attach_to_live_s``: attach until the job follows the live stream with no
  lag (copy + replay).

Each strategy alternates the plain read and the job's copy ``REPEATS`` times, each pair on a fresh table
(this machine's timings swing between runs); the median run is reported, ``.ratio_range`` lists all.

``BENCH_QUICK=1`` uses 100k rows.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

QUICK = os.environ.get("BENCH_QUICK") == "1"
ROWS = 100_000 if QUICK else 1_000_000
STRATEGIES = ("snapshot", "arrangement", "chain")
#: Plain read and job copy, alternated this many times per strategy; the median run is reported.
REPEATS = 1 if QUICK else 3


def _plain_read(spark, src: str, version: int, dst: str) -> float:
    t0 = time.monotonic()
    spark.read.format("delta").option("versionAsOf", version).load(src).write.format("delta").save(dst)
    return time.monotonic() - t0


def _strategy(work: Path, src: str, strategy: str, tag: str = "") -> tuple[float, float, int]:
    from source_backfill.config import JobSpec, SourceConfig
    from source_backfill.runtime.registry import JobRegistry
    from source_backfill.runtime.table_source import TableLiveSource
    from source_backfill.testing.delta import ChangingTable

    registry = JobRegistry(work / f"state-{strategy}{tag}", ["t"])
    registry.create(JobSpec(name=strategy, source="t", sink_path=str(work / f"{strategy}{tag}"),
                            strategy=strategy))
    cfg = SourceConfig(name="t", kind="delta", table_path=src, primary_key=["id"], trigger_interval_s=1.0,
                       chunk_rows=2048)
    source = TableLiveSource(cfg, registry)
    source.open()
    up = ChangingTable(src, seed=len(strategy))
    up.next_id = ROWS * 2
    writer, stop = up.writer_thread(0.1)
    job = source.jobs[strategy]
    t0 = time.monotonic()
    copied_s = None
    epochs = 0
    try:
        while job.state is None or job.state.phase.value == "consuming_snapshot":
            source.run_epoch()
            epochs += 1
        copied_s = time.monotonic() - t0
    finally:
        stop.set()
        writer.join()
    while not (job.backfill_done and job.lag_versions == 0):
        source.run_epoch()
        epochs += 1
    return copied_s, time.monotonic() - t0, epochs


def main() -> dict[str, Any]:
    from deltalake import DeltaTable

    from source_backfill.runtime.spark import build_spark
    from source_backfill.testing.delta import ChangingTable

    work = Path(tempfile.mkdtemp(prefix="bench-table-"))
    result: dict[str, Any] = {"table_backfill.rows": ROWS}
    try:
        spark = build_spark("local[*]", "bench-table")
        print(f"table backfill: {ROWS} rows, a writer committing a version every ~0.1 s", flush=True)
        for strategy in STRATEGIES:
            runs = []
            for rep in range(REPEATS):  # alternating, so both sides see the same machine
                src = str(work / f"src-{strategy}-{rep}")  # a fresh table: the same log length each time
                ChangingTable.create(src, ROWS, seed=1)
                version = DeltaTable(src).version()
                # Spark reads the table once untimed (JIT, its cached Delta log): the baseline at its best
                _plain_read(spark, src, version, str(work / f"warm-{strategy}-{rep}"))
                plain_s = _plain_read(spark, src, version, str(work / f"plain-{strategy}-{rep}"))
                copy_s, live_s, epochs = _strategy(work, src, strategy, f"-{rep}")
                runs.append((plain_s / copy_s, plain_s, copy_s, live_s, epochs))
            ratio, plain_s, copy_s, live_s, epochs = sorted(runs)[len(runs) // 2]  # the median run
            result[f"table_backfill.{strategy}.plain_read_s"] = round(plain_s, 2)
            result[f"table_backfill.{strategy}.copy_s"] = round(copy_s, 2)
            result[f"table_backfill.{strategy}.ratio_vs_plain_read"] = round(ratio, 3)
            result[f"table_backfill.{strategy}.ratio_range"] = [round(r[0], 3) for r in sorted(runs)]
            result[f"table_backfill.{strategy}.attach_to_live_s"] = round(live_s, 2)
            print(f"  {strategy:<12} copy {copy_s:6.2f} s vs plain Spark read {plain_s:6.2f} s: ratio "
                  f"{ratio:.2f} (median of {REPEATS}: {', '.join(f'{r[0]:.2f}' for r in sorted(runs))}; "
                  f"goal >= 0.7); attach to live {live_s:.2f} s in {epochs} epochs", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return result


if __name__ == "__main__":
    main()
