"""Delta sink cost (issue 4): commit overhead per epoch, and write throughput vs plain Parquet.

* empty epochs: the state-only commit every idle epoch pays;
* 100k-row epochs: the sink (Spark writes Parquet into the table, delta-rs commits) against a plain
  ``df.write.parquet`` of the same rows, in the same run. Ratio = plain time / sink time (1.0 = free);
* the two writers on the same epochs (a live-sized epoch of 200 rows and a 100k-row one), interleaved:
  delta-rs (Spark writes the files, delta-rs commits them with the state) against delta-spark (one
  ``format("delta")`` write with ``txnAppId``/``txnVersion`` and the state in ``userMetadata``).
  ``delta_spark_vs_delta_rs`` = delta-rs time / delta-spark time (> 1: delta-spark is faster).
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
    return result


WRITER_ROWS = (200, ROWS)


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
