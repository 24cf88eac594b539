"""Transforms are judged on Spark's parsed plan by allow-list before anything runs.

The hostile transforms below were each tried as an attacker would; every one is kept so that the hole
it probes fails this test if it reopens. They are grouped by kind (statements, shell, files, other
tables, JVM reflection, name resolution, function names, format fields, resource exhaustion).
"""

from __future__ import annotations

import re

import pytest

from source_backfill.errors import TransformError
from source_backfill.executors import transform as transform_module
from source_backfill.executors.transform import MAX_TRANSFORM_CHARS, apply_transform, check_transform
from source_backfill.executors.transform_allowed import FUNCTIONS, GENERATORS

pytestmark = pytest.mark.integration

ALLOWED = [
    "SELECT key, value, partition, offset FROM {source}",
    "SELECT upper(CAST(value AS STRING)) AS v, offset FROM {source} WHERE offset > 3",
    "WITH t AS (SELECT * FROM {source}) SELECT offset FROM t",
    "SELECT offset FROM {source} WHERE partition IN (SELECT partition FROM {source} WHERE offset = 0)",
    "SELECT partition, count(*) AS n, max(offset) FILTER (WHERE offset > 1) m FROM {source} "
    "GROUP BY partition HAVING count(*) > 0 ORDER BY partition LIMIT 10 OFFSET 1",
    "SELECT offset, sum(offset) OVER w AS s, row_number() OVER (PARTITION BY partition ORDER BY offset) rn "
    "FROM {source} WINDOW w AS (PARTITION BY partition ORDER BY offset "
    "ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW)",
    "SELECT a.offset FROM {source} a JOIN {source} b ON a.offset = b.offset AND a.partition = b.partition",
    "SELECT offset, w FROM {source} LATERAL VIEW explode(split(CAST(value AS STRING), ',')) t AS w",
    "SELECT explode(array(1, 2)) AS e, transform(array(1, 2), x -> x + 1) AS t, offset FROM {source}",
    "SELECT DISTINCT partition FROM {source} UNION ALL SELECT partition FROM {source} "
    "EXCEPT SELECT 99 INTERSECT SELECT partition FROM {source}",
    "SELECT CASE WHEN offset % 2 = 0 THEN 'even' ELSE 'odd' END c, offset BETWEEN 1 AND 2 b, "
    "CAST(value AS STRING) LIKE 'x%' l, CAST(key AS STRING) || 'x' k, -offset n, NOT (offset > 1) g, "
    "from_json(CAST(value AS STRING), 'a INT').a AS a, map('k', 1)['k'] mk, timestamp + INTERVAL 1 DAY t, "
    "TIMESTAMP '2020-01-01' t0, EXTRACT(YEAR FROM timestamp) y, value IS NULL z, offset DIV 2 d "
    "FROM {source}",
    "SELECT partition, count(*) FROM {source} GROUP BY GROUPING SETS ((partition), ())",
    "SELECT partition, count(*) FROM {source} GROUP BY 1",
    "SELECT offset, v.x FROM {source} CROSS JOIN (VALUES (1), (2)) AS v(x)",
    "SELECT sha2(value, 256) h, uuid() u, rand() r, current_timestamp() ts, coalesce(key, value) k, "
    "get_json_object(CAST(value AS STRING), '$.a') j FROM {source}",
    "SELECT offset FROM {source} WHERE EXISTS (SELECT 1 FROM {source} s WHERE s.offset = offset) "
    "AND offset > (SELECT min(offset) FROM {source})",
    "WITH a AS (SELECT * FROM {source}), b AS (SELECT * FROM a WHERE offset > 0) SELECT * FROM b",
    "SELECT struct(offset, partition) AS s, named_struct('a', 1) n FROM {source} WHERE partition NOT IN (5)",
    "SELECT `offset`, topic FROM {source} WHERE topic <> '{source}'",
]

#: (kind, transform, what the refusal must say)
HOSTILE = [
    # statements: only a query may reach spark.sql
    ("statement", "WITH t AS (SELECT * FROM {source}) INSERT OVERWRITE TABLE victim SELECT * FROM t",
     "INSERT"),
    ("statement", "WITH t AS (SELECT * FROM {source}) INSERT INTO delta.`/tmp/other-job` SELECT * FROM t",
     "INSERT"),
    ("statement", "SELECT * FROM {source}; DROP TABLE victim", "does not parse"),
    ("statement", "EXECUTE IMMEDIATE 'SELECT * FROM {source}'", "EXECUTE IMMEDIATE"),
    ("statement", "SELECT * FROM {source}; SET spark.sql.variable.substitute=true", "does not parse"),
    ("statement", "WITH t AS (SELECT * FROM {source}) SELECT /*+ REPARTITION(100000) */ * FROM t", "hint"),
    # shell
    ("shell", "SELECT TRANSFORM(value) USING 'sh -c id' AS (o) FROM {source}", "script"),
    ("shell", "SELECT TRANSFORM(*) USING 'bash -c \"cat /etc/passwd\"' FROM {source}", "script"),
    ("shell", "SELECT java_method('java.lang.Runtime', 'exec', 'id') AS x FROM {source}", "java_method()"),
    ("shell", "FROM {source} SELECT TRANSFORM(key) USING 'python3 -c 1'", "script"),
    # files
    ("files", "SELECT * FROM {source} UNION ALL SELECT * FROM parquet.`/etc`", "reads 'parquet./etc'"),
    ("files", "SELECT * FROM {source} UNION ALL SELECT * FROM text.`/etc/passwd`",
     "reads 'text./etc/passwd'"),
    ("files", "SELECT * FROM read_files('/etc/passwd') JOIN {source}", "table-valued function"),
    ("files", "SELECT input_file_name() AS f FROM {source}", "input_file_name()"),
    ("files", "SELECT * FROM {source} WITH ('path' = '/etc/passwd')", "with options"),
    ("files", "WITH t AS (SELECT * FROM csv.`/etc/passwd`) SELECT * FROM t, {source}",
     "reads 'csv./etc/passwd'"),
    ("files", "SELECT xpath_string('<!DOCTYPE x [<!ENTITY e SYSTEM \"file:///etc/passwd\">]><x>&e;</x>', "
     "'/x') AS p FROM {source}", "xpath_string()"),
    ("files", "SELECT offset FROM {source} WHERE EXISTS (SELECT 1 FROM json.`/tmp`)", "reads 'json./tmp'"),
    # other tables
    ("tables", "SELECT * FROM {source} JOIN spark_catalog.default.victim USING (offset)",
     "reads 'spark_catalog.default.victim'"),
    ("tables", "SELECT * FROM delta.`/data/tables/other-job` WHERE '{source}' > ''",
     "reads 'delta./data/tables/other-job'"),
    ("tables", "SELECT * FROM {source} UNION ALL SELECT * FROM global_temp.shared",
     "reads 'global_temp.shared'"),
    ("tables", "SELECT * FROM {source} VERSION AS OF 1", "time travel"),
    ("tables", "SELECT * FROM {source} JOIN range(3)", "table-valued function"),
    # JVM reflection
    ("jvm", "SELECT java_method('java.lang.System', 'exit', 1) AS x FROM {source}", "java_method()"),
    ("jvm", "SELECT REFLECT('java.lang.Runtime', 'getRuntime') AS x FROM {source}", "REFLECT()"),
    ("jvm", "SELECT try_reflect('java.lang.System', 'getenv', 'HOME') AS x FROM {source}", "try_reflect()"),
    ("jvm", "SELECT offset FROM {source} LATERAL VIEW java_method('a', 'b') t AS x", "java_method()"),
    # name resolution tricks
    ("names", "SELECT * FROM (WITH x AS (SELECT * FROM {source}) SELECT * FROM x) JOIN x USING (offset)",
     "reads 'x'"),
    ("names", "WITH x AS (SELECT * FROM x) SELECT * FROM x JOIN {source}", "reads 'x'"),
    ("names", "WITH RECURSIVE r AS (SELECT offset FROM {source} UNION ALL SELECT offset + 1 FROM r) "
     "SELECT * FROM r", "RECURSIVE"),
    ("names", "SELECT * FROM spark_catalog.default.{source}", "reads"),
    ("names", "SELECT * FROM IDENTIFIER('victim') JOIN {source} USING (offset)", "reads 'victim'"),
    ("names", "SELECT * FROM __source_backfill_0123456789abcdef0123456789abcdef UNION ALL "
     "SELECT * FROM {source}", "reads '__source_backfill_"),
    ("names", "SELECT * FROM {source} TABLESAMPLE (10 PERCENT)", "TABLESAMPLE"),
    # function-name tricks
    ("functions", "SELECT system.builtin.java_method('java.lang.System', 'exit', 1) FROM {source}",
     "system.builtin.java_method()"),
    ("functions", "SELECT `java_method`('java.lang.System', 'exit', 1) FROM {source}", "java_method()"),
    ("functions", "SELECT IDENTIFIER('java_method')('java.lang.System', 'exit', 1) FROM {source}",
     "IDENTIFIER"),
    ("functions", "SELECT my_registered_udf(value) FROM {source}", "my_registered_udf()"),
    ("functions", "SELECT current_user() AS u, version() AS v FROM {source}", "()"),
    ("functions", "SELECT from_avro(value, '{\"type\":\"int\"}', map('avroSchemaUrl', 'file:///etc/passwd')) "
     "FROM {source}", "from_avro()"),
    ("functions", "SELECT offset FROM {source} LATERAL VIEW read_files('/etc') t AS x", "read_files()"),
    # format fields and Spark's variable substitution
    ("format", "SELECT * FROM {source.__init__.__globals__}", "must read the Kafka rows as {source}"),
    ("format", "SELECT '${env:SOURCE_BACKFILL_API_TOKEN}' AS t FROM {source}", "'${'"),
    ("format", "SELECT '${spark.app.name}' AS t FROM {source}", "'${'"),
    ("format", "SELECT '${system:user.dir}' AS t FROM {source}", "'${'"),
    ("format", "SELECT * FROM {source} WHERE {0} = 1", "does not parse"),
    # resource exhaustion (the check itself is bounded; running time is bounded by the job's deadline)
    ("resources", "SELECT offset FROM {source} WHERE " + " OR ".join(["offset = 1"] * 1800), "characters"),
    ("resources", "SELECT " + "+".join(["1"] * 6000) + " AS s FROM {source}", "too"),
    ("resources", "SELECT * FROM {source} WHERE partition IN (" + ",".join(["7"] * 6000) + ")", "too large"),
    ("resources", "SELECT " + "(" * 4000 + "offset" + ")" * 4000 + " FROM {source}", "nests parentheses"),
]


@pytest.mark.parametrize("sql", ALLOWED)
def test_queries_over_the_source_pass_and_run(spark, sql):
    from connectors.kafka.ranges import kafka_schema

    check_transform(spark, sql)
    apply_transform(spark, sql, spark.createDataFrame([], kafka_schema())).collect()


@pytest.mark.parametrize(("kind", "sql", "reason"), HOSTILE,
                         ids=[f"{k}-{i}" for i, (k, _, _) in enumerate(HOSTILE)])
def test_a_hostile_transform_is_refused_naming_what_it_used(spark, kind, sql, reason):
    with pytest.raises(TransformError, match=re.escape(reason)):
        check_transform(spark, sql)


def test_every_kind_of_attack_is_kept_at_least_three_times():
    kinds: dict[str, int] = {}
    for kind, _, _ in HOSTILE:
        kinds[kind] = kinds.get(kind, 0) + 1
    assert len(HOSTILE) >= 40
    assert all(n >= 3 for n in kinds.values()), kinds


def test_a_refused_transform_never_ran_anything(spark, tmp_path):
    """The check refuses an INSERT before any of it runs: the victim table is not touched."""
    victim = tmp_path / "victim"
    spark.range(3).write.parquet(str(victim))
    before = sorted(p.name for p in victim.iterdir())
    with pytest.raises(TransformError):
        check_transform(spark, f"WITH t AS (SELECT * FROM {{source}}) INSERT OVERWRITE parquet.`{victim}` "
                               "SELECT offset FROM t")
    assert sorted(p.name for p in victim.iterdir()) == before


def test_format_fields_in_a_transform_are_text_not_python(spark):
    """Braces other than {source} reach Spark as written: no str.format evaluates them."""
    from connectors.kafka.ranges import kafka_schema

    sql = ("SELECT '{source.__class__}' AS a, '{spark}' AS b, '{0}' AS c, '{source:>99999999}' AS d "
           "FROM {source}")
    df = spark.createDataFrame([(None, b"v", "t", 0, 7, None, 0)], kafka_schema())
    check_transform(spark, sql)
    rows = apply_transform(spark, sql, df).collect()
    assert len(rows) == 1
    assert (rows[0].a, rows[0].b, rows[0].c, rows[0].d) == (
        "{source.__class__}", "{spark}", "{0}", "{source:>99999999}")


def test_spark_does_not_substitute_variables_in_the_daemons_sessions(spark):
    assert spark.conf.get("spark.sql.variable.substitute") == "false"


def test_a_transform_over_the_length_limit_is_refused_before_it_is_parsed(spark):
    sql = "SELECT offset FROM {source} -- " + "x" * MAX_TRANSFORM_CHARS
    with pytest.raises(TransformError, match="over the limit"):
        check_transform(spark, sql)


def test_the_check_has_a_deadline(spark, monkeypatch):
    import time

    def slow(*_args):
        time.sleep(2)

    monkeypatch.setattr(transform_module, "_check_plan", slow)
    started = time.monotonic()
    with pytest.raises(TransformError, match="longer than 0.2 s"):
        check_transform(spark, "SELECT offset AS never_checked_before FROM {source}", deadline_s=0.2)
    assert time.monotonic() - started < 1.5


def test_every_allowed_name_is_a_builtin_function_of_this_spark(spark):
    """A typo or a function a Spark release removed would otherwise be allowed for nothing."""
    builtins = {row.function for row in spark.sql("SHOW SYSTEM FUNCTIONS").collect()}
    missing = sorted((FUNCTIONS | GENERATORS) - builtins)
    assert missing == []
