"""Snapshots + deltas rebuild exactly the state the job held (against a log that keeps every full state)."""

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from source_backfill.core import SplitState
from source_backfill.core.codec import (
    LoggedState,
    decode_state,
    delta_to_json,
    rebuild,
    snapshot_to_json,
    splits_from_rows,
    states_from_json,
    states_to_json,
)
from source_backfill.core.columnar import SplitTable
from source_backfill.core.state_log import Chain, Changes, SnapshotPolicy, apply, diff, size, snapshot_due
from source_backfill.errors import StateFormatError
from tests.budget import examples
from tests.unit.core.strategies import states

SPLITS = [f"t:{i}" for i in range(6)] + ["a:b:7"]


@st.composite
def job_states(draw):
    """A job's full state as the executor logs it: split rows and covered-to positions."""
    chosen = draw(st.dictionaries(st.sampled_from(SPLITS), states(), max_size=len(SPLITS)))
    rows = SplitTable.from_states(dict(sorted(chosen.items()))).to_json_rows()
    end = {s: draw(st.integers(0, 50)) for s in rows}
    return {"splits": rows, "end": end}


@st.composite
def epochs(draw):
    """A run of epochs: each keeps the state (an idle epoch) or moves to a new one."""
    first = draw(job_states())
    out = [first]
    for _ in range(draw(st.integers(0, 25))):
        out.append(out[-1] if draw(st.booleans()) else draw(job_states()))
    return out


class Writer:
    """The executor's commit path in miniature: no commit without a change, snapshot or delta by policy."""

    def __init__(self, log, policy, *, now=0.0):
        self.log, self.policy, self.now = log, policy, now
        self.logged = None
        self.chain = None

    def epoch(self, state):
        if self.logged is not None and not diff(self.logged, state):
            return None  # nothing moved: nothing committed
        changes = diff(self.logged or {}, state)
        due = snapshot_due(self.policy, has_base=self.chain is not None,
                           deltas_since=self.chain.deltas_since if self.chain else 0, changes=changes,
                           total=size(state),
                           base_age_s=self.now - (self.chain.base_time_s if self.chain else 0))
        if due:
            doc = snapshot_to_json(state)
        else:
            doc = delta_to_json(changes, base=self.chain.base, prev=self.chain.prev)
        version = self.log.append(json.dumps(doc))
        self.chain = (Chain(version, version, 0, self.now) if self.chain is None
                      else self.chain.after(version, snapshot=due, now_s=self.now))
        self.logged = state
        return version


class Log:
    """Delta's log as a list of commits; ``None`` entries are other writers' commits (OPTIMIZE)."""

    def __init__(self):
        self.commits = []

    def append(self, text):
        self.commits.append(text)
        return len(self.commits) - 1

    def foreign(self):
        self.commits.append(None)

    def read(self, version):
        if version >= len(self.commits) or self.commits[version] is None:
            return None
        return decode_state(self.commits[version])

    def recover(self):
        head = next((v for v in range(len(self.commits) - 1, -1, -1) if self.commits[v] is not None), None)
        return None if head is None else rebuild(self.read(head), self.read)


@settings(max_examples=examples(300), deadline=None)
@given(epochs(), st.integers(1, 8), st.floats(0.1, 1.0), st.data())
def test_snapshot_plus_changes_rebuilds_the_state_at_every_crash_point(run, every, fraction, data):
    log = Log()
    writer = Writer(log, SnapshotPolicy(every=every, max_fraction=fraction, max_age_s=5.0))
    crash = data.draw(st.integers(0, len(run) - 1), label="crash after epoch")
    for i, state in enumerate(run[: crash + 1]):
        writer.now = float(i)
        if data.draw(st.booleans(), label="foreign commit"):
            log.foreign()
        writer.epoch(state)
    assert log.recover() == run[crash]


@settings(max_examples=examples(100), deadline=None)
@given(epochs())
def test_idle_epochs_commit_nothing(run):
    log = Log()
    writer = Writer(log, SnapshotPolicy(every=100))
    for state in run:
        writer.epoch(state)
    moves = 1 + sum(1 for a, b in zip(run, run[1:], strict=False) if a != b)
    assert len(log.commits) == moves


@given(job_states(), job_states())
def test_apply_of_diff_is_the_new_state(a, b):
    assert apply(a, diff(a, b)) == b
    assert not diff(b, b)


def test_one_moving_split_of_many_is_a_small_delta():
    rows = SplitTable.from_states(states_from_json(states_to_json(
        {f"t:{i}": SplitState.finished(5, 4, 9) for i in range(10_000)}))).to_json_rows()
    state = {"splits": rows, "end": dict.fromkeys(rows, 6)}
    moved = apply(state, Changes({"end": {"t:42": 7}}))
    text = json.dumps(delta_to_json(diff(state, moved), base=1, prev=2))
    assert len(text) < 200
    assert not snapshot_due(SnapshotPolicy(), has_base=True, deltas_since=3, changes=diff(state, moved),
                            total=size(moved), base_age_s=10)


def test_snapshot_policy_every_n_by_size_and_by_age():
    policy = SnapshotPolicy(every=10, max_fraction=0.5, max_age_s=100)
    small = Changes({"splits": {"t:0": 1}})
    assert snapshot_due(policy, has_base=False, deltas_since=0, changes=small, total=10, base_age_s=0)
    assert not snapshot_due(policy, has_base=True, deltas_since=8, changes=small, total=10, base_age_s=0)
    assert snapshot_due(policy, has_base=True, deltas_since=9, changes=small, total=10, base_age_s=0)
    big = Changes({"splits": dict.fromkeys("abcdef", 1)})
    assert snapshot_due(policy, has_base=True, deltas_since=0, changes=big, total=10, base_age_s=0)
    assert snapshot_due(policy, has_base=True, deltas_since=0, changes=small, total=10, base_age_s=100)


def test_previous_format_is_a_snapshot():
    v1 = {"version": 1, "splits": {"t:0": {"stage": "finished", "offset": 3, "num_consumed_rows": 4,
                                             "target_offset": 3}}}
    logged = decode_state(json.dumps(v1))
    assert logged.kind == "snapshot" and logged.version == 1 and "end" not in logged.sections
    assert splits_from_rows(logged.sections["splits"]) == states_from_json(v1)


def test_a_delta_alone_is_not_a_state():
    doc = delta_to_json(Changes({"end": {"t:0": 1}}), base=3, prev=4)
    with pytest.raises(StateFormatError, match="needs its snapshot"):
        states_from_json(doc)


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ({"version": 2, "kind": "other", "splits": {}}, "neither"),
        ({"version": 2, "kind": "delta", "splits": {}, "base": 4}, "base/prev"),
        ({"version": 2, "kind": "delta", "splits": {}, "base": 4, "prev": 3}, "base/prev"),
        ({"version": 2, "kind": "snapshot", "splits": {}, "end": {"t:0": -1}}, '"end"'),
        ({"version": 2, "kind": "delta", "splits": {}, "base": 1, "prev": 1, "removed": [1]}, "removed"),
        ({"version": 2, "kind": "snapshot", "splits": {"t:0": {"stage": "x"}}}, "missing field"),
    ],
)
def test_malformed_v2_state_is_refused(doc, message):
    with pytest.raises(StateFormatError, match=message):
        decode_state(doc)


def test_missing_or_misplaced_chain_links_fail_loudly():
    snap = LoggedState("snapshot", {"splits": {}, "end": {"t:0": 1}})
    d1 = decode_state(delta_to_json(Changes({"end": {"t:0": 2}}), base=0, prev=0))
    d2 = decode_state(delta_to_json(Changes({"end": {"t:0": 3}}), base=0, prev=1))
    log = {0: snap, 1: d1}
    assert rebuild(d2, log.get) == {"splits": {}, "end": {"t:0": 3}}
    with pytest.raises(StateFormatError, match="version 0 .* is missing"):
        rebuild(d2, {1: d1}.get, where="Delta table /x")
    with pytest.raises(StateFormatError, match="chain's snapshot is at version 0"):
        rebuild(d2, {1: snap}.get)
    other = decode_state(delta_to_json(Changes(), base=9, prev=9))
    with pytest.raises(StateFormatError, match="builds on snapshot 9"):
        rebuild(d2, {1: other}.get)


@st.composite
def two_tables(draw):
    """Two split tables: the same splits in the same order (the epoch's case), or different split sets."""
    before = draw(st.dictionaries(st.sampled_from(SPLITS), states(), min_size=1))
    if draw(st.booleans()):
        after = {s: draw(st.one_of(st.just(v), states())) for s, v in before.items()}
    else:
        after = draw(st.dictionaries(st.sampled_from(SPLITS), states()))
    return SplitTable.from_states(before), SplitTable.from_states(after)


@given(two_tables())
def test_changed_rows_are_the_rows_diff_finds(tables):
    before, after = tables
    rows, removed = after.changed_rows(before)
    expected = diff({"splits": before.to_json_rows()}, {"splits": after.to_json_rows()})
    assert rows == expected.changed.get("splits", {})
    assert removed == expected.removed.get("splits", [])
    assert after.changed_rows(None) == (after.to_json_rows(), [])
