"""A topic deleted and created again under the same name (a new topic id, offsets from 0 again): the
source stops instead of restarting its query for ever, and its jobs fail naming the topic and both ids —
at once, and again after a restart of the daemon."""

from __future__ import annotations

import shutil
import time

import pytest

from source_backfill.config import JobSpec
from tests.integration.daemon.conftest import exactly_once, finished, job_of, job_spec, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.slow]  # ~70 s: make test-slow


def _recreate(bootstrap: str, topic: str, partitions: int) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.delete_topics([topic])[topic].result(30)
    deadline = time.monotonic() + 60
    while True:  # the deletion completes in the background: create again once the name is free
        try:
            admin.create_topics([NewTopic(topic, partitions)])[topic].result(30)
            return
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def test_a_recreated_topic_stops_its_source_and_fails_its_jobs_naming_both_ids(
    daemon_factory, new_topic, producer_for, kafka_bootstrap, tmp_path
):
    topic = new_topic(2)
    p = producer_for(topic)
    p.send(1000, 2)
    state = tmp_path / "state"
    d = daemon_factory([topic], [job_spec("before", tmp_path)], state_root=state)
    wait_for(lambda: finished(d, "before"), what="the job finished")
    recorded = (state / "sources" / "src" / "topic_ids.json").read_text()
    assert topic in recorded
    _recreate(kafka_bootstrap, topic, 2)
    p.send(100, 2, start=5000)

    error = wait_for(lambda: d.registry.get("before").error, timeout=180, what="the job failed")
    assert f"topic {topic} was deleted and created again (topic id " in error
    source = d.sources["src"]
    assert "stopped" in (source.error or "") and f"topic {topic}" in source.error
    failures = source.query_failures
    time.sleep(5)
    assert source.query_failures == failures  # stopped: no restart loop
    assert not d.health()["ok"]
    d.stop()

    # a restart does not start the source again: the record still says which log its positions belong to
    again = daemon_factory([topic], state_root=state)
    wait_for(lambda: again.sources["src"].error, timeout=60, what="the source stopped again at start")
    assert again.sources["src"]._query is None  # noqa: SLF001
    assert again.registry.get("before").error is not None


def test_a_job_left_on_its_old_table_after_its_source_started_over_fails_naming_both_ids(
    daemon_factory, new_topic, producer_for, kafka_bootstrap, tmp_path
):
    """Each commit records the topics' ids: a job whose source's folder was removed (the documented start
    over) fails on the table of the old topic instead of resuming at its offsets in the new log, and a job
    created on a new table copies the new topic exactly once."""
    topic = new_topic(2)
    p = producer_for(topic)
    p.send(600, 2)
    state = tmp_path / "state"
    d = daemon_factory([topic], [job_spec("old", tmp_path)], state_root=state)
    wait_for(lambda: finished(d, "old"), what="the job finished")
    old_id = job_of(d, "old").sink.recover().plan["topic_ids"][topic]  # in the table's newest commit
    d.stop()

    _recreate(kafka_bootstrap, topic, 2)
    p.send(300, 2, start=9000)
    shutil.rmtree(state / "sources" / "src")  # the source starts over (docs/guides/kafka-failures.md)
    again = daemon_factory([topic], [job_spec("old", tmp_path)], state_root=state)
    error = wait_for(lambda: again.registry.get("old").error, timeout=120, what="the old table's job failed")
    new_id = again.sources["src"].topic_ids[topic]
    assert new_id != old_id
    assert f"topic {topic} (id {old_id} in the table, {new_id} now)" in error, error
    assert again.sources["src"].error is None  # the source itself reads the new log

    again.registry.create(JobSpec(**job_spec("fresh", tmp_path)))
    wait_for(lambda: finished(again, "fresh"), what="the job on a new table finished")
    report = exactly_once(tmp_path / "fresh", kafka_bootstrap, [topic])
    assert sum(s.log_records for s in report.splits.values()) == 300


def _table_state(path) -> tuple[int, list[tuple[int, int, bytes]]]:
    """A table's version and its rows (partition, offset, value), sorted: what "unchanged" compares."""
    from deltalake import DeltaTable

    table = DeltaTable(str(path))
    rows = table.to_pyarrow_table(columns=["partition", "offset", "value"]).to_pylist()
    return table.version(), sorted((r["partition"], r["offset"], r["value"]) for r in rows)


def test_sources_reset_then_a_retry_into_a_new_table_copies_the_new_topic_exactly_once(
    daemon_factory, new_topic, producer_for, kafka_bootstrap, tmp_path, capsys, monkeypatch
):
    """The documented start over, with the two commands on a running daemon (no restart in between): the
    source stopped for good is reset, the failed job retried from the earliest offsets into a new table;
    the new table holds exactly the new topic's records once each, the old table is as it was. A restart
    afterwards keeps it all: the source reads the new log, the job its new table."""
    from source_backfill import cli
    from source_backfill.runtime.source_reset import MARKER

    topic = new_topic(2)
    p = producer_for(topic)
    p.send(400, 2)
    state = tmp_path / "state"
    d = daemon_factory([topic], [job_spec("copy", tmp_path)], state_root=state)
    wait_for(lambda: finished(d, "copy"), what="the job finished")
    exactly_once(tmp_path / "copy", kafka_bootstrap, [topic])
    old_id = (state / "sources" / "src" / "topic_ids.json").read_text()

    _recreate(kafka_bootstrap, topic, 2)
    p.send(300, 2, start=9000)
    wait_for(lambda: d.registry.get("copy").error, timeout=180, what="the job failed")
    wait_for(lambda: d.sources["src"].stopped_for_good, timeout=60, what="the source stopped for good")
    old_table = _table_state(tmp_path / "copy")

    monkeypatch.setenv(cli.ENV_API, d.api_url)

    def run(*argv: str) -> str:
        code = cli.main(list(argv))
        out, err = capsys.readouterr()
        assert code == 0, err
        return out

    assert "--new-table" in (d.registry.get("copy").error or "")  # its error says what to do
    out = run("sources", "reset", "src")
    assert "reads the new log" in out
    [kept] = [f for f in (state / "sources").iterdir() if f.name.startswith("src.reset-")]
    assert (kept / "topic_ids.json").read_text() == old_id and (kept / "checkpoint").is_dir()
    wait_for(lambda: d.sources["src"].error is None and d.sources["src"].last_epoch is not None, timeout=120,
             what="the reset source's first epoch")
    assert d.registry.get("copy").error is not None  # its jobs stay failed until retried
    new_ids = wait_for(lambda: d.sources["src"].topic_ids, what="the new topic ids")
    assert new_ids[topic] not in old_id

    out = run("jobs", "retry", "copy", "--from", "earliest", "--new-table")
    assert str(tmp_path / "copy-2") in out
    assert d.registry.get("copy").spec.sink_path == str(tmp_path / "copy-2")
    wait_for(lambda: finished(d, "copy"), what="the job finished on its new table")
    report = exactly_once(tmp_path / "copy-2", kafka_bootstrap, [topic])
    assert sum(s.log_records for s in report.splits.values()) == 300
    _, rows = _table_state(tmp_path / "copy-2")
    new_values = sorted(f"v{9000 + i}".encode() for i in range(300))
    assert sorted(v for _, _, v in rows) == new_values  # the new topic's, not one of the old
    assert _table_state(tmp_path / "copy") == old_table  # the old table left as it was
    audit = [(r["kind"], r["job"]) for r in d.registry.audit_rows()]
    assert ("reset", "") in audit and ("retry", "copy") in audit
    wait_for(lambda: not d.registry.pending("copy") and not d.registry.pending_resets("src"),
             what="the reset and the retry applied")
    d.stop()

    again = daemon_factory([topic], state_root=state)  # durable: the new folder, the new table
    assert (state / "sources" / "src" / MARKER).exists()
    p.send(100, 2, start=20000)
    wait_for(lambda: finished(again, "copy"), what="the job resumed on its new table after a restart")
    report = exactly_once(tmp_path / "copy-2", kafka_bootstrap, [topic])
    assert sum(s.log_records for s in report.splits.values()) == 400
    assert again.sources["src"].stopped_for_good is None and again.registry.get("copy").error is None
    assert _table_state(tmp_path / "copy") == old_table
