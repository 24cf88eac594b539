"""``source-backfill verify`` and the dry run against a real daemon process (its own Spark JVM), a real
broker and real Delta tables: the checks users run on their own jobs."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from source_backfill import cli
from source_backfill.testing import RunningDaemon

pytestmark = pytest.mark.integration

#: The checkout these tests belong to: the daemon process runs its code (not an editable install's).
ROOT = Path(__file__).resolve().parents[3]


def _produce(bootstrap: str, topic: str, records: int, partitions: int = 2, size: int = 20) -> None:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20})
    pad = "x" * max(0, size - 8)
    for i in range(records):
        while True:
            try:
                producer.produce(topic, value=f"v{i:07d}{pad}".encode(), partition=i % partitions)
                break
            except BufferError:
                producer.poll(0.1)
    assert producer.flush(60) == 0


@pytest.fixture(scope="module")
def topic(kafka_admin, kafka_bootstrap) -> str:
    name = f"verify-{uuid.uuid4().hex[:8]}"
    kafka_admin.create_topic(name, 2)
    _produce(kafka_bootstrap, name, 3000)
    return name


#: Records of the topic the dry-run estimates are checked on: the rate-limited job copies them in ~25 s.
PLAN_RECORDS, PLAN_RATE = 50_000, 2000.0
#: Records of the topic the measured history rate is taken on (a job without a limit copies it in seconds).
BIG_RECORDS = 1_500_000


@pytest.fixture(scope="module")
def plan_topics(kafka_admin, kafka_bootstrap) -> tuple[str, str]:
    small, big = f"plan-{uuid.uuid4().hex[:8]}", f"big-{uuid.uuid4().hex[:8]}"
    kafka_admin.create_topic(small, 2)
    kafka_admin.create_topic(big, 2)
    _produce(kafka_bootstrap, small, PLAN_RECORDS)
    _produce(kafka_bootstrap, big, BIG_RECORDS)
    return small, big


@pytest.fixture(scope="module")
def daemon(tmp_path_factory, kafka_bootstrap, topic, plan_topics) -> Iterator[RunningDaemon]:
    work = tmp_path_factory.mktemp("verify-daemon")
    sources = [{"name": "src", "topics": [topic]}, {"name": "plan", "topics": [plan_topics[0]]},
               {"name": "big", "topics": [plan_topics[1]]}]
    d = RunningDaemon(work, kafka_bootstrap, sources, [], {})
    assert d.env is not None
    d.env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    d.start()
    try:
        d.wait_ready(240)
        yield d
    finally:
        d.stop()


def _cli(daemon: RunningDaemon, capsys, *argv: str) -> tuple[int, str, str]:
    code = cli.main(["--api", daemon.url, *argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_verify_passes_on_the_job_s_table_and_fails_once_a_row_is_removed_and_one_duplicated(
    daemon, topic, kafka_bootstrap, capsys
):
    import pyarrow.dataset as ds
    from deltalake import DeltaTable, write_deltalake

    daemon.create_job(name="late-copy", source="src")
    daemon.wait_finished("late-copy", 240)
    _produce(kafka_bootstrap, topic, 200)  # live records the job may not have committed yet: not missing
    code, out, err = _cli(daemon, capsys, "verify", "late-copy")
    assert code == 0, err
    line = out.strip()
    assert line.startswith("late-copy: exactly once, ") and line.endswith(" records, 0 missing, 0 duplicated")
    assert int(line.split(", ")[1].split()[0]) >= 3000

    table = str(daemon.tables / "late-copy")  # one row removed, another written twice (not by the job)
    DeltaTable(table).delete("`partition` = 0 AND `offset` = 5")
    dup = DeltaTable(table).to_pyarrow_dataset().to_table(
        filter=(ds.field("partition") == 1) & (ds.field("offset") == 7))
    assert dup.num_rows == 1
    write_deltalake(table, dup, mode="append")
    code, out, _ = _cli(daemon, capsys, "verify", "late-copy")
    assert code == cli.EXIT_DIFFERS, out
    assert "NOT exactly once" in out and "1 missing, 1 duplicated" in out
    assert f"{topic}:0" in out and "missing [5]" in out and "duplicated [7]" in out

    # a job whose transform drops the offset columns is refused, saying why
    daemon.create_job(name="values-only", source="src", transform="SELECT value FROM {source}")
    daemon.wait_finished("values-only", 240)
    code, _, err = _cli(daemon, capsys, "verify", "values-only")
    assert code == 1 and "transform drops them" in err, err


def _dry_run(daemon: RunningDaemon, **spec) -> dict:
    r = daemon.request("POST", "/jobs?dry_run=true", daemon._with_sink(spec))  # noqa: SLF001
    assert r is not None and r.status_code == 200, None if r is None else r.text
    return r.json()


def _backfill_seconds(daemon: RunningDaemon, **spec) -> float:
    """Create the job and time it from the create to ``finished`` (polled every 0.1 s)."""
    import time

    daemon.create_job(**spec)
    started = time.monotonic()
    while True:
        job = daemon.job(spec["name"])
        if job["status"] == "finished":
            return time.monotonic() - started
        assert job["status"] != "failed", job.get("error")
        assert time.monotonic() - started < 300, job
        time.sleep(0.1)


def test_a_dry_run_changes_nothing_and_plans_the_copy(daemon, capsys):
    state = daemon.tables.parent / "state" / "mutations.jsonl"
    log = state.read_bytes()
    plan = _dry_run(daemon, name="limited", source="plan", rate_limit=PLAN_RATE)
    assert daemon.request("GET", "/jobs/limited").status_code == 404
    assert state.read_bytes() == log and not (daemon.tables / "limited").exists()
    assert plan["offsets_total"] == PLAN_RECORDS and plan["bytes_total"] is None
    assert plan["seconds_at_rate_limit"] >= PLAN_RECORDS / PLAN_RATE
    assert plan["measured_rows_per_s"] is None and "none" in plan["measured_note"]
    code, out, _ = _cli(daemon, capsys, "jobs", "create", "limited", "--source", "plan", "--sink",
                        str(daemon.tables / "limited"), "--rate-limit", str(PLAN_RATE), "--dry-run")
    assert code == 0 and "at the rate limit: " in out and state.read_bytes() == log


#: The estimates model what the daemon measured (its startup, the source's epoch pace, the fastest unlimited
#: copy), not what the machine will do next: on 2 shared cores at load 15-18 a lone run measured the pace
#: of idle epochs and missed (25 s estimated, 136 s actual before the pace was modelled); in this file's
#: order, after the verify test's jobs: 65.1 s estimated, 63.4 s actual; 15.0 s and 17.5 s without a limit.
def test_the_estimate_at_a_fixed_rate_limit_holds_within_30_percent(daemon):
    # at a fixed rate limit (the startup and the source's epoch pace as measured so far)
    plan = _dry_run(daemon, name="limited", source="plan", rate_limit=PLAN_RATE)
    estimate = plan["seconds_at_rate_limit"]
    actual = _backfill_seconds(daemon, name="limited", source="plan", rate_limit=PLAN_RATE)
    print(f"rate limit {PLAN_RATE:g} rows/s ({plan['rate_limit_rows_per_s']:g} at the epochs' pace), startup "
          f"{plan['startup_s']} s: estimate {estimate:.1f} s, actual {actual:.1f} s")
    assert abs(estimate - actual) <= 0.3 * actual


def test_the_estimate_at_the_measured_history_rate_holds_within_30_percent(daemon):
    # no limit: the history rate measured on a job, the estimate checked on the next; a daemon's first
    # copies pay Spark's warm-up (the first read ahead's Python workers, JIT): one job takes it first
    warm_up = _backfill_seconds(daemon, name="warm-up", source="big")
    first = _backfill_seconds(daemon, name="first", source="big")
    plan = _dry_run(daemon, name="second", source="big")
    estimate = plan["seconds_at_measured_rate"]
    assert plan["rate_limit_rows_per_s"] is None and estimate is not None
    actual = _backfill_seconds(daemon, name="second", source="big")
    print(f"measured {plan['measured_rows_per_s']:,.0f} rows/s (warm-up job {warm_up:.1f} s, first "
          f"{first:.1f} s): estimate {estimate:.1f} s, actual {actual:.1f} s")
    assert abs(estimate - actual) <= 0.3 * actual
