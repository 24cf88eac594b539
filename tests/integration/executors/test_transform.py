"""Transforms are checked on Spark's parsed plan before anything runs: only {source} is read."""

from __future__ import annotations

import pytest

from source_backfill.errors import TransformError
from source_backfill.executors.transform import apply_transform, check_transform

pytestmark = pytest.mark.integration

ALLOWED = [
    "SELECT key, value, partition, offset FROM {source}",
    "SELECT upper(CAST(value AS STRING)) AS v, offset FROM {source} WHERE offset > 3",
    "WITH t AS (SELECT * FROM {source}) SELECT offset FROM t",
    "SELECT offset FROM {source} WHERE partition IN (SELECT partition FROM {source} WHERE offset = 0)",
]
REFUSED = [
    ("SELECT * FROM parquet.`/etc`", "reads 'parquet./etc'"),
    ("SELECT * FROM {source} JOIN some_catalog_table USING (offset)", "reads 'some_catalog_table'"),
    ("SELECT * FROM read_files('/etc')", "table-valued function"),
    ("SELECT * FROM {source} JOIN range(3)", "table-valued function"),
    ("SELECT java_method('java.lang.System', 'exit', 1) AS x FROM {source}", "java_method()"),
    ("SELECT REFLECT('java.lang.Runtime', 'getRuntime') AS x FROM {source}", "reflect()"),
    ("SELECT offset FROM {source} WHERE EXISTS (SELECT 1 FROM parquet.`/tmp`)", "reads 'parquet./tmp'"),
    ("WITH t AS (SELECT * FROM csv.`/etc/passwd`) SELECT * FROM t", "reads 'csv./etc/passwd'"),
    ("SELECT ((( FROM {source}", "does not parse"),
]


@pytest.mark.parametrize("sql", ALLOWED)
def test_queries_over_the_source_pass_and_run(spark, sql):
    from connectors.kafka.ranges import kafka_schema

    check_transform(spark, sql)
    apply_transform(spark, sql, spark.createDataFrame([], kafka_schema())).collect()


@pytest.mark.parametrize(("sql", "reason"), REFUSED)
def test_anything_else_is_refused_before_analysis(spark, sql, reason):
    import re

    with pytest.raises(TransformError, match=re.escape(reason)):
        check_transform(spark, sql)
