"""How close the dry run's estimates come to the actual backfill (``POST /jobs?dry_run=true``).

A real daemon process on the embedded broker. Two estimates, each against the time the same job then
takes from its create to ``finished`` (polled every 0.1 s):

* ``dry_run.error_at_rate_limit``: a job limited to 2,000 rows/s over 50,000 records
  (``seconds_at_rate_limit``, the limit at the pace the source's epochs run, plus the measured start);
* ``dry_run.error_at_measured_rate``: a job without a limit over 1.5M records, at the history rate the
  daemon measured on an earlier job of the same source (``seconds_at_measured_rate``); one job pays
  Spark's warm-up first.

Each is ``|estimate - actual| / actual`` (goal ≤ 0.30). The estimates model what the daemon measured so
far, not what the machine will do next: on a machine whose load changes between the dry run and the copy
they miss by that change (2 shared cores at load 15-18: 25 s estimated, 136 s actual, before the epochs'
pace was modelled).
"""

from __future__ import annotations

import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

QUICK_SCALE = 10  # --quick: records / 10

RATE = 2000.0


def _produce(bootstrap: str, topic: str, records: int) -> None:
    from bench.records import fill

    fill(bootstrap, topic, records, 2)


def _dry_run(daemon: Any, **spec: Any) -> dict[str, Any]:
    r = daemon.request("POST", "/jobs?dry_run=true", daemon._with_sink(spec))  # noqa: SLF001
    if r is None or r.status_code != 200:
        msg = f"dry run refused: {None if r is None else r.text}"
        raise RuntimeError(msg)
    return r.json()


def _backfill_seconds(daemon: Any, **spec: Any) -> float:
    daemon.create_job(**spec)
    started = time.monotonic()
    while True:
        job = daemon.job(spec["name"])
        if job["status"] == "finished":
            return time.monotonic() - started
        if job["status"] == "failed" or time.monotonic() - started > 600:
            msg = f"job {spec['name']} did not finish: {job}"
            raise RuntimeError(msg)
        time.sleep(0.1)


def main() -> dict[str, Any]:
    import os

    from connectors.kafka.admin import KafkaAdmin
    from connectors.kafka.embedded import EmbeddedBroker
    from source_backfill.testing import RunningDaemon

    scale = QUICK_SCALE if os.environ.get("BENCH_QUICK") == "1" else 1
    limited_records, big_records = 50_000 // scale, 1_500_000 // scale
    result: dict[str, Any] = {}
    with EmbeddedBroker() as broker:
        admin = KafkaAdmin(broker.bootstrap)
        small, big = f"plan-{uuid.uuid4().hex[:8]}", f"big-{uuid.uuid4().hex[:8]}"
        for topic, records in ((small, limited_records), (big, big_records)):
            admin.create_topic(topic, 2)
            _produce(broker.bootstrap, topic, records)
        work = Path(tempfile.mkdtemp(prefix="bench-dry-run-"))
        daemon = RunningDaemon(work, broker.bootstrap, [{"name": "plan", "topics": [small]},
                                                        {"name": "big", "topics": [big]}], [], {})
        daemon.start()
        try:
            daemon.wait_ready(240)
            plan = _dry_run(daemon, name="limited", source="plan", rate_limit=RATE)
            actual = _backfill_seconds(daemon, name="limited", source="plan", rate_limit=RATE)
            estimate = plan["seconds_at_rate_limit"]
            result.update({"dry_run.estimate_at_rate_limit_s": round(estimate, 1),
                           "dry_run.actual_at_rate_limit_s": round(actual, 1),
                           "dry_run.error_at_rate_limit": round(abs(estimate - actual) / actual, 3)})
            _backfill_seconds(daemon, name="warm-up", source="big")
            _backfill_seconds(daemon, name="first", source="big")
            plan = _dry_run(daemon, name="second", source="big")
            estimate = plan["seconds_at_measured_rate"]
            actual = _backfill_seconds(daemon, name="second", source="big")
            result.update({"dry_run.measured_rows_per_s": round(plan["measured_rows_per_s"] or 0),
                           "dry_run.estimate_at_measured_rate_s": round(estimate, 1),
                           "dry_run.actual_at_measured_rate_s": round(actual, 1),
                           "dry_run.error_at_measured_rate": round(abs(estimate - actual) / actual, 3)})
        finally:
            daemon.stop()
    for key, value in result.items():
        print(f"  {key} = {value}", flush=True)
    print("  goal: both errors <= 0.30", flush=True)
    return result


if __name__ == "__main__":
    main()
