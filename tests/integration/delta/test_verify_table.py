"""``verify`` of a table job (a delta source): its table against the source at the version it caught up to."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest
from deltalake import CommitProperties, write_deltalake

from connectors.delta.log import KEY_JOB, KEY_STATE
from source_backfill.errors import VerifyRefusedError
from source_backfill.verify import verify_table_job


def _job_table(path, rows, *, phase="consume_upstream", cursor=1):
    state = {"table_backfill": {"strategy": "snapshot", "phase": phase, "pinned": 0, "cursor": cursor,
                                "vnode_count": 256, "vnodes": {}}}
    meta = {KEY_JOB: "copy", KEY_STATE: json.dumps(state)}
    write_deltalake(str(path), pa.table(rows), mode="overwrite",
                    commit_properties=CommitProperties(custom_metadata=meta))


def test_a_table_job_is_compared_row_for_row_at_the_version_it_caught_up_to(tmp_path):
    src, t = tmp_path / "src", tmp_path / "t"
    write_deltalake(str(src), pa.table({"id": [1, 2, 3], "v": ["a", "b", "c"]}))  # version 0
    write_deltalake(str(src), pa.table({"id": [1, 2, 3, 4], "v": ["a", "B", "c", "d"]}), mode="overwrite")
    write_deltalake(str(src), pa.table({"id": [9], "v": ["later"]}), mode="append")  # not caught up to yet
    _job_table(t, {"id": [4, 3, 2, 1], "v": ["d", "c", "B", "a"]}, cursor=1)
    result = verify_table_job(str(t), "copy", str(src), ["id"])
    assert result.ok and result.summary() == "copy: exactly once, 4 records, 0 missing, 0 duplicated"

    _job_table(t, {"id": [4, 3, 3, 1, 7], "v": ["d", "c", "c", "x", "?"]}, cursor=1)
    result = verify_table_job(str(t), "copy", str(src), ["id"])
    assert not result.ok
    assert result.summary().splitlines()[0] == ("copy: NOT exactly once, 4 records, 1 missing, 1 duplicated, "
                                                "1 not in the source, 1 different")
    assert result.to_json()["examples"] == {"missing": [2], "duplicated": [3], "unexpected": [7],
                                            "different": [1]}

    _job_table(t, {"id": [1], "v": ["a"]}, phase="consuming_snapshot", cursor=None)
    with pytest.raises(VerifyRefusedError, match="still copying"):
        verify_table_job(str(t), "copy", str(src), ["id"])
