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


def _files_hold(root: Path, secret: str) -> list[str]:
    """Files under ``root`` whose bytes hold ``secret`` (state, logs, tables: Parquet is not compressed
    away for a short string in a dictionary page, but a password is never a column value here)."""
    needle = secret.encode()
    return [str(p) for p in root.rglob("*") if p.is_file() and needle in p.read_bytes()]


@pytest.mark.parametrize("connector", ["spark", "python"])
def test_a_job_over_scram_tls_with_a_private_ca_ends_exactly_once_and_the_password_shows_nowhere(
    connector, secured_broker, daemon_factory, tmp_path, caplog
):
    import httpx

    from source_backfill.verify import check_exactly_once

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
    producer.stop()
    producer.close()
    kafka = {k: v for k, v in secured_broker.librdkafka_config().items() if k != "bootstrap.servers"}
    wait_for(lambda: check_exactly_once(str(tmp_path / "copy"), secured_broker.bootstrap, [topic],
                                        kafka_options=kafka).ok,
             timeout=120, what="every offset once, read over SASL_SSL")

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


def test_a_job_over_mtls_ends_exactly_once(mtls_broker, daemon_factory, tmp_path):
    from source_backfill.verify import check_exactly_once

    topic = _topic(mtls_broker)
    producer = Producer(mtls_broker.bootstrap, topic, mtls_broker.librdkafka_config())
    producer.send(2000, 2)
    d = daemon_factory([topic], [job_spec("copy", tmp_path)], bootstrap_servers=mtls_broker.bootstrap,
                       security=mtls_broker.client_security())
    producer.stream(2, per_second=100)
    wait_for(lambda: finished(d, "copy"), timeout=max(300, 100 * INTERVAL_S), what="the backfill over mTLS")
    producer.stop()
    producer.close()
    kafka = {k: v for k, v in mtls_broker.librdkafka_config().items() if k != "bootstrap.servers"}
    wait_for(lambda: check_exactly_once(str(tmp_path / "copy"), mtls_broker.bootstrap, [topic],
                                        kafka_options=kafka).ok,
             timeout=120, what="every offset once, read over mTLS")


def _wrong_password(broker: Any, tmp_path: Path) -> dict[str, str]:
    wrong = tmp_path / "wrong-password"
    wrong.write_text("not-the-password")
    return {**broker.client_security(), "password_file": str(wrong)}


def test_a_wrong_password_fails_the_source_saying_so_and_health_names_it(secured_broker, daemon_factory,
                                                                          tmp_path):
    import httpx

    topic = _topic(secured_broker)
    d = daemon_factory([topic], [job_spec("copy", tmp_path)], bootstrap_servers=secured_broker.bootstrap,
                       security=_wrong_password(secured_broker, tmp_path))
    source = d.sources["src"]
    wait_for(lambda: source.error is not None, timeout=120, what="the source's error")
    print("SOURCE ERROR:", source.error)
    health = httpx.get(f"{d.api_url}/health").json()
    print("HEALTH:", health)
    job = httpx.get(f"{d.api_url}/jobs/copy").json()
    print("JOB:", job)
    assert "authentication" in source.error.lower()
