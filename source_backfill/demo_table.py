"""The table-backfill demo (``make run-table``): three jobs copy a Delta table that a writer keeps changing.

A 200k-row keyed table (change data feed on) under ``var/demo-table/src`` gets a new version every
~0.1 s (inserts, updates, deletes, upserts). The daemon follows it as a ``delta`` source; three jobs
attach at once — ``snapshot`` (merged), ``arrangement`` (merged) and ``chain`` (a changelog) — and show
their phase, vnodes copied and lag in versions until Ctrl-C (or ``--duration``). Then the writer stops,
the jobs catch up, and each job's table is compared with the source's latest version row for row.
"""

from __future__ import annotations

import argparse
import logging
import shutil
import signal
import threading
import time
from pathlib import Path
from typing import Any

import httpx

JOBS = (("snapshot-copy", "snapshot", "merge"), ("arrangement-copy", "arrangement", "merge"),
        ("chain-log", "chain", "changelog"))


def _show(job: dict[str, Any]) -> None:
    t = job.get("table") or {}
    print(f"  {job['name']:<17} {job['status']:<11} {t.get('phase', '-'):<19} "
          f"vnodes {t.get('vnodes_completed', 0):>3}/{t.get('vnodes_total', 256)} "
          f"lag {t.get('lag_versions')} versions  rows {t.get('rows', {})}", flush=True)


def main(argv: list[str] | None = None) -> int:
    """Run the table demo until Ctrl-C (or ``--duration`` seconds); exit 1 if a table differs."""
    from deltalake import DeltaTable

    from source_backfill.config import load_settings
    from source_backfill.daemon import Daemon
    from source_backfill.testing.delta import ChangingTable, as_rows, replay_changelog

    parser = argparse.ArgumentParser(prog="python -m source_backfill.demo_table", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=200_000, help="rows of the source table")
    parser.add_argument("--api-port", type=int, default=8080)
    parser.add_argument("--root", default="var/demo-table")
    parser.add_argument("--duration", type=float, default=None, help="stop after this many seconds")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s %(message)s")

    root = Path(args.root).resolve()
    shutil.rmtree(root, ignore_errors=True)  # a fresh table each run: the writer's random history restarts
    print(f"source-backfill table demo: a {args.rows}-row Delta table (change data feed on)", flush=True)
    up = ChangingTable.create(str(root / "src"), args.rows, seed=int(time.time()))
    stop = threading.Event()
    previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGINT, signal.SIGTERM)}
    writer, writer_stop = up.writer_thread(0.1)
    settings = load_settings(
        daemon={"state_root": str(root / "state")},
        api={"port": args.api_port},
        metrics={"port": None},
        sources=[{"name": "table", "kind": "delta", "table_path": str(root / "src"), "primary_key": ["id"],
                  "trigger_interval_s": 1.0, "chunk_rows": 256}],
        jobs=[{"name": n, "source": "table", "sink_path": str(root / n), "strategy": s, "mode": m,
               "rate_limit": 40_000} for n, s, m in JOBS],
    )
    daemon = Daemon(settings)
    daemon.start()
    api = daemon.api_url
    print(f"daemon up (no Spark: table jobs read with delta-rs): API {api}  status page {api}/ui  "
          f"metrics {api}/metrics  (Ctrl-C stops the writer, lets the jobs catch up and checks them)",
          flush=True)
    deadline = time.monotonic() + args.duration if args.duration else None
    ok = True
    try:
        with httpx.Client(base_url=api, timeout=10) as client:
            while not stop.is_set() and (deadline is None or time.monotonic() < deadline):
                print(f"{time.strftime('%H:%M:%S')}  source at version {up.versions}", flush=True)
                for job in client.get("/jobs").json():
                    _show(job)
                stop.wait(3.0)
            writer_stop.set()
            writer.join()
            latest = DeltaTable(str(root / "src")).version()
            print(f"writer stopped at version {latest}; waiting for every job to reach it", flush=True)
            until = time.monotonic() + 120
            while time.monotonic() < until:
                jobs = client.get("/jobs").json()
                if all((j.get("table") or {}).get("cursor_version") == latest for j in jobs):
                    break
                time.sleep(1)
        want = up.expected()
        for name, _, mode in JOBS:
            table = DeltaTable(str(root / name)).to_pyarrow_table()
            got = as_rows(table) if mode == "merge" else replay_changelog(table)
            same = got == want
            ok = ok and same
            print(f"  {name}: {len(got)} rows, {'equal to' if same else 'DIFFERENT FROM'} the source's "
                  f"{len(want)}", flush=True)
    finally:
        writer_stop.set()
        daemon.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    print("table demo stopped", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
