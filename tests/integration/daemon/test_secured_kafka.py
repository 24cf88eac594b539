"""The daemon against a real secured broker (issue 47): SCRAM over TLS with a private CA, and mTLS.

The broker is the embedded Apache Kafka in its secured mode (``secured_broker``: SASL_SSL, SCRAM users,
ACLs on; ``mtls_broker``: SSL requiring a client certificate), its CA and keys made by the fixture. Each
job runs with both connectors (Spark's Java client reads with ``connector = "spark"``, librdkafka with
``"python"``; the admin client and the driver's small reads are librdkafka either way) under a live
producer, and is checked offset by offset with the same security. The SASL password is a canary: after
the run it must appear in no log line, API answer, metric, state file or table.
"""

from __future__ import annotations

import logging
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.integration.daemon.conftest import INTERVAL_S, Producer, finished, job_spec, wait_for

pytestmark = pytest.mark.timeout(900)


def _topic(broker: Any, partitions: int = 2) -> str:
    from connectors.kafka.admin import KafkaAdmin

    name = f"sec-{uuid.uuid4().hex[:10]}"
    admin = KafkaAdmin(broker.bootstrap, broker.librdkafka_config())
    try:
        admin.create_topic(name, partitions)
    finally:
        admin.close()
    return name


def _stopped_then_exactly_once(producer: Producer, broker: Any, table: Path, topic: str) -> None:
    """Stop the live producer, then wait for the table to hold every offset once, read as the broker
    wants (its security)."""
    from source_backfill.verify import check_exactly_once

    producer.stop()
    producer.close()
    kafka = {k: v for k, v in broker.librdkafka_config().items() if k != "bootstrap.servers"}
    wait_for(lambda: check_exactly_once(str(table), broker.bootstrap, [topic], kafka_options=kafka).ok,
             timeout=120, what=f"every offset once, read over {broker.security}")


def _files_hold(root: Path, secret: str) -> list[str]:
    """Files under ``root`` whose bytes hold ``secret`` (state, logs, tables: Parquet is not compressed
    away for a short string in a dictionary page, but a password is never a column value here)."""
    needle = secret.encode()
    return [str(p) for p in root.rglob("*") if p.is_file() and needle in p.read_bytes()]


#: the daemon over a secured broker runs in make test-slow (CI); make test keeps the broker's SASL_SSL
#: round trip and a refused password (tests/integration/kafka/test_secured_broker.py) and the translation's
#: unit tests, within its ten minutes
@pytest.mark.slow
@pytest.mark.parametrize("connector", ["spark", "python"])
def test_a_job_over_scram_tls_with_a_private_ca_ends_exactly_once_and_the_password_shows_nowhere(
    connector, secured_broker, daemon_factory, tmp_path, caplog
):
    import httpx

    caplog.set_level(logging.DEBUG)
    security = secured_broker.client_security()
    password = Path(security["password_file"]).read_text()
    topic = _topic(secured_broker)
    producer = Producer(secured_broker.bootstrap, topic, secured_broker.librdkafka_config())
    producer.send(3000, 2)  # history
    d = daemon_factory([topic], [job_spec("copy", tmp_path)], bootstrap_servers=secured_broker.bootstrap,
                       security=security, connector=connector)
    producer.stream(2, per_second=100)  # and live records while it backfills and after
    wait_for(lambda: finished(d, "copy"), timeout=max(300, 100 * INTERVAL_S),
             what="the backfill over SASL_SSL")
    source = d.sources["src"]
    wait_for(lambda: source.jobs["copy"].committed_epoch is not None
             and source.jobs["copy"].committed_epoch >= source.last_epoch - 1, what="the job following live")
    _stopped_then_exactly_once(producer, secured_broker, tmp_path / "copy", topic)
    # the daemon's own verify reads the log over the source's security too (POST /jobs/{name}/verify)
    run = httpx.post(f"{d.api_url}/jobs/copy/verify").json()
    run = wait_for(lambda: (r := httpx.get(f"{d.api_url}/jobs/copy/verify/{run['id']}").json())["status"]
                   != "running" and r, timeout=120, what="the daemon's verify run over SASL_SSL")
    assert run["status"] == "done" and run["ok"], run

    # the canary: nowhere the daemon writes or answers
    answers = [httpx.get(f"{d.api_url}{path}").text for path in ("/jobs", "/jobs/copy", "/health", "/ready")]
    from prometheus_client import generate_latest

    answers.append(generate_latest().decode())
    from source_backfill.core import HistoryRange

    query = source._query  # noqa: SLF001 - the live query
    history = source.connector.read_ranges([HistoryRange(f"{topic}:0", 0, 10)])  # a history read's plan
    answers += [query._jsq.explainInternal(True), history._jdf.queryExecution().toString(),  # noqa: SLF001
                repr(query.lastProgress), repr(d.spark.sparkContext.getConf().getAll())]
    assert not [a for a in answers if password in a]
    assert not [r.getMessage() for r in caplog.records if password in r.getMessage()]
    assert _files_hold(tmp_path, password) == []


@pytest.mark.slow
@pytest.mark.parametrize("connector", ["spark", "python"])
def test_a_job_over_mtls_ends_exactly_once(connector, mtls_broker, daemon_factory, tmp_path):
    topic = _topic(mtls_broker)
    producer = Producer(mtls_broker.bootstrap, topic, mtls_broker.librdkafka_config())
    producer.send(2000, 2)
    d = daemon_factory([topic], [job_spec("copy", tmp_path)], bootstrap_servers=mtls_broker.bootstrap,
                       security=mtls_broker.client_security(), connector=connector)
    producer.stream(2, per_second=100)
    wait_for(lambda: finished(d, "copy"), timeout=max(300, 100 * INTERVAL_S), what="the backfill over mTLS")
    _stopped_then_exactly_once(producer, mtls_broker, tmp_path / "copy", topic)


def _sources(broker: Any, tmp_path: Path, bad: dict[str, dict[str, Any]]) -> Any:
    """A daemon with a source that connects as alice (``good``, 500 records of history) and one source of
    each of ``bad``'s settings by name, a job on each (``job-<source>``)."""
    from source_backfill.config import load_settings
    from source_backfill.daemon import Daemon

    good_topic = _topic(broker)
    producer = Producer(broker.bootstrap, good_topic, broker.librdkafka_config())
    producer.send(500, 2)
    producer.close()
    base = {"bootstrap_servers": broker.bootstrap, "trigger_interval_s": INTERVAL_S}
    sources = [{**base, "name": "good", "topics": [good_topic], "security": broker.client_security()}]
    sources += [{**base, "name": name, "topics": [_topic(broker)], **more} for name, more in bad.items()]
    settings = load_settings(
        daemon={"state_root": str(tmp_path / "state"), "shutdown_timeout_s": 60},
        api={"port": 0}, metrics={"port": None}, sources=sources,
        jobs=[{"name": f"job-{s['name']}", "source": s["name"], "sink_path": str(tmp_path / s["name"])}
              for s in sources],
    )
    daemon = Daemon(settings)
    daemon.start()
    return daemon


def _bad_settings(broker: Any, tmp_path: Path) -> dict[str, tuple[dict[str, Any], str]]:
    """Per case, a source's settings that cannot connect, and what its error must say."""
    security = broker.client_security()
    wrong = tmp_path / "wrong-password.txt"  # (not a job's table path)
    wrong.write_text("not-the-password")
    broker.add_user("mallory")  # may connect, has no ACL
    return {
        "wrong-password": ({"security": {**security, "password_file": str(wrong)}}, "authentication failed"),
        "untrusted-ca": ({"security": {**security, "ca_file": str(broker.untrusted_ca_file)}}, "not trusted"),
        "hostname-mismatch": ({"security": security, "bootstrap_servers": broker.mismatch_bootstrap},
                              "does not name 127.0.0.1"),
        "denied-principal": ({"security": broker.client_security("mallory")}, "not authorized"),
    }


@pytest.mark.slow
def test_a_source_that_cannot_connect_says_why_and_its_neighbours_go_on(secured_broker, spark, tmp_path):
    """A wrong password, an untrusted CA, a certificate naming another host, an expired certificate (a TLS
    listener presenting one the broker's CA signed) and a principal without ACLs, one source each in one
    daemon: each fails with its cause in its error and /health, its job not failed, while the source
    connecting as alice backfills."""
    from tests.fixtures.tls_listener import tls_listener

    cases = _bad_settings(secured_broker, tmp_path)
    with tls_listener(secured_broker.expired_certificate()) as expired:
        # "certificate has expired": librdkafka's "verify failed" gives only "not trusted ... or has expired"
        cases["expired-certificate"] = ({"security": secured_broker.client_security(),
                                         "bootstrap_servers": expired}, "certificate has expired")
        _cannot_connect(secured_broker, tmp_path, cases)


def _cannot_connect(secured_broker: Any, tmp_path: Path,
                    cases: dict[str, tuple[dict[str, Any], str]]) -> None:
    """Each of ``cases`` (a source's settings, what its error says) as a source beside alice's."""
    import httpx

    d = _sources(secured_broker, tmp_path, {name: settings for name, (settings, _) in cases.items()})
    try:
        wait_for(lambda: all(d.sources[name].error is not None for name in cases), timeout=240,
                 what="every bad source's error")
        health = httpx.get(f"{d.api_url}/health").json()
        for name, (_, says) in cases.items():
            error = d.sources[name].error
            assert says in error.lower(), (name, error)
            assert not health["sources"][name]["healthy"], name
            assert says in " ".join(health["sources"][name]["problems"]).lower(), (name, health)
            assert httpx.get(f"{d.api_url}/jobs/job-{name}").json()["status"] != "failed"  # the source's
        good = d.sources["good"]  # the neighbour goes on: backfilled and following live
        wait_for(lambda: good.jobs["job-good"].backfill_done and good.error is None,
                 timeout=max(180, 60 * INTERVAL_S), what="the good source's job")
    finally:
        d.stop()


@pytest.mark.slow
def test_revoked_credentials_fail_their_source_saying_so_and_the_neighbour_goes_on(spark, tmp_path):
    """bob's SCRAM credentials are deleted while his source runs: the broker asks every connection to
    re-authenticate within 5 s (``connections.max.reauth.ms``), bob's fail, his source says why; alice's
    source goes on committing."""
    from connectors.kafka.embedded import EmbeddedBroker

    with EmbeddedBroker(security="SASL_SSL", users=("alice", "bob"), startup_timeout_s=180,
                        overrides={"connections.max.reauth.ms": "5000"}) as broker:
        d = _sources(broker, tmp_path, {"bad": {"security": broker.client_security("bob")}})
        try:
            good, bad = d.sources["good"], d.sources["bad"]
            wait_for(lambda: good.jobs["job-good"].backfill_done and bad.last_epoch is not None, timeout=180,
                     what="both sources running")
            assert bad.error is None
            broker.revoke("bob")
            wait_for(lambda: bad.error is not None, timeout=180, what="bob's source failing")
            assert "authentication failed" in bad.error.lower(), bad.error
            at = good.last_epoch
            wait_for(lambda: good.last_epoch >= at + 3 and good.error is None, timeout=120,
                     what="alice's source going on")
        finally:
            d.stop()
