"""A table larger than the driver: a 20M-row table backfill against a 1M-row one (issue 30, ``scale.``).

Each size is a static Delta table (``id`` and a ~50-byte ``payload``, written in 1M-row slices so this
process never holds it), copied by one snapshot job of a daemon process (a 1 s trigger) that runs Spark
for its tables (``spark.tables = true``, ``local[2]``): both versions are at least ``spark_copy_rows``
(1M by default), so both go by files on Spark. The daemon's process tree (Python and its Spark JVM) is
sampled every 0.25 s from job creation until the job reports ``finished``. The baseline, in the same
run, is what a user does once by hand: a plain Spark read of the same version written into a new Delta
table (in this process's Spark, stopped before the daemons start, its first read untimed). The 1M table
is also copied on the driver with delta-rs (``spark_copy_rows`` off), for where the threshold lies. Keys:

* ``scale.table_rss_ratio_20m_vs_1m``: peak RSS of the daemon's process tree, 20M over 1M (goal ≤ 1.3:
  the copy's memory does not grow with the table);
* ``scale.table20m.ratio_vs_plain_read``: plain-read seconds ÷ the job's (create to finished; goal ≥ 0.9);
* ``scale.table1m.*``, ``scale.table20m.*``: each size's seconds, rows/s, peak RSS;
* ``scale.table1m.delta_rs_copy_s``, ``scale.table1m.spark_vs_delta_rs``: the 1M copy on the driver, and
  its seconds over the copy by Spark's;
* ``scale.threshold.<rows>.spark_s`` / ``.delta_rs_s`` / ``.spark_vs_delta_rs``: smaller tables (100k,
  300k rows) copied both ways, for where the default ``spark_copy_rows`` (1M) lies against the crossover.

A soak-sized run (~4 min): it runs when named (``make bench BENCH_ARGS=scale_table``).
``BENCH_SCALE_TABLE_ROWS`` sets the large size (20M; 2M with ``--quick``).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

QUICK = os.environ.get("BENCH_QUICK") == "1"
SMALL = 100_000 if QUICK else 1_000_000
LARGE = int(os.environ.get("BENCH_SCALE_TABLE_ROWS", "2000000" if QUICK else "20000000"))
#: Smaller tables copied both ways (the threshold ``spark_copy_rows`` against the crossover).
THRESHOLD_SIZES = (10_000,) if QUICK else (100_000, 300_000)
#: Rows per slice the source table is written in.
SLICE = 1_000_000
COPY_TIMEOUT_S = 3600.0


def _source(path: Path, rows: int) -> int:
    """A Delta table of ``rows`` rows (change data feed on), written slice by slice; its version."""
    import pyarrow as pa
    import pyarrow.compute as pc
    from deltalake import DeltaTable, write_deltalake

    for start in range(0, rows, SLICE):
        ids = pa.array(range(start, min(rows, start + SLICE)), pa.int64())
        payload = pc.binary_join_element_wise(pc.cast(ids, pa.string()), "y" * 40, "")
        write_deltalake(str(path), pa.table({"id": ids, "payload": payload}),
                        mode="append" if start else "error",
                        configuration=None if start else {"delta.enableChangeDataFeed": "true"})
    return int(DeltaTable(str(path)).version())


def _plain_read(spark: Any, src: Path, version: int, dst: Path) -> float:  # noqa: ANN401
    t0 = time.monotonic()
    df = spark.read.format("delta").option("versionAsOf", version).load(str(src))
    df.write.format("delta").save(str(dst))
    return time.monotonic() - t0


def _config(work: Path, src: Path, port: int, *, spark: bool) -> Path:
    config = work / "config.toml"
    config.write_text(f"""
[daemon]
state_root = "{work / 'state'}"
[spark]
master = "local[2]"
tables = {str(spark).lower()}
[api]
port = {port}
[metrics]
port = false
[[sources]]
name = "tbl"
kind = "delta"
table_path = "{src}"
primary_key = ["id"]
trigger_interval_s = 1.0
spark_copy_rows = {0 if spark else "false"}
""")
    return config


def _copy(work: Path, src: Path, rows: int, *, spark: bool = True) -> dict[str, float]:
    """One snapshot job of a fresh daemon copies ``src``: seconds (create to finished), peak tree RSS."""
    from source_backfill.testing.process import DaemonProcess, free_port

    port = free_port()
    daemon = DaemonProcess(_config(work, src, port, spark=spark), port, work / "daemon.log")
    daemon.start()
    try:
        daemon.wait_ready(240)
        peak, t = daemon.tree_rss_bytes(), time.monotonic()
        r = daemon.request("POST", "/jobs", {"name": "copy", "source": "tbl", "strategy": "snapshot",
                                             "sink_path": str(work / "copy")})
        if r is None or r.status_code != 201:
            msg = f"table bench: job not created: {None if r is None else r.text}"
            raise RuntimeError(msg)
        while True:
            peak = max(peak, daemon.tree_rss_bytes())
            job = daemon.get("/jobs/copy")
            status = job.json().get("status") if job is not None and job.status_code == 200 else None
            if status == "finished":
                break
            if status == "failed" or time.monotonic() - t > COPY_TIMEOUT_S:
                msg = f"table bench: {rows} rows not copied ({status}): {daemon.tail()}"
                raise RuntimeError(msg)
            time.sleep(0.25)
        seconds = time.monotonic() - t
    finally:
        daemon.stop()
    from deltalake import DeltaTable

    copied = DeltaTable(str(work / "copy")).to_pyarrow_dataset().count_rows()
    if copied != rows:
        msg = f"table bench: the job's table holds {copied} rows, the source {rows}"
        raise RuntimeError(msg)
    return {"seconds": seconds, "peak_rss_mib": peak / 2**20}


def _threshold(root: Path) -> dict[str, float]:
    """Tables of ``THRESHOLD_SIZES`` rows copied by Spark (by files) and on the driver (delta-rs)."""
    out: dict[str, float] = {}
    for rows in THRESHOLD_SIZES:
        src = root / f"t{rows}" / "src"
        _source(src, rows)
        seconds = {}
        for engine, spark in (("spark", True), ("delta_rs", False)):
            work = root / f"t{rows}" / engine
            work.mkdir()
            seconds[engine] = _copy(work, src, rows, spark=spark)["seconds"]
        key = f"scale.threshold.{rows}"
        out.update({f"{key}.spark_s": round(seconds["spark"], 2),
                    f"{key}.delta_rs_s": round(seconds["delta_rs"], 2),
                    f"{key}.spark_vs_delta_rs": round(seconds["delta_rs"] / seconds["spark"], 3)})
        print(f"  {rows:>11,} rows: by Spark {seconds['spark']:.2f}s, on the driver "
              f"{seconds['delta_rs']:.2f}s", flush=True)
        shutil.rmtree(root / f"t{rows}", ignore_errors=True)
    return out


def main() -> dict[str, Any]:
    from source_backfill.runtime.spark import build_spark

    root = Path(tempfile.mkdtemp(prefix="bench-scale-table-"))
    sizes = {"table1m": SMALL, "table20m": LARGE}
    result: dict[str, Any] = {}
    try:
        versions = {}
        for key, rows in sizes.items():
            t = time.monotonic()
            versions[key] = _source(root / key / "src", rows)
            print(f"scale table: {rows:,} rows written in {time.monotonic() - t:.1f}s", flush=True)
        spark = build_spark("local[2]", "bench-scale-table")
        _plain_read(spark, root / "table1m" / "src", versions["table1m"], root / "warm")  # untimed
        plain = {key: _plain_read(spark, root / key / "src", versions[key], root / key / "plain")
                 for key in sizes}
        spark.stop()
        (root / "driver").mkdir()
        driver = _copy(root / "driver", root / "table1m" / "src", SMALL, spark=False)
        shutil.rmtree(root / "driver", ignore_errors=True)
        print(f"  {SMALL:>11,} rows on the driver (delta-rs): {driver['seconds']:.1f}s", flush=True)
        result["scale.table1m.delta_rs_copy_s"] = round(driver["seconds"], 2)
        result.update(_threshold(root))
        for key, rows in sizes.items():
            shutil.rmtree(root / key / "plain", ignore_errors=True)
            run = _copy(root / key, root / key / "src", rows)
            result.update({
                f"scale.{key}.rows": rows,
                f"scale.{key}.copy_s": round(run["seconds"], 2),
                f"scale.{key}.plain_read_s": round(plain[key], 2),
                f"scale.{key}.rows_per_s": round(rows / run["seconds"]),
                f"scale.{key}.peak_rss_mib": round(run["peak_rss_mib"], 1),
                f"scale.{key}.ratio_vs_plain_read": round(plain[key] / run["seconds"], 3),
            })
            seconds, rss = run["seconds"], run["peak_rss_mib"]
            print(f"  {rows:>11,} rows: copied in {seconds:.1f}s ({rows / seconds:,.0f} rows/s) vs a plain "
                  f"Spark read {plain[key]:.1f}s; peak RSS {rss:,.0f} MiB", flush=True)
            shutil.rmtree(root / key, ignore_errors=True)
        result["scale.table1m.spark_vs_delta_rs"] = round(
            driver["seconds"] / result["scale.table1m.copy_s"], 3)
        result["scale.table_rss_ratio_20m_vs_1m"] = round(
            result["scale.table20m.peak_rss_mib"] / result["scale.table1m.peak_rss_mib"], 3)
        print(f"  rss ratio 20m/1m: {result['scale.table_rss_ratio_20m_vs_1m']} (goal <= 1.3); 20m vs plain "
              f"read: {result['scale.table20m.ratio_vs_plain_read']} (goal >= 0.9)", flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return result


if __name__ == "__main__":
    main()
