"""One source's jobs kept apart by their lanes (docs/architecture.md, "Lanes: no job waits for another").

Daemon processes (``source-backfill run``, ``local[2]``, a 1 s trigger) on the embedded broker, a producer
writing ``LIVE_PER_S`` records/s over ``PARTITIONS`` partitions after ``HISTORY`` records; in one run:

* ``isolation.victim_p99_ratio_heavy_neighbour`` (goal <= 1.5): the live p99 of a Finished identity job,
  ``victim``, while a neighbour on its source (``heavy``) runs a heavy but allowed transform
  (:func:`heavy`: each record becomes ``HEAVY_ROWS`` rows, each hashed: ~1.5 s of a core a record, ~30 s
  of CPU for one trigger's records), over its p99 with no neighbour, ``WINDOW_S`` each, the lone window
  first, same daemon. A row's latency is the commit of the version that added it minus its Kafka
  timestamp (``live_latency_seconds``' definition), read per row from the victim's table; the API's
  1-minute p99 at each window's end is reported beside it, and ``isolation.victim_epochs_per_trigger_*``
  (the victim's commits per trigger in each window).
* ``isolation.sigterm_exit_s`` (goal <= ``isolation.sigterm_exit_limit_s``, ``shutdown_timeout_s`` + 5):
  SIGTERM to the daemon's exit while the heavy job's step runs (its ``lag_s`` > 0), a repair of the victim
  accepted just before it; the slowest of the run's ``RESTARTS`` such stops, and the ERROR lines each
  logged meanwhile (``isolation.sigterm_error_lines``, the most).
* ``isolation.ready_s_pending_repair`` (goal <= 1.5): /ready of a restart with a repair of the victim
  accepted just before the stop (run after the restart: ``isolation.repair_after_restart``) and the heavy
  job lagging, over /ready of a plain restart (a daemon of the victim alone on the same topic), restarts
  alternated plain first, ``RESTARTS`` pairs, medians.
* ``isolation.drop_applied_s`` (goal <= 2): ``DELETE /jobs/heavy`` while its step runs, to the drop
  applied (``GET /jobs/heavy`` 404) and the last commit of its table, whichever is later; commits of its
  table after that are counted (``isolation.drop_commits_after_applied``, 0).
* ``isolation.lagging_job_exactly_once`` (goal 1): in a daemon of its own, an identity job made slow by a
  transform that keeps identity's columns (:func:`slow_identity`) under the live producer lags past its
  source's ``max_job_lag_s`` (``LAG_BOUND_S``) and is failed; ``LAG_S`` after it first lagged its
  transform is set back to identity (``PATCH``) and it is retried; once caught up (the producer stopped)
  its table is checked against the log offset by offset (``source_backfill.verify``): 1 when every
  offset is there once, else 0.

Restarts are timed from the process start to /ready; every stop waits for the daemon's process group (its
Spark JVM) to be gone before the next start. ``BENCH_ISOLATION_WINDOW_S`` (45), ``BENCH_ISOLATION_RESTARTS``
(2), ``BENCH_ISOLATION_HEAVY_ROWS`` (7,500,000) and ``BENCH_ISOLATION_LAG_S`` set the sizes;
``BENCH_ISOLATION_KEEP=1`` keeps the daemons' logs and tables (their folder is printed);
``BENCH_QUICK=1`` shortens the windows. ``LAG_S`` is 60 s by default to keep ``make bench`` short;
``BENCH_ISOLATION_LAG_S=120`` is the two-minute lag of docs/benchmarks.md.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.meters import commit_times_ms, live_latencies_s, pct, tree_cpu_s
from bench.records import live, new_history

QUICK = os.environ.get("BENCH_QUICK") == "1"
WINDOW_S = float(os.environ.get("BENCH_ISOLATION_WINDOW_S", "10" if QUICK else "45"))
RESTARTS = int(os.environ.get("BENCH_ISOLATION_RESTARTS", "1" if QUICK else "2"))
#: 0.61 CPU-s per 3M rows a record, measured in a warm standalone session: 7.5M rows are ~1.5 s of a core a
#: record, ~30 s of CPU for one trigger's 20 records (3M gave 13-17 s steps of 20 records in the daemon).
HEAVY_ROWS = int(os.environ.get("BENCH_ISOLATION_HEAVY_ROWS", "7500000"))
PARTITIONS = 4
LIVE_PER_S = 20.0
HISTORY = 100_000
TRIGGER_S = 1.0
SHUTDOWN_S = 10.0
LAG_S = float(os.environ.get("BENCH_ISOLATION_LAG_S", "40" if QUICK else "60"))
#: The lagging job's source's ``max_job_lag_s``: small, but above a new job's first steps on a busy box
#: (10 s failed an identity job during its 2,000-record backfill at a load average of 20).
LAG_BOUND_S = 30.0
#: The lagging job's producer: 2 partitions at 20 records/s, after LAG_HISTORY records.
LAG_PARTITIONS, LAG_PER_S, LAG_HISTORY = 2, 20.0, 2000
#: Seconds before the lone window, once the victim is Finished (its backfill out of the API's minute).
SETTLE_S = 5.0 if QUICK else 15.0
ROOT = Path(__file__).resolve().parent.parent


def heavy(rows: int = HEAVY_ROWS) -> str:
    """test_lanes' HEAVY with ``rows`` rows a record: allowed (a generator, built-in pure functions)."""
    return (f"SELECT value, n FROM (SELECT value, explode(sequence(1, {rows})) AS n FROM {{source}}) "
            "WHERE sha2(concat(CAST(value AS STRING), CAST(n AS STRING)), 256) = 'never'")


def slow_identity(rows: int = 200_000) -> str:
    """Identity's columns through a costly always-true predicate: ~0.11 s of a core a record (warm), so
    20 records/s ask for more than the 2 cores give with the daemon's own work."""
    return (f"SELECT * FROM {{source}} WHERE NOT exists(sequence(1, {rows}), "
            "x -> sha2(concat(CAST(value AS STRING), CAST(x AS STRING)), 256) = 'never')")


def wait_until(cond: Callable[[], Any], timeout_s: float, what: str, interval_s: float = 0.2) -> Any:
    """``cond()``'s first truthy value, polled every ``interval_s``; TimeoutError after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not within {timeout_s:.0f} s")
        time.sleep(interval_s)


def _producer(bootstrap: str, topic: str, partitions: int, per_s: float, stop: threading.Event) -> Any:
    """A thread producing ``per_s`` records/s, 4 at a time, until ``stop``."""
    thread = threading.Thread(target=live, args=(bootstrap, topic, partitions, per_s, stop, 4), daemon=True)
    thread.start()
    return thread


def daemon(work: Path, bootstrap: str, sources: list[dict[str, Any]], jobs: list[dict[str, Any]],
           **settings: dict[str, Any]) -> Any:
    """A daemon process of this checkout's code (not started): a 1 s trigger, no job timeout in the way."""
    from source_backfill.testing import RunningDaemon

    work.mkdir(parents=True, exist_ok=True)
    d = RunningDaemon(work, bootstrap, [{"trigger_interval_s": TRIGGER_S, "job_timeout_s": 3600, **s}
                                        for s in sources], jobs, settings)
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    d.env = {**(d.env or {}), "PYTHONPATH": path}  # the daemon runs this checkout's code
    return d


def start(d: Any) -> float:
    """Start the daemon; seconds from its start to /ready."""
    d.start()
    return float(d.wait_ready(600))


def stop(d: Any) -> tuple[float, int | None, int]:
    """SIGTERM; (seconds to the daemon's exit, its exit code, ERROR lines it logged meanwhile), once its
    process group is gone too."""
    pid, logged = d.pid, d.log.stat().st_size
    t = time.monotonic()
    code = d.stop(timeout_s=SHUTDOWN_S + 60)
    took = time.monotonic() - t
    if pid is not None:
        try:
            wait_until(lambda: not _group_alive(pid), 60, "the daemon's process group gone", 0.1)
        except TimeoutError:
            os.killpg(pid, signal.SIGKILL)
    with d.log.open("rb") as f:
        f.seek(logged)
        errors = sum(1 for line in f.read().decode(errors="replace").splitlines() if " ERROR " in line)
    return took, code, errors


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def call(d: Any, method: str, path: str, body: dict[str, Any] | None = None, timeout_s: float = 120) -> Any:
    """One API call, None when it does not answer within ``timeout_s`` (not the kit's 5 s: a create or a
    new transform is checked by Spark before it is accepted, which took longer at a load average of 20)."""
    import httpx

    try:
        return httpx.request(method, d.url + path, json=body, timeout=timeout_s)
    except httpx.HTTPError:
        return None


def accepted(d: Any, method: str, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
    """A mutation the API accepts (201/202): its answer; RuntimeError otherwise."""
    r = call(d, method, path, body)
    if r is None or r.status_code not in (201, 202):
        raise RuntimeError(f"{method} {path}: {'no answer' if r is None else r.text}")
    return dict(r.json())


def job(d: Any, name: str) -> dict[str, Any] | None:
    """``GET /jobs/{name}``, None when it does not answer 200."""
    r = call(d, "GET", f"/jobs/{name}", timeout_s=30)
    return dict(r.json()) if r is not None and r.status_code == 200 else None


def finished(d: Any, name: str, timeout_s: float = 600) -> None:
    """Until the job is Finished (RuntimeError if it fails)."""
    def done() -> bool:
        view = job(d, name) or {}
        if view.get("status") == "failed":
            raise RuntimeError(f"{name} failed: {view.get('error')}")
        return view.get("status") == "finished"

    wait_until(done, timeout_s, f"{name} finished", 0.5)


def _lagging(d: Any, name: str = "heavy", timeout_s: float = 600) -> None:
    """Until the job's lane skips epochs (``lag_s`` > 0: its step runs on; its status says ``lagging``
    only once it has committed, ``pending`` while its first step runs)."""
    wait_until(lambda: ((job(d, name) or {}).get("lag_s") or 0) > 0, timeout_s,
               f"{name} lagging (its step runs on)", 0.5)


def _window(d: Any, table: str) -> dict[str, Any]:
    """``WINDOW_S`` of the running daemon: its bounds (ms), the victim's commits in it, CPU, API p99."""
    cpu0, t0 = tree_cpu_s(d.pid), time.time()
    time.sleep(WINDOW_S)  # the measured stretch itself
    cpu1, t1 = tree_cpu_s(d.pid), time.time()
    commits = [c for c in commit_times_ms(table) if t0 * 1000 <= c <= t1 * 1000]
    view = job(d, "victim") or {}
    return {"since_ms": t0 * 1000, "until_ms": t1 * 1000, "commits": len(commits),
            "epochs_per_trigger": len(commits) / ((t1 - t0) / TRIGGER_S),
            "cores_busy": (cpu1 - cpu0) / (t1 - t0),
            "api_p99_s": (view.get("live_latency") or {}).get("p99_s")}


def _ask_repair(d: Any) -> int:
    """``POST /jobs/victim/repair`` of every split's first quarter of the history: accepted; its id."""
    window = {"splits": [], "from_offset": 0, "to_offset": HISTORY // PARTITIONS // 4}
    return int(accepted(d, "POST", "/jobs/victim/repair", window)["id"])


def _repair_state(d: Any, repair_id: int) -> str | None:
    """The repair's state as the running daemon shows it; None: not shown (finished before it started)."""
    views = wait_until(lambda: job(d, "victim"), 300, "the victim's view")["repairs"]
    return next((str(r["state"]) for r in views if r["id"] == repair_id), None)


def _drop_heavy(d: Any) -> dict[str, Any]:
    """``DELETE /jobs/heavy`` while its step runs: seconds to the drop applied and its table's last commit."""
    table = str(d.tables / "heavy")
    _lagging(d)
    t0, m0 = time.time(), time.monotonic()
    accepted(d, "DELETE", "/jobs/heavy")
    wait_until(lambda: getattr(call(d, "GET", "/jobs/heavy", timeout_s=30), "status_code", None) == 404, 300,
               "heavy's drop applied", 0.05)
    applied_s, applied_at = time.monotonic() - m0, time.time()
    victim = (job(d, "victim") or {}).get("epoch") or 0
    wait_until(lambda: ((job(d, "victim") or {}).get("epoch") or 0) >= victim + 5, 120,
               "five more victim commits after the drop")
    commits = commit_times_ms(table) if Path(table, "_delta_log").exists() else []
    last_s = max((c / 1000 - t0 for c in commits if c >= t0 * 1000), default=0.0)
    return {"isolation.drop_applied_s": round(max(applied_s, last_s), 2),
            "isolation.drop_applied_api_s": round(applied_s, 2),
            "isolation.drop_commits_after_applied": sum(1 for c in commits if c > applied_at * 1000)}


def main() -> dict[str, Any]:
    from connectors.kafka.admin import KafkaAdmin
    from connectors.kafka.embedded import EmbeddedBroker

    work = Path(tempfile.mkdtemp(prefix="bench-isolation-"))
    out: dict[str, Any] = {}
    stop_live = threading.Event()
    with EmbeddedBroker() as broker:
        bootstrap = broker.bootstrap
        topic = "isolation"
        new_history(KafkaAdmin(bootstrap), bootstrap, topic, HISTORY, PARTITIONS)
        producer = _producer(bootstrap, topic, PARTITIONS, LIVE_PER_S, stop_live)
        source = [{"name": "src", "topics": [topic]}]
        victim = [{"name": "victim", "source": "src"}]
        plain = daemon(work / "plain", bootstrap, source, victim, daemon={"shutdown_timeout_s": SHUTDOWN_S})
        main_d = daemon(work / "main", bootstrap, source, victim, daemon={"shutdown_timeout_s": SHUTDOWN_S})
        try:
            out.update(_victim_and_restarts(plain, main_d))
        finally:
            for d in (plain, main_d):
                d.kill()
            stop_live.set()
            producer.join(30)
        out.update(lagging_exactly_once(work / "lag", bootstrap))
    if os.environ.get("BENCH_ISOLATION_KEEP") == "1":
        print(f"  daemons' logs and tables kept in {work}", flush=True)
    else:
        shutil.rmtree(work, ignore_errors=True)
    _print(out)
    return out


def _victim_and_restarts(plain: Any, d: Any) -> dict[str, Any]:
    """Every figure but the lagging job's, on the plain daemon and the main one (see the module)."""
    start(plain)
    finished(plain, "victim")
    stop(plain)
    out: dict[str, Any] = {"isolation.fresh_ready_s": round(start(d), 2)}
    finished(d, "victim")
    table = str(d.tables / "victim")
    from deltalake import DeltaTable

    version = DeltaTable(table).version()
    time.sleep(SETTLE_S)  # the backfill's epochs out of the API's 1-minute window
    alone = _window(d, table)
    accepted(d, "POST", "/jobs", {"name": "heavy", "source": "src", "sink_path": str(d.tables / "heavy"),
                                  "start": {"kind": "latest"}, "transform": heavy()})
    _lagging(d)
    with_heavy = _window(d, table)
    print(f"  windows: alone {alone}, beside the heavy job {with_heavy}", flush=True)
    lat = {name: live_latencies_s(table, w["since_ms"], w["until_ms"], version)
           for name, w in (("alone", alone), ("heavy", with_heavy))}
    p99 = {name: pct(values, 0.99) for name, values in lat.items()}
    out.update({
        "isolation.victim_p99_ratio_heavy_neighbour": round(p99["heavy"] / p99["alone"], 3),
        **{f"isolation.victim_p99_s_{n}": round(v, 3) for n, v in p99.items()},
        **{f"isolation.victim_p50_s_{n}": round(pct(v, 0.5), 3) for n, v in lat.items()},
        **{f"isolation.victim_rows_{n}": len(v) for n, v in lat.items()},
        **{f"isolation.victim_{k}_{n}": round(w[k], 3) if isinstance(w[k], float) else w[k]
           for n, w in (("alone", alone), ("heavy", with_heavy))
           for k in ("epochs_per_trigger", "cores_busy", "api_p99_s")},
    })
    # SIGTERM while the heavy step runs, a repair of the victim just accepted (pending at the restart)
    sigterms, errors = [], []
    ready: dict[str, list[float]] = {"plain": [], "loaded": []}
    states = []
    for i in range(RESTARTS):
        _lagging(d)
        repair_id = _ask_repair(d)
        took, code, logged = stop(d)
        sigterms.append(took)
        errors.append(logged)
        if code != 0:
            raise RuntimeError(f"daemon exited {code} on SIGTERM; log:\n{d.tail()}")
        ready["plain"].append(start(plain))
        stop(plain)
        ready["loaded"].append(start(d))
        states.append(_repair_state(d, repair_id))
        print(f"  SIGTERM with the heavy step running: exit {code} in {took:.1f} s, {logged} ERROR lines "
              f"logged meanwhile; restart {i + 1}: plain "
              f"{ready['plain'][-1]:.1f} s, repair pending + heavy lagging {ready['loaded'][-1]:.1f} s to "
              f"/ready (the repair then: {states[-1]})", flush=True)
    out.update(_drop_heavy(d))
    repaired = wait_until(lambda: (s := _repair_state(d, repair_id)) in ("done", "failed") and s, 300,
                          "the victim's last repair finished")
    stop(d)
    loaded, plain_s = statistics.median(ready["loaded"]), statistics.median(ready["plain"])
    out.update({
        "isolation.ready_s_pending_repair": round(loaded / plain_s, 3),
        "isolation.ready_s_plain_restart": round(plain_s, 2),
        "isolation.ready_s_restart_pending_repair": round(loaded, 2),
        # the repair ran after the restart (shown: pending, running or done since the daemon started)
        "isolation.repair_after_restart": int(all(s is not None for s in states)),
        "isolation.repair_pending_at_ready": sum(1 for s in states if s not in (None, "done")),
        "isolation.repair_done": int(repaired == "done"),
        "isolation.sigterm_exit_s": round(max(sigterms), 2),
        "isolation.sigterm_exit_limit_s": SHUTDOWN_S + 5,
        "isolation.sigterm_stops": len(sigterms),
        # Spark's and py4j's: a cancelled write, the abandoned epoch's traceback (the exit code is 0)
        "isolation.sigterm_error_lines": max(errors),
    })
    return out


def lagging_exactly_once(work: Path, bootstrap: str) -> dict[str, Any]:
    """The lagging identity job, failed past its bound, retried as identity: exactly once (1) or not (0)."""
    from connectors.kafka.admin import KafkaAdmin
    from source_backfill.verify import check_exactly_once

    topic = "isolation-lag"
    new_history(KafkaAdmin(bootstrap), bootstrap, topic, LAG_HISTORY, LAG_PARTITIONS)
    stop_live = threading.Event()
    producer = _producer(bootstrap, topic, LAG_PARTITIONS, LAG_PER_S, stop_live)
    d = daemon(work, bootstrap, [{"name": "lag", "topics": [topic], "max_job_lag_s": LAG_BOUND_S}], [])
    try:
        start(d)
        accepted(d, "POST", "/jobs", {"name": "lagger", "source": "lag",
                                      "sink_path": str(d.tables / "lagger")})
        finished(d, "lagger")
        accepted(d, "PATCH", "/jobs/lagger", {"transform": slow_identity()})
        _lagging(d, "lagger", 300)
        lagging_at = time.monotonic()
        view = wait_until(lambda: (v := job(d, "lagger")) is not None and v["status"] == "failed" and v, 300,
                          "lagger failed past its bound", 0.5)
        failed_after = time.monotonic() - lagging_at
        time.sleep(max(0.0, lagging_at + LAG_S - time.monotonic()))  # the lag asked for, failed or not
        lag = time.monotonic() - lagging_at
        accepted(d, "PATCH", "/jobs/lagger", {"transform": None})
        accepted(d, "POST", "/jobs/lagger/retry")
        caught_up = time.monotonic()
        finished(d, "lagger")
        caught_up_s = time.monotonic() - caught_up
        stop_live.set()
        producer.join(30)
        table = str(d.tables / "lagger")

        def once() -> Any:  # the job commits the producer's last records at its next epochs
            report = check_exactly_once(table, bootstrap, [topic])
            return report if report.ok else None

        try:
            report, ok = wait_until(once, 120, "the lagging job's table exactly once", 1.0), 1
        except TimeoutError:
            report, ok = check_exactly_once(table, bootstrap, [topic]), 0
            print(f"  lagging job NOT exactly once:\n{report.summary()}", flush=True)
    finally:
        stop_live.set()
        d.kill()
    print(f"  lagging job: failed {failed_after:.0f} s after it first lagged ({view['error']}); retried "
          f"after {lag:.0f} s, caught up {caught_up_s:.1f} s later; {report.summary()}", flush=True)
    return {"isolation.lagging_job_exactly_once": ok,
            "isolation.lagging_job_records": sum(s.log_records for s in report.splits.values()),
            "isolation.lagging_job_lag_s": round(lag, 1), "isolation.lagging_job_failed_after_s":
            round(failed_after, 1), "isolation.lagging_job_catch_up_s": round(caught_up_s, 2)}


def _print(out: dict[str, Any]) -> None:
    goals = {"victim_p99_ratio_heavy_neighbour": "<= 1.5", "drop_applied_s": "<= 2",
             "ready_s_pending_repair": "<= 1.5", "sigterm_exit_s": f"<= {SHUTDOWN_S + 5:g} s",
             "lagging_job_exactly_once": "1"}
    for key, goal in goals.items():
        print(f"  isolation.{key}: {out.get('isolation.' + key)} (goal {goal})", flush=True)
    print("bench_isolation:", json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
