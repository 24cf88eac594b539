"""The deploy tests run a real daemon with the daemon tests' harness (a real broker, Spark, Delta)."""

from tests.integration.daemon.conftest import daemon_factory, new_topic, producer_for  # noqa: F401
