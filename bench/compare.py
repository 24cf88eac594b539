"""Two builds compared in one run: ``make bench-compare BASE=<rev>`` / ``python -m bench.compare REV``.

A date-to-date comparison of two ``latest.json`` cannot tell a regression from this machine's noise (the
batch copy took 4.0 s in one run and 9.3 s in the next: issue 51). So both builds run here, now, in turn:
the base revision checked out as a git worktree under ``var/bench-compare/<sha>`` (with its own venv only
when its dependencies differ from the head's), the head being this tree as it is, uncommitted changes
included. Each chosen benchmark module runs on base and head alternately, ABAB… for ``--pairs`` pairs,
each side as ``python -m bench MODULES`` in its own tree with its own ``source_backfill`` first on the
path, each run's figures in a file of its own (``BENCH_RESULTS``; a base from before it has its
``latest.json`` taken instead), never the shared ``bench/results/latest.json``.

Then, per figure (the goals of :mod:`bench.report` first, then every other number the modules gave):
both medians, head/base, each side's spread (min–max) and a verdict (:func:`verdict`): "regression" when
every head run is worse than every base run (the two spreads apart, on the goal's bad side),
"improvement" the other way, else "same". The table is printed and written as markdown for an issue's
note (``var/bench-compare/runs/<stamp>/compare.md`` unless ``--out``).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench import report

ROOT = Path(__file__).parent.parent
WORK = ROOT / "var" / "bench-compare"
DEFAULT_BENCH = "startup backfill trigger"


# --- the statistics: pure ------------------------------------------------------------------------------


def verdict(base: Sequence[float], head: Sequence[float], higher_is_better: bool | None) -> str:
    """``head``'s runs against ``base``'s: "regression", "improvement", "same" (or "changed", no direction).

    Beyond the spread of the runs means the two ranges do not meet: every head run worse than every base
    run is a regression (with 3 runs each, 1 chance in 20 for two builds alike), one range touching or
    overlapping the other is "same". ``higher_is_better`` None (a figure with no direction): "changed"
    when apart. A side with no runs: "—".
    """
    if not base or not head:
        return "—"
    below, above = max(head) < min(base), min(head) > max(base)
    if higher_is_better is None:
        return "changed" if below or above else "same"
    if below:
        return "regression" if higher_is_better else "improvement"
    if above:
        return "improvement" if higher_is_better else "regression"
    return "same"


_HIGHER = ("speedup", "_per_s", "rows_s", "throughput")
_LOWER = ("_ms", "_s", "_bytes", "_mb", "_kb")


def direction(key: str) -> bool | None:
    """Whether a higher ``key`` is better: from its goal, else from its unit; None when neither tells."""
    goal = next((g for g in report.GOALS if g.key == key), None)
    if goal is not None:
        return goal.higher_is_better
    if key.endswith(_HIGHER):
        return True
    if key.endswith(_LOWER) or any(w in key for w in ("p50", "p99", "rss", "latency")):
        return False
    return None


def numbers(run: Mapping[str, Any]) -> dict[str, float]:
    """A run's numeric figures (no ``_measured_at``-like entries, no flags, no NaN)."""
    return {k: float(v) for k, v in run.items() if not k.startswith("_") and not isinstance(v, bool)
            and isinstance(v, int | float) and v == v}


@dataclass(frozen=True)
class Row:
    """One figure on both sides: its runs' values and which way is better."""

    key: str
    base: tuple[float, ...]
    head: tuple[float, ...]
    higher_is_better: bool | None = None
    goal: str = ""

    @property
    def base_median(self) -> float | None:
        return statistics.median(self.base) if self.base else None

    @property
    def head_median(self) -> float | None:
        return statistics.median(self.head) if self.head else None

    @property
    def ratio(self) -> float | None:
        """head median / base median (None: a side missing, or a base of 0)."""
        if self.base_median is None or self.head_median is None or self.base_median == 0:
            return None
        return self.head_median / self.base_median

    @property
    def verdict(self) -> str:
        return verdict(self.base, self.head, self.higher_is_better)


def compare(base_runs: Sequence[Mapping[str, Any]], head_runs: Sequence[Mapping[str, Any]]) -> list[Row]:
    """Every figure either side measured: the goals first (in ``report.GOALS``' order), then the rest."""
    base = [numbers(r) for r in base_runs]
    head = [numbers(r) for r in head_runs]
    keys = {k for run in (*base, *head) for k in run}
    goals = [g.key for g in report.GOALS if g.key in keys]
    texts = {g.key: g.goal for g in report.GOALS}
    return [Row(k, tuple(r[k] for r in base if k in r), tuple(r[k] for r in head if k in r), direction(k),
                texts.get(k, "")) for k in [*goals, *sorted(keys - set(goals))]]


def _n(v: float | None) -> str:
    return "—" if v is None else f"{v:.4g}"


def _spread(values: Sequence[float]) -> str:
    return f"{min(values):.4g}–{max(values):.4g}" if values else "—"


def table(rows: Sequence[Row]) -> str:
    """The markdown table of the comparison; a verdict other than "same" in bold."""
    lines = ["| figure | goal | better | base median | head median | head/base | base spread | head spread "
             "| verdict |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        better = {True: "higher", False: "lower", None: "?"}[r.higher_is_better]
        shown = r.verdict if r.verdict in ("same", "—") else f"**{r.verdict}**"
        ratio = "—" if r.ratio is None else f"{r.ratio:.3f}"
        lines.append(report._row(f"`{r.key}`", r.goal or "—", better, _n(r.base_median), _n(r.head_median),
                                 ratio, _spread(r.base), _spread(r.head), shown))
    return "\n".join(lines)


def modules_for(words: Sequence[str], available: Sequence[str]) -> list[str]:
    """The benchmark modules (``bench_*``) that ``words`` name: a module's name or part of it, or a
    figure's prefix measured by another module (``startup``: ``bench_trigger``)."""
    chosen: list[str] = []
    for word in words:
        word = report.FIGURE_MODULES.get(word, word)
        found = [m for m in available if word in m.removeprefix("bench_")]
        if not found:
            raise SystemExit(f"bench-compare: no benchmark module for {word!r} (modules: "
                             f"{', '.join(m.removeprefix('bench_') for m in available)})")
        chosen += [m for m in found if m not in chosen]
    return chosen


# --- the runs: git, venvs, processes -------------------------------------------------------------------


@dataclass
class Side:
    """One build: its tree, the python that runs it, the environment it runs in, and its runs' figures."""

    name: str
    tree: Path
    python: str
    env: dict[str, str]
    label: str
    runs: list[dict[str, Any]] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)


def _git(*args: str, cwd: Path = ROOT) -> str:
    done = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"bench-compare: git {' '.join(args)}: {done.stderr.strip()}")
    return done.stdout.strip()


def checkout(sha: str) -> Path:
    """The base revision as a git worktree under ``var/bench-compare/<sha>`` (made once, then reused)."""
    tree = WORK / sha
    if (tree / ".git").exists():
        _git("checkout", "--quiet", "--force", "--detach", sha, cwd=tree)  # a README its bench rewrote
    else:
        WORK.mkdir(parents=True, exist_ok=True)
        _git("worktree", "add", "--force", "--detach", str(tree), sha)
    return tree


def _dependencies(tree: Path) -> tuple[list[str], list[str]]:
    path = tree / "pyproject.toml"
    project = tomllib.loads(path.read_text()).get("project", {}) if path.exists() else {}
    return project.get("dependencies", []), project.get("optional-dependencies", {}).get("bench", [])


def python_for(tree: Path) -> str:
    """The head's python when ``tree``'s dependencies are the head's, else a venv of its own in ``tree``."""
    wanted = _dependencies(tree)
    if wanted == _dependencies(ROOT):
        return sys.executable
    venv = tree / ".venv"
    stamp = venv / ".bench-compare-installed"
    python = str(venv / "bin" / "python")
    if not stamp.exists() or stamp.read_text() != json.dumps(wanted):
        print(f"bench-compare: the base's dependencies differ from the head's: installing them into {venv}",
              flush=True)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([python, "-m", "pip", "install", "--quiet", "-e", f"{tree}[bench]"], check=True)
        stamp.write_text(json.dumps(wanted))
    return python


def jars_env(tree: Path, python: str, env: dict[str, str]) -> dict[str, str]:
    """The base's JVM jars: the head's when both pin the same (``deploy/jvm/pom.xml``), else its own."""
    pom = Path("deploy/jvm/pom.xml")
    if not (tree / pom).exists() or _pins(tree / pom) == _pins(ROOT / pom):
        return {"SOURCE_BACKFILL_JARS": os.environ.get("SOURCE_BACKFILL_JARS") or str(ROOT / "var" / "jvm")}
    mine = {k: v for k, v in env.items() if k != "SOURCE_BACKFILL_JARS"}
    subprocess.run([python, "-m", "source_backfill.runtime.jvm", "fetch"], cwd=tree, env=mine, check=True)
    return {"SOURCE_BACKFILL_JARS": str(tree / "var" / "jvm")}


def _pins(pom: Path) -> str:
    """The pom's text without its comments: a reworded comment pins no other jar."""
    return re.sub(r"<!--.*?-->", "", pom.read_text(), flags=re.DOTALL)


def side_env(tree: Path) -> dict[str, str]:
    """The environment a side runs in: its own tree first on the path, no quick mode."""
    env = {k: v for k, v in os.environ.items() if k not in ("BENCH_QUICK", "BENCH_RESULTS")}
    env["PYTHONPATH"] = os.pathsep.join([str(tree), *filter(None, [os.environ.get("PYTHONPATH")])])
    return env


def check_imports(side: Side) -> None:
    """Fail unless the side imports its own tree's ``bench`` and ``source_backfill`` (no installed copy)."""
    code = "import bench, source_backfill; print(bench.__file__); print(source_backfill.__file__)"
    found = subprocess.run([side.python, "-c", code], cwd=side.tree, env=side.env, capture_output=True,
                           text=True, check=False)
    paths = found.stdout.split()
    if found.returncode != 0 or len(paths) != 2 or not all(Path(p).is_relative_to(side.tree) for p in paths):
        raise SystemExit(f"bench-compare: the {side.name} side does not import its own tree {side.tree}: "
                         f"{found.stdout.strip() or found.stderr.strip()}")


def run_once(side: Side, modules: Sequence[str], out: Path) -> None:
    """One run of ``modules`` on ``side``: its figures into ``out`` and ``side.runs``, its output in a log."""
    log = out.with_suffix(".log")
    own = (side.tree / "bench" / "__main__.py").read_text()
    supported = "BENCH_RESULTS" in own  # a base from before it writes only its own latest.json
    latest = side.tree / "bench" / "results" / "latest.json"
    if not supported:
        latest.unlink(missing_ok=True)
    t = time.monotonic()
    with log.open("w") as sink:
        done = subprocess.run([side.python, "-m", "bench", *modules], cwd=side.tree,
                              env={**side.env, "BENCH_RESULTS": str(out)}, stdout=sink,
                              stderr=subprocess.STDOUT, check=False)
    if not supported and latest.exists():
        shutil.copyfile(latest, out)
    figures = json.loads(out.read_text()) if out.exists() else {}
    side.runs.append(figures)
    status = "ok" if done.returncode == 0 else f"exit {done.returncode}"
    if done.returncode != 0:
        side.failed.append(f"{out.stem}: {status}, log {log}")
    print(f"  {out.stem}: {time.monotonic() - t:.1f} s, {status}, {len(numbers(figures))} figures "
          f"({log.relative_to(ROOT) if log.is_relative_to(ROOT) else log})", flush=True)
    if done.returncode != 0:
        print("    " + "\n    ".join(log.read_text().splitlines()[-15:]), flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.compare", description=__doc__.split("\n")[0])
    parser.add_argument("base", help="the base revision (a commit, tag, branch, HEAD~3 ...)")
    parser.add_argument("--bench", default=DEFAULT_BENCH,
                        help=f"modules, or figure prefixes, separated by spaces (default: {DEFAULT_BENCH!r})")
    parser.add_argument("--pairs", type=int, default=3, help="base/head pairs of runs (default 3)")
    parser.add_argument("--out", type=Path, help="the markdown file (default: in the runs' folder)")
    args = parser.parse_args(argv)
    if args.pairs < 1:
        parser.error("--pairs: at least 1")
    available = sorted(p.stem for p in (ROOT / "bench").glob("bench_*.py"))
    modules = modules_for(args.bench.split(), available)
    sha = _git("rev-parse", "--verify", f"{args.base}^{{commit}}")
    head_commit = report.measured_commit(ROOT) or "?"
    base_tree = checkout(sha)
    base_python = python_for(base_tree)
    base_env = side_env(base_tree)
    base_env.update(jars_env(base_tree, base_python, base_env))
    base = Side("base", base_tree, base_python, base_env, f"`{sha[:7]}` ({args.base})")
    head = Side("head", ROOT, sys.executable, side_env(ROOT), f"`{head_commit[:7]}`" + (
        " with uncommitted changes" if head_commit.endswith(report.DIRTY) else ""))
    for side in (base, head):
        check_imports(side)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    runs = WORK / "runs" / f"{stamp}-{sha[:7]}-vs-{head_commit[:7]}"
    runs.mkdir(parents=True)
    if args.pairs < 3:
        print(f"bench-compare: {args.pairs} pairs: fewer than 3, a verdict means little", flush=True)
    print(f"bench-compare: base {base.label} vs head {head.label}: {', '.join(modules)}, "
          f"{args.pairs} pairs, ABAB…; figures and logs in {runs}", flush=True)
    for pair in range(1, args.pairs + 1):
        for side in (base, head):
            run_once(side, modules, runs / f"{side.name}-{pair}.json")
    rows = compare(base.runs, head.runs)
    failed = [f"- failed run {f}" for f in base.failed + head.failed]
    text = "\n".join([
        f"`make bench-compare BASE={args.base}` ({stamp}): base {base.label} vs head {head.label}, "
        f"{', '.join(modules)}; {args.pairs} pairs run alternately, base first. Medians and spreads "
        "(min–max) of the runs; \"regression\"/\"improvement\": every head run worse/better than every "
        "base run.", "", table(rows),
        *([""] + failed if failed else [])])
    out = args.out or runs / "compare.md"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text + "\n")
    print(f"\n{text}\n\nwritten to {out}", flush=True)
    return 1 if not rows or failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
