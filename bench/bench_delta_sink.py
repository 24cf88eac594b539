"""Delta sink cost (issue 4): commit overhead per epoch, and write throughput vs plain Parquet.

* empty epochs: the state-only commit every idle epoch pays;
* 100k-row epochs: the sink (Spark writes Parquet into the table, delta-rs commits) against a plain
  ``df.write.parquet`` of the same rows, in the same run. Ratio = plain time / sink time (1.0 = free).
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
        result = {
            "empty_epoch_commit_ms": round(empty_ms, 1),
            "rows_per_epoch": ROWS,
            "plain_parquet_epoch_ms": round(plain_s * 1000, 1),
            "sink_epoch_ms": round(sink_s * 1000, 1),
            "sink_overhead_ms": round((sink_s - plain_s) * 1000, 1),
            "sink_rows_per_s": round(ROWS / sink_s),
            "sink_vs_plain_parquet": round(plain_s / sink_s, 3),
        }
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print("bench_delta_sink:", json.dumps(result), flush=True)
    print(f"  empty epoch commit {result['empty_epoch_commit_ms']} ms; {ROWS}-row epoch: sink "
          f"{result['sink_epoch_ms']} ms vs plain parquet {result['plain_parquet_epoch_ms']} ms "
          f"(ratio {result['sink_vs_plain_parquet']})")
    return result


if __name__ == "__main__":
    main()
