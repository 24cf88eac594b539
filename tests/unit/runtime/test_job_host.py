"""The jobs of a source run their epochs side by side, each failing alone (JobHost._run_jobs)."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

from source_backfill.config import JobSpec, SourceConfig
from source_backfill.errors import JobError
from source_backfill.runtime.jobs import JOB_ATTEMPTS, JobHost
from source_backfill.runtime.registry import JobRegistry


class FakeJob:
    def __init__(self, name: str) -> None:
        self.name = name
        self.paused = False
        self.rate_limit: float | None = None
        self.closed = False

    def close(self) -> None:
        self.closed = True


class Host(JobHost):
    def __init__(self, config: SourceConfig, registry: JobRegistry) -> None:
        super().__init__(config, registry)
        self.built: list[str] = []

    def _new_job(self, spec: JobSpec) -> FakeJob:
        self.built.append(spec.name)
        return FakeJob(spec.name)

    def _progress(self, job: Any) -> Any:
        return None


@pytest.fixture
def host_factory(tmp_path: Path):
    made: list[tuple[Host, JobRegistry]] = []

    def make(names: list[str], parallel: int) -> Host:
        registry = JobRegistry(tmp_path / f"state{len(made)}", ["src"])
        host = Host(SourceConfig(name="src", topics=["t"], max_parallel_jobs=parallel), registry)
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
