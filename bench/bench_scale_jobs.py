"""Jobs of a source side by side: 30 jobs against 10 at a 1 s trigger, in one run (issue 30, ``scale.``).

The load soak of :mod:`bench.bench_load` (100 partitions, half the jobs backfilling under a rate limit,
the others Finished, 1,000 live rows/s) twice on one broker: with 10 jobs, then with 30. Were the jobs'
epochs run one after the other, an epoch would take ~3× as long with 30 (the jobs' work adds up); side
by side it grows well below that. Keys:

* ``scale.jobs30_vs_10.epoch_p50_ratio``: the 30-job run's median epoch over the 10-job run's (goal ≤ 1.5);
* ``scale.jobs30_vs_10.rss_ratio``: peak RSS of daemon + JVM, 30 over 10 (goal ≤ 1.3);
* ``scale.jobs30.errors``, ``scale.jobs10.errors``: source errors in the windows (goal 0); and each run's
  epochs ratio, mean epoch, verdict, and the history and live rows committed per second: an epoch is
  short too when the backfilling jobs' reads stall, so the epoch figures are read beside them; and the
  epoch p99 and every job's live p99 (``live_p99_s``): a memory setting that trims the peak RSS by
  stop-the-world collections shows there.

``BENCH_SCALE_MINUTES`` sets each window (10; 1 with ``--quick``), ``BENCH_LOAD_PARALLEL_JOBS`` the
sources' ``max_parallel_jobs`` (the daemon's default). A soak: it runs when named
(``make bench BENCH_ARGS=scale_jobs``).
"""

from __future__ import annotations

import os
from typing import Any

from bench.bench_load import _load

QUICK = os.environ.get("BENCH_QUICK") == "1"
MINUTES = float(os.environ.get("BENCH_SCALE_MINUTES", "1" if QUICK else "10"))
#: Each run's figures kept under ``scale.jobs<N>.``.
KEPT = ("epochs_ratio", "epoch_mean_s", "epoch_p50_s", "epoch_p99_s", "live_p99_s", "errors", "failed_jobs",
        "peak_rss_mib", "jvm_dead", "verdict", "max_parallel_jobs", "history_rows_per_s", "live_rows_per_s")


def main() -> dict[str, Any]:
    from connectors.kafka.embedded import EmbeddedBroker

    runs: dict[int, dict[str, Any]] = {}
    with EmbeddedBroker() as broker:
        for n in (10, 30):
            print(f"scale: {n} jobs, 1 s trigger, {MINUTES:g} min", flush=True)
            runs[n] = _load(broker.bootstrap, n_jobs=n, interval_s=1.0, minutes=MINUTES)
    result: dict[str, Any] = {}
    for n, figures in runs.items():
        result.update({f"scale.jobs{n}.{k}": figures.get(f"load.{k}") for k in KEPT})
    p10, p30 = runs[10].get("load.epoch_p50_s"), runs[30].get("load.epoch_p50_s")
    result["scale.jobs30_vs_10.epoch_p50_ratio"] = round(p30 / p10, 3) if p10 and p30 else None
    result["scale.jobs30_vs_10.rss_ratio"] = round(
        runs[30]["load.peak_rss_mib"] / max(runs[10]["load.peak_rss_mib"], 1e-9), 3)
    for key, value in result.items():
        print(f"  {key} = {value}", flush=True)
    return result


if __name__ == "__main__":
    main()
