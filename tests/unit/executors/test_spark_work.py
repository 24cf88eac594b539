"""Attribution of crashes to the jobs whose Spark work was in flight, and the deadline of that work
(``executors/spark_work.py``), without Spark: a fake SparkContext records tags and cancels."""

from __future__ import annotations

import threading
import time

import pytest

from source_backfill.errors import SparkWorkTimeoutError
from source_backfill.executors.spark_work import EPOCH, READ_AHEAD, SparkWork, WorkLedger


class _FakeContext:
    """The SparkContext calls SparkWork makes; a cancelled tag makes the running 'Spark job' raise."""

    def __init__(self) -> None:
        self.tags: set[str] = set()
        self.cancelled: list[str] = []

    def addJobTag(self, tag: str) -> None:  # noqa: N802 - pyspark's name
        self.tags.add(tag)

    def removeJobTag(self, tag: str) -> None:  # noqa: N802
        self.tags.discard(tag)

    def cancelJobsWithTag(self, tag: str) -> None:  # noqa: N802
        self.cancelled.append(tag)

    def run_job(self, seconds: float) -> None:
        """A 'Spark job' of the calling work: raises once its tag is cancelled."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if self.tags & set(self.cancelled):
                msg = "[SPARK_JOB_CANCELLED] Job 3 cancelled part of cancelled job tags"
                raise RuntimeError(msg)
            time.sleep(0.01)


class _FakeSpark:
    def __init__(self) -> None:
        self.sparkContext = _FakeContext()


def _work(tmp_path, alive=lambda: True):
    spark = _FakeSpark()
    return SparkWork(spark, WorkLedger(tmp_path / "spark-work"), alive=alive), spark.sparkContext


def test_a_marker_names_the_job_while_its_spark_work_runs_and_goes_after(tmp_path):
    work, _ = _work(tmp_path)
    with work.running("a", "epoch 3", 60):
        assert work.ledger.in_flight() == ["a"]
        with work.running("a", "a read ahead", 60):  # epoch and read ahead overlap: one marker
            assert work.ledger.in_flight() == ["a"]
        assert work.ledger.in_flight() == ["a"]
    assert work.ledger.in_flight() == []


def test_a_failure_while_the_jvm_answers_clears_the_marker_and_one_while_it_is_gone_keeps_it(tmp_path):
    alive = {"jvm": True}
    work, _ = _work(tmp_path, alive=lambda: alive["jvm"])
    with pytest.raises(RuntimeError), work.running("a", "epoch 1", 60):
        raise RuntimeError("a Spark job failed")
    assert work.ledger.in_flight() == []
    alive["jvm"] = False
    with pytest.raises(RuntimeError), work.running("a", "epoch 2", 60):
        raise RuntimeError("Answer from Java side is empty")
    assert work.ledger.in_flight() == ["a"]


def test_crashes_count_only_the_jobs_in_flight_reset_on_an_epoch_and_reach_the_limit(tmp_path):
    root = tmp_path / "spark-work"
    registered = {"a", "b"}
    for crash in range(1, 4):
        ledger = WorkLedger(root)
        counts = ledger.recover(registered)
        assert counts.get("a", None) is None or counts["a"].count == crash - 1
        ledger.begin("a", EPOCH)  # a's transform runs when the JVM dies; b is between its epochs
        ledger.jvm_died("Spark's JVM (pid 1) killed by signal SIGKILL (9)")
    counts = WorkLedger(root).recover(registered)
    assert counts["a"].count == 3 and "SIGKILL" in counts["a"].last
    assert "b" not in counts  # never every job of the source: only the one in flight
    # a read ahead completing is not what crashed; an epoch completing is: from 0, durably
    ledger = WorkLedger(root)
    ledger.completed("a", READ_AHEAD)
    assert WorkLedger(root).crashes["a"].count == 3
    ledger.completed("a", EPOCH)
    assert WorkLedger(root).recover(registered) == {}


def test_a_read_ahead_that_crashes_is_counted_while_the_jobs_epochs_commit(tmp_path):
    root = tmp_path / "spark-work"
    for _ in range(3):
        ledger = WorkLedger(root)
        ledger.recover({"a"})
        ledger.completed("a", EPOCH)  # its epochs commit between the crashes
        ledger.begin("a", READ_AHEAD)
        ledger.jvm_died("out of memory")
    assert WorkLedger(root).recover({"a"})["a"].count == 3


def test_a_kill_of_the_whole_daemon_or_a_clean_end_counts_no_crash(tmp_path):
    root = tmp_path / "spark-work"
    ledger = WorkLedger(root)
    with ledger_running(ledger, "a"):
        pass  # ended cleanly
    assert WorkLedger(root).recover({"a"}) == {}
    WorkLedger(root).begin("a")  # the process group was killed while it ran: no JVM death written down
    assert WorkLedger(root).recover({"a"}) == {}
    assert WorkLedger(root).in_flight() == []  # and the markers are gone
    ledger = WorkLedger(root)
    ledger.begin("a")
    ledger.jvm_died("gone")
    assert WorkLedger(root).recover(set()) == {}  # a job no longer registered is forgotten


def ledger_running(ledger, job):
    from contextlib import contextmanager

    @contextmanager
    def run():
        ledger.begin(job)
        try:
            yield
        finally:
            ledger.end(job)

    return run()


def test_work_past_its_deadline_is_cancelled_and_fails_with_the_deadline_in_its_error(tmp_path):
    work, sc = _work(tmp_path)
    ticking = threading.Event()

    def ticks():
        while not ticking.wait(0.05):
            work.tick()

    threading.Thread(target=ticks, daemon=True).start()
    try:
        t0 = time.monotonic()
        with pytest.raises(SparkWorkTimeoutError, match=r"deadline of 0.3 s \(sources\[\].job_timeout_s\)"), \
                work.running("slow", "epoch 7", 0.3):
            sc.run_job(30)
        assert time.monotonic() - t0 < 5
        assert len(sc.cancelled) >= 1 and not sc.tags
        # another job's work in time is not touched
        with work.running("quick", "epoch 7", 30):
            sc.run_job(0.2)
    finally:
        ticking.set()
    assert work.ledger.in_flight() == []


def test_a_cancel_ends_only_that_jobs_work_says_why_and_is_not_a_timeout(tmp_path):
    """A drop or a retry cancels the job's Spark work by its tags, at once and again at each tick."""
    from source_backfill.errors import LaneStoppedError, SparkWorkCancelledError

    class _PerThread(_FakeContext):
        """Tags per thread, as Spark's are: a cancel reaches only the works of the cancelled tags."""

        def __init__(self) -> None:
            self._local = threading.local()
            super().__init__()

        @property  # type: ignore[override]
        def tags(self) -> set[str]:
            if not hasattr(self._local, "tags"):
                self._local.tags = set()
            return self._local.tags

        @tags.setter
        def tags(self, value: set[str]) -> None:
            self._local.tags = value

    spark = _FakeSpark()
    spark.sparkContext = sc = _PerThread()
    work = SparkWork(spark, WorkLedger(tmp_path / "spark-work"), alive=lambda: True)
    outcome: dict[str, BaseException | None] = {}
    started = threading.Barrier(3, timeout=10)

    def run(job: str) -> None:
        try:
            with work.running(job, f"{job}'s epoch 7", 600):
                started.wait()
                sc.run_job(30)
            outcome[job] = None
        except BaseException as exc:  # noqa: BLE001
            outcome[job] = exc

    threads = [threading.Thread(target=run, args=(job,)) for job in ("dropped", "other")]
    for thread in threads:
        thread.start()
    started.wait()
    assert work.cancel("dropped", "dropped") == 1
    threads[0].join(10)
    exc = outcome["dropped"]
    assert isinstance(exc, SparkWorkCancelledError) and isinstance(exc, LaneStoppedError)
    assert not isinstance(exc, SparkWorkTimeoutError)  # not the job's failure
    assert "dropped's epoch 7 was cancelled: dropped" in str(exc)
    assert threads[1].is_alive()  # the other job's work runs on
    work.tick()  # a cancelled work is not reported as past its deadline
    assert len(sc.cancelled) == 1
    work.cancel("other", "the daemon is stopping")
    threads[1].join(10)
    assert isinstance(outcome["other"], SparkWorkCancelledError)
    assert work.ledger.in_flight() == []
