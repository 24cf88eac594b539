"""Virtual nodes: a stable bucket of a primary key (crc32, never Python's salted ``hash``)."""

from __future__ import annotations

import json
import zlib
from collections.abc import Sequence
from typing import Any

VNODE_COUNT = 256


def vnode(pk: bytes, count: int = VNODE_COUNT) -> int:
    """The vnode of ``pk``: ``crc32(pk) % count``."""
    return zlib.crc32(pk) % count


def key_vnode(key: Sequence[Any], count: int = VNODE_COUNT) -> int:
    """The vnode of a primary key given as its column values (the table-backfill modules' bucket).

    The key is encoded as compact JSON (``str`` for what JSON lacks: dates, decimals), so one key has one
    vnode wherever it is computed: in a snapshot chunk and in a live change.
    """
    return vnode(json.dumps(list(key), separators=(",", ":"), default=str).encode(), count)


def key_vnodes(columns: Sequence[Sequence[Any]], count: int = VNODE_COUNT) -> Sequence[int]:
    """:func:`key_vnode` of every key given column-wise (``columns[c][row]``), the same values, faster.

    A key of one column given as a numpy integer array is hashed in numpy, every row at once
    (:func:`int_key_vnodes`, a numpy array back); other keys go through the JSON encoder row by row.
    """
    dtype = getattr(columns[0], "dtype", None) if len(columns) == 1 else None
    if dtype is not None and dtype.kind in "iu":
        hashed: Sequence[int] = int_key_vnodes(columns[0], count)
        return hashed
    return [key_vnode(key, count) for key in zip(*columns, strict=True)]


def _crc32_table() -> Any:
    import numpy as np

    table = np.arange(256, dtype=np.uint32)
    for _ in range(8):
        table = np.where(table & 1, (table >> 1) ^ np.uint32(0xEDB88320), table >> 1).astype(np.uint32)
    return table


def int_key_vnodes(values: Any, count: int = VNODE_COUNT) -> Any:
    """The vnodes of one-integer keys (a numpy integer array), as ``crc32(b"[%d]" % v) % count``.

    zlib's CRC-32 over every row at once, one byte position at a time: pyarrow writes the decimal texts,
    and a row's CRC stops advancing past its own text.
    """
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    if len(values) == 0:
        return np.zeros(0, dtype=np.int64)
    texts = pc.cast(pa.array(values), pa.string())
    offsets = np.frombuffer(texts.buffers()[1], dtype=np.int32)[: len(texts) + 1]
    data = np.frombuffer(texts.buffers()[2], dtype=np.uint8)
    starts, lengths = offsets[:-1], np.diff(offsets)
    table = _crc32_table()
    last = len(data) - 1

    def step(crc: Any, byte: Any) -> Any:
        return table[(crc ^ byte) & 0xFF] ^ (crc >> np.uint32(8))

    crc = step(np.full(len(texts), 0xFFFFFFFF, dtype=np.uint32), np.uint32(ord("[")))
    for i in range(int(lengths.max(initial=0))):
        byte = data[np.minimum(starts + i, last)].astype(np.uint32)
        crc = np.where(i < lengths, step(crc, byte), crc)
    crc = step(crc, np.uint32(ord("]"))) ^ np.uint32(0xFFFFFFFF)
    return (crc % np.uint32(count)).astype(np.int64)
