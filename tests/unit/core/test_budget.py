from source_backfill.core import WAIT_EPOCH_MULTIPLE, history_budget
from source_backfill.core.budget import FIRST_EPOCH_BUDGET, MIN_ADAPTIVE_BUDGET


def budget(**kw):
    args = dict(rate_limit_rows_per_s=None, interval_s=1.0, max_rows_per_epoch=None,
                measured_rows_per_s=None, last_epoch_s=None, paused=False)
    args.update(kw)
    return history_budget(**args)


def test_paused_and_rate_zero_read_nothing():
    assert budget(paused=True) == 0
    assert budget(rate_limit_rows_per_s=0) == 0


def test_self_pause_after_an_epoch_over_the_multiple():
    assert budget(last_epoch_s=WAIT_EPOCH_MULTIPLE * 1.0 + 0.1) == 0
    assert budget(last_epoch_s=WAIT_EPOCH_MULTIPLE * 1.0) > 0


def test_smallest_of_rate_cap_and_adaptive():
    assert budget() == FIRST_EPOCH_BUDGET
    assert budget(rate_limit_rows_per_s=100, interval_s=2) == 200
    assert budget(rate_limit_rows_per_s=100, max_rows_per_epoch=50) == 50
    assert budget(measured_rows_per_s=10_000, interval_s=1) == 8_000
    assert budget(measured_rows_per_s=10, interval_s=1) == MIN_ADAPTIVE_BUDGET
    assert budget(rate_limit_rows_per_s=0.1, interval_s=1) == 1  # a tiny rate still progresses
