"""Delta Lake: the exactly-once epoch sink and the table source, both without Delta's JVM jars."""

from connectors.delta.committer import CommitResult
from connectors.delta.sink import DeltaEpochSink, Recovered
from connectors.delta.spark_writer import delta_spark_available
from connectors.delta.table_source import DeltaTableSource

__all__ = ["CommitResult", "DeltaEpochSink", "DeltaTableSource", "Recovered", "delta_spark_available"]
