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


def key_vnodes(columns: Sequence[Sequence[Any]], count: int = VNODE_COUNT) -> list[int]:
    """:func:`key_vnode` of every key given column-wise (``columns[c][row]``), the same values, faster.

    A key of one integer column is encoded as ``b"[%d]"`` directly (what the JSON encoding gives), ~15x
    quicker than the JSON encoder over a million rows.
    """
    if len(columns) == 1 and all(type(v) is int for v in columns[0]):
        return [zlib.crc32(b"[%d]" % v) % count for v in columns[0]]
    return [key_vnode(key, count) for key in zip(*columns, strict=True)]
