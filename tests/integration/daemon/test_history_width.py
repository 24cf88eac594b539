"""The history width on the real stack: copies as wide as the free slots, narrower when live latency rises.

The tasks a read ahead ran are read from Spark's own status (its job group's stages), not assumed; each
case ends with the offset-by-offset exactly-once check.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from source_backfill import metrics
from source_backfill.testing.metrics import scrape, total
from tests.integration.daemon.conftest import exactly_once, finished, job_of, job_spec, metric_total, wait_for

pytestmark = pytest.mark.integration


class TaskWatch:
    """Polls a job's reads ahead and records the most tasks any stage of theirs had (Spark's status)."""

    def __init__(self, spark: Any, job: Any) -> None:
        self.tracker = spark.sparkContext.statusTracker()
        self.job = job
        self.most = 0
        #: The source's history width, as seen while the reads ran.
        self.widths: set[int] = set()
        self.groups: set[str] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            with self.job._reads.lock:  # noqa: SLF001
                running = {read.group for read in self.job._reads._reads}  # noqa: SLF001
            if running:
                self.widths.add(self.job.history_tasks)
            self.groups |= running
            for group in list(self.groups):
                for job_id in self.tracker.getJobIdsForGroup(group):
                    info = self.tracker.getJobInfo(job_id)
                    for stage_id in info.stageIds if info is not None else ():
                        stage = self.tracker.getStageInfo(stage_id)
                        if stage is not None:
                            self.most = max(self.most, stage.numTasks)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)


def test_a_lone_jobs_copy_of_one_partition_runs_on_every_free_slot(
    spark, daemon_factory, new_topic, producer_for, kafka_bootstrap, tmp_path
):
    """No Finished job on the source: no live latency to keep, so the read ahead takes every slot
    (local[2]: 2 tasks), its one partition cut into offset pieces."""
    topic = new_topic(1)
    p = producer_for(topic)
    for batch in range(2):  # the producer's queue holds 100,000
        p.send(100_000, 1, start=batch * 100_000)
    d = daemon_factory([topic], [job_spec("wide", tmp_path)])
    wait_for(lambda: "wide" in d.sources["src"].jobs, what="job built")
    job = job_of(d, "wide")
    watch = TaskWatch(spark, job)
    try:
        wait_for(lambda: finished(d, "wide"), timeout=240, what="backfill finished")
    finally:
        watch.stop()
    assert watch.groups, "no history read ahead ran"
    assert watch.widths == {2}
    assert watch.most == 2, f"read ahead stages had at most {watch.most} tasks"
    exactly_once(tmp_path / "wide", kafka_bootstrap, [topic])
    # the copies' time on the width, counted for its namespace (the turns by namespace go by it)
    from source_backfill import metrics

    assert metric_total(metrics.HISTORY_SLOT_SECONDS, source="src", namespace="default") > 0


@pytest.mark.slow  # real load: make test-slow. make test has it with injected latency samples
# (tests/unit/runtime/test_width.py, ..._doubles_while_the_live_latency_keeps_the_target_then_narrows...)
@pytest.mark.xfail(strict=False, reason=(
    "since the lanes (issue 45) the last step fails: the width narrows to one task but the duty never "
    "falls below it within 120 s (3 runs of 3 on 2026-11-28, also with the governor taking a slow job's "
    "latencies, fde7c54). The live job's 1.5 s steps skip epochs and rejoin by offsets: suspect what "
    "reaches the governor's duty steps then (copying / at_width / live rows vs rejoined ones). Open."))
def test_the_width_narrows_when_the_live_latency_of_a_finished_job_rises(
    spark, daemon_factory, new_topic, producer_for, kafka_bootstrap, tmp_path, monkeypatch
):
    """A Finished job keeps its latency target while the width doubles to 2; then its live path is slowed
    on purpose (each epoch waits before its commit) and the governor comes back to 1 task."""
    from source_backfill.config import JobSpec
    from source_backfill.executors.source_backfill import SourceBackfillJob

    slow = threading.Event()
    original = SourceBackfillJob.run_epoch

    def run_epoch(self: Any, inp: Any) -> bool:
        if self.name == "live" and slow.is_set():
            time.sleep(1.5)  # the live rows wait: their produce-to-commit latency rises by 1.5 s
        return original(self, inp)

    monkeypatch.setattr(SourceBackfillJob, "run_epoch", run_epoch)
    topic = new_topic(2)
    p = producer_for(topic)
    for batch in range(6):  # history for the second job, copied at a rate limit: it lasts the test
        p.send(100_000, 2, start=batch * 100_000)
    width = {"latency_target_s": 1.5}
    # the live job starts at the live position (the end of that history: nothing else is written until
    # it is Finished), so the history is the late job's alone
    d = daemon_factory([topic], [job_spec("live", tmp_path, start={"kind": "latest"})], history_width=width)
    wait_for(lambda: finished(d, "live"), timeout=120, what="the live job Finished")
    attached = {f"{topic}:0": 300_000, f"{topic}:1": 300_000}
    p.stream(2, per_second=40)
    # a light copy (5,000 rows/s): at 20,000 one task of it could take the live p99 over 1.5 s by itself
    # on a busy machine, and the governor went below one task before ever trying two
    d.registry.create(JobSpec(**job_spec("late", tmp_path, rate_limit=5_000)))
    source = d.sources["src"]
    gauge = metrics.HISTORY_WIDTH.labels("src")
    wait_for(lambda: source.width.latency_s is not None and source.width.width == 2
             and gauge._value.get() == 2, timeout=120,  # noqa: SLF001
             what="the width doubled while the live latency kept its target")
    assert source.width.latency_s is not None and source.width.latency_s <= 1.5
    assert not finished(d, "late")
    # the rest of the history must outlast the waits below (up to 2 x 120 s): at 5,000 rows/s the copy
    # of 600,000 ended within them on a busy machine, and with no copy left the duty never fell
    d.registry.throttle("late", 1_000)
    slow.set()
    wait_for(lambda: source.width.width == 1, timeout=120, what="the width narrowed")
    assert source.width.latency_s is not None and source.width.latency_s > 1.5
    assert gauge._value.get() == 1  # noqa: SLF001
    # the figure it steered by and the target it kept, as /metrics gives them
    scraped = scrape(d.api_url)
    assert total(scraped, "history_width_tasks", source="src") == 1
    assert total(scraped, "history_width_latency_seconds", source="src") > 1.5  # over the target: narrowed
    assert total(scraped, "history_width_target_seconds", source="src") == pytest.approx(1.5)
    assert total(scraped, "history_width_duty_ratio", source="src") == 1.0
    # one task at a time is still too much for the target: the governor slows the copies down below it
    wait_for(lambda: source.width.duty < 1.0, timeout=120, what="the copies slowed below one task")
    assert total(scrape(d.api_url), "history_width_duty_ratio", source="src") < 1.0
    slow.clear()
    job_of(d, "late").rate_limit = None
    wait_for(lambda: finished(d, "late"), timeout=240, what="late job finished")
    p.stop()
    exactly_once(tmp_path / "late", kafka_bootstrap, [topic])
    exactly_once(tmp_path / "live", kafka_bootstrap, [topic], start=attached)


def test_backfilling_jobs_take_the_width_in_turns(daemon_factory, new_topic, producer_for, kafka_bootstrap,
                                                  tmp_path):
    """Three jobs backfilling on a width of one task: their reads ahead run one at a time (never two at
    once, each job in its turn), and each job's table is exactly the log."""
    topic = new_topic(2)
    p = producer_for(topic)
    p.send(60_000, 2)
    names = ["t0", "t1", "t2"]
    d = daemon_factory([topic], [job_spec(n, tmp_path, rate_limit=15_000) for n in names],
                       history_width={"fixed_tasks": 1})
    wait_for(lambda: all(n in d.sources["src"].jobs for n in names), what="jobs built")
    most, copied_by, stop = [0], set(), threading.Event()

    def watch() -> None:
        while not stop.wait(0.02):
            running = []
            for n in names:
                job = job_of(d, n)
                with job._reads.lock:  # noqa: SLF001
                    if any(not a.done.is_set() for a in job._reads._reads):  # noqa: SLF001
                        running.append(n)
            most[0] = max(most[0], len(running))
            copied_by.update(running)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        wait_for(lambda: all(finished(d, n) for n in names), timeout=240, what="the three backfills")
    finally:
        stop.set()
        watcher.join(5)
    assert most[0] == 1, f"{most[0]} reads ahead ran at once on a width of one task"
    assert copied_by == set(names)
    # every slot comes back: a job's last read ahead may still be ending (its slot given back as its Spark
    # job ends) at the moment the job shows Finished on a busy machine (seen once with two test workers)
    wait_for(lambda: d.sources["src"].gate.holding() == {}, timeout=30, what="the history slots back")
    for n in names:
        exactly_once(tmp_path / n, kafka_bootstrap, [topic])
