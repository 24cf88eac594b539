"""The checks of a change to a running job, made when it is asked for (a 422 naming why), not in an epoch.

* A new transform (``PATCH /jobs/{name}``) passes the create's checks and gives the job's table the
  columns it has: the same names and types as the job's current transform gives (the table was made
  from those), so no epoch after the change writes a column the table lacks or a type it does not hold.
* A repair (``POST /jobs/{name}/repair``) is for a Kafka job that has committed, whose table keeps the
  columns the window is matched on (``executors/repair.py``), and whose splits are its source's topics.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from source_backfill.core import parse_split_id
from source_backfill.errors import ConfigError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from source_backfill.config import JobSpec, RepairSpec, SourceConfig


def check_retransform(spark: SparkSession | None, old: JobSpec, new: JobSpec) -> None:
    """``new``'s transform gives the columns ``old``'s gives (names, order and types); ConfigError if not.

    Both are applied to an empty DataFrame of Kafka's columns (analysis only, no Spark job runs); the
    new transform has passed the transform check before (the caller's create checks).
    """
    if old.format.value != "raw" or new.format.value != old.format.value:
        msg = (f'job "{new.name}" decodes its records ({old.format.value}): its transform reads the decoded '
               "columns, which only the job's table knows; re-create the job with the new transform")
        raise ConfigError(msg)
    if spark is None:
        return
    from connectors.kafka.ranges import kafka_schema
    from source_backfill.executors.transform import apply_transform

    empty = spark.createDataFrame([], kafka_schema())
    before = apply_transform(spark, old.transform, empty).schema
    after = apply_transform(spark, new.transform, empty).schema
    had = [(f.name, f.dataType.simpleString()) for f in before.fields]
    has = [(f.name, f.dataType.simpleString()) for f in after.fields]
    if had != has:
        msg = (f'the new transform changes the columns of job "{new.name}"\'s table: it has '
               f"{_columns(had)}, the new transform gives {_columns(has)} (a new table needs a new job)")
        raise ConfigError(msg)


def check_repair(spec: JobSpec, repair: RepairSpec, source: SourceConfig, *, failed: bool) -> None:
    """The job can be repaired as asked (see the module); ConfigError saying why not."""
    from deltalake import DeltaTable

    from source_backfill.executors.repair import check_repairable

    if source.kind != "kafka":
        msg = f'job "{spec.name}" reads a delta source: a repair replaces a window of Kafka offsets'
        raise ConfigError(msg)
    if failed:
        msg = f'job "{spec.name}" has failed: retry it first, then repair it'
        raise ConfigError(msg)
    if not DeltaTable.is_deltatable(spec.sink_path):
        msg = f'job "{spec.name}" has committed nothing yet: there is nothing to repair'
        raise ConfigError(msg)
    check_repairable([f.name for f in DeltaTable(spec.sink_path).schema().fields], source)
    if source.topics:
        others = sorted({parse_split_id(s)[0] for s in repair.splits} - set(source.topics))
        if others:
            msg = f'splits of topics the source "{source.name}" does not read: {", ".join(others[:5])}'
            raise ConfigError(msg)


def _columns(cols: list[tuple[str, str]]) -> str:
    return "(" + ", ".join(f"{n} {t}" for n, t in cols) + ")"
