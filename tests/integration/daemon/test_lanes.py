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
    process_running,
    spark_jvm_of,
    wait_for,
)

pytestmark = pytest.mark.integration


def _live_topic(new_topic: Any, producer_for: Any, history: int) -> tuple[str, Any]:
    """A 2-partition topic with ``history`` records and a producer streaming 40 rows/s into it."""
    topic = new_topic(2)
    p = producer_for(topic)
    if history:
        p.send(history, 2)
    p.stream(2, per_second=40)
    return topic, p


def _both_finished(d: Any, *names: str) -> None:
    wait_for(lambda: all(finished(d, name) for name in names), what=f"{', '.join(names)} finished")


def _ask_repair(d: Any, topic: str) -> None:
    """``POST /jobs/j/repair`` of offsets [50, 100) of the topic's first partition: accepted."""
    import httpx

    r = httpx.post(f"{d.api_url}/jobs/j/repair",
                   json={"splits": [f"{topic}:0"], "from_offset": 50, "to_offset": 100})
    assert r.status_code == 202, r.text


def _repair_done_then_exactly_once(d: Any, p: Any, topic: str, bootstrap: str, tmp_path: Any) -> None:
    """Job j's last repair is done; with the producer stopped, j and n hold the log exactly once."""
    import httpx

    wait_for(lambda: (httpx.get(f"{d.api_url}/jobs/j").json()["repairs"] or [{}])[-1].get("state")
             == "done", what="the repair done")
    p.stop()
    for name in ("j", "n"):
        assert exactly_once(tmp_path / name, bootstrap, [topic]).ok


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

    topic, p = _live_topic(new_topic, producer_for, 2000)
    hold = _Hold(monkeypatch, "slow", "run_epoch")
    d = daemon_factory([topic], [job_spec("victim", tmp_path), job_spec("slow", tmp_path)])
    _both_finished(d, "victim", "slow")

    def victim_steps() -> float:  # the victim's steps, each timed on its lane
        return sum(s.value for m in metrics.JOB_STEP_DURATION.collect() for s in m.samples
                   if s.name.endswith("_count") and s.labels.get("job") == "victim")

    hold.arm()
    slow, victim = job_of(d, "slow"), job_of(d, "victim")
    held_at, victim_at, steps_at = slow.processed_epoch, victim.committed_epoch, victim_steps()
    # the victim runs step after step while its neighbour's step is held (before lanes: none); on a busy
    # machine a step of its own may outlast the bound, so it skips epochs too: its steps are counted
    wait_for(lambda: victim_steps() >= steps_at + 8, timeout=max(120, 40 * INTERVAL_S),
             what="the victim's steps while its neighbour is held")
    assert victim.committed_epoch > victim_at
    assert slow.processed_epoch == held_at and not hold.release.is_set()
    assert metric_total(metrics.JOB_EPOCHS_SKIPPED, job="slow") >= 5
    assert metrics.JOB_LAG_SECONDS.labels("slow")._value.get() > 0  # noqa: SLF001
    view = httpx.get(f"{d.api_url}/jobs/slow").json()
    assert view["status"] == "lagging" and view["lag_s"] > 0, view
    lagging = d.sources["src"].health(60)["lagging_jobs"]
    # the held job lags; on a busy machine the victim may skip an epoch of its own too, but only briefly
    # (its lag restarts each time it catches up), never as long as its held neighbour
    assert "slow" in lagging and lagging.get("victim", 0) < lagging["slow"], lagging
    assert httpx.get(f"{d.api_url}/ready").status_code == 200  # the source's epochs go on

    rejoins = metric_total(metrics.JOB_REJOINS, job="slow")
    hold.release.set()
    # free again: its next step does not start where its output ends, and it reads the gap by offsets
    wait_for(lambda: metric_total(metrics.JOB_REJOINS, job="slow") > rejoins, what="slow rejoins")
    wait_for(lambda: finished(d, "slow") and d.sources["src"].lanes.lag_s("slow") == 0,
             what="slow caught up again")
    assert metrics.JOB_LAG_SECONDS.labels("slow")._value.get() == 0  # noqa: SLF001
    # the two lanes' Spark work ran side by side in FAIR pools of their own threads, not in "default"
    # (FIFO inside: a heavy step's queued tasks went before the neighbour's); Spark makes a pool as work
    # first names it
    scheduler = d.spark.sparkContext._jsc.sc()  # noqa: SLF001
    threads = range(d.sources["src"].config.max_parallel_jobs)  # which lane thread takes a step varies
    assert sum(scheduler.getPoolForName(f"lane-jobs-src-{i}").isDefined() for i in threads) >= 2
    p.stop()
    for name in ("victim", "slow"):  # every offset of the log once, offset by offset (it waits for it)
        assert exactly_once(tmp_path / name, kafka_bootstrap, [topic]).ok


def test_a_drop_of_a_held_job_is_taken_at_once_and_nothing_of_it_commits_after(
    daemon_factory, new_topic, producer_for, kafka_bootstrap, tmp_path, monkeypatch
):
    from deltalake import DeltaTable

    from source_backfill.errors import JobNotFoundError

    topic, p = _live_topic(new_topic, producer_for, 500)
    hold = _Hold(monkeypatch, "doomed", "_commit")  # held with its rows in hand, about to commit
    d = daemon_factory([topic], [job_spec("victim", tmp_path), job_spec("doomed", tmp_path)])
    _both_finished(d, "victim", "doomed")

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


#: Allowed by the transform allow-list (select, a generator, built-in pure functions): each record
#: becomes 300,000 rows, each hashed, ~0.25 s of a core per record: a step of many seconds per batch.
HEAVY = ("SELECT value, n FROM (SELECT value, explode(sequence(1, 300000)) AS n FROM {source}) "
         "WHERE sha2(concat(CAST(value AS STRING), CAST(n AS STRING)), 256) = 'never'")


@pytest.mark.slow  # ~30 s: make test-slow (issue 46's budget); bench isolation measures the same stop
def test_sigterm_during_a_heavy_step_exits_0_in_time_and_logs_no_error(
    new_topic, producer_for, kafka_bootstrap, tmp_path
):
    """A daemon process whose heavy job's step is in Spark stops within its shutdown timeout (+5 s)."""
    import os
    import time
    from pathlib import Path

    from source_backfill.testing import RunningDaemon

    topic = new_topic(2)
    p = producer_for(topic)
    p.stream(2, per_second=20)
    shutdown_s = 10
    daemon = RunningDaemon(
        tmp_path, kafka_bootstrap, [{"name": "src", "topics": [topic], "job_timeout_s": 600}],
        [{"name": "plain", "source": "src", "start": {"kind": "latest"}},
         {"name": "heavy", "source": "src", "start": {"kind": "latest"}, "transform": HEAVY}],
        {"daemon": {"shutdown_timeout_s": shutdown_s}},
    )
    assert daemon.env is not None
    root = Path(__file__).resolve().parents[3]  # the daemon process runs this checkout's code
    daemon.env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")]))
    daemon.start()
    try:
        daemon.wait_ready()
        assert daemon.pid is not None
        jvm = spark_jvm_of(daemon.pid)
        wait_for(lambda: daemon.job("heavy")["status"] == "lagging", what="the heavy job lagging (busy)",
                 timeout=180)
        plain = daemon.job("plain")["epoch"]
        wait_for(lambda: (daemon.job("plain")["epoch"] or 0) >= (plain or 0) + 3,
                 what="the plain job committing beside it")
        logged = daemon.log.read_text(errors="replace")
        t0 = time.monotonic()
        code = daemon.stop(timeout_s=shutdown_s + 60)
        took = time.monotonic() - t0
    finally:
        daemon.kill()
        p.stop()
    tail = daemon.log.read_text(errors="replace")[len(logged):]
    assert code == 0, tail[-3000:]
    assert took <= shutdown_s + 5, f"{took:.1f} s to stop\n{tail[-3000:]}"
    assert "Spark JVM is gone" not in tail  # the JVM was not shut down under the epoch (exit 70 once)
    wait_for(lambda: not process_running(jvm), timeout=30, what="the daemon's JVM gone with it")
    errors = [line for line in tail.splitlines() if " ERROR " in line]
    assert not errors, "\n".join(errors[:20])


@pytest.mark.slow  # make test-slow (issue 46's budget: 46 s); make test keeps a repair held in its job's lane
# while the daemon becomes ready (test_ready_after_a_restart_...) and the crash suite's repairs in flight
def test_a_repair_in_its_jobs_lane_does_not_delay_the_neighbours_commits(
    daemon_factory, new_topic, producer_for, kafka_bootstrap, tmp_path, monkeypatch
):
    """A repair runs in its job's step: held there, the source's epochs and the other job go on."""

    from source_backfill.executors import repair as repair_module

    topic, p = _live_topic(new_topic, producer_for, 400)
    held, release = threading.Event(), threading.Event()
    real = repair_module.run_repair

    def slow_repair(*a: Any, **kw: Any) -> Any:
        held.set()
        release.wait(300)  # as a repair's first Delta write in a fresh JVM (13-38 s in the crash suite)
        return real(*a, **kw)

    monkeypatch.setattr(repair_module, "run_repair", slow_repair)
    d = daemon_factory([topic], [job_spec("j", tmp_path), job_spec("n", tmp_path)])
    _both_finished(d, "j", "n")
    _ask_repair(d, topic)
    wait_for(held.is_set, what="the repair running")
    n, epoch = job_of(d, "n"), d.sources["src"].last_epoch
    at = n.committed_epoch
    wait_for(lambda: n.committed_epoch >= at + 6, what="the neighbour committing while the repair runs")
    # and the source's epochs go on (an epoch's number is set once it ends: after n's commit in it)
    wait_for(lambda: d.sources["src"].last_epoch >= epoch + 6, what="the source's epochs going on")
    assert not release.is_set()
    release.set()
    _repair_done_then_exactly_once(d, p, topic, kafka_bootstrap, tmp_path)


def test_ready_after_a_restart_does_not_wait_for_a_pending_repair(
    daemon_factory, new_topic, producer_for, kafka_bootstrap, tmp_path, monkeypatch
):
    """A repair accepted before a stop runs after the restart in its job's lane: /ready comes meanwhile."""
    import httpx

    from source_backfill.executors import repair as repair_module

    topic, p = _live_topic(new_topic, producer_for, 400)
    state = tmp_path / "state"
    jobs = [job_spec("j", tmp_path), job_spec("n", tmp_path)]
    d = daemon_factory([topic], jobs, state_root=state)
    _both_finished(d, "j", "n")
    release = threading.Event()
    started: list[int] = []
    real = repair_module.run_repair

    def held_repair(job: Any, repair_id: int, spec: Any) -> Any:
        started.append(repair_id)
        if not release.wait(300):  # held: the repair never ends before the test says so
            raise AssertionError("never released")
        return real(job, repair_id, spec)

    monkeypatch.setattr(repair_module, "run_repair", held_repair)  # imported at each call: held from now
    _ask_repair(d, topic)
    wait_for(lambda: started, what="the repair running in j's lane")
    d.stop()  # the repair is pending (not applied) and held: the restart runs it again, in the lane
    started.clear()
    d = daemon_factory([topic], jobs, state_root=state)
    wait_for(lambda: httpx.get(f"{d.api_url}/ready").status_code == 200, what="ready with the repair held")
    n = job_of(d, "n")
    wait_for(lambda: n is not None and n.committed_epoch is not None and started,
             what="the neighbour committing and the repair running again")
    assert not release.is_set()  # ready, and n committed, while j's repair still runs
    release.set()
    _repair_done_then_exactly_once(d, p, topic, kafka_bootstrap, tmp_path)


def test_a_batch_that_comes_while_the_source_stops_is_skipped_and_its_jobs_rejoin_by_offsets(
    daemon_factory, new_topic, producer_for, kafka_bootstrap, tmp_path, monkeypatch
):
    """The batch Spark starts during a stop ends without an error and runs no job; after the restart the
    jobs' output ends before the live stream's next batch, and they rejoin by offsets: exactly once."""
    from source_backfill import metrics
    from source_backfill.runtime.source import LiveSource

    entered, armed, returned = threading.Event(), threading.Event(), threading.Event()
    real = LiveSource._on_batch

    def on_batch(self: LiveSource, batch: Any, batch_id: int) -> None:
        if not armed.is_set():
            real(self, batch, batch_id)
            return
        entered.set()
        real(self, batch, batch_id)  # raised before: the query ended with an error
        returned.set()

    monkeypatch.setattr(LiveSource, "_on_batch", on_batch)  # the query holds the method from its start
    topic, p = _live_topic(new_topic, producer_for, 200)
    state = tmp_path / "state"
    jobs = [job_spec("j", tmp_path), job_spec("n", tmp_path)]
    d = daemon_factory([topic], jobs, state_root=state)
    _both_finished(d, "j", "n")
    source = d.sources["src"]
    with source._lock:  # noqa: SLF001 - the next batch waits for the epoch lock, as behind a running epoch
        armed.set()
        last = source.last_epoch
        wait_for(entered.is_set, what="a batch waiting behind the epoch")
        source._stopping.set()  # noqa: SLF001 - the stop's first step, with that batch in flight
    wait_for(returned.is_set, what="the waiting batch ended without an error")
    assert source.last_epoch == last  # and ran no epoch
    d.stop()
    rejoins = {name: metric_total(metrics.JOB_REJOINS, job=name) for name in ("j", "n")}
    d = daemon_factory([topic], jobs, state_root=state)
    wait_for(lambda: all(metric_total(metrics.JOB_REJOINS, job=name) > rejoins[name] for name in rejoins),
             what="both jobs rejoining by offsets after the restart")
    _both_finished(d, "j", "n")
    p.stop()
    for name in ("j", "n"):
        assert exactly_once(tmp_path / name, kafka_bootstrap, [topic]).ok
