"""A job's append written straight into its table's log: one commit file, created only if absent.

An epoch of an append job is one new log version: ``_delta_log/<version>.json`` holding the commit info
(with the job's keys: :mod:`connectors.delta.log`), one ``add`` per file and the job's ``txn``. delta-rs
writes that file the same way (a temporary file linked to its name, which fails if the name exists), but
first brings its snapshot of the table up to date and then reads the new version back: 12–20 ms of CPU
a commit on this box (the update before it 2–4 ms with nothing new, the commit 6–10, the update after
it 4–6), most of the epoch of a job whose rows are on the driver: with 30 jobs, half the job threads'
time went to these delta-rs calls (three quarters to the sink's commit, the file write included). The
sink knows what the table holds after its own commit, so it needs neither.

:class:`LogHead` is the newest version and this job's committed epoch as the sink last saw them, with
the identity of that version's file. :meth:`LogHead.current` holds while nothing was written since (the
next version's file is absent) and that file is still the one seen (same inode and modification time: a
table deleted and created again at the path numbers its versions anew). Only then, and only for a table
whose protocol, properties and columns are on the allow-list of :func:`direct_refusal`, is an append
written here (:func:`write_append`). Anything else takes delta-rs' path, which reloads the table and
checks conflicts as before: another writer's commit, a maintenance rewrite, a recreated table, a
version taken between the check and the write (the link fails), a table with constraints, generated or
identity columns, column mapping, deletion vectors or table features.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

if TYPE_CHECKING:
    import pyarrow as pa
    from deltalake import DeltaTable

#: Table properties an append written here keeps to: the sink's own (change data feed, checkpoints, log
#: retention) and ones that say nothing about how an append is written. Any other ``delta.*`` property
#: (constraints, column mapping, deletion vectors, row tracking, in-commit timestamps, ...) sends the
#: table's appends to delta-rs.
ALLOWED_PROPERTIES = frozenset({
    "delta.enableChangeDataFeed",
    "delta.logRetentionDuration",
    "delta.enableExpiredLogCleanup",
    "delta.checkpointInterval",
    "delta.appendOnly",
    "delta.deletedFileRetentionDuration",
    "delta.dataSkippingNumIndexedCols",
    "delta.checkpoint.writeStatsAsJson",
    "delta.checkpoint.writeStatsAsStruct",
})
#: The writer versions an append written here satisfies: 2 (append-only, invariants: none allowed in the
#: columns), 3 (check constraints: none allowed), 4 (change data feed: an append's adds are its inserts;
#: generated columns: none allowed). Readers: version 1, no table features.
WRITER_VERSIONS = frozenset({1, 2, 3, 4})
ENGINE = "source-backfill"


class LogVersionTaken(Exception):  # noqa: N818 - what happened, not an error of the caller's
    """The version an append was to be written as exists already: another writer took it first."""


@dataclass(frozen=True, slots=True)
class LogHead:
    """The log's newest version, this job's committed epoch in it, and that version's file as seen."""

    version: int
    epoch: int | None
    #: ``(st_ino, st_mtime_ns)`` of ``<version>.json``; None: the file was not there to see.
    file: tuple[int, int] | None

    def current(self, path: str) -> bool:
        """Nothing was written to the log at ``path`` since, and its newest file is the one seen."""
        log = Path(path) / "_delta_log"
        if self.file is None or (log / _name(self.version + 1)).exists():
            return False
        return _identity(log / _name(self.version)) == self.file


def head_of(path: str, table: DeltaTable, job_id: str) -> LogHead:
    """The head of the table at ``path`` as ``table`` (just loaded or brought up to date) sees it."""
    version = int(table.version())
    return LogHead(version, table.transaction_version(job_id),
                   _identity(Path(path) / "_delta_log" / _name(version)))


def direct_refusal(table: DeltaTable, arrow_schema: pa.Schema, partition_by: Sequence[str]) -> str | None:
    """Why the table's appends must go through delta-rs, or None when they may be written here."""
    from deltalake import Schema

    protocol = table.protocol()
    if protocol.min_reader_version != 1 or protocol.min_writer_version not in WRITER_VERSIONS \
            or protocol.reader_features or protocol.writer_features:
        return f"protocol {protocol.min_reader_version}/{protocol.min_writer_version} with features"
    metadata = table.metadata()
    unknown = sorted(k for k in metadata.configuration
                     if k.startswith("delta.") and k not in ALLOWED_PROPERTIES)
    if unknown:
        return f"table properties {unknown}"
    if list(metadata.partition_columns) != list(partition_by):
        return "partition columns"
    have = json.loads(table.schema().to_json())
    if have != json.loads(Schema.from_arrow(arrow_schema).to_json()):
        return "columns other than the sink's"
    if any(f.get("metadata") for f in have.get("fields", [])):
        return "columns carrying metadata (generated or identity columns, invariants, column mapping)"
    return None


def write_append(path: str, head: LogHead, adds: Sequence[Any], meta: Mapping[str, str], job_id: str,
                 epoch: int, metadata: Mapping[str, Any] | None = None) -> LogHead:
    """Commit ``adds`` as version ``head.version + 1`` with the job's txn and ``meta``; its head after.

    ``metadata``: a ``metaData`` action the commit carries too (the table's new schema and properties,
    :func:`grown_metadata`): the columns grow in the same commit as the first rows that hold them.

    :class:`LogVersionTaken` when that version exists already (another writer took it between the check
    and the write): nothing was written. The file appears whole or not at all: it is written under a
    temporary name in the log folder and linked to its version's name, which fails if the name exists.
    An add's path is a URI in Delta's log: percent-encoded here (all but ``/`` and unreserved
    characters; readers decode any escape), its partition values as they are.
    """
    log = Path(path) / "_delta_log"
    version = head.version + 1
    now = int(time.time() * 1000)
    lines = [{"commitInfo": {"timestamp": now, "operation": "WRITE",
                             "operationParameters": {"mode": "Append"}, "isBlindAppend": True,
                             "engineInfo": ENGINE, "clientVersion": ENGINE, **meta}}]
    if metadata is not None:
        lines.append({"metaData": dict(metadata)})
    lines += [{"add": {"path": quote(a.path, safe="/"), "partitionValues": dict(a.partition_values or {}),
                       "size": a.size,
                       "modificationTime": a.modification_time, "dataChange": a.data_change,
                       "stats": a.stats}} for a in adds]
    lines.append({"txn": {"appId": job_id, "version": epoch, "lastUpdated": now}})
    tmp = log / f"_commit_{uuid.uuid4().hex}.json.tmp"
    tmp.write_text("".join(json.dumps(line, separators=(",", ":")) + "\n" for line in lines),
                   encoding="utf-8")
    target = log / _name(version)
    try:
        os.link(tmp, target)
    except FileExistsError:
        msg = f"version {version} of {path} was written by another writer first"
        raise LogVersionTaken(msg) from None
    finally:
        tmp.unlink(missing_ok=True)
    return LogHead(version, epoch, _identity(target))


def grown_metadata(table: DeltaTable, arrow_schema: pa.Schema,
                   properties: Mapping[str, str]) -> dict[str, Any]:
    """The ``metaData`` action of ``table`` with the columns of ``arrow_schema`` and ``properties`` added.

    Only additive: every column the table has must be in ``arrow_schema`` with the same type (the caller
    checks, :func:`grown_schema`); the table's id, partitioning, creation time and other properties stay.
    """
    from deltalake import Schema

    meta = table.metadata()
    return {
        "id": meta.id,
        "name": meta.name,
        "description": meta.description,
        "format": {"provider": "parquet", "options": {}},
        "schemaString": Schema.from_arrow(arrow_schema).to_json(),
        "partitionColumns": list(meta.partition_columns),
        "configuration": {**meta.configuration, **properties},
        "createdTime": meta.created_time,
    }


def grown_schema(have: pa.Schema, output: pa.Schema) -> pa.Schema:
    """The table's columns ``have`` with those of ``output`` it lacks added at the end, in their order.

    ValueError naming the column when that is not an addition: a column of ``have`` that ``output``
    lacks or gives another type, or an added column that is not nullable (the rows before it hold none).
    """
    import pyarrow as pa

    for field in have:
        if field.name not in output.names:
            msg = f"column {field.name!r} would go: a table's columns may only be added to"
            raise ValueError(msg)
        kind = output.field(field.name).type
        if not kind.equals(field.type):
            msg = (f"column {field.name!r} would change type from {field.type} to {kind}: a table's columns "
                   "may only be added to")
            raise ValueError(msg)
    added = [f for f in output if f.name not in have.names]
    stiff = [f.name for f in added if not f.nullable]
    if stiff:
        msg = f"added columns {stiff} are not nullable: the rows written before them hold none"
        raise ValueError(msg)
    return pa.schema([*have, *added])


def _name(version: int) -> str:
    return f"{version:020d}.json"


def _identity(file: Path) -> tuple[int, int] | None:
    try:
        stat = file.stat()
    except FileNotFoundError:
        return None
    return stat.st_ino, stat.st_mtime_ns
