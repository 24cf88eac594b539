"""A Kafka source stopped for good, started over in the running daemon: ``sources reset SRC`` (issue 49).

A topic deleted and created again stops its source for good (``LiveSource._recreated``): its checkpoint,
``topic_ids.json`` and ``anchors.json`` belong to the old topic's log. :meth:`SourceResets.reset`, in order:

1. refuses (SourceRunningError, 409) unless the source is stopped for good;
2. stops the source object (its threads and Kafka clients);
3. records a ``reset`` line (durable, and audited: ``JobRegistry.reset_source``);
4. renames the source's folder ``sources/<name>`` to ``sources/<name>.reset-<UTC time>-<id>``, kept for
   inspection (one rename, then the parent folder fsynced: after a crash the next start finds the old
   folder or the new one, never half of either), and writes ``reset.json`` in the new folder
   (:data:`MARKER`: which reset made it, and the tables its jobs had written from the old log);
5. builds the source anew and starts it: with a new folder it records its topics' ids as they are now, and
   its live query starts a new checkpoint.

A crash after 3 leaves the line unapplied: the next start finishes 4 before it starts the source
(:meth:`SourceResets.finish_pending`); the line is marked applied at the new source's first epoch.

Epoch ids start again at 0 with the new checkpoint, and nothing compares them across the reset: the new
source object has new lanes and no live position, its anchors are in the new folder (none yet). The jobs
failed by the recreated topic stay failed: a plain retry resumes a job from its table, which its source
refuses (the table's commits name the old topic's id, ``SourceBackfillJob.check_topics``; a table of the
marker's ``old_tables`` whose commits name no id, written before ids were recorded, is refused too: its
epochs are the old checkpoint's, and would skip the new one's up to them). A job retried into a new
table has no commit, so no ``Transaction(job, epoch)`` of the old checkpoint; it attaches at the next
epoch.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Mapping, MutableMapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from source_backfill.core.start_over import reset_folder_name
from source_backfill.errors import SourceNotFoundError, SourceRunningError, StateMoveError, one_line
from source_backfill.runtime.mutation_log import fsync_dir
from source_backfill.runtime.paths import redact, resolve
from source_backfill.runtime.topic_record import write_record

if TYPE_CHECKING:
    from source_backfill.config import SourceConfig
    from source_backfill.runtime.mutation_log import By, Mutation
    from source_backfill.runtime.registry import JobRegistry

logger = logging.getLogger(__name__)

#: In a source's folder made by a reset: ``{"reset_id", "at", "moved_to"}``.
MARKER = "reset.json"
#: Renames a folder (``os.rename``: atomic on one file system; the tests put a crash in its place).
rename = os.rename
#: How long a reset waits for the stopped source's threads.
STOP_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class ResetOutcome:
    """What a reset did: its mutation id, where the old folder went (under the state root), the new start."""

    source: str
    id: int
    moved_to: str
    #: Why the source did not start again (None: it runs); a reset may then be asked again.
    error: str | None = None


def read_marker(folder: Path) -> dict[str, Any] | None:
    """The reset that made ``folder`` (its :data:`MARKER`), None for a folder no reset made."""
    import json

    path = folder / MARKER
    if not path.exists():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {"unreadable": True}  # a reset made it all the same
    return data if isinstance(data, dict) else {"unreadable": True}


class SourceResets:
    """The resets of the daemon's Kafka sources: asked through the API, finished at start after a crash."""

    def __init__(self, registry: JobRegistry, state_root: Path, configs: Mapping[str, SourceConfig],
                 sources: MutableMapping[str, Any], build: Callable[[SourceConfig], Any]) -> None:
        self.registry = registry
        self.folders = Path(state_root) / "sources"
        self.configs = configs
        #: The daemon's running sources by name (a reset replaces its entry).
        self.sources = sources
        #: Builds a Kafka source (not started) for its config.
        self.build = build
        self._lock = threading.Lock()

    def finish_pending(self) -> None:
        """Move the folders of resets accepted before a crash and not moved yet (at start, before sources)."""
        for name, config in self.configs.items():
            if config.kind == "kafka":
                self._finish(name)

    def reset(self, name: str, *, by: By | None = None) -> ResetOutcome:
        """Start source ``name`` over (see the module); SourceRunningError unless it is stopped for good."""
        with self._lock:
            config = self.configs.get(name)
            if config is None:
                msg = f'unknown source "{name}"'
                raise SourceNotFoundError(msg)
            source = self.sources.get(name)
            why = getattr(source, "stopped_for_good", None)
            if config.kind != "kafka" or source is None or why is None:
                msg = (f'source "{name}" is running: a reset is for a source stopped for good (a topic of it '
                       "deleted and created again); nothing was changed")
                raise SourceRunningError(msg)
            logger.warning('source reset asked source="%s" by="%s" stopped_because="%s"', name, by, why)
            source.stop(STOP_TIMEOUT_S)
            done = self._finish(name)
            if done is None:
                m, at = self.registry.reset_source(name, by=by)
                done = self._move(name, m, at)
            fresh = self.build(config)
            self.sources[name] = fresh
            error = None
            try:
                fresh.start()
            except Exception as exc:  # noqa: BLE001 - said in the answer and in health; it may be reset again
                error = redact(one_line(exc), self.folders.parent)  # the API answers with it
                logger.error('source not started after its reset source="%s" error="%s"', name, error)
                fresh.stop(STOP_TIMEOUT_S)
                fresh.error = fresh.stopped_for_good = f"not started after its reset: {error}"
            logger.info('source reset source="%s" id=%d moved_to="%s"', name, done.id, done.moved_to)
            return ResetOutcome(name, done.id, done.moved_to, error)

    def _finish(self, name: str) -> ResetOutcome | None:
        """Finish ``name``'s pending resets not done yet; the last one finished now, if any.

        A reset is done once its folder was renamed aside and the new folder names it (:data:`MARKER`);
        a crash may have come before either.
        """
        finished = None
        pending = self.registry.pending_resets(name)
        for m, at in pending:
            if not (self.folders / reset_folder_name(name, at, m.id)).exists():
                logger.warning('source reset finished after a restart source="%s" id=%d', name, m.id)
                finished = self._move(name, m, at)
        if pending and finished is None:
            m, at = pending[-1]
            marker = read_marker(self.folders / name)
            if marker is None:  # renamed, then the crash came before the new folder was marked
                finished = self._move(name, m, at)
        return finished

    def _tables_of(self, name: str) -> list[str]:
        """The tables of the source's registered jobs, resolved: written before the reset, of the old log."""
        found = set()
        for record in self.registry.list():
            if record.source == name:
                for table in record.spec.tables:
                    try:
                        found.add(str(resolve(table)))
                    except (OSError, ValueError):
                        continue
        return sorted(found)

    def _move(self, name: str, m: Mutation, at: datetime) -> ResetOutcome:
        """Rename the folder aside (once), then mark the new folder as this reset's (StateMoveError)."""
        folder = self.folders / name
        target_name = reset_folder_name(name, at, m.id)
        target = self.folders / target_name
        try:
            if folder.exists() and not target.exists():
                rename(folder, target)  # one rename: the folder is whole on either side of it
                fsync_dir(self.folders)
                logger.info('source folder moved aside source="%s" to="%s"', name, target)
            write_record(folder / MARKER, {"reset_id": m.id, "at": at.isoformat(),
                                           "moved_to": f"sources/{target_name}",
                                           "old_tables": self._tables_of(name)})
            fsync_dir(self.folders)
        except OSError as exc:
            msg = (f'source "{name}": its folder could not be moved aside ({exc.strerror or exc}); the reset '
                   "is recorded and finishes at the next start, or ask it again")
            raise StateMoveError(msg) from exc
        return ResetOutcome(name, m.id, f"sources/{target_name}")
