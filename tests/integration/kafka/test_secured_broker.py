"""The embedded broker's secured modes, against the real broker with confluent-kafka clients.

``SASL_SSL`` (SCRAM, private CA): metadata, a topic created, records produced and consumed; a wrong
password, an untrusted CA and a certificate not naming the host are each refused for that reason (the
same client with that one setting right connects). ``SSL`` with client certificates: works with alice's,
refused without one. ACLs: a user without any cannot describe or read a topic, and can once granted.

Refusals are read from librdkafka's error callback (its metadata call only says "transport failure"),
waited for with generous deadlines: the machine running this has 2 busy cores.
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer
from confluent_kafka.admin import AdminClient, NewTopic

pytestmark = pytest.mark.integration

DEADLINE_S = 90.0


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def _create_topic(conf: dict, topic: str, partitions: int = 1) -> None:
    admin = AdminClient({**conf, "log_level": 0})
    admin.create_topics([NewTopic(topic, partitions, 1)], request_timeout=60)[topic].result(timeout=60)
    deadline = time.monotonic() + DEADLINE_S
    while True:  # created is not yet in the broker's metadata cache on a busy machine
        md = admin.list_topics(topic, timeout=10).topics.get(topic)
        if md is not None and md.error is None and len(md.partitions) == partitions:
            return
        assert time.monotonic() < deadline, f"{topic} not in the metadata after {DEADLINE_S}s: {md}"
        time.sleep(0.2)


def _produce(conf: dict, topic: str, values: list[bytes]) -> None:
    errors: list = []
    producer = Producer({**conf, "linger.ms": 5, "log_level": 0})
    for value in values:
        producer.produce(topic, value, on_delivery=lambda err, _msg: err and errors.append(err))
    assert producer.flush(DEADLINE_S) == 0, "records not delivered"
    assert not errors, errors


def _consume(conf: dict, topic: str, count: int, group: str | None = None) -> list[bytes]:
    consumer = Consumer({**conf, "group.id": group or _name("g"), "auto.offset.reset": "earliest",
                         "enable.auto.commit": False, "log_level": 0})
    try:
        consumer.subscribe([topic])
        values: list[bytes] = []
        deadline = time.monotonic() + DEADLINE_S
        while len(values) < count:
            assert time.monotonic() < deadline, f"{len(values)} of {count} records read in {DEADLINE_S}s"
            msg = consumer.poll(1.0)
            if msg is None:
                continue
            assert msg.error() is None, msg.error()
            values.append(msg.value())
        return values
    finally:
        consumer.close()


def _refusal(conf: dict, code: int) -> KafkaError:
    """The first error of ``code`` a client with ``conf`` reports while it tries to read metadata.

    A refused client must also never get metadata: that a call answered would mean it got in. The
    metadata call itself only raises "Broker transport failure"; the cause reaches ``error_cb``, served
    by ``poll``.
    """
    seen: list[KafkaError] = []
    admin = AdminClient({**conf, "error_cb": seen.append, "log_level": 0,
                         "reconnect.backoff.ms": 200, "reconnect.backoff.max.ms": 1000})
    deadline = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline:
        try:
            md = admin.list_topics(timeout=2)
        except KafkaException:
            pass
        else:
            pytest.fail(f"the client was let in: {md.brokers}")
        admin.poll(0.5)
        found = [e for e in seen if e.code() == code]
        if found:
            return found[0]
    pytest.fail(f"no {KafkaError(code).name()} within {DEADLINE_S}s; errors: {[str(e) for e in seen]}")


def _metadata(conf: dict) -> None:
    md = AdminClient({**conf, "log_level": 0}).list_topics(timeout=DEADLINE_S)
    assert md.brokers, md


# -- SASL_SSL --------------------------------------------------------------------------------------------
def test_client_security_names_files_a_client_can_use(secured_broker):
    sec = secured_broker.client_security("alice")
    assert sec["protocol"] == "SASL_SSL"
    assert sec["mechanism"] == "SCRAM-SHA-512"
    assert sec["username"] == "alice"
    for key in ("password_file", "ca_file"):
        assert Path(sec[key]).is_absolute() and Path(sec[key]).is_file(), sec[key]
    assert Path(sec["password_file"]).read_text().strip() == secured_broker.librdkafka_config("alice")[
        "sasl.password"]
    assert "BEGIN CERTIFICATE" in Path(sec["ca_file"]).read_text()


def test_sasl_ssl_metadata_topic_produce_consume(secured_broker):
    conf = secured_broker.librdkafka_config("alice")
    assert conf["security.protocol"] == "SASL_SSL"
    _metadata(conf)
    topic = _name("sasl")
    _create_topic(conf, topic, partitions=2)
    values = [f"v{i}".encode() for i in range(20)]
    _produce(conf, topic, values)
    assert sorted(_consume(conf, topic, len(values))) == sorted(values)


@pytest.mark.slow  # make test keeps SASL_SSL's round trip and a refused password
def test_scram_sha_256_authenticates_too(secured_broker):
    _metadata(secured_broker.librdkafka_config("alice", mechanism="SCRAM-SHA-256"))


def test_a_wrong_password_is_refused(secured_broker):
    conf = {**secured_broker.librdkafka_config("alice"), "sasl.password": "not-alices-password"}
    err = _refusal(conf, KafkaError._AUTHENTICATION)
    assert "Authentication failed" in err.str(), err.str()
    assert "SCRAM-SHA-512" in err.str(), err.str()


@pytest.mark.slow  # make test keeps SASL_SSL's round trip and a refused password
def test_an_untrusted_ca_is_refused(secured_broker):
    conf = {**secured_broker.librdkafka_config("alice"),
            "ssl.ca.location": str(secured_broker.untrusted_ca_file)}
    err = _refusal(conf, KafkaError._SSL)
    assert "SSL handshake failed" in err.str(), err.str()
    assert "certificate verify failed" in err.str(), err.str()


@pytest.mark.slow  # make test keeps SASL_SSL's round trip and a refused password
def test_a_certificate_not_naming_the_host_is_refused(secured_broker):
    conf = secured_broker.librdkafka_config("alice", hostname_mismatch=True)
    err = _refusal(conf, KafkaError._SSL)
    assert "certificate verify failed" in err.str(), err.str()
    # librdkafka says no more than for an unknown CA; the same listener, CA and user without hostname
    # verification get in, so the name (SAN wrong.example, dialled 127.0.0.1) was the cause
    _metadata({**conf, "ssl.endpoint.identification.algorithm": "none"})


# -- SSL with client certificates ------------------------------------------------------------------------
@pytest.mark.slow  # make test keeps SASL_SSL's round trip and a refused password
def test_mtls_with_a_client_certificate(mtls_broker):
    sec = mtls_broker.client_security("alice")
    assert sec["protocol"] == "SSL"
    assert {"ca_file", "client_cert_file", "client_key_file", "key_password_file"} <= set(sec)
    assert "ENCRYPTED PRIVATE KEY" in Path(sec["client_key_file"]).read_text()
    conf = mtls_broker.librdkafka_config("alice")
    topic = _name("mtls")
    _create_topic(conf, topic)
    _produce(conf, topic, [b"a", b"b", b"c"])
    assert _consume(conf, topic, 3) == [b"a", b"b", b"c"]


@pytest.mark.slow  # make test keeps SASL_SSL's round trip and a refused password
def test_mtls_without_a_client_certificate_is_refused(mtls_broker):
    conf = {k: v for k, v in mtls_broker.librdkafka_config("alice").items()
            if k not in ("ssl.certificate.location", "ssl.key.location", "ssl.key.password")}
    # the JVM's TLS answers a handshake without a certificate with alert 42 (bad_certificate); in TLS 1.3
    # the client learns it on its first read after the handshake, so librdkafka reports a receive failure
    err = _refusal(conf, KafkaError._TRANSPORT)
    assert "alert bad certificate" in err.str(), err.str()


# -- ACLs ------------------------------------------------------------------------------------------------
@pytest.mark.slow  # make test keeps SASL_SSL's round trip and a refused password
def test_a_user_without_acls_cannot_describe_or_read_until_granted(secured_broker):
    alice = secured_broker.librdkafka_config("alice")
    topic, group = _name("acl"), _name("acl-group")
    _create_topic(alice, topic)
    _produce(alice, topic, [b"one", b"two"])

    user = _name("bob")
    assert secured_broker.add_user(user) == f"User:{user}"
    bob = secured_broker.librdkafka_config(user)

    md = AdminClient({**bob, "log_level": 0}).list_topics(topic, timeout=DEADLINE_S)
    assert md.topics[topic].error is not None
    assert md.topics[topic].error.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED, md.topics[topic].error
    # with nothing granted, a consumer's group (its coordinator, its join) and its topic's metadata are
    # both refused, in whichever order librdkafka's requests happen to be answered
    assert _read_error(bob, topic, group) in (KafkaError.GROUP_AUTHORIZATION_FAILED,
                                              KafkaError.TOPIC_AUTHORIZATION_FAILED)
    # the group granted, the topic is the one thing missing
    secured_broker.grant(user, group=group)
    assert _read_error(bob, topic, group) == KafkaError.TOPIC_AUTHORIZATION_FAILED

    secured_broker.grant(user, topic=topic)
    md = AdminClient({**bob, "log_level": 0}).list_topics(topic, timeout=DEADLINE_S)
    assert md.topics[topic].error is None and list(md.topics[topic].partitions) == [0]
    assert _consume(bob, topic, 2, group=group) == [b"one", b"two"]


def _read_error(conf: dict, topic: str, group: str) -> int:
    """The first error a consumer in ``group`` subscribed to ``topic`` gets.

    Subscribed, not assigned: librdkafka reports a topic it may not describe to a subscriber, while an
    assigned partition of it only waits for metadata that never comes.
    """
    consumer = Consumer({**conf, "group.id": group, "enable.auto.commit": False, "log_level": 0})
    try:
        consumer.subscribe([topic])
        deadline = time.monotonic() + DEADLINE_S
        while time.monotonic() < deadline:
            msg = consumer.poll(1.0)
            if msg is None:
                continue
            assert msg.error() is not None, f"read {msg.value()!r} without an ACL"
            if msg.error().code() != KafkaError._PARTITION_EOF:
                return int(msg.error().code())
        pytest.fail(f"no error reading {topic} within {DEADLINE_S}s")
    finally:
        consumer.close()


# -- a kept folder -----------------------------------------------------------------------------------------
@pytest.mark.slow  # make test keeps SASL_SSL's round trip and a refused password
def test_a_kept_secured_folder_restarts_with_its_material_and_users(tmp_path):
    from connectors.kafka.embedded import EmbeddedBroker

    folder = tmp_path / "kafka"
    broker = EmbeddedBroker(log_dir=folder, security="SASL_SSL", startup_timeout_s=180.0).start()
    try:
        before = broker.client_security("alice")
        password = Path(before["password_file"]).read_text()
        _metadata(broker.librdkafka_config("alice"))
    finally:
        broker.stop()
    broker = EmbeddedBroker(log_dir=folder, security="SASL_SSL", users=("alice", "carol"),
                            startup_timeout_s=180.0).start()
    try:
        assert broker.client_security("alice") == before
        assert Path(before["password_file"]).read_text() == password
        _metadata(broker.librdkafka_config("alice"))
        _metadata(broker.librdkafka_config("carol"))  # named after the format: added at start
    finally:
        broker.stop()
