"""The one place a source's ``connector`` setting is read: which :class:`KafkaConnector` it gets."""

from __future__ import annotations

from typing import TYPE_CHECKING

from connectors.kafka.connector import KafkaConnector
from connectors.kafka.python_connector import PythonKafkaConnector
from connectors.kafka.spark_kafka import SparkKafkaConnector

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from connectors.kafka.admin import KafkaAdmin
    from source_backfill.config import SourceConfig


def connector_class(source: SourceConfig) -> type[KafkaConnector]:
    """The connector class of ``source`` (its ``connector``): the one place the choice is made."""
    if source.connector == "spark":
        return SparkKafkaConnector
    return PythonKafkaConnector


def connector_for(source: SourceConfig, bootstrap_servers: str, spark: SparkSession,
                  admin: KafkaAdmin) -> KafkaConnector:
    """The connector ``source`` reads Kafka with, at ``bootstrap_servers`` (resolved), in ``spark``.

    ``admin``: the source's admin client (log starts for a data-loss check before a read).
    """
    return connector_class(source)(source, bootstrap_servers, spark, admin)
