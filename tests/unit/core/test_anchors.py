"""Anchors (``core/anchors.py``): the fingerprint's framing, the newest anchor per split, the verdict."""

import hashlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from source_backfill.core.anchors import (
    MAX_PASSED,
    Anchor,
    Anchors,
    Found,
    Truncation,
    anchors_from_json,
    anchors_to_json,
    check,
    fingerprint,
    first_per_split,
    framing,
    newest,
)

maybe_bytes = st.one_of(st.none(), st.binary(max_size=40))
timestamps = st.integers(-1, 2**53)
records = st.tuples(maybe_bytes, maybe_bytes, timestamps)
anchors = st.builds(Anchor, st.sampled_from(["t:0", "t:1", "a:b:2"]), st.integers(0, 100),
                    st.text("0123456789abcdef", min_size=1, max_size=8))


def test_the_framing_is_the_documented_text_and_its_sha256():
    assert framing(b"\x01\xab", None, 1700000000123) == "k01ABv-t1700000000123"
    assert framing(b"", b"x", -1) == "kv78t-1"
    assert fingerprint(b"k", b"v", 5) == hashlib.sha256(b"k6Bv76t5").hexdigest()


@given(records, records)
def test_two_records_have_one_framing_only_if_they_are_the_same(a, b):
    """Unambiguous: the text gives the key, the value (null apart from empty) and the timestamp back."""
    assert (framing(*a) == framing(*b)) == (a == b)


@given(records)
def test_a_fingerprint_is_64_lowercase_hex(record):
    fp = fingerprint(*record)
    assert len(fp) == 64 and fp == fp.lower() and int(fp, 16) >= 0


@given(st.lists(anchors), st.lists(anchors))
def test_newest_keeps_the_highest_offset_per_split_whatever_the_order(first, second):
    merged = newest(newest({}, first), second)
    everything = first + second
    assert set(merged) == {a.split for a in everything}
    for split, kept in merged.items():
        assert kept.offset == max(a.offset for a in everything if a.split == split)
    # an older or equal anchor never replaces the kept one
    assert newest(merged, [Anchor(a.split, a.offset, "other") for a in merged.values()]) == merged


@given(st.lists(anchors), st.lists(anchors), st.lists(st.lists(anchors, max_size=3)))
def test_the_record_reads_back_what_was_written(checked, found, epochs):
    kept = Anchors(newest({}, checked), newest({}, found))
    for epoch in epochs:
        kept = kept.advanced(epoch)
    assert anchors_from_json(anchors_to_json(kept)) == kept


def test_the_record_a_release_before_the_passed_anchors_wrote_reads_with_none_passed():
    """Written by 11f10b8 (``checked`` and ``newest`` only); a record with none passed is written alike."""
    old = {"checked": {"t:0": {"offset": 9, "fingerprint": "a9"}},
           "newest": {"t:0": {"offset": 29, "fingerprint": "b19"}, "t:1": {"offset": 3, "fingerprint": "x"}}}
    kept = anchors_from_json(old)
    assert kept == Anchors({"t:0": Anchor("t:0", 9, "a9")},
                           {"t:0": Anchor("t:0", 29, "b19"), "t:1": Anchor("t:1", 3, "x")})
    assert kept.passed == {}
    assert anchors_to_json(kept) == old


@pytest.mark.parametrize("bad", [[], {"t:0": 3}, {"newest": {}}, {"checked": {}, "newest": {"t:0": 3}},
                                 {"checked": {}, "newest": {"t:0": {"offset": "1", "fingerprint": "f"}}},
                                 {"checked": {"t:0": {"offset": True, "fingerprint": "f"}}, "newest": {}},
                                 {"checked": {}, "newest": {"t:0": {"offset": 1}}},
                                 {"checked": {}, "newest": {}, "passed": {"t:0": []}},
                                 {"checked": {}, "newest": {},
                                  "passed": {"t:0": {"offset": 1, "fingerprint": "f"}}},
                                 {"checked": {}, "newest": {}, "passed": {"t:0": [{"offset": 1}]}},
                                 {"checked": {}, "newest": {}, "other": {}}])
def test_a_malformed_record_is_refused(bad):
    with pytest.raises(ValueError):  # noqa: PT011 - the message names the entry
        anchors_from_json(bad)


def test_a_check_reads_the_verified_and_the_newest_anchor_and_verifies_only_what_it_read():
    a29, a49 = Anchor("t:0", 29, "old"), Anchor("t:0", 49, "new")
    b5 = Anchor("t:1", 5, "b")
    at_check = Anchors({"t:0": a29}, {"t:0": a49, "t:1": b5})
    assert at_check.to_check() == [a29, a49, b5]
    # meanwhile an epoch advanced t:1; the check read a29, a49 (held) but not b5 (no answer)
    now = at_check.advanced([Anchor("t:1", 9, "b9")])
    after = at_check.after_check(now, [], [a29, a49])
    assert after == Anchors({"t:0": a49}, {"t:0": a49, "t:1": Anchor("t:1", 9, "b9")},
                            {"t:1": (b5,)})  # passed by the epoch, not read: read next time
    # a truncation drops the split's anchors: the next epoch anchors it in the log as it is
    cut = Truncation(a29, Found(0, 10))
    after = at_check.after_check(now, [cut], [a29, a49, b5])
    assert after == Anchors({"t:1": b5}, {"t:1": now.newest["t:1"]})


def test_an_anchor_passed_before_a_check_is_read_by_it_and_finds_a_truncation_refilled_past_it():
    """Checked at 9; an epoch anchors 29 (the old log); the log is cut at 10 and refilled to 50, and the live
    stream anchors 49 (the new log) before any check: the check reads 29 too, and finds c19 there."""
    a9, a29, a49 = Anchor("t:0", 9, "a9"), Anchor("t:0", 29, "b19"), Anchor("t:0", 49, "c39")
    at_check = Anchors({"t:0": a9}, {"t:0": a9}).advanced([a29]).advanced([a49])
    assert at_check.passed == {"t:0": (a29,)}
    assert at_check.to_check() == [a9, a29, a49]
    assert check(a29, Found(0, 50, 29, "c19")) is not None
    # no truncation: what was read is let go; an anchor passed during the check waits for the next one
    now = at_check.advanced([Anchor("t:0", 60, "d")])
    after = at_check.after_check(now, [], [a9, a29, a49])
    assert after == Anchors({"t:0": a49}, {"t:0": Anchor("t:0", 60, "d")}, {})
    after = at_check.after_check(now, [], [a9])  # 29 and 49 not read (no answer): read again next time
    assert after.passed == {"t:0": (a29, a49)} and after.checked == {"t:0": a9}


@given(st.lists(st.integers(1, 5), max_size=3 * MAX_PASSED))
def test_every_anchor_since_the_last_check_is_read_by_the_next_up_to_the_bound(steps):
    kept = Anchors()
    offset, given_ = 0, []
    for step in steps:
        offset += step
        given_.append(Anchor("t:0", offset, str(offset)))
        kept = kept.advanced([given_[-1]])
    to_check = kept.to_check()
    assert to_check == given_[-(MAX_PASSED + 1):]  # the newest, and the passed ones the bound keeps
    after = kept.after_check(kept, [], to_check)
    assert after.passed == {} and after.to_check() == given_[-1:]


def test_the_verified_anchor_finds_a_truncation_the_live_stream_has_read_past():
    """The log cut at 10 and refilled to 50 before a check: the newest anchor (49, in the new log) holds,
    the verified one (29, copied from the old log) does not."""
    a29, a49 = Anchor("t:0", 29, "old"), Anchor("t:0", 49, "new")
    assert check(a49, Found(0, 50, 49, "new")) is None
    assert check(a29, Found(0, 50, 29, "c19")) == Truncation(a29, Found(0, 50, 29, "c19"))
    found = [Truncation(a49, Found(0, 10)), Truncation(a29, Found(0, 10)),
             Truncation(Anchor("u:0", 3, "x"), Found(0, 1))]
    assert first_per_split(found) == [found[1], found[2]]  # the lowest anchor of each split


A = Anchor("t:0", 29, "f" * 64)


@given(start=st.integers(0, 60), end=st.integers(0, 60), offset=st.one_of(st.none(), st.integers(0, 60)),
       same=st.booleans())
def test_the_verdict(start, end, offset, same):
    fp = None if offset is None else ("f" * 64 if same else "e" * 64)
    found = Found(start, max(start, end), offset, fp)
    verdict = check(A, found)
    if start > A.offset:  # retention removed it: nothing to say
        assert verdict is None
    elif found.log_end <= A.offset:  # the log ends at or below the anchor: truncated
        assert verdict == Truncation(A, found)
    elif offset == A.offset and not same:  # another record at it
        assert verdict == Truncation(A, found)
    else:  # the record is there, or the offset holds none now (compacted, a marker): no verdict
        assert verdict is None


def test_a_truncation_names_topic_partition_offset_and_what_is_there():
    ended = str(check(A, Found(0, 10)))
    assert "topic t partition 0 was truncated below what was copied: offset 29" in ended
    assert "the log now ends at offset 10" in ended
    other = str(check(A, Found(0, 50, 29, "e" * 64)))
    assert f"another record is at offset 29 (fingerprint {'e' * 64})" in other
    assert check(A, Found(0, 50, 29, "f" * 64)) is None
    assert check(A, Found(0, 50, 31, "e" * 64)) is None
