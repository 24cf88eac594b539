"""What a staged copy of Kafka records holds so far: rows and the last offset per split, from its files.

A read ahead copies history ranges into staged Parquet files of a job's table (either connector); its
progress, and Spark's connector's record counts, are read from the files that closed.
"""

from __future__ import annotations

import os
from pathlib import Path


def _parquet_files(folder: Path) -> list[Path]:
    """The Parquet files under ``folder`` now, sorted.

    A copy in progress moves its files: a Spark task writes under ``_temporary/`` and its job's commit
    moves them up and removes that folder, so a folder listed a moment ago may be gone when the walk
    enters it. ``os.walk`` skips such a folder (``Path.rglob`` raised FileNotFoundError, which failed
    the epoch that read the progress: two job rebuilds in a 10-minute load soak).
    """
    found: list[Path] = []
    for root, _dirs, files in os.walk(folder):  # an error listing a folder (it vanished) is skipped
        found.extend(Path(root) / name for name in files if name.endswith(".parquet"))
    return sorted(found)


class StagedProgress:
    """What a read ahead has copied so far: rows and the last offset per split, from its closed files.

    A staged copy writes Parquet files that close as it goes (Spark's connector: every
    ``STAGED_FILE_ROWS`` rows; Python's: every range). A closed file has a footer; the one being
    written has none yet and is skipped. Each file is read once (three columns), then remembered.
    """

    def __init__(self) -> None:
        self.folder: Path | None = None
        #: By file name: a Spark task writes under ``_temporary`` and moves its files up when it ends.
        self._files: dict[str, dict[str, tuple[int, int]]] = {}

    def read(self) -> dict[str, tuple[int, int]]:
        """``split -> (rows, last offset)`` over the closed files found now (empty before the copy)."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        from source_backfill.core import split_id

        folder = self.folder
        if folder is not None:
            for file in _parquet_files(folder):
                if file.name in self._files:
                    continue
                try:
                    if not {"topic", "partition", "offset"} <= set(pq.read_schema(file).names):
                        self._files[file.name] = {}  # a transform's output without the Kafka columns
                        continue
                    table = pq.read_table(file, columns=["topic", "partition", "offset"])
                except (OSError, pa.ArrowInvalid):
                    continue  # still being written (no footer yet), or moved away meanwhile
                grouped = table.group_by(["topic", "partition"]).aggregate(
                    [([], "count_all"), ("offset", "max")])
                self._files[file.name] = {split_id(r["topic"], r["partition"]): (int(r["count_all"]),
                                                                            int(r["offset_max"]))
                                     for r in grouped.to_pylist()}
        total: dict[str, tuple[int, int]] = {}
        for stats in self._files.values():
            for split, (n, last) in stats.items():
                rows, top = total.get(split, (0, -1))
                total[split] = (rows + n, max(top, last))
        return total
