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


def test_a_run_of_one_benchmark_keeps_the_rows_it_did_not_measure(tmp_path):
    """``python -m bench isolation`` alone rewrote every other goal's row as "not measured"."""
    readme = tmp_path / "benchmarks.md"
    first = tmp_path / "first.json"
    first.write_text(json.dumps({"startup.ready_s": 11.2, "trigger.caught_up_p50_s": 0.2}))
    readme.write_text(f"{report.BEGIN}\n{report.END}\n")
    assert report.update(readme, first)
    second = tmp_path / "second.json"
    second.write_text(json.dumps({"startup.ready_s": 13.0}))
    assert report.update(readme, second)
    text = readme.read_text()
    assert _row(text, "startup.ready_s")[2] == "13" and _row(text, "startup.ready_s")[-1] == "**missed**"
    assert _row(text, "trigger.caught_up_p50_s")[2] == "0.2"  # kept from the first run
    assert _row(text, "kafka_read.ratio_vs_raw")[2] == "not measured"


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


# A history a - b - c on main, x branched off at a: "contains(commit, other)" is other in commit's history.
_HISTORY = {"a": {"a"}, "b": {"a", "b"}, "c": {"a", "b", "c"}, "x": {"a", "x"}}


def _contains(commit: str, other: str) -> bool:
    return other in _HISTORY.get(commit.removesuffix(report.DIRTY), set())


def test_a_figure_is_stale_unless_measured_on_a_commit_holding_the_newest_code():
    # the newest commit touching the code is b (c touched only the docs)
    assert not report.is_stale(["b"], "b", _contains)
    assert not report.is_stale(["c"], "b", _contains)  # measured after it
    assert report.is_stale(["a"], "b", _contains)  # measured before the code changed
    assert report.is_stale(["x"], "b", _contains)  # on a branch without the change
    assert report.is_stale([], "b", _contains)  # no commit recorded: cannot tell, so not "yes"
    assert report.is_stale(["c" + report.DIRTY], "b", _contains)  # uncommitted code
    assert report.is_stale(["c", "a"], "b", _contains)  # a median over runs, one of them before the change


def test_each_row_carries_its_commit_and_a_stale_row_never_says_yes():
    figures = {
        "_measured_at": {"trigger": "2026-11-28T07:00:00+00:00", "planner": "2026-11-25T07:00:00+00:00",
                         "backfill": "2026-11-28T08:00:00+00:00"},
        "_commit": {"trigger": "c" * 40, "planner": "a" * 40, "backfill": "c" * 39 + "c" + report.DIRTY},
        "startup.ready_s": 8.3,  # measured by bench_trigger
        "trigger.caught_up_p50_s": 0.3,
        "planner.mixed_planner_ms": 4.1,
        "backfill.ratio_vs_batch_copy": 1.2,
    }
    newest = "b" * 40
    history = {"c" * 40: {"a" * 40, "b" * 40, "c" * 40}, "a" * 40: {"a" * 40}}

    def stale(commits):
        return report.is_stale(commits, newest, lambda c, o: o in history.get(c, set()))

    table = report.render(figures, stale)
    assert _row(table, "startup.ready_s")[3:] == ["2026-11-28 `ccccccc`", "≤ 12 s", "yes"]
    assert _row(table, "trigger.caught_up_p50_s")[-1] == "**missed**"
    assert _row(table, "planner.mixed_planner_ms")[3:] == [
        "2026-11-25 `aaaaaaa`", "< 5 ms", "stale (was yes)"]
    assert _row(table, "backfill.ratio_vs_batch_copy")[3] == "2026-11-28 `ccccccc+dirty`"
    assert _row(table, "backfill.ratio_vs_batch_copy")[-1] == "stale (was yes)"
    assert _row(report.render(figures), "planner.mixed_planner_ms")[-1] == "yes"  # not judged without git


def test_combined_runs_keep_every_commit_they_were_measured_on():
    runs = [{"_measured_at": {"trigger": "2026-11-28T07:00:00+00:00"}, "_commit": {"trigger": c},
             "startup.ready_s": 9.0} for c in ("a" * 40, "c" * 40, "c" * 40)]
    runs.append({"_measured_at": {"trigger": "2026-11-27T07:00:00+00:00"}, "startup.ready_s": 9.5})
    combined = report.combine(runs)
    assert combined["_commit"] == {"trigger": ["a" * 40, "c" * 40, "?"]}
    assert _row(report.render(combined), "startup.ready_s")[3] == "2026-11-28 `aaaaaaa` `ccccccc` `?`"


def test_the_repositorys_own_history_judges_the_rows(tmp_path):
    """The git side of the rule, on a throwaway repository: a code commit makes older figures stale."""
    import subprocess

    def git(*args):
        return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=tmp_path,
                              check=True, capture_output=True, text=True).stdout.strip()

    git("init", "-q")
    (tmp_path / "bench").mkdir()
    (tmp_path / "bench" / "x.py").write_text("1\n")
    git("add", "-A")
    git("commit", "-qm", "code")
    measured = report.measured_commit(tmp_path)
    assert measured == git("rev-parse", "HEAD")
    (tmp_path / "README.md").write_text("docs\n")
    git("add", "-A")
    git("commit", "-qm", "docs only")
    stale = report.git_staleness(tmp_path / "bench")  # from a sub-folder too (the table may move to docs/)
    assert stale is not None and not stale([measured]) and not stale([git("rev-parse", "HEAD")])
    (tmp_path / "bench" / "x.py").write_text("2\n")
    assert report.measured_commit(tmp_path) == git("rev-parse", "HEAD") + report.DIRTY
    git("commit", "-qam", "code again")
    stale = report.git_staleness(tmp_path)
    assert stale is not None and stale([measured]) and not stale([git("rev-parse", "HEAD")])


def test_a_run_records_each_modules_commit_where_bench_results_says(tmp_path, monkeypatch):
    from bench import RESULTS
    from bench.__main__ import record, results_path

    monkeypatch.delenv("BENCH_RESULTS", raising=False)
    assert results_path() == RESULTS
    monkeypatch.setenv("BENCH_RESULTS", str(tmp_path / "run.json"))
    path = results_path()
    assert path == tmp_path / "run.json"
    record("bench_trigger", {"startup.ready_s": 9.1, "caught_up_p50_s": 0.12}, path, "c" * 40)
    record("bench_planner", {"mixed_planner_ms": 4.0}, path, "a" * 40 + report.DIRTY)
    data = json.loads(path.read_text())
    assert data["_commit"] == {"trigger": "c" * 40, "planner": "a" * 40 + report.DIRTY}
    assert data["trigger.caught_up_p50_s"] == 0.12 and set(data["_measured_at"]) == {"trigger", "planner"}
    record("bench_planner", {"mixed_planner_ms": 4.2}, path, None)  # measured again, commit unknown
    assert json.loads(path.read_text())["_commit"] == {"trigger": "c" * 40}
