"""Log positions a real broker moves: the log start raised under a running backfill, and a job started
at ``latest`` (ListOffsets earliest / latest / timestamp must be right for both)."""

from __future__ import annotations

import pytest

from source_backfill.core import Stage
from source_backfill.verify import check_exactly_once, table_offsets
from tests.integration.daemon.conftest import finished, job_of, job_spec, metric_total, wait_for

pytestmark = pytest.mark.integration


def _delete_under_backfill(d, admin, topic, cut):
    """Pause the job (its reads in flight are dropped), move each split's log start to ``cut``, resume.

    Returns each split's backfilled position when the log start moved.
    """
    d.registry.pause("j")
    wait_for(lambda: job_of(d, "j").paused, what="pause applied")
    positions = {sid: s.offset for sid, s in job_of(d, "j").states.items()}
    assert all(p is not None and p < cut - 1 for p in positions.values()), positions
    assert admin.delete_records({sid: cut for sid in positions}) == {sid: cut for sid in positions}
    assert admin.earliest_offsets(list(positions)) == {sid: cut for sid in positions}
    d.registry.resume("j")
    return positions


def test_log_start_moved_under_a_backfill_fails_the_job_naming_split_and_offsets(
    daemon_factory, new_topic, producer_for, kafka_bootstrap, tmp_path
):
    from connectors.kafka.admin import KafkaAdmin
    from source_backfill import metrics

    topic = new_topic(2)
    producer_for(topic).send(6000, 2)
    d = daemon_factory([topic], [job_spec("j", tmp_path, max_rows_per_epoch=200, rate_limit=200)])
    wait_for(lambda: job_of(d, "j").rows[0] > 0, what="backfill started")
    before = metric_total(metrics.SOURCE_ERRORS, job="j", error_type="data_loss")
    _delete_under_backfill(d, KafkaAdmin(kafka_bootstrap), topic, 2000)
    wait_for(lambda: d.registry.get("j").error, what="job failed on data loss")
    error = d.registry.get("j").error
    assert f"data loss on Kafka split {topic}:" in error and "log start is 2000" in error, error
    assert metric_total(metrics.SOURCE_ERRORS, job="j", error_type="data_loss") == before + 1
    assert job_of(d, "j") is None  # out of the epochs until retried or dropped
    # the live stream goes on for the others: the source still runs epochs
    epoch = d.sources["src"].last_epoch
    wait_for(lambda: d.sources["src"].last_epoch > epoch + 2, what="epochs after the failure")


def test_log_start_moved_under_a_backfill_skips_and_counts_the_lost_offsets(
    daemon_factory, new_topic, producer_for, kafka_bootstrap, tmp_path
):
    from connectors.kafka.admin import KafkaAdmin
    from source_backfill import metrics

    topic = new_topic(2)
    p = producer_for(topic)
    p.send(4400, 2)  # 2,200 per partition: 200 of each above the cut, so the rest is short
    p.stream(2, per_second=40)
    d = daemon_factory([topic], [job_spec("j", tmp_path, max_rows_per_epoch=200, rate_limit=200)],
                       fail_on_data_loss=False)
    wait_for(lambda: job_of(d, "j").rows[0] > 0, what="backfill started")
    positions = _delete_under_backfill(d, KafkaAdmin(kafka_bootstrap), topic, 2000)
    d.registry.throttle("j", None)  # the loss is counted; the rest need not crawl (max_rows_per_epoch holds)
    wait_for(lambda: finished(d, "j"), what="finished past the lost range")
    p.stop()

    def whole_log_from_the_new_start():
        # the log now starts at 2000: from there the table must hold it exactly once; below it, the table
        # keeps what the backfill wrote before the deletion ("unexpected" to a check of today's log)
        report = check_exactly_once(str(tmp_path / "j"), kafka_bootstrap, [topic])
        ok = all(not c.missing and not c.duplicates and all(o < 2000 for o in c.unexpected)
                 for c in report.splits.values())
        return ok and report

    report = wait_for(whole_log_from_the_new_start, timeout=120, interval=1.0, what="exactly once from 2000")
    held = table_offsets(str(tmp_path / "j"))
    for sid, pos in positions.items():
        assert list(report.splits[sid].unexpected) == list(range(0, pos + 1))  # read before: kept, once
        assert not set(range(pos + 1, 2000)) & set(held[sid])  # the lost range is absent ...
        # ... and counted, offset for offset
        assert metric_total(metrics.DATA_LOSS_OFFSETS, job="j", split=sid) == 2000 - (pos + 1)
    # the job's total, exported whatever metrics.per_split picks
    assert metric_total(metrics.JOB_DATA_LOSS, job="j") == sum(2000 - (pos + 1) for pos in positions.values())


def test_start_at_latest_gets_exactly_the_records_after_attach(
    daemon_factory, new_topic, producer_for, kafka_bootstrap, tmp_path
):
    from connectors.kafka.admin import KafkaAdmin

    topic = new_topic(3)
    p = producer_for(topic)
    p.send(900, 3)
    p.stream(3, per_second=60)
    admin = KafkaAdmin(kafka_bootstrap)
    sids = [f"{topic}:{i}" for i in range(3)]
    d = daemon_factory([topic], [job_spec("j", tmp_path, start={"kind": "latest"})])
    wait_for(lambda: job_of(d, "j").states is not None, what="attach")
    assert all(s.stage is Stage.FINISHED for s in job_of(d, "j").states.values())
    wait_for(lambda: (job_of(d, "j").committed_epoch or 0) >= 6, what="live epochs")
    p.stop()
    ends = admin.end_offsets(sids)
    held = table_offsets(str(tmp_path / "j"))
    assert job_of(d, "j").rows[0] == 0  # no history read
    starts = {sid: min(held[sid]) for sid in sids}
    assert all(starts[sid] >= 300 for sid in sids), starts  # nothing produced before the job
    # from its attach position on, every record exactly once and nothing else
    report = wait_for(lambda: (r := check_exactly_once(str(tmp_path / "j"), kafka_bootstrap, [topic],
                                                      start=starts, end=ends)).ok and r,
                      what="the live records after attach")
    assert sum(s.table_rows for s in report.splits.values()) == sum(ends[s] - starts[s] for s in sids)
