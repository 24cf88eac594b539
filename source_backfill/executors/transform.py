"""A job's SQL transform: checked on Spark's parsed plan before anything runs, then applied.

A transform is a query over ``{source}`` (the Kafka rows). Spark analyses a query eagerly, and analysis
already reads files (``parquet.`/path``` infers a schema from the files), so the check runs on the
*parsed* plan, before analysis: every relation read must be ``{source}`` or a name the query itself
defines with ``WITH``; no table-valued function (``read_files``, ``range``, ...); no function that calls
into the JVM (``java_method``, ``reflect``). Subqueries and CTE bodies are checked the same way.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from source_backfill.errors import TransformError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

#: The name ``{source}`` is parsed as (the real view name is chosen by pyspark when the query runs).
PLACEHOLDER = "__source_backfill_source__"
#: Functions a transform may not call: they reach the JVM or the file system.
DENIED_FUNCTIONS = frozenset({"java_method", "reflect", "try_reflect", "read_files", "input_file_name"})


def check_transform(spark: SparkSession, sql: str) -> None:
    """Raise :class:`TransformError` unless ``sql`` only reads ``{source}`` and calls no denied function."""
    parser = spark._jsparkSession.sessionState().sqlParser()  # noqa: SLF001 - the parser has no Python API
    try:
        root = parser.parsePlan(sql.replace("{source}", PLACEHOLDER))
    except Exception as exc:  # noqa: BLE001 - py4j wraps Spark's ParseException
        first = str(exc).strip().splitlines()
        msg = f"transform does not parse: {first[1] if len(first) > 1 else first[0] if first else exc}"
        raise TransformError(msg) from None
    allowed = {PLACEHOLDER}
    plans = [root]
    while plans:
        node = plans.pop()
        kind = node.getClass().getSimpleName()
        if kind == "UnresolvedWith":
            for pair in _items(node.cteRelations()):
                allowed.add(str(pair._1()).lower())
        if kind == "UnresolvedRelation":
            name = ".".join(_items(node.multipartIdentifier()))
            if name.lower() not in allowed:
                msg = f"transform reads {name!r}: it may read only {{source}} (and its own WITH names)"
                raise TransformError(msg)
        elif "TableValuedFunction" in kind or kind == "UnresolvedTVFAliases":
            msg = "transform calls a table-valued function: a transform may read only {source}"
            raise TransformError(msg)
        plans.extend(_items(node.children()))
        plans.extend(_items(node.innerChildren()))
        for expression in _items(node.expressions()):
            plans.extend(_check_expression(expression))


def _check_expression(root: Any) -> list[Any]:
    """Refuse denied functions in an expression tree; return the plans of its subqueries."""
    subqueries = []
    stack = [root]
    while stack:
        expression = stack.pop()
        kind = expression.getClass().getSimpleName()
        if kind == "UnresolvedFunction":
            name = str(list(_items(expression.nameParts()))[-1]).lower()
            if name in DENIED_FUNCTIONS:
                msg = f"transform calls {name}(): it reaches the JVM or the file system"
                raise TransformError(msg)
        if kind in ("ScalarSubquery", "ListQuery", "Exists", "LateralSubquery"):  # a plan inside
            subqueries.append(expression.plan())
        stack.extend(_items(expression.children()))
    return subqueries


def _items(seq: Any) -> list[Any]:
    """A Scala collection's elements."""
    out = []
    it = seq.iterator()
    while it.hasNext():
        out.append(it.next())
    return out


def apply_transform(spark: SparkSession, sql: str | None, df: DataFrame) -> DataFrame:
    """``sql`` over ``df`` as ``{source}`` (identity when None).

    Run in ``df``'s own session: the live batch of ``foreachBatch`` has a session of its own, and the view
    pyspark registers for ``{source}`` exists only there (in ``spark``'s the query failed with
    TABLE_OR_VIEW_NOT_FOUND). ``spark`` is used only when ``df`` has no session.
    """
    if sql is None:
        return df
    return (getattr(df, "sparkSession", None) or spark).sql(sql, source=df)
