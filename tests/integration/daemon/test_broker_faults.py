"""Broker faults mid-backfill: the broker stopped and restarted on the same port and log folder; the broker
reachable only through a faulty network (latency, connection resets, a black hole), then healed."""

from __future__ import annotations

import socket
import time

import pytest

from tests.fixtures.proxy import FaultyProxy
from tests.integration.daemon.conftest import (
    Producer,
    exactly_once,
    finished,
    job_of,
    job_spec,
    metric_total,
    wait_for,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]  # ~3.5 min: make test-slow (CI runs it)


def _source_errors() -> float:
    from source_backfill import metrics

    return metric_total(metrics.SOURCE_ERRORS, error_type="live_query")


def test_broker_restarted_mid_backfill_the_daemon_reports_it_and_resumes_exactly_once(
    daemon_factory, tmp_path
):
    import httpx

    from connectors.kafka.admin import KafkaAdmin
    from connectors.kafka.embedded import EmbeddedBroker

    broker = EmbeddedBroker(log_dir=tmp_path / "kafka").start()
    p = None
    try:
        bootstrap = broker.bootstrap
        KafkaAdmin(bootstrap).create_topic("faulty", 2)
        p = Producer(bootstrap, "faulty")
        p.send(20_000, 2)
        p.stream(2, per_second=40)
        d = daemon_factory(["faulty"], [job_spec("j", tmp_path, rate_limit=1500)],
                           bootstrap_servers=bootstrap)
        wait_for(lambda: job_of(d, "j").rows[0] > 0, what="backfill started")
        errors = _source_errors()
        broker.stop()
        assert not broker.running
        # the live query stalls, then fails (no offsets within the admin's deadline) and is restarted
        # with backoff; health says so — epochs stalled, then the query's error — while it lasts
        wait_for(lambda: httpx.get(f"{d.api_url}/health").status_code == 503, timeout=120,
                 what="unhealthy while the broker is down")
        assert httpx.get(f"{d.api_url}/health").json()["sources"]["src"]["problems"]
        assert httpx.get(f"{d.api_url}/ready").status_code == 503
        wait_for(lambda: _source_errors() > errors, timeout=180, what="the live query's failure counted")
        body = wait_for(lambda: (b := httpx.get(f"{d.api_url}/health").json()["sources"]["src"])["error"]
                        and b, timeout=120, what="the query's error in /health")
        assert "kafka" in body["error"].lower() and body["query_failures"] >= 1
        assert not finished(d, "j")
        broker.start()  # same log folder, same ports
        assert broker.bootstrap == bootstrap
        wait_for(lambda: finished(d, "j"), timeout=300, what="finished after the broker came back")
        wait_for(lambda: httpx.get(f"{d.api_url}/health").status_code == 200, what="healthy again")
        p.stop()
        exactly_once(tmp_path / "j", bootstrap, ["faulty"])
        d.stop()
    finally:
        if p is not None:
            p.stop()
            p.close()
        broker.stop()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_broker_behind_a_faulty_network_the_daemon_reports_it_and_resumes_exactly_once(
    daemon_factory, tmp_path
):
    import httpx

    from connectors.kafka.admin import KafkaAdmin
    from connectors.kafka.embedded import EmbeddedBroker
    from source_backfill import metrics

    # Clients connect to the address the broker advertises: advertising the proxy's port sends every
    # connection after the bootstrap one (daemon, Spark readers, producer, verifier) through the proxy.
    port = _free_port()
    proxy = FaultyProxy("127.0.0.1", port).start()
    broker = EmbeddedBroker(port=port, log_dir=tmp_path / "kafka",
                            overrides={"advertised.listeners": f"PLAINTEXT://{proxy.address}"}).start()
    p = None
    try:
        bootstrap = proxy.address
        KafkaAdmin(bootstrap).create_topic("faulty", 2)
        p = Producer(bootstrap, "faulty")
        p.send(20_000, 2)
        p.stream(2, per_second=40)
        # rate-limited: the backfill runs through the faults. A read without progress for 15 s fails (with
        # the default 60 s the black hole would have to last a minute).
        d = daemon_factory(["faulty"], [job_spec("j", tmp_path, rate_limit=1000)],
                           bootstrap_servers=bootstrap, poll_timeout_s=15)
        wait_for(lambda: job_of(d, "j").rows[0] > 0, what="backfill started")
        seen: dict[str, object] = {}
        log: list[str] = []
        t0 = time.monotonic()

        def job_errors() -> float:  # history read errors of the job (source_errors_total{job="j"})
            return metric_total(metrics.SOURCE_ERRORS, job="j")

        def note(what: str) -> None:
            job = job_of(d, "j")
            log.append(f"{time.monotonic() - t0:.0f}s {what} query_failures={_source_errors() - errors:.0f} "
                       f"job_errors={job_errors():.0f} rows={job.rows if job else None}")

        def look() -> bool:
            """One look at /health and GET /jobs/j, remembering the first errors they show; job finished?"""
            health = httpx.get(f"{d.api_url}/health", timeout=10)
            src = health.json()["sources"]["src"]
            if health.status_code == 503 and "unhealthy" not in seen:
                seen["unhealthy"] = src["problems"]
                note("503")
            if src["error"] and "error" not in seen:
                seen["error"] = src["error"]
                note("error")
            job = httpx.get(f"{d.api_url}/jobs/j", timeout=10).json()
            if job["last_error"] and "last_error" not in seen:
                seen["last_error"] = job["last_error"]
                note("last_error")
            return finished(d, "j")

        def query_failed() -> bool:
            look()
            return _source_errors() > errors

        def watch(seconds: float) -> None:
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                look()
                time.sleep(0.5)

        errors = _source_errors()
        epoch = d.sources["src"].last_epoch
        note("latency")
        proxy.latency(0.2)  # every chunk, both ways, for 8 s: epochs slow down
        watch(8)
        proxy.latency(0)
        assert d.sources["src"].last_epoch > epoch, "no epoch completed under latency"
        note("resets")
        for _ in range(3):  # every connection aborted with an RST; the clients reconnect
            assert proxy.reset() > 0
            watch(1.5)
        assert not finished(d, "j"), "the backfill ended before the black hole: lower the job's rate"
        assert _source_errors() == errors, f"latency or resets failed the live query (not retried): {log}"
        note("black hole")
        # Connections open, nothing delivered: only the deadlines notice, the admin's (10 s, the next
        # batch's offsets) or the reads' (15 s, a batch reading when it began). It lasts until the live
        # query has failed; the deadlines bound that, the last attempt and Spark's reaction add to them.
        proxy.blackhole(True)
        wait_for(query_failed, timeout=40, what="the live query failing in the black hole")
        note("noticed")
        watch(2)  # a little longer: /health shows the failure while the network is still down
        proxy.blackhole(False)
        note("healed")
        assert httpx.patch(f"{d.api_url}/jobs/j", json={"rate_limit": None}).status_code == 202  # finish fast
        wait_for(look, timeout=180, what="finished after the network healed")
        note("finished")
        wait_for(lambda: httpx.get(f"{d.api_url}/health").status_code == 200, what="healthy again")
        note("healthy")
        print("\n".join(log), f"\nerrors seen: {seen}")
        assert _source_errors() > errors, f"the live query's failure was not counted: {log}"
        assert seen.get("unhealthy"), f"/health never said 503: {log}"
        assert "kafka" in str(seen.get("error", "")).lower(), f"no Kafka error in /health: {seen}"
        # A history read in flight in the black hole fails too (job_errors), but GET /jobs/j shows its
        # last_error only if the epoch that takes the failure does not read history successfully itself.
        p.stop()
        exactly_once(tmp_path / "j", bootstrap, ["faulty"])
        d.stop()
    finally:
        if p is not None:
            p.stop()
            p.close()
        proxy.stop()
        broker.stop()
