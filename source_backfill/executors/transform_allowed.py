"""What a job's SQL transform may be built from: the allow-lists the transform check decides by.

A transform is untrusted code that runs in the daemon's shared Spark. It is accepted only if every plan
node, every expression and every function name of Spark's *parsed* plan is named here; anything not
named is refused, so a construct a new Spark release adds is refused until someone adds it here on
purpose. Each list holds only what computes over the rows it is given: no node or function that reads a
file, a catalog table, the session's configuration or environment, runs a command, or reaches the JVM.
docs/architecture.md ("Transforms") explains the list and why it is safe.
"""

from __future__ import annotations

#: Plan nodes of a query over ``{source}`` (besides the three the check walks itself: a relation, which
#: must be ``{source}`` or a ``WITH`` name in scope, ``WITH`` (not ``RECURSIVE``) and ``WINDOW``).
#: ``LocalRelation`` is a ``VALUES`` list: constants only.
PLAN_NODES = frozenset({
    "Project", "Filter", "Aggregate", "UnresolvedHaving", "Sort", "GlobalLimit", "LocalLimit", "Offset",
    "Distinct", "Union", "Intersect", "Except", "Join", "SubqueryAlias", "Generate", "OneRowRelation",
    "LocalRelation", "UnresolvedSubqueryColumnAliases",
})

#: Expressions as the parser leaves them: columns, literals, operators, casts, CASE, window specs, lambda
#: variables. Functions are ``UnresolvedFunction`` / ``UnresolvedGenerator`` and checked by name below;
#: subqueries are checked as plans in the scope of the query around them.
EXPRESSIONS = frozenset({
    "UnresolvedAttribute", "UnresolvedStar", "UnresolvedAlias", "Alias", "MultiAlias", "Literal", "Cast",
    "UnresolvedExtractValue", "AttributeReference",
    "Add", "Subtract", "Multiply", "Divide", "IntegralDivide", "Remainder", "UnaryMinus", "UnaryPositive",
    "EqualTo", "EqualNullSafe", "LessThan", "LessThanOrEqual", "GreaterThan", "GreaterThanOrEqual",
    "Not", "And", "Or", "In", "IsNull", "IsNotNull", "Like", "ILike", "RLike",
    "LikeAll", "NotLikeAll", "LikeAny", "NotLikeAny", "CaseWhen", "Concat",
    "BitwiseAnd", "BitwiseOr", "BitwiseXor", "BitwiseNot",
    "SortOrder", "UnresolvedWindowExpression", "WindowExpression", "WindowSpecDefinition",
    "SpecifiedWindowFrame", "UnspecifiedFrame$", "UnboundedPreceding$", "UnboundedFollowing$",
    "CurrentRow$", "LambdaFunction", "UnresolvedNamedLambdaVariable", "GroupingSets", "Cube", "Rollup",
    "UnresolvedOrdinal", "CreateNamedStruct",
})

#: Expressions holding a query (``(SELECT ...)``, ``EXISTS``, ``IN (SELECT ...)``): checked as plans.
SUBQUERIES = frozenset({"ScalarSubquery", "Exists", "ListQuery"})
#: ``x IN (SELECT ...)``: its children are the values and a ``ListQuery``.
IN_SUBQUERY = "InSubquery"

#: Generators (``LATERAL VIEW explode(...)`` and ``SELECT explode(...)``).
GENERATORS = frozenset({
    "explode", "explode_outer", "posexplode", "posexplode_outer", "inline", "inline_outer", "stack",
    "json_tuple",
})

#: Built-in functions that compute over their arguments only: strings, numbers, dates, collections,
#: JSON, aggregates, windows, generators. Called by one unqualified name (``upper(x)``, never
#: ``system.builtin.upper``, a temporary function, or a name computed by ``IDENTIFIER(...)``).
#: ``rand``/``randn``/``random``/``uuid``/``shuffle``/``current_timestamp`` are allowed though not
#: deterministic: they read no state of the daemon.
FUNCTIONS = frozenset({
    # strings and bytes
    "ascii", "base64", "bit_length", "btrim", "char", "char_length", "character_length", "chr", "concat",
    "concat_ws", "contains", "decode", "elt", "encode", "endswith", "find_in_set", "format_number",
    "format_string", "initcap", "instr", "lcase", "left", "len", "length", "levenshtein", "locate",
    "lower", "lpad", "ltrim", "luhn_check", "mask", "octet_length", "overlay", "position", "printf",
    "regexp", "regexp_count", "regexp_extract", "regexp_extract_all", "regexp_instr", "regexp_like",
    "regexp_replace", "regexp_substr", "repeat", "replace", "right", "rlike", "rpad", "rtrim",
    "soundex", "space", "split", "split_part", "startswith", "substr", "substring", "substring_index",
    "to_binary", "to_char", "to_number", "to_varchar", "translate", "trim", "try_to_binary",
    "try_to_number", "ucase", "unbase64", "upper", "url_decode", "url_encode", "parse_url", "hex", "unhex",
    "md5", "sha", "sha1", "sha2", "crc32", "hash", "xxhash64", "like", "ilike",
    # casts by name
    "string", "binary", "boolean", "tinyint", "smallint", "int", "bigint", "float", "double", "decimal",
    "date", "timestamp",
    # numbers
    "abs", "acos", "acosh", "asin", "asinh", "atan", "atan2", "atanh", "bin", "bround", "cbrt", "ceil",
    "ceiling", "conv", "cos", "cosh", "cot", "csc", "sec", "degrees", "e", "exp", "expm1", "factorial",
    "floor", "greatest", "hypot", "least", "ln", "log", "log10", "log1p", "log2", "mod", "negative", "pi",
    "pmod", "positive", "pow", "power", "radians", "rand", "randn", "random", "rint", "round", "sign",
    "signum", "sin", "sinh", "sqrt", "tan", "tanh", "try_add", "try_divide", "try_multiply",
    "try_subtract", "try_mod", "width_bucket", "div", "shiftleft", "shiftright", "shiftrightunsigned",
    "bit_count", "bit_get", "getbit", "isnan", "nanvl",
    # nulls and conditions
    "coalesce", "if", "ifnull", "isnull", "isnotnull", "nullif", "nvl", "nvl2", "equal_null",
    "zeroifnull", "nullifzero", "assert_true", "raise_error", "between", "in",
    # dates and times
    "add_months", "convert_timezone", "curdate", "current_date", "current_timestamp", "current_timezone",
    "date_add", "date_diff", "date_format", "date_from_unix_date", "date_part", "date_sub", "date_trunc",
    "dateadd", "datediff", "datepart", "day", "dayname", "dayofmonth", "dayofweek", "dayofyear",
    "extract", "from_unixtime", "from_utc_timestamp", "hour", "last_day", "localtimestamp", "make_date",
    "make_dt_interval", "make_interval", "make_timestamp", "make_ym_interval", "minute", "month",
    "monthname", "months_between", "next_day", "now", "quarter", "second", "timestamp_micros",
    "timestamp_millis", "timestamp_seconds", "to_date", "to_timestamp", "to_timestamp_ltz",
    "to_timestamp_ntz", "to_unix_timestamp", "to_utc_timestamp", "trunc", "try_to_timestamp",
    "unix_date", "unix_micros", "unix_millis", "unix_seconds", "unix_timestamp", "weekday",
    "weekofyear", "year",
    # arrays, maps, structs (and their lambdas)
    "aggregate", "array", "array_append", "array_compact", "array_contains", "array_distinct",
    "array_except", "array_insert", "array_intersect", "array_join", "array_max", "array_min",
    "array_position", "array_prepend", "array_remove", "array_repeat", "array_size", "array_sort",
    "array_union", "arrays_overlap", "arrays_zip", "cardinality", "element_at", "exists", "filter",
    "flatten", "forall", "get", "map", "map_concat", "map_contains_key", "map_entries", "map_filter",
    "map_from_arrays", "map_from_entries", "map_keys", "map_values", "map_zip_with", "named_struct",
    "reduce", "reverse", "sequence", "shuffle", "size", "slice", "sort_array", "str_to_map", "struct",
    "transform", "transform_keys", "transform_values", "try_element_at", "zip_with",
    # JSON (no option of these reads a file)
    "from_json", "get_json_object", "json_array_length", "json_object_keys", "json_tuple",
    "schema_of_json", "to_json",
    # aggregates
    "any", "any_value", "approx_count_distinct", "approx_percentile", "array_agg", "avg", "bit_and",
    "bit_or", "bit_xor", "bool_and", "bool_or", "collect_list", "collect_set", "corr", "count",
    "count_if", "covar_pop", "covar_samp", "every", "first", "first_value", "kurtosis", "last",
    "last_value", "max", "max_by", "mean", "median", "min", "min_by", "mode", "percentile",
    "percentile_approx", "skewness", "some", "std", "stddev", "stddev_pop", "stddev_samp", "sum",
    "var_pop", "var_samp", "variance",
    # windows
    "cume_dist", "dense_rank", "lag", "lead", "nth_value", "ntile", "percent_rank", "rank", "row_number",
    # rows and types
    "typeof", "uuid", "monotonically_increasing_id", "spark_partition_id",
}) | GENERATORS
