"""What several benchmarks do with an in-process daemon: create a job and time it to Finished."""

from __future__ import annotations

import time
from typing import Any


def backfill_seconds(daemon: Any, spec: dict[str, Any]) -> float:
    """Create the job ``spec`` describes on ``daemon`` (a ``Daemon``); seconds from the create to Finished.

    A job that fails raises with its error.
    """
    from source_backfill.config import JobSpec

    name = spec["name"]
    t = time.monotonic()
    daemon.registry.create(JobSpec.model_validate(spec))
    jobs = daemon.sources[spec["source"]].jobs
    while name not in jobs or not jobs[name].backfill_done:
        if daemon.registry.get(name).error is not None:
            msg = f"{name} failed: {daemon.registry.get(name).error}"
            raise RuntimeError(msg)
        time.sleep(0.1)
    return time.monotonic() - t
