"""The goals table of docs/benchmarks.md, from ``bench/results/latest.json``: ``python -m bench.report``.

``make bench`` calls it after a full run. It rewrites what sits between the two markers below in
docs/benchmarks.md: one row per goal with the figure measured last, when and on which commit it was
measured, and plainly whether the goal is met. Figures a run did not produce are shown as "not measured",
and a figure measured on a commit older than the newest commit touching the code (``CODE_PATHS``) is
shown "stale", not "yes" (:func:`is_stale`): a row never says "met" for code it did not measure. The
hand-written tables after it keep the context (earlier runs, variants tried).
``python -m bench.report RUN.json ...`` writes the table from several runs' ``latest.json`` instead:
each goal's median, with its range and the number of runs, judged on the median.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench import RESULTS

#: The page holding the goals table (named README while the table lived in README.md).
README = Path(__file__).parent.parent / "docs" / "benchmarks.md"
BEGIN = "<!-- bench-goals:begin (written by python -m bench.report from bench/results/latest.json) -->"
END = "<!-- bench-goals:end -->"


@dataclass(frozen=True)
class Goal:
    """One goal: the figure's key, what it measures, the goal as text, and the test of a figure."""

    key: str
    what: str
    goal: str
    met: Callable[[float, Mapping[str, Any]], bool]
    #: Which way the figure gets better (``bench.compare``'s verdicts); None: from ``met`` (a bound).
    higher: bool | None = None

    @property
    def higher_is_better(self) -> bool | None:
        """True: a higher figure is better, False: a lower one, None: no direction."""
        return self.higher if self.higher is not None else getattr(self.met, "higher", None)


@dataclass(frozen=True)
class _Bound:
    """A goal met at ``bound`` or beyond it, on the side ``higher`` says."""

    bound: float
    higher: bool

    def __call__(self, v: float, _: Mapping[str, Any]) -> bool:
        return v >= self.bound if self.higher else v <= self.bound


def _at_least(bound: float) -> Callable[[float, Mapping[str, Any]], bool]:
    return _Bound(bound, higher=True)


def _at_most(bound: float) -> Callable[[float, Mapping[str, Any]], bool]:
    return _Bound(bound, higher=False)


def _below_fresh_query(v: float, figures: Mapping[str, Any]) -> bool:
    other = figures.get("live_p99.ratio_with_fresh_query")
    return v <= 1.2 and isinstance(other, int | float) and v < other


def _within_stop_limit(v: float, figures: Mapping[str, Any]) -> bool:
    """A stop within the limit its run reported beside it (``shutdown_timeout_s`` + 5 s)."""
    limit = figures.get("isolation.sigterm_exit_limit_s")
    return isinstance(limit, int | float) and v <= limit


GOALS = (
    Goal("planner.mixed_planner_ms", "planner, 10,000 splits, mixed stages: ms per epoch", "< 5 ms",
         lambda v, _: v < 5, higher=False),
    Goal("kafka_read.ratio_vs_raw", "history read of 1M records into the job's table (Spark's connector) "
         "vs a raw confluent-kafka consume", "≥ 0.6", _at_least(0.6)),
    Goal("trigger.caught_up_p50_s", "caught-up trigger, 2 Finished jobs, 200 rows/s: median seconds",
         "≤ 0.25 s", _at_most(0.25)),
    Goal("startup.ready_s", "daemon start to `/ready`: seconds", "≤ 12 s", _at_most(12)),
    Goal("backfill.ratio_vs_batch_copy", "backfill of 1M records with a live producer vs a batch copy",
         "≥ 0.9", _at_least(0.9)),
    Goal("backfill.ratio_vs_fresh_query", "the same vs a new streaming query from `earliest` (what a "
         "user does instead)", "≥ 1.0", _at_least(1.0)),
    Goal("live_p99.ratio_with_backfill", "live p99 of a Finished job while the backfill runs, vs none",
         "≤ 1.2 and below the fresh query's", _below_fresh_query, higher=False),
    Goal("live_p99.ratio_with_fresh_query", "the same while the fresh query runs instead", "(reference)",
         lambda v, _: True, higher=False),
    *(Goal(f"table_backfill.{s}.ratio_vs_plain_read", f"table backfill `{s}` of a changing 1M-row table vs a "
           "plain Spark read", "≥ 0.7", _at_least(0.7)) for s in ("snapshot", "arrangement", "chain")),
    Goal("memory.rss_ratio_5m_vs_1m", "peak RSS backfilling 5M vs 1M records", "≤ 1.10", _at_most(1.10)),
    Goal("quiet.metrics_series_10k", "sample lines one Finished job on 10,000 splits adds to `/metrics`",
         "≤ 100", _at_most(100)),
    Goal("dry_run.error_at_rate_limit", "dry run's estimate vs the actual backfill, at a 2,000 rows/s "
         "limit: |error| / actual", "≤ 0.30", _at_most(0.30)),
    Goal("dry_run.error_at_measured_rate", "the same without a limit, at the history rate the daemon "
         "measured", "≤ 0.30", _at_most(0.30)),
    Goal("scale.jobs30_vs_10.epoch_p50_ratio", "median epoch, 30 jobs vs 10 at a 1 s trigger (soak: "
         "`BENCH_ARGS=scale_jobs`)", "≤ 1.5", _at_most(1.5)),
    Goal("scale.jobs30_vs_10.rss_ratio", "peak RSS, 30 jobs vs 10", "≤ 1.3", _at_most(1.3)),
    Goal("scale.history_speedup_vs_plain", "history copy's speedup on 2 task slots vs 1, over a plain Spark "
         "read's on 2 tasks vs 1", "≥ 0.9", _at_least(0.9)),
    Goal("scale.live_p99_ratio_governed", "live p99 of a Finished job while the governed copy runs, vs idle",
         "≤ 1.2", _at_most(1.2)),
    Goal("scale.governed_vs_1_task", "governed copy's speed vs the copy at width 1", "≥ 1.0", _at_least(1.0)),
    Goal("scale.table_rss_ratio_20m_vs_1m", "peak RSS, table backfill of 20M rows vs 1M (soak: "
         "`BENCH_ARGS=scale_table`)", "≤ 1.3", _at_most(1.3)),
    Goal("scale.table20m.ratio_vs_plain_read", "that 20M-row copy vs a plain Spark read of the version",
         "≥ 0.9", _at_least(0.9)),
    Goal("archive.ratio_vs_kafka", "history of 1M records from a trusted archive table vs the same from "
         "Kafka, same width, 0.5 s trigger (a copy ends at an epoch)", "≥ 2.0", _at_least(2.0)),
    Goal("archive.kafka_tier_offsets", "history offsets that archive copy planned from Kafka", "0",
         lambda v, _: v == 0, higher=False),
    Goal("archive.broker_bytes", "record bytes that archive copy's history reads fetched from the broker "
         "(`job_history_broker_bytes_total`)", "0", lambda v, _: v == 0, higher=False),
    Goal("archive.half.exactly_once", "a job whose history's first half is only in the archive and second "
         "half only in Kafka, under a live producer: exactly once across the tiers (1)", "1",
         lambda v, _: v == 1, higher=True),
    Goal("isolation.victim_p99_ratio_heavy_neighbour", "live p99 of a Finished job while a neighbour on its "
         "source runs a heavy transform (~30 s of CPU per trigger's records), vs alone, 1 s trigger",
         "≤ 1.5", _at_most(1.5)),
    Goal("isolation.drop_applied_s", "`DELETE` of that heavy job while its step runs, to the drop applied "
         "and its table's last commit: seconds", "≤ 2 s", _at_most(2)),
    Goal("isolation.ready_s_pending_repair", "`/ready` after a restart with a repair pending and the heavy "
         "job lagging, over a plain restart's", "≤ 1.5", _at_most(1.5)),
    Goal("isolation.sigterm_exit_s", "SIGTERM to the daemon's exit while the heavy job's step runs: seconds",
         "≤ `shutdown_timeout_s` + 5 s (next row)", _within_stop_limit, higher=False),
    Goal("isolation.sigterm_exit_limit_s", "that stop's limit: the daemon's `shutdown_timeout_s` + 5 s",
         "(reference)", lambda v, _: True),
    Goal("isolation.lagging_job_exactly_once", "an identity job lagging past `max_job_lag_s` under a live "
         "producer, failed, retried as identity: exactly once, offset by offset (1)", "1",
         lambda v, _: v == 1, higher=True),
    Goal("tenants.width_share_error", "30 jobs of two namespaces of `width_share` 1 (24 and 6) backfilling "
         "one source: max over the namespaces of |share of history slot-seconds held − ½| / ½ (per-job "
         "turns: 0.6)", "≤ 0.2", _at_most(0.2)),
    Goal("security.sasl_ssl_ratio", "a 1M-record backfill over SASL_SSL (SCRAM-SHA-512, a private CA) vs "
         "in plaintext, same run: records/s over records/s", "≥ 0.8", _at_least(0.8)),
    Goal("formats.avro_ratio_vs_raw_copy", "a 1M-record Avro topic (10 fields, ~150 B) backfilled into typed "
         "columns vs the same records copied undecoded, same run: records/s over records/s", "≥ 0.7",
         _at_least(0.7)),
    Goal("formats.evolution_exactly_once", "1M records over 3 schema versions, a live producer moving to a "
         "4th mid-backfill: every offset once, each row as its writer gave it (1)", "1",
         lambda v, _: v == 1, higher=True),
    Goal("quiet.idle_commits_per_hour", "table versions per hour of a Finished job on an idle topic and a "
         "live table job on a quiet table, 1 s trigger", "0", lambda v, _: v == 0, higher=False),
    Goal("quiet.commit_bytes_10k_one_moving", "commit file, 10,000 splits, one moving per epoch: bytes "
         "(mean, snapshots included)", "≤ 4 kB", _at_most(4096)),
    Goal("quiet.recovery_s_10k", "opening that table to the job's exact state after 1,000 commits: seconds",
         "≤ 2 s", _at_most(2)),
)


#: The module that measures each figure's prefix, where the two differ (``bench.compare`` reads it too).
FIGURE_MODULES = {"live_p99": "backfill", "table_backfill": "table", "startup": "trigger", "memory": "load"}

#: The code a figure describes: a commit touching one of these makes figures measured before it stale.
CODE_PATHS = ("source_backfill", "connectors", "bench")
#: Pathspecs of ``CODE_PATHS`` from the repository's top (less the results), whatever folder git runs in.
_CODE_PATHSPECS = (*(f":(top){p}" for p in CODE_PATHS), ":(top,exclude)bench/results")

#: The mark of figures measured on a tree with uncommitted changes under ``CODE_PATHS``.
DIRTY = "+dirty"


def _module(key: str, measured: Mapping[str, Any]) -> str:
    """The module whose entry in ``_measured_at`` / ``_commit`` (``measured``) covers figure ``key``."""
    module = FIGURE_MODULES.get(key.split(".")[0], key.split(".")[0])
    if module == "scale":  # scale.jobs* (scale_jobs), scale.table* (scale_table), the rest scale_history
        rest = key.split(".")[1]
        module = "scale_jobs" if rest.startswith("jobs") else "scale_table" if rest.startswith("table") else (
            "scale_history")
    if module not in measured:  # a key's prefix shared by several modules (quiet.*: bench_quiet_log too)
        module = next((m for m in sorted(measured) if m.startswith(f"{module}_")), module)
    return module


def _measured_at(key: str, figures: Mapping[str, Any]) -> str:
    measured = figures.get("_measured_at", {})
    return str(measured.get(_module(key, measured), "?"))[:10]


def _commits(key: str, figures: Mapping[str, Any]) -> list[str]:
    """The commits figure ``key`` was measured on (several: :func:`combine`'s runs; none: unknown)."""
    commits = figures.get("_commit", {})
    found = commits.get(_module(key, commits), [])
    return [found] if isinstance(found, str) else list(found)


def is_stale(measured_on: Sequence[str], newest_code: str, contains: Callable[[str, str], bool]) -> bool:
    """Whether figures measured on the commits ``measured_on`` may not describe the code any more.

    ``newest_code``: the newest commit touching ``CODE_PATHS``; ``contains(commit, other)``: whether
    ``other`` is ``commit`` or one of its ancestors. Stale when a commit is unknown (none recorded), was a
    tree with uncommitted changes, or lacks ``newest_code`` (older than it, or on another line of history).
    """
    return not measured_on or any(
        c.endswith(DIRTY) or not (c == newest_code or contains(c, newest_code)) for c in measured_on)


def _git(*args: str, root: Path = README.parent) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, check=False)


def measured_commit(root: Path = README.parent) -> str | None:
    """The commit the tree at ``root`` runs (with ``DIRTY`` when the code has uncommitted changes)."""
    head = _git("rev-parse", "HEAD", root=root)
    if head.returncode != 0:
        return None
    dirty = _git("status", "--porcelain", "--", *_CODE_PATHSPECS, root=root).stdout.strip()
    return head.stdout.strip() + (DIRTY if dirty else "")


def newest_code_commit(root: Path = README.parent) -> str | None:
    """The newest commit of ``root``'s history that touched ``CODE_PATHS`` (None: no git here)."""
    found = _git("log", "-1", "--format=%H", "--", *_CODE_PATHSPECS, root=root)
    return found.stdout.strip() or None if found.returncode == 0 else None


def git_staleness(root: Path = README.parent) -> Callable[[Sequence[str]], bool] | None:
    """:func:`is_stale` against ``root``'s history, for :func:`render` (None: no git to judge by)."""
    newest = newest_code_commit(root)
    if newest is None:
        return None

    def contains(commit: str, other: str) -> bool:
        return _git("merge-base", "--is-ancestor", other, commit, root=root).returncode == 0

    return lambda measured_on: is_stale(measured_on, newest, contains)


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and value == value  # not NaN


def combine(runs: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Figures of several runs as one: each goal's median, its values under ``_runs``, the latest dates.

    ``_commit`` keeps every commit a module's runs were measured on (a run that recorded none among runs
    that did: "?"; none at all: no entry, as in a ``latest.json`` of before commits were recorded).
    """
    out: dict[str, Any] = {"_measured_at": {}, "_runs": {}, "_commit": {}}
    for run in runs:
        for module, at in run.get("_measured_at", {}).items():
            out["_measured_at"][module] = max(at, out["_measured_at"].get(module, at))
            commit = run.get("_commit", {}).get(module, "?")
            for c in [commit] if isinstance(commit, str) else commit:
                if c not in out["_commit"].setdefault(module, []):
                    out["_commit"][module].append(c)
    out["_commit"] = {module: commits for module, commits in out["_commit"].items() if commits != ["?"]}
    for g in GOALS:
        values = [float(r[g.key]) for r in runs if _number(r.get(g.key))]
        if values:
            out[g.key] = round(statistics.median(values), 3)
            out["_runs"][g.key] = values
    return out


def _row(*cells: str) -> str:
    """One markdown row; a bar inside a cell ("|error|") is escaped, else it would split the row."""
    return "| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |"


def render(figures: Mapping[str, Any], stale: Callable[[Sequence[str]], bool] | None = None) -> str:
    """The markdown table of every goal against ``figures`` (a ``latest.json``).

    ``stale``: whether figures measured on those commits are stale (:func:`git_staleness`); such a row
    says "stale" whatever its figure. None: not judged (no git to judge by).
    """
    lines = ["| goal | key | last figure | measured | goal | met |", "|---|---|---|---|---|---|"]
    for g in GOALS:
        value = figures.get(g.key)
        if not _number(value):
            lines.append(_row(g.what, f"`{g.key}`", "not measured", "—", g.goal, "—"))
            continue
        verdict = "yes" if g.met(float(value), figures) else "**missed**"
        spread = figures.get(g.key.rsplit(".", 1)[0] + ".ratio_range")
        shown = f"{value:g}" + (f" (runs: {', '.join(f'{r:g}' for r in spread)})"
                                if isinstance(spread, list) and g.key.endswith("ratio_vs_plain_read") else "")
        runs = figures.get("_runs", {}).get(g.key, [])
        if len(runs) > 1:
            shown = f"{value:g} (median of {len(runs)} runs: {min(runs):g}–{max(runs):g})"
        commits = _commits(g.key, figures)
        at = " ".join([_measured_at(g.key, figures), *(f"`{c[:7]}{DIRTY if c.endswith(DIRTY) else ''}`"
                                                          for c in commits)])
        if stale is not None and stale(commits):
            verdict = f"stale (was {verdict})"
        lines.append(_row(g.what, f"`{g.key}`", shown, at, g.goal, verdict))
    return "\n".join(lines)


def table_in(text: str) -> tuple[str, str, str] | None:
    """``text`` cut at the markers: before the table, the table, after it (None: no markers)."""
    if BEGIN not in text or END not in text:
        return None
    head, rest = text.split(BEGIN, 1)
    table, tail = rest.split(END, 1)
    return head, table.strip(), tail


def update(readme: Path = README, results: Path | Sequence[Path] = RESULTS) -> bool:
    """Rewrite the table between the markers of ``readme``; False when the file has no markers.

    ``results``: one ``latest.json``, or several runs' (:func:`combine`). Rows are judged stale by the
    git history of the folder ``readme`` is in (:func:`git_staleness`; none outside a repository).
    """
    parts = table_in(readme.read_text())
    if parts is None:
        return False
    if isinstance(results, Path):
        figures = json.loads(results.read_text()) if results.exists() else {}
    else:
        figures = combine([json.loads(p.read_text()) for p in results])
    head, old, tail = parts
    table = _kept(render(figures, git_staleness(readme.parent)), old, figures)
    readme.write_text(f"{head}{BEGIN}\n{table}\n{END}{tail}")
    return True


def _kept(table: str, old: str, figures: Mapping[str, Any]) -> str:
    """``table`` with each goal these ``figures`` do not measure kept as ``old`` shows it.

    One benchmark run alone (``python -m bench isolation``) measures its own goals only: the others'
    rows, measured by other runs (often several, hand-combined), must not turn "not measured".
    """
    before = {key: line for line in old.splitlines() if (key := _key_of(line))}
    return "\n".join(before.get(key, line) if (key := _key_of(line)) and not _number(figures.get(key))
                     else line for line in table.splitlines())


def _key_of(row: str) -> str | None:
    """The goal key a table row names (its second cell), None for the header rows."""
    cells = [cell.strip() for cell in row.strip().strip("|").split(" | ")]
    return cells[1].strip("`") if len(cells) > 1 and cells[1].startswith("`") else None


if __name__ == "__main__":
    if not update(README, [Path(a) for a in sys.argv[1:]] if sys.argv[1:] else RESULTS):
        print(f"no markers in {README}: nothing written", file=sys.stderr)
        sys.exit(1)
    print(f"goals table written into {README}")
