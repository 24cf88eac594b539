"""A transform cannot take the daemon down: a job's Spark work has a deadline (it fails alone past it), a
dead Spark JVM makes the daemon exit non-zero (its supervisor restarts it), and a job in flight at
crash after crash is quarantined until it is retried.

The deadline runs in-process on the session Spark; the JVM deaths kill the JVM of a real daemon process
(``kill -9`` of its ``SparkSubmit`` child, found in ``/proc``).
"""

from __future__ import annotations

import json
import os
import signal
import time
import uuid
from pathlib import Path

import pytest

from source_backfill.testing import RunningDaemon
from source_backfill.testing.metrics import scrape, total
from tests.integration.daemon.conftest import (
    exactly_once,
    finished,
    job_of,
    job_spec,
    metric_total,
    process_running,
    spark_jvm_of,
    wait_for,
)

pytestmark = pytest.mark.integration

#: The checkout these tests belong to: the daemon processes run its code (not an editable install's).
ROOT = Path(__file__).resolve().parents[3]

#: Made only of what a strict allow-list permits (select, a generator, built-in pure functions): each
#: Kafka record becomes 300,000 rows, each hashed. ~0.25 s of a core per record: forever for history.
SLOW = ("SELECT value, n FROM (SELECT value, explode(sequence(1, 300000)) AS n FROM {source}) "
        "WHERE sha2(concat(CAST(value AS STRING), CAST(n AS STRING)), 256) = 'never'")


@pytest.mark.slow  # make test-slow; make test keeps the deadline's cancel and error
# (tests/unit/executors/test_spark_work.py, ..._past_its_deadline_is_cancelled_and_fails_with_the_deadline...)
# and a neighbour committing beside a heavy job (tests/integration/daemon/test_lanes.py)
def test_a_transform_past_its_deadline_fails_that_job_alone_and_the_other_keeps_committing(
    daemon_factory, new_topic, producer_for, kafka_bootstrap, tmp_path
):
    from source_backfill import metrics

    topic = new_topic(2)
    p = producer_for(topic)
    p.send(20000, 2)
    before = metric_total(metrics.SPARK_WORK_TIMEOUTS, job="slow")
    # the slow job reads its history ahead (5,000 records a read: ~10 min of a core), the plain one too
    d = daemon_factory([topic], [job_spec("plain", tmp_path),
                                 job_spec("slow", tmp_path, transform=SLOW, max_rows_per_epoch=5000)],
                       job_timeout_s=25)
    t0 = time.monotonic()
    wait_for(lambda: d.registry.get("slow").error, timeout=120, what="the slow job failed")
    failed_after = time.monotonic() - t0
    error = d.registry.get("slow").error
    assert error.startswith("a history read ahead ("), error  # its read ahead: the path with no cache
    assert "ran past its deadline of 25 s (sources[].job_timeout_s)" in error, error
    assert job_of(d, "slow") is None
    assert metric_total(metrics.SPARK_WORK_TIMEOUTS, job="slow") == before + 1
    assert metrics.JOB_FAILED.labels("slow")._value.get() == 1  # noqa: SLF001
    # its cancelled tasks stopped too: they do not keep the shared JVM's cores
    jvm = d.spark.sparkContext._gateway.proc.pid  # noqa: SLF001
    wait_for(lambda: _task_threads_cpu(jvm, 2.0) < 0.2, timeout=30, interval=0,
             what="the slow job's cancelled tasks stopped")
    # the plain job committed meanwhile, and goes on with the live stream, exactly once
    wait_for(lambda: finished(d, "plain"), what="plain finished")
    p.stream(2, per_second=40)
    epoch = d.sources["src"].last_epoch
    wait_for(lambda: d.sources["src"].last_epoch >= epoch + 4, what="epochs after the failure")
    assert d.registry.get("plain").error is None
    assert d.sources["src"].error is None
    p.stop()
    report = exactly_once(tmp_path / "plain", kafka_bootstrap, [topic])
    assert sum(s.log_records for s in report.splits.values()) >= 20000
    print(f"slow job failed {failed_after:.1f} s after the daemon started (deadline 25 s)")


def _task_threads_cpu(pid: int, seconds: float) -> float:
    """Cores the JVM's Spark task threads (``Executor task launch worker``) used over ``seconds``."""
    def ticks() -> int:
        total = 0
        for task in Path(f"/proc/{pid}/task").iterdir():
            try:
                stat = (task / "stat").read_text()
            except OSError:
                continue
            if "(Executor task" in stat:
                fields = stat.rsplit(")", 1)[1].split()
                total += int(fields[11]) + int(fields[12])
        return total

    before = ticks()
    time.sleep(seconds)
    return (ticks() - before) / os.sysconf("SC_CLK_TCK") / seconds


# -- the JVM dies: a real daemon process ---------------------------------------------------------------
def _kill_jvm_and_wait_exit(daemon: RunningDaemon) -> tuple[int, float, bool]:
    """``kill -9`` the daemon's JVM; the daemon's exit code, seconds to exit, and whether /live said 503."""
    assert daemon.proc is not None and daemon.pid is not None
    jvm = spark_jvm_of(daemon.pid)
    t0 = time.monotonic()
    os.kill(jvm, signal.SIGKILL)
    saw_503 = False
    while daemon.proc.poll() is None and time.monotonic() - t0 < 30:
        r = daemon.get("/live")
        saw_503 = saw_503 or (r is not None and r.status_code == 503)
        time.sleep(0.05)
    code = daemon.proc.wait(max(0.1, 30 - (time.monotonic() - t0)))
    seconds = time.monotonic() - t0
    daemon.proc = None
    return code, seconds, saw_503


def _daemon(tmp_path: Path, bootstrap: str, sources: list[dict], jobs: list[dict],
            settings: dict | None = None) -> RunningDaemon:
    daemon = RunningDaemon(tmp_path, bootstrap, sources, jobs, settings or {})
    assert daemon.env is not None
    daemon.env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    return daemon


def _in_flight(ledger: Path, job: str, pid: int | None) -> bool:
    """A marker of ``job``'s Spark work written by the daemon process ``pid`` (not one kept from before)."""
    for marker in ledger.glob(f"{job}.*.running"):
        try:
            if json.loads(marker.read_text())["pid"] == pid:
                return True
        except (OSError, ValueError):
            continue
    return False


def _topic(kafka_admin, kafka_bootstrap: str, records: int) -> str:
    from confluent_kafka import Producer

    topic = f"jvm-{uuid.uuid4().hex[:8]}"
    kafka_admin.create_topic(topic, 2)
    producer = Producer({"bootstrap.servers": kafka_bootstrap})
    for i in range(records):
        producer.produce(topic, value=f"v{i}".encode(), partition=i % 2)
    assert producer.flush(30) == 0
    return topic


@pytest.mark.slow  # make test: test_lanes' SIGTERM during a heavy step checks the same exit and JVM
def test_a_sigterm_mid_epochs_stops_the_daemon_cleanly_and_its_jvm_with_it(
    tmp_path, kafka_bootstrap, kafka_admin
):
    """SIGTERM to the daemon (as Docker and Kubernetes send it): the running epoch ends, exit code 0.

    The test kit once sent it to the process group: the JVM shut down under the epoch, and the daemon
    reported a dead JVM and exited 70 on every stop.
    """
    topic = _topic(kafka_admin, kafka_bootstrap, 500)
    daemon = _daemon(tmp_path, kafka_bootstrap, [{"name": "src", "topics": [topic]}],
                     [{"name": "a", "source": "src"}, {"name": "b", "source": "src"}])
    daemon.start()
    try:
        daemon.wait_ready(240)
        daemon.wait_finished("a", timeout_s=120)
        assert daemon.pid is not None
        jvm = spark_jvm_of(daemon.pid)
    finally:
        code = daemon.stop()
    log = daemon.log.read_text(errors="replace")
    assert code == 0, log[-3000:]
    assert "Spark JVM is gone" not in log
    wait_for(lambda: not process_running(jvm), timeout=30, what="the daemon's JVM gone with it")


def test_a_dead_jvm_fails_liveness_and_the_daemon_exits_non_zero_within_30_s(
    tmp_path, kafka_bootstrap, kafka_admin
):
    from source_backfill.daemon import EXIT_JVM_GONE

    topic = _topic(kafka_admin, kafka_bootstrap, 500)
    daemon = _daemon(tmp_path, kafka_bootstrap, [{"name": "src", "topics": [topic]}],
                     [{"name": "j", "source": "src"}])
    daemon.start()
    try:
        daemon.wait_ready(240)
        live = daemon.get("/live")
        assert live is not None and live.status_code == 200 and live.json()["live"] is True
        assert total(scrape(daemon.url), "spark_jvm_up") == 1
        code, seconds, saw_503 = _kill_jvm_and_wait_exit(daemon)
        log = daemon.log.read_text(errors="replace")
        assert code == EXIT_JVM_GONE, log[-3000:]
        assert seconds < 30
        assert "Spark JVM is gone, the daemon exits" in log
        assert "killed by signal SIGKILL" in log or "py4j gateway" in log
        print(f"daemon exited with {code} {seconds:.1f} s after its JVM was killed; /live 503: {saw_503}")
    finally:
        daemon.stop()


@pytest.mark.slow  # three JVM deaths and restarts: 30-75 s, with the slow tests to keep make test in 20 min
def test_a_job_in_flight_at_jvm_death_after_jvm_death_is_quarantined_alone_until_retried(
    tmp_path, kafka_bootstrap, kafka_admin
):
    from source_backfill.daemon import EXIT_JVM_GONE

    topic = _topic(kafka_admin, kafka_bootstrap, 2000)
    daemon = _daemon(
        tmp_path, kafka_bootstrap, [{"name": "src", "topics": [topic], "job_timeout_s": 120}],
        [{"name": "evil", "source": "src", "transform": SLOW}, {"name": "plain", "source": "src"}],
        {"daemon": {"quarantine_after_crashes": 2}},  # one JVM start fewer than the default 3 (~10-40 s)
    )
    ledger = tmp_path / "state" / "spark-work"
    for death in range(1, 3):
        daemon.start()
        wait_for(lambda: _in_flight(ledger, "evil", daemon.pid) or daemon.pid is None, timeout=180,
                 interval=0.2, what="evil's Spark work in flight")
        code, seconds, _ = _kill_jvm_and_wait_exit(daemon)
        assert code == EXIT_JVM_GONE, daemon.tail()
        assert any(ledger.glob("evil.*.running")), f"death {death}: evil's marker kept"
    daemon.start()
    try:
        wait_for(lambda: (r := daemon.get("/jobs/evil")) is not None and r.status_code == 200, timeout=240,
                 what="the API")
        evil = daemon.job("evil")
        assert evil["status"] == "failed", evil
        assert ("quarantined: its Spark work was in flight at 2 crashes in a row "
                "(daemon.quarantine_after_crashes = 2)") in evil["error"], evil["error"]
        assert "Spark's JVM died" in evil["error"] and "SIGKILL" in evil["error"]
        daemon.wait_ready(240)  # evil is not built: it cannot stall the epochs
        assert daemon.wait_finished("plain", timeout_s=120)["error"] is None  # never every job
        samples = scrape(daemon.url)
        assert total(samples, "job_quarantined", job="evil") == 1
        assert total(samples, "job_crashes", job="evil") == 2
        assert total(samples, "job_quarantined", job="plain") == 0
        # retry undoes it: built again, its count from 0, no longer failed
        r = daemon.request("POST", "/jobs/evil/retry")
        assert r is not None and r.status_code == 202 and r.json()["error"] is None
        wait_for(lambda: daemon.job("evil")["status"] != "failed"
                 and total(scrape(daemon.url), "job_quarantined", job="evil") == 0,
                 timeout=60, what="evil's quarantine undone")
        assert total(scrape(daemon.url), "job_crashes", job="evil") == 0
        assert "evil" not in (ledger / "crashes.json").read_text()
    finally:
        daemon.kill()  # evil's transform runs again: no graceful stop needed


def test_live_answers_503_with_the_reason_once_the_jvm_is_gone(tmp_path):
    from fastapi.testclient import TestClient

    from source_backfill.api.app import create_app
    from source_backfill.runtime.registry import JobRegistry

    health = {"ok": True, "ready": True, "live": True, "jvm_error": None}
    client = TestClient(create_app(JobRegistry(tmp_path, ["src"]), health=lambda: dict(health)))
    assert client.get("/live").status_code == 200
    health.update(ok=False, ready=False, live=False, jvm_error="Spark's JVM (pid 7) killed by SIGKILL")
    r = client.get("/live")
    assert r.status_code == 503 and r.json() == {"live": False, "error": health["jvm_error"]}


def test_the_stop_quiets_the_writes_it_cancels_and_nothing_before(spark):
    """A write the stop cancels logs Spark's "FileFormatWriter: Aborting job" at ERROR (test_lanes' SIGTERM
    test saw it once in a fresh clone's make test); from the stop on those loggers are off, not before."""
    from source_backfill.runtime.spark import CANCELLED_WRITE_LOGGERS, quiet_cancelled_writes

    jvm = spark.sparkContext._jvm  # noqa: SLF001
    logs, levels = jvm.org.apache.logging.log4j.LogManager, jvm.org.apache.logging.log4j.Level
    configurator = jvm.org.apache.logging.log4j.core.config.Configurator
    before = {name: str(logs.getLogger(name).getLevel()) for name in CANCELLED_WRITE_LOGGERS}
    try:
        for name in CANCELLED_WRITE_LOGGERS:  # as a running daemon has them (a stopped one's are off)
            configurator.setLevel(name, levels.ERROR)
        quiet_cancelled_writes(spark)
        assert {str(logs.getLogger(name).getLevel()) for name in CANCELLED_WRITE_LOGGERS} == {"OFF"}
    finally:  # the session's other tests keep the levels they had
        for name, level in before.items():
            configurator.setLevel(name, levels.valueOf(level))
