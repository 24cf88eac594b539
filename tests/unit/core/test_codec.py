import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from source_backfill.core import SplitState, states_from_json, states_to_json
from source_backfill.errors import StateFormatError
from tests.unit.core.strategies import states


@given(st.dictionaries(st.sampled_from(["t:0", "t:1", "a:b:7"]), states()))
def test_round_trip_through_json_text(value):
    assert states_from_json(json.dumps(states_to_json(value))) == value


def _doc(**split):
    base = {"stage": "backfilling", "offset": 3, "num_consumed_rows": 1, "target_offset": 9}
    base.update(split)
    return {"version": 1, "splits": {"t:0": base}}


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ("{not json", "not valid JSON"),
        ([1, 2], "must be an object"),
        ({"version": 3, "splits": {}}, "version 3"),
        ({"version": 1}, 'no "splits"'),
        ({"version": 1, "splits": {"nocolon": {}}}, "topic:partition"),
        (_doc(stage="done"), "unknown stage"),
        (_doc(offset="3"), 'field "offset" must be an integer'),
        (_doc(offset=True), 'field "offset" must be an integer'),
        (_doc(num_consumed_rows=-1), '"num_consumed_rows" must be >= 0'),
        (_doc(offset=-5), '"offset" must be >= -1'),
        (_doc(stage="source_caching_up", offset=None), "SourceCachingUp needs"),
        ({"version": 1, "splits": {"t:0": {"stage": "finished"}}}, "missing field"),
    ],
)
def test_malformed_state_is_refused_naming_the_problem(doc, message):
    with pytest.raises(StateFormatError, match=message):
        states_from_json(doc if not isinstance(doc, str) else doc)


def test_error_names_the_split():
    with pytest.raises(StateFormatError, match='split "t:0"'):
        states_from_json(_doc(stage="x"))


def test_finished_state_round_trips():
    s = {"t:3": SplitState.finished(41, 40, 100)}
    assert states_from_json(states_to_json(s)) == s
