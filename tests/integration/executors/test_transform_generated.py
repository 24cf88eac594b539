"""Random transforms built from grammar pieces, safe and hostile: each is refused, or it runs and never
reveals the canaries (a file, an environment variable of the JVM, a Spark conf value)."""

from __future__ import annotations

import os
import uuid

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from source_backfill.errors import TransformError
from source_backfill.executors.transform import apply_transform, check_transform
from tests.fixtures.spark import CANARY_ENV

pytestmark = pytest.mark.integration

SAFE_ITEMS = [
    "offset", "partition", "topic", "upper(CAST(value AS STRING)) AS u", "length(value) AS n",
    "sha2(value, 256) AS h", "'{spark}' AS f", "concat(topic, '-', partition) AS c", "offset * 2 AS d",
    "coalesce(key, value) AS k", "CASE WHEN offset > 0 THEN 'a' ELSE 'b' END AS w",
    "'{source.__class__.__init__.__globals__}' AS g",
]
HOSTILE_ITEMS = [
    "java_method('java.lang.System', 'getenv', '{env}') AS j",
    "reflect('java.lang.System', 'getProperty', 'user.dir') AS r",
    "try_reflect('java.lang.System', 'getenv', '{env}') AS t", "input_file_name() AS i",
    "'${{env:{env}}}' AS e", "'${{spark.sourcebackfill.canary}}' AS s", "current_user() AS cu",
    "(SELECT first(value) FROM text.`{file}`) AS v",
    "IDENTIFIER('java_method')('java.lang.System', 'getenv', '{env}') AS x",
    "system.builtin.reflect('java.lang.System', 'getenv', '{env}') AS y",
]
SAFE_FROM = ["{source}", "{source} s", "(SELECT * FROM {source}) q",
             "{source} a JOIN {source} b USING (offset, partition, topic, key, value, timestamp)"]
HOSTILE_FROM = [
    "text.`{file}`", "{source} WITH ('path' = '{file}')", "read_files('{file}')",
    "{source} CROSS JOIN text.`{file}`", "csv.`{file}`",
]
WHERES = ["", " WHERE offset >= 0", " WHERE partition IN (SELECT partition FROM {source})",
          " WHERE EXISTS (SELECT 1 FROM text.`{file}`)", " WHERE '${{env:{env}}}' <> ''"]
WRAPS = ["{q}", "WITH t AS ({q}) SELECT * FROM t", "SELECT * FROM ({q}) z", "{q} LIMIT 5"]


def transforms():
    items = st.lists(st.sampled_from(SAFE_ITEMS * 3 + HOSTILE_ITEMS), min_size=1, max_size=3, unique=True)
    froms = st.sampled_from(SAFE_FROM * 4 + HOSTILE_FROM)
    wheres = st.sampled_from(WHERES[:3] * 3 + WHERES[3:])
    return st.builds(
        lambda i, f, w, wrap: wrap.format(q="SELECT " + ", ".join(i) + " FROM " + f + w),
        items, froms, wheres, st.sampled_from(WRAPS),
    )


def test_generated_transforms_are_refused_or_reveal_nothing(spark, tmp_path):
    from connectors.kafka.ranges import kafka_schema

    secret_file = f"canary-file-{uuid.uuid4().hex}"
    canary_path = tmp_path / "canary.txt"
    canary_path.write_text(secret_file + "\n")
    secret_conf = f"canary-conf-{uuid.uuid4().hex}"
    spark.conf.set("spark.sourcebackfill.canary", secret_conf)
    secrets = [secret_file, secret_conf, os.environ[CANARY_ENV]]  # a refusal may echo the path it was sent
    rows = [(b"k", b"hello", "t", 0, i, None, 0) for i in range(3)]
    df = spark.createDataFrame(rows, kafka_schema())
    seen = {"accepted": 0, "refused": 0}

    @settings(max_examples=30, deadline=None, database=None, derandomize=True,
              suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
    @given(template=transforms())
    def attempt(template):
        sql = template.replace("{file}", str(canary_path)).replace("{env}", CANARY_ENV)
        try:
            check_transform(spark, sql)
        except TransformError as exc:
            seen["refused"] += 1
            text = str(exc)
        else:
            seen["accepted"] += 1
            try:
                text = repr(apply_transform(spark, sql, df).collect())
            except Exception as exc:  # analysis errors (ambiguous columns, ...) are fine if they say nothing
                text = str(exc)
        for secret in secrets:
            assert secret not in text, (sql, text[:500])

    attempt()
    total = seen["accepted"] + seen["refused"]
    assert seen["accepted"] * 3 >= total, seen  # else the property would hold by refusing everything
    assert seen["refused"] > 0, seen
    print(f"generated transforms: {seen}")  # noqa: T201 - shown with -s
