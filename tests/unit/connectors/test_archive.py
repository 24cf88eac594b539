"""What an archive table holds, read from a real Delta table on disk (delta-rs, no Spark)."""

from __future__ import annotations

import pyarrow as pa
import pytest
from deltalake import write_deltalake

from connectors.delta.archive import archive_holdings
from source_backfill.errors import DeltaSinkError


def records(topic: str, partition: int, offsets: list[int]) -> pa.Table:
    n = len(offsets)
    return pa.table({
        "key": pa.array([None] * n, pa.binary()),
        "value": pa.array([b"v%d" % o for o in offsets], pa.binary()),
        "topic": pa.array([topic] * n, pa.string()),
        "partition": pa.array([partition] * n, pa.int32()),
        "offset": pa.array(offsets, pa.int64()),
    })


def test_contiguous_files_are_taken_from_their_statistics_and_the_others_read(tmp_path):
    path = str(tmp_path / "archive")
    write_deltalake(path, records("t", 0, list(range(0, 100))))  # one split, no hole: statistics
    write_deltalake(path, records("t", 0, list(range(100, 200))), mode="append")
    write_deltalake(path, records("t", 1, [0, 1, 2, 5, 6]), mode="append")  # a hole: read
    mixed = pa.concat_tables([records("t", 2, [10, 11]), records("u:x", 0, [7])])  # two splits: read
    write_deltalake(path, mixed, mode="append")
    h = archive_holdings(path, unique_offsets=True)
    held = {"t:0": [(0, 200)], "t:1": [(0, 3), (5, 7)], "t:2": [(10, 12)], "u:x:0": [(7, 8)]}
    assert h.held == held
    assert (h.files_from_stats, h.files_read, h.duplicates) == (2, 2, 0) and h.version == 3
    foreign = archive_holdings(path)  # a foreign table: every file read, the same holdings
    assert foreign.held == held and (foreign.files_from_stats, foreign.files_read) == (0, 4)


def test_a_duplicate_hiding_a_hole_is_not_taken_for_a_run(tmp_path):
    # offsets 0..4 with 2 twice and 3 missing: 5 records, max - min + 1 = 5, the statistics look whole
    path = str(tmp_path / "archive")
    write_deltalake(path, records("t", 0, [0, 1, 2, 2, 4]))
    h = archive_holdings(path)
    assert h.held == {"t:0": [(0, 3), (4, 5)]} and h.duplicates == 1


def test_a_pinned_version_is_what_the_plan_reads(tmp_path):
    path = str(tmp_path / "archive")
    write_deltalake(path, records("t", 0, list(range(10))))
    write_deltalake(path, records("t", 0, list(range(10, 20))), mode="append")  # the table grows
    assert archive_holdings(path, version=0).held == {"t:0": [(0, 10)]}
    assert archive_holdings(path).held == {"t:0": [(0, 20)]}


def test_a_table_without_the_kafka_columns_is_refused(tmp_path):
    path = str(tmp_path / "not-an-archive")
    write_deltalake(path, pa.table({"value": [b"x"]}))
    with pytest.raises(DeltaSinkError, match="no topic, partition, offset column"):
        archive_holdings(path)


def _timed(topic: str, partition: int, offsets: list[int], ts_ms: list[int]) -> pa.Table:
    table = records(topic, partition, offsets)
    return table.append_column("timestamp", pa.array([t * 1000 for t in ts_ms], pa.timestamp("us", tz="UTC")))


def test_the_first_offset_at_a_timestamp_below_the_log_start_kafka_s_rule_on_the_archive(tmp_path):
    from connectors.delta.archive import first_offsets_at

    path = str(tmp_path / "archive")
    # t:0 offsets 0..9 at 100, 110, ..., 190 ms; t:1 out of order (CreateTime): 5 at 500, 6 at 300, 7 at 600
    write_deltalake(path, _timed("t", 0, list(range(10)), [100 + 10 * o for o in range(10)]))
    write_deltalake(path, _timed("t", 1, [5, 6, 7], [500, 300, 600]), mode="append")
    below = {"t:0": 8, "t:1": 100}
    assert first_offsets_at(path, 130, below) == {"t:0": 3, "t:1": 5}  # the first offset at or after it
    assert first_offsets_at(path, 135, below) == {"t:0": 4, "t:1": 5}
    assert first_offsets_at(path, 550, below) == {"t:1": 7}  # t:0 has none below 8 at or after 550
    assert first_offsets_at(path, 185, below) == {"t:1": 5}  # 8 and 9 are at the log start or above
    assert first_offsets_at(path, 0, {"t:0": 0, "u:0": 5}) == {}  # nothing below, a split it lacks
    assert first_offsets_at(path, 130, below, version=0) == {"t:0": 3}  # the pinned version's records


def test_a_timestamp_start_takes_the_archive_s_offset_where_it_has_one_else_kafka_s():
    from source_backfill.core.tiers import at_timestamp

    kafka = {"t:0": 150, "t:1": 150, "t:2": 400}
    assert at_timestamp(kafka, [{"t:0": 100}, {"t:0": 120, "t:1": 90}]) == {"t:0": 100, "t:1": 90, "t:2": 400}
    assert at_timestamp(kafka, [{"u:0": 1}]) == kafka  # a split the job does not read is not added


def test_only_files_holding_their_rows_as_the_table_shows_them_are_listed_to_be_taken_whole(tmp_path):
    # a trusted archive's one-split runs, in a plain table: listed with their runs
    plain = str(tmp_path / "plain")
    write_deltalake(plain, records("t", 0, list(range(10))))
    write_deltalake(plain, records("t", 0, [10, 11, 13]), mode="append")  # a hole: read, not listed
    h = archive_holdings(plain, unique_offsets=True)
    assert [(f.split, f.start, f.end) for f in h.files] == [("t:0", 0, 10)]
    assert h.files[0].path.startswith(str(tmp_path / "plain")) and h.files[0].path.endswith(".parquet")
    assert archive_holdings(plain).files == ()  # not trusted: nothing says its offsets are once each
    # partition columns live in the log, not in the file: a file of such a table is not its rows
    parted = str(tmp_path / "parted")
    write_deltalake(parted, records("t", 0, list(range(10))).append_column("day", pa.array(["d1"] * 10)),
                    partition_by=["day"])
    assert archive_holdings(parted, unique_offsets=True).files == ()
    # reader protocol 2+ (column mapping, deletion vectors): a file may hold rows the table does not
    from types import SimpleNamespace

    from connectors.delta.archive import _files_as_they_are

    def table(reader: int, partitions: list[str]) -> SimpleNamespace:
        return SimpleNamespace(protocol=lambda: SimpleNamespace(min_reader_version=reader),
                               metadata=lambda: SimpleNamespace(partition_columns=partitions))

    assert _files_as_they_are(table(1, []))
    assert not _files_as_they_are(table(2, [])) and not _files_as_they_are(table(3, []))
    assert not _files_as_they_are(table(1, ["day"]))


@pytest.mark.parametrize("trusted", [True, False])
def test_an_archive_with_column_mapping_is_planned_by_its_physical_columns(tmp_path, trusted):
    # its files (and statistics) name each column by a physical name of its own: the holdings read those
    path = str(tmp_path / "mapped")
    mapping = {"delta.columnMapping.mode": "name", "delta.minReaderVersion": "2",
               "delta.minWriterVersion": "5"}
    write_deltalake(path, records("t", 0, list(range(10))), configuration=mapping)
    write_deltalake(path, records("t", 1, [0, 1, 3]), mode="append")
    h = archive_holdings(path, unique_offsets=trusted)
    assert h.held == {"t:0": [(0, 10)], "t:1": [(0, 2), (3, 4)]}
    assert (h.files_from_stats, h.files_read) == ((1, 1) if trusted else (0, 2))
    assert h.files == ()  # reader protocol 2: a file is not taken whole
