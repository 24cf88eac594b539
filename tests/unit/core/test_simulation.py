"""Drive the planner over a synthetic partitioned log: exactly once, whatever happens.

The log has gaps (compaction, transaction markers), the live stream moves, budgets and pauses are random,
the job attaches mid-stream, partitions are added, and the job crashes at random points (an epoch's
output and state thrown away and replayed, state restored through a JSON round-trip). With ``lanes``, the
job's lane is busy at random epochs: it skips them, and at the next one it runs, the batch does not start
where its output ends, so it rejoins by offsets (``rejoin``; a partition whose first batch it skipped is
read from its log start). Per split, the
emitted offsets (history + live) must be the log's records from the job's start, each exactly once —
and every history record the planner plans to read must be one the row rules emit.
"""

import json
import random
from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from source_backfill.core import (
    HistoryRange,
    LiveStats,
    Stage,
    adopt_history,
    ahead_of,
    attach,
    finish_epoch,
    is_backfill_done,
    on_history_row,
    on_live_row,
    plan_epoch,
    reconcile_splits,
    rejoin,
    states_from_json,
    states_to_json,
)
from tests.budget import examples


def _make_log(rng, length):
    """Record offsets of a partition of ``length`` positions; the rest are gaps."""
    return [o for o in range(length) if rng.random() > 0.2]


@settings(max_examples=examples(150), deadline=None)
@given(seed=st.integers(0, 2**32 - 1), splits=st.integers(1, 4), attach_at=st.integers(0, 6),
       read_ahead=st.booleans(), lanes=st.booleans())
def test_emitted_offsets_are_the_log_exactly_once(seed, splits, attach_at, read_ahead, lanes):
    """``read_ahead``: history is read between epochs from older states (reads chain, finish late, are
    lost with a crash) and adopted at a boundary only when it still fits the plan."""
    rng = random.Random(seed)
    lengths = {f"t:{i}": rng.randint(0, 80) for i in range(splits)}
    logs = {s: _make_log(rng, n) for s, n in lengths.items()}
    late = f"t:{splits}"  # a partition added mid-stream
    add_at = rng.randint(attach_at, attach_at + 10)
    pos = {s: 0 for s in logs}  # the live stream's next position per split
    starts = {s: rng.choice([0, 0, rng.randint(0, max(0, lengths[s]))]) for s in logs}

    def advance(epoch):
        if epoch == add_at and late not in logs:
            logs[late] = _make_log(rng, rng.randint(0, 30))
            lengths[late] = (logs[late][-1] + 1) if logs[late] else 0
            pos[late] = 0
        batch, start = {}, dict(pos)
        for s in logs:
            step = rng.choice([0, 1, 3, 10, 40])
            new = min(lengths[s], pos[s] + step)
            batch[s] = [o for o in logs[s] if pos[s] <= o < new]
            pos[s] = new
        return start, batch

    # the live stream runs before the job attaches
    for e in range(attach_at):
        advance(e)
    emitted = {s: [] for s in logs}
    states = None
    committed = None  # JSON of S(e-1)
    live_to = {}  # where the live stream stood after the job's last committed epoch (its output's end)
    epoch = attach_at
    pending = []  # read-ahead history: [epoch it is ready at, ranges], in the order they were planned
    while True:
        start, batch = advance(epoch)
        for s in batch:
            emitted.setdefault(s, [])
        # the job's lane still busy with an earlier epoch: this one goes by without it
        skip = lanes and states is not None and rng.random() < 0.3
        attempts = 0 if skip else 2 if rng.random() < 0.2 else 1  # crash once, then replay the same batch
        for attempt in range(attempts):
            if states is None:
                # a start past the live position is clamped to it: the live stream covers the rest
                effective = {s: min(starts.get(s, 0), start[s]) for s in start}
                current = attach(sorted(pos), start, effective)
            else:
                current = states_from_json(json.loads(committed))
            current, changes = reconcile_splits(current, sorted(pos))
            if live_to:  # the batch starts where the output ends, or the job rejoins by offsets
                # a partition new to the job whose first batch it skipped: from its log start (0)
                covered = {**live_to, **{c.split: 0 for c in changes if c.kind == "added" and start[c.split]}}
                if any(covered.get(s, p) != p for s, p in start.items()):
                    current = rejoin(current, covered, start)
            live = {s: LiveStats(b[0], b[-1], len(b), pos[s]) for s, b in batch.items() if b}
            budget = 0 if rng.random() < 0.15 else rng.choice([1, 2, 5, 17, 1000])
            out = {s: [] for s in batch}
            counts = {}

            def read(ranges, states):
                """History rows of ``ranges``, checked against the history rule from ``states``."""
                for r in ranges:
                    assert r.end <= pos[r.split]  # never read past the live stream
                    rows = [o for o in logs[r.split] if r.start <= o < r.end]
                    state = states[r.split]
                    for o in rows:
                        emit, state = on_history_row(state, o)
                        assert emit, f"planned history row {r.split}@{o} would be dropped"
                    out[r.split].extend(rows)
                    counts[r.split] = counts.get(r.split, 0) + len(rows)

            if read_ahead:  # reads done before this batch apply first, from the committed states
                ready = []
                while pending and pending[0][0] <= epoch:
                    ready.extend(pending.pop(0)[1])
                adopted = None
                if ready:
                    sizes = {}
                    for r in ready:
                        n = sum(1 for o in logs[r.split] if r.start <= o < r.end)
                        sizes[r.split] = sizes.get(r.split, 0) + n
                    adopted = adopt_history(current, ready, sizes)
                    if adopted is None:
                        pending = []  # stale: thrown away, read again from the committed state
                    else:
                        merged = {}
                        for r in ready:
                            lo = merged.get(r.split, r).start
                            merged[r.split] = HistoryRange(r.split, lo, r.end)
                        read(merged.values(), current)
                        counts = {}  # adopt_history has counted them
                        current = adopted
            plan = plan_epoch(current, live, 0 if read_ahead else budget, dict(pos))
            # live rows: the vectorized threshold, checked against the row rules
            for s, rows in batch.items():
                state = current[s]
                reference = []
                for o in rows:
                    emit, state = on_live_row(state, o)
                    if emit:
                        reference.append(o)
                above = plan.emit_above[s]
                got = [] if above is None else [o for o in rows if o > above]
                assert got == reference
                assert state == plan.states[s]
                out[s].extend(got)
            read(plan.history, plan.states)
            new_states = finish_epoch(plan, counts)
            if attempt + 1 < attempts:
                pending = []  # the reads ahead die with the process
                continue  # crash before the commit: output and state are lost, the batch replays
            for s, rows in out.items():
                emitted[s].extend(rows)
            committed = json.dumps(states_to_json(new_states))
            states = new_states
            live_to = dict(pos)
            if read_ahead and budget:
                for _ in range(rng.choice([0, 1, 1, 2])):  # start reads ahead, chained on those in flight
                    ahead = ahead_of(states, [r for _, ranges in pending for r in ranges])
                    ranges = plan_epoch(ahead, {}, budget, {}).history
                    if ranges:
                        pending.append([epoch + 1 + rng.choice([0, 0, 1, 3]), ranges])
        epoch += 1
        at_end = all(pos[s] == lengths[s] for s in logs) and epoch > add_at
        if at_end and states is not None and is_backfill_done(states) and live_to == pos:
            break  # (a job that skipped the last batches has not caught up with the log's end yet)
        assert epoch < attach_at + 2000, "the job never finished"

    for s, log in logs.items():
        expected = [o for o in log if o >= effective.get(s, 0)]
        counts = Counter(emitted[s])
        assert sorted(counts) == expected, f"{s}: wrong offsets"
        assert all(n == 1 for n in counts.values()), f"{s}: duplicates"
    assert all(st_.stage is Stage.FINISHED for st_ in states.values())
