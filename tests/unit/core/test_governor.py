"""The width governor against a model of a cluster (core/governor.py's docstring has the model).

A cluster of ``n`` slots whose live path takes ``live`` of them; the live latency at a history width ``w``
is ``BASE / (1 - u)`` with ``u = (live + w) / n`` (capped below 1). The target is twice the idle latency
at the starting load, so the best width is the widest with ``u <= 1 - (1 - live0/n) / 2``.
"""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from source_backfill.core.governor import PROBE_AFTER, Governor

BASE = 0.05  # seconds: the live path's latency on an idle cluster


def latency(width: int, live: float, n: int) -> float:
    u = min(0.999, (live + width) / n)
    return BASE / (1 - u)


def best_width(live: float, n: int, target: float) -> int:
    """The widest width within the target (at least 1: history always may progress)."""
    widest = max(w for w in range(1, n + 1) if latency(w, live, n) <= target or w == 1)
    return widest


def run(gov: Governor, steps: int, live: float, n: int, target: float) -> tuple[Governor, list, list]:
    """``steps`` steps; ``overs``: the steps over the target at a width above the minimum (at the
    minimum the governor can do nothing more: history always may progress)."""
    widths, overs = [], []
    for _ in range(steps):
        lat = latency(gov.width, live, n)
        widths.append(gov.width)
        overs.append(lat > target and gov.width > gov.min_width)
        gov = gov.step(lat, target)
    return gov, widths, overs


@pytest.mark.parametrize("n", [2, 16, 256])
def test_converges_within_10_percent_of_the_best_width_in_20_steps(n):
    live = 0.1 * n
    target = 2 * latency(0, live, n)
    best = best_width(live, n, target)
    gov, widths, _ = run(Governor.start(1, n), 20, live, n, target)
    near = max(1, math.floor(0.1 * best))
    assert abs(gov.width - best) <= near, (n, best, widths)
    # and it stays there: over 100 more steps at most one in PROBE_AFTER goes over, the rest are near best
    gov, widths, overs = run(gov, 100, live, n, target)
    assert sum(overs) <= 100 // PROBE_AFTER, (n, best, widths)
    assert sum(abs(w - best) <= near for w in widths) >= 80, (n, best, widths)


@pytest.mark.parametrize("n", [16, 256])
def test_back_within_the_target_in_3_steps_after_the_live_load_doubles(n):
    live = 0.1 * n
    target = 2 * latency(0, live, n)
    gov, _, _ = run(Governor.start(1, n), 40, live, n, target)
    gov, widths, overs = run(gov, 10, 2 * live, n, target)  # the live load doubles
    assert overs.index(False) <= 3, (widths, overs)
    best = best_width(2 * live, n, target)
    gov, widths, _ = run(gov, 20, 2 * live, n, target)
    assert abs(gov.width - best) <= max(1, math.floor(0.1 * best)), (best, widths)


def test_widens_again_when_the_live_load_falls():
    n = 256
    live = 0.3 * n
    target = 2 * latency(0, 0.1 * n, n)
    gov, _, _ = run(Governor.start(1, n), 40, live, n, target)
    assert gov.width <= best_width(live, n, target)
    gov, widths, _ = run(gov, 60, 0.1 * n, n, target)
    best = best_width(0.1 * n, n, target)
    assert abs(gov.width - best) <= max(1, math.floor(0.1 * best)), (best, widths)


def test_bounds_hold_and_no_measure_keeps_the_width():
    gov = Governor.start(2, 8)
    assert gov.width == 2
    for _ in range(10):
        gov = gov.step(0.0, 1.0)
    assert gov.width == 8  # never above max_width
    for _ in range(10):
        gov = gov.step(5.0, 1.0)
    assert gov.width == 2  # never below min_width
    assert gov.step(None, 1.0) == gov
    assert gov.with_bounds(1, 1).width == 1 and Governor.start(0, 0).width == 1


@given(
    n=st.integers(1, 512),
    live_share=st.floats(0.0, 0.6),
    factor=st.floats(1.1, 4.0),
    lows=st.lists(st.booleans(), min_size=1, max_size=80),
)
def test_width_always_within_bounds_and_a_step_over_the_target_never_widens(n, live_share, factor, lows):
    live = live_share * n
    target = factor * latency(0, live, n)
    gov = Governor.start(1, n)
    for spike in lows:
        lat = latency(gov.width, live, n) * (10 if spike else 1)  # spikes: a noisy measure
        nxt = gov.step(lat, target)
        assert 1 <= nxt.width <= n
        if lat > target:
            assert nxt.width <= gov.width
        gov = nxt
