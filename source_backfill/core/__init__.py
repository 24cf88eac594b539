"""The pure core: split state machines, the epoch planner, budgets, progress. No I/O."""

from source_backfill.core.budget import (
    WAIT_EPOCH_MULTIPLE,
    EpochCost,
    RateAllowance,
    budget_after_adopted,
    fit_epoch_cost,
    history_budget,
    read_ahead_budget,
)
from source_backfill.core.codec import states_from_json, states_to_json
from source_backfill.core.plan import (
    EpochPlan,
    HistoryRange,
    LiveStats,
    SplitChange,
    adopt_history,
    ahead_of,
    attach,
    finish_epoch,
    is_backfill_done,
    is_finish_reported,
    plan_epoch,
    reconcile_splits,
    rejoin,
)
from source_backfill.core.progress import JobProgressSummary, job_progress, split_lag
from source_backfill.core.splits import (
    SplitId,
    SplitState,
    Stage,
    on_history_row,
    on_live_row,
    parse_split_id,
    split_id,
)
from source_backfill.core.vnode import vnode

__all__ = [
    "WAIT_EPOCH_MULTIPLE",
    "EpochPlan",
    "HistoryRange",
    "JobProgressSummary",
    "LiveStats",
    "SplitChange",
    "SplitId",
    "SplitState",
    "Stage",
    "adopt_history",
    "ahead_of",
    "attach",
    "finish_epoch",
    "budget_after_adopted",
    "history_budget",
    "read_ahead_budget",
    "EpochCost",
    "RateAllowance",
    "fit_epoch_cost",
    "is_backfill_done",
    "is_finish_reported",
    "job_progress",
    "on_history_row",
    "on_live_row",
    "parse_split_id",
    "plan_epoch",
    "reconcile_splits",
    "rejoin",
    "split_id",
    "split_lag",
    "states_from_json",
    "states_to_json",
    "vnode",
]
