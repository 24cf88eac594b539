"""Delta Lake: the exactly-once epoch sink and the table source, both without Delta's JVM jars."""

from connectors.delta.sink import CommitResult, DeltaEpochSink, Recovered, delta_spark_available
from connectors.delta.table_source import DeltaTableSource

__all__ = ["CommitResult", "DeltaEpochSink", "DeltaTableSource", "Recovered", "delta_spark_available"]
