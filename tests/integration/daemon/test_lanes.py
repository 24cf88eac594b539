"""Each job on its own lane: a job whose step does not end holds neither its source nor its neighbours.

A hook holds one job's step (as a heavy transform or a slow first write would) while the others go on:
the held job skips the source's epochs, shows as lagging, and once free rejoins by offsets and ends
exactly once (every offset of the log in its table once, checked offset by offset). A drop of a held job
is taken at once and nothing of it commits after it.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest

from source_backfill.executors.source_backfill import SourceBackfillJob
from tests.integration.daemon.conftest import (
    INTERVAL_S,
    exactly_once,
    finished,
    job_of,
    job_spec,
    metric_total,
    wait_for,
)

pytestmark = pytest.mark.integration


class _Hold:
    """Holds one job's next call of ``method`` until released (armed once)."""

    def __init__(self, monkeypatch: Any, job: str, method: str) -> None:
        self.job = job
        self.armed = False
        self.held = threading.Event()
        self.release = threading.Event()
        real = getattr(SourceBackfillJob, method)

        def held(inner: SourceBackfillJob, *a: Any, **kw: Any) -> Any:
            if inner.name == self.job and self.armed:
                self.armed = False
                self.held.set()
                self.release.wait(300)
            return real(inner, *a, **kw)

        monkeypatch.setattr(SourceBackfillJob, method, held)

    def arm(self) -> None:
        self.armed = True
        wait_for(self.held.is_set, what=f"{self.job}'s step held")


def test_a_held_job_lags_alone_and_rejoins_by_offsets_exactly_once(
    daemon_factory, new_topic, producer_for, kafka_bootstrap, tmp_path, monkeypatch
):
    import httpx

    from source_backfill import metrics

    topic = new_topic(2)
    p = producer_for(topic)
    p.send(2000, 2)
    p.stream(2, per_second=40)
    hold = _Hold(monkeypatch, "slow", "run_epoch")
    d = daemon_factory([topic], [job_spec("victim", tmp_path), job_spec("slow", tmp_path)])
    wait_for(lambda: finished(d, "victim") and finished(d, "slow"), what="both finished")

    hold.arm()
    slow, victim = job_of(d, "slow"), job_of(d, "victim")
    held_at, victim_at = slow.processed_epoch, victim.committed_epoch
    # the victim commits epoch after epoch while its neighbour's step is held (before lanes: none)
    wait_for(lambda: victim.committed_epoch >= victim_at + 8, timeout=max(120, 40 * INTERVAL_S),
             what="the victim committing while its neighbour is held")
    assert slow.processed_epoch == held_at and not hold.release.is_set()
    assert metric_total(metrics.JOB_EPOCHS_SKIPPED, job="slow") >= 5
    view = httpx.get(f"{d.api_url}/jobs/slow").json()
    assert view["status"] == "lagging" and view["lag_s"] > 0, view
    assert d.sources["src"].health(60)["lagging_jobs"].keys() == {"slow"}
    assert httpx.get(f"{d.api_url}/ready").status_code == 200  # the source's epochs go on

    rejoins = metric_total(metrics.JOB_REJOINS, job="slow")
    hold.release.set()
    # free again: its next step does not start where its output ends, and it reads the gap by offsets
    wait_for(lambda: metric_total(metrics.JOB_REJOINS, job="slow") > rejoins, what="slow rejoins")
    wait_for(lambda: finished(d, "slow") and d.sources["src"].lanes.lag_s("slow") == 0,
             what="slow caught up again")
    p.stop()
    for name in ("victim", "slow"):  # every offset of the log once, offset by offset (it waits for it)
        assert exactly_once(tmp_path / name, kafka_bootstrap, [topic]).ok


def test_a_drop_of_a_held_job_is_taken_at_once_and_nothing_of_it_commits_after(
    daemon_factory, new_topic, producer_for, kafka_bootstrap, tmp_path, monkeypatch
):
    from deltalake import DeltaTable

    from source_backfill.errors import JobNotFoundError

    topic = new_topic(2)
    p = producer_for(topic)
    p.send(500, 2)
    p.stream(2, per_second=40)
    hold = _Hold(monkeypatch, "doomed", "_commit")  # held with its rows in hand, about to commit
    d = daemon_factory([topic], [job_spec("victim", tmp_path), job_spec("doomed", tmp_path)])
    wait_for(lambda: finished(d, "victim") and finished(d, "doomed"), what="both finished")

    hold.arm()
    version = DeltaTable(str(tmp_path / "doomed")).version()
    victim = job_of(d, "victim")
    d.registry.drop("doomed")
    epoch = d.sources["src"].last_epoch
    wait_for(lambda: job_of(d, "doomed") is None, timeout=max(60, 20 * INTERVAL_S),
             what="the drop taken while the job's step is held")
    assert d.sources["src"].last_epoch <= epoch + 3  # within a few triggers, not once the step ends
    at = victim.committed_epoch
    hold.release.set()  # the held step goes on to its commit: refused, its lane is stopped
    wait_for(lambda: not d.sources["src"].lanes.busy("doomed"), what="the held step ended")

    def applied() -> bool:
        try:
            d.registry.get("doomed")
        except JobNotFoundError:
            return True
        return False

    wait_for(applied, what="the drop applied once the lane is free")
    wait_for(lambda: victim.committed_epoch >= at + 3, what="the victim going on")
    assert DeltaTable(str(tmp_path / "doomed")).version() == version  # nothing committed after the drop
    p.stop()
    assert exactly_once(tmp_path / "victim", kafka_bootstrap, [topic]).ok
