"""A namespace's table bytes of the day on a real daemon (broker, Spark, Delta): once its jobs have
written ``max_bytes_per_day``, their history copies are held (the job says why), the live rows of its jobs
that follow the live stream are still committed, and the namespace's creates are refused; the bytes
counted are the tables' files' sizes.

(A split still backfilling commits no live row at any time: its history read covers them, so a held
backfill resumes where it stopped, nothing lost.)"""

from __future__ import annotations

import pytest

from connectors.delta.log import added_bytes
from source_backfill import metrics
from source_backfill.errors import QuotaExceededError
from tests.integration.daemon.conftest import job_of, job_spec, metric_total, wait_for

pytestmark = pytest.mark.integration


def test_a_namespace_past_its_bytes_of_the_day_holds_history_and_still_commits_live_rows(
    daemon_factory, new_topic, producer_for, tmp_path
):
    topic = new_topic(2)
    p = producer_for(topic)
    p.send(6000, 2)
    spec = job_spec("a.j", tmp_path, namespace="a", max_rows_per_epoch=500, read_ahead=False)
    follows = job_spec("a.live", tmp_path, namespace="a", start={"kind": "latest"})
    before = metric_total(metrics.NAMESPACE_BYTES_WRITTEN, namespace="a")
    d = daemon_factory([topic], [spec, follows], namespaces=[{"name": "a", "max_bytes_per_day": 1}])

    def held():
        progress = d.registry.progress("a.j")
        return progress is not None and progress.history_held is not None and progress

    progress = wait_for(held, what="the namespace's history held after its first commit")
    assert "max_bytes_per_day" in progress.history_held and progress.history_paused
    copied = progress.rows_history
    assert copied < 6000  # held with history left (500 offsets an epoch at most; none if a.live's first
    # commit wrote the namespace's byte before a.j's first)
    assert metrics.NAMESPACE_HISTORY_HELD.labels("a")._value.get() == 1

    p.send(100, 2)  # live rows: committed while the history waits
    wait_for(lambda: d.registry.progress("a.live").rows_live >= 100, what="the live rows committed")
    after = d.registry.progress("a.j")
    assert after.rows_history == copied, "a held namespace's job copied history"
    assert after.history_held is not None

    with pytest.raises(QuotaExceededError, match="max_bytes_per_day"):
        d.registry.create(d.registry.get("a.j").spec.model_copy(
            update={"name": "a.k", "sink_path": str(tmp_path / "a.k")}))
    assert metric_total(metrics.QUOTA_REFUSALS, namespace="a", quota="max_bytes_per_day") >= 1

    # what was counted is what the table's versions added, each once
    jobs = [job_of(d, name) for name in ("a.j", "a.live")]
    d.stop()
    total = 0
    for job in jobs:
        table = job.spec.sink_path
        newest = job.sink.recover().version
        total += sum(found[0] for v in range(newest + 1) if (found := added_bytes(table, v)) is not None)
    counted = metric_total(metrics.NAMESPACE_BYTES_WRITTEN, namespace="a") - before
    assert counted == total > 0  # (a version that creates the table adds no file)
