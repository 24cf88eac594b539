"""Broker faults: the broker stopped and restarted on the same port and log folder mid-backfill."""

from __future__ import annotations

import pytest

from tests.integration.daemon.conftest import (
    Producer,
    exactly_once,
    finished,
    job_of,
    job_spec,
    metric_total,
    wait_for,
)

pytestmark = pytest.mark.integration


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
