"""One job's failure never stalls the others; failed jobs are persisted, retried or dropped; health tells
the truth about a failing live query."""

from __future__ import annotations

import httpx
import pytest

from connectors.delta.sink import DeltaEpochSink
from source_backfill.config import JobSpec
from source_backfill.errors import SinkPathError, TransformError
from tests.integration.daemon.conftest import exactly_once, finished, job_of, job_spec, wait_for

pytestmark = pytest.mark.integration


def _fault(monkeypatch, job: str, times: int | None):
    """Make ``job``'s Delta commits raise (``times`` commits, or until ``stop()``); others untouched."""
    real = DeltaEpochSink.commit_epoch
    left = {"n": times, "on": True, "raised": 0}

    def commit_epoch(self, *a, **kw):
        if self.job_id == job and left["on"] and (left["n"] is None or left["n"] > 0):
            if left["n"] is not None:
                left["n"] -= 1
            left["raised"] += 1
            raise RuntimeError(f"injected commit failure of {job}")
        return real(self, *a, **kw)

    monkeypatch.setattr(DeltaEpochSink, "commit_epoch", commit_epoch)
    left["stop"] = lambda: left.update(on=False)
    return left


def test_a_job_failing_every_epoch_is_failed_alone_and_comes_back_with_retry(
    daemon_factory, new_topic, producer_for, kafka_bootstrap, tmp_path, monkeypatch
):
    import httpx

    from source_backfill import metrics

    topic = new_topic(2)
    p = producer_for(topic)
    p.send(1000, 2)
    p.stream(2, per_second=40)
    fault = _fault(monkeypatch, "bad", None)
    state = tmp_path / "state"
    d = daemon_factory([topic], [job_spec("good", tmp_path), job_spec("bad", tmp_path)], state_root=state)
    wait_for(lambda: d.registry.get("bad").error, what="bad marked failed")
    assert "failed 3 times in a row" in d.registry.get("bad").error
    assert "injected commit failure of bad" in d.registry.get("bad").error
    assert job_of(d, "bad") is None
    assert metrics.JOB_FAILED.labels("bad")._value.get() == 1  # noqa: SLF001
    # the other job and the live stream go on
    wait_for(lambda: finished(d, "good"), what="good finished")
    epoch = d.sources["src"].last_epoch
    wait_for(lambda: d.sources["src"].last_epoch >= epoch + 3, what="epochs after the failure")
    health = httpx.get(f"{d.api_url}/health").json()
    assert health["ok"] and health["sources"]["src"]["failed_jobs"] == ["bad"]
    view = httpx.get(f"{d.api_url}/jobs/bad").json()
    assert view["status"] == "failed" and "injected" in view["error"]
    # the failure is persisted: a restarted daemon keeps the job failed, without building it
    d.stop()
    d = daemon_factory([topic], [job_spec("good", tmp_path), job_spec("bad", tmp_path)], state_root=state)
    assert d.registry.get("bad").error and job_of(d, "bad") is None
    # retried after the fault is gone: rebuilt from its table, it catches up exactly once
    fault["stop"]()
    r = httpx.post(f"{d.api_url}/jobs/bad/retry")
    assert r.status_code == 202 and r.json()["error"] is None
    wait_for(lambda: job_of(d, "bad") is not None and finished(d, "bad"), what="bad finished after retry")
    p.stop()
    exactly_once(tmp_path / "good", kafka_bootstrap, [topic])
    exactly_once(tmp_path / "bad", kafka_bootstrap, [topic])


def test_a_job_failing_one_epoch_is_rebuilt_from_its_table_and_stays_exactly_once(
    daemon_factory, new_topic, producer_for, kafka_bootstrap, tmp_path, monkeypatch
):
    topic = new_topic(2)
    p = producer_for(topic)
    p.send(2000, 2)
    p.stream(2, per_second=60)
    d = daemon_factory([topic], [job_spec("j", tmp_path, max_rows_per_epoch=300, rate_limit=400)])
    wait_for(lambda: job_of(d, "j") is not None and job_of(d, "j").rows[0] > 0, what="backfill started")
    fault = _fault(monkeypatch, "j", 2)  # two epochs in a row fail: under the limit of three
    wait_for(lambda: fault["raised"] == 2, what="two injected failures")
    wait_for(lambda: finished(d, "j"), what="finished")
    assert d.registry.get("j").error is None
    p.stop()
    exactly_once(tmp_path / "j", kafka_bootstrap, [topic])


def test_a_create_that_cannot_start_fails_that_job_only_and_the_daemon_restarts(
    daemon_factory, new_topic, producer_for, kafka_bootstrap, tmp_path
):
    topic = new_topic(2)
    p = producer_for(topic)
    p.send(400, 2)
    p.stream(2, per_second=40)
    state = tmp_path / "state"
    d = daemon_factory([topic], [job_spec("ok", tmp_path)], state_root=state)
    wait_for(lambda: finished(d, "ok"), what="ok finished")
    # a transform that fails analysis, and a job writing into another job's table
    d.registry.create(JobSpec(**job_spec("bad-sql", tmp_path, transform="SELECT nope FROM {source}")))
    # a transform reading another job's files is refused when it is created (the API's 422), never run
    with pytest.raises(TransformError, match="transform reads 'parquet."):
        d.registry.create(JobSpec(**job_spec("reader", tmp_path, transform="SELECT * FROM {source} "
                                             f"UNION ALL SELECT * FROM parquet.`{tmp_path / 'ok'}`")))
    assert all(r.name != "reader" for r in d.registry.list())
    r = httpx.post(f"{d.api_url}/jobs", json=job_spec("shell", tmp_path, transform=(
        "SELECT TRANSFORM(value) USING 'touch /tmp/owned' AS (o) FROM {source}")))
    assert r.status_code == 422 and "TRANSFORM ... USING" in r.text, r.text
    # a job writing into another job's table is refused when it is created (runtime/paths.py)
    with pytest.raises(SinkPathError, match='job "ok"'):
        d.registry.create(JobSpec(**{**job_spec("thief", tmp_path), "sink_path": str(tmp_path / "ok")}))
    wait_for(lambda: d.registry.get("bad-sql").error, what="the create failed")
    assert "could not start" in d.registry.get("bad-sql").error
    epoch = d.sources["src"].last_epoch
    wait_for(lambda: d.sources["src"].last_epoch >= epoch + 3, what="epochs go on")
    d.stop()
    # the daemon starts again with them registered (and failed), and they can be dropped
    d = daemon_factory([topic], [job_spec("ok", tmp_path)], state_root=state)
    assert d.registry.get("bad-sql").error and job_of(d, "ok") is not None
    d.registry.drop("bad-sql")
    wait_for(lambda: not any(r.name == "bad-sql" for r in d.registry.list())
             and d.registry.pending("bad-sql") == 0, what="drop applied")
    p.stop()
    exactly_once(tmp_path / "ok", kafka_bootstrap, [topic])


def test_health_stays_unhealthy_while_the_live_query_keeps_failing(
    daemon_factory, new_topic, producer_for, tmp_path, monkeypatch
):
    import httpx

    from source_backfill.runtime import source as source_mod

    topic = new_topic(1)
    p = producer_for(topic)
    p.stream(1, per_second=20)
    d = daemon_factory([topic], [job_spec("j", tmp_path)])
    wait_for(lambda: httpx.get(f"{d.api_url}/ready").status_code == 200, what="ready")
    real = source_mod._live_stats
    broken = {"on": True}

    def failing(*a, **kw):
        if broken["on"]:
            raise RuntimeError("injected live batch failure")
        return real(*a, **kw)

    monkeypatch.setattr(source_mod, "_live_stats", failing)
    # unhealthy through several restarts of the query (the error is not cleared by a restart)
    wait_for(lambda: d.sources["src"].query_failures >= 2, what="the query failed twice")
    for _ in range(3):
        r = httpx.get(f"{d.api_url}/health")
        assert r.status_code == 503, r.json()
        assert "injected live batch failure" in r.json()["sources"]["src"]["error"]
        assert httpx.get(f"{d.api_url}/ready").status_code == 503
        assert httpx.get(f"{d.api_url}/live").status_code == 200
    broken["on"] = False
    wait_for(lambda: httpx.get(f"{d.api_url}/health").status_code == 200, timeout=120,
             what="healthy after an epoch completes")
    assert httpx.get(f"{d.api_url}/ready").status_code == 200
    p.stop()
