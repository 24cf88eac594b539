"""Staging a sink's Parquet files before the commit that adds them to its Delta table.

Rows are written as Parquet files into a folder *inside* the table (``sb_attempts/<epoch>-<attempt id>/``,
holding an ``_ATTEMPT`` marker); the add actions a commit needs (path, size, row count, partition values)
are read back from the folder and the files' footers. An epoch's own rows are written into its attempt
folder (Spark's executors, or pyarrow for rows already on the driver); rows staged ahead of the epoch
that commits them (a read ahead: :meth:`EpochStaging.stage_files`) go into a folder named as an attempt
of the job's next epoch, so the orphan sweep removes it if no commit ever takes it.

:class:`EpochStaging` is handed the sink's table (:class:`connectors.delta.table.SinkTable`);
:class:`connectors.delta.sink.DeltaEpochSink` holds one, and its delta-rs append committer
(:mod:`connectors.delta.append`) commits what it writes and stages.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

from connectors.delta.maintenance import MARKER, STAGING, remove_attempt
from connectors.delta.table import is_arrow_table
from source_backfill.errors import DeltaSinkError

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame

    from connectors.delta.table import SinkTable

#: A staged Spark write starts a new file every this many rows: a closed file's footer tells what a
#: read ahead has copied so far (its progress while it runs), at ~13 MB per file of 130-byte records.
STAGED_FILE_ROWS = 100_000
#: Columns a staged Spark write keeps out of Parquet's dictionary encoding: Kafka's ``offset`` and
#: ``timestamp`` hold (nearly) one value per record, so their dictionary always outgrows its page and
#: falls back to plain after hashing ~128k values per row group (Java Flight Recorder on a 1M-record Avro
#: copy: ~4 % of the tasks' CPU; the copy 4 % faster). Parquet-mr's per-column setting.
PLAIN_COLUMNS = ("offset", "timestamp")


@dataclass(frozen=True)
class StagedFiles:
    """Rows written ahead of the epoch that commits them (:meth:`EpochStaging.stage_files`).

    Not in the table until a ``commit_epoch(..., staged=[...])`` takes them; swept as an orphan if none
    ever does.
    """

    folder: Path
    rows: int


class EpochStaging:
    """The staging of the Parquet files of one job's sink table.

    ``accepts_staged``: whether files can be staged ahead at all (a sink in append mode; a merge
    commits no files written ahead).
    """

    def __init__(self, target: SinkTable, *, accepts_staged: bool) -> None:
        self.target = target
        self.accepts_staged = accepts_staged

    def stage_files(self, write: Callable[[Path], Any], after_epoch: int,
                    on_folder: Callable[[Path], None] | None = None) -> StagedFiles:
        """Have ``write(folder)`` stage Parquet files now, for a later epoch to commit (``staged=...``).

        Any writer (a job's Spark tasks writing with pyarrow, say). The files must have the table's
        columns and types (checked; a mismatch raises :class:`DeltaSinkError`).
        ``after_epoch``: the job's last committed epoch. The folder is named as an attempt of the next
        one, so if no commit ever takes it the orphan sweep removes it (a restart sweeps what is above
        the committed epoch; below it, a folder no commit names). Not under the commit lock: staging
        runs beside the epochs. A failed or cancelled write leaves nothing behind; :meth:`discard`
        removes a staged folder that will not be committed. ``on_folder(folder)`` is called before the
        write starts (whoever watches the write's progress looks there).
        """
        if not self.accepts_staged:
            msg = "staged files need the delta-rs append path (files written, then committed)"
            raise DeltaSinkError(msg)
        folder = Path(self.target.path) / STAGING / f"{after_epoch + 1}-{uuid.uuid4().hex[:16]}"
        self.target.ensure()
        try:
            folder.mkdir(parents=True)
            (folder / MARKER).touch()
            if on_folder is not None:
                on_folder(folder)
            write(folder)
            self._check_file_schemas(folder)
            _, rows = self.collect_adds(folder)
        except BaseException:
            if folder.exists():
                remove_attempt(folder)
            raise
        return StagedFiles(folder, rows)

    def stage_dataframe(self, df: DataFrame, after_epoch: int,
                        on_folder: Callable[[Path], None] | None = None) -> StagedFiles:
        """:meth:`stage_files` with Spark writing ``df`` (the table's columns) as the files.

        A file holds at most :data:`STAGED_FILE_ROWS` rows, so files close as the write goes.
        """
        return self.stage_files(self.dataframe_write(df), after_epoch, on_folder)

    def dataframe_write(self, df: DataFrame) -> Callable[[Path], None]:
        """The ``write(folder)`` of :meth:`stage_dataframe`: Spark writing ``df``'s rows into ``folder``."""
        plain = {f"parquet.enable.dictionary#{c}": "false" for c in PLAIN_COLUMNS
                 if c in self.target.arrow_schema.names}

        def write(folder: Path) -> None:
            (self.target.conform(df).write.mode("append").option("maxRecordsPerFile", STAGED_FILE_ROWS)
             .options(**plain).parquet(str(folder)))

        return write

    def _check_file_schemas(self, folder: Path) -> None:
        """Every Parquet file in ``folder`` has the table's columns with the table's types."""
        want = self._file_columns()
        for file in folder.rglob("*.parquet"):
            got = _columns(file)
            if got != want:
                msg = (f"Delta sink {self.target.path}: staged file {file.name} has columns {got}, the table "
                       f"{want}")
                raise DeltaSinkError(msg)

    def _file_columns(self) -> list[tuple[str, Any]]:
        """The columns (name, Arrow type) a data file of the table holds: the partition columns aside."""
        return [(f.name, f.type) for f in self.target.arrow_schema if f.name not in self.target.partition_by]

    def takes_whole(self, files: Sequence[Path]) -> list[Path]:
        """Of ``files`` (another table's data files), those that can be staged as they are.

        An allow-list: the table has no partition columns (a staged file's folders would name them) and
        the file has exactly the table's columns with its types, in its order, as a file Spark staged.
        """
        if self.target.partition_by:
            return []
        want = self._file_columns()
        return [f for f in files if _columns(f) == want]

    @staticmethod
    def link_files(files: Sequence[Path], folder: Path) -> int:
        """Put ``files`` into ``folder`` as they are; the bytes copied (0 when all were linked).

        A hard link shares the file's bytes (a Parquet file is never changed in place; removing either
        name leaves the other); a copy where no link can be made (another filesystem, a file the daemon
        may read but not link).
        """
        copied = 0
        for file in files:
            to = folder / f"whole-{uuid.uuid4().hex[:12]}-{file.name}"
            try:
                os.link(file, to)
            except OSError:
                shutil.copyfile(file, to)
                copied += to.stat().st_size
        return copied

    @staticmethod
    def discard(staged: StagedFiles) -> None:
        """Remove staged files no commit took (a no-op once a commit moved them into its attempt)."""
        if staged.folder.exists():
            remove_attempt(staged.folder)

    def write_files(self, df: DataFrame | pa.Table | None, folder: Path) -> tuple[list[Any], int]:
        """Have Spark's executors write ``df`` into ``folder``; return the add actions and row count.

        An Arrow table (rows already on the driver) is written by pyarrow, one file per partition value.
        """
        if df is None:
            return [], 0
        folder.mkdir(parents=True)
        (folder / MARKER).touch()
        partition_by = self.target.partition_by
        if is_arrow_table(df):
            rows = self.target.conform_arrow(df)
            name = f"part-{uuid.uuid4().hex[:12]}"
            if rows.num_rows and partition_by:
                import pyarrow.dataset as ds

                ds.write_dataset(rows, folder, format="parquet", partitioning=list(partition_by),
                                 partitioning_flavor="hive", basename_template=f"{name}-{{i}}.parquet",
                                 existing_data_behavior="overwrite_or_ignore")
            elif rows.num_rows:
                import pyarrow.parquet as pq

                # one file, no dataset machinery (about half the time of write_dataset for an epoch's
                # rows), and its add action from what was written: no listing, no footer read back
                file = folder / f"{name}-0.parquet"
                pq.write_table(rows, file)
                self._sealed_check(folder)
                return [self._add(file, {}, rows.num_rows)], rows.num_rows
            return self.collect_adds(folder)
        writer = self.target.conform(df).write.mode("append")
        if partition_by:
            writer = writer.partitionBy(*partition_by)
        writer.parquet(str(folder))
        return self.collect_adds(folder)

    def collect_adds(self, folder: Path) -> tuple[list[Any], int]:
        """The add actions and row count of the Parquet files written into ``folder`` (empty ones removed)."""
        import pyarrow.parquet as pq

        adds, rows = [], 0
        for file in sorted(folder.rglob("*.parquet")):
            meta = pq.read_metadata(file)
            if meta.num_rows == 0:
                file.unlink()
                continue
            parts = {unquote(k): (None if v == "__HIVE_DEFAULT_PARTITION__" else unquote(v)) for k, v in
                     (seg.split("=", 1) for seg in file.relative_to(folder).parts[:-1])}
            adds.append(self._add(file, parts, meta.num_rows))
            rows += meta.num_rows
        self._sealed_check(folder)
        return adds, rows

    def _add(self, file: Path, parts: dict[str, str | None], rows: int) -> Any:
        """The add action of a data file of ``rows`` rows written into the table's folder."""
        from deltalake.transaction import AddAction

        stat = file.stat()
        return AddAction(file.relative_to(self.target.path).as_posix(), stat.st_size, parts,
                         int(stat.st_mtime * 1000), True, json.dumps({"numRecords": rows}))

    def _sealed_check(self, folder: Path) -> None:
        """Raise when the attempt's folder lost its marker while written (another sink's orphan sweep)."""
        if not (folder / MARKER).exists():
            msg = (f"Delta sink {self.target.path}: attempt {folder.name} was removed by another sink's "
                   "orphan sweep while it was written (two live writers of one job?)")
            raise DeltaSinkError(msg)


def _columns(file: Path) -> list[tuple[str, Any]]:
    """A Parquet file's columns: (name, Arrow type), in order."""
    import pyarrow.parquet as pq

    return [(f.name, f.type) for f in pq.read_schema(file)]

