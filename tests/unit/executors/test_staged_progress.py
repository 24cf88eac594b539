"""A read ahead's progress is read from the files its copy closed, while the copy moves them."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from source_backfill.executors.history import StagedProgress


def _file(path: Path, offsets: list[int]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({"topic": ["t"] * len(offsets), "partition": [0] * len(offsets),
                             "offset": offsets}), path)


def test_a_task_folder_removed_while_the_progress_is_read_is_skipped(tmp_path, monkeypatch):
    """Spark's job commit removes ``_temporary`` between the listing of its parent and its own."""
    folder = tmp_path / "attempt"
    _file(folder / "part-0.parquet", [0, 1, 2])
    _file(folder / "_temporary" / "0" / "task" / "part-1.parquet", [3, 4])
    real = os.scandir

    def committing(path):  # the commit lands just before the walk enters _temporary
        if str(path).endswith("_temporary"):
            shutil.rmtree(path)
        return real(path)

    monkeypatch.setattr(os, "scandir", committing)
    progress = StagedProgress()
    progress.folder = folder
    assert progress.read() == {"t:0": (3, 2)}
    monkeypatch.setattr(os, "scandir", real)
    _file(folder / "part-1.parquet", [3, 4])  # where the commit moved it
    assert progress.read() == {"t:0": (5, 4)}
