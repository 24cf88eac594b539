"""bench-compare's statistics: medians, ratio, spreads, and a verdict only beyond the runs' spread."""

from __future__ import annotations

import pytest

from bench import compare, report


def test_a_regression_is_every_head_run_worse_than_every_base_run():
    # startup.ready_s: lower is better (issue 51: 8.3 s on the base, ~20 s now)
    assert compare.verdict([8.0, 8.3, 8.35], [20.2, 20.6, 17.4], higher_is_better=False) == "regression"
    assert compare.verdict([20.2, 20.6, 17.4], [8.0, 8.3, 8.35], higher_is_better=False) == "improvement"
    # backfill.ratio_vs_batch_copy: higher is better (1.198 before, 0.594 / 0.819 now)
    assert compare.verdict([1.07, 1.2, 1.34], [0.59, 0.82, 0.7], higher_is_better=True) == "regression"
    assert compare.verdict([0.59, 0.82, 0.7], [1.07, 1.2, 1.34], higher_is_better=True) == "improvement"


def test_spreads_that_meet_or_overlap_are_the_same():
    assert compare.verdict([4.0, 9.3, 5.0], [6.0, 7.0, 8.0], higher_is_better=False) == "same"  # inside
    assert compare.verdict([1.0, 2.0], [2.0, 3.0], higher_is_better=False) == "same"  # touching at 2.0
    assert compare.verdict([1.0, 2.0], [2.01, 3.0], higher_is_better=False) == "regression"
    assert compare.verdict([5.0], [5.0], higher_is_better=True) == "same"


def test_a_figure_without_direction_or_runs():
    assert compare.verdict([1.0, 1.1], [2.0, 2.1], higher_is_better=None) == "changed"
    assert compare.verdict([1.0, 1.1], [1.05], higher_is_better=None) == "same"
    assert compare.verdict([], [1.0], higher_is_better=True) == "—"
    assert compare.verdict([1.0], [], higher_is_better=False) == "—"


def test_directions_come_from_the_goals_then_from_the_units():
    assert compare.direction("startup.ready_s") is False  # _at_most
    assert compare.direction("backfill.ratio_vs_batch_copy") is True  # _at_least
    assert compare.direction("planner.mixed_planner_ms") is False  # "< 5 ms", told in its Goal
    assert compare.direction("archive.half.exactly_once") is True
    assert compare.direction("planner.mixed_speedup") is True
    assert compare.direction("backfill.rows_per_s") is True
    assert compare.direction("planner.mixed_reference_ms") is False
    assert compare.direction("planner.load_average_1m") is None
    assert all(g.higher_is_better is not None for g in report.GOALS if g.goal != "(reference)")


def test_rows_give_medians_ratio_and_spreads_goals_first():
    base = [{"startup.ready_s": v, "trigger.x_s": 1.0, "_measured_at": {"trigger": "t"}, "load.verdict": "ok",
             "trigger.flag": True} for v in (8.0, 8.4, 8.3)]
    head = [{"startup.ready_s": v, "trigger.x_s": 1.0, "trigger.new": float("nan")}
            for v in (20.2, 20.6, 17.4)]
    head[0]["trigger.only_head_ms"] = 3.0
    rows = compare.compare(base, head)
    assert [r.key for r in rows] == ["startup.ready_s", "trigger.only_head_ms", "trigger.x_s"]
    ready = rows[0]
    assert (ready.base_median, ready.head_median) == (8.3, 20.2)
    assert ready.ratio == pytest.approx(20.2 / 8.3)
    assert ready.verdict == "regression" and ready.goal == "≤ 12 s"
    assert rows[1].verdict == "—" and rows[1].ratio is None
    assert rows[2].verdict == "same" and rows[2].ratio == 1.0


def test_the_markdown_table():
    rows = compare.compare([{"startup.ready_s": v} for v in (8.0, 8.4, 8.3)],
                           [{"startup.ready_s": v} for v in (20.2, 20.6, 17.4)])
    lines = compare.table(rows).splitlines()
    assert lines[0].startswith("| figure | goal | better | base median | head median | head/base |")
    assert lines[2] == ("| `startup.ready_s` | ≤ 12 s | lower | 8.3 | 20.2 | 2.434 | 8–8.4 | 17.4–20.6 "
                        "| **regression** |")


def test_modules_from_names_and_figure_prefixes():
    available = ["bench_backfill", "bench_planner", "bench_scale_table", "bench_table", "bench_trigger"]
    assert compare.modules_for(["startup", "backfill", "trigger"], available) == ["bench_trigger",
                                                                                  "bench_backfill"]
    assert compare.modules_for(["table_backfill"], available) == ["bench_scale_table", "bench_table"]
    with pytest.raises(SystemExit, match="no benchmark module for 'nope'"):
        compare.modules_for(["nope"], available)


_OLD_BENCH = '''import json, pathlib, sys
out = pathlib.Path(__file__).parent / "results" / "latest.json"
out.parent.mkdir(exist_ok=True)
old = json.loads(out.read_text()) if out.exists() else {}
out.write_text(json.dumps({**old, "planner.mixed_planner_ms": 4.0, "planner.args": len(sys.argv)}))
'''


def test_each_run_has_its_own_figures_whether_or_not_the_side_knows_bench_results(tmp_path):
    """A base from before BENCH_RESULTS writes only its latest.json: a run takes it, and no earlier run's."""
    import sys

    old, new = tmp_path / "old", tmp_path / "new"
    for tree, main in ((old, _OLD_BENCH), (new, _OLD_BENCH.replace(
            'pathlib.Path(__file__).parent / "results" / "latest.json"',
            'pathlib.Path(__import__("os").environ["BENCH_RESULTS"])  # BENCH_RESULTS'))):
        (tree / "bench").mkdir(parents=True)
        (tree / "bench" / "__init__.py").write_text("")
        (tree / "bench" / "__main__.py").write_text(main)
    (old / "bench" / "results").mkdir()
    (old / "bench" / "results" / "latest.json").write_text('{"stale.figure_s": 1.0}')
    for tree in (old, new):
        side = compare.Side("base", tree, sys.executable, compare.side_env(tree), "x")
        compare.run_once(side, ["bench_planner"], tmp_path / f"{tree.name}-1.json")
        assert side.runs == [{"planner.mixed_planner_ms": 4.0, "planner.args": 2}] and not side.failed
        assert (tmp_path / f"{tree.name}-1.log").exists()
    assert not (new / "bench" / "results").exists()
