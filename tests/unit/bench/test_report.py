"""The goals table of docs/benchmarks.md: written from latest.json, each goal plainly met or missed."""

from __future__ import annotations

import json
import re

from bench import report


def _cells(line: str) -> list[str]:
    """A markdown row's cells (a bar escaped as ``\\|`` stays in its cell)."""
    return [cell.strip() for cell in re.split(r"(?<!\\)\|", line.strip().strip("|"))]


def _row(table: str, key: str) -> list[str]:
    return _cells(next(line for line in table.splitlines() if f"`{key}`" in line))


def test_each_goal_is_met_missed_or_not_measured():
    figures = {
        "_measured_at": {"trigger": "2026-11-24T00:14:36+00:00", "backfill": "2026-11-23T10:00:00+00:00"},
        "trigger.caught_up_p50_s": 0.255,
        "backfill.ratio_vs_batch_copy": 1.03,
        "live_p99.ratio_with_backfill": 1.11,
        "live_p99.ratio_with_fresh_query": 1.05,
        "table_backfill.chain.ratio_vs_plain_read": 1.27,
        "table_backfill.chain.ratio_range": [1.02, 1.27, 1.59],
        "kafka_read.ratio_vs_raw": float("nan"),
    }
    table = report.render(figures)
    assert _row(table, "trigger.caught_up_p50_s")[2:] == ["0.255", "2026-11-24", "≤ 0.25 s", "**missed**"]
    assert _row(table, "backfill.ratio_vs_batch_copy")[-1] == "yes"
    # within 1.2 but not below the fresh query's: missed
    assert _row(table, "live_p99.ratio_with_backfill")[-1] == "**missed**"
    assert _row(table, "table_backfill.chain.ratio_vs_plain_read")[2] == "1.27 (runs: 1.02, 1.27, 1.59)"
    assert _row(table, "kafka_read.ratio_vs_raw")[2] == "not measured"
    assert _row(table, "startup.ready_s")[2] == "not measured"
    assert len(table.splitlines()) == 2 + len(report.GOALS)


def test_update_rewrites_only_between_the_markers(tmp_path):
    readme = tmp_path / "README.md"
    results = tmp_path / "latest.json"
    results.write_text(json.dumps({"startup.ready_s": 11.2}))
    readme.write_text(f"before\n{report.BEGIN}\nold table\n{report.END}\nafter\n")
    assert report.update(readme, results)
    text = readme.read_text()
    assert text.startswith(f"before\n{report.BEGIN}\n| goal |") and text.endswith(f"{report.END}\nafter\n")
    assert "old table" not in text and _row(text, "startup.ready_s")[-1] == "yes"
    assert report.update(readme, results) and readme.read_text() == text  # idempotent
    readme.write_text("no markers\n")
    assert not report.update(readme, results)


def test_several_runs_give_each_goal_its_median_and_range(tmp_path):
    runs = [{"_measured_at": {"trigger": f"2026-11-2{d}T01:00:00+00:00"}, "trigger.caught_up_p50_s": v,
             "startup.ready_s": 11.0 + d} for d, v in ((1, 0.30), (3, 0.24), (2, 0.22))]
    runs.append({"trigger.caught_up_p50_s": float("nan")})  # a run that did not measure it: left out
    table = report.render(report.combine(runs))
    assert _row(table, "trigger.caught_up_p50_s")[2:] == [
        "0.24 (median of 3 runs: 0.22–0.3)", "2026-11-23", "≤ 0.25 s", "yes"]
    assert _row(table, "startup.ready_s")[2].startswith("13 (median of 3 runs: 12–14)")
    assert _row(table, "startup.ready_s")[-1] == "**missed**"
    files = []
    for n, run in enumerate(runs):
        files.append(tmp_path / f"run{n}.json")
        files[-1].write_text(json.dumps(run))
    readme = tmp_path / "README.md"
    readme.write_text(f"{report.BEGIN}\n{report.END}\n")
    assert report.update(readme, files) and "median of 3 runs" in readme.read_text()


def test_the_committed_table_lists_every_goal_in_order():
    """The committed table is hand-kept between full runs (medians of soaks): it must not drop a goal."""
    parts = report.table_in(report.README.read_text())
    assert parts is not None
    rows = [_cells(row) for row in parts[1].splitlines()[2:]]
    assert all(len(cells) == 6 and cells[-1] for cells in rows), rows
    assert [cells[1].strip("`") for cells in rows] == [g.key for g in report.GOALS]
