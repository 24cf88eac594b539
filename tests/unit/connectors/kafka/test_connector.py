"""The Kafka connector of a source: which one a config gets, and the exact options each gives its reader."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from connectors.kafka.connector import KafkaConnector
from connectors.kafka.factory import connector_class, connector_for
from connectors.kafka.python_connector import PythonKafkaConnector, max_read_tasks
from connectors.kafka.spark_kafka import SparkKafkaConnector
from source_backfill.config import SourceConfig

#: What the options were before the connector interface (captured from ``spark_kafka.reader_options``
#: and ``source.reader_options`` at 3e3e621): the same source gives the same options.
DEFAULT_SPARK = {
    "kafka.bootstrap.servers": "b:9092", "failOnDataLoss": "true", "kafkaConsumer.pollTimeoutMs": "60000",
    "fetchOffset.numRetries": "3", "kafka.isolation.level": "read_committed",
    "kafka.max.poll.records": "10000", "kafka.default.api.timeout.ms": "20000",
    "kafka.request.timeout.ms": "20000",
}
DEFAULT_PYTHON = {
    "kafka.bootstrap.servers": "b:9092", "failOnDataLoss": "true", "maxTasks": "7",
    "kafkaConsumer.pollTimeoutMs": "60000",
}
TUNED = {"poll_timeout_s": 2.5, "fail_on_data_loss": False,
         "kafka": {"max.poll.records": "700", "client.id": "c", "request.timeout.ms": "9"}}
TUNED_SPARK = {
    "kafka.bootstrap.servers": "b:9092", "failOnDataLoss": "false", "kafkaConsumer.pollTimeoutMs": "2500",
    "fetchOffset.numRetries": "3", "kafka.isolation.level": "read_committed",
    "kafka.max.poll.records": "700", "kafka.default.api.timeout.ms": "1000",
    "kafka.request.timeout.ms": "9", "kafka.client.id": "c",
}
TUNED_PYTHON = {
    "kafka.bootstrap.servers": "b:9092", "failOnDataLoss": "false", "maxTasks": "7",
    "kafkaConsumer.pollTimeoutMs": "2500", "kafka.max.poll.records": "700",
    "kafka.client.id": "c", "kafka.request.timeout.ms": "9",
}


def _spark(parallelism: int = 4) -> object:
    return SimpleNamespace(sparkContext=SimpleNamespace(defaultParallelism=parallelism))


def _connector(connector: str, spark: object | None = None, **source: object) -> KafkaConnector:
    config = SourceConfig(name="s", topics=["t"], connector=connector, **source)  # type: ignore[arg-type]
    return connector_for(config, "b:9092", spark or _spark(), None)  # type: ignore[arg-type]


@pytest.mark.parametrize(("kind", "cls", "python_workers"), [
    ("spark", SparkKafkaConnector, False), ("python", PythonKafkaConnector, True),
])
def test_the_source_config_picks_the_connector(kind, cls, python_workers):
    config = SourceConfig(name="s", topics=["t"], connector=kind)
    assert connector_class(config) is cls
    assert cls.python_workers is python_workers  # the session registers kafka_py, warms a worker
    made = connector_for(config, "resolved:9092", _spark(), None)
    assert type(made) is cls
    assert made.bootstrap_servers == "resolved:9092" and made.source is config


def test_spark_connector_options_are_the_ones_of_before():
    assert _connector("spark").reader_options() == DEFAULT_SPARK
    assert _connector("spark", **TUNED).reader_options() == TUNED_SPARK


def test_python_connector_options_are_the_ones_of_before():
    assert _connector("python", max_read_tasks=7).reader_options() == DEFAULT_PYTHON
    assert _connector("python", max_read_tasks=7, **TUNED).reader_options() == TUNED_PYTHON


def test_python_connector_tasks_are_twice_the_parallelism_unless_configured():
    assert _connector("python", _spark(3)).reader_options()["maxTasks"] == "6"
    assert _connector("python", _spark(0)).reader_options()["maxTasks"] == "2"
    assert _connector("python", _spark(3), max_read_tasks=5).reader_options()["maxTasks"] == "5"
    assert max_read_tasks(_spark(8), None) == 16


def test_the_resolved_bootstrap_servers_are_read_not_the_configs():
    config = SourceConfig(name="s", topics=["t"], bootstrap_servers="embedded")
    for kind in ("spark", "python"):
        made = connector_for(config.model_copy(update={"connector": kind}), "127.0.0.1:39092", _spark(), None)
        assert made.reader_options()["kafka.bootstrap.servers"] == "127.0.0.1:39092"


def test_close_without_a_small_batch_read_is_harmless():
    made = _connector("python")
    made.close()
    made.close()
