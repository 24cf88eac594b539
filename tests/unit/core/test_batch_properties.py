"""The vectorized batch forms equal folding the row rules over the batch, on arbitrary inputs."""

from hypothesis import given, settings

from source_backfill.core import apply_history_batch, apply_live_batch, on_history_row, on_live_row
from tests.unit.core.strategies import sorted_offsets, states


def _fold_live(state, offsets):
    emitted = []
    for o in offsets.tolist():
        emit, state = on_live_row(state, o)
        if emit:
            emitted.append(o)
    return emitted, state


def _fold_history(state, offsets):
    emitted = []
    for o in offsets.tolist():
        emit, state = on_history_row(state, o)
        if emit:
            emitted.append(o)
    return emitted, state


@settings(max_examples=600)
@given(state=states(), offsets=sorted_offsets())
def test_live_batch_equals_row_by_row(state, offsets):
    expected, expected_state = _fold_live(state, offsets)
    result = apply_live_batch(state, offsets)
    got = [] if result.emit_above is None else [o for o in offsets.tolist() if o > result.emit_above]
    assert got == expected
    assert result.emitted == len(expected)
    assert result.state == expected_state
    # the emitted rows are a suffix of the batch
    assert offsets.tolist()[len(offsets) - len(got):] == got


@settings(max_examples=600)
@given(state=states(), offsets=sorted_offsets())
def test_history_batch_equals_row_by_row(state, offsets):
    expected, expected_state = _fold_history(state, offsets)
    result = apply_history_batch(state, offsets)
    assert offsets.tolist()[: result.emit_count] == expected  # a prefix
    assert result.state == expected_state
