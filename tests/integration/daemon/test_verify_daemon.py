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
from tests.integration.daemon.conftest import wait_for

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


#: Records of the topic the dry run plans (a rate-limited job would copy them in ~25 s).
PLAN_RECORDS, PLAN_RATE = 50_000, 2000.0


@pytest.fixture(scope="module")
def plan_topic(kafka_admin, kafka_bootstrap) -> str:
    name = f"plan-{uuid.uuid4().hex[:8]}"
    kafka_admin.create_topic(name, 2)
    _produce(kafka_bootstrap, name, PLAN_RECORDS)
    return name


@pytest.fixture(scope="module")
def daemon(tmp_path_factory, kafka_bootstrap, topic, plan_topic) -> Iterator[RunningDaemon]:
    work = tmp_path_factory.mktemp("verify-daemon")
    sources = [{"name": "src", "topics": [topic]}, {"name": "plan", "topics": [plan_topic]}]
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

    # one row removed, another written twice (not by the job), once the job has committed every record:
    # an edit beside one of its live commits fails in delta-rs (CommitFailedError, seen once)
    table = str(daemon.tables / "late-copy")
    wait_for(lambda: DeltaTable(table).to_pyarrow_dataset().count_rows() == 3200,
             what="the live records committed")
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


# How close the dry run's estimates come to the actual backfill time is a timing: a benchmark
# (bench/bench_dry_run.py, keys dry_run.*), not a test.
