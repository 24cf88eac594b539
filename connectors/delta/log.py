"""What the sink's commits carry in Delta's log, and how it is read back.

Log metadata keys (in each commit's ``commitInfo``; with delta-spark inside ``userMetadata`` as JSON):
``source_backfill.job``, ``source_backfill.epoch``, ``source_backfill.attempt``,
``source_backfill.state`` (JSON object), ``source_backfill.plan`` (JSON object, optional).

Shared by the sink (:mod:`connectors.delta.sink`: commits, recovery) and its table maintenance
(:mod:`connectors.delta.maintenance`: the orphan sweep), which both search the log for them.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from source_backfill.errors import StateFormatError

KEY_JOB = "source_backfill.job"
KEY_EPOCH = "source_backfill.epoch"
KEY_ATTEMPT = "source_backfill.attempt"
KEY_STATE = "source_backfill.state"
KEY_PLAN = "source_backfill.plan"
#: How far back the log is searched for the job's last commit (maintenance commits such as OPTIMIZE
#: carry no state), newest first, one commit file at a time.
HISTORY_LIMIT = 4096


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

    Searched like the sink's recovery (:func:`commits_back`, at most :data:`HISTORY_LIMIT` commits):
    the job a sink of ``path`` would find, and refuse if it is not its own.
    """
    from deltalake import DeltaTable

    newest = int(DeltaTable(path).version())
    return next((str(c[KEY_JOB]) for c in commits_back(path, newest) if c.get(KEY_JOB) is not None), None)


def commits_back(path: str, newest: int, limit: int = HISTORY_LIMIT) -> Iterator[dict[str, Any]]:
    """The ``commitInfo`` of versions ``newest``, ``newest - 1``, ... of the local table at ``path``.

    Each read from its own commit file (:func:`read_commit`, ``version`` set from the file's name), at
    most ``limit`` versions, and never below the oldest commit file the log keeps (cleaned up after its
    retention); a version without commit info is skipped. Lazy: a caller that finds what it looks for
    reads no further.

    Not delta-rs' ``DeltaTable.history``: on a table loaded at version V (1.6.6) it lists the log's
    newest commits, written after V too, numbered down from V, so a reader of a table another writer
    commits to took a newer commit for V's (verify then counted the rows of that newer commit missing).
    """
    for version in range(newest, max(-1, newest - limit), -1):
        commit = read_commit(path, version)
        if commit is None:
            if not (Path(path) / "_delta_log" / f"{version:020d}.json").exists():
                return  # below what the log keeps
            continue
        yield commit


def added_bytes(path: str, version: int) -> tuple[int, int | None] | None:
    """Bytes the log version ``version`` of the local table at ``path`` added, and its timestamp (ms).

    The sum of its ``add`` actions' ``size`` (files removed are not subtracted: a quota counts what was
    written); the timestamp is its ``commitInfo``'s (None without one). None when the log no longer has
    the version. A line that cannot be parsed raises :class:`StateFormatError`, as :func:`read_commit`.
    """
    file = Path(path) / "_delta_log" / f"{version:020d}.json"
    try:
        text = file.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    size, timestamp = 0, None
    for line in text.splitlines():
        if not line.strip():
            continue
        try:
            action = json.loads(line)
        except ValueError as exc:
            msg = f"Delta table {path}: commit file {file.name} is torn ({exc})"
            raise StateFormatError(msg) from exc
        add = action.get("add")
        if isinstance(add, dict) and isinstance(add.get("size"), int):
            size += add["size"]
        info = action.get("commitInfo")
        if isinstance(info, dict) and isinstance(info.get("timestamp"), int):
            timestamp = info["timestamp"]
    return size, timestamp


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
