"""Record contents in ``verify``: the table's copy of each offset against the record the log holds there.

Offsets alone cannot tell a log truncated and written again (an unclean leader election, a lost disk):
new records take the lost offsets, and a table copied from the old log holds each offset once. So where a
table keeps the record's content (Kafka's ``key``, ``value`` and ``timestamp`` columns: the identity
transform, a dead-letter table) ``verify`` compares contents too, in bounded memory and without sorting:
per split the offsets ``[lo, hi)`` are cut into at most :data:`MAX_BLOCKS` blocks, and each side sums the
64-bit digests of its records per block (modulo 2**64, so the order rows and records come in does not
matter). A block whose two sums differ holds at least one offset whose content is not the log's; it is
reported as an offset range (blocks are :data:`MIN_BLOCK` offsets wide for a split of up to 4M offsets).

The digest is this module's own (BLAKE2b of the offset and the length-prefixed fields), sharing nothing
with the daemon's copy or its anchors (``verify`` checks them). Headers are not compared.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from source_backfill.core.splits import split_id

#: The columns a table must keep for its contents to be compared.
CONTENT_COLUMNS = ("key", "value", "timestamp")
#: Blocks per split at most (two arrays of 8 bytes each: 1 MiB a split at most).
MAX_BLOCKS = 65_536
#: The narrowest block, in offsets (the width a reported range has in a split of up to 4M offsets).
MIN_BLOCK = 64


def digest(offset: int, key: bytes | None, value: bytes | None, timestamp_ms: int) -> int:
    """A record's 64-bit content digest at ``offset`` (a null and an empty field differ)."""
    h = hashlib.blake2b(digest_size=8)
    h.update(offset.to_bytes(8, "big", signed=True))
    h.update(timestamp_ms.to_bytes(8, "big", signed=True))
    for part in (key, value):
        if part is None:
            h.update(b"\xff" * 8)
        else:
            h.update(len(part).to_bytes(8, "big"))
            h.update(part)
    return int.from_bytes(h.digest(), "big")


def keeps_content(dt: Any) -> bool:  # noqa: ANN401 - a deltalake.DeltaTable
    """Whether the table keeps Kafka's content columns as Spark's Kafka source gives them (their types)."""
    import pyarrow as pa

    schema = pa.schema(dt.schema().to_arrow())
    if not all(c in schema.names for c in CONTENT_COLUMNS):
        return False
    key, value, stamp = (schema.field(c).type for c in CONTENT_COLUMNS)
    binary = (pa.binary(), pa.large_binary(), pa.binary_view())
    return key in binary and value in binary and pa.types.is_timestamp(stamp)


def block_width(lo: int, hi: int) -> int:
    """The offsets a block of ``[lo, hi)`` spans: :data:`MIN_BLOCK`, doubled until the blocks fit."""
    width = MIN_BLOCK
    while (hi - lo) > width * MAX_BLOCKS:
        width *= 2
    return width


@dataclass
class SplitContent:
    """One split's per-block digest sums, the table's and the log's, over ``[lo, hi)``."""

    lo: int
    hi: int
    width: int = 0
    table: Any = None  # numpy uint64 per block
    log: Any = None
    differs: list[tuple[int, int]] = field(default_factory=list)

    def __post_init__(self) -> None:
        import numpy as np

        self.width = block_width(self.lo, self.hi)
        blocks = max(0, -(-(self.hi - self.lo) // self.width))
        self.table = np.zeros(blocks, dtype=np.uint64)
        self.log = np.zeros(blocks, dtype=np.uint64)

    def add(self, side: str, offsets: Any, digests: Any) -> None:
        """Add the digests of records at ``offsets`` (numpy arrays) to ``side``; others ignored."""
        import numpy as np

        inside = (offsets >= self.lo) & (offsets < self.hi)
        if inside.any():
            np.add.at(getattr(self, side), (offsets[inside] - self.lo) // self.width, digests[inside])

    def compare(self) -> list[tuple[int, int]]:
        """The offset ranges whose contents differ (their blocks' sums do), kept in :attr:`differs`."""
        import numpy as np

        self.differs = [(self.lo + int(b) * self.width, min(self.hi, self.lo + (int(b) + 1) * self.width))
                        for b in np.flatnonzero(self.table != self.log)]
        return self.differs


def scan_digests(dt: Any, batch_rows: int) -> Iterator[tuple[str, Any, Any]]:  # noqa: ANN401
    """``(split, offsets, digests)`` numpy arrays from the table's record batches (content columns read)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    columns = ["topic", "partition", "offset", "key", "value", "timestamp"]
    for batch in dt.to_pyarrow_dataset().to_batches(columns=columns, batch_size=batch_rows):
        if batch.num_rows == 0:
            continue
        rows = pa.Table.from_batches([batch])
        ms = pc.divide(rows["timestamp"].cast("int64"), 1000).to_pylist()  # Kafka's ms, stored x 1000
        per: dict[str, tuple[list[int], list[int]]] = {}
        for t, p, o, k, v, stamp in zip(*(rows[c].to_pylist() for c in columns[:5]), ms, strict=True):
            offs, digs = per.setdefault(split_id(t, p), ([], []))
            offs.append(o)
            digs.append(digest(o, k, v, -1 if stamp is None else stamp))
        for s, (offs, digs) in per.items():
            yield s, np.asarray(offs, dtype=np.int64), np.asarray(digs, dtype=np.uint64)


def log_digests(messages: Sequence[Any]) -> dict[str, tuple[Any, Any]]:
    """Per split the offsets and digests of consumed Kafka messages (confluent-kafka ``Message``)."""
    import numpy as np

    per: dict[str, tuple[list[int], list[int]]] = {}
    for msg in messages:
        offs, digs = per.setdefault(split_id(msg.topic(), msg.partition()), ([], []))
        offs.append(msg.offset())
        digs.append(digest(msg.offset(), msg.key(), msg.value(), msg.timestamp()[1]))
    return {s: (np.asarray(o, dtype=np.int64), np.asarray(d, dtype=np.uint64)) for s, (o, d) in per.items()}
