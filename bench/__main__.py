"""Run every benchmark module (bench/bench_*.py) in turn: ``make bench`` / ``python -m bench [name ...]``.

Each module's ``main()`` prints its own report (ratios against a baseline measured in the same run);
one failing benchmark is reported and the others still run.
"""

from __future__ import annotations

import importlib
import sys
import time
import traceback
from pathlib import Path


def main(argv: list[str]) -> int:
    names = sorted(p.stem for p in Path(__file__).parent.glob("bench_*.py"))
    if argv:
        names = [n for n in names if any(a in n for a in argv)]
    failed = []
    for name in names:
        print(f"\n=== {name} ===", flush=True)
        t = time.monotonic()
        try:
            importlib.import_module(f"bench.{name}").main()
        except Exception:  # noqa: BLE001 - report and go on with the other benchmarks
            traceback.print_exc()
            failed.append(name)
        print(f"=== {name}: {time.monotonic() - t:.1f}s ===", flush=True)
    if failed:
        print(f"\nfailed benchmarks: {', '.join(failed)}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
