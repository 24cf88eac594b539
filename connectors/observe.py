"""Reading a Spark ``Observation`` with a deadline (its ``get`` has none).

An observation's metrics arrive when the first action over the observed DataFrame finishes; a plan that
never runs the observed node (Spark pruned the scan, the action failed) leaves ``get`` waiting forever.
The readers of this service wait a bounded time instead and decide what a missing figure means.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

from source_backfill.errors import SourceBackfillError

if TYPE_CHECKING:
    from pyspark.sql import Observation

#: How long observed figures may take to arrive after the action finished (in an epoch; a read ahead
#: waits less: its figures only feed what is shown).
OBSERVE_TIMEOUT_S = 60.0


def observed(observation: Observation, timeout_s: float = OBSERVE_TIMEOUT_S) -> dict[str, Any]:
    """``observation.get`` bounded by ``timeout_s``.

    Past it :class:`~source_backfill.errors.SourceBackfillError` (not a JobError: the job is fine).
    """
    box: dict[str, Any] = {}

    def get() -> None:
        try:
            box["value"] = observation.get
        except Exception as exc:  # noqa: BLE001 - handed to the caller
            box["error"] = exc

    waiter = threading.Thread(target=get, name="observation-get", daemon=True)
    waiter.start()
    waiter.join(timeout_s)
    if "error" in box:
        raise box["error"]
    if "value" not in box:
        msg = f"observed figures not there within {timeout_s:.0f}s after the action"
        raise SourceBackfillError(msg)
    return dict(box["value"])


def arrived(observation: Observation) -> bool:
    """The observation's figures are there (its first action finished): :func:`observed` will not wait.

    False too when the JVM cannot be asked (it died: the figures never come).
    """
    java = getattr(observation, "_jo", None)  # set by DataFrame.observe; the JVM's Observation
    if java is None:
        return False
    try:
        return bool(java.future().isCompleted())
    except Exception:  # noqa: BLE001 - py4j's errors when the JVM is gone
        return False
