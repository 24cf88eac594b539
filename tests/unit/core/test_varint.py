"""Base-128 varints and zigzag (core/varint.py), against the specs' own examples and a decoder."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from source_backfill.core.varint import varint, zigzag


def test_the_protobuf_and_avro_specs_examples():
    assert [varint(n) for n in (0, 1, 127, 128, 150, 300)] == [
        b"\x00", b"\x01", b"\x7f", b"\x80\x01", b"\x96\x01", b"\xac\x02"]
    assert [zigzag(n) for n in (0, -1, 1, -2, 2147483647, -2147483648)] == [
        0, 1, 2, 3, 4294967294, 4294967295]
    assert zigzag(-(2**63)) == 2**64 - 1
    with pytest.raises(ValueError, match="non-negative"):
        varint(-1)


@given(st.integers(0, 2**64 - 1))
def test_every_value_reads_back(value):
    raw = varint(value)
    assert all(b & 0x80 for b in raw[:-1]) and not raw[-1] & 0x80
    assert sum((b & 0x7F) << (7 * i) for i, b in enumerate(raw)) == value
