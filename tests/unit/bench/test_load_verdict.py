"""The load benchmark's verdict: epochs run against the window's intervals, a dead JVM fails the run."""

from __future__ import annotations

import pytest

from bench.__main__ import failed_verdicts
from bench.load_verdict import death_markers, epochs_ratio, judge, window_intervals


def test_the_ratio_is_epochs_over_the_intervals_the_window_holds():
    assert window_intervals(600, 1) == 600
    assert window_intervals(600, 30) == 20
    assert epochs_ratio(540, 600, 1) == pytest.approx(0.9)
    assert epochs_ratio(-3, 600, 1) == 0.0  # a daemon that stopped answering scrapes as nothing
    with pytest.raises(ValueError, match="positive"):
        window_intervals(600, 0)


def test_the_issue_run_fails_though_its_epochs_were_within_the_interval():
    # 68 epochs in 360 s at a 1 s trigger (94 % within the interval, no failed job): the JVM was dead
    verdict = judge(epochs=68, window_s=360, interval_s=1)
    assert not verdict.ok
    assert verdict.ratio == pytest.approx(68 / 360)
    assert "0.189 of the 360 intervals" in verdict.line()
    assert verdict.line().startswith("load: FAILED: ")


def test_ninety_percent_of_the_intervals_pass_and_fewer_fail():
    assert judge(epochs=540, window_s=600, interval_s=1).ok
    assert judge(epochs=600, window_s=600, interval_s=1).line() == \
        "load: OK (epochs run / window intervals = 1.000)"
    assert not judge(epochs=539, window_s=600, interval_s=1).ok


def test_one_epoch_of_slack_for_the_window_edges():
    # a 30 s trigger in a 60 s window: one epoch may run across a scrape
    assert judge(epochs=1, window_s=60, interval_s=30).ok
    assert not judge(epochs=0, window_s=60, interval_s=30).ok
    assert judge(epochs=19, window_s=600, interval_s=30).ok


def test_a_dead_jvm_fails_whatever_the_epochs():
    verdict = judge(epochs=600, window_s=600, interval_s=1,
                    dead=["Spark JVM process gone", "/live 503", "Spark JVM process gone"])
    assert not verdict.ok
    assert verdict.reasons == ["Spark JVM dead: Spark JVM process gone", "Spark JVM dead: /live 503"]


def test_errors_and_failed_jobs_fail_the_run():
    assert judge(epochs=600, window_s=600, interval_s=1, errors=2).reasons == ["2 source errors"]
    assert judge(epochs=600, window_s=600, interval_s=1, failed_jobs=1).reasons == ["1 failed jobs"]


def test_death_markers_in_the_daemon_log():
    log = [
        "26/11/25 13:00:03 WARN InternalKafkaConsumerPool: Pool exceeds its soft max size",
        "java.lang.OutOfMemoryError: Java heap space",
        "ConnectionRefusedError: [Errno 111] Connection refused",
        "java.lang.OutOfMemoryError: Java heap space",
        "INFO epoch committed job=\"live1\" epoch=71",
    ]
    assert death_markers(log) == ["java.lang.OutOfMemoryError", "ConnectionRefusedError"]
    assert death_markers(["INFO all fine"]) == []


def test_a_failed_verdict_fails_the_bench_run():
    assert failed_verdicts({"load.epochs": 600, "load.verdict": "ok"}) == {}
    assert failed_verdicts({"load.verdict": "FAILED: Spark JVM dead: /live 503"}) == {
        "load.verdict": "FAILED: Spark JVM dead: /live 503"}
