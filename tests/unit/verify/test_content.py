"""verify's content comparison: per-block digest sums, whatever order the rows and records come in."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from source_backfill.verify.content import MAX_BLOCKS, MIN_BLOCK, SplitContent, block_width, digest

RECORD = st.tuples(st.one_of(st.none(), st.binary(max_size=8)), st.one_of(st.none(), st.binary(max_size=8)),
                   st.integers(0, 2**41))


def test_the_digest_tells_each_field_and_a_null_from_an_empty_one():
    base = digest(5, b"k", b"v", 1000)
    others = [digest(6, b"k", b"v", 1000), digest(5, b"K", b"v", 1000), digest(5, b"k", b"V", 1000),
              digest(5, b"k", b"v", 1001), digest(5, None, b"v", 1000), digest(5, b"", b"v", 1000),
              digest(5, b"k", None, 1000), digest(5, b"kv", b"", 1000), digest(5, b"", b"kv", 1000)]
    assert len({base, *others}) == 1 + len(others)
    assert 0 <= base < 2**64


def test_blocks_are_narrow_for_small_splits_and_never_more_than_the_bound():
    assert block_width(0, 10) == MIN_BLOCK and block_width(0, MIN_BLOCK * MAX_BLOCKS) == MIN_BLOCK
    for span in (MIN_BLOCK * MAX_BLOCKS + 1, 10**9, 2**40):
        width = block_width(7, 7 + span)
        assert -(-span // width) <= MAX_BLOCKS < -(-span // (width // 2))


@given(lo=st.integers(0, 10**6), records=st.lists(RECORD, min_size=1, max_size=300), data=st.data())
def test_sums_agree_in_any_order_and_a_changed_record_names_its_block(lo, records, data):
    offsets = np.arange(lo, lo + len(records), dtype=np.int64)
    digests = np.array([digest(int(o), *r) for o, r in zip(offsets, records, strict=True)], dtype=np.uint64)
    content = SplitContent(lo, lo + len(records))
    order = np.array(data.draw(st.permutations(range(len(records)))), dtype=np.int64)
    content.add("log", offsets, digests)
    for part in np.array_split(order, 3):  # the table's rows in other batches and another order
        content.add("table", offsets[part], digests[part])
    content.add("table", np.array([lo - 1, lo + len(records)], dtype=np.int64),
                np.array([1, 2], dtype=np.uint64))  # outside [lo, hi): not counted
    assert content.compare() == []

    at = data.draw(st.integers(0, len(records) - 1))
    key, value, ts = records[at]
    changed = digests.copy()
    changed[at] = np.uint64(digest(lo + at, key, (value or b"") + b"!", ts))
    content = SplitContent(lo, lo + len(records))
    content.add("log", offsets, digests)
    content.add("table", offsets[order], changed[order])
    block = at // content.width
    first = lo + block * content.width
    assert content.compare() == [(first, min(lo + len(records), first + content.width))]
