"""Folding a new-key epoch (chunk rows, then the changes after them) into rows to append.

An arrangement epoch whose every change is of a key the job's table does not hold yet is appended, not
merged: the rows it appends must be what replaying its changes one by one leaves.
"""

from __future__ import annotations

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from source_backfill.executors.table_backfill import _folded
from tests.budget import examples

Log = list[tuple[tuple[int, str], str, int]]

KEYS = st.tuples(st.integers(0, 6), st.sampled_from(["a", "b"]))


@st.composite
def changelogs(draw: st.DrawFn) -> Log:
    """A valid change sequence: inserts of absent keys, updates (pre and post image), deletes."""
    present: dict[tuple[int, str], int] = {}
    out: Log = []
    for value in range(draw(st.integers(0, 40))):
        key = draw(KEYS)
        if key not in present:
            out.append((key, "insert", value))
            present[key] = value
        elif draw(st.booleans()):
            out.append((key, "update_preimage", present[key]))
            out.append((key, "update_postimage", value))
            present[key] = value
        else:
            out.append((key, "delete", present.pop(key)))
    return out


def _replayed(log: Log) -> dict[tuple[int, str], int]:
    rows: dict[tuple[int, str], int] = {}
    for key, kind, value in log:
        if kind in ("insert", "update_postimage"):
            rows[key] = value
        elif kind == "delete":
            del rows[key]
    return rows


@settings(max_examples=examples(300), deadline=None)
@given(changelogs())
def test_folded_rows_are_what_replaying_the_changes_leaves(log: Log) -> None:
    table = pa.table({
        "k1": pa.array([k[0] for k, _, _ in log], pa.int64()),
        "k2": pa.array([k[1] for k, _, _ in log], pa.string()),
        "v": pa.array([v for _, _, v in log], pa.int64()),
        "_change_type": pa.array([c for _, c, _ in log], pa.string()),
    })
    out = _folded(table, ["k1", "k2"]).to_pylist()
    assert {r["_change_type"] for r in out} <= {"insert"}
    folded = {(r["k1"], r["k2"]): r["v"] for r in out}
    assert len(folded) == len(out), "a key appended twice"
    assert folded == _replayed(log)
