"""A dry run of a create (``POST /jobs?dry_run=true``, ``jobs create --dry-run``): checked and planned.

The registry makes every check a create makes (:meth:`JobRegistry.check_create`: kind, transform, name,
sink path rules, sink ownership) and records nothing: no registry entry, no mutation log line, no table.
The plan says, per split, the offsets the job would backfill: from its start (as the job resolves it when
it attaches: earliest, offsets, timestamp, latest) to the live position now (the job's target moves on
with the live stream, so this is the history at this moment). Offsets, not records: a log with gaps
(transaction markers, compaction) holds fewer records than offsets, so the estimate errs long. Bytes are
unknown: the Kafka admin client reports no log sizes. A job reading its source's archive starts where
its attach would (the archive's first offset with an ``earliest`` start) and has its offsets counted per
tier (archive, Kafka, gap, loss) by the rule its reads plan with (``core.tiers``).

Two time estimates: at the job's rate limit (``max_rows_per_epoch`` per trigger interval caps it too) and
at the history rate this daemon measured on the source (:class:`HistoryRates`: rows a job without a rate
limit backfilled over the time from its create to its finish, attach included; none before one did). The
estimate at the limit adds the startup measured on the source (a create to its first history rows). A
retention warning is given when the log start would pass the copy at that rate: with ``retention.ms`` set
on a topic, the record written at ``t`` goes at ``t + retention.ms`` at the earliest, so the log start at a
future moment is the first offset at or after ``then - retention.ms``, compared with where the copy stands.
"""

from __future__ import annotations

import re
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from source_backfill.config import (
    EarliestStart,
    JobSpec,
    LatestStart,
    OffsetsStart,
    SourceConfig,
    TimestampStart,
)
from source_backfill.core import tiers
from source_backfill.core.splits import split_id, split_topic
from source_backfill.errors import one_line

#: Moments of the copy at which the log start is compared with the copy's position.
RETENTION_CHECKS = 10
#: The tiers a plan counts history offsets in (``core.tiers.Tier``'s values).
TIER_NAMES = ("archive", "kafka", "gap", "loss")


@dataclass(frozen=True, slots=True)
class SplitPlan:
    """One split's history to copy: offsets ``[start, end)`` (``end``: the live position now)."""

    split: str
    start: int
    end: int
    log_start: int

    @property
    def offsets(self) -> int:
        """Offsets to copy (records at most: gaps hold none)."""
        return max(0, self.end - self.start)


@dataclass
class HistoryRates:
    """What this daemon measured of its jobs' history copies, per source: the estimates' inputs.

    Fed a few times a second (:meth:`observe` each job's status and history rows, :meth:`observe_epoch`
    each source's last epoch). Only jobs created while this daemon ran count (one recovered after a restart
    counts rows since the restart, not since its create). Per source:

    * ``startup_s``: from a job's create to its first history rows committed (attach at the next epoch,
      the first read's Spark job), the shortest seen: a daemon's first job also pays Spark's warm-up;
    * ``rate``: rows over the time from the create to the finish, of a job without a rate limit (a limited
      job measures its limit), the fastest seen for the same reason; while none has finished, the running
      ones' rate so far (over ``min_s`` at least);
    * ``epoch_period_s``: seconds between the source's epochs over the last ``window_s``:
      ``max_rows_per_epoch`` is a budget per epoch, so epochs slower than the interval read less than it
      (the rate limit is kept on the wall clock: ``core.budget.RateAllowance``).
    """

    #: Jobs created before this (wall clock, s) are not measured.
    since: float = field(default_factory=time.time)
    min_s: float = 2.0
    window_s: float = 30.0
    _started: set[tuple[str, str, float]] = field(default_factory=set)
    _rates: dict[str, float] = field(default_factory=dict)
    _finished_rates: dict[str, float] = field(default_factory=dict)
    _startup: dict[str, float] = field(default_factory=dict)
    _done: set[tuple[str, str, float]] = field(default_factory=set)
    _epochs: dict[str, deque[tuple[int, float]]] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def observe(self, source: str, job: str, status: str, rows_history: int, *, created_at: float,
                limited: bool, now: float | None = None) -> None:
        """One look at ``job`` on ``source``: its status, history rows, create time (wall clock, s)."""
        now = time.time() if now is None else now
        key = (source, job, created_at)
        with self._lock:
            if created_at < self.since or key in self._done or status not in ("backfilling", "finished"):
                return
            if rows_history > 0 and key not in self._started:
                self._started.add(key)
                startup = now - created_at
                self._startup[source] = min(startup, self._startup.get(source, startup))
            seconds = now - created_at
            if not limited and rows_history > 0 and seconds >= self.min_s:
                rate = rows_history / seconds
                if status == "finished":
                    self._finished_rates[source] = max(rate, self._finished_rates.get(source, 0.0))
                else:
                    self._rates[source] = rate
            if status == "finished":
                self._done.add(key)

    def observe_epoch(self, source: str, epoch: int | None, at: float | None) -> None:
        """The source's last epoch and when it ended (wall clock, s)."""
        if epoch is None or at is None:
            return
        with self._lock:
            seen = self._epochs.setdefault(source, deque())
            if seen and seen[-1][0] == epoch:
                return
            seen.append((epoch, at))
            while len(seen) > 2 and at - seen[0][1] > self.window_s:
                seen.popleft()

    def forget_epochs(self, source: str) -> None:
        """The source started over (a reset): its epoch ids start again from 0."""
        with self._lock:
            self._epochs.pop(source, None)

    def rate(self, source: str) -> float | None:
        """The source's measured history rate (rows/s, create to finish), None before any."""
        with self._lock:
            return self._finished_rates.get(source) or self._rates.get(source)

    def startup_s(self, source: str) -> float | None:
        """Seconds from a job's create to its first history rows, last measured on ``source``."""
        with self._lock:
            return self._startup.get(source)

    def epoch_period_s(self, source: str) -> float | None:
        """Seconds between the source's epochs over the last window, None before two epochs."""
        with self._lock:
            seen = self._epochs.get(source)
            if not seen or len(seen) < 2 or seen[-1][0] <= seen[0][0]:
                return None
            return (seen[-1][1] - seen[0][1]) / (seen[-1][0] - seen[0][0])


def effective_limit(spec: JobSpec, interval_s: float, epoch_period_s: float | None = None) -> float | None:
    """The job's history rows/s ceiling: its rate limit, and ``max_rows_per_epoch`` per epoch.

    The rate limit is kept on the wall clock (``core.budget.RateAllowance``): it holds whatever pace the
    epochs run at. ``max_rows_per_epoch`` is a budget per epoch: with epochs ``epoch_period_s`` apart
    (slower than the interval on a busy daemon) it reads that much less per second.
    """
    period = max(epoch_period_s or interval_s, interval_s)
    caps = [c for c in (spec.rate_limit,
                        None if spec.max_rows_per_epoch is None else spec.max_rows_per_epoch / period)
            if c is not None]
    return min(caps) if caps else None


def start_offsets(spec: JobSpec, splits: list[str], earliest: Mapping[str, int], ends: Mapping[str, int],
                  for_timestamp: Callable[[list[str], int], dict[str, int]]) -> dict[str, int]:
    """Where the job would start per split, as its attach resolves it (``ends`` standing for the position)."""
    start = spec.start
    if isinstance(start, OffsetsStart):
        chosen = {s: max(start.offsets.get(s, earliest[s]), earliest[s]) for s in splits}
    elif isinstance(start, TimestampStart):
        chosen = for_timestamp(splits, start.timestamp_ms)
    elif isinstance(start, LatestStart):
        chosen = dict(ends)
    else:
        assert isinstance(start, EarliestStart)  # noqa: S101 - the config union is closed
        chosen = dict(earliest)
    return {s: min(chosen.get(s, ends[s]), ends[s]) for s in splits}


def seconds_at(offsets: int, rate: float | None, startup_s: float = 0.0) -> float | None:
    """Seconds to copy ``offsets`` at ``rate`` rows/s after ``startup_s`` (None: no rate; inf at rate 0)."""
    if rate is None:
        return None
    if offsets == 0:
        return 0.0
    return float("inf") if rate <= 0 else startup_s + offsets / rate


def retention_overtakes(
    splits: list[SplitPlan], rate: float, retention_ms: Mapping[str, int | None],
    log_start_at: Callable[[list[str], int], dict[str, int]], now_ms: int,
) -> str | None:
    """A warning when the log start would pass the copy's position at ``rate`` rows/s, else None.

    The copy is taken as spread over the splits in proportion to what each has to copy (they finish
    together). At moments through the copy, a split's log start is the first offset written at or after
    ``moment - retention.ms`` (``log_start_at(splits, ts_ms)``); past the copy's position, history is lost
    (the job fails, or skips it with ``fail_on_data_loss = false``).
    """
    total = sum(s.offsets for s in splits)
    todo = [s for s in splits if s.offsets > 0 and retention_ms.get(split_topic(s.split)) is not None]
    if not todo or rate <= 0 or total == 0:
        return None
    duration = total / rate
    for i in range(1, RETENTION_CHECKS + 1):
        elapsed = duration * i / RETENTION_CHECKS
        by_split: dict[int, list[SplitPlan]] = {}
        for s in todo:
            by_split.setdefault(int(retention_ms[split_topic(s.split)] or 0), []).append(s)
        for keep_ms, group in by_split.items():
            starts = log_start_at([s.split for s in group], now_ms + int(elapsed * 1000) - keep_ms)
            for s in group:
                copied = s.start + int(s.offsets * i / RETENTION_CHECKS)
                if starts.get(s.split, -1) > copied:
                    return (f"retention: at {rate:,.0f} rows/s the log start of {s.split} (retention.ms "
                            f"{keep_ms}) passes the copy about {elapsed:,.0f} s in (log start "
                            f"{starts[s.split]}, copied to {copied}): raise the rate limit, or the "
                            "topic's retention, or start later")
    return None


def source_splits(source: SourceConfig, topic_partitions: Callable[[], dict[str, int]],
                  list_splits: Callable[[Iterable[str]], list[tuple[str, int]]]) -> list[str]:
    """The split ids the source reads now (its topics, or those matching its pattern)."""
    if source.topic_pattern:
        pattern = re.compile(source.topic_pattern)
        counts = topic_partitions()
        return [split_id(t, p) for t in sorted(counts) if pattern.fullmatch(t) for p in range(counts[t])]
    return [split_id(t, p) for t, p in list_splits(source.topics)]


def plan_kafka_job(spec: JobSpec, source: SourceConfig, admin: Any, rates: HistoryRates) -> dict[str, Any]:
    """The dry run's plan of a job on a Kafka source (the validation is done by the caller)."""
    measured, startup = rates.rate(source.name), rates.startup_s(source.name) or 0.0
    splits = source_splits(source, admin.topic_partitions, admin.list_splits)
    log_starts = admin.earliest_offsets(splits)
    ends = admin.end_offsets(splits)
    warnings: list[str] = []
    archives = _archive_holdings(spec, source, warnings)
    all_held = {} if archives is None else tiers.merged(held for held, _ in archives)
    first = log_starts if archives is None else {
        s: tiers.earliest(log_starts[s], all_held.get(s, []), spec.history_source) for s in splits}
    starts = start_offsets(spec, splits, first, ends, _for_timestamp(admin, source, archives))
    plans = [SplitPlan(s, starts[s], ends[s], log_starts[s]) for s in splits]
    by_tier = None if archives is None else {p.split: _tier_sizes(p, archives, spec) for p in plans}
    total = sum(p.offsets for p in plans)
    limit = effective_limit(spec, source.trigger_interval_s, rates.epoch_period_s(source.name))
    # the copy's pace for the retention check: the slower of the limit and what was measured
    pace = min(r for r in (limit, measured) if r is not None) if (limit or measured) else None
    if pace is not None and total:
        retention = admin.retention_ms({split_topic(p.split) for p in plans if p.offsets})
        warning = retention_overtakes(plans, pace, retention, admin.offsets_for_timestamp,
                                      int(time.time() * 1000))
        if warning:
            warnings.append(warning)
    if isinstance(spec.start, OffsetsStart):
        unknown = sorted(set(spec.start.offsets) - set(splits))
        if unknown:
            warnings.append(f"start.offsets names splits the source does not have: {', '.join(unknown)}")
        below = sorted(s for s, o in spec.start.offsets.items() if s in first and o < first[s])
        if below:
            warnings.append("start.offsets below the log start (retention removed them): the copy starts at "
                            f"the log start for {', '.join(below)}")
    if limit == 0 and total:
        warnings.append("rate limit 0: no history is read until the job is throttled up")
    tiers_total = None
    if by_tier is not None:
        tiers_total = {t: sum(sizes[t] for sizes in by_tier.values()) for t in TIER_NAMES}
        if tiers_total["loss"]:
            warnings.append(f"{tiers_total['loss']} history offsets are held by neither the archive nor "
                            "Kafka: data loss (fail_on_data_loss decides)")
    return {
        "splits": [{"split": p.split, "from_offset": p.start, "to_offset": p.end, "offsets": p.offsets,
                    "log_start": p.log_start, "bytes": None,
                    "tiers": None if by_tier is None else by_tier[p.split]} for p in plans],
        "offsets_total": total,
        "tiers_total": tiers_total,
        "bytes_total": None,
        "bytes_note": "unknown: the Kafka admin client reports no log sizes",
        "rate_limit_rows_per_s": None if limit is None else round(limit, 1),
        "seconds_at_rate_limit": _round(seconds_at(total, limit, startup)),
        "measured_rows_per_s": None if measured is None else round(measured, 1),
        "seconds_at_measured_rate": _round(seconds_at(total, measured)),  # its startup is in the rate
        "startup_s": round(startup, 1),
        "measured_note": None if measured is not None else
        "none: no job without a rate limit has backfilled on this source since the daemon started",
        "warnings": warnings,
    }


def _archive_holdings(spec: JobSpec, source: SourceConfig, warnings: list[str],
                      ) -> list[tuple[dict[str, list[tuple[int, int]]], bool]] | None:
    """Per archive of the source: what it holds per split, and whether it is trusted (None: Kafka alone).

    An archive that cannot be read is a warning (the job would fail at its first epoch, saying why) and
    holds nothing here.
    """
    if not source.archives or spec.history_source == "kafka":
        return None
    from connectors.delta.archive import archive_holdings

    found = []
    for archive in source.archives:
        try:
            held = dict(archive_holdings(archive.path, unique_offsets=archive.trusted).held)
        except Exception as exc:  # noqa: BLE001 - a dry run reports; the job's first epoch fails
            warnings.append(f"archive {archive.path} cannot be read ({one_line(exc)}): the job would fail")
            held = {}
        found.append((held, archive.trusted))
    return found


def _for_timestamp(admin: Any, source: SourceConfig, archives: list[Any] | None,  # noqa: ANN401
                   ) -> Callable[[list[str], int], dict[str, int]]:
    """A timestamp start as the job's attach resolves it: Kafka's, or its archives' below the log start.

    Only the archives that could be read (the others are a warning already).
    """
    if archives is None:
        return admin.offsets_for_timestamp  # type: ignore[no-any-return]
    from connectors.delta.archive import offsets_for_timestamp

    readable = [(a.path, None) for a, (held, _) in zip(source.archives, archives, strict=True) if held]
    return lambda splits, ts_ms: offsets_for_timestamp(admin, readable, splits, ts_ms)


def _tier_sizes(plan: SplitPlan, archives: list[tuple[dict[str, list[tuple[int, int]]], bool]],
                spec: JobSpec) -> dict[str, int]:
    """The split's history offsets by tier, as the job would plan them now (``core.tiers``)."""
    mine = [tiers.usable(held.get(plan.split, []), plan.log_start, spec.history_source, trusted=trusted)
            for held, trusted in archives]
    segments = tiers.plan_tiers_many(plan.start, plan.end, mine, plan.log_start, spec.history_source)
    sizes = tiers.tier_sizes(segments)
    return {t.value: sizes[t] for t in tiers.Tier}


def _round(value: float | None) -> float | None:
    return None if value is None or value == float("inf") else round(value, 1)


def plan_table_job(spec: JobSpec, source: SourceConfig, table: Any, *, spark: bool) -> dict[str, Any]:
    """The dry run's plan of a job on a ``delta`` source: the version it would copy now, and how.

    ``table``: the source's :class:`~connectors.delta.table_source.DeltaTableSource`; ``spark``: whether
    the daemon runs Spark. The copy goes by files on Spark or by vnode on the driver by the rule the job
    applies when it starts (:func:`source_backfill.core.table_backfill.copies_by_files`); rows come from
    the log's file statistics (None: a file without them). The time is estimated at the job's rate limit
    only (no table copy rate is measured on the source).
    """
    from source_backfill.core.table_backfill import copies_by_files

    version = table.latest_version()
    files = table.data_files(version)
    rows = None if files is None else sum(n for _, n in files)
    pinned = spec.strategy in ("snapshot", "chain")
    by_files = copies_by_files(spec.strategy or "", rows, source.spark_copy_rows, spark=spark)
    if by_files:
        why = (f"{rows:,} rows, at least spark_copy_rows ({source.spark_copy_rows:,}): whole data files "
               "an epoch, on Spark's executors")
    elif not pinned:
        why = "arrangement copies by vnode and key on the driver (its live changes follow the key order)"
    elif not spark:
        why = "this daemon runs no Spark (spark.tables = false): by vnode on the driver"
    elif source.spark_copy_rows is None:
        why = "spark_copy_rows is off: by vnode on the driver"
    else:
        why = (f"{'unknown' if rows is None else f'{rows:,}'} rows, under spark_copy_rows "
               f"({source.spark_copy_rows:,}): by vnode on the driver")
    spilled = (not by_files and spec.strategy != "chain" and rows is not None
               and rows > source.table_index_rows)
    limit = effective_limit(spec, source.trigger_interval_s)
    return {
        "table": {"version": version, "rows": rows, "files": None if files is None else len(files),
                  "copy_by": "files" if by_files else "vnodes", "engine": "spark" if by_files else "delta-rs",
                  "spilled": spilled, "why": why},
        "rate_limit_rows_per_s": limit,
        "seconds_at_rate_limit": None if limit is None or rows is None else rows / limit,
        "measured_note": "a table copy's rate is not measured on the source: no estimate without a limit",
    }
