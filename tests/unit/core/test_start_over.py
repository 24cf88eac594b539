"""The pure parts of starting over after a recreated topic: the reset's folder name, a new table's paths."""

from datetime import UTC, datetime, timedelta, timezone

from source_backfill.core.start_over import (
    NEW_TABLE_TRIES,
    RESET_MARK,
    new_table_candidates,
    reset_folder_name,
)


def test_the_folder_name_is_the_lines_time_in_utc_and_its_id():
    at = datetime(2026, 11, 29, 6, 15, 2, 123456, tzinfo=UTC)
    assert reset_folder_name("src", at, 17) == "src.reset-20261129T061502Z-17"
    # the same instant given in another zone names the same folder (a replayed line's time is UTC)
    east = at.astimezone(timezone(timedelta(hours=2)))
    assert reset_folder_name("src", east, 17) == "src.reset-20261129T061502Z-17"
    assert reset_folder_name("src", at, 18) != reset_folder_name("src", at, 17)  # same second, two resets
    assert reset_folder_name("a.b", at, 1).startswith("a.b" + RESET_MARK)


def test_new_table_candidates_append_a_number_to_the_old_path():
    assert list(new_table_candidates("/data/t", 3)) == ["/data/t-2", "/data/t-3", "/data/t-4"]
    assert next(new_table_candidates("/data/t/")) == "/data/t-2"  # not a folder inside the old table
    assert next(new_table_candidates("rel/t")) == "rel/t-2"
    assert len(list(new_table_candidates("/t"))) == NEW_TABLE_TRIES
    assert all(c != "/t" for c in new_table_candidates("/t"))  # never the old table itself
