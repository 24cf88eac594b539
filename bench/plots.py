"""PNG plots next to ``bench/results/latest.json``: rows/s over time, and latency CDFs.

matplotlib (the ``bench`` extra, installed by ``make venv``) draws them without a display (Agg). A machine
without it still gets every figure in ``latest.json``: the plots are skipped with a line saying so.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

RESULTS = Path(__file__).parent / "results"


def _pyplot():  # noqa: ANN202 - matplotlib's module, or None when the extra is not installed
    try:
        import matplotlib
    except ImportError:
        print("  plots skipped: matplotlib is not installed (pip install -e '.[bench]')", flush=True)
        return None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def rates(samples: Sequence[tuple[float, int]], bin_s: float = 1.0) -> tuple[list[float], list[float]]:
    """Rows/s per ``bin_s`` window from ``(seconds, rows so far)`` samples: the window's ends and rates.

    A window's rate is the growth of the rows over it, with the count at any time taken as the last
    sample at or before it (rows so far never shrink).
    """
    if not samples:
        return [], []
    ordered = sorted(samples)
    ends: list[float] = []
    per_s: list[float] = []
    last_rows, i = 0, 0
    t = bin_s
    horizon = ordered[-1][0]
    while t - bin_s < horizon:
        rows = last_rows
        while i < len(ordered) and ordered[i][0] <= t:
            rows = max(rows, ordered[i][1])
            i += 1
        ends.append(t)
        per_s.append((rows - last_rows) / bin_s)
        last_rows = rows
        t += bin_s
    return ends, per_s


def rows_per_s(series: Mapping[str, Sequence[tuple[float, int]]], title: str, name: str,
               folder: Path = RESULTS) -> Path | None:
    """One line per series of rows/s over seconds since its start; the PNG's path (None: skipped)."""
    plt = _pyplot()
    if plt is None:
        return None
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for label, samples in series.items():
        ends, per_s = rates(samples)
        ax.step(ends, per_s, where="post", label=label)
    ax.set_xlabel("seconds since start")
    ax.set_ylabel("rows/s (1 s windows)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    return _save(fig, plt, folder / name)


def cdfs(series: Mapping[str, Sequence[float]], title: str, name: str, xlabel: str,
         folder: Path = RESULTS) -> Path | None:
    """Empirical CDFs, one line per series (its sample count in the legend); the PNG's path."""
    plt = _pyplot()
    if plt is None:
        return None
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for label, values in series.items():
        ordered = sorted(values)
        if not ordered:
            continue
        n = len(ordered)
        ax.step(ordered, [(i + 1) / n for i in range(n)], where="post", label=f"{label} (n={n})")
    ax.set_xscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel("fraction of rows")
    ax.set_title(title)
    ax.grid(alpha=0.3, which="both")
    ax.legend()
    return _save(fig, plt, folder / name)


def _save(fig, plt, path: Path) -> Path:  # noqa: ANN001
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    print(f"  plot: {path}", flush=True)
    return path
