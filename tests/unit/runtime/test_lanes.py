"""The lanes' book (``runtime/lanes.py``): a job's lag is the age of the oldest skipped epoch its output
does not hold yet, against a reference that keeps every skip until a step handed after it has ended.

Times are given (``now``), so nothing here waits on the clock.
"""

from __future__ import annotations

import time
from concurrent.futures import Future

from hypothesis import given, settings
from hypothesis import strategies as st

from source_backfill.runtime.lanes import FAST_STEPS_TO_WAIT, Lanes
from tests.budget import examples


def _start(lanes: Lanes, job: str = "j") -> Future[object]:
    lanes.handing(job)
    step: Future[object] = Future()
    lanes.handed(job, step)
    return step


def test_a_job_whose_every_step_is_a_rejoin_slower_than_the_trigger_stays_a_step_behind() -> None:
    """0.5 s trigger, the epoch waits 1 s, each step (a rejoin: a Spark read of the skipped offsets) takes
    1.5 s: the job skips every other epoch for ever, yet its output is never more than a step and a
    trigger behind. Measured since its first skip, it would pass any bound (the bug this fixes)."""
    lanes = Lanes(wait_s=1.0)
    t, worst = 0.0, 0.0
    for _ in range(200):
        step = _start(lanes)
        worst = max(worst, lanes.lag_s("j", t))
        worst = max(worst, lanes.skipped("j", t + 0.5))  # the next epoch finds its lane busy
        lanes.ended("j", 1.5, now=t + 1.5)
        step.set_result(None)
        worst = max(worst, lanes.lag_s("j", t + 1.5))
        t += 2.0  # its next step at the epoch after
    assert worst <= 2.0  # the step's 1.5 s and the trigger it skipped; 200 cycles: 400 s since the first


def test_a_job_that_really_falls_behind_lags_more_with_each_step() -> None:
    """Each step 60 s on a 1 s trigger: the lag is the age of the oldest record no step has written."""
    lanes = Lanes(wait_s=2.0)
    step = _start(lanes)
    for k in range(1, 60):
        lanes.skipped("j", float(k))  # epochs 1..59 skipped while the first step runs
    assert lanes.lag_s("j", 60.0) == 59.0
    lanes.ended("j", 60.0, now=60.0)
    step.set_result(None)
    assert lanes.lag_s("j", 60.0) == 59.0  # its output ends at epoch 0: epoch 1's records wait
    step = _start(lanes)  # at 60: the rejoin reads epochs 1..59
    for k in range(61, 120):
        lanes.skipped("j", float(k))
    assert lanes.lag_s("j", 119.0) == 118.0  # epoch 1's records still wait for this step to end
    lanes.ended("j", 60.0, now=120.0)
    step.set_result(None)
    assert lanes.lag_s("j", 120.0) == 59.0  # its output now holds epochs up to 60


def test_a_long_step_with_no_epoch_skipped_meanwhile_leaves_no_lag() -> None:
    lanes = Lanes(wait_s=1.0)
    step = _start(lanes)
    lanes.ended("j", 5.0, now=5.0)  # longer than the wait, but the next epoch had not come
    step.set_result(None)
    assert lanes.lag_s("j", 5.0) == 0.0
    assert not lanes.busy("j")


def test_a_slow_jobs_quick_rejoin_step_does_not_make_the_epoch_wait_for_its_next_heavy_step() -> None:
    """A heavy job: a 30 s step, then its rejoin's first commit (0.3 s, no rows), then 30 s again. The
    epoch must not wait for the step after the quick one (it held every neighbour a whole wait)."""
    lanes = Lanes(wait_s=2.0)
    assert lanes.waited("heavy")
    for seconds in (30.0, 0.3, 30.0, 0.3, 30.0):
        _start(lanes, "heavy").set_result(None)
        lanes.ended("heavy", seconds)
        assert not lanes.waited("heavy")


def test_a_job_slow_once_is_waited_for_again_after_enough_quick_steps() -> None:
    lanes = Lanes(wait_s=2.0)
    _start(lanes).set_result(None)
    lanes.ended("j", 5.0)  # a slow first write, say
    for _ in range(FAST_STEPS_TO_WAIT - 1):
        _start(lanes).set_result(None)
        lanes.ended("j", 0.1)
        assert not lanes.waited("j")
    _start(lanes).set_result(None)
    lanes.ended("j", 0.1)
    assert lanes.waited("j")


def test_the_epoch_does_not_wait_for_a_slow_jobs_step() -> None:
    """``wait`` returns without the wait's 30 s with the slow job's step running."""
    lanes = Lanes(wait_s=30.0)
    _start(lanes, "heavy").set_result(None)
    lanes.ended("heavy", 60.0)
    heavy = _start(lanes, "heavy")
    light = _start(lanes, "light")
    light.set_result(None)
    t0 = time.monotonic()
    assert lanes.wait({"heavy": heavy, "light": light}, started=t0) == ["heavy"]
    assert time.monotonic() - t0 < 30.0


def test_forget_starts_a_job_anew() -> None:
    lanes = Lanes(wait_s=1.0)
    _start(lanes)
    lanes.skipped("j", 1.0)
    lanes.forget("j")
    assert lanes.lag_s("j", 10.0) == 0.0


#: One lane's events: a step handed, an epoch skipped (only while a step runs), the step's end; each
#: after a pause in seconds.
_EVENTS = st.lists(st.tuples(st.sampled_from(["hand", "skip", "end"]), st.floats(0.0, 10.0)), max_size=60)


@given(_EVENTS)
@settings(max_examples=examples(200))
def test_the_lag_is_the_oldest_skip_no_ended_step_covers(events: list[tuple[str, float]]) -> None:
    """Reference: every skip is kept until a step handed after it has ended; the lag is the oldest's age."""
    lanes = Lanes(wait_s=1.0)
    now, running = 0.0, False
    waiting: list[float] = []  # skips no step has been handed since
    covered: list[float] = []  # skips the step in flight reads
    for kind, pause in events:
        now += pause
        if kind == "hand" and not running:
            _start(lanes)
            covered, waiting, running = waiting, [], True
        elif kind == "skip" and running:
            lanes.skipped("j", now)
            waiting.append(now)
        elif kind == "end" and running:
            lanes.ended("j", 0.5, now=now)
            covered, running = [], False
        oldest = min(covered + waiting, default=None)
        assert lanes.lag_s("j", now) == (0.0 if oldest is None else now - oldest)
