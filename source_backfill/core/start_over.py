"""Starting over after a topic was deleted and created again: the pure parts of the two commands (issue 49).

``sources reset SRC`` moves the source's folder (checkpoint, ``topic_ids.json``, ``anchors.json``) aside,
kept for inspection, under a name made from the reset's mutation line (:func:`reset_folder_name`: the
line's time and id), so the same name comes back whenever the line is replayed: a daemon that crashed
between the line and the move finishes it at its next start.

``jobs retry NAME --from earliest --new-table`` runs a failed job again into a new table: by default the
old table's path with ``-2`` appended (``-3``, ... when that is taken: :func:`new_table_candidates`);
which candidate is free (nothing there, no other job's table) is the registry's to find.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime

#: Between a source's name and the reset's time in the name of a folder moved aside.
RESET_MARK = ".reset-"
#: How many ``-N`` paths a retry into a new table tries before it asks for ``sink``.
NEW_TABLE_TRIES = 100


def reset_folder_name(source: str, at: datetime, mutation_id: int) -> str:
    """The name the folder of ``source`` is moved to by the reset accepted ``at`` as ``mutation_id``.

    ``<source>.reset-<UTC time to the second>-<id>``: readable, sorted by time, and unique (two resets
    within a second differ by id).
    """
    when = at.astimezone(UTC) if at.tzinfo is not None else at
    return f"{source}{RESET_MARK}{when:%Y%m%dT%H%M%SZ}-{mutation_id}"


def new_table_candidates(old: str, tries: int = NEW_TABLE_TRIES) -> Iterator[str]:
    """The default paths of a job's new table, in order: ``<old>-2``, ``<old>-3``, ... (``tries`` of them).

    A trailing ``/`` of the old path is dropped first (``t/`` gives ``t-2``, not ``t/-2``: a folder inside
    the old table).
    """
    base = old.rstrip("/") or old
    for n in range(2, 2 + tries):
        yield f"{base}-{n}"
