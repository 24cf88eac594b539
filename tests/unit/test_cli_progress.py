"""What the CLI shows of a job's progress and live latency (from the API's JSON, no daemon)."""

from source_backfill.cli import job_line, render_table


def job(**kw):
    base = {"name": "j", "source": "src", "status": "finished", "epoch": 7, "splits_finished": 2,
            "splits_total": 2, "rows_history": 100, "rows_live": 50, "eta_seconds": 0.0, "paused": False,
            "rate_limit": None, "splits": []}
    return {**base, **kw}


def test_the_live_latency_is_shown_when_the_api_has_it():
    j = job(live_latency={"p50_s": 0.213, "p99_s": 0.84, "window_s": 60, "rows": 10,
                          "timestamp_type": "create_time"})
    assert "latency p50 0.21s p99 0.84s" in job_line(j)
    assert "p50 0.21s p99 0.84s" in render_table([j]).splitlines()[1]


def test_no_latency_figure_without_live_rows_in_the_window():
    j = job(live_latency={"p50_s": None, "p99_s": None, "window_s": 60, "rows": 0, "timestamp_type": None})
    assert "latency" not in job_line(j) and "latency" not in job_line(job())
    assert render_table([j]).splitlines()[1].rstrip().endswith("-")


def test_paused_instead_of_an_eta_and_the_jobs_percentage_and_history_rate():
    j = job(status="backfilling", paused=True, rate_limit=5000, history_paused=True, eta_seconds=None,
            progress=0.4567, history_rows_per_s=1234.4)
    line = job_line(j)
    assert "eta paused" in line and "eta 8s" not in line and "45.7%" in line
    assert "history 1234 rows/s" in line
    assert "paused" in render_table([j]).splitlines()[1]
    j = job(status="backfilling", eta_seconds=62.0, progress=0.5, history_rows_per_s=2000.0)
    assert "eta 62s" in job_line(j) and "50.0%" in job_line(j)
    assert "eta -" in job_line(job(status="backfilling", eta_seconds=None))


def test_a_table_jobs_bar_follows_the_rows_copied():
    from source_backfill.cli import table_bar

    table = {"strategy": "snapshot", "phase": "consuming_snapshot", "vnodes_completed": 0,
             "vnodes_total": 256, "lag_versions": 2, "progress": 130_000 / 180_000, "rows_total": 180_000,
             "rows_copied": 130_000}
    assert table_bar(table, width=10) == ("snapshot  [#######---]  72.2%  rows 130000/180000  vnodes 0/256  "
                                          "consuming_snapshot  lag 2 versions")
