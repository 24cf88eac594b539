"""How many examples a property test runs: a quarter of its number in ``make test``, all of it in CI.

``make test`` is the inner loop (ten minutes on 2 cores): each Hypothesis test there runs a quarter of the
examples it names (at least 10), and a test that names none runs 25. ``make test-properties`` (CI runs it
after ``make test``) sets ``SOURCE_BACKFILL_PROPERTY_EXAMPLES=full`` and runs every example each test names
(100 where it names none). Use ``@settings(max_examples=examples(300))``. The attacks (the API fuzz, the
generated transforms) keep their full numbers: their refusal ratios need the sample.
"""

from __future__ import annotations

import os

#: Every example each test names (CI), or a quarter of them (``make test``).
FULL = os.environ.get("SOURCE_BACKFILL_PROPERTY_EXAMPLES") == "full"


def examples(n: int) -> int:
    """The examples a test that names ``n`` runs in this run."""
    return n if FULL else max(10, n // 4)
