"""Harness for end-to-end daemon tests: a real broker, the session Spark, real Delta tables on disk."""

from __future__ import annotations

import gc
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

INTERVAL_S = 0.5


def wait_for(
    predicate: Callable[[], Any], timeout: float = 180.0, interval: float = 0.5, what: str = ""
) -> Any:
    """Poll ``predicate`` until truthy; fail the test with ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = predicate()
        if last:
            return last
        time.sleep(interval)
    pytest.fail(f"timed out after {timeout}s waiting for {what or predicate}; last={last!r}")


class Producer:
    """Writes numbered records to a topic, in the foreground or as a steady background stream."""

    def __init__(self, bootstrap: str, topic: str, config: dict[str, str] | None = None) -> None:
        """``config``: more librdkafka settings (a secured broker's)."""
        from confluent_kafka import Producer as KafkaProducer

        self.topic = topic
        self._producer = KafkaProducer({"bootstrap.servers": bootstrap, "linger.ms": 5, **(config or {})})
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.sent = 0

    def send(self, count: int, partitions: int, *, start: int = 0, timestamp_ms: int | None = None,
             weights: list[int] | None = None) -> None:
        """Send ``count`` records spread over ``partitions`` (by ``weights`` when given)."""
        from tests.fixtures.kafka import await_partition

        weights = weights or [1] * partitions
        order = [p for p, w in enumerate(weights) for _ in range(w)]
        for partition in set(order):  # added partitions: the client's metadata must know them
            await_partition(self._producer, self.topic, partition)
        for i in range(count):
            kw: dict[str, Any] = {}
            if timestamp_ms is not None:
                kw["timestamp"] = timestamp_ms
            while True:
                try:
                    self._producer.produce(self.topic, key=str(start + i).encode(),
                                           value=f"v{start + i}".encode(), partition=order[i % len(order)],
                                           **kw)
                    break
                except BufferError:  # the client's queue is full: wait for the broker's acks, then again
                    self._producer.poll(0.5)
            if i % 5000 == 0:
                self._producer.poll(0)
        self._producer.flush(30)
        self.sent += count

    def stream(self, partitions: int, per_second: float = 100.0) -> None:
        """Keep writing ``per_second`` records until :meth:`stop`."""

        from tests.fixtures.kafka import await_partition

        for partition in range(partitions):
            await_partition(self._producer, self.topic, partition)

        def run() -> None:
            i = 0
            while not self._stop.wait(1.0 / per_second * 10):
                for _ in range(10):
                    self._producer.produce(self.topic, value=f"live{i}".encode(), partition=i % partitions)
                    i += 1
                self._producer.poll(0)
            self._producer.flush(30)
            self.sent += i

        self._thread = threading.Thread(target=run, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(30)

    def close(self) -> None:
        self._producer.flush(5)
        del self._producer


@pytest.fixture
def new_topic(kafka_bootstrap: str) -> Iterator[Callable[[int], str]]:
    from connectors.kafka.admin import KafkaAdmin

    admin = KafkaAdmin(kafka_bootstrap)

    def make(partitions: int = 4) -> str:
        name = f"e2e-{uuid.uuid4().hex[:10]}"
        admin.create_topic(name, partitions)
        return name

    yield make
    admin.close()  # pytest keeps the fixture's value past the test: no client left polling the broker


@pytest.fixture
def producer_for(kafka_bootstrap: str) -> Iterator[Callable[[str], Producer]]:
    made: list[Producer] = []

    def make(topic: str) -> Producer:
        p = Producer(kafka_bootstrap, topic)
        made.append(p)
        return p

    yield make
    for p in made:
        p.stop()
        p.close()
    gc.collect()  # destroy the clients now, not after the session broker is gone (reconnect noise)


@pytest.fixture
def daemon_factory(spark, kafka_bootstrap: str, tmp_path: Path) -> Iterator[Callable[..., Any]]:
    """Start a :class:`Daemon` on one topic set; every daemon started is stopped at teardown."""
    from source_backfill.config import load_settings
    from source_backfill.daemon import Daemon

    started: list[Daemon] = []

    def make(topics: list[str], jobs: list[dict[str, Any]] | None = None, *, token: str | None = None,
             state_root: Path | None = None, namespaces: list[dict[str, Any]] | None = None,
             **source: Any) -> Daemon:
        settings = load_settings(
            daemon={"state_root": str(state_root or tmp_path / "state"), "shutdown_timeout_s": 60},
            api={"port": 0, "token": token},
            metrics={"port": None},
            sources=[{"name": "src", "bootstrap_servers": kafka_bootstrap, "topics": topics,
                      "trigger_interval_s": INTERVAL_S, **source}],
            jobs=jobs or [],
            namespaces=namespaces or [],
        )
        daemon = Daemon(settings)
        daemon.start()
        started.append(daemon)
        return daemon

    yield make
    for daemon in started:
        if not daemon._stop.is_set():  # noqa: SLF001
            daemon.stop()


def job_spec(name: str, tmp_path: Path, **kw: Any) -> dict[str, Any]:
    """A job on the test source ``src`` writing to ``tmp_path/name``."""
    return {"name": name, "source": "src", "sink_path": str(tmp_path / name), **kw}


def metric_total(metric: Any, **labels: str) -> float:
    """The sum of a counter's ``_total`` samples whose labels include ``labels``."""
    return sum(s.value for m in metric.collect() for s in m.samples
               if s.name.endswith("_total") and all(s.labels.get(k) == v for k, v in labels.items()))


def job_of(daemon: Any, name: str) -> Any:
    return daemon.sources["src"].jobs.get(name)


def finished(daemon: Any, name: str) -> bool:
    job = job_of(daemon, name)
    return job is not None and job.backfill_done


def exactly_once(table: Path, bootstrap: str, topics: list[str], **kw: Any) -> Any:
    """Poll until the table holds the whole log exactly once (the job may still be catching up)."""
    from source_backfill.verify import check_exactly_once

    def check() -> Any:
        if not (table / "_delta_log").exists():
            return None
        report = check_exactly_once(str(table), bootstrap, topics, **kw)
        return report if report.ok else None

    report = wait_for(check, timeout=120, interval=1.0, what=f"exactly-once contents of {table}")
    return report


def both_tables(main: Path, dead: Path, bootstrap: str, topic: str) -> Any:
    """The log against a job's table and its dead-letter table together: each offset in exactly one.

    A table not made yet holds nothing (a job with no dead letter yet)."""
    from source_backfill.verify.log_check import compare, log_offsets, table_offsets

    held: dict[str, list[int]] = {}
    for path in (main, dead):
        if (path / "_delta_log").exists():
            for split, offsets in table_offsets(str(path)).items():
                held.setdefault(split, []).extend(offsets)
    return compare(log_offsets(bootstrap, [topic]), held)


def await_both_tables(main: Path, dead: Path, bootstrap: str, topic: str, timeout: float = 180.0) -> Any:
    """Wait until each offset of ``topic`` is in exactly one of a job's table and its dead-letter table."""

    def both() -> Any:
        report = both_tables(main, dead, bootstrap, topic)
        return report if report.ok else None

    return wait_for(both, timeout=timeout, interval=1.0, what="every offset in exactly one of the two tables")


def table_daemon_config(tmp_path: Path, port: int, extra: str = "") -> Path:
    """``config.toml`` of a daemon process with one delta source ``tbl`` over ``tmp_path / "src"``.

    A 0.3 s trigger; ``extra``: TOML appended below the source's keys (more of them, then jobs).
    """
    config = tmp_path / "config.toml"
    config.write_text(f"""
[daemon]
state_root = "{tmp_path / 'state'}"
[api]
port = {port}
[metrics]
port = false
[[sources]]
name = "tbl"
kind = "delta"
table_path = "{tmp_path / 'src'}"
primary_key = ["id"]
trigger_interval_s = 0.3
{extra}""")
    return config


def spark_jvm_of(daemon_pid: int) -> int:
    """The pid of the daemon's Spark JVM: its child running ``org.apache.spark.deploy.SparkSubmit``."""
    from source_backfill.testing.process import processes_below

    for pid, _ in processes_below(daemon_pid):
        try:
            if b"SparkSubmit" in Path(f"/proc/{pid}/cmdline").read_bytes():
                return pid
        except OSError:
            continue
    msg = f"no Spark JVM under the daemon (pid {daemon_pid})"
    raise AssertionError(msg)


def process_running(pid: int) -> bool:
    """Whether ``pid`` runs (not gone, not a zombie)."""
    try:
        return "\nState:\tZ" not in Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False


@pytest.fixture
def registry_topic(new_topic, kafka_bootstrap, schema_registry):
    """``make(cls, partitions)``: a new topic of ``cls``'s framed records (``tests/fixtures/framed_topic.py``)
    over the real registry."""
    made = []

    def make(cls: Any, partitions: int = 2) -> Any:
        made.append(cls(kafka_bootstrap, new_topic(partitions), schema_registry))
        return made[-1]

    yield make
    for t in made:
        t.close()


@pytest.fixture
def avro_topic(registry_topic):
    """``make(partitions)``: a new topic of Confluent-framed Avro records (``tests/fixtures/avro.py``)."""
    from tests.fixtures.avro import AvroTopic

    return lambda partitions=2: registry_topic(AvroTopic, partitions)
