"""The jobs of a source run their epochs side by side, each failing alone (JobHost._run_jobs).

The jobs are fakes of the :class:`~source_backfill.executors.job.Job` protocol (mypy checks that
``FakeJob`` is one); the host is a :class:`JobHost` with its two hooks and nothing else.
"""

from __future__ import annotations

import threading
import time
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from source_backfill import metrics
from source_backfill.config import JobSpec, SourceConfig
from source_backfill.errors import JobError
from source_backfill.executors.job import Job
from source_backfill.runtime.jobs import JOB_ATTEMPTS, JobHost
from source_backfill.runtime.progress import JobProgress
from source_backfill.runtime.registry import JobRegistry


class FakeJob:
    """A job of the protocol whose epoch is a call the test gives it."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.paused = False
        self.rate_limit: float | None = None
        self.alone = False
        self.committed_epoch: int | None = None
        self.processed_epoch: int | None = None
        self.closed = False
        self.stopped: str | None = None

    def run_epoch(self, epoch: int, fault: BaseException | None = None) -> None:
        if fault is not None:
            raise fault
        self.committed_epoch = self.processed_epoch = epoch

    def close(self) -> None:
        self.closed = True

    def stop_lane(self, why: str, timeout_s: float = 30.0) -> bool:
        self.stopped = why
        return True


_IS_A_JOB: type[Job] = FakeJob  # what mypy checks: the fake has everything a source asks of a job


class Host(JobHost[FakeJob]):
    def __init__(self, config: SourceConfig, registry: JobRegistry) -> None:
        super().__init__(config, registry)
        self.built: list[str] = []
        #: Names whose build raises.
        self.unbuildable: set[str] = set()

    def _new_job(self, spec: JobSpec) -> FakeJob:
        if spec.name in self.unbuildable:
            raise ValueError("table owned by another job")
        self.built.append(spec.name)
        return FakeJob(spec.name)

    def _progress(self, job: FakeJob) -> JobProgress:
        return JobProgress(epoch=job.processed_epoch, status="backfilling", rows_history=0, rows_live=0)


@pytest.fixture
def host_factory(tmp_path: Path):
    made: list[tuple[Host, JobRegistry]] = []

    def make(names: list[str], parallel: int, **source: Any) -> Host:
        """A host of ``names`` on source ``src`` (``source``: more of its config)."""
        registry = JobRegistry(tmp_path / f"state{len(made)}", ["src"])
        host = Host(SourceConfig(name="src", topics=["t"], max_parallel_jobs=parallel, **source), registry)
        for name in names:
            registry.create(JobSpec(name=name, source="src", sink_path=f"/tables/{name}"))
        host._recover_jobs()
        made.append((host, registry))
        return host

    yield make
    for host, registry in made:
        host._close_pool()
        registry.close()


def test_epochs_of_a_sources_jobs_overlap(host_factory) -> None:
    """Four jobs whose epochs each wait for all four to be inside theirs: only side by side can they pass."""
    host = host_factory(["a", "b", "c", "d"], parallel=4)
    inside = threading.Barrier(4, timeout=10)
    threads: set[str] = set()

    def run() -> None:
        threads.add(threading.current_thread().name)
        inside.wait()

    host._run_jobs(1, [(job, run) for job in host.jobs.values()])
    assert len(threads) == 4
    assert sorted(host.jobs) == ["a", "b", "c", "d"]
    assert host.registry.failed() == []


def test_the_bound_holds(host_factory) -> None:
    host = host_factory([f"j{i}" for i in range(6)], parallel=2)
    lock = threading.Lock()
    now = peak = 0

    def run() -> None:
        nonlocal now, peak
        with lock:
            now += 1
            peak = max(peak, now)
        time.sleep(0.05)
        with lock:
            now -= 1

    host._run_jobs(1, [(job, run) for job in host.jobs.values()])
    assert peak == 2


def test_one_width_runs_in_series_on_the_epoch_thread(host_factory) -> None:
    host = host_factory(["a", "b"], parallel=1)
    seen: list[str] = []
    host._run_jobs(1, [(job, lambda job=job: seen.append((job.name, threading.current_thread().name)))
                       for job in host.jobs.values()])
    assert seen == [("a", threading.current_thread().name), ("b", threading.current_thread().name)]
    assert host._pool is None


def test_a_failing_job_fails_alone_while_the_others_commit(host_factory) -> None:
    """A JobError fails its job at once; an unexpected error rebuilds it; the slow others still complete."""
    host = host_factory(["bad", "flaky", "ok1", "ok2"], parallel=4)
    done: list[str] = []

    def runner(name: str) -> Any:
        def run() -> None:
            if name == "bad":
                raise JobError("bad transform")
            if name == "flaky":
                raise RuntimeError("boom")
            time.sleep(0.1)  # still running when the others have failed
            done.append(name)
        return run

    old_flaky = host.jobs["flaky"]
    host._run_jobs(1, [(job, runner(job.name)) for job in list(host.jobs.values())])
    assert sorted(done) == ["ok1", "ok2"]
    assert [r.name for r in host.registry.failed()] == ["bad"]
    assert "bad" not in host.jobs
    assert host.jobs["flaky"] is not old_flaky and old_flaky.closed  # rebuilt from its table
    assert host._job_failures == {"flaky": 1}

    for _ in range(JOB_ATTEMPTS - 1):
        host._run_jobs(2, [(job, runner(job.name)) for job in list(host.jobs.values())])
    assert sorted(r.name for r in host.registry.failed()) == ["bad", "flaky"]
    assert sorted(host.jobs) == ["ok1", "ok2"]


def test_stopping_is_raised_once_every_job_has_ended(host_factory) -> None:
    """An error that is not the job's (the daemon stopping) fails the source epoch, after all jobs end."""
    host = host_factory(["a", "b", "c"], parallel=3)
    ended: list[str] = []

    def runner(name: str) -> Any:
        def run() -> None:
            if name == "a":
                host._stopping.set()
                raise RuntimeError("session closed")
            time.sleep(0.1)
            ended.append(name)
        return run

    with pytest.raises(RuntimeError, match="session closed"):
        host._run_jobs(1, [(job, runner(job.name)) for job in list(host.jobs.values())])
    assert sorted(ended) == ["b", "c"]
    assert host.registry.failed() == [] and sorted(host.jobs) == ["a", "b", "c"]


def test_a_job_in_flight_at_a_jvm_death_runs_alone_after_the_others(host_factory) -> None:
    """Side by side, a job beside the culprit would be counted at each death: suspects run one at a time."""
    host = host_factory(["a", "s1", "b", "s2"], parallel=4)
    host._suspect = lambda name: name.startswith("s")  # type: ignore[method-assign]
    lock = threading.Lock()
    running: set[str] = set()
    beside: dict[str, set[str]] = {}

    def runner(name: str) -> Any:
        def run() -> None:
            with lock:
                running.add(name)
                beside[name] = set(running)
                for other in running:
                    beside[other] |= running
            time.sleep(0.05)
            with lock:
                running.discard(name)
        return run

    host._run_jobs(1, [(job, runner(job.name)) for job in host.jobs.values()])
    assert beside["s1"] == {"s1"} and beside["s2"] == {"s2"}
    # and they start no read ahead, which would run beside the others' epochs
    assert {name: job.alone for name, job in host.jobs.items()} == {"a": False, "s1": True, "b": False,
                                                                    "s2": True}
    assert beside["a"] == beside["b"] == {"a", "b"}


def test_the_jobs_threads_never_hold_up_the_process_exit(host_factory) -> None:
    """Daemon threads: a job's epoch stuck in Spark past the shutdown timeout does not keep the process."""
    host = host_factory(["a", "b"], parallel=2)
    names: list[tuple[str, bool]] = []

    def run() -> None:
        names.append((threading.current_thread().name, threading.current_thread().daemon))

    host._run_jobs(1, [(job, run) for job in host.jobs.values()])
    assert len(names) == 2 and all(daemon for _, daemon in names), names
    assert all(name.startswith("jobs-src-") for name, _ in names)
    threads = list(host._pool._threads)
    host._close_pool()
    for thread in threads:
        thread.join(5)
    assert not any(thread.is_alive() for thread in threads)


def test_a_source_says_how_to_build_and_describe_its_jobs(tmp_path: Path) -> None:
    """Both hooks are abstract: a host without them cannot be made."""

    class Partial(JobHost[FakeJob]):
        def _new_job(self, spec: JobSpec) -> FakeJob:
            return FakeJob(spec.name)

    registry = JobRegistry(tmp_path / "state", ["src"])
    try:
        with pytest.raises(TypeError, match="_progress"):
            Partial(SourceConfig(name="src", topics=["t"]), registry)  # type: ignore[abstract]
    finally:
        registry.close()


@pytest.mark.parametrize("parallel", [1, 3])
def test_failures_stay_with_their_jobs_over_epochs(host_factory, parallel: int) -> None:
    """JobError: failed at once. Another error: rebuilt each epoch, failed after JOB_ATTEMPTS in a row.

    The other jobs run every epoch and publish it; a failed job leaves the epochs and is closed.
    """
    host = host_factory(["bad", "flaky", "ok1", "ok2"], parallel=parallel)
    faults: dict[str, BaseException] = {"bad": JobError("bad transform"), "flaky": RuntimeError("boom")}
    bad = host.jobs["bad"]
    flakies = [host.jobs["flaky"]]

    def epoch(n: int) -> None:
        host._run_jobs(n, [(job, lambda job=job: job.run_epoch(n, faults.get(job.name)))
                           for job in list(host.jobs.values())])

    epoch(1)
    assert bad.closed and "bad" not in host.jobs
    assert host.registry.get("bad").error == "bad transform"
    for n in range(2, JOB_ATTEMPTS + 1):
        assert host.jobs["flaky"] is not flakies[-1] and flakies[-1].closed  # rebuilt from its table
        assert host._job_failures == {"flaky": n - 1}
        flakies.append(host.jobs["flaky"])
        epoch(n)
    assert flakies[-1].closed and sorted(host.jobs) == ["ok1", "ok2"]
    assert host.built.count("flaky") == JOB_ATTEMPTS  # built at start, rebuilt after all but the last
    error = host.registry.get("flaky").error
    assert error == f"epoch {JOB_ATTEMPTS} failed {JOB_ATTEMPTS} times in a row: RuntimeError: boom"
    assert sorted(r.name for r in host.registry.failed()) == ["bad", "flaky"]
    for name in ("ok1", "ok2"):
        assert host.jobs[name].committed_epoch == JOB_ATTEMPTS
        assert host.registry.progress(name).epoch == JOB_ATTEMPTS
    assert host._job_failures == {}

    epoch(JOB_ATTEMPTS + 1)  # the failed ones stay out; the others go on
    assert [host.jobs[n].committed_epoch for n in ("ok1", "ok2")] == [JOB_ATTEMPTS + 1] * 2


def test_an_epoch_that_works_again_resets_the_count(host_factory) -> None:
    host = host_factory(["flaky"], parallel=1)
    for n, fault in enumerate([RuntimeError("boom")] * (JOB_ATTEMPTS - 1) + [None] + [RuntimeError("boom")],
                              start=1):
        job = host.jobs["flaky"]
        host._run_jobs(n, [(job, lambda job=job, fault=fault: job.run_epoch(n, fault))])
    assert host.registry.failed() == [] and host._job_failures == {"flaky": 1}


def test_a_job_that_cannot_be_built_is_failed(host_factory) -> None:
    host = host_factory([], parallel=1)
    host.unbuildable.add("broken")
    host.registry.create(JobSpec(name="broken", source="src", sink_path="/tables/broken"))
    host.registry.create(JobSpec(name="fine", source="src", sink_path="/tables/fine"))
    host._recover_jobs()
    assert sorted(host.jobs) == ["fine"]
    assert host.registry.get("broken").error == "job could not start: table owned by another job"


def test_each_job_has_a_series_naming_its_namespace_until_it_is_dropped(host_factory) -> None:
    """job_namespace: what the Grafana dashboard chooses a namespace's jobs by (job series carry only job)."""
    host = host_factory(["plain"], parallel=1)
    host.unbuildable.add("team-a.broken")
    host.registry.create(JobSpec(name="team-a.fine", namespace="team-a", source="src", sink_path="/tables/a"))
    host.registry.create(JobSpec(name="team-a.broken", namespace="team-a", source="src",
                                 sink_path="/tables/b"))
    host._recover_jobs()

    def series() -> dict[str, str]:
        return {job: ns for job, ns in metrics.JOB_NAMESPACE._metrics  # noqa: SLF001
                if job in ("plain", "team-a.fine", "team-a.broken")}

    assert series() == {"plain": "default", "team-a.fine": "team-a", "team-a.broken": "team-a"}
    assert all(metrics.JOB_NAMESPACE.labels(j, ns)._value.get() == 1  # noqa: SLF001
               for j, ns in series().items())
    host._dropped("team-a.fine")
    assert series() == {"plain": "default", "team-a.broken": "team-a"}


# -- lanes: the source's epoch never waits for a slow job (runtime/lanes.py) ----------------------------
@pytest.fixture
def lane_host(host_factory):
    """A host on a 50 ms trigger (its epochs wait 100 ms for the steps), lag bound ``max_lag``."""

    def make(names: list[str], max_lag: float = 900.0) -> Host:
        return host_factory(names, 4, trigger_interval_s=0.05, max_job_lag_s=max_lag)

    return make


def test_a_slow_job_holds_neither_the_epoch_nor_its_neighbours(lane_host) -> None:
    """A step that blocks: the epoch ends without it, the others run every epoch, the slow one skips."""
    host = lane_host(["slow", "a", "b"])
    release = threading.Event()
    ran: dict[str, list[int]] = {"slow": [], "a": [], "b": []}

    def runs(epoch: int) -> list[Any]:
        def run(job: FakeJob) -> None:
            ran[job.name].append(epoch)
            if job.name == "slow" and epoch == 1:
                assert release.wait(30)
            job.run_epoch(epoch)
        return [(job, partial(run, job)) for job in list(host.jobs.values())]

    assert host._run_lanes(1, runs(1)) == ["slow"]  # ended without it
    for epoch in (2, 3, 4):
        host._run_lanes(epoch, runs(epoch))
        assert host.jobs["a"].committed_epoch == host.jobs["b"].committed_epoch == epoch
    assert ran["slow"] == [1] and host.lanes.busy("slow")
    assert host.lanes.lag_s("slow") > 0
    assert host.registry.progress("a").epoch == 4
    release.set()
    assert host.lanes.wait_idle("slow", 30)
    host._run_lanes(5, runs(5))
    assert ran["slow"] == [1, 5]  # its next step: the job rejoins by offsets there (its own check)
    assert host.lanes.wait_idle("slow", 30)  # (a slow job's step is not waited for by the epoch)
    assert host.lanes.lag_s("slow") == 0  # it kept up again: no epoch was skipped while step 5 ran
    assert host.registry.failed() == []


def test_a_job_lagging_past_its_bound_is_failed_saying_so(lane_host) -> None:
    host = lane_host(["slow", "a"], max_lag=0.001)
    release = threading.Event()

    def runs(epoch: int) -> list[Any]:
        def run(job: FakeJob) -> None:
            if job.name == "slow":
                assert release.wait(30)
            job.run_epoch(epoch)
        return [(job, partial(run, job)) for job in list(host.jobs.values())]

    host._run_lanes(1, runs(1))
    host._run_lanes(2, runs(2))  # the first skip: the lag starts
    time.sleep(0.01)
    host._run_lanes(3, runs(3))
    release.set()
    error = host.registry.get("slow").error
    assert error is not None and "fell behind the live stream" in error and "max_job_lag_s" in error
    assert "slow" not in host.jobs and host.jobs["a"].committed_epoch == 3


def test_a_drop_of_a_busy_job_is_applied_as_its_lane_frees(lane_host) -> None:
    """Not at the epoch after: the lane's thread marks the drop applied as the step ends (its record goes)."""
    host = lane_host(["slow", "a"])
    release = threading.Event()
    stopped: list[str] = []
    host._stop_lane = lambda job, why, wait=True: stopped.append(why)  # type: ignore[method-assign]
    slow = host.jobs["slow"]
    host._run_lanes(1, [(slow, lambda: release.wait(30) and slow.run_epoch(1))])
    host.registry.drop("slow")
    applied = host._apply_mutations(host.registry.drain("src"), 2)
    assert "drop" not in [m.kind for m in applied]  # not applied while it runs
    assert "slow" not in host.jobs and slow.closed and stopped == ["dropped"]  # gone, its work cancelled
    assert host.registry.get("slow").dropped  # accepted, not applied
    release.set()
    assert host.lanes.wait_idle("slow", 30)
    deadline = time.monotonic() + 30
    while "slow" in [r.name for r in host.registry.list()] and time.monotonic() < deadline:
        time.sleep(0.01)  # the step's thread applies it as it ends: no epoch comes meanwhile
    assert "slow" not in [r.name for r in host.registry.list()]
    assert host._deferred == []
    assert slow.committed_epoch == 1  # (a fake: a real job's commit is refused once its lane is stopped)
    assert host.registry.progress("slow") is None  # its record is gone; the step published nothing


def test_a_suspect_job_still_runs_alone_with_every_lane_idle(lane_host) -> None:
    """Quarantine's rule across lanes: the epoch waits for the busy lanes, then runs the suspect alone."""
    host = lane_host(["a", "s"])
    host._suspect = lambda name: name == "s"  # type: ignore[method-assign]
    lock = threading.Lock()
    running: set[str] = set()
    beside: dict[str, set[str]] = {}

    def run(name: str) -> None:
        with lock:
            running.add(name)
            beside.setdefault(name, set()).update(running)
        time.sleep(0.2)  # longer than the lanes' wait: "a" of epoch 1 still runs when epoch 2 comes
        with lock:
            running.discard(name)

    a = host.jobs["a"]
    host._suspect = lambda name: False  # type: ignore[method-assign]
    host._run_lanes(1, [(a, partial(run, "a"))])
    host._suspect = lambda name: name == "s"  # type: ignore[method-assign]
    host._run_lanes(2, [(job, partial(run, job.name)) for job in host.jobs.values()])
    assert beside["s"] == {"s"}


def test_a_retry_into_a_new_table_builds_the_job_on_it_and_a_reset_is_applied_as_nothing(
    host_factory,
) -> None:
    """The epoch loop's part of starting over: a ``retry`` carrying a new spec builds the job from that spec
    (its new table, from the earliest offsets); a source's ``reset`` line (no job) is marked applied at the
    first epoch of the source started again, changing no job."""
    from source_backfill.config import RetrySpec

    host = host_factory(["a", "b"], 1)
    host.registry.mark_applied([x.id for x in host.registry.drain("src")], 0)  # their creates
    host.registry.set_failed("a", "topic t was deleted and created again")
    host._fail("a", "topic t was deleted and created again")  # noqa: SLF001 - as the source fails it
    retried = host.registry.retry("a", new_table=RetrySpec.model_validate({"from": "earliest",
                                                                          "new_table": True}))
    m, _ = host.registry.reset_source("src")
    pending = host.registry.drain("src")
    applied = host._apply_mutations(pending, 0)  # noqa: SLF001 - the new checkpoint's epoch 0
    assert [x.kind for x in applied] == ["retry", "reset"] and m in applied
    assert "a" in host.jobs and host.built[-1] == "a"
    assert host.registry.get("a").spec == retried.spec and retried.spec.sink_path.endswith("/a-2")
    assert sorted(host.jobs) == ["a", "b"]
