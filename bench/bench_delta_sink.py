"""Delta sink cost (issue 4): commit overhead per epoch, and write throughput vs plain Parquet.

* empty epochs: the state-only commit every idle epoch pays;
* 100k-row epochs: the sink (Spark writes Parquet into the table, delta-rs commits) against a plain
  ``df.write.parquet`` of the same rows, in the same run. Ratio = plain time / sink time (1.0 = free);
* the two writers on the same epochs (a live-sized epoch of 200 rows and a 100k-row one), interleaved:
  delta-rs (Spark writes the files, delta-rs commits them with the state) against delta-spark (one
  ``format("delta")`` write with ``txnAppId``/``txnVersion`` and the state in ``userMetadata``).
  ``delta_spark_vs_delta_rs`` = delta-rs time / delta-spark time (> 1: delta-spark is faster);
* the commit of an epoch whose rows are on the driver (a caught-up job's 1,000 live rows, written by
  pyarrow), ``DRIVER_EPOCHS`` epochs on each of two tables, interleaved: the append written straight
  into the log (``connectors/delta/log_append.py``, the default) against the same sink with that path
  off (delta-rs reloads its snapshot, commits, reads the version back): ``driver_commit_ms_direct``,
  ``driver_commit_ms_delta_rs`` (medians, wall), ``driver_commit_cpu_ms_*`` (the process's CPU per
  commit, delta-rs' threads included) and ``driver_commit_delta_rs_vs_direct`` = delta-rs / direct.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from pathlib import Path

ROWS = int(os.environ.get("BENCH_DELTA_ROWS", "100000"))
EPOCHS = 5
EMPTY_EPOCHS = 20
DRIVER_EPOCHS = int(os.environ.get("BENCH_DRIVER_EPOCHS", "300"))


def main() -> dict[str, float]:
    from connectors.delta.sink import DeltaEpochSink
    from source_backfill.runtime.spark import build_spark

    spark = build_spark("local[*]", "bench-delta")
    work = Path(tempfile.mkdtemp(prefix="bench-delta-"))
    try:
        df = spark.range(ROWS).selectExpr(
            "id AS offset", "CAST(id % 4 AS INT) AS partition", "'bench' AS topic",
            "CAST(repeat('x', 120) AS BINARY) AS value", "current_timestamp() AS timestamp",
        ).cache()
        df.count()
        split = {"stage": "backfilling", "offset": 1, "num_consumed_rows": 1, "target_offset": 9}
        state = {"version": 1, "splits": {f"bench:{p}": split for p in range(4)}}
        # warm-up both paths once
        df.write.mode("overwrite").parquet(str(work / "warm"))
        DeltaEpochSink(str(work / "warm-delta"), "w", df.schema).commit_epoch(1, df, state)

        sink = DeltaEpochSink(str(work / "empty"), "bench", df.schema)
        sink.commit_epoch(0, None, state)
        t = time.perf_counter()
        for e in range(1, EMPTY_EPOCHS + 1):
            sink.commit_epoch(e, None, state)
        empty_ms = (time.perf_counter() - t) / EMPTY_EPOCHS * 1000

        # interleaved, so load from anything else on the machine hits both paths alike
        sink = DeltaEpochSink(str(work / "full"), "bench", df.schema)
        plain, full = [], []
        for e in range(1, EPOCHS + 1):
            t = time.perf_counter()
            df.write.mode("overwrite").parquet(str(work / f"plain-{e}"))
            plain.append(time.perf_counter() - t)
            t = time.perf_counter()
            sink.commit_epoch(e, df, state)
            full.append(time.perf_counter() - t)
        plain_s, sink_s = sorted(plain)[EPOCHS // 2], sorted(full)[EPOCHS // 2]
        writers = _writers(spark, df, state, work)
        writers.update(_driver_commits(state, work))
        result = {
            "empty_epoch_commit_ms": round(empty_ms, 1),
            "rows_per_epoch": ROWS,
            "plain_parquet_epoch_ms": round(plain_s * 1000, 1),
            "sink_epoch_ms": round(sink_s * 1000, 1),
            "sink_overhead_ms": round((sink_s - plain_s) * 1000, 1),
            "sink_rows_per_s": round(ROWS / sink_s),
            "sink_vs_plain_parquet": round(plain_s / sink_s, 3),
            **writers,
        }
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print("bench_delta_sink:", json.dumps(result), flush=True)
    print(f"  empty epoch commit {result['empty_epoch_commit_ms']} ms; {ROWS}-row epoch: sink "
          f"{result['sink_epoch_ms']} ms vs plain parquet {result['plain_parquet_epoch_ms']} ms "
          f"(ratio {result['sink_vs_plain_parquet']})")
    for rows in WRITER_ROWS:
        print(f"  writers, {rows}-row epoch: delta-rs {result[f'delta_rs_{rows}_ms']} ms, delta-spark "
              f"{result[f'delta_spark_{rows}_ms']} ms (delta_spark_vs_delta_rs "
              f"{result[f'delta_spark_vs_delta_rs_{rows}']})")
    print(f"  a 1,000-row epoch on the driver: commit {result['driver_commit_ms_direct']} ms written into "
          f"the log vs {result['driver_commit_ms_delta_rs']} ms through delta-rs (CPU "
          f"{result['driver_commit_cpu_ms_direct']} vs {result['driver_commit_cpu_ms_delta_rs']} ms; "
          f"ratio {result['driver_commit_delta_rs_vs_direct']})")
    return result


WRITER_ROWS = (200, ROWS)


def _driver_commits(state: dict, work: Path) -> dict[str, float]:
    """Epochs of rows already on the driver: the append into the log vs delta-rs, interleaved."""
    import pyarrow as pa

    from connectors.delta.sink import DeltaEpochSink

    schema = pa.schema([("offset", pa.int64()), ("partition", pa.int32()), ("topic", pa.string()),
                        ("value", pa.binary())])
    sinks = {path: DeltaEpochSink(str(work / f"driver-{path}"), "bench", schema)
             for path in ("direct", "delta_rs")}
    sinks["delta_rs"].target.direct_head = lambda: None  # type: ignore[method-assign] - the path off
    wall: dict[str, list[float]] = {p: [] for p in sinks}
    cpu: dict[str, list[float]] = {p: [] for p in sinks}
    for e in range(DRIVER_EPOCHS + 1):
        rows = pa.table({"offset": list(range(e * 1000, (e + 1) * 1000)), "partition": [e % 100] * 1000,
                         "topic": ["bench"] * 1000, "value": [b"x" * 120] * 1000}, schema=schema)
        for path, sink in (sinks.items() if e % 2 else reversed(sinks.items())):
            t, c = time.perf_counter(), time.process_time()
            assert sink.commit_epoch(e, rows, state).committed
            if e:  # the first creates the table
                wall[path].append(time.perf_counter() - t)
                cpu[path].append(time.process_time() - c)
    out: dict[str, float] = {}
    for path in sinks:
        out[f"driver_commit_ms_{path}"] = round(sorted(wall[path])[len(wall[path]) // 2] * 1000, 2)
        out[f"driver_commit_cpu_ms_{path}"] = round(sum(cpu[path]) / len(cpu[path]) * 1000, 2)
    assert sinks["direct"].target.last_direct == DRIVER_EPOCHS + 1  # (version 0 created the table)
    assert sinks["delta_rs"].target.last_direct is None
    out["driver_commit_delta_rs_vs_direct"] = round(out["driver_commit_ms_delta_rs"]
                                                    / max(out["driver_commit_ms_direct"], 1e-9), 3)
    return out


def _writers(spark, df, state, work: Path) -> dict[str, float]:
    """Median epoch time of each writer on the same epochs, interleaved."""
    from connectors.delta.sink import DeltaEpochSink

    out: dict[str, float] = {}
    for rows in WRITER_ROWS:
        part = df.limit(rows).cache()
        part.count()
        times: dict[str, list[float]] = {"delta-rs": [], "delta-spark": []}
        sinks = {w: DeltaEpochSink(str(work / f"{w}-{rows}"), "bench", df.schema, writer=w) for w in times}
        for sink in sinks.values():  # warm-up: table creation and the first write of each path
            sink.commit_epoch(0, part, state)
        for e in range(1, EPOCHS + 2):
            for w, sink in (sinks.items() if e % 2 else reversed(sinks.items())):
                t = time.perf_counter()
                assert sink.commit_epoch(e, part, state).committed
                times[w].append(time.perf_counter() - t)
        rs, sp = (sorted(times[w])[len(times[w]) // 2] for w in ("delta-rs", "delta-spark"))
        out[f"delta_rs_{rows}_ms"] = round(rs * 1000, 1)
        out[f"delta_spark_{rows}_ms"] = round(sp * 1000, 1)
        out[f"delta_spark_vs_delta_rs_{rows}"] = round(rs / sp, 3)
        part.unpersist()
    return out


if __name__ == "__main__":
    main()
