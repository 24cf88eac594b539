"""Hypothesis strategies shared by the core tests."""

import numpy as np
from hypothesis import strategies as st

from source_backfill.core import SplitState, Stage

offsets_small = st.integers(min_value=0, max_value=60)


@st.composite
def states(draw):
    stage = draw(st.sampled_from(list(Stage)))
    if stage is Stage.SOURCE_CACHING_UP:
        offset = draw(st.integers(-1, 60))
    else:
        offset = draw(st.one_of(st.none(), st.integers(-1, 60)))
    target = draw(st.one_of(st.none(), st.integers(-1, 60)))
    rows = draw(st.integers(0, 5))
    return SplitState(stage, offset, rows, target)


@st.composite
def sorted_offsets(draw, max_size=30):
    """Strictly increasing offsets with arbitrary gaps (compaction, transaction markers)."""
    values = draw(st.lists(offsets_small, max_size=max_size, unique=True))
    return np.array(sorted(values), dtype=np.int64)
