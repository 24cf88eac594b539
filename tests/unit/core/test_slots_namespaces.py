"""The history slots' turns by namespace: each namespace holds its share of the width over time, whatever
its number of jobs, and one coming back after idling does not take the width to make up for it."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from source_backfill.core.slots import HistorySlots
from tests.budget import examples


def _simulate(slots: HistorySlots, jobs: dict[str, str], seconds: float, seed: int,
              active: dict[str, tuple[float, float]] | None = None) -> dict[str, float]:
    """Every job asks at each 0.25 s tick while its namespace is active, each copy lasts 0.5-2 s (one task);
    the slot-seconds each namespace's ended copies held."""
    rng = random.Random(seed)
    running: dict[str, tuple[float, float]] = {}  # job -> (start, end)
    held = dict.fromkeys(set(jobs.values()), 0.0)
    now = 0.0
    while now < seconds:
        for job, (start, end) in list(running.items()):
            if end <= now:
                del running[job]
                held[jobs[job]] += end - start
                slots.give_back(job, end - start, now)
        order = list(jobs)
        rng.shuffle(order)  # who asks first in a tick is not the namespace's doing
        for job in order:
            lo, hi = (active or {}).get(jobs[job], (0.0, seconds))
            if job not in running and lo <= now < hi and slots.take(job, 1, now):
                running[job] = (now, now + rng.uniform(0.5, 2.0))
        now = round(now + 0.25, 6)
    return held


def _shares(held: dict[str, float]) -> dict[str, float]:
    total = sum(held.values())
    return {ns: h / total for ns, h in held.items()}


@settings(max_examples=examples(40), deadline=None)
@given(a_jobs=st.integers(1, 15), b_jobs=st.integers(1, 15), tasks=st.integers(1, 3),
       seed=st.integers(0, 999))
def test_two_namespaces_of_equal_shares_each_hold_about_half_the_width(a_jobs, b_jobs, tasks, seed):
    # each namespace asks enough to fill the width alone (a namespace of one job holds one task at most)
    a_jobs, b_jobs = max(a_jobs, tasks), max(b_jobs, tasks)
    jobs = {f"a{i}": "a" for i in range(a_jobs)} | {f"b{i}": "b" for i in range(b_jobs)}
    slots = HistorySlots(tasks=tasks, stale_s=5.0, namespace_of=jobs.__getitem__)
    share = _shares(_simulate(slots, jobs, 300.0, seed))
    assert abs(share["a"] - 0.5) <= 0.1, share  # within 20 % of half


@settings(max_examples=examples(20), deadline=None)
@given(seed=st.integers(0, 999))
def test_shares_two_to_one_hold_two_thirds_and_one_third(seed):
    jobs = {f"a{i}": "a" for i in range(2)} | {f"b{i}": "b" for i in range(12)}
    slots = HistorySlots(tasks=2, namespace_of=jobs.__getitem__, shares={"a": 2.0})
    share = _shares(_simulate(slots, jobs, 300.0, seed))
    assert abs(share["a"] - 2 / 3) <= 0.1, share


def test_a_namespace_back_from_idling_does_not_take_the_width_to_make_up():
    jobs = {"a0": "a", "a1": "a", "b0": "b", "b1": "b"}
    slots = HistorySlots(tasks=1, namespace_of=jobs.__getitem__)
    # b copies alone for 200 s, then a comes: over the next 200 s they share, a does not take it all
    held = _simulate(slots, jobs, 400.0, seed=7, active={"a": (200.0, 400.0), "b": (0.0, 400.0)})
    b_alone = 200.0
    assert held["a"] / (held["a"] + held["b"] - b_alone) <= 0.6, held


def test_without_namespaces_the_turns_are_the_queue_order():
    slots = HistorySlots(tasks=1)
    assert slots.take("x", 1, 0.0)
    assert not slots.take("y", 1, 0.1) and not slots.take("z", 1, 0.2)
    assert slots.give_back("x", 1.0, 1.0) == "y"
