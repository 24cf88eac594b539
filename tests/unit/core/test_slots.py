"""A source's history slots (core/slots.py): within the width, in turn, and at the duty below one task."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from source_backfill.core.slots import HistorySlots
from tests.budget import examples


def test_copies_hold_at_most_the_width_and_a_freed_slot_goes_to_the_job_that_waited():
    slots = HistorySlots(tasks=2, stale_s=5.0)
    assert slots.take("a", 1, 0.0) and slots.take("b", 1, 0.0)
    assert not slots.take("c", 1, 0.1) and not slots.take("d", 1, 0.2)  # queued: c, then d
    assert slots.give_back("a", 1.0, 1.0) == "c"  # c is asked to try now
    assert not slots.take("a", 1, 1.0)  # a's next copy waits behind c and d
    assert not slots.take("d", 1, 1.0)  # d is behind c
    assert slots.take("c", 1, 1.0)
    assert slots.held == {"b": 1, "c": 1} and list(slots.waiting) == ["d", "a"]


def test_a_job_that_stopped_asking_leaves_the_queue():
    slots = HistorySlots(tasks=1, stale_s=5.0)
    assert slots.take("a", 1, 0.0)
    assert not slots.take("gone", 1, 0.0)  # asks once, then finishes (never asks again)
    assert not slots.take("b", 1, 1.0)
    assert slots.give_back("a", 1.0, 2.0) == "gone"
    assert not slots.take("b", 1, 2.0)  # gone is still first, within stale_s
    assert slots.take("b", 1, 6.0)  # 6 s since gone asked: it left


def test_a_job_is_not_granted_a_second_copy_while_one_runs_and_asks_for_no_more_than_the_width():
    slots = HistorySlots(tasks=4)
    assert slots.take("a", 16, 0.0) and slots.held == {"a": 4}
    assert not slots.take("a", 1, 0.0)
    slots.leave("a")
    assert slots.free() == 4 and not slots.waiting


def test_below_one_task_a_copy_closes_the_slots_for_the_rest_of_its_duty_cycle():
    slots = HistorySlots()
    slots.resize(1, 0.25)
    assert slots.take("a", 1, 0.0)
    assert slots.give_back("a", 2.0, 2.0) is None  # 2 s of copy at a quarter: closed for 6 s
    assert not slots.take("a", 1, 7.9)
    assert slots.take("a", 1, 8.0)


@settings(max_examples=examples(200))
@given(
    tasks=st.integers(1, 4),
    duty=st.sampled_from([0.125, 0.25, 0.5, 1.0]),
    jobs=st.integers(1, 6),
    copy_s=st.lists(st.floats(0.05, 3.0), min_size=1, max_size=8),
)
def test_jobs_asking_each_epoch_copy_within_the_width_in_turn_and_at_the_duty(tasks, duty, jobs, copy_s):
    """Jobs asking every 0.1 s (their epochs, their copies' ends), each copy taking its job's next
    duration: never more than ``tasks`` running, every job gets turns (none waits while another copies
    again), and below one task the copies run at most ``duty`` of the time (plus one copy)."""
    slots = HistorySlots(stale_s=5.0)
    slots.resize(tasks, duty)
    names = [f"j{i}" for i in range(jobs)]
    running: dict[str, float] = {}  # job -> when its copy ends
    started: dict[str, float] = {}
    copies = {n: 0 for n in names}
    since_turn = {n: 0 for n in names}  # copies others started since this job began waiting
    busy, now, step = 0.0, 0.0, 0.1
    while now < 120.0:
        for name, ends in sorted(running.items(), key=lambda kv: kv[1]):
            if ends <= now:
                del running[name]
                slots.give_back(name, now - started[name], now)
                since_turn[name] = 0
        for name in names:
            if name not in running and slots.take(name, 1, now):
                running[name], started[name] = now + copy_s[copies[name] % len(copy_s)], now
                copies[name] += 1
                for other in names:
                    since_turn[other] = 0 if other == name else since_turn[other] + 1
                assert max((since_turn[o] for o in names if o not in running), default=0) < jobs
        assert len(running) <= tasks
        busy += step * min(1, len(running)) if tasks == 1 else 0.0
        now += step
    # every job had a turn once the copies were as many as the jobs (a long duty cycle allows fewer)
    assert sum(copies.values()) < jobs or all(copies[n] > 0 for n in names)
    if tasks == 1 and duty < 1.0:
        assert busy <= duty * now + max(copy_s) + step


def test_a_job_with_nothing_to_copy_withdraws_and_the_next_in_turn_is_asked():
    slots = HistorySlots(tasks=1, stale_s=60.0)
    assert slots.take("a", 1, 0.0)
    assert not slots.take("b", 1, 0.1) and not slots.take("c", 1, 0.2)
    assert slots.give_back("a", 1.0, 1.0) == "b"
    assert slots.withdraw("b", 1.1) == "c"  # b's tail is read in its epoch: it asks no more
    assert slots.take("c", 1, 1.1)  # not held back for stale_s behind b
    assert slots.withdraw("b", 1.2) is None  # not queued: nothing to do
