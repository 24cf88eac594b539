"""The CLI's text of the API's JSON (source_backfill.cli.render): job lines, bars, plans; no daemon."""

import pytest

from source_backfill.cli.render import (
    BAR_WIDTH,
    eta_text,
    job_line,
    latency_text,
    render_jobs,
    render_plan,
    split_bar,
    table_bar,
)


def job(**kw):
    base = {"name": "orders", "source": "events", "status": "backfilling", "epoch": 12, "splits_finished": 1,
            "splits_total": 4, "rows_history": 5200, "rows_live": 300, "eta_seconds": 41.6, "paused": False,
            "rate_limit": None, "progress": 0.52, "history_rows_per_s": 1999.6, "splits": []}
    return {**base, **kw}


def test_the_line_of_a_backfilling_job():
    assert job_line(job(rows_read_ahead=800)) == (
        "orders  backfilling  epoch 12  splits 1/4 finished  history 5200 rows (+800 read ahead)  "
        "live 300 rows  52.0%  eta 42s  history 2000 rows/s")


def test_the_line_of_a_paused_job_says_paused_instead_of_an_eta():
    line = job_line(job(paused=True, history_paused=True, eta_seconds=None, rate_limit=500))
    assert line == ("orders  backfilling  epoch 12  splits 1/4 finished  history 5200 rows  live 300 rows  "
                    "52.0%  eta paused  history 2000 rows/s  [paused, rate 500/s]")
    assert eta_text(job(history_paused=True)) == "paused"


def test_the_line_of_a_finished_job_has_no_history_rate_and_shows_its_latency():
    j = job(status="finished", splits_finished=4, progress=1.0, eta_seconds=0.0,
            live_latency={"p50_s": 0.2049, "p99_s": 1.5})
    assert job_line(j) == ("orders  finished  epoch 12  splits 4/4 finished  history 5200 rows  "
                           "live 300 rows  100.0%  eta 0s  latency p50 0.20s p99 1.50s")


def test_a_job_before_its_first_epoch_and_a_failed_dropping_one():
    j = {"name": "new", "status": "pending", "epoch": None}
    assert job_line(j) == "new  pending  epoch -  splits 0/0 finished  history 0 rows  live 0 rows  eta -"
    line = job_line(job(status="failed", dropped=True, pending_mutations=2, error="boom"))
    assert line.endswith("  [dropping, 2 pending]  error: boom")


def test_latency_needs_both_percentiles():
    assert latency_text(job()) is None
    assert latency_text(job(live_latency={"p50_s": 0.1, "p99_s": None})) is None
    assert latency_text(job(live_latency={"p50_s": 0.1, "p99_s": 0.25})) == "p50 0.10s p99 0.25s"


@pytest.mark.parametrize(
    ("split", "bar"),
    [
        # committed '#', copied by a read ahead not committed yet '=', still to read '-'
        ({"backfilled_offset": 24, "read_ahead_offset": 49, "target_offset": 99}, "##===-----"),
        ({"backfilled_offset": None, "target_offset": 99}, "----------"),
        ({"backfilled_offset": 99, "target_offset": 99}, "##########"),
        # a read ahead behind the commit adds nothing
        ({"backfilled_offset": 49, "read_ahead_offset": 9, "target_offset": 99}, "#####-----"),
        # an empty split (target before its first offset) is done
        ({"backfilled_offset": None, "target_offset": -1}, "##########"),
    ],
)
def test_a_split_bars_characters(split, bar):
    line = split_bar({"split": "s:0", "stage": "backfilling", **split}, width=10)
    assert line.startswith(f"s:0  [{bar}] ")
    assert len(bar) == 10


def test_a_split_without_a_target_and_a_finished_one():
    unknown = {"split": "s:1", "stage": "backfilling", "backfilled_offset": None, "target_offset": None}
    assert split_bar(unknown, width=4) == "s:1  [----]     ?%  ?/?  backfilling"
    assert split_bar({"split": "s:1", "stage": "finished", "backfilled_offset": 2, "target_offset": 9},
                     width=4) == "s:1  [####] 100.0%  10/10  finished"
    assert split_bar({"split": "s:1", "stage": "finished"}).count("#") == BAR_WIDTH


def test_a_table_bar_without_the_apis_progress_counts_vnodes():
    table = {"strategy": "chain", "phase": "catching_up", "vnodes_completed": 64, "vnodes_total": 256,
             "lag_versions": None}
    assert table_bar(table, width=8) == "chain  [##------]  25.0%  vnodes 64/256  catching_up  lag ? versions"
    empty = {**table, "vnodes_total": 0, "vnodes_completed": 0}
    assert table_bar(empty, width=4).startswith("chain  [####] 100.0%")


def test_render_jobs_aligns_the_split_names():
    splits = [{"split": "a:0", "stage": "finished", "target_offset": 0, "backfilled_offset": 0},
              {"split": "a:10", "stage": "backfilling", "target_offset": 9, "backfilled_offset": 4}]
    lines = render_jobs([job(splits=splits)]).splitlines()
    assert lines[1].startswith("  a:0   [") and lines[2].startswith("  a:10  [")
    assert render_jobs([]) == "no jobs"


def test_a_dry_runs_plan():
    plan = {"job": {"name": "j", "source": "s", "sink_path": "/t", "rate_limit": 1000},
            "splits": [{"split": "t:0", "from_offset": 0, "to_offset": 99, "offsets": 100}],
            "offsets_total": 100, "bytes_total": None, "rate_limit_rows_per_s": 1000,
            "seconds_at_rate_limit": 300.0, "measured_rows_per_s": None, "warnings": ["slow"]}
    assert render_plan(plan).splitlines() == [
        'dry run: job "j" on source "s" -> /t: every check passed; nothing was created',
        "  t:0  offsets 0..99  100 to copy",
        "  total 100 offsets, bytes unknown",
        "  at the rate limit: 1,000 rows/s: 5.0 min",
        "  at the measured history rate: none",
        "  warning: slow",
    ]


def test_a_job_reading_an_archive_shows_its_history_tiers_and_others_nothing():
    tiers = {"archive": 390, "kafka": 400, "gap": 10, "loss": 0}
    lines = render_jobs([job(history_tiers=tiers)]).splitlines()
    assert lines[1] == "  history from archive 390, kafka 400, gap 10"
    nothing = {"archive": 0, "kafka": 0, "gap": 0, "loss": 0}
    assert render_jobs([job(history_tiers=nothing)]).splitlines()[1] == "  history from nothing yet"
    assert len(render_jobs([job(history_tiers=None)]).splitlines()) == 1
    fetched = render_jobs([job(history_tiers=tiers, history_broker_bytes=12_345)]).splitlines()[1]
    assert fetched == "  history from archive 390, kafka 400, gap 10; 12,345 bytes from the broker"


def test_a_dry_run_of_a_job_reading_an_archive_shows_each_split_s_tiers_and_the_total():
    tiers = {"archive": 90, "kafka": 10, "gap": 0, "loss": 0}
    plan = {"job": {"name": "j", "source": "s", "sink_path": "/t"},
            "splits": [{"split": "t:0", "from_offset": 0, "to_offset": 100, "offsets": 100, "tiers": tiers}],
            "offsets_total": 100, "tiers_total": tiers, "warnings": []}
    lines = render_plan(plan).splitlines()
    assert lines[1] == "  t:0  offsets 0..100  100 to copy  (archive 90, kafka 10)"
    assert lines[2] == "  history from archive 90, kafka 10"
