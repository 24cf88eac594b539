"""Maintenance of a sink's Delta table: log checkpoints, the orphan sweep, compaction and vacuum.

Commits write their files into attempt folders *inside* the table (``sb_attempts/<epoch>-<attempt id>/``,
holding an ``_ATTEMPT`` marker while their writer may still commit them); the sweep removes the ones the
log does not reference and never will. The attempt folder is deliberately *not* hidden (no leading
``_``): Delta's vacuum skips hidden folders, so files there would never be reclaimed after compaction.

:class:`TableMaintenance` is handed the sink's table (:class:`connectors.delta.table.SinkTable`);
:class:`connectors.delta.sink.DeltaEpochSink` holds one (its commits write a checkpoint every
``checkpoint_interval`` versions through it).
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

from connectors.delta.log import KEY_ATTEMPT, KEY_EPOCH, KEY_JOB, commits_back

if TYPE_CHECKING:
    from deltalake import DeltaTable

    from connectors.delta.table import SinkTable

logger = logging.getLogger(__name__)

STAGING = "sb_attempts"
#: Present in an attempt folder while its writer may still commit it; the orphan sweep deletes it first.
MARKER = "_ATTEMPT"


class TableMaintenance:
    """The maintenance of one job's sink table: checkpoints, the orphan sweep, compaction, vacuum.

    Every step holds the table's lock (the one every commit holds) and drops its cached snapshot where
    it rewrites the table.
    """

    def __init__(self, target: SinkTable) -> None:
        self.target = target

    def maintain(self, version: int) -> None:
        """A checkpoint every ``checkpoint_interval`` versions, for a table that does not say its own.

        A table this sink created sets ``delta.checkpointInterval``: delta-rs' post-commit hook writes
        the checkpoints then (and removes the commit files past ``delta.logRetentionDuration``). A
        version the sink wrote straight into the log (:mod:`connectors.delta.log_append`) had no hook:
        :meth:`_maintain_direct` does the same.
        """
        if self.target.last_direct == version:
            self._maintain_direct(version)
            return
        interval = self.target.checkpoint_interval
        if interval > 0 and version > 0 and version % interval == 0:
            done = Path(self.target.path) / "_delta_log" / f"{version:020d}.checkpoint.parquet"
            table = self.target.cached()
            if table is None or "delta.checkpointInterval" in table.metadata().configuration:
                return
            if not done.exists():  # delta-rs' own hook may have written it
                table.create_checkpoint()
                logger.info('delta checkpoint written path="%s" version=%d', self.target.path, version)

    def _maintain_direct(self, version: int) -> None:
        """What delta-rs' post-commit hook does after a commit, for a version written into the log here.

        Every ``delta.checkpointInterval`` versions (the sink's ``checkpoint_interval`` when the table
        sets none; at versions N - 1, 2N - 1, ... as delta-rs writes them) a checkpoint, then, unless
        ``delta.enableExpiredLogCleanup`` is false, the removal of the commit files it covers that are
        older than ``delta.logRetentionDuration``.
        """
        props = self.target.properties_seen
        interval = int(props.get("delta.checkpointInterval", self.target.checkpoint_interval))
        if interval <= 0 or (version + 1) % interval != 0:  # delta-rs' rule: after its Nth, 2Nth... commit
            return
        table = self.target.snapshot()  # brought up to the version just written
        if int(table.version()) != version:
            return  # another writer committed after it: its own commit's hook takes the checkpoint
        table.create_checkpoint()
        if props.get("delta.enableExpiredLogCleanup", "true").lower() == "true":
            table.cleanup_metadata()
        logger.info('delta checkpoint written path="%s" version=%d', self.target.path, version)

    def remove_orphans(self) -> int:
        """Remove attempt folders the log does not reference and never will; returns how many.

        * epochs above the committed one: an attempt there can no longer be committed by a live writer
          of this (single-writer) job, so it is a crashed attempt;
        * epochs at or below the committed one still holding the ``_ATTEMPT`` marker (the marker is
          removed right after a successful commit): the log decides. The folder is removed only when the
          commit of its epoch names another attempt (a losing duplicate or a crashed retry); if it names
          this folder the commit landed and only its marker is removed; if that commit cannot be found
          (older than the history searched) the folder is kept for :meth:`vacuum`.

        A file the log references is never deleted, and a table another job owns is left untouched
        (:class:`ForeignTableError`): its attempts are not this job's to judge.
        """
        staging = Path(self.target.path) / STAGING
        if not staging.is_dir():
            return 0
        with self.target.lock:
            table = self.target.open()
            if table is not None:
                self.target.last_job_commit(table)  # raises ForeignTableError before anything is removed
            done = None if table is None else table.transaction_version(self.target.job_id)
            removed = 0
            doubtful: dict[int, list[Path]] = {}
            for folder in staging.iterdir():
                head = folder.name.split("-", 1)[0]
                if not head.isdigit():
                    continue
                if done is None or int(head) > done:
                    remove_attempt(folder)
                    removed += 1
                elif (folder / MARKER).exists():
                    doubtful.setdefault(int(head), []).append(folder)
            if doubtful and table is not None:
                winners = self._attempts_of(table, set(doubtful))
                for epoch, folders in doubtful.items():
                    for folder in folders:
                        if epoch not in winners:
                            continue
                        if winners[epoch] == folder.name.split(".", 1)[0]:  # the attempt or its staged
                            (folder / MARKER).unlink(missing_ok=True)
                        else:
                            remove_attempt(folder)
                            removed += 1
        if removed:
            logger.info('orphan attempts removed path="%s" count=%d committed=%s', self.target.path, removed,
                        done)
        return removed

    def _attempts_of(self, table: DeltaTable, epochs: set[int]) -> dict[int, str]:
        """The committed attempt id of each of ``epochs`` found in the newest commits of this job."""
        found: dict[int, str] = {}
        for commit in commits_back(self.target.path, int(table.version())):
            epoch = str(commit.get(KEY_EPOCH, ""))
            attempt = commit.get(KEY_ATTEMPT)
            if attempt is None or commit.get(KEY_JOB) != self.target.job_id or not epoch.isdigit():
                continue  # (no attempt id logged: nothing is provably unreferenced)
            if int(epoch) in epochs:
                found.setdefault(int(epoch), str(attempt))
                if len(found) == len(epochs):
                    break
        return found

    def checkpoint(self) -> None:
        """Write a log checkpoint now (readers then start from it instead of replaying every commit)."""
        with self.target.lock:
            table = self.target.open()
            if table is not None:
                table.create_checkpoint()

    def compact(self, target_size: int | None = None) -> dict[str, Any]:
        """Rewrite small files into larger ones; returns delta-rs' metrics.

        The OPTIMIZE commit carries no state and no data change: recovery and the change feed skip it.
        """
        with self.target.lock:
            table = self.target.open()
            if table is None:
                return {}
            metrics = dict(table.optimize.compact(target_size=target_size))
            self.target.forget_snapshot()
        logger.info('delta compacted path="%s" added=%s removed=%s', self.target.path,
                    metrics.get("numFilesAdded"), metrics.get("numFilesRemoved"))
        return metrics

    def vacuum(self, retention_hours: int = 168, *, full: bool = True) -> list[str]:
        """Delete files no version within ``retention_hours`` references; returns them.

        ``full`` also deletes untracked files older than the retention (leftovers of losing or crashed
        attempts), not only files removed by compaction. Emptied attempt folders are removed too.
        """
        with self.target.lock:
            table = self.target.open()
            if table is None:
                return []
            deleted = list(table.vacuum(retention_hours=retention_hours, dry_run=False,
                                        enforce_retention_duration=False, full=full))
            staging = Path(self.target.path) / STAGING
            if staging.is_dir():
                for folder in staging.iterdir():
                    if not any(p.suffix == ".parquet" for p in folder.rglob("*")):
                        remove_attempt(folder)
            self.target.forget_snapshot()
        logger.info('delta vacuumed path="%s" files=%d', self.target.path, len(deleted))
        return deleted


def remove_attempt(folder: Path) -> None:
    """Remove an attempt folder, its marker first (a writer still in it then refuses to commit)."""
    (folder / MARKER).unlink(missing_ok=True)
    shutil.rmtree(folder, ignore_errors=True)
