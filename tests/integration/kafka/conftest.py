"""Secured brokers for the Kafka tests: ``secured_broker`` (SASL_SSL, ACLs on) and ``mtls_broker`` (SSL).

The same fixtures users' tests get from the test kit (``source_backfill.testing``, which the suite does
not load as a plugin): session-scoped, started by the first test that asks for one, stopped at the
session's end. Always the embedded broker (one KRaft node from the jars), whatever
``KAFKA_BOOTSTRAP_SERVERS`` says: the tests need its CA, users and secrets.
"""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def secured_broker():
    """``SASL_SSL`` (SCRAM-SHA-512/256) with a private CA and ACLs on; ``alice`` granted everything."""
    from source_backfill.testing import secured_kafka

    with secured_kafka("SASL_SSL", acls=True) as broker:
        yield broker


@pytest.fixture(scope="session")
def mtls_broker():
    """``SSL`` requiring a client certificate signed by the broker's CA (``alice``'s made); no ACLs."""
    from source_backfill.testing import secured_kafka

    with secured_kafka("SSL", acls=False) as broker:
        yield broker
