"""The archive tier of a Kafka source's history: which offsets come from its archive table, and reading them.

A source's archive (``sources[].archive``, :class:`~source_backfill.config.ArchiveConfig`) is a Delta table
of the topic's records as Kafka gave them. For each history range a job reads, :meth:`ArchiveTier.plan`
cuts it by :func:`source_backfill.core.tiers.plan_tiers_many` into what the archive holds, what Kafka holds,
gaps and data loss, with no gap and no overlap between the parts; :meth:`ArchiveTier.rows` reads the
archive's part with Spark at the archive's pinned version (column and offset predicates: Parquet
statistics skip the files outside), as Kafka's columns, so the rows go on exactly like a Kafka read's
(transform, staging, counting, one commit per epoch).

A source may name several archives, in order: an offset is read from the first that holds it. What each
archive holds is read once per job and pinned (:func:`connectors.delta.archive.archive_holdings`
at the newest version then): an archive that is a live job's table keeps growing, and the copy reads the
version its plan came from. An archive not ``trusted`` is used only below the log start: where Kafka still
holds an offset it is read from Kafka (a job with ``history_source = "archive"`` asked for the archive
alone: it reads all the archive holds). Before a job reads an archive not ``trusted``, its records where it
overlaps what Kafka holds are compared with Kafka's (:meth:`ArchiveTable.check`, ``check_offsets`` per
split from the log start): a difference refuses the archive with :class:`ArchiveError`, so an archive of
another log (a recreated topic's, a transformed table) is never copied below the log start either.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from source_backfill.core import HistoryRange, parse_split_id, split_id
from source_backfill.core.tiers import (
    HistorySource,
    Segment,
    Tier,
    merged,
    normalized,
    overlap_window,
    plan_tiers_many,
    usable,
    whole_runs,
)
from source_backfill.errors import ArchiveError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from connectors.delta.archive import ArchiveFile, ArchiveHoldings
    from connectors.kafka.admin import KafkaAdmin
    from source_backfill.config import ArchiveConfig

logger = logging.getLogger(__name__)

#: Kafka's records of some ranges, as the source's connector reads them (``KafkaConnector.read_ranges``).
KafkaRows = Callable[[Sequence[HistoryRange]], "DataFrame"]
#: The columns an archive's record is compared with Kafka's by (``topic``, ``partition``, ``offset``: the
#: join; ``headers`` too when both have them).
COMPARED = ("key", "value", "timestamp", "timestampType")
#: Differences named in a refusal (the first, by split and offset).
DIFFERENCES_SHOWN = 5


@dataclass
class TierPlan:
    """History ranges cut by tier: each offset of the planned ranges in exactly one of the lists."""

    kafka: list[HistoryRange] = field(default_factory=list)
    #: Every archive's part (``by_archive``: the same, per archive index, in the source's order).
    archive: list[HistoryRange] = field(default_factory=list)
    by_archive: dict[int, list[HistoryRange]] = field(default_factory=dict)
    #: Below the log start, inside an archive's span, held by none: transaction markers or aborted records
    #: as far as anything can tell (nothing is read; counted).
    gap: list[HistoryRange] = field(default_factory=list)
    #: Held by nothing (below the log start, outside the archives): data loss (``fail_on_data_loss``).
    loss: list[HistoryRange] = field(default_factory=list)

    def add(self, split: str, segment: Segment) -> None:
        """One segment of ``split`` into its tier's list."""
        rng = HistoryRange(split, segment.start, segment.end)
        {Tier.KAFKA: self.kafka, Tier.ARCHIVE: self.archive, Tier.GAP: self.gap,
         Tier.LOSS: self.loss}[segment.tier].append(rng)
        if segment.tier is Tier.ARCHIVE:
            self.by_archive.setdefault(segment.archive, []).append(rng)

    def sizes(self) -> dict[str, int]:
        """Offsets per tier (``archive``, ``kafka``, ``gap``, ``loss``)."""
        tiers = {"archive": self.archive, "kafka": self.kafka, "gap": self.gap, "loss": self.loss}
        return {name: sum(r.size for r in ranges) for name, ranges in tiers.items()}


class ArchiveTable:
    """One archive: what it holds, read once (its newest version then) and pinned; its rows there."""

    def __init__(self, spark: SparkSession, config: ArchiveConfig) -> None:
        self.spark = spark
        self.config = config
        self._holdings: ArchiveHoldings | None = None
        self._lock = threading.RLock()
        #: Splits compared with Kafka (:meth:`check`), and the refusal once a difference was found.
        self._checked: set[str] = set()
        self._refused: ArchiveError | None = None

    def holdings(self) -> ArchiveHoldings:
        """What the archive holds per split, read once and pinned (:class:`ArchiveError` if it cannot be)."""
        with self._lock:
            if self._holdings is None:
                from deltalake import DeltaTable

                from connectors.delta.archive import archive_holdings

                if not DeltaTable.is_deltatable(self.config.path):
                    msg = f"archive {self.config.path} is not a Delta table (nothing there, or no _delta_log)"
                    raise ArchiveError(msg)
                holdings = archive_holdings(self.config.path, unique_offsets=self.config.trusted)
                _check_archive(self.config.path, holdings)
                self._holdings = holdings
                held = sum(hi - lo for r in self._holdings.held.values() for lo, hi in r)
                logger.info('archive pinned path="%s" version=%d splits=%d offsets=%d files_from_stats=%d '
                            'files_read=%d duplicates=%d', self.config.path, self._holdings.version,
                            len(self._holdings.held), held, self._holdings.files_from_stats,
                            self._holdings.files_read, self._holdings.duplicates)
            return self._holdings

    def check(self, log_start: dict[str, int], kafka_rows: KafkaRows, admin: KafkaAdmin) -> None:
        """An untrusted archive's records where it overlaps Kafka are Kafka's, else :class:`ArchiveError`.

        Per split not checked yet, the window :func:`core.tiers.overlap_window` gives (``check_offsets``
        from the log start, inside the archive's span) is read from both and joined by offset: an offset in
        one and not the other, or a compared column that differs, is a difference. An offset the archive
        holds that Kafka did not return because retention removed it meanwhile (below the log start after
        the read) is not. A refusal is kept: the archive is refused for the job from then on.
        """
        if self.config.trusted:
            return
        with self._lock:
            if self._refused is not None:
                raise self._refused
            held = self.holdings().held
            windows = []
            for split in sorted(set(log_start) - self._checked):
                window = overlap_window(held.get(split, []), log_start[split], self.config.check_offsets)
                if window is not None:
                    windows.append(HistoryRange(split, *window))
            if windows:
                found = _differences(self.rows(windows), kafka_rows(windows))
                if any(kind == "kafka lacks" for _, _, kind in found):
                    after = admin.earliest_offsets(sorted({s for s, _, _ in found}))
                    found = [d for d in found if not (d[2] == "kafka lacks" and d[1] < after.get(d[0], 0))]
                if found:
                    shown = "; ".join(f"{split} offset {o}: {_WHAT[kind]}"
                                      for split, o, kind in found[:DIFFERENCES_SHOWN])
                    checked = ", ".join(f"{w.split} {w.start}..{w.end - 1}" for w in windows)
                    self._refused = ArchiveError(
                        f"archive {self.config.path} differs from Kafka where both hold offsets ({shown}; "
                        f"compared: {checked}): an archive not trusted must hold this topic's records as "
                        "Kafka gave them (a recreated topic's old records, or a transformed table, are not)")
                    logger.error('archive refused path="%s" differences=%d first="%s"', self.config.path,
                                 len(found), shown)
                    raise self._refused
                logger.info('archive checked against Kafka path="%s" splits=%d offsets=%d', self.config.path,
                            len(windows), sum(w.size for w in windows))
            self._checked.update(log_start)

    def rows(self, ranges: Sequence[HistoryRange], session: SparkSession | None = None) -> DataFrame:
        """The archive's records of ``ranges`` at its pinned version, as Kafka's columns and types."""
        from pyspark.sql import functions as F  # noqa: N812

        from connectors.kafka.ranges import kafka_schema

        spark = session or self.spark
        table = (spark.read.format("delta").option("versionAsOf", self.holdings().version)
                 .load(self.config.path))
        wanted = None
        for r in ranges:
            topic, partition = parse_split_id(r.split)
            cond = ((F.col("topic") == topic) & (F.col("partition") == partition)
                    & (F.col("offset") >= r.start) & (F.col("offset") < r.end))
            wanted = cond if wanted is None else wanted | cond
        if wanted is not None:
            table = table.where(wanted)
        else:
            table = table.limit(0)
        return table.select([F.col(f.name).cast(f.dataType).alias(f.name) for f in kafka_schema().fields])


class ArchiveTier:
    """One job's view of its source's archives (in order): holdings pinned at first use, plans and reads."""

    def __init__(self, spark: SparkSession, configs: Sequence[ArchiveConfig], admin: KafkaAdmin,
                 kafka_rows: KafkaRows | None = None) -> None:
        """The archives of ``configs``, in order, planned at ``admin``'s log starts.

        ``kafka_rows``: the source's Kafka reads, for comparing untrusted archives with Kafka where both
        hold offsets (:meth:`ArchiveTable.check`); None: not compared (a plan without Kafka reads).
        """
        self.spark = spark
        self.tables = [ArchiveTable(spark, c) for c in configs]
        self.admin = admin
        self.kafka_rows = kafka_rows

    def held(self) -> dict[str, list[tuple[int, int]]]:
        """What the archives hold per split, all of them (verify's log below the log start, ``earliest``)."""
        return merged(t.holdings().held for t in self.tables)

    def plan(self, ranges: Sequence[HistoryRange], source: HistorySource) -> TierPlan:
        """``ranges`` cut by tier (``core.tiers``) at the splits' log starts now (one ListOffsets)."""
        plan = TierPlan()
        if not ranges:
            return plan
        if source == "kafka":
            plan.kafka.extend(ranges)
            return plan
        holdings = [t.holdings().held for t in self.tables]
        log_start = self.admin.earliest_offsets(sorted({r.split for r in ranges}))
        if self.kafka_rows is not None:
            for table in self.tables:
                table.check(log_start, self.kafka_rows, self.admin)
        for r in ranges:
            start = log_start.get(r.split, 0)
            usable_by = [usable(held.get(r.split, []), start, source, trusted=t.config.trusted)
                         for held, t in zip(holdings, self.tables, strict=True)]
            for segment in plan_tiers_many(r.start, r.end, usable_by, start, source):
                plan.add(r.split, segment)
        return plan

    def offsets_for_timestamp(self, splits: Sequence[str], ts_ms: int) -> dict[str, int]:
        """A timestamp start per split: the first offset at or after ``ts_ms``, the archives' or Kafka's.

        The archives' below the log start, at their pinned versions, or else Kafka's
        (:func:`core.tiers.at_timestamp`).
        """
        from connectors.delta.archive import offsets_for_timestamp

        return offsets_for_timestamp(self.admin, [(t.config.path, t.holdings().version) for t in self.tables],
                                     list(splits), ts_ms)

    def held_counts(self, plan: TierPlan) -> dict[str, int]:
        """The records of ``plan``'s archive part per split: the offsets its archives hold of its ranges.

        Exact: the holdings are each archive's offsets at its pinned version, read from its files (or
        their statistics), and an archive holding an offset twice is refused (``_check_archive``).
        """
        counts: dict[str, int] = {}
        for i, ranges in plan.by_archive.items():
            held = self.tables[i].holdings().held
            for r in ranges:
                inside = sum(max(0, min(hi, r.end) - max(lo, r.start))
                             for lo, hi in normalized(held.get(r.split, [])))
                counts[r.split] = counts.get(r.split, 0) + inside
        return counts

    def whole_files(self, plan: TierPlan,
                    fits: Callable[[list[Path]], list[Path]]) -> tuple[list[ArchiveFile], TierPlan]:
        """The archives' data files ``plan``'s archive part can take whole, and the plan left to read.

        A file can be taken whole when its archive lists it (:class:`~connectors.delta.archive.ArchiveFile`:
        a trusted archive whose files hold their rows as the table shows them, the file one split's run
        of offsets by its statistics), its run lies inside the ranges its archive serves in ``plan``
        (:func:`~source_backfill.core.tiers.whole_runs`), and ``fits`` keeps it (the sink's columns).
        The plan returned is ``plan`` with those runs cut out of its archive part (its Kafka part, gaps
        and loss as they were): each offset is in exactly one of the files or the plan.
        """
        files: list[ArchiveFile] = []
        rest = TierPlan(kafka=list(plan.kafka), gap=list(plan.gap), loss=list(plan.loss))
        for i, ranges in sorted(plan.by_archive.items()):
            spans = [(r.split, r.start, r.end) for r in ranges]
            listed = self.tables[i].holdings().files
            inside = [listed[j] for j in whole_runs(spans, [(f.split, f.start, f.end) for f in listed])[0]]
            kept = set(fits([Path(f.path) for f in inside])) if inside else set()
            candidates = [f for f in inside if Path(f.path) in kept]
            taken, left = whole_runs(spans, [(f.split, f.start, f.end) for f in candidates])
            files.extend(candidates[j] for j in taken)
            for split, start, end in left:
                rest.add(split, Segment(Tier.ARCHIVE, start, end, i))
        return files, rest

    def rows(self, plan: TierPlan, session: SparkSession | None = None) -> DataFrame:
        """The records of ``plan``'s archive part, each range from its archive (one DataFrame)."""
        parts = [self.tables[i].rows(ranges, session) for i, ranges in sorted(plan.by_archive.items())]
        if not parts:
            return self.tables[0].rows([], session)
        rows = parts[0]
        for part in parts[1:]:
            rows = rows.unionByName(part)
        return rows


def _check_archive(path: str, holdings: ArchiveHoldings) -> None:
    """The archive has Kafka's columns and each offset once; else :class:`ArchiveError` saying why."""
    from deltalake import DeltaTable

    from connectors.kafka.ranges import kafka_schema

    names = {f.name for f in DeltaTable(path, version=holdings.version).schema().fields}
    lacking = [f.name for f in kafka_schema().fields if f.name not in names]
    if lacking:
        msg = (f"archive {path} has no {', '.join(lacking)} column: an archive keeps Kafka's columns as "
               "Kafka gave them (a job of this service without a transform writes them)")
        raise ArchiveError(msg)
    if holdings.duplicates:
        msg = (f"archive {path} holds {holdings.duplicates} offsets more than once at version "
               f"{holdings.version}: it is not one copy of the log, and its rows would be copied twice")
        raise ArchiveError(msg)


_WHAT = {"archive lacks": "Kafka has a record the archive lacks",
         "kafka lacks": "the archive holds a record Kafka does not return",
         "differs": "the records differ"}


def _differences(archive: DataFrame, kafka: DataFrame) -> list[tuple[str, int, str]]:
    """Offsets where ``archive`` and ``kafka`` (both Kafka's columns) differ: (split, offset, kind).

    The first :data:`DIFFERENCES_SHOWN` times 20, by split and offset (one Spark job, a full outer join).
    """
    from pyspark.sql import functions as F  # noqa: N812

    columns = [*COMPARED] + [c for c in ("headers",) if c in archive.columns and c in kafka.columns]
    keys = ["topic", "partition", "offset"]
    a = archive.select(*keys, *[F.col(c).alias(f"a_{c}") for c in columns], F.lit(True).alias("in_a"))
    k = kafka.select(*keys, *[F.col(c).alias(f"k_{c}") for c in columns], F.lit(True).alias("in_k"))
    same = F.lit(True)
    for c in columns:
        same = same & F.col(f"a_{c}").eqNullSafe(F.col(f"k_{c}"))
    kind = (F.when(F.col("in_a").isNull(), "archive lacks").when(F.col("in_k").isNull(), "kafka lacks")
            .when(~same, "differs"))
    rows = (a.join(k, keys, "full_outer").select("topic", "partition", "offset", kind.alias("kind"))
            .where(F.col("kind").isNotNull()).orderBy("topic", "partition", "offset")
            .limit(DIFFERENCES_SHOWN * 20).collect())
    return [(split_id(r["topic"], r["partition"]), int(r["offset"]), r["kind"]) for r in rows]
