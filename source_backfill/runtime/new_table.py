"""A failed job run again from the earliest offsets into a new table (``jobs retry --new-table``, issue 49).

For a job whose table cannot be resumed: its topic was deleted and created again (a new topic id, offsets
from 0), and its table holds the old topic's records. The job keeps its name and its spec but for two
fields: ``start`` becomes ``earliest`` and ``sink_path`` a new table, given (``sink``) or chosen
(:func:`choose_new_table`: the old path with ``-2``, ``-3``, ... appended, the first whose tables are
free). The old table is left as it is. The registry records the new spec in the ``retry`` line
(``runtime/registry.py``) after the checks of a create's sink (:func:`check_new_tables`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path

from pydantic import ValidationError

from source_backfill.config import JobSpec
from source_backfill.core.start_over import NEW_TABLE_TRIES, new_table_candidates
from source_backfill.errors import ConfigError, SinkConflictError
from source_backfill.runtime.paths import check_sink_path

#: Checks a job's new spec: ``(spec, free)``, ``free`` when the daemon chose its path (nothing may be
#: there yet); SinkConflictError when the path is taken, another ConfigError when it cannot be used.
CheckNew = Callable[[JobSpec, bool], None]


def new_table_spec(spec: JobSpec, sink: str) -> JobSpec:
    """``spec`` from the earliest offsets into ``sink`` (ConfigError if ``sink`` is not a sink path)."""
    try:
        return JobSpec.model_validate({**spec.model_dump(), "sink_path": sink, "start": {"kind": "earliest"}})
    except ValidationError as exc:
        msg = f"sink: {exc.errors()[0]['msg']}"
        raise ConfigError(msg) from None


def choose_new_table(spec: JobSpec, sink: str | None, check: CheckNew) -> JobSpec:
    """The job's spec into its new table: ``sink`` checked, else the first free default path.

    A default path whose check says it is taken (SinkConflictError) gives way to the next; any other
    refusal (outside the data root) would refuse every one of them, and is raised at once.
    """
    if sink is not None:
        new = new_table_spec(spec, sink)
        check(new, False)
        return new
    for candidate in new_table_candidates(spec.sink_path):
        new = new_table_spec(spec, candidate)
        try:
            check(new, True)
        except SinkConflictError:
            continue
        return new
    msg = (f"sink_path {spec.sink_path!r}: none of its next {NEW_TABLE_TRIES} paths ('-2', '-3', ...) is "
           "free for the job's new table: give one (sink)")
    raise SinkConflictError(msg)


def check_new_tables(spec: JobSpec, *, data_root: Path | None, protected: Iterable[tuple[str, Path]],
                     free: bool) -> None:
    """Each table of ``spec`` passes a create's path rules and is new.

    ``protected`` holds the job's old tables besides what a create's does, so no new table overlaps
    them. ``free``: nothing may be at the path at all (a path the daemon chose); else a folder is taken,
    but not one holding a Delta table (the old one, another job's, or one no job wrote: not new).
    """
    protected = list(protected)
    for table in spec.tables:
        path = check_sink_path(table, data_root=data_root, protected=protected)
        if free and (path.exists() or path.is_symlink()):
            msg = f"sink_path {table!r} exists already: a new table needs a free path"
            raise SinkConflictError(msg)
        if (path / "_delta_log").exists():
            msg = f"sink_path {table!r} holds a Delta table already: give the job's new table a free path"
            raise SinkConflictError(msg)
