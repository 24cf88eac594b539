"""Two namespaces of equal ``width_share`` hold half a source's history width each (issue 50, ``tenants.``).

A daemon process (``source-backfill run``, ``local[2]``, a 1 s trigger) on the embedded broker, one Kafka
source of ``PARTITIONS`` partitions holding ``HISTORY`` records, its history width fixed at ``WIDTH`` tasks
(``history_width.fixed_tasks``), and two declared namespaces (``[[namespaces]]``) ``a`` and ``b`` of
``width_share`` 1 each. ``JOBS_A`` jobs of ``a`` and ``JOBS_B`` of ``b`` (24 and 6: per-job turns would give
``a`` 80 % of the width, per-namespace turns 50 %) are created through the API, interleaved, all from
``earliest``, with reads ahead on and ``max_rows_per_epoch`` = ``CAP``: each copy is small, every job asks
for a slot again at once, so both namespaces always have more copies waiting than the width runs, and no
job adopts more than ``CAP`` offsets an epoch, so none runs out of history within the run (each has
``HISTORY`` offsets to copy: 500 epochs of ``CAP`` at the least; a job of ``b`` got 13 copies a minute
in a quick run here).

Once every job is backfilling, after ``SETTLE_S``, the window: ``/metrics`` is scraped every ``SAMPLE_S``
for ``history_slot_seconds_total{source, namespace}`` (task-seconds each namespace's copies held, counted as
each copy ends) and ``GET /jobs`` for every job's status. **The window is measured only while every job of
both namespaces is still backfilling**: it ends at the last sample before one finished or failed (then the
verdict says so), else after ``WINDOW_S``. Keys:

* ``tenants.width_share_error`` (goal <= 0.2): max over the namespaces of ``|share_held - 0.5| / 0.5``,
  ``share_held`` its slot-seconds over both namespaces' in the window;
* ``tenants.width_share_a`` / ``_b``, ``tenants.slot_seconds_a`` / ``_b``; ``tenants.per_job_fair_share_a``
  (``JOBS_A`` / all jobs, 0.8: what per-job turns would give, for contrast, not measured) and its error
  (0.6); ``tenants.width_utilisation`` (both namespaces' slot-seconds over ``WIDTH`` x the window: how busy
  the width was); ``tenants.rows_share_b`` (history rows ``b``'s jobs copied in the window over all);
  ``tenants.min_remaining_offsets`` (the least history any job had left at the window's end: > 0, else the
  window was cut); ``tenants.window_s`` as measured, ``tenants.verdict``;
* ``tenants.baseline.*``: the same jobs on a second daemon with no namespace declared, so the turns go by
  job (the queue's order), over ``BASELINE_S``: what the namespaces' turns are measured against (its
  ``width_share_a`` near 0.8 shows the figure can tell the two apart).

``BENCH_TENANTS_WINDOW_S`` (300; 60 with ``BENCH_QUICK=1``), ``BENCH_TENANTS_BASELINE_S`` (60; 30 quick;
0 leaves the baseline out), ``BENCH_TENANTS_JOBS_A`` (24),
``BENCH_TENANTS_JOBS_B`` (6) set the sizes; ``BENCH_TENANTS_KEEP=1`` keeps the daemon's log and tables (the
folder is printed). The machine is shared: the figure is a ratio of two namespaces' slot-seconds in one
window, not a duration.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.bench_isolation import accepted, call, daemon, start, stop, wait_until
from bench.records import new_history

QUICK = os.environ.get("BENCH_QUICK") == "1"
WINDOW_S = float(os.environ.get("BENCH_TENANTS_WINDOW_S", "60" if QUICK else "300"))
#: The baseline's window (no namespaces declared: per-job turns); 0 leaves it out.
BASELINE_S = float(os.environ.get("BENCH_TENANTS_BASELINE_S", "30" if QUICK else "60"))
#: Jobs by namespace: per-job turns would give ``a`` 80 % of the width, per-namespace turns 50 %.
JOBS = {"a": int(os.environ.get("BENCH_TENANTS_JOBS_A", "24")),
        "b": int(os.environ.get("BENCH_TENANTS_JOBS_B", "6"))}
TOPIC = "tenants"
PARTITIONS = 4
HISTORY = 1_000_000
#: Offsets a job adopts an epoch at most (and copies a read ahead): 1M offsets last it 500 s at 1 s epochs.
CAP = 2000
WIDTH = 2
SETTLE_S = 10.0 if QUICK else 20.0
SAMPLE_S = 5.0 if QUICK else 10.0
GOAL = 0.2
#: The baseline's figures kept, under ``tenants.baseline.``.
BASELINE_KEYS = ("width_share_error", *(f"{k}_{ns}" for k in ("width_share", "slot_seconds") for ns in JOBS),
                 "width_utilisation", "rows_share_b", "window_s", "verdict")


def interleaved(jobs: dict[str, int]) -> list[str]:
    """Job names ``<ns>.j<NN>`` ordered so each namespace's creates are spread over the whole sequence."""
    names = [(i / n, ns, f"{ns}.j{i:02d}") for ns, n in jobs.items() for i in range(n)]
    return [name for _, _, name in sorted(names)]


def _sample(d: Any) -> dict[str, Any] | None:
    """Slot-seconds by namespace and every job's status, rows and history left, now (None: no answer)."""
    from source_backfill.testing.metrics import scrape, total

    samples = scrape(d.url)
    r = call(d, "GET", "/jobs", timeout_s=60)
    if not samples or r is None or r.status_code != 200:
        return None
    views = {v["name"]: v for v in r.json()}
    return {"t": time.monotonic(),
            "slot_s": {ns: total(samples, "history_slot_seconds_total", source="src", namespace=ns)
                       for ns in JOBS},
            "status": {name: v.get("status") for name, v in views.items()},
            "rows": {name: v.get("rows_history") or 0 for name, v in views.items()},
            "remaining": {name: v.get("remaining_offsets") for name, v in views.items()}}


def _all_backfilling(sample: dict[str, Any], names: list[str]) -> bool:
    return all(sample["status"].get(n) == "backfilling" for n in names)


def measure(d: Any, names: list[str], window_s: float) -> dict[str, Any]:
    """The window on the running daemon whose jobs ``names`` exist: its first and last samples, its cut."""
    wait_until(lambda: (s := _sample(d)) is not None and _all_backfilling(s, names), 600,
               "every job backfilling", 1.0)
    print(f"  every job backfilling; window of {window_s:g} s after {SETTLE_S:g} s", flush=True)
    time.sleep(SETTLE_S)
    first = wait_until(lambda: _sample(d), 120, "the window's first sample")
    last, cut, minutes = first, None, [first]
    while last["t"] - first["t"] < window_s:
        time.sleep(max(0.0, min(SAMPLE_S, first["t"] + window_s - time.monotonic())))
        s = _sample(d)
        if s is None:
            continue
        if not _all_backfilling(s, names):
            cut = {n: s["status"].get(n) for n in names if s["status"].get(n) != "backfilling"}
            break
        last = s
        if last["t"] - minutes[-1]["t"] >= 60:
            minutes.append(last)
            held = {ns: last["slot_s"][ns] - minutes[-2]["slot_s"][ns] for ns in JOBS}
            print(f"  minute {len(minutes) - 1}: slot-seconds held {held}", flush=True)
    return {"first": first, "last": last, "cut": cut, "minutes": minutes, "asked_s": window_s}


def figures(window: dict[str, Any], names: list[str]) -> dict[str, Any]:
    """The module's keys (``tenants.`` ones) from the window's first and last samples."""
    first, last = window["first"], window["last"]
    span = last["t"] - first["t"]
    held = {ns: last["slot_s"][ns] - first["slot_s"][ns] for ns in JOBS}
    both = sum(held.values())
    share = {ns: held[ns] / both if both else float("nan") for ns in JOBS}
    rows = {ns: sum(last["rows"].get(n, 0) - first["rows"].get(n, 0) for n in names if n.startswith(f"{ns}."))
            for ns in JOBS}
    per_job_a = JOBS["a"] / sum(JOBS.values())
    remaining = [r for n in names if (r := last["remaining"].get(n)) is not None]
    verdict = "ok"
    if window["cut"]:
        verdict = (f"window cut at {span:.0f} s of {window['asked_s']:g}: not backfilling any more "
                   f"{window['cut']}")
    elif not both:
        verdict = "no copy ended in the window"
    return {
        "tenants.width_share_error": round(max(abs(s - 0.5) / 0.5 for s in share.values()), 3),
        **{f"tenants.width_share_{ns}": round(share[ns], 3) for ns in JOBS},
        **{f"tenants.slot_seconds_{ns}": round(held[ns], 1) for ns in JOBS},
        **{f"tenants.jobs_{ns}": JOBS[ns] for ns in JOBS},
        "tenants.width_share_jobs": sum(JOBS.values()),
        "tenants.per_job_fair_share_a": round(per_job_a, 3),
        "tenants.per_job_fair_error": round(abs(per_job_a - 0.5) / 0.5, 3),
        "tenants.width_utilisation": round(both / (WIDTH * span), 3) if span else None,
        "tenants.rows_share_b": round(rows["b"] / max(sum(rows.values()), 1), 3),
        **{f"tenants.rows_{ns}": rows[ns] for ns in JOBS},
        "tenants.min_remaining_offsets": min(remaining) if remaining else None,
        "tenants.window_s": round(span, 1),
        "tenants.verdict": verdict,
    }


def run(bootstrap: str, work: Path, names: list[str], declared: bool, window_s: float) -> dict[str, Any]:
    """One daemon of the jobs ``names``, the namespaces declared (per-namespace turns) or not (per-job
    turns: the baseline), measured over ``window_s``; its figures."""
    source = {"name": "src", "topics": [TOPIC], "history_width": {"fixed_tasks": WIDTH}}
    d = daemon(work, bootstrap, [source], [])
    spaces = [{"name": ns, "sources": ["src"], "width_share": 1} for ns in JOBS] if declared else []
    d.env = {**(d.env or {}), "SOURCE_BACKFILL_NAMESPACES": json.dumps(spaces)}
    try:
        print(f"  /ready in {start(d):.1f} s; creating {len(names)} jobs {JOBS}, namespaces "
              f"{'declared' if declared else 'not declared (per-job turns)'}", flush=True)
        t = time.monotonic()
        for name in names:
            accepted(d, "POST", "/jobs", {"name": name, "namespace": name.split(".")[0], "source": "src",
                                          "sink_path": str(d.tables / name), "max_rows_per_epoch": CAP})
        print(f"  created in {time.monotonic() - t:.1f} s", flush=True)
        window = measure(d, names, window_s)
        stop(d)
    finally:
        d.kill()
    return figures(window, names)


def main() -> dict[str, Any]:
    from connectors.kafka.admin import KafkaAdmin
    from connectors.kafka.embedded import EmbeddedBroker

    work = Path(tempfile.mkdtemp(prefix="bench-tenants-"))
    names = interleaved(JOBS)
    with EmbeddedBroker() as broker:
        new_history(KafkaAdmin(broker.bootstrap), broker.bootstrap, TOPIC, HISTORY, PARTITIONS)
        out = run(broker.bootstrap, work / "shares", names, declared=True, window_s=WINDOW_S)
        if BASELINE_S > 0:
            base = run(broker.bootstrap, work / "baseline", names, declared=False, window_s=BASELINE_S)
            out.update({f"tenants.baseline.{k}": base[f"tenants.{k}"] for k in BASELINE_KEYS})
    if os.environ.get("BENCH_TENANTS_KEEP") == "1":
        print(f"  the daemons' logs and tables kept in {work}", flush=True)
    else:
        shutil.rmtree(work, ignore_errors=True)
    print(f"  tenants.width_share_error: {out['tenants.width_share_error']} (goal <= {GOAL:g}); per-job "
          f"turns would give {out['tenants.per_job_fair_error']}, measured "
          f"{out.get('tenants.baseline.width_share_error')}", flush=True)
    print("bench_tenants:", json.dumps(out), flush=True)
    return out


if __name__ == "__main__":
    main()
