"""Planner cost per epoch for 10,000 splits (goal < 5 ms), next to the row-by-row reference.

The planner is timed as the runtime calls it: the committed states as a ``SplitTable`` (the job keeps
them so), the live batch's ``LiveStats`` per split and the end positions as mappings, then
``finish_epoch`` with the history counts; the conversion of the mappings to columns is in the time. The
reference applies the row rules to every live row and every history row of the same epoch. Both on the
same input, in the same run.
"""

from __future__ import annotations

import json
import os
import random
import time

from source_backfill.core import (
    LiveStats,
    SplitState,
    finish_epoch,
    on_history_row,
    on_live_row,
    plan_epoch,
)
from source_backfill.core.columnar import SplitTable

SPLITS = 10_000
ROWS_PER_SPLIT = 20  # live rows per split per epoch


def _inputs(kind: str):
    rng = random.Random(7)
    states, live, end = {}, {}, {}
    for i in range(SPLITS):
        split = f"events:{i}"
        base = 1_000_000 + rng.randint(0, 1000)
        if kind == "backfilling" or (kind == "mixed" and i % 2):
            states[split] = SplitState.backfilling(rng.randint(0, base // 2), base - 1)
        else:
            states[split] = SplitState.finished(base - 1)
        live[split] = LiveStats(base, base + ROWS_PER_SPLIT - 1, ROWS_PER_SPLIT, base + ROWS_PER_SPLIT)
        end[split] = base + ROWS_PER_SPLIT
    return states, live, end


def _planner(states, live, end, budget):
    plan = plan_epoch(states, live, budget, end)
    counts = {r.split: r.end - r.start for r in plan.history}
    return finish_epoch(plan, counts), plan


def _reference(states, live, history_ranges):
    out = {}
    for split, state in states.items():
        stats = live[split]
        for o in range(stats.first, stats.last + 1):
            _, state = on_live_row(state, o)
        for r in history_ranges.get(split, ()):
            for o in range(r.start, r.end):
                _, state = on_history_row(state, o)
        out[split] = state
    return out


def _best(fn, repeat=7):
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def main() -> dict[str, float]:
    result: dict[str, float] = {}
    budget = 100_000
    for kind in ("finished", "mixed", "backfilling"):
        states, live, end = _inputs(kind)
        table = SplitTable.from_states(states)
        _, plan = _planner(table, live, end, budget)
        ranges: dict[str, list] = {}
        for r in plan.history:
            ranges.setdefault(r.split, []).append(r)
        planner_s = _best(lambda: _planner(table, live, end, budget), repeat=21)  # noqa: B023
        reference_s = _best(lambda: _reference(states, live, ranges), repeat=3)  # noqa: B023
        result[f"{kind}_planner_ms"] = round(planner_s * 1000, 3)
        result[f"{kind}_reference_ms"] = round(reference_s * 1000, 1)
        result[f"{kind}_speedup"] = round(reference_s / planner_s, 1)
    result["load_average_1m"] = round(os.getloadavg()[0], 2)
    print("bench_planner:", json.dumps(result), flush=True)
    print(f"  (load average {result['load_average_1m']} on {os.cpu_count()} cores: absolute times scale with "
          "it, the ratios much less)")
    for kind in ("finished", "mixed", "backfilling"):
        print(f"  {kind:<12} planner {result[f'{kind}_planner_ms']:>7} ms per epoch for {SPLITS} splits "
              f"(goal < 5 ms), row-by-row reference {result[f'{kind}_reference_ms']} ms, "
              f"ratio {result[f'{kind}_speedup']}x")
    return result


if __name__ == "__main__":
    main()
