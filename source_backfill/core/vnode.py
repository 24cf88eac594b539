"""Virtual nodes: a stable bucket of a primary key (crc32, never Python's salted ``hash``)."""

from __future__ import annotations

import zlib

VNODE_COUNT = 256


def vnode(pk: bytes, count: int = VNODE_COUNT) -> int:
    """The vnode of ``pk``: ``crc32(pk) % count``."""
    return zlib.crc32(pk) % count
