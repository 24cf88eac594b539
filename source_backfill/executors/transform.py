"""A job's SQL transform: judged on Spark's parsed plan by allow-list before anything runs, then applied.

A transform is one query over ``{source}`` (the Kafka rows), and it is untrusted code in the daemon's
shared Spark. Spark analyses a query eagerly, and analysis already reads files (``parquet.`/path```
infers a schema from them) and runs commands (``INSERT``, ``CREATE``), so the check runs on the *parsed*
plan, before analysis, and accepts a transform only if every plan node, expression and function name of
it is one :mod:`~source_backfill.executors.transform_allowed` names (anything else is refused, naming
the construct). Every relation must be ``{source}`` or a ``WITH`` name in scope where it is read.

``{source}`` is replaced by the project with a temporary view of a name it chooses; the user's text is
never given to ``str.format`` (pyspark's ``spark.sql(sql, source=df)`` formats it) nor to Spark's
``${...}`` variable substitution (off in the daemon's sessions, and a transform containing ``${`` is
refused). The check is bounded: a length limit, a limit on the plan's size and a deadline, and it runs on
the thread of whoever registers the job (the API's, or the daemon's at start), never in an epoch: the
epoch finds the verdict in :func:`check_transform`'s cache.
"""

from __future__ import annotations

import threading
import uuid
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import TYPE_CHECKING, Any

from source_backfill.config import MAX_TRANSFORM_CHARS
from source_backfill.errors import TransformError, one_line
from source_backfill.executors.transform_allowed import (
    EXPRESSIONS,
    FUNCTIONS,
    GENERATORS,
    IN_SUBQUERY,
    PLAN_NODES,
    SUBQUERIES,
)

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

#: What the user writes for the Kafka rows.
SOURCE = "{source}"
#: Views that ``{source}`` names are called this and a fresh hex id, while checking and when applied: a
#: transform cannot name the view of another job or of another check.
VIEW_PREFIX = "__source_backfill_"
#: A parsed plan with more nodes and expressions than this is refused (a real transform has a few dozen).
MAX_PLAN_NODES = 5_000
#: Parentheses nested deeper than this are refused before parsing (Spark's parser overflowed its thread's
#: stack at 4,000; a real transform nests a handful).
MAX_NESTING = 256
#: The check gives up (refusing the transform) after this many seconds.
CHECK_DEADLINE_S = 10.0
#: Spark's variable substitution syntax (``${env:HOME}`` reads an environment variable).
_SUBSTITUTION = "${"

_checked: OrderedDict[str, None] = OrderedDict()
_checked_lock = threading.Lock()
_CACHE_SIZE = 1_024
_pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="transform-check")


def check_transform(spark: SparkSession, sql: str, *, deadline_s: float = CHECK_DEADLINE_S) -> None:
    """Raise :class:`TransformError` unless ``sql`` is one query built only from allowed constructs.

    A text checked once is remembered (the epoch that builds the job's schema finds it here).
    """
    with _checked_lock:
        if sql in _checked:
            _checked.move_to_end(sql)
            return
    _check_text(sql)
    future = _pool.submit(_check_plan, spark, sql)
    try:
        future.result(timeout=deadline_s)
    except FutureTimeout:
        msg = f"transform check took longer than {deadline_s:g} s: simplify the transform"
        raise TransformError(msg) from None
    with _checked_lock:
        _checked[sql] = None
        while len(_checked) > _CACHE_SIZE:
            _checked.popitem(last=False)


def _check_text(sql: str) -> None:
    if len(sql) > MAX_TRANSFORM_CHARS:
        msg = f"transform is {len(sql)} characters long, over the limit of {MAX_TRANSFORM_CHARS}"
        raise TransformError(msg)
    if SOURCE not in sql:
        msg = "transform must read the Kafka rows as {source}, e.g. SELECT key, value FROM {source}"
        raise TransformError(msg)
    depth = deepest = 0
    for char in sql:  # counted in literals too: a bound, not a parse
        if char == "(":
            depth += 1
            deepest = max(deepest, depth)
        elif char == ")":
            depth -= 1
    if deepest > MAX_NESTING:
        msg = f"transform nests parentheses {deepest} deep, over the limit of {MAX_NESTING}"
        raise TransformError(msg)
    if _SUBSTITUTION in sql:
        msg = "transform contains '${': Spark's variable substitution is not allowed in a transform"
        raise TransformError(msg)


def _check_plan(spark: SparkSession, sql: str) -> None:
    parser = spark._jsparkSession.sessionState().sqlParser()  # noqa: SLF001 - the parser has no Python API
    view = _fresh_view()
    try:
        root = parser.parsePlan(_named(sql, view))
    except Exception as exc:  # noqa: BLE001 - py4j wraps Spark's ParseException
        lines = [line for line in str(exc).strip().splitlines() if line.strip()]
        detail = next((line for line in lines if "PARSE" in line or "Syntax" in line), one_line(exc))
        msg = f"transform does not parse: {detail[:300]}"
        raise TransformError(msg) from None
    _Walk().plan(root, frozenset({view}))


class _Walk:
    """One pass over a parsed plan, refusing the first construct the allow-lists do not name."""

    def __init__(self) -> None:
        self.seen = 0

    def _count(self) -> None:
        self.seen += 1
        if self.seen > MAX_PLAN_NODES:
            msg = f"transform is too large: its plan has over {MAX_PLAN_NODES} nodes"
            raise TransformError(msg)

    def plan(self, root: Any, scope: frozenset[str]) -> None:
        """Check ``root`` and everything under it; ``scope``: the relation names readable there."""
        stack = [(root, scope)]
        while stack:
            node, names = stack.pop()
            self._count()
            kind = node.getClass().getSimpleName()
            if kind == "UnresolvedRelation":
                _check_relation(node, names)
                continue
            if kind == "UnresolvedWith":
                if node.allowRecursion():
                    msg = "transform uses WITH RECURSIVE, which is not allowed"
                    raise TransformError(msg)
                defined = set(names)
                for pair in _items(node.cteRelations()):  # a name is readable after its definition
                    stack.append((pair._2(), frozenset(defined)))
                    defined.add(str(pair._1()).lower())
                stack.append((node.child(), frozenset(defined)))
                continue
            if kind == "WithWindowDefinition":
                for spec in _items(node.windowDefinitions().values()):
                    stack.extend((p, names) for p in self.expression(spec))
                stack.append((node.child(), names))
                continue
            if kind not in PLAN_NODES:
                raise TransformError(_refusal(kind))
            stack.extend((child, names) for child in _items(node.children()))
            for expression in _items(node.expressions()):
                stack.extend((p, names) for p in self.expression(expression))

    def expression(self, root: Any) -> list[Any]:
        """Check an expression tree; return the plans of the subqueries in it (checked by the caller)."""
        plans = []
        stack = [root]
        while stack:
            expression = stack.pop()
            self._count()
            kind = expression.getClass().getSimpleName()
            if kind == "UnresolvedFunction":
                _check_function(list(_items(expression.nameParts())))
            elif kind == "UnresolvedGenerator":
                name = expression.name()
                if not name.database().isEmpty() or str(name.funcName()).lower() not in GENERATORS:
                    msg = f"transform calls {name.unquotedString()}(), which is not an allowed generator"
                    raise TransformError(msg)
            elif kind in SUBQUERIES:
                plans.append(expression.plan())
            elif kind != IN_SUBQUERY and kind not in EXPRESSIONS:
                raise TransformError(_refusal(kind))
            stack.extend(_items(expression.children()))
        return plans


def _check_relation(node: Any, names: frozenset[str]) -> None:
    parts = [str(p) for p in _items(node.multipartIdentifier())]
    shown = ".".join(parts)
    if len(parts) != 1 or parts[0].lower() not in names:
        msg = f"transform reads {shown!r}: it may read only {{source}} (and its own WITH names in scope)"
        raise TransformError(msg)
    if not node.options().isEmpty() or node.isStreaming():
        msg = f"transform reads {shown!r} with options: a transform reads {{source}} as it is"
        raise TransformError(msg)


def _check_function(parts: list[str]) -> None:
    name = ".".join(parts)
    if len(parts) != 1 or parts[0].lower() not in FUNCTIONS:
        msg = (f"transform calls {name}(), which is not an allowed built-in function "
               "(docs/architecture.md lists them)")
        raise TransformError(msg)


#: What the user wrote that a plan node or expression comes from, for the refusal.
_CONSTRUCTS = {
    "InsertIntoStatement": "INSERT", "ScriptTransformation": "TRANSFORM ... USING (a script)",
    "UnresolvedHint": "a hint (/*+ ... */)", "Sample": "TABLESAMPLE", "RelationTimeTravel": "time travel",
    "PlanWithUnresolvedIdentifier": "IDENTIFIER(...)", "ExpressionWithUnresolvedIdentifier":
    "IDENTIFIER(...)", "UnresolvedTableValuedFunction": "a table-valued function",
    "UnresolvedTVFAliases": "a table-valued function", "LateralSubquery": "a LATERAL subquery",
    "PipeOperator": "the |> pipe syntax", "UnresolvedExecuteImmediate": "EXECUTE IMMEDIATE",
}


def _refusal(kind: str) -> str:
    construct = _CONSTRUCTS.get(kind, kind)
    return (f"transform uses {construct}, which a transform may not: only a query over {{source}} built "
            "from the allowed constructs (docs/architecture.md) is accepted")


def _items(seq: Any) -> list[Any]:
    """A Scala collection's elements."""
    out = []
    it = seq.iterator()
    while it.hasNext():
        out.append(it.next())
    return out


def _fresh_view() -> str:
    return f"{VIEW_PREFIX}{uuid.uuid4().hex}"


def _named(sql: str, view: str) -> str:
    """``sql`` with ``{source}`` replaced by ``view`` (plain replacement: never ``str.format``)."""
    return sql.replace(SOURCE, view)


def apply_transform(spark: SparkSession, sql: str | None, df: DataFrame) -> DataFrame:
    """``sql`` over ``df`` as ``{source}`` (identity when None); ``sql`` must have passed the check.

    Run in ``df``'s own session: the live batch of ``foreachBatch`` has a session of its own, and a view
    registered in ``spark``'s would not be found there. ``spark`` is used only when ``df`` has no session.
    The view has a fresh name per call and is dropped once Spark has analysed the query (the result holds
    its plan, not its name).
    """
    if sql is None:
        return df
    check_transform(spark, sql)
    session = getattr(df, "sparkSession", None) or spark
    view = _fresh_view()
    df.createOrReplaceTempView(view)
    try:
        return session.sql(_named(sql, view))
    finally:
        session.catalog.dropTempView(view)
