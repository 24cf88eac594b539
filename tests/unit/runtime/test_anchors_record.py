"""``anchors.json`` (``runtime/anchors.py``): absent in a folder of an earlier release, written whole,
refused when unreadable; the driver's fingerprints of arrow rows pick the record at each split's offset."""

from __future__ import annotations

import datetime as dt

import pyarrow as pa
import pytest

from source_backfill.core.anchors import Anchor, Anchors, fingerprint
from source_backfill.errors import StateFormatError
from source_backfill.runtime.anchors import FILE_NAME, last_fingerprints, read_anchors, save_anchors


def test_a_folder_without_the_record_has_no_anchors_and_a_saved_one_reads_back(tmp_path):
    assert read_anchors(tmp_path) == Anchors()
    kept = Anchors({"t:0": Anchor("t:0", 3, "a")},
                   {"t:0": Anchor("t:0", 9, "b"), "t:1": Anchor("t:1", 0, "c")})
    save_anchors(tmp_path, kept)
    assert read_anchors(tmp_path) == kept
    assert not (tmp_path / "anchors.tmp").exists()  # written through a temporary file, renamed over


@pytest.mark.parametrize("text", ["{not json", "[]", '{"newest": {}}'])
def test_an_unreadable_record_is_refused_naming_the_file(tmp_path, text):
    (tmp_path / FILE_NAME).write_text(text)
    with pytest.raises(StateFormatError, match="anchors.json of a source cannot be read"):
        read_anchors(tmp_path)


def test_the_fingerprints_of_arrow_rows_are_the_records_at_the_offsets_asked():
    ts = pa.array([dt.datetime(2026, 1, 1, tzinfo=dt.UTC) + dt.timedelta(milliseconds=i) for i in range(4)],
                  pa.timestamp("us", tz="UTC"))
    rows = pa.table({"key": pa.array([b"a", None, b"c", b"d"], pa.binary()),
                     "value": pa.array([b"1", b"2", None, b"4"], pa.binary()),
                     "topic": ["t", "t", "u", "t"], "partition": pa.array([0, 0, 0, 1], pa.int32()),
                     "offset": pa.array([5, 6, 6, 2], pa.int64()), "timestamp": ts})
    ms = int(dt.datetime(2026, 1, 1, tzinfo=dt.UTC).timestamp() * 1000)
    got = last_fingerprints(rows, {("t", 0): 6, ("u", 0): 6, ("t", 1): 9})
    assert got == {("t", 0): fingerprint(None, b"2", ms + 1), ("u", 0): fingerprint(b"c", None, ms + 2)}
