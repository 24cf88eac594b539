"""History width: one partition's history copied on 1 and on 2 Spark tasks, in one run (``scale.``).

All on the embedded broker, one topic of ``BENCH_SCALE_RECORDS`` (1,000,000; 100,000 with ``--quick``)
~130-byte records on **one** partition (so the daemon must cut the range into offset pieces to copy it
on 2 tasks), Spark ``local[2]``. One SparkSession serves the whole run: it is built first, the plain reads
run in it while no daemon runs, and each daemon's ``build_spark`` gets it back (``getOrCreate``;
``Daemon.stop`` leaves Spark running). Keys:

* the daemon's copy at a fixed width (``history_width.fixed_tasks`` = 1, then 2; one daemon at a time; no
  live job nor producer): a job from ``earliest``, timed from create to Finished (every copy, governed too,
  is created just after an epoch of a running source: the same trigger phase): ``scale.history_s_1_task``,
  ``scale.history_s_2_tasks``, ``scale.history_speedup_2_slots`` = t1 / t2;
* Spark's own ceiling: a plain batch read of the same offsets (``read_ranges`` with the service's reader
  options, cut by ``pieces_for_tasks``) written to Parquet on 1 and on 2 tasks:
  ``scale.plain_read_s_1_task``, ``scale.plain_read_s_2_tasks``, ``scale.plain_read_speedup_2_tasks``;
  ``scale.history_speedup_vs_plain`` = the daemon's speedup / Spark's (goal >= 0.9);
* the same for the fixed-width copies' reads ahead alone (``bench.meters.ReadSeconds``: a copy of 1M
  records at a 1 s trigger waits on epoch boundaries, its attach and the adoption, which quantize its
  create-to-Finished time): ``scale.history_read_s_1_task``, ``..._2_tasks``,
  ``scale.history_read_speedup_2_slots``, ``scale.history_read_speedup_vs_plain``;
* the governed run (default ``history_width``): a Finished job ``live`` while 200 live rows/s are
  produced, then a job copying the history: ``scale.history_s_governed``, ``scale.governed_vs_1_task`` =
  t1 / t_governed (goal >= 1.0), ``scale.live_p99_ratio_governed`` = the ``live`` job's p99 while the copy
  runs / idle (goal <= 1.2), and the widths the governor chose while copying (sampled every 0.25 s):
  ``scale.governed_width_max``, ``scale.governed_width_last``.

Fixed widths and plain reads alternate over ``BENCH_SCALE_ROUNDS`` (2) rounds (1, 2, 2, 1, ...); medians.
Warm-ups, not timed: a 1,000-offset plain read in 2 pieces into Parquet, and one daemon copying a topic of
1,000 records. ``scale.governor_idle_p99_s``, ``scale.governor_target_s``: the idle p99 the governor had
when the copy was created and the target of its last step (None: it took none).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from bench.bench_backfill import _latencies, _pct
from bench.meters import ReadSeconds
from bench.records import fill, live, new_history

QUICK = os.environ.get("BENCH_QUICK") == "1"
RECORDS = int(os.environ.get("BENCH_SCALE_RECORDS", "100000" if QUICK else "1000000"))
ROUNDS = int(os.environ.get("BENCH_SCALE_ROUNDS", "2"))
PARTITIONS = 1
LIVE_PER_S = 200.0
WINDOW_S = float(os.environ.get("BENCH_SCALE_WINDOW_S", "20"))
#: A copy not Finished after this long fails the benchmark (rather than hanging it).
COPY_TIMEOUT_S = 1800.0


class _Lines(logging.Handler):
    """Keeps the governor's log lines (``history width source=... tasks=1->2 ...``) for the report."""

    lines: list[str]

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def _order(rounds: int) -> list[int]:
    """The widths in turn: 1, 2, 2, 1, 1, 2, ..."""
    return [w for r in range(rounds) for w in ((1, 2) if r % 2 == 0 else (2, 1))]


def _daemon(work: Path, tag: str, bootstrap: str, topic: str, width: dict[str, int],
            jobs: list[dict[str, Any]] | None = None, **source: Any) -> Any:  # noqa: ANN401 - a started Daemon
    """A started in-process daemon of one source ``bench`` on ``topic`` (``source``: more of its keys)."""
    from source_backfill.config import load_settings
    from source_backfill.daemon import Daemon

    settings = load_settings(
        daemon={"state_root": str(work / f"state-{tag}")},
        api={"port": 0},
        metrics={"port": None},
        spark={"master": "local[2]"},
        sources=[{"name": "bench", "bootstrap_servers": bootstrap, "topics": [topic],
                  "trigger_interval_s": 1.0, "history_width": width, **source}],
        jobs=jobs or [],
    )
    daemon = Daemon(settings)
    daemon.start()
    source, t = daemon.sources["bench"], time.monotonic()
    # a job created before the query's first epoch would wait for it: copies start from a running source
    while source.last_epoch is None or source.last_epoch < 1:
        if time.monotonic() - t > 120:
            daemon.stop()
            msg = "the source ran no epoch in 120 s"
            raise RuntimeError(msg)
        time.sleep(0.1)
    return daemon


def _copy(daemon: Any, name: str, sink: Path, widths: list[tuple[float, int]] | None = None,  # noqa: ANN401
          **spec: Any) -> float:  # noqa: ANN401
    """Create a job from ``earliest`` just after an epoch; seconds from create until it is Finished.

    ``widths``: ``(seconds, source width)`` appended every 0.25 s from the job's attach until it is
    Finished (the job's ``copying`` flag is only set at its epochs: it would miss a short copy).
    ``spec``: more of the job's keys.
    """
    from source_backfill.config import JobSpec

    source = daemon.sources["bench"]
    epoch, t = source.last_epoch, time.monotonic()
    while source.last_epoch == epoch and time.monotonic() - t < 60:  # every copy is created at the same
        time.sleep(0.02)  # phase of the trigger: just after an epoch
    t = time.monotonic()
    daemon.registry.create(JobSpec(name=name, source="bench", sink_path=str(sink), **spec))
    sampled = t
    while True:
        job = source.jobs.get(name)
        if job is not None and job.failed is not None:
            msg = f"job {name} failed: {job.failed}"
            raise RuntimeError(msg)
        if job is not None and job.backfill_done:
            return time.monotonic() - t
        if time.monotonic() - t > COPY_TIMEOUT_S:
            msg = f"job {name} not Finished after {COPY_TIMEOUT_S:g}s"
            raise RuntimeError(msg)
        if widths is not None and job is not None and time.monotonic() - sampled >= 0.25:
            sampled = time.monotonic()
            widths.append((sampled - t, source.width.width))
        time.sleep(0.02)  # the Finished state is seen within 20 ms (it was 0.25 s: a coarse clock)


def _fixed_copy(work: Path, tag: str, bootstrap: str, topic: str, tasks: int,
                reads: ReadSeconds | None = None) -> float:
    """Seconds a daemon with ``fixed_tasks`` = ``tasks`` takes to copy ``topic`` (then it is stopped).

    ``reads``: started here, it sums the copy's reads ahead alone.
    """
    daemon = _daemon(work, tag, bootstrap, topic, {"fixed_tasks": tasks})
    try:
        if reads is not None:
            reads.start()
        return _copy(daemon, "h", work / f"table-{tag}")
    finally:
        daemon.stop()
        shutil.rmtree(work / f"table-{tag}", ignore_errors=True)
        shutil.rmtree(work / f"state-{tag}", ignore_errors=True)


def main() -> dict[str, Any]:
    from connectors.kafka.admin import KafkaAdmin
    from connectors.kafka.embedded import EmbeddedBroker
    from connectors.kafka.spark_kafka import SparkKafkaConnector, read_ranges
    from source_backfill.config import SourceConfig
    from source_backfill.core import HistoryRange
    from source_backfill.core.governor import pieces_for_tasks
    from source_backfill.runtime.spark import build_spark

    work = Path(tempfile.mkdtemp(prefix="bench-scale-history-"))
    governor_log = _Lines()
    governor_log.lines = []
    width_logger = logging.getLogger("source_backfill.runtime.width")
    width_logger.addHandler(governor_log)
    level = width_logger.level
    width_logger.setLevel(logging.INFO)
    stop = threading.Event()
    meter = ReadSeconds()
    try:
        with EmbeddedBroker() as broker:
            bootstrap = broker.bootstrap
            admin = KafkaAdmin(bootstrap)
            topic = "bench-scale-history"
            new_history(admin, bootstrap, topic, RECORDS, PARTITIONS)
            split = f"{topic}:0"
            ends = admin.end_offsets([split])
            history = [HistoryRange(split, 0, ends[split])]
            spark = build_spark("local[2]", "bench-scale", python_sources=False)

            # -- Spark's own ceiling: a plain batch read of the offsets into Parquet, 1 vs 2 tasks ----
            options = SparkKafkaConnector(SourceConfig(name="bench", topics=[topic]), bootstrap, spark,
                                          admin).reader_options()  # the service's
            warm = pieces_for_tasks([HistoryRange(split, 0, min(ends[split], 1000))], 2, min_piece=1)
            read_ranges(spark, warm, options).coalesce(2).write.mode("overwrite").parquet(str(work / "plain"))
            plain: dict[int, list[float]] = {1: [], 2: []}
            for tasks in _order(ROUNDS):
                pieces = pieces_for_tasks(history, tasks, min_piece=1)
                t = time.monotonic()
                read_ranges(spark, pieces, options).coalesce(tasks).write.mode("overwrite").parquet(
                    str(work / "plain"))
                plain[tasks].append(round(time.monotonic() - t, 2))
                print(f"plain read, {tasks} task(s), {len(pieces)} piece(s): {plain[tasks][-1]:.1f}s",
                      flush=True)
            shutil.rmtree(work / "plain", ignore_errors=True)

            # -- the daemon's copy at a fixed width, one daemon at a time -----------------------------
            admin.create_topic(f"{topic}-warm", PARTITIONS)  # the first daemon's copy is not timed
            fill(bootstrap, f"{topic}-warm", 1000, PARTITIONS)
            _fixed_copy(work, "warm", bootstrap, f"{topic}-warm", 2)
            fixed: dict[int, list[float]] = {1: [], 2: []}
            reads: dict[int, list[float]] = {1: [], 2: []}
            for i, tasks in enumerate(_order(ROUNDS)):
                seconds = _fixed_copy(work, f"w{tasks}-{i}", bootstrap, topic, tasks, meter)
                fixed[tasks].append(round(seconds, 2))
                reads[tasks].append(round(meter.total, 2))
                print(f"history copy, fixed_tasks={tasks}: {fixed[tasks][-1]:.1f}s (its reads ahead "
                      f"{reads[tasks][-1]:.2f}s)", flush=True)

            # -- the governed run: a Finished job under a live stream, then a copy ------------------
            producer = threading.Thread(target=live, args=(bootstrap, topic, PARTITIONS, LIVE_PER_S, stop),
                                        daemon=True)
            producer.start()
            daemon = _daemon(work, "governed", bootstrap, topic, {}, jobs=[
                {"name": "live", "source": "bench", "sink_path": str(work / "live"),
                 "start": {"kind": "offsets", "offsets": ends}}])
            widths: list[tuple[float, int]] = []
            try:
                source = daemon.sources["bench"]
                while "live" not in source.jobs or not source.jobs["live"].backfill_done:
                    time.sleep(0.5)
                time.sleep(3)
                a0 = time.time() * 1000
                time.sleep(WINDOW_S)
                a1 = time.time() * 1000
                b0, idle_s = time.time() * 1000, source.width.idle_p99(time.monotonic())
                governed_s = _copy(daemon, "governed", work / "governed", widths)
                target_s = source.width.target_s
                b1 = time.time() * 1000
                print(f"history copy, governed: {governed_s:.1f}s", flush=True)
                time.sleep(3)
            finally:
                stop.set()
                producer.join(10)
                daemon.stop()
            spark.stop()
            idle = _latencies(str(work / "live"), a0, a1)
            during = _latencies(str(work / "live"), b0, b1)
    finally:
        meter.stop()
        stop.set()
        width_logger.removeHandler(governor_log)
        width_logger.setLevel(level)
        shutil.rmtree(work, ignore_errors=True)

    t1, t2 = statistics.median(fixed[1]), statistics.median(fixed[2])
    r1, r2 = statistics.median(reads[1]), statistics.median(reads[2])
    p1, p2 = statistics.median(plain[1]), statistics.median(plain[2])
    p99_idle, p99_during = _pct(idle, 0.99), _pct(during, 0.99)
    ok = p99_idle == p99_idle and p99_idle > 0
    result: dict[str, Any] = {
        "scale.history_records": RECORDS,
        "scale.history_s_1_task": round(t1, 2),
        "scale.history_s_2_tasks": round(t2, 2),
        "scale.history_speedup_2_slots": round(t1 / t2, 3),
        "scale.plain_read_s_1_task": round(p1, 2),
        "scale.plain_read_s_2_tasks": round(p2, 2),
        "scale.plain_read_speedup_2_tasks": round(p1 / p2, 3),
        "scale.history_speedup_vs_plain": round((t1 / t2) / (p1 / p2), 3),
        "scale.history_read_s_1_task": round(r1, 2),
        "scale.history_read_s_2_tasks": round(r2, 2),
        "scale.history_read_speedup_2_slots": round(r1 / r2, 3) if r2 else None,
        "scale.history_read_speedup_vs_plain": round((r1 / r2) / (p1 / p2), 3) if r2 else None,
        "scale.history_s_governed": round(governed_s, 2),
        "scale.governed_vs_1_task": round(t1 / governed_s, 3),
        "scale.live_p99_ms_idle": round(p99_idle, 1),
        "scale.live_p99_ms_governed": round(p99_during, 1),
        "scale.live_p99_ratio_governed": round(p99_during / p99_idle, 3) if ok else float("nan"),
        "scale.live_samples_idle": len(idle),
        "scale.live_samples_governed": len(during),
        "scale.governor_idle_p99_s": round(idle_s, 3),  # the governor's own idle figure, at create
        "scale.governor_target_s": round(target_s, 3) if target_s is not None else None,
        "scale.governed_width_max": max((w for _, w in widths), default=None),
        "scale.governed_width_last": widths[-1][1] if widths else None,
    }
    changes = [(round(s, 1), w) for i, (s, w) in enumerate(widths) if i == 0 or widths[i - 1][1] != w]
    print("bench_scale_history:", json.dumps(result), flush=True)
    print(f"  history copy (s) 1 task {fixed[1]}, 2 tasks {fixed[2]}: speedup "
          f"{result['scale.history_speedup_2_slots']}; plain read (s) 1 task {plain[1]}, 2 tasks {plain[2]}: "
          f"speedup {result['scale.plain_read_speedup_2_tasks']}")
    print(f"  history speedup on 2 slots vs Spark's plain read: {result['scale.history_speedup_vs_plain']} "
          "(goal >= 0.9)")
    print(f"  the reads ahead alone (s) 1 task {reads[1]}, 2 tasks {reads[2]}: speedup "
          f"{result['scale.history_read_speedup_2_slots']}, vs Spark's plain read "
          f"{result['scale.history_read_speedup_vs_plain']}")
    print(f"  governed copy vs 1 task: {result['scale.governed_vs_1_task']} (goal >= 1.0); widths "
          f"(s since create, tasks): {changes}")
    print(f"  live p99 while the governed copy runs / idle: {result['scale.live_p99_ratio_governed']} "
          "(goal <= 1.2)")
    for line in governor_log.lines:
        print(f"  governor: {line}")
    return result


if __name__ == "__main__":
    main()
