"""An expired broker certificate is named as such, in either client's words.

librdkafka says "certificate verify failed" alike for an untrusted CA, an expired certificate and one
naming another host; the daemon checks once more with Python's TLS (``security.tls_diagnosis``), which
names the cause. Real TLS: a certificate made by ``tls_material`` (valid on 1 January 2020 only) presented
by a TLS listener, a real librdkafka client refused by it.
"""

from __future__ import annotations

import threading

import pytest
from confluent_kafka import KafkaError
from confluent_kafka.admin import AdminClient

from connectors.kafka import tls_material
from connectors.kafka.security import explain_failure, tls_diagnosis
from tests.fixtures.tls_listener import tls_listener

pytestmark = pytest.mark.integration


@pytest.fixture
def ca(tmp_path):
    return tls_material.make_ca(tmp_path / "tls", "ca", "test CA")


def test_an_expired_certificate_is_named_expired_where_librdkafka_says_only_verify_failed(ca):
    expired = ca.issue("expired", "127.0.0.1", ("DNS:localhost", "IP:127.0.0.1"), expired=True)
    with tls_listener(expired) as bootstrap:
        options = {"security.protocol": "SSL", "ssl.ca.location": str(ca.cert_file)}
        assert "has expired" in (tls_diagnosis(bootstrap, options) or "")
        errors: list[KafkaError] = []
        seen = threading.Event()

        def on_error(err: KafkaError) -> None:
            errors.append(err)
            if err.code() == KafkaError._SSL:
                seen.set()

        admin = AdminClient({"bootstrap.servers": bootstrap, **options, "error_cb": on_error})
        try:
            for _ in range(60):
                admin.poll(1)
                if seen.wait(0):
                    break
        finally:
            del admin
        text = next(e.str() for e in errors if e.code() == KafkaError._SSL)
        assert "certificate verify failed" in text and "expired" not in text, text
        explained = explain_failure(text, bootstrap, options)
        assert explained.startswith(text), explained
        assert "TLS: the broker's certificate has expired" in explained, explained


def test_the_same_listener_with_a_valid_certificate_is_not_refused(ca):
    """The control: the same CA, host and listener with a certificate in date: Python's TLS gets in."""
    valid = ca.issue("valid", "127.0.0.1", ("DNS:localhost", "IP:127.0.0.1"))
    with tls_listener(valid) as bootstrap:
        assert tls_diagnosis(bootstrap, {"ssl.ca.location": str(ca.cert_file)}) is None
