"""What an archive table holds: per split, the offset ranges of its records at a pinned version.

An archive is a Delta table of a topic's records as Kafka gave them (``topic``, ``partition``,
``offset`` and the rest: a job of this service without a transform writes exactly that). What it holds
is read, not guessed (``core.tiers`` plans from it):

* From the **file statistics**, when the archive's offsets are known unique (``unique_offsets``: a job
  of this service wrote it, each offset committed once): a data file whose ``topic`` and ``partition``
  are one value each and whose record count equals ``max(offset) - min(offset) + 1`` holds exactly that
  run of offsets, so it is taken without being read. (Of a foreign table nothing says an offset is
  not there twice, hiding a hole of the same size: its files are all read.)
  Such a file of an archive whose files hold their rows as the table shows them (reader protocol 1, no
  partition columns) is also listed (``files``): a job copying its run without a transform takes the
  file whole, linked into its staged files, instead of reading and writing its rows.
* Any other file (several splits in one file, or holes in its run, or no statistics) has its ``topic``,
  ``partition`` and ``offset`` columns read (column pruning: nothing else), one file at a time, so the
  driver never holds more than one file's offsets. Offsets found more than once are counted
  (``duplicates``): the adapter that trusts the archive decides what they mean.

The result is the merged half-open ranges per split (``"topic:partition"``) and the version read, which
the copy then reads at (an archive that is a live job's table keeps growing: the copy pins the version
its plan came from).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from source_backfill.core.splits import parse_split_id, split_id
from source_backfill.core.tiers import at_timestamp, normalized
from source_backfill.errors import DeltaSinkError

#: The columns an archive must have (Kafka's, as Spark's Kafka source names them).
ARCHIVE_COLUMNS = ("topic", "partition", "offset")


@dataclass(frozen=True, slots=True)
class ArchiveHoldings:
    """The offsets an archive table holds per split at ``version``, and how they were found."""

    version: int
    held: dict[str, list[tuple[int, int]]]
    #: Data files taken from their statistics alone, and files whose offsets were read.
    files_from_stats: int = 0
    files_read: int = 0
    #: Offsets found more than once in the files read (0 in an archive written exactly once).
    duplicates: int = 0
    #: The data files that can be taken whole (:func:`archive_holdings`), each with its run of offsets.
    files: tuple[ArchiveFile, ...] = ()


@dataclass(frozen=True, slots=True)
class ArchiveFile:
    """A data file of an archive holding exactly the offsets ``[start, end)`` of ``split``, as it is."""

    path: str
    split: str
    start: int
    end: int


def archive_holdings(path: str | Path, version: int | None = None, *, unique_offsets: bool = False,
                     read_offsets: Callable[[str], Any] | None = None) -> ArchiveHoldings:
    """What the archive at ``path`` holds at ``version`` (None: its newest), per split.

    ``read_offsets(file_uri)``: a pyarrow table of the file's ``topic``, ``partition``, ``offset``
    (default: pyarrow's Parquet reader). Raises :class:`DeltaSinkError` when the table lacks a column.
    """
    import pyarrow as pa
    from deltalake import DeltaTable

    table = DeltaTable(str(path), version=version)
    names = {f.name for f in table.schema().fields}
    missing = [c for c in ARCHIVE_COLUMNS if c not in names]
    if missing:
        msg = f"archive {path} has no {', '.join(missing)} column: it is not a table of Kafka records"
        raise DeltaSinkError(msg)
    actions = pa.table(table.get_add_actions(flatten=True)).to_pylist()
    physical = _physical_names(table)
    reader = read_offsets or (lambda uri: _parquet_offsets(uri, physical))
    runs: dict[str, list[tuple[int, int]]] = {}
    from_stats = read = 0
    whole_files = _files_as_they_are(table)
    files: list[ArchiveFile] = []
    for action in actions:
        whole = _run_from_stats(action, physical) if unique_offsets else None
        if whole is not None:
            sid, lo, hi = whole
            runs.setdefault(sid, []).append((lo, hi))
            from_stats += 1
            uri = _file_uri(table, action["path"])
            if whole_files and uri.startswith(("/", "file://")):
                files.append(ArchiveFile(uri.removeprefix("file://"), sid, lo, hi))
            continue
        for sid, lo, hi in _runs(reader(_file_uri(table, action["path"]))):
            runs.setdefault(sid, []).append((lo, hi))
        read += 1
    held = {sid: normalized(r) for sid, r in sorted(runs.items())}
    total = sum(hi - lo for r in runs.values() for lo, hi in r)
    distinct = sum(hi - lo for r in held.values() for lo, hi in r)
    return ArchiveHoldings(table.version(), held, from_stats, read, total - distinct, tuple(files))


def _files_as_they_are(table: Any) -> bool:  # noqa: ANN401 - a deltalake.DeltaTable
    """Whether a data file of ``table`` holds its rows as the table shows them, so it can be taken whole.

    An allow-list: reader protocol 1 (no deletion vectors hiding rows of a file, no column mapping
    renaming its columns) and no partition columns (kept in the log, not in the file).
    """
    protocol = table.protocol()
    return protocol.min_reader_version == 1 and not table.metadata().partition_columns


def first_offsets_at(path: str | Path, ts_ms: int, below: Mapping[str, int],
                     version: int | None = None) -> dict[str, int]:
    """Per split of ``below``, the first offset under ``below[split]`` timestamped at or after ``ts_ms``.

    Kafka's ListOffsets rule for a timestamp, on the archive's records; splits with none are left out.

    Streamed in record batches of four columns, files outside the timestamp filter skipped by their
    statistics: the driver holds one batch at a time. ``version``: the one the archive is pinned at.
    """
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.dataset as ds
    from deltalake import DeltaTable

    wanted = {sid: end for sid, end in below.items() if end > 0}
    if not wanted:
        return {}
    dataset = DeltaTable(str(path), version=version).to_pyarrow_dataset()
    at = pa.scalar(ts_ms * 1000, pa.timestamp("us", tz="UTC")).cast(dataset.schema.field("timestamp").type)
    by_split = None
    for sid, end in wanted.items():
        topic, partition = parse_split_id(sid)
        cond = (ds.field("topic") == topic) & (ds.field("partition") == partition) & (
            ds.field("offset") < end)
        by_split = cond if by_split is None else by_split | cond
    found: dict[str, int] = {}
    for batch in dataset.to_batches(columns=list(ARCHIVE_COLUMNS),
                                    filter=(ds.field("timestamp") >= at) & by_split):
        if batch.num_rows == 0:
            continue
        firsts = pa.Table.from_batches([batch]).group_by(["topic", "partition"]).aggregate(
            [("offset", "min")])
        lowest = pc.cast(firsts.column("offset_min"), "int64").to_pylist()
        for topic, partition, first in zip(firsts.column("topic").to_pylist(),
                                           firsts.column("partition").to_pylist(), lowest, strict=True):
            sid = split_id(topic, int(partition))
            found[sid] = min(found.get(sid, first), first)
    return found


def offsets_for_timestamp(admin: Any, archives: Iterable[tuple[str, int | None]], splits: list[str],  # noqa: ANN401
                          ts_ms: int) -> dict[str, int]:
    """A timestamp start per split with ``archives`` (path, version; None: the newest).

    Kafka's first offset at or after ``ts_ms``, or an archive's below the log start
    (:func:`core.tiers.at_timestamp`): the one rule the attach, the dry run and the daemon's verify
    resolve a timestamp start by.
    """
    log_start = admin.earliest_offsets(splits)
    firsts = [first_offsets_at(path, ts_ms, log_start, version) for path, version in archives]
    return at_timestamp(admin.offsets_for_timestamp(splits, ts_ms), firsts)


def _physical_names(table: Any) -> dict[str, str]:  # noqa: ANN401 - a deltalake.DeltaTable
    """:data:`ARCHIVE_COLUMNS` as the table's files and statistics name them.

    Under column mapping (``delta.columnMapping.mode``) a column's data is stored under a physical name
    of its own (its field's ``delta.columnMapping.physicalName``); otherwise under its name.
    """
    key = "delta.columnMapping.physicalName"
    names = {f.name: (f.metadata or {}).get(key) for f in table.schema().fields}
    return {c: str(names.get(c) or c) for c in ARCHIVE_COLUMNS}


def _run_from_stats(action: dict[str, Any], physical: Mapping[str, str] | None = None,
                    ) -> tuple[str, int, int] | None:
    """``(split, lo, hi)`` when the file's statistics prove it holds exactly the offsets ``[lo, hi)``.

    ``physical``: the columns' names in the statistics (:func:`_physical_names`; default their names).
    """
    count = action.get("num_records")
    names = physical or {c: c for c in ARCHIVE_COLUMNS}
    stats: list[Any] = [action.get(f"{m}.{names[c]}") for m in ("min", "max") for c in ARCHIVE_COLUMNS]
    if count is None or any(v is None for v in stats):
        return None
    min_topic, max_topic = str(stats[0]), str(stats[3])
    min_part, min_off, max_part, max_off = (int(v) for v in (stats[1], stats[2], stats[4], stats[5]))
    if min_topic != max_topic or min_part != max_part or count != max_off - min_off + 1:
        return None
    return split_id(min_topic, min_part), min_off, max_off + 1


def _runs(rows: Any) -> Iterable[tuple[str, int, int]]:
    """Runs of consecutive offsets per split in a table of ``topic``, ``partition``, ``offset``."""
    import pyarrow.compute as pc

    if rows.num_rows == 0:
        return []
    ordered = rows.select(list(ARCHIVE_COLUMNS)).sort_by([(c, "ascending") for c in ARCHIVE_COLUMNS])
    topics = ordered.column("topic").to_pylist()
    parts = ordered.column("partition").to_pylist()
    offsets = pc.cast(ordered.column("offset"), "int64").to_pylist()
    out: list[tuple[str, int, int]] = []
    start = 0
    for i in range(1, len(offsets) + 1):
        # a run ends at a new split or a hole; a repeated offset is its own run (counted as a duplicate)
        if i == len(offsets) or topics[i] != topics[start] or parts[i] != parts[start] \
                or offsets[i] != offsets[i - 1] + 1:
            out.append((split_id(topics[start], int(parts[start])), offsets[start], offsets[i - 1] + 1))
            start = i
    return out


def _file_uri(table: Any, path: str) -> str:
    """A data file's location: its path as the log has it, joined to the table's when relative."""
    if "://" in path or path.startswith("/"):
        return path
    return f"{table.table_uri.rstrip('/')}/{path}"


def _parquet_offsets(uri: str, physical: Mapping[str, str] | None = None) -> Any:
    """The ``topic``, ``partition``, ``offset`` columns of one Parquet data file.

    Read by their ``physical`` names (:func:`_physical_names`), named as the table names them.
    """
    import pyarrow.parquet as pq

    local = uri.removeprefix("file://")
    names = physical or {c: c for c in ARCHIVE_COLUMNS}
    return pq.read_table(local, columns=[names[c] for c in ARCHIVE_COLUMNS]).rename_columns(
        list(ARCHIVE_COLUMNS))
