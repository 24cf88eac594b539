"""The delta-spark committer: an epoch's rows written by delta-spark itself (``writer="delta-spark"``).

The same protocol through delta-spark's own options: ``txnAppId`` / ``txnVersion`` (delta-spark skips
a replayed epoch itself) and ``userMetadata`` (the job's metadata keys as JSON). Needs delta-spark's
jars on Spark's classpath (:func:`delta_spark_available`).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from connectors.delta.committer import CommitResult, EpochWrite
from connectors.delta.table import is_arrow_table
from source_backfill.errors import DeltaSinkError

if TYPE_CHECKING:
    import pyarrow as pa
    from deltalake import DeltaTable
    from pyspark.sql import DataFrame

    from connectors.delta.table import SinkTable


class DeltaSparkAppend:
    """Append a Spark DataFrame's rows with delta-spark; rows on the driver, or none, go to delta-rs."""

    writes_before_commit = False
    direct = False

    def __init__(self, target: SinkTable) -> None:
        self.target = target
        #: Whether delta-spark's jars load in the session (asked once, of the first DataFrame's session).
        self.available: bool | None = None

    def takes(self, df: DataFrame | pa.Table | None, *, new_keys_only: bool) -> bool:
        """A Spark DataFrame; refused with :class:`DeltaSinkError` when delta-spark's jars are missing."""
        if df is None or is_arrow_table(df):
            return False
        if self.available is None:
            self.available = delta_spark_available(df.sparkSession)
        if not self.available:
            msg = "writer delta-spark asked for, but delta-spark's jars are not on Spark's classpath"
            raise DeltaSinkError(msg)
        return True

    def commit(self, snapshot: DeltaTable | None, write: EpochWrite) -> CommitResult:
        """The same protocol through delta-spark: its txnAppId/txnVersion skip replays for us."""
        target, df = self.target, write.df
        if df is None or is_arrow_table(df):  # (never: not taken, see takes)
            msg = "the delta-spark writer commits a Spark DataFrame"
            raise DeltaSinkError(msg)
        (
            target.conform(df).write.format("delta").mode("append")
            .option("txnAppId", target.job_id).option("txnVersion", str(write.epoch))
            .option("userMetadata", json.dumps(write.meta, sort_keys=True)).save(target.path)
        )
        table = target.open()
        commit = None if table is None else target.find_epoch_commit(table, write.epoch)
        # the version of *this* commit (another writer may have committed after it): the chain of a
        # job's state commits names versions
        version = None if commit is None else int(commit["version"])
        return CommitResult(write.epoch, True, version, 0, -1)


def delta_spark_available(spark: Any) -> bool:
    """True when delta-spark's JVM classes load in ``spark`` (its jars are on the classpath)."""
    try:
        # spark.jars land in Spark's own class loader (the thread's context loader), not the JVM's
        loader = spark._jvm.java.lang.Thread.currentThread().getContextClassLoader()  # noqa: SLF001
        loader.loadClass("io.delta.tables.DeltaTable")
    except Exception:  # noqa: BLE001 - py4j raises a generic error for a missing class; Connect has no _jvm
        return False
    return True
