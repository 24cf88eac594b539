"""Every cell of the row-rule tables (core/splits.py), by name."""

from source_backfill.core import SplitState, Stage, on_history_row, on_live_row

B = SplitState.backfilling
C = SplitState.caching_up
F = SplitState.finished


# -- live rows ----------------------------------------------------------------------------------------
def test_live_backfilling_none_drops_and_sets_target():
    emit, s = on_live_row(B(None), 7)
    assert (emit, s) == (False, B(None, target=7))


def test_live_backfilling_b_less_than_o_drops_and_keeps_backfilling():
    emit, s = on_live_row(B(3, target=5), 8)
    assert (emit, s) == (False, B(3, target=8))


def test_live_backfilling_b_equal_o_finishes_and_drops():
    emit, s = on_live_row(B(8, target=5, rows=4), 8)
    assert (emit, s) == (False, SplitState(Stage.FINISHED, 8, 4, 5))


def test_live_backfilling_b_greater_than_o_caches_up_and_drops():
    emit, s = on_live_row(B(9, target=5), 8)
    assert (emit, s) == (False, C(9, target=5))


def test_live_caching_up_b_less_than_o_finishes_and_emits_after_compaction():
    emit, s = on_live_row(C(5), 9)
    assert (emit, s) == (True, F(5))


def test_live_caching_up_b_equal_o_finishes_and_drops():
    emit, s = on_live_row(C(9), 9)
    assert (emit, s) == (False, F(9))


def test_live_caching_up_b_greater_than_o_drops():
    emit, s = on_live_row(C(9), 4)
    assert (emit, s) == (False, C(9))


def test_live_finished_b_less_than_o_emits():
    assert on_live_row(F(5), 10) == (True, F(5))


def test_live_finished_b_equal_o_emits():
    assert on_live_row(F(5), 5) == (True, F(5))


def test_live_finished_b_greater_than_o_emits():
    assert on_live_row(F(5), 0) == (True, F(5))


def test_live_finished_without_offset_emits():
    assert on_live_row(F(), 0) == (True, F())


def test_live_target_is_not_updated_once_out_of_backfilling():
    _, s = on_live_row(B(8, target=2), 8)
    assert s.target_offset == 2


# -- history rows -------------------------------------------------------------------------------------
def test_history_backfilling_below_target_emits_and_advances():
    emit, s = on_history_row(B(None, target=10), 4)
    assert (emit, s) == (True, B(4, target=10, rows=1))


def test_history_backfilling_at_target_emits_and_caches_up():
    emit, s = on_history_row(B(4, target=10, rows=1), 10)
    assert (emit, s) == (True, C(10, target=10, rows=2))


def test_history_backfilling_past_target_emits_and_caches_up():
    emit, s = on_history_row(B(4, target=10), 12)
    assert (emit, s) == (True, C(12, target=10, rows=1))


def test_history_backfilling_without_target_keeps_backfilling():
    emit, s = on_history_row(B(None), 12)
    assert (emit, s) == (True, B(12, rows=1))


def test_history_caching_up_drops_and_counts():
    emit, s = on_history_row(C(3), 4)
    assert (emit, s) == (False, C(3, rows=1))


def test_history_finished_drops_and_counts():
    emit, s = on_history_row(F(3), 4)
    assert (emit, s) == (False, F(3, rows=1))
