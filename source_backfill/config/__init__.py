"""The one typed configuration model: a TOML file, overridden by ``SOURCE_BACKFILL_*`` environment variables.

Nested keys use ``__`` in the environment: ``SOURCE_BACKFILL_API__TOKEN=secret``,
``SOURCE_BACKFILL_SPARK__MASTER=spark://host:7077``. Lists (sources, jobs) come from the file; a JSON
value in the environment replaces the whole list.

One model, one section per module (everything is imported from here): :mod:`.base` (the frozen base
model, names, "off" values), :mod:`.starts` (where a job's history starts), :mod:`.kafka` (a Kafka
source's width, archive, security and Schema Registry), :mod:`.sources`, :mod:`.jobs` (a job, its format,
repairs, what it asks of its source), :mod:`.daemon` (Spark, the API, metrics, the process),
:mod:`.access` (who may use the API) and
:mod:`.settings` (all of it, loaded).
"""

from __future__ import annotations

from source_backfill.config.access import DEFAULT_NAMESPACE, NamespaceConfig, OidcConfig
from source_backfill.config.base import (
    EMBEDDED,
    MAX_TRANSFORM_CHARS,
    NAME_PATTERN,
    TRANSFORM_PATTERN,
    Name,
    TransformText,
    transform_text,
)
from source_backfill.config.daemon import (
    LOOPBACK_HOSTS,
    ApiConfig,
    DaemonConfig,
    MetricsConfig,
    SparkConfig,
    normalize_host,
)
from source_backfill.config.jobs import (
    DEAD_LETTER_SUFFIX,
    MAX_REPAIR_SPLITS,
    AvroFormat,
    FormatSpec,
    JobSpec,
    RawFormat,
    RepairSpec,
    RetrySpec,
    check_job_fits_source,
)
from source_backfill.config.kafka import (
    SECURITY_OPTIONS,
    ArchiveConfig,
    HistoryWidthConfig,
    KafkaSecurity,
    SchemaRegistryConfig,
)
from source_backfill.config.settings import (
    Settings,
    describe_errors,
    load_settings,
    validation_message,
)
from source_backfill.config.sources import (
    SourceConfig,
)
from source_backfill.config.starts import (
    EarliestStart,
    LatestStart,
    OffsetsStart,
    StartSpec,
    TimestampStart,
)

__all__ = [
    "ApiConfig",
    "ArchiveConfig",
    "AvroFormat",
    "DEAD_LETTER_SUFFIX",
    "DEFAULT_NAMESPACE",
    "DaemonConfig",
    "EMBEDDED",
    "EarliestStart",
    "FormatSpec",
    "HistoryWidthConfig",
    "JobSpec",
    "KafkaSecurity",
    "LOOPBACK_HOSTS",
    "LatestStart",
    "MAX_REPAIR_SPLITS",
    "MAX_TRANSFORM_CHARS",
    "MetricsConfig",
    "NAME_PATTERN",
    "Name",
    "NamespaceConfig",
    "OffsetsStart",
    "OidcConfig",
    "RawFormat",
    "RepairSpec",
    "RetrySpec",
    "SECURITY_OPTIONS",
    "SchemaRegistryConfig",
    "Settings",
    "SourceConfig",
    "SparkConfig",
    "StartSpec",
    "TRANSFORM_PATTERN",
    "TimestampStart",
    "TransformText",
    "check_job_fits_source",
    "describe_errors",
    "load_settings",
    "normalize_host",
    "transform_text",
    "validation_message",
]
