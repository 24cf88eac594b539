"""Repair a range in place: a window of a Kafka job's rows replaced by a fresh copy in one Delta commit.

A repair (``POST /jobs/{name}/repair``, :class:`~source_backfill.config.RepairSpec`) runs at an epoch
boundary of its job, on the job's own turn (between two of its epoch commits, so nothing else writes the
table meanwhile):

1. its window is resolved to offsets (a timestamp window through Kafka's ``ListOffsets``) and cut to what
   the job's table holds (:func:`source_backfill.core.repair.cut_repair`: Finished splits, from the job's
   start to the live position its last commit covered);
2. the cut ranges are read from the tiers that hold them (the archive, then Kafka: the history reader's
   plan, no gap and no overlap; offsets held by neither refuse the repair, since the rows there could be
   deleted but not copied again) and go through the job's *current* transform;
3. delta-spark writes them with ``replaceWhere`` on the window's ``partition``/``offset`` (and ``topic``)
   columns: the rows of the window are removed and the fresh ones added **in one commit**, which carries
   ``Transaction("<job>.repair", <repair id>)``. The id is the repair's mutation id, which increases
   with every command accepted, so a repair replayed after a crash (its mutation is marked applied only
   once it is committed) finds its transaction in the table and is not applied twice; one cut short by
   the crash committed nothing (a Delta commit is atomic) and runs again.

The table must keep ``partition`` and ``offset`` columns as Kafka gave them (and ``topic`` when the source
reads more than one topic): :func:`check_repairable` refuses the repair otherwise, and delta-spark refuses
a fresh row outside the window (a transform that rewrites the offset column), so a repair never deletes
rows it does not put back.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from source_backfill import metrics
from source_backfill.config import LatestStart, RepairSpec, SourceConfig
from source_backfill.core import HistoryRange, Stage, parse_split_id
from source_backfill.core.repair import cut_repair, windows_for
from source_backfill.errors import ConfigError, LaneStoppedError, one_line

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping, Sequence

    import pyarrow.compute as pc
    import pyarrow.dataset as ds

    from source_backfill.executors.source_backfill import SourceBackfillJob

logger = logging.getLogger(__name__)

#: The commit metadata key a repair commit carries (JSON: the repair's id and what it replaced). Not the
#: job's key (``source_backfill.job``): a repair commit carries no state, and recovery reads the newest
#: commit of the job's key.
KEY_REPAIR = "source_backfill.repair"
#: Columns a job's table must keep for its rows to be repaired (and ``topic`` with several topics).
REPAIR_COLUMNS = ("partition", "offset")

RepairState = Literal["pending", "done", "failed"]
#: Rows of the job's table (by its log's statistics) up to which a repair counts its window and finds a
#: ``latest`` job's first offsets on the driver (:class:`_TableReads`); above, Spark reads them.
DRIVER_READ_ROWS = 5_000_000


def repair_app_id(job: str) -> str:
    """The Delta transaction app id of the job's repairs (versions: the repairs' ids)."""
    return f"{job}.repair"


def check_repairable(columns: Iterable[str], source: SourceConfig) -> None:
    """The job's table keeps what a repair's window is matched on; ConfigError saying what it lacks."""
    have = set(columns)
    needed = list(REPAIR_COLUMNS)
    if source.topic_pattern is not None or len(source.topics) != 1:
        needed.insert(0, "topic")
    lacking = [c for c in needed if c not in have]
    if lacking:
        msg = (f"the job's table keeps no {', '.join(lacking)} column: a repair replaces the rows of its "
               "window by their Kafka positions, so the job's transform must keep "
               f"{', '.join(needed)} as Kafka gave them")
        raise ConfigError(msg)


@dataclass
class RepairOutcome:
    """What a repair did (the API's ``repairs`` of a job): its ranges, rows and commit."""

    id: int
    spec: RepairSpec
    state: RepairState = "pending"
    #: ``"topic:partition" -> [from, to)`` replaced (the window cut to the job's rows).
    ranges: dict[str, tuple[int, int]] = field(default_factory=dict)
    #: Splits asked for and left alone, and why.
    skipped: dict[str, str] = field(default_factory=dict)
    rows_removed: int | None = None
    rows_added: int | None = None
    #: The table version of the repair's commit (None: not committed, or committed before a restart).
    version: int | None = None
    error: str | None = None
    finished_at: float | None = None

    def to_json(self) -> dict[str, Any]:
        """The API's view of the repair."""
        return {
            "id": self.id, "state": self.state, "window": self.spec.model_dump(mode="json"),
            "ranges": {s: list(r) for s, r in self.ranges.items()}, "skipped": self.skipped,
            "rows_removed": self.rows_removed, "rows_added": self.rows_added, "version": self.version,
            "error": self.error,
        }


def run_repair(job: SourceBackfillJob, repair_id: int, spec: RepairSpec) -> RepairOutcome:
    """Run one repair of ``job`` now (its turn, in its lane); raises only when the lane is stopped under it.

    A repair that cannot be done (refused split, data loss, a fresh row outside the window) is
    ``failed`` with its reason, the table unchanged; the job goes on either way.
    """
    outcome = RepairOutcome(repair_id, spec)
    t0 = time.monotonic()
    try:
        _run(job, outcome)
    except LaneStoppedError:
        raise  # the job was dropped or the daemon stops under it: not failed, it runs again if kept
    except Exception as exc:  # noqa: BLE001 - a repair's failure is the repair's, never the job's
        outcome.state, outcome.error = "failed", one_line(exc)
        logger.warning('repair failed job="%s" id=%d error="%s"', job.name, repair_id, outcome.error)
    outcome.finished_at = time.time()
    metrics.JOB_REPAIRS.labels(job.name, outcome.state).inc()
    logger.info('repair %s job="%s" id=%d ranges=%d removed=%s added=%s version=%s seconds=%.2f',
                outcome.state, job.name, repair_id, len(outcome.ranges), outcome.rows_removed,
                outcome.rows_added, outcome.version, time.monotonic() - t0)
    return outcome


def _run(job: SourceBackfillJob, outcome: RepairOutcome) -> None:
    sink = job.sink
    check_repairable(sink.arrow_schema.names, job.source)
    table = sink.target.open()
    app = repair_app_id(job.name)
    if table is not None and (table.transaction_version(app) or -1) >= outcome.id:
        outcome.state = "done"  # committed before a restart: its mutation was not marked applied yet
        outcome.skipped["*"] = "committed before the daemon restarted"
        return
    if job.states is None or table is None:
        msg = "the job has committed nothing yet"
        raise ConfigError(msg)
    states = job.states.to_states()
    ranges = _cut(job, outcome, states)
    if not ranges:
        outcome.state = "done"
        return
    plan = job.history.tier_plan(ranges)  # archive and Kafka parts; loss refuses the repair
    if plan is not None and plan.loss:
        lost = ", ".join(f"{r.split} [{r.start}, {r.end})" for r in plan.loss[:5])
        msg = (f"offsets {lost} are held by neither the archive nor Kafka: their rows would be removed "
               "and not copied again")
        raise ConfigError(msg)
    reads = _TableReads(job)
    where = _predicate(ranges, reads.with_topic)
    meta = {KEY_REPAIR: json.dumps({"id": outcome.id, "job": job.name,
                                    "ranges": {s: list(r) for s, r in outcome.ranges.items()}},
                                   sort_keys=True)}
    with job.spark_work(f"repair {outcome.id}"), job.committing(), sink.target.lock:
        before = reads.count(ranges)
        fresh = sink.target.conform(job.transform(job.history.rows(ranges)))
        try:
            (fresh.write.format("delta").mode("overwrite").option("replaceWhere", where)
             .option("txnAppId", app).option("txnVersion", str(outcome.id))
             .option("userMetadata", json.dumps(meta, sort_keys=True)).save(sink.path))
        except Exception as exc:
            if "REPLACE_WHERE" not in str(exc).upper():
                raise
            msg = ("the fresh rows fall outside the window (the job's transform does not keep topic, "
                   "partition and offset as Kafka gave them): nothing was replaced")
            raise ConfigError(msg) from None
    commit = _find_commit(sink.path, outcome.id)
    outcome.rows_removed = before
    if commit is not None:  # the window's rows at the repair's version (the commit's numOutputRows
        # counts the rows of the files it rewrote too, those outside the window)
        outcome.version = int(commit["version"])
        outcome.rows_added = reads.count(ranges, outcome.version)
    outcome.state = "done"
    if outcome.rows_added is not None:
        metrics.JOB_REPAIR_ROWS.labels(job.name, "added").inc(outcome.rows_added)
    metrics.JOB_REPAIR_ROWS.labels(job.name, "removed").inc(before)


def _cut(job: SourceBackfillJob, outcome: RepairOutcome, states: Mapping[str, Any]) -> list[HistoryRange]:
    """The repair's window per split, cut to the job's rows (``core.repair``); refused splits raise."""
    spec = outcome.spec
    splits = list(spec.splits) or sorted(states)
    finished = [s for s in splits if s in states and states[s].stage is Stage.FINISHED]
    covered = {s: job.log.covered_to[s] for s in finished if s in job.log.covered_to}
    if spec.by_timestamp:
        assert spec.from_timestamp_ms is not None and spec.to_timestamp_ms is not None  # noqa: S101
        lo = job.admin.offsets_for_timestamp(finished, spec.from_timestamp_ms) if finished else {}
        hi = job.admin.offsets_for_timestamp(finished, spec.to_timestamp_ms) if finished else {}
        windows = {s: (lo[s], hi[s]) for s in finished}
        windows.update({s: (0, 0) for s in splits if s not in windows})
    else:
        assert spec.from_offset is not None and spec.to_offset is not None  # noqa: S101
        windows = windows_for(splits, spec.from_offset, spec.to_offset)
    beyond: dict[str, str] = {}
    if isinstance(job.spec.start, LatestStart):  # its first rows are read from the table: only where
        # the window reaches any of the job's rows at all (a window past them all reads nothing)
        reach = cut_repair(windows, states, dict.fromkeys(finished, 0), covered)
        finished, beyond = sorted({r.split for r in reach.ranges}), reach.skipped
    cut = cut_repair(windows, states, _starts(job, finished, covered), covered)
    if cut.refused:
        why = "; ".join(f"{s}: {r}" for s, r in sorted(cut.refused.items())[:5])
        msg = f"the repair names splits it cannot replace ({why})"
        raise ConfigError(msg)
    outcome.skipped.update({**cut.skipped, **beyond})
    outcome.ranges = {r.split: (r.start, r.end) for r in cut.ranges}
    return cut.ranges


def _starts(job: SourceBackfillJob, splits: Sequence[str], covered: Mapping[str, int]) -> dict[str, int]:
    """Each split's first offset of the job: its start (a ``latest`` job: its first row in the table)."""
    if not splits:
        return {}
    if not isinstance(job.spec.start, LatestStart):
        return job.start_offsets(list(splits), covered)
    return _TableReads(job).firsts([HistoryRange(s, 0, covered[s]) for s in splits if s in covered])


class _TableReads:
    """What a repair reads of the job's table: the rows of its window, a ``latest`` job's first offsets.

    A table of up to :data:`DRIVER_READ_ROWS` rows (by its log's statistics) is read on the driver
    (delta-rs and pyarrow, the window as a filter on the Parquet statistics); a larger one, or one
    delta-rs cannot read (a reader feature it lacks), with Spark. In a daemon just restarted, Spark's
    first Delta read costs seconds (measured in the crash suite: 9-10 s to find a ``latest`` job's first
    offsets, against 0.02 s on the driver) while the source's epochs wait for the repair.
    """

    def __init__(self, job: SourceBackfillJob) -> None:
        self.job = job
        self.path = job.sink.path
        self.with_topic = "topic" in job.sink.arrow_schema.names

    def count(self, ranges: Sequence[HistoryRange], version: int | None = None) -> int:
        """Rows of the table (at ``version``; latest when None) in ``ranges``."""
        dataset = self._dataset(version)
        if dataset is not None:
            return int(dataset.count_rows(filter=_expression(ranges, self.with_topic)))
        reader = self.job.spark.read.format("delta")
        if version is not None:
            reader = reader.option("versionAsOf", version)
        return int(reader.load(self.path).where(_predicate(ranges, self.with_topic)).count())

    def firsts(self, ranges: Sequence[HistoryRange]) -> dict[str, int]:
        """The least offset the table holds in each split of ``ranges`` (splits it holds none of: absent)."""
        if not ranges:
            return {}
        keys = [*(["topic"] if self.with_topic else []), "partition"]
        dataset = self._dataset(None)
        if dataset is not None:
            rows = (dataset.to_table(columns=[*keys, "offset"], filter=_expression(ranges, self.with_topic))
                    .group_by(keys).aggregate([("offset", "min")]).rename_columns([*keys, "first"])
                    .to_pylist())
        else:
            from pyspark.sql import functions as F  # noqa: N812

            rows = [r.asDict() for r in self.job.spark.read.format("delta").load(self.path)
                    .where(_predicate(ranges, self.with_topic)).groupBy(*keys)
                    .agg(F.min("offset").alias("first")).collect()]
        default = self.job.source.topics[0]
        return {f"{d.get('topic') or default}:{d['partition']}": int(d["first"]) for d in rows}

    def _dataset(self, version: int | None) -> ds.Dataset | None:
        """The table as a pyarrow dataset when the driver reads it (small, readable), else None."""
        from deltalake import DeltaTable

        from connectors.delta.table_source import log_row_count

        try:
            table = DeltaTable(self.path, version=version)
            rows = log_row_count(table)
            if rows is None or rows > DRIVER_READ_ROWS:
                return None
            return table.to_pyarrow_dataset()
        except Exception as exc:  # noqa: BLE001 - a table delta-rs cannot read is read by Spark
            logger.info('repair reads the table with Spark job="%s" reason="%s"', self.job.name,
                        one_line(exc))
            return None


def _expression(ranges: Sequence[HistoryRange], with_topic: bool) -> pc.Expression:
    """:func:`_predicate` as a pyarrow filter (values, never text: nothing to quote)."""
    import pyarrow.compute as pc

    found = pc.scalar(False)
    for r in ranges:
        topic, partition = parse_split_id(r.split)
        cond = ((pc.field("partition") == int(partition)) & (pc.field("offset") >= int(r.start))
                & (pc.field("offset") < int(r.end)))
        if with_topic:
            cond = (pc.field("topic") == topic) & cond
        found = found | cond
    return found


def _predicate(ranges: Sequence[HistoryRange], with_topic: bool) -> str:
    """The SQL condition of the rows of ``ranges`` (``replaceWhere``'s); topics quoted as SQL strings."""
    parts = []
    for r in ranges:
        topic, partition = parse_split_id(r.split)
        cond = f"`partition` = {int(partition)} AND `offset` >= {int(r.start)} AND `offset` < {int(r.end)}"
        if with_topic:
            quoted = topic.replace("\\", "\\\\").replace("'", "\\'")
            cond = f"`topic` = '{quoted}' AND {cond}"
        parts.append(f"({cond})")
    return " OR ".join(parts) if parts else "false"


def _find_commit(path: str, repair_id: int) -> dict[str, Any] | None:
    """The repair's commit among the table's newest (by its metadata's id)."""
    from deltalake import DeltaTable

    from connectors.delta.log import commits_back

    for commit in commits_back(path, int(DeltaTable(path).version()), 64):
        raw = commit.get(KEY_REPAIR)  # delta-spark's userMetadata, merged in by the log reader
        if isinstance(raw, str) and json.loads(raw).get("id") == repair_id:
            return commit
    return None
