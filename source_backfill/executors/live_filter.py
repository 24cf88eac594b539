"""The live filter: which rows of a live batch a job emits this epoch.

The planner (:func:`source_backfill.core.plan_epoch`) gives each split a threshold ``emit_above``: the
job emits the split's live rows with ``offset > threshold``; ``None`` emits none of them (the split is
still backfilling below the batch), ``-1`` all (Finished). The same rule over a Spark DataFrame (a large
batch, or one a transform reads) and over Arrow rows already on the driver (a small batch).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from source_backfill.core import parse_split_id

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import Column, DataFrame, SparkSession

#: Above this many splits with a partial live threshold, the live filter is a broadcast join, not an OR.
MAX_FILTER_TERMS = 64


def _all_or_none(emit_above: Mapping[str, int | None]) -> tuple[dict[str, int], bool]:
    """The splits with a threshold, and whether every split emits every row (all Finished)."""
    keep = {s: t for s, t in emit_above.items() if t is not None}
    return keep, len(keep) == len(emit_above) and all(t < 0 for t in keep.values())


def live_rows(spark: SparkSession, batch: DataFrame, emit_above: Mapping[str, int | None]) -> DataFrame:
    """The live rows the plan emits from a DataFrame: per split ``offset > threshold``."""
    from pyspark.sql import functions as F  # noqa: N812

    keep, everything = _all_or_none(emit_above)
    if everything:
        return batch  # every split finished: the hot path of a caught-up job
    if not keep:
        return batch.limit(0)
    if len(keep) <= MAX_FILTER_TERMS:
        cond: Column | None = None
        for split, threshold in keep.items():
            topic, partition = parse_split_id(split)
            split_rows = (F.col("topic") == topic) & (F.col("partition") == partition)
            term = split_rows & (F.col("offset") > threshold)
            cond = term if cond is None else cond | term
        assert cond is not None  # noqa: S101
        return batch.where(cond)
    rows = [(*parse_split_id(s), t) for s, t in keep.items()]
    thresholds = spark.createDataFrame(rows, "topic string, partition int, _emit_above long")
    joined = batch.join(F.broadcast(thresholds), ["topic", "partition"])
    return joined.where(F.col("offset") > F.col("_emit_above")).drop("_emit_above").select(*batch.columns)


def live_rows_arrow(rows: pa.Table, emit_above: Mapping[str, int | None]) -> pa.Table:
    """The live rows the plan emits from Arrow rows on the driver (in their order)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    keep, everything = _all_or_none(emit_above)
    if everything:
        return rows
    if not keep or rows.num_rows == 0:
        return rows.slice(0, 0)
    topics, partitions = zip(*(parse_split_id(s) for s in keep), strict=True)
    thresholds = pa.table({"topic": pa.array(topics, pa.string()),
                           "partition": pa.array(partitions, rows.schema.field("partition").type),
                           "_emit_above": pa.array(list(keep.values()), pa.int64())})
    at = pa.array(range(rows.num_rows), pa.int64())
    joined = rows.select(["topic", "partition", "offset"]).append_column("_at", at).join(
        thresholds, keys=["topic", "partition"], join_type="inner")
    kept = joined.filter(pc.greater(joined.column("offset"), joined.column("_emit_above"))).column("_at")
    return rows.take(pc.take(kept, pc.sort_indices(kept)))
