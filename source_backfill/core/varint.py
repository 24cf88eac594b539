"""Base-128 varints, as Avro and Protobuf write integers (pure).

Seven bits a byte, least significant first, the high bit set on every byte but the last; a signed value
is zigzag-mapped first (0, -1, 1, -2 ... → 0, 1, 2, 3 ...), as Avro's ints and longs, Protobuf's
``sint`` fields and Confluent's Protobuf message indexes are.
"""

from __future__ import annotations


def varint(value: int) -> bytes:
    """The varint bytes of a non-negative ``value``."""
    if value < 0:
        msg = f"a varint holds a non-negative value, not {value} (zigzag it first)"
        raise ValueError(msg)
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def zigzag(value: int) -> int:
    """``value`` (a signed 64-bit integer) zigzag-mapped onto a non-negative one."""
    return (value << 1) ^ (value >> 63)
