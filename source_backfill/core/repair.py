"""Which offsets a repair may replace in a job's table (pure; issue 31's "repair a range in place").

A repair asks for an offset window ``[lo, hi)`` of some splits. It replaces the job's rows of those offsets
with a fresh copy, so it may only touch offsets the job's table holds *and* the job would hold again: the
window is cut, per split, to

* a split of the job (else refused: not the job's);
* a **Finished** split (else refused: its history copy is still under way, and a repair racing it would
  copy rows the copy then copies again);
* ``[start, covered)``: from the job's start offset for the split (rows below it were never the job's)
  to the live position its last commit covered (rows above it are the live stream's next epochs').

What is left may be empty (nothing of the job's output in the window): that split is skipped, said so.
The adapter (``executors/repair.py``) then reads the cut ranges from the tiers that hold them and
replaces the rows in one commit.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from source_backfill.core.plan import HistoryRange
from source_backfill.core.splits import SplitState, Stage


@dataclass(frozen=True)
class RepairCut:
    """The window cut per split: the ranges to replace, and why each other split asked is not."""

    ranges: list[HistoryRange] = field(default_factory=list)
    #: split -> why it is refused (not the job's, not Finished).
    refused: dict[str, str] = field(default_factory=dict)
    #: split -> why nothing of it is replaced (the window holds none of the job's rows).
    skipped: dict[str, str] = field(default_factory=dict)


def cut_repair(
    windows: Mapping[str, tuple[int, int]],
    states: Mapping[str, SplitState],
    starts: Mapping[str, int],
    covered: Mapping[str, int],
) -> RepairCut:
    """The module's rule applied to each split's asked window ``[lo, hi)``."""
    cut = RepairCut()
    for split, (lo, hi) in sorted(windows.items()):
        state = states.get(split)
        if state is None:
            cut.refused[split] = "not a split of the job"
            continue
        if state.stage is not Stage.FINISHED:
            stage = state.stage.value.replace("_", " ")
            cut.refused[split] = f"still {stage}: repair it once its history copy is Finished"
            continue
        start = starts.get(split)
        end = covered.get(split)
        if start is None or end is None:
            cut.skipped[split] = "the job's table holds none of it yet"
            continue
        a, b = max(lo, start), min(hi, end)
        if a >= b:
            cut.skipped[split] = (f"the window [{lo}, {hi}) holds none of the job's offsets "
                                  f"[{start}, {end})")
            continue
        cut.ranges.append(HistoryRange(split, a, b))
    return cut


def windows_for(splits: Iterable[str], lo: int, hi: int) -> dict[str, tuple[int, int]]:
    """The same window ``[lo, hi)`` for each of ``splits``."""
    return {s: (lo, hi) for s in splits}
