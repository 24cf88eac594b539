"""The ``source-backfill`` CLI against a live API server (in-process ``cli.main`` with capsys)."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
import types
from pathlib import Path
from typing import Any

import pytest

from source_backfill import cli
from source_backfill.runtime.progress import JobProgress, SplitProgress
from tests.integration.api.conftest import TOKEN

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture
def run(live_api, cli_against):
    """``run(*argv)`` -> (exit code, stdout, stderr) against the live server, with the token from the env."""
    return cli_against(live_api.url)


def _progress(finished: bool = False) -> JobProgress:
    return JobProgress(
        epoch=9, status="finished" if finished else "backfilling", rows_history=5300, rows_live=12,
        eta_seconds=None if finished else 4.2, finish_reported=finished,
        splits=[
            SplitProgress("events:0", "finished" if finished else "backfilling", 9999 if finished else 5199,
                          9999, 10000 if finished else 5200, 0 if finished else 4800),
            SplitProgress("events:1", "source_caching_up", 99, 99, 100, 0),
            SplitProgress("events:10", "backfilling", None, None, 0, None),
        ],
    )


def test_create_list_show_and_control(run, live_api) -> None:
    code, out, err = run("jobs", "create", "orders-copy", "--source", "events", "--sink", "/t/oc",
                         "--start-offsets", '{"events:0": 5}', "--rate-limit", "50",
                         "--max-rows-per-epoch", "100", "--transform", "SELECT key FROM {source}")
    assert (code, err) == (0, ""), err
    assert 'created job "orders-copy"' in out
    spec = live_api.registry.get("orders-copy").spec
    assert spec.start.offsets == {"events:0": 5} and spec.rate_limit == 50 and spec.max_rows_per_epoch == 100
    assert spec.transform == "SELECT key FROM {source}"

    code, _, _ = run("jobs", "create", "ts", "--source", "orders", "--sink", "/t/ts",
                     "--start-timestamp", "1700")
    assert code == 0
    assert live_api.registry.get("ts").spec.start.timestamp_ms == 1700

    code, out, _ = run("jobs", "list")
    lines = out.splitlines()
    assert code == 0 and lines[0].split()[:3] == ["NAME", "SOURCE", "STATUS"]
    assert [line.split()[0] for line in lines[1:]] == ["orders-copy", "ts"]

    assert run("jobs", "pause", "orders-copy")[1].startswith('paused job "orders-copy"')
    assert live_api.registry.get("orders-copy").paused
    assert run("jobs", "resume", "orders-copy")[0] == 0
    assert not live_api.registry.get("orders-copy").paused
    assert "to 0 rows/s" in run("jobs", "throttle", "orders-copy", "0")[1]
    assert live_api.registry.get("orders-copy").rate_limit == 0
    assert "to unlimited" in run("jobs", "throttle", "orders-copy", "none")[1]
    assert live_api.registry.get("orders-copy").rate_limit is None

    code, out, _ = run("jobs", "show", "orders-copy")
    assert code == 0 and out.startswith("orders-copy  pending") and '"events:0": 5' in out
    code, out, _ = run("jobs", "show", "orders-copy", "--json")
    assert code == 0 and '"sink_path": "/t/oc"' in out

    assert run("jobs", "drop", "ts")[0] == 0
    assert live_api.registry.get("ts").dropped


def test_api_errors_are_one_line_with_exit_1(run, live_api, monkeypatch) -> None:
    run("jobs", "create", "a", "--source", "events", "--sink", "/t/a")
    create_b = ("jobs", "create", "b", "--source", "events", "--sink", "/t/b")
    cases = [
        (("jobs", "create", "a", "--source", "events", "--sink", "/t/a"), 'job "a" already exists', "409"),
        (("jobs", "create", "c", "--source", "nope", "--sink", "/t"), "unknown source", "field source"),
        ((*create_b, "--rate-limit", "-1"), "greater than", "field rate_limit"),
        ((*create_b, "--transform", "DROP x"), "SELECT", "field transform"),
        (("jobs", "show", "ghost"), 'job "ghost" not found', "404"),
        (("jobs", "throttle", "a", "-3"), "greater than or equal to 0", "field rate_limit"),
        (("status", "ghost"), "not found", "404"),
    ]
    for argv, text, where in cases:
        code, out, err = run(*argv)
        assert code == 1, (argv, out, err)
        assert err.startswith("error: ") and err.count("\n") == 1, err
        assert text in err and where in err, err

    monkeypatch.delenv(cli.ENV_TOKEN)
    code, _, err = run("jobs", "pause", "a")
    assert code == 1 and "missing bearer token (HTTP 401 unauthorized)" in err
    code, _, err = run("jobs", "pause", "a", "--token", "wrong")
    assert code == 1 and "HTTP 401" in err
    assert run("jobs", "list")[0] == 0  # reads need no token
    assert run("--token", TOKEN, "jobs", "pause", "a")[0] == 0


def test_the_token_can_come_from_a_file(run, live_api, monkeypatch, tmp_path) -> None:
    monkeypatch.delenv(cli.ENV_TOKEN)
    secret = tmp_path / "token"
    secret.write_text(TOKEN + "\n")
    create = ("jobs", "create", "f", "--source", "events", "--sink", "/t/f")
    assert run(*create, "--token-file", str(secret))[0] == 0
    monkeypatch.setenv(cli.ENV_TOKEN_FILE, str(secret))
    assert run("jobs", "pause", "f")[0] == 0
    code, _, err = run("jobs", "resume", "f", "--token-file", str(tmp_path / "missing"))
    assert code == 2 and "missing cannot be read" in err and TOKEN not in err


def test_unreachable_api(run) -> None:
    code, _, err = run("--api", "http://127.0.0.1:9", "jobs", "list")
    assert code == 1 and err.startswith("error: cannot reach the API at http://127.0.0.1:9")


@pytest.mark.parametrize(
    "argv",
    [
        (),
        ("jobs",),
        ("bogus",),
        ("jobs", "create", "a", "--sink", "/t"),
        ("jobs", "create", "a", "--source", "events", "--sink", "/t", "--start-offsets", "not-json"),
        ("jobs", "create", "a", "--source", "events", "--sink", "/t", "--start-offsets", "[1]"),
        ("jobs", "create", "a", "--source", "events", "--sink", "/t", "--start-timestamp", "soon"),
        ("jobs", "create", "a", "--source", "events", "--sink", "/t", "--start-offsets", '{"t:0": 1}',
         "--start-timestamp", "5"),
        ("jobs", "throttle", "a", "fast"),
        ("status", "--watch", "x"),
        ("status", "--watch", "0"),
        ("run",),
    ],
)
def test_usage_errors_exit_2(run, live_api, argv) -> None:
    code, _, err = run(*argv)
    assert code == 2 and err
    assert live_api.registry.list() == []


def test_help_shows_env_twins(run) -> None:
    code, out, _ = run("--help")
    assert code == 0
    out = " ".join(out.split())  # argparse wraps lines
    assert "[env: SOURCE_BACKFILL_API_URL]" in out
    assert "SOURCE_BACKFILL_API_TOKEN]" in out
    assert TOKEN not in out


def test_status_bars(run, live_api) -> None:
    run("jobs", "create", "p", "--source", "events", "--sink", "/t/p")
    run("jobs", "create", "q", "--source", "events", "--sink", "/t/q")
    live_api.registry.publish_progress("p", _progress())
    code, out, _ = run("status", "p")
    assert code == 0
    lines = out.splitlines()
    assert lines[0].startswith("p  backfilling  epoch 9  splits 0/3 finished  history 5300 rows")
    assert "eta 4s" in lines[0]
    assert lines[1] == "  events:0   [##########----------]  52.0%  5200/10000  backfilling"
    assert lines[2] == "  events:1   [####################] 100.0%  100/100  source_caching_up"
    assert lines[3] == "  events:10  [--------------------]     ?%  ?/?  backfilling"
    code, out, _ = run("status")
    assert code == 0 and "p  backfilling" in out and "q  pending" in out


def test_status_watch_until_finished(run, live_api, monkeypatch) -> None:
    run("jobs", "create", "w", "--source", "events", "--sink", "/t/w")
    live_api.registry.publish_progress("w", _progress())
    # the job finishes once the watch has read it unfinished (a condition, not a margin: a busy machine
    # may poll later than any sleep)
    read_unfinished = threading.Event()
    progress = live_api.registry.progress

    def progress_seen(name: str) -> Any:
        out = progress(name)
        if name == "w" and out is not None and not read_unfinished.is_set():
            read_unfinished.set()
        return out

    monkeypatch.setattr(live_api.registry, "progress", progress_seen)

    def finish_later() -> None:
        assert read_unfinished.wait(30)
        live_api.registry.publish_progress("w", _progress(finished=True))

    t = threading.Thread(target=finish_later)
    t.start()
    started = time.monotonic()
    code, out, _ = run("status", "w", "--watch", "0.1", "--until-finished")
    t.join()
    assert code == 0 and time.monotonic() - started < 60
    frames = [f for f in out.split("\n\n") if f.strip()]
    assert len(frames) >= 2
    assert "52.0%  5200/10000  backfilling" in frames[0]
    assert "events:0   [####################] 100.0%  10000/10000  finished" in frames[-1]
    assert "w  finished  epoch 9  splits 1/3 finished" in frames[-1]


def test_run_loads_the_config_and_calls_the_daemon(run, tmp_path, monkeypatch) -> None:
    seen = {}
    fake = types.ModuleType("source_backfill.daemon")
    fake.run_daemon = lambda settings: seen.setdefault("settings", settings) and 0
    monkeypatch.setitem(sys.modules, "source_backfill.daemon", fake)
    config = tmp_path / "daemon.toml"
    config.write_text('[[sources]]\nname = "events"\ntopics = ["t"]\n\n'
                      '[[jobs]]\nname = "j"\nsource = "events"\nsink_path = "/t/j"\n')
    assert run("run", "--config", str(config))[0] == 0
    assert [j.name for j in seen["settings"].jobs] == ["j"]
    code, _, err = run("run", "--config", str(tmp_path / "missing.toml"))
    assert code == 2 and "config file not found" in err


def test_run_with_a_damaged_mutation_log_says_where_in_one_line(run, tmp_path) -> None:
    state = tmp_path / "daemon-state"
    state.mkdir()
    good = ('{"v":1,"type":"mutation","id":1,"kind":"pause","job":"orders-1","source":"events",'
            '"at":"2024-01-01T00:00:00+00:00"}')
    (state / "mutations.jsonl").write_text('{"v":1,"type":"mutation","id":1,"kind":"cre\n' + good + "\n")
    config = tmp_path / "daemon.toml"
    config.write_text(f'[daemon]\nstate_root = "{state}"\n\n[[sources]]\nname = "events"\ntopics = ["t"]\n')
    code, _, err = run("run", "--config", str(config))
    assert code == 1
    assert err.startswith("error: the daemon did not start: ") and err.count("\n") == 1, err
    assert f"{state / 'mutations.jsonl'}:1: malformed mutation log line" in err
    assert "Remove or fix that line" in err


def test_console_script(live_api) -> None:
    exe = ROOT / ".venv" / "bin" / "source-backfill"
    if not exe.exists():
        pytest.skip("console script not installed")
    argv = [str(exe), "--api", live_api.url, "--token", TOKEN, "jobs", "create", "sub", "--source", "events",
            "--sink", "/t/sub"]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    r = subprocess.run([str(exe), "--api", live_api.url, "status", "sub"], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0 and r.stdout.startswith("sub  pending"), r.stderr


@pytest.mark.parametrize(
    ("split", "line"),
    [
        ({"split": "topic:0", "stage": "backfilling", "backfilled_offset": 5199, "target_offset": 9999},
         "topic:0  [#####-----]  52.0%  5200/10000  backfilling"),
        ({"split": "topic:0", "stage": "backfilling", "backfilled_offset": None, "target_offset": 9},
         "topic:0  [----------]   0.0%  0/10  backfilling"),
        ({"split": "topic:0", "stage": "finished", "backfilled_offset": 3, "target_offset": 9},
         "topic:0  [##########] 100.0%  10/10  finished"),
        ({"split": "topic:0", "stage": "finished", "backfilled_offset": None, "target_offset": None},
         "topic:0  [##########] 100.0%  -  finished"),
        # copied by a read ahead, its commit waiting for an epoch: counted, drawn apart
        ({"split": "topic:0", "stage": "backfilling", "backfilled_offset": 1999, "read_ahead_offset": 5199,
          "target_offset": 9999}, "topic:0  [##===-----]  52.0%  5200/10000  backfilling"),
        ({"split": "topic:0", "stage": "backfilling", "backfilled_offset": None, "read_ahead_offset": 4,
          "target_offset": 9}, "topic:0  [=====-----]  50.0%  5/10  backfilling"),
    ],
)
def test_split_bar(split, line) -> None:
    assert cli.split_bar(split, width=10) == line


def test_table_bar_and_create_options_of_a_table_job() -> None:
    table = {"strategy": "snapshot", "phase": "consuming_snapshot", "vnodes_completed": 128,
             "vnodes_total": 256, "lag_versions": 4}
    assert cli.table_bar(table, width=10) == (
        "snapshot  [#####-----]  50.0%  vnodes 128/256  consuming_snapshot  lag 4 versions")
    rendered = cli.render_jobs([{"name": "t", "status": "backfilling", "epoch": 3, "table": table}])
    assert rendered.splitlines()[1] == "  " + cli.table_bar(table)
    by_files = table | {"progress": 0.3, "rows_copied": 6_000, "rows_total": 20_000, "files_copied": 3,
                        "files_total": 10}
    assert cli.table_bar(by_files, width=10) == (
        "snapshot  [###-------]  30.0%  rows 6000/20000  files 3/10  consuming_snapshot  lag 4 versions")
    # a strategy the daemon does not have is a usage error, refused before any request
    assert cli.main(["jobs", "create", "t", "--source", "s", "--sink", "/x", "--strategy", "sideways"]) == 2


def test_a_relative_sink_is_resolved_against_the_cli_s_directory(run, live_api, tmp_path,
                                                                 monkeypatch) -> None:
    here = tmp_path / "elsewhere"
    here.mkdir()
    monkeypatch.chdir(here)  # not the daemon's (this process's original) working directory
    code, out, err = run("jobs", "create", "rel", "--source", "events", "--sink", "out/rel")
    assert code == 0, err
    assert live_api.registry.get("rel").spec.sink_path == str(here / "out" / "rel")
    assert str(here / "out" / "rel") in out


def test_a_dry_run_prints_the_plan_and_creates_nothing(run, live_api) -> None:
    code, out, err = run("jobs", "create", "dry", "--source", "events", "--sink", "/t/dry", "--dry-run")
    assert code == 0, err
    assert out.startswith('dry run: job "dry" on source "events" -> /t/dry: every check passed; nothing')
    assert "at the rate limit: none (unlimited)" in out
    assert live_api.registry.list() == []
    code, _, err = run("jobs", "create", "dry", "--source", "nope", "--sink", "/t/dry", "--dry-run")
    assert code == 1 and "unknown source" in err


def test_a_transform_changed_and_a_repair_accepted_waited_for_and_shown(run, live_api, monkeypatch) -> None:
    monkeypatch.setattr(cli, "VERIFY_POLL_S", 0.05)
    run("jobs", "create", "r", "--source", "events", "--sink", "/t/r")
    code, out, err = run("jobs", "transform", "r", "SELECT value FROM {source}")
    assert (code, err) == (0, ""), err
    assert out.startswith('re-transformed job "r" to SELECT value FROM {source}')
    assert live_api.registry.get("r").spec.transform == "SELECT value FROM {source}"
    assert "to identity" in run("jobs", "transform", "r", "identity")[1]
    assert live_api.registry.get("r").spec.transform is None
    code, _, err = run("jobs", "transform", "r", "DROP TABLE x")
    assert code == 1 and "SELECT" in err

    code, out, _ = run("jobs", "repair", "r", "--split", "events:0", "--offsets", "5", "9")
    assert code == 0 and "accepted" in out
    first = live_api.registry.repair_views("r")[0]
    assert first["state"] == "pending" and first["window"]["splits"] == ["events:0"]
    assert "repair {} pending: events:0 [5, 9)".format(first["id"]) in run("jobs", "show", "r")[1]

    def finish() -> None:  # what the epoch loop publishes once the repair ran
        while not [v for v in live_api.registry.repair_views("r") if v["id"] > first["id"]]:
            time.sleep(0.02)
        later = max(v["id"] for v in live_api.registry.repair_views("r"))
        live_api.registry.publish_repair("r", {"id": later, "state": "done", "window": {},
                                               "ranges": {"events:1": [0, 4]}, "rows_removed": 4,
                                               "rows_added": 4, "version": 7})

    helper = threading.Thread(target=finish)
    helper.start()
    code, out, _ = run("jobs", "repair", "r", "--split", "events:1", "--offsets", "0", "4", "--wait")
    helper.join(10)
    assert code == 0 and "done: events:1 [0, 4) 4 rows removed, 4 added (version 7)" in out, out
    code, _, err = run("jobs", "repair", "r", "--offsets", "4", "4")
    assert code == 1 and "empty" in err
    code, _, err = run("jobs", "repair", "r", "--offsets", "1", "2", "--timestamps", "1", "2")
    assert code == 2


def test_namespaces_and_the_audit_from_the_cli(run, live_api) -> None:
    code, out, err = run("jobs", "create", "orders", "--namespace", "team-a", "--source", "events",
                         "--sink", "/t/team-a/orders")  # named team-a.orders
    assert (code, err) == (0, ""), err
    assert live_api.registry.get("team-a.orders").spec.namespace == "team-a"
    assert run("jobs", "create", "plain", "--source", "events", "--sink", "/t/plain")[0] == 0
    code, out, _ = run("jobs", "list", "--namespace", "team-a", "--json")
    assert code == 0 and [j["name"] for j in json.loads(out)] == ["team-a.orders"]
    assert run("jobs", "pause", "plain")[0] == 0
    code, out, _ = run("audit", "--job", "plain")
    lines = out.strip().splitlines()
    assert code == 0 and len(lines) == 2, out  # the legacy token is the admin principal
    assert "  admin  create  plain" in lines[0] and "  admin  pause  plain" in lines[1], out
    code, out, _ = run("audit", "--limit", "1", "--json")
    assert code == 0 and [r["kind"] for r in json.loads(out)] == ["pause"]
    assert run("jobs", "pause", "plain", "--token", "not-the-token-" + "x" * 20)[0] != 0  # refused: 401
    code, out, _ = run("audit", "--refused")
    assert code == 0 and "  401  -  POST /jobs/plain/pause  " in out, out
