"""Run every benchmark module (bench/bench_*.py) in turn: ``make bench`` / ``python -m bench [name ...]``.

Each module's ``main()`` prints its own report (ratios against a baseline measured in the same run) and
returns its figures; they are merged into ``bench/results/latest.json`` (keys with a dot kept as they
are, others prefixed with the module's name), so running one benchmark updates only its own keys; each
module's entry under ``_measured_at`` says when, under ``_commit`` on which commit (``+dirty``: with
uncommitted changes to the code), which the goals table judges staleness by. ``BENCH_RESULTS=FILE`` sends
the figures to FILE instead and leaves the README's table alone (``make bench-compare``'s runs). One
failing benchmark is reported and the others still run. ``--quick`` asks each module for a smoke run.
Without names every module runs but those in ``LONG`` (the soaks: load, the scale runs, tenants), which
run when named.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import time
import traceback
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench import RESULTS, report

#: Modules that take 10 minutes or more (soaks): left out of a plain ``make bench`` (15 minutes in all).
LONG = ("bench_load", "bench_scale_jobs", "bench_scale_table", "bench_tenants")


def results_path() -> Path:
    """Where this run's figures go: ``BENCH_RESULTS`` when set, else ``latest.json``."""
    return Path(os.environ.get("BENCH_RESULTS") or RESULTS)


def record(module: str, figures: dict[str, Any], path: Path = RESULTS, commit: str | None = None) -> None:
    """Merge one module's figures into ``latest.json`` with the time and the commit they were measured on."""
    short = module.removeprefix("bench_")
    data: dict[str, Any] = json.loads(path.read_text()) if path.exists() else {}
    for key, value in figures.items():
        data[key if "." in key else f"{short}.{key}"] = value
    data.setdefault("_measured_at", {})[short] = datetime.now(UTC).isoformat(timespec="seconds")
    if commit is not None:
        data.setdefault("_commit", {})[short] = commit
    else:  # a module measured again where git cannot tell the commit: its old commit no longer holds
        data.get("_commit", {}).pop(short, None)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(dict(sorted(data.items())), indent=2) + "\n")


def failed_verdicts(figures: dict[str, Any]) -> dict[str, Any]:
    """A module's ``*.verdict`` figures other than ``"ok"`` (``bench_load``: a dead JVM, too few epochs)."""
    return {k: v for k, v in figures.items() if k.endswith(".verdict") and v != "ok"}


def main(argv: list[str]) -> int:
    if "--quick" in argv:
        argv = [a for a in argv if a != "--quick"]
        os.environ["BENCH_QUICK"] = "1"
    names = sorted(p.stem for p in Path(__file__).parent.glob("bench_*.py"))
    if argv:
        names = [n for n in names if any(a in n for a in argv)]
    else:  # the soak-length modules run when named (``make bench BENCH_ARGS=load``)
        names = [n for n in names if n not in LONG]
    failed = []
    results = results_path()
    commit = report.measured_commit()  # before the modules run: the code they run is the tree's now
    for name in names:
        print(f"\n=== {name} ===", flush=True)
        t = time.monotonic()
        try:
            figures = importlib.import_module(f"bench.{name}").main()
            if isinstance(figures, dict) and os.environ.get("BENCH_QUICK") != "1":
                record(name, figures, results, commit)
            if isinstance(figures, dict) and (verdicts := failed_verdicts(figures)):
                for key, verdict in verdicts.items():  # measured and recorded, but the run failed
                    print(f"{key}: {verdict}", flush=True)
                failed.append(name)
        except Exception:  # noqa: BLE001 - report and go on with the other benchmarks
            traceback.print_exc()
            failed.append(name)
        print(f"=== {name}: {time.monotonic() - t:.1f}s ===", flush=True)
    if os.environ.get("BENCH_QUICK") != "1" and results == RESULTS:
        if report.update():
            print("\ndocs/benchmarks.md: the goals table is written from bench/results/latest.json",
                  flush=True)
    if failed:
        print(f"\nfailed benchmarks: {', '.join(failed)}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
