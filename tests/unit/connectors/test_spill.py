"""The spilled index answers every chunk read as the in-memory one does, a vnode at a time on disk."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from connectors.delta.spill import SpilledIndex
from connectors.delta.table_source import VersionIndex
from source_backfill.errors import DeltaSinkError
from tests.budget import examples

VNODES = 8


def table_of(keys: list[tuple[int, str]], composite: bool) -> tuple[pa.Table, list[str]]:
    ids = [k for k, _ in keys]
    names = [n for _, n in keys]
    rows = pa.table({"id": pa.array(ids, pa.int64()), "name": pa.array(names, pa.string()),
                     "payload": pa.array([f"row-{i}" for i in range(len(keys))], pa.string())})
    return rows, (["name", "id"] if composite else ["id"])


def spilled(rows: pa.Table, pk: list[str], folder: Path, batch: int, buffer_rows: int,
            group_rows: int) -> SpilledIndex:
    """``buffer_rows``: the buffer in rows of this table (its bytes over its rows)."""
    per_row = max(1, rows.nbytes // max(1, rows.num_rows))
    return SpilledIndex(rows.to_batches(max_chunksize=batch), rows.schema, pk, VNODES, folder,
                        buffer_bytes=buffer_rows * per_row, group_rows=group_rows)


keys = st.lists(st.tuples(st.integers(-10**6, 10**6), st.sampled_from(["a", "b", "é", ""])),
                max_size=300, unique=True)


@settings(max_examples=examples(60), deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(keys, st.booleans(), st.integers(1, 50), st.integers(1, 80), st.integers(1, 30),
       st.lists(st.integers(1, 40), min_size=1, max_size=12))
def test_every_chunk_read_equals_the_in_memory_index(
    tmp_path: Path, pairs: list[tuple[int, str]], composite: bool, batch: int, buffer_rows: int,
    group_rows: int, sizes: list[int],
) -> None:
    if not composite:  # one integer key: the ids alone must be unique
        pairs = list({k: (k, n) for k, n in pairs}.values())
    rows, pk = table_of(pairs, composite)
    memory = VersionIndex(rows, pk, VNODES)
    disk = spilled(rows, pk, tmp_path / f"spill-{len(pairs)}-{batch}-{group_rows}", batch, buffer_rows,
                   group_rows)
    try:
        assert disk.num_rows == memory.num_rows == rows.num_rows
        for vn in range(VNODES):
            after_m = after_d = None
            for size in sizes * 3:
                got_m, keys_m = memory.read_chunk(vn, after_m, size)
                got_d, keys_d = disk.read_chunk(vn, after_d, size)
                assert got_d.to_pylist() == got_m.to_pylist()
                assert list(keys_d) == list(keys_m)
                if keys_m:
                    after_m, after_d = keys_m[-1], keys_d[-1]
    finally:
        disk.close()
    assert not disk.folder.exists()


def test_a_repeated_key_in_different_batches_and_a_null_key_are_refused(tmp_path: Path) -> None:
    rows = pa.table({"id": pa.array([1, 2, 3, 2], pa.int64()), "v": pa.array(["a", "b", "c", "d"])})
    with pytest.raises(DeltaSinkError, match=r"same primary key \(id\)"):
        spilled(rows, ["id"], tmp_path / "dup", batch=2, buffer_rows=2, group_rows=2)
    assert not (tmp_path / "dup").exists()  # a failed spill leaves nothing behind
    nulls = pa.table({"id": pa.array([1, None], pa.int64())})
    with pytest.raises(DeltaSinkError, match="null primary key"):
        spilled(nulls, ["id"], tmp_path / "null", batch=1, buffer_rows=1, group_rows=1)
    with pytest.raises(DeltaSinkError, match="integer or string"):
        spilled(pa.table({"f": pa.array([1.5])}), ["f"], tmp_path / "float", 1, 1, 1)


def test_memory_holds_at_most_a_buffer_and_one_vnode(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """200,000 rows (~23 MB) spilled with a buffer of 10,000 rows' bytes into 16 vnodes: Arrow's
    allocations, sampled while the batches stream in and after each vnode's sort, stay far below the
    table's size."""
    n, per_batch = 200_000, 5_000
    pool = pa.default_memory_pool()
    samples: list[int] = []

    def batches():  # made as a reader makes them: one at a time, none kept
        for start in range(0, n, per_batch):
            samples.append(pool.bytes_allocated())
            yield pa.record_batch({"id": pa.array(range(start, start + per_batch), pa.int64()),
                                   "v": pa.array([b"x" * 100] * per_batch, pa.binary())})

    sort = SpilledIndex._sort  # noqa: SLF001

    def sampled_sort(self: SpilledIndex, vn: int, fragments: list[Path]) -> None:
        sort(self, vn, fragments)
        samples.append(pool.bytes_allocated())

    monkeypatch.setattr(SpilledIndex, "_sort", sampled_sort)
    schema = pa.schema([("id", pa.int64()), ("v", pa.binary())])
    base = pool.bytes_allocated()
    index = SpilledIndex(batches(), schema, ["id"], 16, tmp_path / "big", buffer_bytes=10_000 * 112)
    try:
        chunk, keys = index.read_chunk(3, None, 100)
        assert chunk.num_rows == 100 and keys == sorted(keys)
        assert index.num_rows == n
    finally:
        index.close()
    table_bytes = n * (8 + 100 + 4)
    assert max(samples) - base < table_bytes / 4, (max(samples) - base, table_bytes)
