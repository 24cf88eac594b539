"""End-to-end backfill benchmark (issue 5).

Measured in one run, on the embedded broker, with the same connector and sink:

* baseline: a batch copy of the history offsets (one Kafka batch read -> one Delta commit);
* backfill: a job attached to the live source backfilling the same history while a producer writes a
  steady live stream; the time from attach to Finished. Ratio = baseline / backfill (goal >= 0.9);
* live latency (produce -> visible in the table, from the Kafka timestamp to the Delta commit timestamp
  of the version that added the row) of an already-Finished job, without and with the backfill running;
  ratio of the p99s (goal <= 1.2);
* what a user does instead of the service: a new Structured Streaming query from ``earliest`` with Spark's
  Kafka source and a Delta sink (delta-spark), timed until its committed offsets reach the live position
  it started at: ``backfill.ratio_vs_fresh_query`` = fresh-query seconds / backfill seconds (goal >= 1.0),
  and the Finished job's live p99 while it runs, ``live_p99.ratio_with_fresh_query`` (the backfill's
  should be below it).

Both the batch copy and the service read with the default connector (Spark's Kafka source) and the
options the service passes it (``SparkKafkaConnector.reader_options``: ``max.poll.records`` = 10,000 among
them); the fresh query is started as a user would, with Spark's defaults but the same
``kafka.max.poll.records`` (issue 30: the comparison is of the copy, not of a consumer setting a user can
set too).

``BENCH_BACKFILL_RECORDS`` (default 1,000,000) sets the history size; ``BENCH_BACKFILL_SOURCE``, a JSON
object, adds keys to the daemon's source (e.g. ``{"history_width": {"fixed_tasks": 2}}`` to copy without
the width governor, for an A/B of the same build).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import threading
import time
from pathlib import Path

from bench import plots
from bench.records import live, new_history

RECORDS = int(os.environ.get("BENCH_BACKFILL_RECORDS", "1000000"))
SOURCE_EXTRA = json.loads(os.environ.get("BENCH_BACKFILL_SOURCE", "{}"))
PARTITIONS = 4
LIVE_PER_S = 200.0
WINDOW_S = float(os.environ.get("BENCH_BACKFILL_WINDOW_S", "20"))


def _latencies(table: str, since_ms: float, until_ms: float) -> list[float]:
    """Per live row committed in the window: Delta commit time - Kafka record time, in ms."""
    import pyarrow.compute as pc
    from deltalake import DeltaTable

    dt = DeltaTable(table)
    history = {h["version"]: h["timestamp"] for h in dt.history()}
    import pyarrow as pa

    cdf = pa.table(dt.load_cdf(starting_version=0).read_all())
    versions = cdf.column("_commit_version").to_pylist()
    kafka_ts = pc.cast(cdf.column("timestamp"), "int64").to_pylist()  # microseconds
    out = []
    for v, ts in zip(versions, kafka_ts, strict=True):
        produced_ms = ts / 1000.0
        if since_ms <= produced_ms <= until_ms:
            out.append(history[v] - produced_ms)
    return out


def _pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _fresh_query(spark, bootstrap: str, topic: str, splits: list[str], admin, work: Path):  # noqa: ANN001, ANN202
    """A new Structured Streaming query from ``earliest`` (Spark's Kafka source, Delta sink), timed until
    its committed offsets reach the live position it started at; (seconds, window start, end in ms,
    ``(seconds, rows committed so far)`` at the end of each of its batches)."""
    from connectors.kafka.spark_kafka import SPARK_CONSUMER

    target = admin.end_offsets(splits)
    c0 = time.time() * 1000
    t = time.monotonic()
    query = (
        spark.readStream.format("kafka").option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", topic).option("startingOffsets", "earliest")
        .option("kafka.max.poll.records", SPARK_CONSUMER["max.poll.records"]).load()
        .writeStream.format("delta").option("checkpointLocation", str(work / "fresh-ckpt"))
        .trigger(processingTime="1 second").start(str(work / "fresh"))
    )
    try:
        while True:
            progress = query.lastProgress
            if progress and progress["sources"]:
                end = json.loads(progress["sources"][0]["endOffset"]) if isinstance(
                    progress["sources"][0]["endOffset"], str) else progress["sources"][0]["endOffset"]
                done = {f"{tp}:{p}": int(o) for tp, parts in (end or {}).items() for p, o in parts.items()}
                if all(done.get(s, -1) >= target[s] for s in splits):
                    break
            if query.exception() is not None:
                raise RuntimeError(str(query.exception()))
            time.sleep(0.2)
        seconds, c1 = time.monotonic() - t, time.time() * 1000
        return seconds, c0, c1, _batch_rows(query.recentProgress, c0)
    finally:
        query.stop()


def _batch_rows(progress: list[dict], start_ms: float) -> list[tuple[float, int]]:
    """``(seconds since start, rows so far)`` at the end of each batch of a query's progress."""
    from datetime import datetime

    out, rows = [], 0
    for p in sorted(progress, key=lambda p: p["batchId"]):
        began = datetime.fromisoformat(p["timestamp"].replace("Z", "+00:00")).timestamp() * 1000
        rows += int(p.get("numInputRows") or 0)
        out.append(((began + p["durationMs"].get("triggerExecution", 0) - start_ms) / 1000, rows))
    return out


def main() -> dict[str, float]:
    from connectors.delta.sink import DeltaEpochSink
    from connectors.kafka.admin import KafkaAdmin
    from connectors.kafka.embedded import EmbeddedBroker
    from connectors.kafka.spark_kafka import SparkKafkaConnector, read_ranges
    from source_backfill.config import SourceConfig, load_settings
    from source_backfill.core import HistoryRange
    from source_backfill.daemon import Daemon
    from source_backfill.runtime.spark import build_spark

    work = Path(tempfile.mkdtemp(prefix="bench-backfill-"))
    stop = threading.Event()
    with EmbeddedBroker() as broker:
        bootstrap = broker.bootstrap
        admin = KafkaAdmin(bootstrap)
        topic = "bench-backfill"
        new_history(admin, bootstrap, topic, RECORDS, PARTITIONS)
        splits = [f"{topic}:{p}" for p in range(PARTITIONS)]
        ends = admin.end_offsets(splits)
        spark = build_spark("local[*]", "bench-backfill")

        # -- baseline: batch copy of the same offsets with the same connector and sink ----------------
        history = [HistoryRange(s, 0, ends[s]) for s in splits]
        options = SparkKafkaConnector(SourceConfig(name="bench", topics=[topic]), bootstrap, spark,
                                      admin).reader_options()  # the service's
        read_ranges(spark, [HistoryRange(r.split, 0, min(r.end, 1000)) for r in history], options).count()
        t = time.monotonic()
        df = read_ranges(spark, history, options)
        DeltaEpochSink(str(work / "batch-copy"), "batch-copy", df.schema).commit_epoch(0, df, {"batch": True})
        batch_s = time.monotonic() - t
        print(f"baseline batch copy: {batch_s:.1f}s ({RECORDS / batch_s:,.0f} rows/s)", flush=True)

        # -- the daemon: a Finished live job, then a backfilling job attached mid-stream ----------------
        live_thread = threading.Thread(target=live, args=(bootstrap, topic, PARTITIONS, LIVE_PER_S, stop),
                                       daemon=True)
        live_thread.start()
        settings = load_settings(
            daemon={"state_root": str(work / "state")},
            api={"port": 0},
            metrics={"port": None},
            sources=[{"name": "bench", "bootstrap_servers": bootstrap, "topics": [topic],
                      "trigger_interval_s": 1.0, **SOURCE_EXTRA}],
            jobs=[{"name": "live", "source": "bench", "sink_path": str(work / "live"),
                   "start": {"kind": "offsets", "offsets": ends}}],
        )
        daemon = Daemon(settings)
        daemon.start()
        source = daemon.sources["bench"]
        while not (source.jobs["live"].backfill_done):
            time.sleep(0.5)
        time.sleep(3)
        a0 = time.time() * 1000
        time.sleep(WINDOW_S)
        a1 = time.time() * 1000

        from source_backfill.config import JobSpec

        t = time.monotonic()
        daemon.registry.create(JobSpec(name="bf", source="bench", sink_path=str(work / "bf")))
        b0 = time.time() * 1000
        backfilled = []  # (seconds, history rows as the API shows them: committed + read ahead)
        while "bf" not in source.jobs or not source.jobs["bf"].backfill_done:
            time.sleep(0.25)
            p = daemon.registry.progress("bf")
            if p is not None:
                backfilled.append((time.monotonic() - t, p.rows_history + p.rows_read_ahead))
        backfill_s = time.monotonic() - t
        b1 = time.time() * 1000
        print(f"backfill while live: {backfill_s:.1f}s ({RECORDS / backfill_s:,.0f} rows/s)", flush=True)
        time.sleep(3)

        # -- what a user does instead: a new streaming query from earliest into a Delta table ---------
        fresh_s, c0, c1, fresh_rows = _fresh_query(spark, bootstrap, topic, splits, admin, work)
        print(f"fresh query from earliest until caught up: {fresh_s:.1f}s", flush=True)
        time.sleep(3)
        stop.set()
        live_thread.join(10)
        daemon.stop()
        spark.stop()

        without = _latencies(str(work / "live"), a0, a1)
        with_bf = _latencies(str(work / "live"), b0, b1)
        with_fresh = _latencies(str(work / "live"), c0, c1)
    shutil.rmtree(work, ignore_errors=True)
    backfilled.append((backfill_s, RECORDS))
    plots.rows_per_s({"backfill (the service, live stream running)": backfilled,
                      "fresh query from earliest (what a user does instead)": fresh_rows},
                     f"History of {RECORDS:,} records: rows/s over time", "backfill_rows_per_s.png")
    plots.cdfs({"no concurrent work": without, "while the backfill runs": with_bf,
                "while the fresh query runs instead": with_fresh},
               "Live latency of a Finished job (produce -> visible in its Delta table)",
               "live_latency_cdf.png", "milliseconds")

    p99_a, p99_b, p99_c = _pct(without, 0.99), _pct(with_bf, 0.99), _pct(with_fresh, 0.99)
    ok = p99_a == p99_a and p99_a > 0
    result = {
        "history_records": RECORDS,
        "batch_copy_s": round(batch_s, 2),
        "backfill_s": round(backfill_s, 2),
        "fresh_query_s": round(fresh_s, 2),
        "backfill_vs_batch_copy": round(batch_s / backfill_s, 3),
        "backfill.ratio_vs_batch_copy": round(batch_s / backfill_s, 3),
        "backfill.ratio_vs_fresh_query": round(fresh_s / backfill_s, 3),
        "live_p99.ratio_with_backfill": round(p99_b / p99_a, 3) if ok else float("nan"),
        "live_p99.ratio_with_fresh_query": round(p99_c / p99_a, 3) if ok else float("nan"),
        "live_p99_ms_with_fresh_query": round(p99_c, 1),
        "live_samples_with_fresh_query": len(with_fresh),
        "live_p50_ms_without": round(_pct(without, 0.5), 1),
        "live_p99_ms_without": round(p99_a, 1),
        "live_p50_ms_with_backfill": round(_pct(with_bf, 0.5), 1),
        "live_p99_ms_with_backfill": round(p99_b, 1),
        "live_p99_ratio": round(p99_b / p99_a, 3) if p99_a == p99_a and p99_a > 0 else float("nan"),
        "live_samples_without": len(without),
        "live_samples_with": len(with_bf),
    }
    print("bench_backfill:", json.dumps(result), flush=True)
    print(f"  backfill speed vs batch copy: {result['backfill_vs_batch_copy']} (goal >= 0.9)")
    print(f"  backfill speed vs a fresh query from earliest: {result['backfill.ratio_vs_fresh_query']} "
          "(goal >= 1.0)")
    print(f"  live p99 with/without backfill: {result['live_p99_ratio']} (goal <= 1.2); with/without the "
          f"fresh query instead: {result['live_p99.ratio_with_fresh_query']} (goal: backfill's below it)")
    return result


if __name__ == "__main__":
    main()
