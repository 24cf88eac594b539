"""A table job's table (a delta source) checked row for row against its source at the version it follows."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from source_backfill.errors import VerifyRefusedError
from source_backfill.verify.common import EXAMPLES, local_path


@dataclass
class TableVerifyResult:
    """A merge-mode table job's table compared row for row with its source at one version."""

    job: str
    source_version: int
    rows: int
    missing: int
    duplicated: int
    unexpected: int
    different: int
    examples: dict[str, list[Any]]

    @property
    def ok(self) -> bool:
        """The table holds the source's rows at ``source_version``, each once, equal."""
        return not (self.missing or self.duplicated or self.unexpected or self.different)

    def summary(self) -> str:
        """``copy: exactly once, N records, 0 missing, 0 duplicated`` (rows of the source version)."""
        head = (f"{self.job}: {'exactly once' if self.ok else 'NOT exactly once'}, {self.rows} records, "
                f"{self.missing} missing, {self.duplicated} duplicated")
        if self.unexpected or self.different:
            head += f", {self.unexpected} not in the source, {self.different} different"
        if self.ok:
            return head
        ex = "; ".join(f"{k} {v}" for k, v in self.examples.items() if v)
        return f"{head}\n  keys: {ex} (source version {self.source_version})"

    def to_json(self) -> dict[str, Any]:
        """The API's view of the result."""
        return {"job": self.job, "ok": self.ok, "summary": self.summary(),
                "source_version": self.source_version, "records": self.rows, "missing": self.missing,
                "duplicated": self.duplicated, "unexpected": self.unexpected, "different": self.different,
                "examples": self.examples}


def table_job_version(table_path: str, job: str) -> int:
    """The source version a merge-mode table job's table holds, once it follows the source live.

    VerifyRefusedError while it is still copying (its table is then a part of the source by design).
    """
    from deltalake import DeltaTable

    from connectors.delta.log import KEY_JOB, KEY_STATE, commits_back

    if not DeltaTable.is_deltatable(table_path):
        msg = f'job "{job}" has no table yet (nothing committed): nothing to check'
        raise VerifyRefusedError(msg)
    dt = DeltaTable(table_path)
    commit = next((c for c in commits_back(local_path(dt), int(dt.version())) if c.get(KEY_JOB) is not None),
                  None)
    if commit is None or commit.get(KEY_JOB) != job:
        msg = f'the table holds no commit of job "{job}"'
        raise VerifyRefusedError(msg)
    state = json.loads(commit[KEY_STATE]).get("table_backfill") or {}
    if state.get("phase") != "consume_upstream" or state.get("cursor") is None:
        msg = (f'job "{job}" is still copying its table (phase {state.get("phase")}): verify it once it '
               "follows the source live")
        raise VerifyRefusedError(msg)
    return int(state["cursor"])


def verify_table_job(table_path: str, job: str, source_path: str, key: list[str]) -> TableVerifyResult:
    """Compare a merge-mode table job's table with its source at the version the job caught up to, by key.

    Arrow joins, not Python rows: every key of the source version once in the table with equal values
    (missing, duplicated, unexpected keys and rows whose other columns differ are counted, a few keys kept).
    """
    import pyarrow as pa
    import pyarrow.compute as pc
    from deltalake import DeltaTable

    version = table_job_version(table_path, job)
    src = DeltaTable(source_path, version=version).to_pyarrow_table()
    got = DeltaTable(table_path).to_pyarrow_table(columns=src.column_names)
    counts = got.group_by(key).aggregate([([], "count_all")])
    dup = counts.filter(pc.greater(counts.column("count_all"), 1))
    missing = src.join(got.select(key), key, join_type="left anti")
    unexpected = got.select(key).join(src.select(key), key, join_type="left anti")
    values = [c for c in src.column_names if c not in key]
    left = src.rename_columns([c if c in key else f"s.{c}" for c in src.column_names])
    pairs = left.join(got, key, join_type="inner")
    same = pa.array([True] * pairs.num_rows)
    for c in values:
        a, b = pairs.column(f"s.{c}"), pairs.column(c)
        eq = pc.fill_null(pc.equal(a, b), False)
        both_null = pc.and_(pc.is_null(a), pc.is_null(b))
        same = pc.and_(same, pc.or_(eq, both_null))
    different = pairs.filter(pc.invert(same))

    def keys(t: pa.Table) -> list[Any]:
        rows = t.select(key).slice(0, EXAMPLES).to_pylist()
        return [tuple(r.values()) if len(key) > 1 else r[key[0]] for r in rows]

    return TableVerifyResult(job, version, src.num_rows, missing.num_rows, dup.num_rows,
                             unexpected.num_rows, different.num_rows,
                             {"missing": keys(missing), "duplicated": keys(dup),
                              "unexpected": keys(unexpected), "different": keys(different)})
