"""Confluent-framed records whose body is JSON (JSON Schema by id) decoded in Spark (``from_json``).

The framing is Avro's (:mod:`.decode`: a magic byte 0, the writer schema's id, the body), the body JSON
text. Unlike Avro's, a JSON body is read the same way whatever its writer schema: by name, onto the job's
reader's columns (``from_json`` with the reader's struct). The writer schemas decide whether the job takes
them (the policy, :mod:`.stage`) and what a field absent from a record is: its writer's default when the
writer has one, else the reader's (null for an optional field). A property the reader lacks is skipped.

A record is undecodable (kept whole, :func:`~.decode.undecodable`) when its magic byte is not 0, its id is
not known, its body is not a JSON object, a value's type is not its column's (``"7"`` for an integer,
``1.5`` for one: ``from_json``'s corrupt-record column tells), or a required field (not nullable, no
default) is absent or null.
"""

from __future__ import annotations

import operator
from collections.abc import Mapping
from functools import reduce
from typing import TYPE_CHECKING

from connectors.schema_registry.decode import DECODED, SCHEMA_ID, schema_id
from source_backfill.core.schema_evolution import Record

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame
    from pyspark.sql.types import StructType

#: The reader struct's extra field that ``from_json`` fills with the text of a record it could not read.
CORRUPT = "_corrupt_record"


def spark_struct(reader: Record, corrupt: bool = False) -> StructType:
    """The Spark struct of ``reader``'s fields (JSON's types: string, long, double, boolean)."""
    from pyspark.sql.types import (
        BinaryType,
        BooleanType,
        DoubleType,
        FloatType,
        IntegerType,
        LongType,
        StringType,
        StructField,
        StructType,
    )

    types = {"string": StringType(), "long": LongType(), "double": DoubleType(), "boolean": BooleanType(),
             "int": IntegerType(), "float": FloatType(), "bytes": BinaryType()}
    fields = [StructField(f.name, types[f.type], True) for f in reader.fields]
    if corrupt:
        fields.append(StructField(CORRUPT, StringType(), True))
    return StructType(fields)


def decode_json(df: DataFrame, writers: Mapping[int, Record], reader: Record,
                column: str = "value") -> DataFrame:
    """``df`` with :data:`SCHEMA_ID` and :data:`DECODED` (a struct of ``reader``'s fields) added.

    ``writers``: the writer schemas of the batch's ids the registry knows (their records are read); a
    record of any other id, or one that does not read (see the module), has a null ``decoded``. A field
    absent from a record (or null) takes its writer's default when its writer has one, else the
    reader's: what the producer meant by leaving it out.
    """
    from pyspark.sql import functions as F  # noqa: N812

    ids = schema_id(F.col(column), writers)
    body = F.expr(f"CAST(substring(`{column}`, 6, length(`{column}`) - 5) AS STRING)")
    parsed = F.from_json(body, spark_struct(reader, corrupt=True),
                         {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": CORRUPT})
    struct = spark_struct(reader)
    values = []
    for f in reader.fields:
        kind = struct[f.name].dataType
        default: Column | None = None
        for sid, writer in sorted(writers.items()):
            w = writer.get(f.name)
            if w is not None and w.has_default and w.default is not None:
                then = F.lit(w.default).cast(kind)
                default = F.when(ids == sid, then) if default is None else default.when(ids == sid, then)
        if f.has_default and f.default is not None:
            own = F.lit(f.default).cast(kind)
            default = own if default is None else default.otherwise(own)
        values.append(parsed[f.name] if default is None else F.coalesce(parsed[f.name], default))
    required = reduce(operator.and_, (v.isNotNull() for v, f in zip(values, reader.fields, strict=True)
                                      if not f.nullable), F.lit(True))
    known = sorted(writers)
    ok = (ids.isin(known) if known else F.lit(False)) & parsed.isNotNull() & parsed[CORRUPT].isNull() \
        & required
    decoded = F.when(ok, F.struct(*(v.alias(f.name) for v, f in zip(values, reader.fields, strict=True))))
    return df.withColumn(SCHEMA_ID, ids).withColumn(DECODED, decoded)
