"""End-to-end source backfill: a live shared source, jobs attached mid-stream, exactly once into Delta.

Every test checks the sink against the Kafka log offset by offset (``source_backfill.verify``): each
offset of every partition exactly once, nothing else.
"""

from __future__ import annotations

import time

import pytest

from connectors.delta.maintenance import MARKER, STAGING
from source_backfill.core import Stage
from source_backfill.verify import table_offsets
from tests.integration.daemon.conftest import (
    exactly_once,
    finished,
    job_of,
    job_spec,
    metric_total,
    wait_for,
)

pytestmark = pytest.mark.integration


def _splits(daemon, name):
    return job_of(daemon, name).states


def _reads_ahead(job: str, outcome: str) -> float:
    from source_backfill import metrics

    return metric_total(metrics.HISTORY_READS_AHEAD, job=job, outcome=outcome)


@pytest.mark.parametrize("read_ahead", [True, False], ids=["read-ahead", "in-epoch"])
def test_job_attached_to_history_while_producer_writes_is_exactly_once(
    daemon_factory, new_topic, producer_for, kafka_bootstrap, tmp_path, read_ahead
):
    topic = new_topic(4)
    p = producer_for(topic)
    p.send(4000, 4, weights=[5, 3, 1, 1])  # uneven history per partition
    p.stream(4, per_second=200)
    name = f"j-{read_ahead}"
    before = _reads_ahead(name, "adopted")
    d = daemon_factory([topic], [job_spec(name, tmp_path, max_rows_per_epoch=1500, read_ahead=read_ahead)])
    wait_for(lambda: finished(d, name), what=f"job {name} finished")
    assert all(s.stage is Stage.FINISHED for s in _splits(d, name).values())
    # history read ahead by background jobs (one read per 1500 offsets at most), or inside the epochs
    adopted = _reads_ahead(name, "adopted") - before
    assert adopted >= 2 if read_ahead else adopted == 0
    p.stop()
    report = exactly_once(tmp_path / name, kafka_bootstrap, [topic])
    assert sum(s.log_records for s in report.splits.values()) >= 4000


def test_job_created_before_any_data_is_finished_at_once_and_live_data_flows(
    daemon_factory, new_topic, producer_for, kafka_bootstrap, tmp_path
):
    topic = new_topic(3)
    d = daemon_factory([topic], [job_spec("j", tmp_path)])
    wait_for(lambda: _splits(d, "j") is not None, what="attach")
    assert all(s.stage is Stage.FINISHED for s in _splits(d, "j").values())
    assert job_of(d, "j").rows[0] == 0  # no history to read
    producer_for(topic).send(300, 3)
    exactly_once(tmp_path / "j", kafka_bootstrap, [topic])


@pytest.mark.parametrize("connector", ["spark", "python"])
def test_job_created_after_data_with_no_further_live_data_finishes(
    daemon_factory, new_topic, producer_for, kafka_bootstrap, tmp_path, connector
):
    topic = new_topic(4)
    producer_for(topic).send(2000, 4, weights=[1, 2, 3, 4])
    d = daemon_factory([topic], [job_spec("j", tmp_path, max_rows_per_epoch=700)], connector=connector)
    wait_for(lambda: finished(d, "j"), what="finish without new records")
    exactly_once(tmp_path / "j", kafka_bootstrap, [topic])
    assert job_of(d, "j").rows == (2000, 0)
    # the cap holds per epoch: history adopted from reads ahead and read in the epoch together
    per_epoch = _history_offsets_per_commit(tmp_path / "j")
    assert sum(per_epoch) == 2000 and max(per_epoch) <= 700, per_epoch


def _record_reads(monkeypatch, then=None):
    """Offsets of each read ahead as it starts (``then()`` runs right after, before it can be adopted)."""
    from source_backfill.executors.read_ahead import ReadsAhead

    started: list[int] = []
    real = ReadsAhead.start

    def start(self, ranges, stage, done, **kw):
        started.append(sum(r.size for r in ranges))
        if then is not None:
            then()
        return real(self, ranges, stage, done, **kw)

    monkeypatch.setattr(ReadsAhead, "start", start)
    return started


def test_a_read_ahead_that_would_leave_a_tail_one_epoch_reads_takes_it_too(
    daemon_factory, new_topic, producer_for, kafka_bootstrap, tmp_path, monkeypatch
):
    from source_backfill.core import budget

    # 3,000 offsets: a read ahead of 2,500 would leave 500, which an epoch's own budget (1,000) reads; the
    # read takes them, and the epoch that adopts it finishes the job without a Spark read of its own
    monkeypatch.setattr(budget, "FIRST_EPOCH_BUDGET", 1000)
    monkeypatch.setattr(budget, "FIRST_READ_AHEAD", 2500)
    started = _record_reads(monkeypatch)
    topic = new_topic(4)
    producer_for(topic).send(3000, 4)
    d = daemon_factory([topic], [job_spec("whole", tmp_path)])
    wait_for(lambda: finished(d, "whole"), what="finished")
    exactly_once(tmp_path / "whole", kafka_bootstrap, [topic])
    assert started == [3000]
    assert _history_offsets_per_commit(tmp_path / "whole") == [3000]


def test_the_epoch_that_adopts_the_last_read_ahead_reads_the_tail_and_finishes(
    daemon_factory, new_topic, producer_for, kafka_bootstrap, tmp_path, monkeypatch
):
    from source_backfill.core import budget

    # 3,000 offsets: when the read ahead (2,500) starts, the 500 after it do not fit an epoch's own budget
    # (400), so the read leaves them; by its adoption the budget is 1,000: the adopting epoch reads them
    # itself, though what it adopted is more than that budget (the caps hold for adopted offsets, the
    # adaptive share only for what the epoch reads)
    monkeypatch.setattr(budget, "FIRST_EPOCH_BUDGET", 400)
    monkeypatch.setattr(budget, "FIRST_READ_AHEAD", 2500)
    started = _record_reads(monkeypatch, then=lambda: setattr(budget, "FIRST_EPOCH_BUDGET", 1000))
    topic = new_topic(4)
    producer_for(topic).send(3000, 4)
    before = _reads_ahead("tail", "adopted")
    d = daemon_factory([topic], [job_spec("tail", tmp_path)])
    wait_for(lambda: finished(d, "tail"), what="finished")
    exactly_once(tmp_path / "tail", kafka_bootstrap, [topic])
    assert started == [2500] and _reads_ahead("tail", "adopted") - before == 1
    # the adopting epoch read the tail itself: one commit holds all the history, none an interval later
    assert _history_offsets_per_commit(tmp_path / "tail") == [3000]


def test_a_job_created_between_epochs_reads_its_history_before_the_epoch_that_attaches_it(
    daemon_factory, new_topic, producer_for, kafka_bootstrap, tmp_path, monkeypatch
):
    from source_backfill.config import JobSpec
    from source_backfill.core import budget

    # 3,000 offsets, more than an epoch's own budget (400): read ahead, in one read (FIRST_READ_AHEAD)
    monkeypatch.setattr(budget, "FIRST_EPOCH_BUDGET", 400)
    monkeypatch.setattr(budget, "FIRST_READ_AHEAD", 5000)
    topic = new_topic(4)
    producer_for(topic).send(3000, 4)
    d = daemon_factory([topic], trigger_interval_s=3.0)  # 3 s between epochs: the read has time to end
    source = d.sources["src"]
    wait_for(lambda: source.last_epoch is not None and source.last_epoch >= 1, what="the source's epochs")
    attached: list[bool] = []
    started = _record_reads(monkeypatch, then=lambda: attached.append("early" in source.jobs))
    epoch = source.last_epoch
    wait_for(lambda: source.last_epoch != epoch, interval=0.02, what="an epoch")  # just after it
    d.registry.create(JobSpec(name="early", source="src", sink_path=str(tmp_path / "early")))
    wait_for(lambda: finished(d, "early"), what="finished")
    exactly_once(tmp_path / "early", kafka_bootstrap, [topic])
    # the read started before the job was attached (it was not one of the source's jobs yet) ...
    assert started == [3000] and attached == [False]
    # ... so the epoch that attached it adopted the whole history: its first commit finished it
    first, *_ = _history_per_epoch(tmp_path / "early")
    assert first[1] == 3000 and len(_history_offsets_per_commit(tmp_path / "early")) == 1
    assert min(e for e, _ in _history_per_epoch(tmp_path / "early")) == first[0]


@pytest.mark.slow  # ~12 s; make test keeps its margin under 20 min (make test-slow and CI run it)
def test_a_job_built_early_then_dropped_or_left_at_stop_leaves_no_staged_files(
    daemon_factory, new_topic, producer_for, tmp_path, monkeypatch
):
    from source_backfill.config import JobSpec
    from source_backfill.core import budget

    monkeypatch.setattr(budget, "FIRST_EPOCH_BUDGET", 400)
    topic = new_topic(4)
    producer_for(topic).send(3000, 4)
    d = daemon_factory([topic], trigger_interval_s=3.0)
    source = d.sources["src"]
    wait_for(lambda: source.last_epoch is not None and source.last_epoch >= 1, what="the source's epochs")
    started = _record_reads(monkeypatch)
    epoch = source.last_epoch
    wait_for(lambda: source.last_epoch != epoch, interval=0.02, what="an epoch")
    # dropped before the epoch that applies its create: that epoch takes the job built early, then drops it
    d.registry.create(JobSpec(name="gone", source="src", sink_path=str(tmp_path / "gone")))
    wait_for(lambda: started, interval=0.02, what="the early read")
    d.registry.drop("gone")
    wait_for(lambda: source.last_epoch >= epoch + 2, what="two epochs")
    assert "gone" not in source.jobs
    assert not list((tmp_path / "gone" / STAGING).glob(f"*/{MARKER}"))  # its read ahead thrown away
    # built early and still waiting for its epoch when the daemon stops: closed, its staged files removed
    epoch = source.last_epoch
    wait_for(lambda: source.last_epoch != epoch, interval=0.02, what="an epoch")
    d.registry.create(JobSpec(name="left", source="src", sink_path=str(tmp_path / "left")))
    wait_for(lambda: len(started) == 2, interval=0.02, what="the early read")
    d.stop()
    assert "left" not in source.jobs
    assert not list((tmp_path / "left" / STAGING).glob(f"*/{MARKER}"))


def _history_per_epoch(table):
    """``(epoch, history offsets)`` of each commit of a job's table, oldest first."""
    import json

    from deltalake import DeltaTable

    from connectors.delta.log import KEY_EPOCH, KEY_PLAN

    out = []
    for commit in reversed(DeltaTable(str(table)).history()):
        if commit.get(KEY_EPOCH) is None:
            continue
        plan = commit.get(KEY_PLAN)
        history = sum(end - start for _, start, end in json.loads(plan)["history"]) if plan else 0
        out.append((int(commit[KEY_EPOCH]), history))
    return out


def _history_offsets_per_commit(table):
    """Offsets of history each commit of a job's table took (its plan's ranges)."""
    import json

    from deltalake import DeltaTable

    from connectors.delta.log import KEY_PLAN

    sizes = []
    for commit in DeltaTable(str(table)).history():
        plan = commit.get(KEY_PLAN)
        if plan:
            sizes.append(sum(end - start for _, start, end in json.loads(plan)["history"]))
    return [n for n in sizes if n]


def test_second_job_created_later_sees_the_same_rows(
    daemon_factory, new_topic, producer_for, kafka_bootstrap, tmp_path
):
    from source_backfill.config import JobSpec

    topic = new_topic(2)
    p = producer_for(topic)
    p.send(1500, 2)
    p.stream(2, per_second=100)
    d = daemon_factory([topic], [job_spec("first", tmp_path)])
    wait_for(lambda: finished(d, "first"), what="first finished")
    d.registry.create(JobSpec(**job_spec("second", tmp_path, max_rows_per_epoch=500)))
    wait_for(lambda: finished(d, "second"), what="second finished")
    p.stop()
    first = exactly_once(tmp_path / "first", kafka_bootstrap, [topic])
    second = exactly_once(tmp_path / "second", kafka_bootstrap, [topic])
    assert {k: v.log_records for k, v in first.splits.items()} == {
        k: v.log_records for k, v in second.splits.items()
    }
    assert table_offsets(str(tmp_path / "first")).keys() == table_offsets(str(tmp_path / "second")).keys()


def test_rate_limit_zero_reads_no_history_commits_nothing_then_raised_loses_nothing(
    daemon_factory, new_topic, producer_for, kafka_bootstrap, tmp_path
):
    """At rate 0 under a live stream only the job's targets move: it processes its epochs and commits
    none after its first (the targets are kept in memory); restarted, it rejoins from that commit, and
    once throttled up its table holds the log exactly once."""
    from deltalake import DeltaTable

    topic = new_topic(2)
    p = producer_for(topic)
    p.send(1000, 2)
    p.stream(2, per_second=50)
    state = tmp_path / "state"
    d = daemon_factory([topic], [job_spec("j", tmp_path, rate_limit=0)], state_root=state)
    wait_for(lambda: job_of(d, "j").committed_epoch is not None, what="the job's first commit")
    first = job_of(d, "j").committed_epoch
    version = DeltaTable(str(tmp_path / "j")).version()
    wait_for(lambda: (job_of(d, "j").processed_epoch or 0) >= first + 6, what="several epochs at rate 0")
    assert job_of(d, "j").committed_epoch == first  # the targets moved, nothing was committed
    assert DeltaTable(str(tmp_path / "j")).version() == version
    assert job_of(d, "j").rows[0] == 0
    assert all(s.stage is Stage.BACKFILLING for s in _splits(d, "j").values())
    targets = {s: st.target_offset for s, st in _splits(d, "j").items()}
    d.stop()  # the table's targets are those of the first commit: a restart rebuilds the rest
    d2 = daemon_factory([topic], [job_spec("j", tmp_path, rate_limit=0)], state_root=state)
    wait_for(lambda: (job_of(d2, "j").processed_epoch or 0) > 0, what="the restarted job's first epoch")
    assert all(st.target_offset >= targets[s] for s, st in _splits(d2, "j").items())  # rejoined
    d2.registry.throttle("j", None)
    wait_for(lambda: finished(d2, "j"), what="finished after the rate limit was raised")
    p.stop()
    exactly_once(tmp_path / "j", kafka_bootstrap, [topic])


def test_pause_and_resume_mid_backfill(daemon_factory, new_topic, producer_for, kafka_bootstrap, tmp_path):
    topic = new_topic(2)
    producer_for(topic).send(4000, 2)
    # the rate limit keeps the backfill going >= 10 s, so the pause lands mid-backfill
    d = daemon_factory([topic], [job_spec("j", tmp_path, max_rows_per_epoch=300, rate_limit=400)])
    wait_for(lambda: job_of(d, "j").rows[0] > 0, what="backfill started")
    d.registry.pause("j")
    wait_for(lambda: job_of(d, "j").paused, what="pause applied")
    rows = job_of(d, "j").rows[0]
    epoch = job_of(d, "j").processed_epoch
    # no live data and no history while paused: the epochs run and, changing nothing, commit nothing
    wait_for(lambda: job_of(d, "j").processed_epoch >= epoch + 4, what="epochs while paused")
    assert job_of(d, "j").rows[0] == rows
    assert not finished(d, "j")
    d.registry.resume("j")
    wait_for(lambda: finished(d, "j"), what="finished after resume")
    exactly_once(tmp_path / "j", kafka_bootstrap, [topic])


def test_partitions_added_mid_backfill(daemon_factory, new_topic, producer_for, kafka_bootstrap, tmp_path):
    """Partitions added to the topic mid-backfill (4 -> 6) are new splits: Finished at once (nothing
    before the job), read by the live stream from offset 0; every record of all six lands exactly once."""
    from connectors.kafka.admin import KafkaAdmin

    topic = new_topic(4)
    p = producer_for(topic)
    p.send(3000, 4)
    # the rate limit keeps the backfill going >= 10 s, past the discovery of the new partitions
    d = daemon_factory([topic], [job_spec("j", tmp_path, max_rows_per_epoch=300, rate_limit=250)])
    wait_for(lambda: job_of(d, "j").rows[0] > 0, what="backfill started")
    KafkaAdmin(kafka_bootstrap).add_partitions(topic, 6)
    p.send(600, 6, start=3000, weights=[0, 0, 0, 0, 1, 1])  # into the new partitions only
    p.stream(6, per_second=60)
    wait_for(lambda: len(_splits(d, "j") or {}) == 6, what="new splits picked up")
    assert not finished(d, "j")  # still backfilling the first four when the new splits arrived
    d.registry.throttle("j", None)  # the new splits are in: the rest need not crawl
    wait_for(lambda: finished(d, "j"), what="finished")
    p.stop()
    report = exactly_once(tmp_path / "j", kafka_bootstrap, [topic])
    assert report.splits[f"{topic}:4"].table_rows >= 300 and report.splits[f"{topic}:5"].table_rows >= 300
    assert min(table_offsets(str(tmp_path / "j"))[f"{topic}:4"]) == 0


def test_transactional_producer_with_aborts_and_a_marker_tail(
    daemon_factory, new_topic, kafka_bootstrap, tmp_path
):
    """Aborted transactions stay in the log under abort markers (offset gaps); read_committed skips them,
    and a log that ends on a commit marker still finishes with no further data."""
    import uuid

    from confluent_kafka import Producer

    from connectors.kafka.admin import KafkaAdmin

    topic = new_topic(2)
    tx = Producer({"bootstrap.servers": kafka_bootstrap, "transactional.id": f"tx-{uuid.uuid4()}"})
    tx.init_transactions(30)
    for round_ in range(6):
        tx.begin_transaction()
        for i in range(50):
            tx.produce(topic, value=f"r{round_}-{i}".encode(), partition=i % 2)
        if round_ % 3 == 1:
            assert tx.flush(30) == 0  # the aborted records reach the log before the abort marker
            tx.abort_transaction(30)
        else:
            tx.commit_transaction(30)  # the log ends on a commit marker
    # 6 transactions of 25 records + 1 marker per partition: the aborted ones keep their offsets
    ends = KafkaAdmin(kafka_bootstrap).end_offsets([f"{topic}:0", f"{topic}:1"])
    assert ends == {f"{topic}:0": 6 * 26, f"{topic}:1": 6 * 26}
    d = daemon_factory([topic], [job_spec("j", tmp_path, max_rows_per_epoch=120)])
    wait_for(lambda: finished(d, "j"), what="finished on a marker tail")
    report = exactly_once(tmp_path / "j", kafka_bootstrap, [topic])
    assert sum(s.table_rows for s in report.splits.values()) == 4 * 50  # aborted rows never appear
    offsets = table_offsets(str(tmp_path / "j"))[f"{topic}:0"]
    assert not set(range(26, 52)) & set(offsets)  # the aborted second transaction is a gap


def test_start_from_timestamp(daemon_factory, new_topic, producer_for, kafka_bootstrap, tmp_path):
    from connectors.kafka.admin import KafkaAdmin

    topic = new_topic(2)
    p = producer_for(topic)
    now = int(time.time() * 1000)
    p.send(400, 2, timestamp_ms=now - 600_000)
    p.send(600, 2, start=400, timestamp_ms=now - 60_000)
    start = {"kind": "timestamp", "timestamp_ms": now - 300_000}
    d = daemon_factory([topic], [job_spec("j", tmp_path, start=start)])
    wait_for(lambda: finished(d, "j"), what="finished")
    admin = KafkaAdmin(kafka_bootstrap)
    first = admin.offsets_for_timestamp([f"{topic}:0", f"{topic}:1"], now - 300_000)
    assert first == {f"{topic}:0": 200, f"{topic}:1": 200}
    report = exactly_once(tmp_path / "j", kafka_bootstrap, [topic], start=first)
    assert sum(s.table_rows for s in report.splits.values()) == 600


def test_restart_mid_backfill_resumes_from_committed_state_exactly_once(
    daemon_factory, new_topic, producer_for, kafka_bootstrap, tmp_path
):
    topic = new_topic(3)
    p = producer_for(topic)
    p.send(3000, 3)
    p.stream(3, per_second=100)
    state = tmp_path / "state"
    # the rate limit keeps the backfill going >= 10 s, so the stop lands mid-backfill
    d = daemon_factory([topic], [job_spec("j", tmp_path, max_rows_per_epoch=250, rate_limit=300)],
                       state_root=state)
    wait_for(lambda: job_of(d, "j").rows[0] >= 700, what="mid-backfill")
    d.stop()
    assert not finished(d, "j")
    # reads ahead in flight were cancelled and their staged files removed: nothing unsealed is left
    assert not list((tmp_path / "j" / STAGING).glob(f"*/{MARKER}"))
    committed = job_of(d, "j").committed_epoch
    d2 = daemon_factory([topic], [job_spec("j", tmp_path, max_rows_per_epoch=250, rate_limit=300)],
                        state_root=state)
    assert job_of(d2, "j").committed_epoch == committed  # recovered from the table's log
    wait_for(lambda: finished(d2, "j"), what="finished after restart")
    p.stop()
    exactly_once(tmp_path / "j", kafka_bootstrap, [topic])


def test_finished_job_keeps_flowing_while_another_backfills(
    daemon_factory, new_topic, producer_for, kafka_bootstrap, tmp_path
):
    from source_backfill.config import JobSpec

    topic = new_topic(2)
    p = producer_for(topic)
    p.stream(2, per_second=100)
    d = daemon_factory([topic], [job_spec("live", tmp_path)])
    wait_for(lambda: finished(d, "live"), what="live job attached")
    p2 = producer_for(topic)
    p2.send(3000, 2)
    d.registry.create(JobSpec(**job_spec("late", tmp_path, max_rows_per_epoch=400)))
    before = job_of(d, "live").rows[1]
    wait_for(lambda: job_of(d, "late") is not None and job_of(d, "late").rows[0] > 0, what="late backfilling")
    wait_for(lambda: job_of(d, "live").rows[1] > before + 100, what="live rows keep flowing")
    wait_for(lambda: finished(d, "late"), what="late finished")
    p.stop()
    for name in ("live", "late"):
        exactly_once(tmp_path / name, kafka_bootstrap, [topic])


@pytest.mark.parametrize("read_ahead", [True, False], ids=["read-ahead", "in-epoch"])
def test_history_read_failures_keep_live_committing_then_backfill_resumes_exactly_once(
    daemon_factory, new_topic, producer_for, kafka_bootstrap, tmp_path, monkeypatch, read_ahead
):
    """A history read that fails while its rows are written (a read ahead's copy, or inside the epoch's
    own write): the epochs commit their live part, the error is counted, history backs off and resumes
    from the committed offsets; nothing lost or doubled."""
    from pyspark.sql import functions as F  # noqa: N812

    from connectors.delta.sink import DeltaEpochSink
    from source_backfill import metrics
    from source_backfill.executors import pacing
    from source_backfill.executors import source_backfill as executor

    monkeypatch.setattr(pacing, "BACKOFF_BASE_S", 0.2)
    # fail reads until three failures were counted: a failing read ahead that is cancelled before it ran
    # (a self-paused or backing-off epoch drops the reads in flight) never reports its error
    if read_ahead:  # the copy's files are written, then the copy fails: they must not reach the table
        original_stage = DeltaEpochSink.stage_files

        def failing_stage(self, write, after_epoch, on_folder=None):
            def write_then_fail(folder):
                write(folder)
                if errors() < before + 3:
                    raise RuntimeError("injected history copy failure")

            return original_stage(self, write_then_fail, after_epoch, on_folder)

        monkeypatch.setattr(DeltaEpochSink, "stage_files", failing_stage)
    else:
        original_read = executor.SourceBackfillJob._read_history

        def failing_read(self, ranges, **kw):
            df, counts, seconds, observation = original_read(self, ranges, **kw)
            if df is not None and errors() < before + 3:
                boom = F.raise_error(F.lit("injected history read failure"))
                df = df.withColumn("offset", F.when(F.col("offset") >= 0, boom).otherwise(F.col("offset")))
            return df, counts, seconds, observation

        monkeypatch.setattr(executor.SourceBackfillJob, "_read_history", failing_read)

    def errors() -> float:
        return sum(s.value for m in metrics.SOURCE_ERRORS.collect() for s in m.samples
                   if s.name.endswith("_total") and s.labels.get("job") == "j")

    failed_before = _reads_ahead("j", "failed")
    before = errors()
    topic = new_topic(2)
    p = producer_for(topic)
    p.send(3000, 2)
    p.stream(2, per_second=100)
    d = daemon_factory([topic], [job_spec("j", tmp_path, max_rows_per_epoch=500, read_ahead=read_ahead)])
    wait_for(lambda: errors() >= before + 3, what="three failed history reads")
    if read_ahead:  # the errors came from the reads ahead, reported by the epochs that took them
        assert _reads_ahead("j", "failed") - failed_before >= 3
    epoch = job_of(d, "j").committed_epoch
    wait_for(lambda: job_of(d, "j").committed_epoch >= epoch + 2, what="epochs keep committing")
    assert job_of(d, "j").failed is None
    wait_for(lambda: finished(d, "j"), what="finished after the failures")
    p.stop()
    exactly_once(tmp_path / "j", kafka_bootstrap, [topic])


@pytest.mark.slow  # ~20 s, a writer that is not the default: make test-slow (issue 46's budget)
def test_a_job_written_by_delta_spark_is_exactly_once(
    daemon_factory, new_topic, producer_for, kafka_bootstrap, tmp_path
):
    """writer = delta-spark: history read inside the epochs, each epoch one delta-spark commit with
    txnAppId/txnVersion and the state in userMetadata; the same table contents as delta-rs gives."""
    topic = new_topic(2)
    p = producer_for(topic)
    p.send(1200, 2)
    p.stream(2, per_second=40)
    d = daemon_factory([topic], [job_spec("j", tmp_path, writer="delta-spark", max_rows_per_epoch=400)])
    wait_for(lambda: finished(d, "j"), what="finished")
    assert not job_of(d, "j").reads_ahead
    p.stop()
    exactly_once(tmp_path / "j", kafka_bootstrap, [topic])
    from deltalake import DeltaTable

    ops = {h.get("operation") for h in DeltaTable(str(tmp_path / "j")).history()}
    assert "WRITE" in ops  # delta-spark's commits (delta-rs would have written only its own)


def test_a_job_with_a_transform_writes_the_transformed_rows_exactly_once(
    daemon_factory, new_topic, producer_for, kafka_bootstrap, tmp_path
):
    from deltalake import DeltaTable

    from connectors.kafka.admin import KafkaAdmin

    topic = new_topic(2)
    p = producer_for(topic)
    p.send(3000, 2)
    p.stream(2, per_second=100)
    sql = "SELECT topic, partition, offset, upper(CAST(value AS STRING)) AS v FROM {source}"
    # "u" keeps no Kafka column: its staged files cannot say what they hold, only the observation can
    only_v = "SELECT upper(CAST(value AS STRING)) AS v FROM {source} WHERE offset >= 0"
    d = daemon_factory([topic], [job_spec("t", tmp_path, transform=sql, max_rows_per_epoch=1000),
                                 job_spec("u", tmp_path, transform=only_v, max_rows_per_epoch=1000)])
    wait_for(lambda: finished(d, "t") and finished(d, "u"), what="the transform jobs finished")
    assert job_of(d, "t").reads_ahead and job_of(d, "u").reads_ahead  # one history path: read ahead
    assert _reads_ahead("t", "adopted") > 0 and _reads_ahead("u", "adopted") > 0
    # the records read are counted before the transform (a fresh topic has no gaps: history holds the
    # offsets up to each split's target)
    states = job_of(d, "u").states
    assert all(s.num_consumed_rows == s.target_offset + 1 for s in states.values()), dict(states)
    assert job_of(d, "u").rows[0] == sum(s.num_consumed_rows for s in states.values()) >= 3000
    p.stop()
    exactly_once(tmp_path / "t", kafka_bootstrap, [topic])
    rows = DeltaTable(str(tmp_path / "t")).to_pyarrow_table()
    assert rows.column_names == ["topic", "partition", "offset", "v"]  # the transform's columns only
    values = rows.column("v").to_pylist()
    assert sum(v.startswith("V") for v in values) == 3000  # history: "v<i>" upper-cased
    assert all(v.startswith(("V", "LIVE")) and v == v.upper() for v in values)  # live: "live<i>"
    end = sum(KafkaAdmin(kafka_bootstrap).end_offsets([f"{topic}:0", f"{topic}:1"]).values())
    wait_for(lambda: DeltaTable(str(tmp_path / "u")).to_pyarrow_table().num_rows == end,
             what="u has every record once")
    u = DeltaTable(str(tmp_path / "u")).to_pyarrow_table().column("v").to_pylist()
    assert sorted(u) == sorted(values)  # the same records, each once, without the Kafka columns


@pytest.mark.slow  # ~23 s: make test-slow (CI), so make test stays < 20 min (19m27s before, 2026-11-27)
def test_max_rows_per_epoch_holds_when_reads_ahead_pile_up_between_epochs(
    daemon_factory, new_topic, producer_for, kafka_bootstrap, tmp_path
):
    # a 2 s trigger: several reads ahead of <= 600 offsets finish between two epochs (up to 4 are
    # staged); each epoch still takes at most 600 offsets of history, the rest wait for the next ones
    topic = new_topic(2)
    producer_for(topic).send(6000, 2)
    d = daemon_factory([topic], [job_spec("j", tmp_path, max_rows_per_epoch=600)], trigger_interval_s=2.0)
    wait_for(lambda: finished(d, "j"), what="finished")
    exactly_once(tmp_path / "j", kafka_bootstrap, [topic])
    per_epoch = _history_offsets_per_commit(tmp_path / "j")
    assert sum(per_epoch) == 6000 and max(per_epoch) <= 600, per_epoch


def test_a_read_ahead_reports_the_rows_it_copied_while_it_runs(
    daemon_factory, new_topic, producer_for, kafka_bootstrap, tmp_path, monkeypatch
):
    # One read ahead copies the whole history (its first size is 1M offsets). Its staged files close
    # every 20k rows, so while it runs the job's progress counts what the closed files hold: the API
    # shows rows read ahead and a split fraction that moves before any epoch has committed history.
    from connectors.delta import staging

    monkeypatch.setattr(staging, "STAGED_FILE_ROWS", 20_000)
    topic = new_topic(1)
    total = 400_000
    producer_for(topic).send(total, 1)
    # one task: the copy of the one partition must outlast a few epochs (progress is published per epoch)
    d = daemon_factory([topic], [job_spec("j", tmp_path)], history_width={"fixed_tasks": 1})
    seen: list[tuple[int, int, int | None]] = []

    def sample() -> bool:
        p = d.registry.progress("j")
        if p is not None and p.splits:
            seen.append((p.rows_history, p.rows_read_ahead, p.splits[0].read_ahead_offset))
        return finished(d, "j")

    wait_for(sample, interval=0.05, what="finished")
    exactly_once(tmp_path / "j", kafka_bootstrap, [topic])
    before_any_commit = [(ahead, last) for history, ahead, last in seen if history == 0 and ahead]
    assert any(0 < ahead < total for ahead, _ in before_any_commit), seen[-20:]
    for ahead, last in before_any_commit:  # the closed files' rows are the offsets up to the last one
        assert last is not None and ahead == last + 1 <= total
