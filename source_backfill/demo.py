"""``make run``: the daemon on the embedded default, with a live producer and a job attached mid-stream.

1. start the embedded Apache Kafka broker (its log under ``--state-root``) and fill a 4-partition topic
   with uneven history;
2. start a demo producer writing a steady live stream;
3. start the daemon with one job (``live-copy``) and wait for it to catch up;
4. attach a second job (``late-copy``) through the HTTP API while the producer keeps writing, and show
   its per-split backfill progressing to Finished;
5. keep running (metrics and API URLs printed) until Ctrl-C, which stops everything it started.

Run again, it resumes: the broker keeps its log, the jobs their tables and state (``--fresh`` starts over).
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import signal
import threading
import time
import warnings
from pathlib import Path
from typing import Any

logger = logging.getLogger("source_backfill.demo")

TOPIC = "demo-events"


def _producer(bootstrap: str, rate: float, stop: threading.Event) -> None:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    n = 0
    period = 1.0 / rate
    next_at = time.monotonic()
    while not stop.is_set():
        value = json.dumps({"n": n, "at": time.time(), "kind": "live"}).encode()
        producer.produce(TOPIC, key=str(n % 97).encode(), value=value, partition=n % 4)
        n += 1
        next_at += period
        delay = next_at - time.monotonic()
        if delay > 0:
            stop.wait(delay)
        producer.poll(0)
    producer.flush(10)


def _fill_history(bootstrap: str, records: int) -> None:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "batch.num.messages": 10_000})
    weights = [4, 3, 2, 1]  # uneven history per partition
    total_w = sum(weights)
    for partition, weight in enumerate(weights):
        for i in range(records * weight // total_w):
            value = json.dumps({"n": i, "kind": "history", "pad": "x" * 80}).encode()
            producer.produce(TOPIC, key=str(i % 97).encode(), value=value, partition=partition)
            if i % 10_000 == 0:
                producer.poll(0)
    producer.flush(60)


def _bar(done: int, total: int, width: int = 20) -> str:
    frac = 1.0 if total <= 0 else min(1.0, done / total)
    filled = round(frac * width)
    return "[" + "#" * filled + "-" * (width - filled) + f"] {frac * 100:5.1f}%"


def _eta(seconds: float | None) -> str:
    return "?" if seconds is None else f"{seconds:.0f}s"


def _show(job: dict[str, Any]) -> None:
    print(
        f"  {job['name']}: {job['status']} splits {job['splits_finished']}/{job['splits_total']} "
        f"history={job['rows_history']} live={job['rows_live']} eta={_eta(job.get('eta_seconds'))}",
        flush=True,
    )
    for s in job.get("splits", []):
        target = s.get("target_offset")
        done = s.get("backfilled_offset")
        total = (target or 0) + 1
        print(f"    {s['split']:<16} {_bar((done if done is not None else -1) + 1, total)} {s['stage']}",
              flush=True)


def _spark_log_to_file(path: Path) -> dict[str, str]:
    """Spark conf sending the JVM's log4j lines to ``path``: the console shows the demo, not Spark."""
    path.parent.mkdir(parents=True, exist_ok=True)
    conf = path.with_name("log4j2.properties")
    conf.write_text(
        "status = error\n"
        "appender.file.type = File\n"
        "appender.file.name = file\n"
        f"appender.file.fileName = {path.resolve()}\n"
        "appender.file.layout.type = PatternLayout\n"
        "appender.file.layout.pattern = %d{HH:mm:ss} %p %c{1}: %m%n\n"
        "rootLogger.level = warn\n"
        "rootLogger.appenderRef.file.ref = file\n"
    )
    return {"spark.driver.extraJavaOptions": f"-Dlog4j2.configurationFile=file:{conf.resolve()}"}


def main(argv: list[str] | None = None) -> int:
    """Run the demo until Ctrl-C (or ``--duration`` seconds)."""
    parser = argparse.ArgumentParser(prog="python -m source_backfill.demo", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--history", type=int, default=200_000, help="history records before start")
    parser.add_argument("--rate", type=float, default=200.0, help="live records per second")
    parser.add_argument("--api-port", type=int, default=8080)
    parser.add_argument("--metrics-port", type=int, default=9108)
    parser.add_argument("--state-root", default="var/demo")
    parser.add_argument("--duration", type=float, default=None, help="stop after this many seconds")
    parser.add_argument("--fresh", action="store_true", help="remove what an earlier run left and start over")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    warnings.filterwarnings("ignore", category=FutureWarning)  # pyspark's note on pandas 3

    import httpx

    from connectors.kafka.admin import KafkaAdmin
    from connectors.kafka.embedded import EmbeddedBroker
    from source_backfill.config import load_settings
    from source_backfill.runtime.daemon import Daemon

    print("source-backfill demo: embedded broker, live producer, daemon, a job attached mid-stream",
          flush=True)
    root = Path(args.state_root)
    if args.fresh:
        shutil.rmtree(root, ignore_errors=True)
    stop = threading.Event()

    def on_signal(*_: object) -> None:
        stop.set()

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    deadline = time.monotonic() + args.duration if args.duration else None

    with EmbeddedBroker(log_dir=root / "kafka") as broker:
        bootstrap = broker.bootstrap
        admin = KafkaAdmin(bootstrap)
        admin.create_topic(TOPIC, 4)
        held = sum(admin.end_offsets([f"{TOPIC}:{p}" for p in range(4)]).values())
        if held:
            print(f"broker {bootstrap}: {TOPIC} kept from an earlier run ({held} records; --fresh starts "
                  "over)", flush=True)
        else:
            print(f"broker {bootstrap}: writing {args.history} history records into {TOPIC} (4 partitions)",
                  flush=True)
            _fill_history(bootstrap, args.history)
        producer = threading.Thread(target=_producer, args=(bootstrap, args.rate, stop), daemon=True)
        producer.start()
        settings = load_settings(
            daemon={"state_root": str(root / "state")},
            spark={"conf": _spark_log_to_file(root / "spark.log")},
            api={"port": args.api_port},
            metrics={"port": args.metrics_port},
            sources=[{"name": "demo", "bootstrap_servers": bootstrap, "topics": [TOPIC],
                      "trigger_interval_s": 1.0, "starting_offsets": "latest"}],
            jobs=[{"name": "live-copy", "source": "demo", "sink_path": str(root / "tables" / "live-copy")}],
        )
        daemon = Daemon(settings)
        daemon.start()
        signal.signal(signal.SIGINT, on_signal)  # Spark's context installed its own (KeyboardInterrupt)
        api = daemon.api_url
        print(f"daemon up: API {api}  status page {api}/ui  metrics http://127.0.0.1:{args.metrics_port}/metrics"
              f"  Spark log {root / 'spark.log'}", flush=True)
        print("  (Ctrl-C stops everything)", flush=True)
        attached = "late-copy" in {j["name"] for j in httpx.get(f"{api}/jobs", timeout=10).json()}
        announced = False
        try:
            with httpx.Client(base_url=api, timeout=10) as client:
                while not stop.is_set() and (deadline is None or time.monotonic() < deadline):
                    jobs = client.get("/jobs").json()
                    by_name = {j["name"]: j for j in jobs}
                    if not attached and by_name.get("live-copy", {}).get("status") == "finished":
                        body = {"name": "late-copy", "source": "demo",
                                "sink_path": str((root / "tables" / "late-copy").resolve())}
                        r = client.post("/jobs", json=body)
                        print(f"attached late-copy mid-stream: HTTP {r.status_code}", flush=True)
                        attached = True
                    print(time.strftime("%H:%M:%S"), flush=True)
                    for name in sorted(by_name):
                        _show(client.get(f"/jobs/{name}").json())
                    late = by_name.get("late-copy", {}).get("status")
                    if not announced and attached and late == "finished":
                        announced = True
                        print("late-copy reached Finished: every split handed over to the live stream. "
                              f"Metrics: http://127.0.0.1:{args.metrics_port}/metrics", flush=True)
                    stop.wait(3.0)
        finally:
            stop.set()
            producer.join(10)
            daemon.stop()
    print("demo stopped", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
