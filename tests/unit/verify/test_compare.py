from source_backfill.verify import compare


def test_exact_table_is_ok():
    report = compare({"t:0": [0, 1, 3]}, {"t:0": [3, 0, 1]})
    assert report.ok
    assert report.splits["t:0"].log_records == 3


def test_missing_duplicate_and_unexpected_offsets_are_named():
    report = compare({"t:0": [0, 1, 2], "t:1": [5]}, {"t:0": [0, 0, 2, 9], "t:2": [1]})
    assert not report.ok
    s0 = report.splits["t:0"]
    assert (s0.missing, s0.duplicates, s0.unexpected) == ((1,), (0,), (9,))
    assert report.splits["t:1"].missing == (5,)
    assert report.splits["t:2"].unexpected == (1,)
    assert "t:0: missing=1" in report.summary()
