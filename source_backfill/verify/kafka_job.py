"""A Kafka job's table checked against the log up to what the job committed (``source-backfill verify``).

Streamed on both sides (the table in record batches of its offset columns, the log through a consumer),
so a table of any size is checked in bounded memory; below the log start a job reading its source's
archive is checked against the archive's holdings. A table that keeps the records' content (Kafka's
``key``, ``value``, ``timestamp``) is compared by content too (:mod:`.content`): a log truncated and
written again since the copy holds each offset once but not the same record.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from source_backfill.core.splits import split_id
from source_backfill.errors import VerifyRefusedError
from source_backfill.verify.common import local_path
from source_backfill.verify.content import SplitContent, keeps_content, log_digests, scan_digests
from source_backfill.verify.results import SplitTally, VerifyResult

#: Columns a Kafka job's table must keep for its offsets to be checked (the identity transform keeps them).
OFFSET_COLUMNS = ("topic", "partition", "offset")


def committed_positions(table: Any, job: str) -> dict[str, tuple[int | None, int]]:
    """Per split of ``job``'s newest commit in ``table`` (a DeltaTable): ``(backfilled b, position)``.

    The position is where the job's output ends, exclusive: a Finished split holds the log up to the live
    stream's position at that epoch (the state's ``end`` section; a previous-format commit's plan
    ``end``), a Backfilling or SourceCachingUp split up
    to its backfilled offset ``b`` (live rows above it are dropped until history reaches them), a split
    not started yet nothing. Only commits at or before the version ``table`` is loaded at are read, so the
    positions describe the rows that version holds.
    """
    from connectors.delta.log import KEY_JOB, KEY_PLAN, commits_back
    from source_backfill.core.splits import Stage

    commit = next((c for c in commits_back(local_path(table), int(table.version()))
                   if c.get(KEY_JOB) is not None), None)
    if commit is None:
        msg = f'the table holds no commit of job "{job}" yet: nothing to check'
        raise VerifyRefusedError(msg)
    if commit.get(KEY_JOB) != job:
        msg = f'the table belongs to job "{commit.get(KEY_JOB)}", not "{job}"'
        raise VerifyRefusedError(msg)
    states, end = _job_state(table, job, commit)
    if end is None:  # a previous-format commit: the positions are in its plan
        plan = json.loads(commit[KEY_PLAN]) if commit.get(KEY_PLAN) else {}
        end = {k: int(v) for k, v in (plan.get("end") or {}).items()}
    out: dict[str, tuple[int | None, int]] = {}
    for split, state in states.items():
        b = state.offset
        if state.stage is Stage.FINISHED:
            if split not in end:
                msg = f"the commit's plan does not say where split {split} ends: cannot bound the check"
                raise VerifyRefusedError(msg)
            out[split] = (b, end[split])
        else:
            out[split] = (b, -1 if b is None else b + 1)  # -1: nothing yet (its start is resolved later)
    return out


def _job_state(
    table: Any, job: str, commit: Mapping[str, Any]
) -> tuple[dict[str, Any], dict[str, int] | None]:
    """The split states and live positions (None for a previous-format state) ``commit`` stands for.

    A commit's state may be a delta over the job's last snapshot (:mod:`source_backfill.core.state_log`):
    the chain back to that snapshot is read from the table's log, one commit file a link, the way the
    job's own recovery reads it.
    """
    from connectors.delta.log import KEY_JOB, KEY_STATE, read_commit
    from source_backfill.core.codec import END, SPLITS, decode_state, rebuild, splits_from_rows
    from source_backfill.errors import StateFormatError

    path = local_path(table)

    def read(version: int) -> Any:
        found = read_commit(path, version)
        if found is None or found.get(KEY_JOB) != job or KEY_STATE not in found:
            return None
        return decode_state(found[KEY_STATE])

    try:
        sections = rebuild(decode_state(commit.get(KEY_STATE)), read, where=f"Delta table {path}")
        states = splits_from_rows(sections[SPLITS])
    except StateFormatError as exc:
        msg = f"the job's state in its table cannot be read: {exc}"
        raise VerifyRefusedError(msg) from exc
    ends = sections.get(END)
    return states, None if ends is None else {k: int(v) for k, v in ends.items()}


def check_verifiable(table_path: str, job: str) -> None:
    """VerifyRefusedError saying why ``job``'s table cannot be checked offset by offset; quick (no scan).

    No table yet, a table without the offset columns (a transform that drops them), no commit of the job.
    """
    from deltalake import DeltaTable

    if not DeltaTable.is_deltatable(table_path):
        msg = f'job "{job}" has no table yet (nothing committed): nothing to check'
        raise VerifyRefusedError(msg)
    dt = DeltaTable(table_path)
    _check_columns(dt)
    committed_positions(dt, job)


def _check_columns(dt: Any) -> None:
    names = [f.name for f in dt.schema().fields]
    lacking = [c for c in OFFSET_COLUMNS if c not in names]
    if lacking:
        msg = (f"the table keeps no {'/'.join(lacking)} column (its transform drops them): its rows "
               "cannot be matched to Kafka offsets; keep topic, partition and offset in the transform's "
               "SELECT to make it checkable")
        raise VerifyRefusedError(msg)


def verify_job(
    table_path: str,
    job: str,
    admin: Any,
    bootstrap: str,
    kafka_options: Mapping[str, Any] | None = None,
    *,
    start: Any = None,
    batch_rows: int = 65_536,
    timeout_s: float = 600.0,
    archive: Mapping[str, Sequence[tuple[int, int]]] | None = None,
    for_timestamp: Callable[[list[str], int], dict[str, int]] | None = None,
    also: Sequence[str] = (),
    contents: bool = True,
) -> VerifyResult:
    """Check a Kafka job's table against the log, offset by offset, up to the job's committed positions.

    Per split the log's records in ``[lo, hi)`` must each be in the table exactly once, and the table must
    hold no other offset of that range or above it. ``hi`` is the job's committed position
    (:func:`committed_positions`: records the live stream has not committed for the job yet are not
    missing). ``lo`` is the job's start (``start``, the job's StartSpec: earliest, offsets, timestamp) but
    never below the log start; for a ``latest`` start, the first offset the table holds. Rows below the
    log start are counted apart (retention removed what they could be checked against).

    ``archive``: the offsets per split the job's source archive holds (a job reading it: the archive
    tier). Below the log start the archive stands for the log: from its first offset, each offset it
    holds must be in the table once and no other (its gaps hold none); from the log start on, Kafka's
    log as above. ``for_timestamp(splits, ts_ms)``: how the job resolved a timestamp start (default
    Kafka's ListOffsets; a job reading an archive: the archive's first offset at or after it below the log
    start, when it holds one).

    ``also``: more tables of the job whose offsets count as its table's (its dead-letter table: every
    offset is in exactly one of the two), below the committed positions only (a dead letter is committed
    before the job's commit of its epoch, so one above them is not the job's yet).

    Nothing is loaded whole: the table is scanned in record batches of its three offset columns (one
    version, the one the positions come from) into one count per offset of ``[lo, hi)`` (a byte each,
    saturating), and the log is streamed through a consumer (``read_committed``, so aborted records and
    transaction markers are gaps, as in the job's own reads) and compared as it goes.

    ``contents`` (the job's transform is the identity and its values are not decoded) and the job's tables
    keeping Kafka's ``key``, ``value`` and ``timestamp``: the records' contents are compared too
    (:mod:`.content`). A split whose every offset is there once but whose copy of some record is not what
    the log holds at that offset now (a log truncated and written again since the copy) is not exactly
    once, its offset ranges named. The archive's part is compared by offsets only.
    """
    import numpy as np
    from deltalake import DeltaTable

    from source_backfill.config import LatestStart, OffsetsStart, TimestampStart

    dt = DeltaTable(table_path)
    _check_columns(dt)
    positions = committed_positions(dt, job)
    splits = sorted(positions)
    firsts = admin.earliest_offsets(splits) if splits else {}
    if isinstance(start, OffsetsStart):
        wanted = {s: start.offsets.get(s, firsts[s]) for s in splits}
    elif isinstance(start, TimestampStart):
        wanted = (for_timestamp or admin.offsets_for_timestamp)(splits, start.timestamp_ms)
    else:
        wanted = dict(firsts)
    # the table streamed once: counts per offset of [lo, hi), and offsets outside kept per split
    lows = {s: max(firsts[s], wanted.get(s, firsts[s])) for s in splits}
    held = {s: [(a, b) for a, b in (archive or {}).get(s, ()) if a < firsts[s]] for s in splits}
    for s in splits:  # the archive's part, below the log start: from its first offset or the start asked
        if held[s] and not isinstance(start, LatestStart):  # (a latest start is found in the table)
            first = held[s][0][0]
            asked = wanted.get(s, first) if isinstance(start, OffsetsStart | TimestampStart) else first
            lows[s] = min(lows[s], max(asked, first))
    outside: dict[str, list[Any]] = {s: [] for s in splits}
    counts: dict[str, Any] = {}
    tallies: dict[str, SplitTally] = {}
    latest = isinstance(start, LatestStart)
    if latest:
        # the job started at its attach position, which no commit records: its first row is it, found
        # by a first pass over the offset column (streamed too)
        found: dict[str, int | None] = dict.fromkeys(splits)
        for s, offs in _scan_offsets(dt, batch_rows):
            if s in found and len(offs):
                low = max(int(offs.min()), firsts[s])
                seen = found[s]
                found[s] = low if seen is None else min(seen, low)
        lows = {s: (v if v is not None else positions[s][1]) for s, v in found.items()}
    extra = [DeltaTable(path) for path in also if DeltaTable.is_deltatable(path)]
    compared = contents and keeps_content(dt) and all(keeps_content(x) for x in extra)
    for s in splits:
        hi = positions[s][1] if positions[s][1] >= 0 else lows[s]
        lo = min(lows[s], hi)
        tallies[s] = SplitTally(s, lo, hi, kafka_from=max(lo, firsts[s]))
        counts[s] = np.zeros(hi - lo, dtype=np.uint8)
    for s, offs in _scans(dt, extra, tallies, batch_rows):
        tally = tallies.get(s)
        if tally is None:  # a split the job's state does not know
            tallies[s] = tally = SplitTally(s, 0, 0)
            counts[s] = np.zeros(0, dtype=np.uint8)
            outside[s] = []
        inside = (offs >= tally.lo) & (offs < tally.hi)
        if not inside.all():
            outside[s].append(offs[~inside])
        uniq, n = np.unique(offs[inside] - tally.lo, return_counts=True)
        c = counts[s]
        c[uniq] = np.minimum(c[uniq].astype(np.int64) + n, 255).astype(np.uint8)
    for s, parts in outside.items():
        if not parts:
            continue
        offs = np.sort(np.concatenate(parts))
        tally = tallies[s]
        below = offs < firsts.get(s, 0)
        tally.below_log_start += int(below.sum())
        tally.note("unexpected", offs[~below], int((~below).sum()))
    for s in splits:
        _check_archive_part(tallies[s], counts[s], held[s])
    sums = _table_contents(dt, extra, tallies, batch_rows) if compared else None
    _stream_log(bootstrap, kafka_options, tallies, counts, timeout_s, sums)
    for s, content in (sums or {}).items():
        if tallies[s].ok:  # where offsets already differ, their verdict stands
            tallies[s].content_differs = content.compare()
    return VerifyResult(job, int(dt.version()), dict(sorted(tallies.items())), contents_compared=compared)


def _table_contents(dt: Any, extra: Sequence[Any], tallies: Mapping[str, SplitTally],
                    batch_rows: int) -> dict[str, SplitContent]:
    """Per split the table's digest sums over the offsets read from Kafka (``[kafka_from, hi)``)."""
    contents = {s: SplitContent(t.kafka_from if t.kafka_from is not None else t.lo, t.hi)
                for s, t in tallies.items() if t.hi > t.lo}
    for table, below_hi in ((dt, False), *((x, True) for x in extra)):
        for s, offs, digs in scan_digests(table, batch_rows):
            content = contents.get(s)
            if content is not None:  # the other tables' rows above the committed position are not the job's
                keep = offs < content.hi if below_hi else slice(None)
                content.add("table", offs[keep], digs[keep])
    return contents


def _check_archive_part(tally: SplitTally, counts: Any, held: Sequence[tuple[int, int]]) -> None:
    """The archive's offsets below the log start against the table's counts (the archive is the log there).

    Each held offset of ``[lo, kafka_from)`` counted once is right (cleared), none missing, more
    duplicated; what stays counted in that range (a gap of the archive) ends unexpected.
    """
    import numpy as np

    top = tally.kafka_from if tally.kafka_from is not None else tally.lo
    for a, b in held:
        a, b = max(a, tally.lo), min(b, top, tally.hi)
        if b > a:
            _tally_seen(tally, counts, np.arange(a - tally.lo, b - tally.lo))


def _tally_seen(tally: SplitTally, counts: Any, arr: Any) -> None:
    """Offsets ``arr`` (relative to ``tally.lo``) of the log, against the table's counts of them.

    Held once: right (the count is cleared); none: missing; more: duplicated.
    """
    seen = counts[arr]
    tally.records += len(arr)
    tally.note("missing", arr[seen == 0] + tally.lo, int((seen == 0).sum()))
    tally.note("duplicated", arr[seen > 1] + tally.lo, int((seen > 1).sum()))
    counts[arr] = 0


def _scans(dt: Any, extra: Sequence[Any], tallies: Mapping[str, SplitTally],
           batch_rows: int) -> Iterator[tuple[str, Any]]:
    """The job's table's offsets, then those of its other tables below each split's committed position."""
    yield from _scan_offsets(dt, batch_rows)
    for other in extra:
        for s, offs in _scan_offsets(other, batch_rows):
            tally = tallies.get(s)
            if tally is not None:
                yield s, offs[offs < tally.hi]


def _scan_offsets(dt: Any, batch_rows: int) -> Iterator[tuple[str, Any]]:
    """``(split, offsets)`` numpy arrays from the table's record batches (only the offset columns read)."""
    import numpy as np
    import pyarrow as pa

    dataset = dt.to_pyarrow_dataset()
    for batch in dataset.to_batches(columns=list(OFFSET_COLUMNS), batch_size=batch_rows):
        if batch.num_rows == 0:
            continue
        rows = pa.Table.from_batches([batch])
        grouped = rows.group_by(["topic", "partition"]).aggregate([("offset", "list")])
        for topic, partition, offs in zip(grouped.column("topic").to_pylist(),
                                          grouped.column("partition").to_pylist(),
                                          grouped.column("offset_list"), strict=True):
            yield split_id(topic, partition), np.asarray(offs.values, dtype=np.int64)


def _stream_log(bootstrap: str, kafka_options: Mapping[str, Any] | None, tallies: dict[str, SplitTally],
                counts: dict[str, Any], timeout_s: float,
                contents: Mapping[str, SplitContent] | None = None) -> None:
    """Read each split's records in ``[lo, hi)`` and compare them with the table's counts as they come.

    A record whose offset the table holds once is right (its count is cleared); none: missing; more:
    duplicated. What is left counted after the log is read are offsets the table holds and the log has
    not (an aborted transaction's record, say): unexpected. A split is read to ``hi`` or to a consumer
    position at or past it (the last offsets may be transaction markers: no record). ``contents``: the
    records' digests are added to their split's log side as they come.
    """
    import time

    import numpy as np
    from confluent_kafka import Consumer, TopicPartition

    from connectors.kafka.admin import consume_available, consumer_config
    from source_backfill.core.splits import parse_split_id

    todo = {s: t for s, t in tallies.items() if t.hi > t.lo}
    if todo:
        consumer = Consumer(consumer_config(bootstrap, kafka_options, **{
            "enable.auto.commit": False, "isolation.level": "read_committed", "enable.partition.eof": True,
            "group.id": f"source-backfill-verify-{uuid.uuid4()}"}))
        try:
            tps = {s: TopicPartition(*parse_split_id(s), t.lo if t.kafka_from is None else t.kafka_from)
                   for s, t in todo.items()}
            consumer.assign(list(tps.values()))
            deadline = time.monotonic() + timeout_s
            while todo and time.monotonic() < deadline:
                got: dict[str, list[int]] = {}
                records = [m for m in consume_available(consumer, 10_000, 0.5)
                           if m.error() is None]  # an error is the end of a partition: the check below
                for msg in records:
                    got.setdefault(split_id(msg.topic(), msg.partition()), []).append(msg.offset())
                if contents:
                    for s, (offs, digs) in log_digests(records).items():
                        if s in contents:
                            contents[s].add("log", offs, digs)
                for s, offs in got.items():
                    t = todo.get(s)
                    if t is None:
                        continue
                    arr = np.asarray(offs, dtype=np.int64)
                    _tally_seen(t, counts[s], arr[(arr >= t.lo) & (arr < t.hi)] - t.lo)
                for tp in consumer.position([tps[s] for s in todo]):
                    s = split_id(tp.topic, tp.partition)
                    if tp.offset >= 0 and tp.offset >= todo[s].hi:
                        todo.pop(s)
            if todo:
                msg = f"the log was not read to the job's positions within {timeout_s:g} s: {sorted(todo)}"
                raise TimeoutError(msg)
        finally:
            consumer.close()
    for s, t in tallies.items():
        left = np.flatnonzero(counts[s])
        if len(left):
            t.note("unexpected", left + t.lo, len(left))
