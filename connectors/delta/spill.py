"""A version of a keyed table spilled to disk by vnode, for chunk reads in bounded memory.

:class:`~connectors.delta.table_source.VersionIndex` sorts a whole version in the driver's memory: fast,
and impossible for a table larger than the driver. :class:`SpilledIndex` answers the same chunk reads
(a vnode's next rows above a key, in key order) with at most one vnode's rows in memory at a time:

1. **spill** — the version's files are read batch by batch (one file at a time, never the whole table),
   each row's vnode computed as the modules compute it (``core.vnode``); every ``buffer_bytes`` (16 MiB)
   of rows become one fragment file with a row group per vnode, written through to disk and dropped
   from the page cache (a cgroup-capped process is charged for the pages it dirties);
2. **sort** — each vnode's row groups are read from the fragments, sorted by key, checked (no null, no
   repeated key), and
   written as one Parquet file of row groups of ``group_rows`` rows; the first key of each row group is
   kept (``rows / group_rows`` keys in all: 5,000 for 20M rows);
3. **read** — a chunk finds its row group by those first keys, the position in it by bisection over
   that group's keys, and reads the row groups it spans.

The folder holds the spill until :meth:`SpilledIndex.close` (or the job's next version) removes it.
"""

from __future__ import annotations

import bisect
import shutil
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from source_backfill.errors import DeltaSinkError

if TYPE_CHECKING:
    import pyarrow as pa

#: Bytes of rows buffered in memory while spilling, before they go to the vnodes' fragment files.
BUFFER_BYTES = 16 * 2**20
#: Rows per row group of a vnode's sorted file (a chunk read touches one or two).
GROUP_ROWS = 4_096

Key = tuple[Any, ...]
#: Where some of a vnode's spilled rows are: a fragment file and its row group.
Piece = tuple[Path, int]


def _settle(path: Path) -> None:
    """Flush ``path`` to disk and drop it from the page cache.

    A memory-capped process (a cgroup counts the page cache it dirties) must not fill its cap with a
    spill's written pages.
    """
    import os

    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        if hasattr(os, "posix_fadvise"):
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def check_key_columns(schema: pa.Schema, primary_key: Sequence[str]) -> None:
    """The key columns exist and are integers or strings (positions travel as JSON, compare as Python)."""
    import pyarrow as pa

    missing = [k for k in primary_key if k not in schema.names]
    if missing or not primary_key:
        msg = f"primary key columns {list(primary_key)} are not all in the table ({schema.names})"
        raise DeltaSinkError(msg)
    for k in primary_key:
        kind = schema.field(k).type
        if not (pa.types.is_integer(kind) or pa.types.is_string(kind)):
            msg = f"primary key column {k} is {kind}: the table-backfill modules need integer or string keys"
            raise DeltaSinkError(msg)


def row_vnodes(rows: pa.Table | pa.RecordBatch, primary_key: Sequence[str], vnode_count: int) -> Any:
    """Each row's vnode (a numpy array), as :func:`source_backfill.core.vnode.key_vnodes` gives it.

    A null key is refused: the modules' positions need a key that orders every row.
    """
    import numpy as np
    import pyarrow as pa

    from source_backfill.core.vnode import key_vnodes

    if any(rows.column(k).null_count for k in primary_key):
        msg = f"the table has rows with a null primary key ({', '.join(primary_key)})"
        raise DeltaSinkError(msg)
    if len(primary_key) == 1 and pa.types.is_integer(rows.schema.field(primary_key[0]).type):
        columns: list[Any] = [rows.column(primary_key[0]).to_numpy()]
    else:
        columns = [rows.column(k).to_pylist() for k in primary_key]
    return np.asarray(key_vnodes(columns, vnode_count), dtype=np.int32)


def sorted_by_key(rows: pa.Table, primary_key: Sequence[str], *, first: Sequence[str] = ()) -> pa.Table:
    """``rows`` in key order (by the ``first`` columns before it); a repeated key is refused."""
    import pyarrow.compute as pc

    columns = [*first, *primary_key]
    ordered = rows.take(pc.sort_indices(rows, sort_keys=[(k, "ascending") for k in columns]))
    n = ordered.num_rows
    if n > 1:  # sorted: a repeated key sits next to itself
        same = None
        for k in columns:
            col = ordered.column(k)
            eq = pc.equal(col.slice(1), col.slice(0, n - 1))
            same = eq if same is None else pc.and_(same, eq)
        if pc.any(same).as_py():
            msg = f"the table has rows with the same primary key ({', '.join(primary_key)})"
            raise DeltaSinkError(msg)
    return ordered


def keys_of(rows: pa.Table, primary_key: Sequence[str]) -> list[Key]:
    """The rows' keys as tuples of Python values."""
    return list(zip(*(rows.column(k).to_pylist() for k in primary_key), strict=True))


class SpilledIndex:
    """One version of a keyed table on disk, by vnode and key: ``read_chunk`` in bounded memory."""

    def __init__(self, batches: Iterable[pa.RecordBatch], schema: pa.Schema, primary_key: Sequence[str],
                 vnode_count: int, folder: Path, *, buffer_bytes: int = BUFFER_BYTES,
                 group_rows: int = GROUP_ROWS) -> None:
        check_key_columns(schema, primary_key)
        self.primary_key = tuple(primary_key)
        self.schema = schema
        self.vnode_count = vnode_count
        self.folder = folder
        self.group_rows = group_rows
        #: Per vnode: the first key of each row group of its sorted file, and its row count.
        self._firsts: list[list[Key]] = [[] for _ in range(vnode_count)]
        self._sizes = [0] * vnode_count
        folder.mkdir(parents=True, exist_ok=True)
        try:
            pieces = self._spill(batches, buffer_bytes)
            for vn in range(vnode_count):
                self._sort(vn, pieces[vn])
            for fragment in {path for vnode in pieces for path, _ in vnode}:
                fragment.unlink()
        except BaseException:
            self.close()
            raise

    @property
    def num_rows(self) -> int:
        """Rows of the version."""
        return sum(self._sizes)

    def _spill(self, batches: Iterable[pa.RecordBatch], buffer_bytes: int) -> list[list[Piece]]:
        """Step 1: the rows into fragment files, about ``buffer_bytes`` in memory at most.

        Each buffer becomes one fragment file holding a row group per vnode; returned per vnode: the
        fragments and row groups that hold its rows.
        """
        import numpy as np
        import pyarrow as pa
        import pyarrow.parquet as pq

        pieces: list[list[Piece]] = [[] for _ in range(self.vnode_count)]
        buffered: list[pa.Table] = []
        held = 0
        written = 0

        def flush() -> None:
            nonlocal buffered, held, written
            if not buffered:
                return
            rows = pa.concat_tables(buffered)
            buffered, held = [], 0
            vnodes = row_vnodes(rows, self.primary_key, self.vnode_count)
            order = np.argsort(vnodes, kind="stable")
            rows, vnodes = rows.take(pa.array(order)), vnodes[order]
            bounds = np.searchsorted(vnodes, np.arange(self.vnode_count + 1), side="left")
            path = self.folder / f"fragment-{written:05d}.parquet"
            written += 1
            group = 0
            with pq.ParquetWriter(path, self.schema) as writer:
                for vn in range(self.vnode_count):
                    lo, hi = int(bounds[vn]), int(bounds[vn + 1])
                    if hi > lo:  # one row group per vnode
                        writer.write_table(rows.slice(lo, hi - lo), row_group_size=hi - lo)
                        pieces[vn].append((path, group))
                        group += 1
            _settle(path)

        for batch in batches:
            if batch.num_rows:
                buffered.append(pa.Table.from_batches([batch]).cast(self.schema))
                held += batch.nbytes
            if held >= buffer_bytes:
                flush()
        flush()
        return pieces

    def _sort(self, vn: int, pieces: list[Piece]) -> None:
        """Step 2: one vnode's rows as one sorted file; its row groups' first keys kept."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        if not pieces:
            return
        rows = sorted_by_key(pa.concat_tables([pq.ParquetFile(path).read_row_group(group)
                                               for path, group in pieces]).cast(self.schema),
                             self.primary_key)
        pq.write_table(rows, self._path(vn), row_group_size=self.group_rows)
        _settle(self._path(vn))
        starts = range(0, rows.num_rows, self.group_rows)
        keys = rows.select(list(self.primary_key))
        self._firsts[vn] = [keys_of(keys.slice(s, 1), self.primary_key)[0] for s in starts]
        self._sizes[vn] = rows.num_rows

    def _path(self, vn: int) -> Path:
        return self.folder / f"v{vn:04d}.parquet"

    def read_chunk(self, vnode: int, after: Key | None, rows: int) -> tuple[pa.Table, list[Key]]:
        """The first ``rows`` rows of ``vnode`` with a key above ``after`` (all: None), and their keys."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        firsts = self._firsts[vnode]
        if not firsts or rows <= 0:
            return self.schema.empty_table(), []
        file = pq.ParquetFile(self._path(vnode))
        group = 0 if after is None else max(0, bisect.bisect_right(firsts, tuple(after)) - 1)
        parts: list[pa.Table] = []
        taken = 0
        while group < len(firsts) and taken < rows:
            part = file.read_row_group(group)
            if after is not None and group == max(0, bisect.bisect_right(firsts, tuple(after)) - 1):
                skip = bisect.bisect_right(keys_of(part.select(list(self.primary_key)), self.primary_key),
                                           tuple(after))
                part = part.slice(skip)
            part = part.slice(0, rows - taken)
            parts.append(part)
            taken += part.num_rows
            group += 1
        if not parts:
            return self.schema.empty_table(), []
        # a copy of the rows taken: a slice would keep each whole decoded row group alive (256 vnodes x a
        # row group of 2 kB rows held 1 GB for 16k rows read)
        chunk = pa.concat_tables(parts).take(pa.array(range(taken), pa.int64()))
        return chunk, keys_of(chunk.select(list(self.primary_key)), self.primary_key)

    def close(self) -> None:
        """Remove the spill."""
        shutil.rmtree(self.folder, ignore_errors=True)
