"""``make run``: the daemon on the embedded default, with a live producer and a job attached mid-stream.

1. start the embedded Apache Kafka broker (its log under ``--state-root``) and fill a 4-partition topic
   with uneven history;
2. start a demo producer writing a steady live stream;
3. start the daemon with one job (``live-copy``) and wait for it to catch up;
4. attach a second job (``late-copy``) through the HTTP API while the producer keeps writing, rate-limited
   so its backfill lasts about ``--backfill-s`` seconds (time to try the page, pause and throttle), and
   show its progress (the CLI's lines: percentage, rate, ETA, per-split bars) and the live job's latency
   before and while it backfills;
5. when it is Finished, check the claim: ``verify`` compares its table with the Kafka log offset by offset
   and prints ``late-copy: exactly once, N records, 0 missing, 0 duplicated``;
6. keep running (API, page and metrics URLs printed) until Ctrl-C, which stops everything it started
   before the prompt returns. ``--quick`` is the same on a small history, ending at the verify line (exit
   code 0 exactly once, 3 not: what the demo's test runs).

Run again, it resumes: the broker keeps its log, the jobs their tables and state (``--fresh`` starts over).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import signal
import threading
import time
import warnings
from pathlib import Path
from typing import Any

logger = logging.getLogger("source_backfill.demo")

TOPIC = "demo-events"
#: After a signal, the demo exits by this many seconds whatever its stop still waits for (the daemon's
#: shutdown timeout is 30 s by default).
STOP_LIMIT_S = 60.0


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


#: How often the console shows the jobs while one backfills, and once every job is Finished.
SHOW_S, QUIET_SHOW_S = 3.0, 30.0


def _show(client: Any, names: list[str], splits_of: str | None) -> None:
    """Each job's line as ``source-backfill jobs list`` words it, and ``splits_of``'s per-split bars."""
    from source_backfill.cli import job_line, split_bar

    print(time.strftime("%H:%M:%S"), flush=True)
    for name in names:
        job = client.get(f"/jobs/{name}").json()
        print("  " + job_line(job), flush=True)
        if name == splits_of:
            for s in job.get("splits", []):
                print("    " + split_bar(s), flush=True)


def _latency(client: Any, name: str) -> str:
    from source_backfill.cli import latency_text

    return latency_text(client.get(f"/jobs/{name}").json()) or "no live rows in the window yet"


def _verify(client: Any, name: str, timeout_s: float = 300.0) -> tuple[bool, str]:
    """Run the job's verify through the API (as ``source-backfill verify`` does) to its summary line."""
    run = client.post(f"/jobs/{name}/verify").json()
    deadline = time.monotonic() + timeout_s
    while run.get("status") == "running" and time.monotonic() < deadline:
        time.sleep(0.5)
        run = client.get(f"/jobs/{name}/verify/{run['id']}").json()
    if run.get("status") != "done":
        return False, f"verify of {name} {run.get('status')}: {run.get('error') or run.get('detail')}"
    return bool(run["ok"]), str(run["summary"])


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
    """Run the demo until Ctrl-C (or ``--duration`` seconds; ``--quick``: until the verify line)."""
    parser = argparse.ArgumentParser(prog="python -m source_backfill.demo", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--history", type=int, default=None,
                        help="history records before start (default 200,000; --quick 6,000)")
    parser.add_argument("--backfill-s", type=float, default=None,
                        help="the late job's rate limit makes its backfill last about this long "
                             "(default 60; --quick 8; 0: no rate limit)")
    parser.add_argument("--rate", type=float, default=200.0, help="live records per second")
    parser.add_argument("--api-port", type=int, default=8080, help="0: any free port")
    parser.add_argument("--metrics-port", type=int, default=9108, help="0: any free port")
    parser.add_argument("--state-root", default="var/demo")
    parser.add_argument("--duration", type=float, default=None, help="stop after this many seconds")
    parser.add_argument("--fresh", action="store_true", help="remove what an earlier run left and start over")
    parser.add_argument("--quick", action="store_true",
                        help="a small history and a short backfill, then stop after the verify line "
                             "(exit 0: exactly once, 3: not)")
    args = parser.parse_args(argv)
    history = args.history if args.history is not None else (6_000 if args.quick else 200_000)
    backfill_s = args.backfill_s if args.backfill_s is not None else (8.0 if args.quick else 60.0)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    warnings.filterwarnings("ignore", category=FutureWarning)  # pyspark's note on pandas 3

    import httpx

    from connectors.kafka.admin import KafkaAdmin
    from connectors.kafka.embedded import EmbeddedBroker
    from source_backfill.config import load_settings
    from source_backfill.daemon import Daemon

    print("source-backfill demo: embedded broker, live producer, daemon, a job attached mid-stream",
          flush=True)
    root = Path(args.state_root)
    if args.fresh:
        shutil.rmtree(root, ignore_errors=True)
    stop = threading.Event()

    def on_signal(*_: object) -> None:
        stop.set()
        # a signal to the whole process group (Ctrl-C, `timeout`) reaches Spark's JVM too, and a stop with
        # the JVM gone once left the demo waiting for ever (seen under `timeout 300 make run`): it exits
        # all the same once the daemon's stop has had its time
        exit_at = threading.Timer(STOP_LIMIT_S, os._exit, [130])
        exit_at.daemon = True
        exit_at.start()

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    deadline = time.monotonic() + args.duration if args.duration else None
    splits = [f"{TOPIC}:{p}" for p in range(4)]
    verdict: bool | None = None

    with EmbeddedBroker(log_dir=root / "kafka") as broker:
        bootstrap = broker.bootstrap
        admin = KafkaAdmin(bootstrap)
        admin.create_topic(TOPIC, 4)
        held = sum(admin.end_offsets(splits).values())
        if held:
            print(f"broker {bootstrap}: {TOPIC} kept from an earlier run ({held} records; --fresh starts "
                  "over)", flush=True)
        else:
            print(f"broker {bootstrap}: writing {history} history records into {TOPIC} (4 partitions)",
                  flush=True)
            _fill_history(bootstrap, history)
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
        print(f"daemon up: API {api}  status page {api}/ui  metrics {daemon.metrics_url or api}/metrics  "
              f"Spark log {root / 'spark.log'}", flush=True)
        print("  (Ctrl-C stops everything)", flush=True)
        try:
            with httpx.Client(base_url=api, timeout=10) as client:
                names = sorted(j["name"] for j in client.get("/jobs").json())
                attached = "late-copy" in names
                shown_at = -QUIET_SHOW_S
                while not stop.is_set() and not daemon.exit_code and (  # exit_code: the JVM is gone
                        deadline is None or time.monotonic() < deadline):
                    status = {j["name"]: j["status"] for j in client.get("/jobs").json()}
                    if not attached and status.get("live-copy") == "finished":
                        records = sum(admin.end_offsets(splits).values())
                        rate = None if backfill_s <= 0 else max(1.0, float(round(records / backfill_s)))
                        before = _latency(client, "live-copy")
                        body = {"name": "late-copy", "source": "demo", "rate_limit": rate,
                                "sink_path": str((root / "tables" / "late-copy").resolve())}
                        r = client.post("/jobs", json=body)
                        limit = "no rate limit" if rate is None else (
                            f"rate limit {rate:g} rows/s: ~{backfill_s:g} s of backfill; lift it with "
                            f"`source-backfill --api {api} jobs throttle late-copy unlimited`")
                        print(f"attached late-copy mid-stream over {records} records (HTTP {r.status_code}, "
                              f"{limit})", flush=True)
                        print(f"live-copy live latency before late-copy: {before}", flush=True)
                        attached, names = True, ["late-copy", "live-copy"]
                        continue
                    late = status.get("late-copy")
                    busy = late is not None and late != "finished"
                    if busy or time.monotonic() - shown_at >= QUIET_SHOW_S:
                        _show(client, names, "late-copy" if busy else None)
                        shown_at = time.monotonic()
                    if verdict is None and late == "finished":
                        print("late-copy reached Finished: every split handed over to the live stream",
                              flush=True)
                        print(f"live-copy live latency while late-copy backfilled (last minute): "
                              f"{_latency(client, 'live-copy')}", flush=True)
                        verdict, line = _verify(client, "late-copy")
                        print(line, flush=True)
                        if args.quick:
                            break
                    stop.wait(SHOW_S)
        finally:
            stop.set()
            producer.join(10)
            daemon.stop()
            admin.close()  # before the broker stops: no client left polling it
    print("demo stopped", flush=True)
    return 3 if verdict is False else 0


if __name__ == "__main__":
    raise SystemExit(main())
