"""What a caught-up source costs per trigger, and how fast a daemon is ready.

* ``trigger.caught_up_p50_s`` / ``trigger.caught_up_p99_s``: Spark's ``durationMs.triggerExecution`` of
  the live query of a caught-up source — two Finished jobs, a producer at 200 rows/s over 4 partitions,
  a 1 s trigger — over ``WINDOW_S`` seconds after a warm-up (goal p50 <= 0.25 s). Measured in-process
  (the query's ``recentProgress``), with the default connector and ``trigger.python_caught_up_p50_s``
  with the Python one, in the same run.
* ``startup.ready_s``: ``source-backfill run`` as a process, from its start until ``/ready`` is 200
  (the live stream running, every source healthy), on a fresh state root; ``startup.restart_ready_s``:
  the same daemon started again on its state (goal <= 12 s).

``BENCH_QUICK=1``: a 10 s window.
"""

from __future__ import annotations

import os
import shutil
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

QUICK = os.environ.get("BENCH_QUICK") == "1"
WINDOW_S = 10.0 if QUICK else 60.0
WARMUP_S = 5.0 if QUICK else 20.0
LIVE_PER_S = 200.0
PARTITIONS = 4


def _producer(bootstrap: str, topic: str, stop: threading.Event) -> threading.Thread:
    from confluent_kafka import Producer

    def run() -> None:
        p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "log_level": 3})
        i = 0
        while not stop.wait(10 / LIVE_PER_S):
            for _ in range(10):
                p.produce(topic, value=f"live-{i}".encode() * 10, partition=i % PARTITIONS)
                i += 1
            p.poll(0)
        p.flush(10)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def _caught_up(bootstrap: str, work: Path, connector: str) -> list[float]:
    """Trigger durations (s) of a caught-up source with two Finished jobs."""
    from connectors.kafka.admin import KafkaAdmin
    from source_backfill.config import load_settings
    from source_backfill.daemon import Daemon

    topic = f"trigger-{connector}-{int(time.time())}"
    KafkaAdmin(bootstrap).create_topic(topic, PARTITIONS)
    stop = threading.Event()
    thread = _producer(bootstrap, topic, stop)
    settings = load_settings(
        daemon={"state_root": str(work / f"state-{connector}")},
        api={"port": 0},
        metrics={"port": None},
        sources=[{"name": "src", "bootstrap_servers": bootstrap, "topics": [topic], "connector": connector,
                  "trigger_interval_s": 1.0}],
        jobs=[{"name": f"{connector}-{n}", "source": "src", "sink_path": str(work / f"{connector}-{n}")}
              for n in ("a", "b")],
    )
    daemon = Daemon(settings)
    daemon.start()
    try:
        source = daemon.sources["src"]
        deadline = time.monotonic() + 180
        while not (len(source.jobs) == 2 and all(j.backfill_done for j in source.jobs.values())):
            if time.monotonic() > deadline:
                msg = "jobs not finished within 180 s"
                raise RuntimeError(msg)
            time.sleep(0.5)
        time.sleep(WARMUP_S)
        first = source._query.lastProgress["batchId"]  # noqa: SLF001
        time.sleep(WINDOW_S)
        progress = [p for p in source._query.recentProgress if p["batchId"] > first]  # noqa: SLF001
        return [p["durationMs"]["triggerExecution"] / 1000.0 for p in progress]
    finally:
        daemon.stop()
        stop.set()
        thread.join(30)


def _ready(bootstrap: str, work: Path) -> tuple[float, float]:
    """Seconds to ``/ready`` of a daemon process: fresh, then started again on the same state."""
    from connectors.kafka.admin import KafkaAdmin
    from source_backfill.testing.process import DaemonProcess, free_port

    topic = f"ready-{int(time.time())}"
    KafkaAdmin(bootstrap).create_topic(topic, PARTITIONS)
    port = free_port()
    config = work / "ready.toml"
    config.write_text(
        f'[daemon]\nstate_root = "{work / "ready-state"}"\n[api]\nport = {port}\n[metrics]\nport = false\n'
        f'[[sources]]\nname = "src"\nbootstrap_servers = "{bootstrap}"\ntopics = ["{topic}"]\n'
        f'[[jobs]]\nname = "r"\nsource = "src"\nsink_path = "{work / "ready-job"}"\n'
    )
    times = []
    for _ in range(2):
        proc = DaemonProcess(config, port, work / "ready.log")
        proc.start()
        try:
            times.append(proc.wait_ready())
        finally:
            proc.stop()
    return times[0], times[1]


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> dict[str, Any]:
    from connectors.kafka.embedded import EmbeddedBroker
    from source_backfill.runtime.spark import build_spark

    work = Path(tempfile.mkdtemp(prefix="bench-trigger-"))
    broker = EmbeddedBroker().start()
    result: dict[str, Any] = {}
    try:
        build_spark("local[*]", "bench-trigger")
        for connector in ("spark", "python"):
            durations = _caught_up(broker.bootstrap, work, connector)
            prefix = "trigger." if connector == "spark" else "trigger.python_"
            result[f"{prefix}caught_up_p50_s"] = round(statistics.median(durations), 3)
            result[f"{prefix}caught_up_p99_s"] = round(_pct(durations, 0.99), 3)
            result[f"{prefix}caught_up_triggers"] = len(durations)
            print(f"  {connector:<7} caught-up trigger: p50 {result[f'{prefix}caught_up_p50_s']:.3f} s, p99 "
                  f"{result[f'{prefix}caught_up_p99_s']:.3f} s over {len(durations)} triggers (goal p50 <= "
                  f"0.25 s)", flush=True)
        fresh, again = _ready(broker.bootstrap, work)
        result["startup.ready_s"] = round(fresh, 2)
        result["startup.restart_ready_s"] = round(again, 2)
        print(f"  daemon process to /ready: {fresh:.1f} s fresh, {again:.1f} s on its state (goal <= 12 s)",
              flush=True)
    finally:
        broker.stop()
        shutil.rmtree(work, ignore_errors=True)
    return result


if __name__ == "__main__":
    main()
