"""What the sink's commits carry in Delta's log, and how it is read back.

Log metadata keys (in each commit's ``commitInfo``; with delta-spark inside ``userMetadata`` as JSON):
``source_backfill.job``, ``source_backfill.epoch``, ``source_backfill.attempt``,
``source_backfill.state`` (JSON object), ``source_backfill.plan`` (JSON object, optional).

Shared by the sink (:mod:`connectors.delta.sink`: commits, recovery) and its table maintenance
(:mod:`connectors.delta.maintenance`: the orphan sweep), which both search the log for them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from source_backfill.errors import StateFormatError

KEY_JOB = "source_backfill.job"
KEY_EPOCH = "source_backfill.epoch"
KEY_ATTEMPT = "source_backfill.attempt"
KEY_STATE = "source_backfill.state"
KEY_PLAN = "source_backfill.plan"
#: How far back the log is searched for the job's last commit (maintenance commits such as OPTIMIZE
#: carry no state); searched in growing steps, newest first.
HISTORY_STEPS = (16, 256, 4096)


def with_user_metadata(commit: dict[str, Any]) -> dict[str, Any]:
    """A history entry with delta-spark's ``userMetadata`` JSON (our keys) merged in."""
    if KEY_JOB not in commit and isinstance(commit.get("userMetadata"), str):
        try:
            extra = json.loads(commit["userMetadata"])
        except ValueError:
            return commit
        if isinstance(extra, dict):
            return {**commit, **extra}
    return commit


def table_owner(path: str) -> str | None:
    """The job named by the newest commit of the Delta table at ``path`` that carries one, else None.

    Searched like the sink's recovery (newest first, in :data:`HISTORY_STEPS`, at most the last
    4096 commits): the job a sink of ``path`` would find, and refuse if it is not its own.
    """
    from deltalake import DeltaTable

    table = DeltaTable(path)
    seen = 0
    for limit in HISTORY_STEPS:
        history = table.history(limit)
        for commit in history[seen:]:
            job = with_user_metadata(commit).get(KEY_JOB)
            if job is not None:
                return str(job)
        if len(history) < limit:
            break
        seen = len(history)
    return None


def read_commit(path: str, version: int) -> dict[str, Any] | None:
    """The ``commitInfo`` of log version ``version`` of the local table at ``path``, ``version`` added.

    Our keys are merged in from delta-spark's ``userMetadata``.
    Reads that one commit file (``_delta_log/<version>.json``) and nothing else; None when the log no
    longer has it (cleaned up) or it carries no commit info. A file that cannot be parsed raises
    :class:`StateFormatError`: a torn commit is never skipped over.
    """
    file = Path(path) / "_delta_log" / f"{version:020d}.json"
    try:
        text = file.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    for line in text.splitlines():
        if '"commitInfo"' not in line:
            continue
        try:
            info = json.loads(line).get("commitInfo")
        except ValueError as exc:
            msg = (f"Delta table {path}: commit file {file.name} is torn ({exc}); restore "
                   "_delta_log from a backup, or drop the job and re-create it on a new sink path")
            raise StateFormatError(msg) from exc
        if isinstance(info, dict):
            return {**with_user_metadata(info), "version": version}
    return None
