"""Where a job's table may be written: an allow-list check of sink paths, and private state files.

A sink path is accepted when, resolved the way the Delta sink will open it (made absolute against the
working directory, symlinks followed where they exist, ``..`` applied after them), it lies inside
``daemon.data_root`` (when one is set) AND shares no ancestor/descendant relation with any protected path:
the state root (so the mutation log, every source's streaming checkpoint and the embedded broker's log
folder, all kept under it), each of those resolved on its own (a symlink inside the state root may lead
elsewhere), and every other live job's table (so its ``_delta_log`` too). A table written inside the
daemon's state would put ``_delta_log`` and Parquet folders among Kafka's partition folders or Spark's
checkpoint (the broker then refuses to start), or under a vacuum that deletes files it does not track.

The overlap test is conservative about case: two paths that differ only in letter case count as the same
(they are the same on a case-insensitive file system), so such a sink is refused rather than risked.
"""

from __future__ import annotations

import logging
import os
import re
import stat
from collections.abc import Iterable
from pathlib import Path

from source_backfill.errors import SinkConflictError, SinkPathError

logger = logging.getLogger(__name__)

#: Mode of the state root: only the daemon's user may list or enter it (the checkpoints and the broker's
#: files under it are written by Spark and Kafka with the process umask; the folder keeps others out).
STATE_DIR_MODE = 0o700
#: Mode of the state files the daemon writes itself (the mutation log, its compaction's temp file).
STATE_FILE_MODE = 0o600

#: ``scheme://`` or ``scheme:`` followed by a path: sinks are local paths, never URIs.
_URI = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:(//|/)")


def resolve(path: str | Path) -> Path:
    """``path`` as the kernel will see it: absolute, each symlink resolved before the ``..`` after it."""
    return Path(os.path.realpath(path))


def readings(path: str | Path) -> list[Path]:
    """Every place ``path`` may be opened at; a sink must pass the check for each.

    As the kernel resolves it, and with ``..`` removed first (as a URL library would, before the file
    system sees it), then resolved.
    """
    found = [resolve(path)]
    lexical = resolve(os.path.normpath(os.path.abspath(path)))  # noqa: PTH100
    if lexical != found[0]:
        found.append(lexical)
    return found


def overlaps(a: Path, b: Path) -> bool:
    """True if ``a`` and ``b`` are the same path or one contains the other (case-insensitively)."""
    fa, fb = Path(str(a).casefold()), Path(str(b).casefold())
    return fa == fb or fa.is_relative_to(fb) or fb.is_relative_to(fa)


def state_paths(state_root: Path, sources: Iterable[str], log_name: str) -> list[tuple[str, Path]]:
    """The daemon's own state, each resolved: what no sink may overlap (``(what, path)`` pairs)."""
    root = Path(state_root)
    found = [("the state root", root), ("the mutation log", root / log_name),
             ("the streaming checkpoints", root / "sources"),
             ("the embedded broker's log folder", root / "kafka"), ("the audit table", root / "audit")]
    found += [(f'source "{s}"\'s checkpoint', root / "sources" / s / "checkpoint") for s in sorted(sources)]
    return [(what, resolve(p)) for what, p in found]


def check_sink_path(
    sink_path: str, *, data_root: Path | None, protected: Iterable[tuple[str, Path]],
) -> Path:
    """The resolved sink path if it is allowed, else SinkPathError saying what it collides with.

    The messages name the path as sent and what it collides with in words, never what it resolves to,
    the data root or a protected path: they are API answers, and the daemon's working directory or a
    symlink's target are not the caller's to learn. The log has the details.
    """
    if _URI.match(sink_path):
        msg = f"sink_path {sink_path!r} is a URI: give a local file system path"
        raise SinkPathError(msg)
    try:
        resolved = readings(sink_path)
    except (OSError, ValueError) as exc:  # a NUL byte is a ValueError, not a path outside the root
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        msg = f"sink_path {sink_path!r} is not a usable path ({reason})"
        raise SinkPathError(msg) from None
    protected = list(protected)
    for candidate in resolved:
        if data_root is not None and not candidate.is_relative_to(data_root):
            logger.warning('sink path refused sink_path=%r resolved="%s" data_root="%s"', sink_path,
                           candidate, data_root)
            msg = (f"sink_path {sink_path!r} is outside daemon.data_root (resolved, with any '..' or "
                   "symlink in it followed)")
            raise SinkPathError(msg)
        for what, path in protected:
            if overlaps(candidate, path):
                relation = ("is" if str(candidate).casefold() == str(path).casefold()
                            else "is inside" if candidate.is_relative_to(path) else "contains")
                logger.warning('sink path refused sink_path=%r resolved="%s" overlaps="%s" path="%s"',
                               sink_path, candidate, what, path)
                msg = (f"sink_path {sink_path!r} {relation} {what}: a job's table must not overlap the "
                       "daemon's state or another job's table")
                raise (SinkConflictError if what.startswith("job ") else SinkPathError)(msg)
    if any(candidate.exists() and not candidate.is_dir() for candidate in resolved):
        # a table is a folder: accepted, the job failed at its first epoch with delta-rs' "Generic
        # LocalFileSystem error", which says nothing of the path
        msg = f"sink_path {sink_path!r} is an existing file, not a folder: a job's table is a folder"
        raise SinkPathError(msg)
    return resolved[0]


#: How long a create may spend reading an existing table's log for its owner before it lets the job's
#: sink decide at its first epoch (it refuses a foreign table there too, only later).
OWNER_CHECK_S = 5.0


def check_sink_owner(sink_path: str, job: str, *, timeout_s: float = OWNER_CHECK_S) -> None:
    """SinkConflictError if the sink is an existing Delta table another job wrote, or inside a Delta table.

    The table at the sink is read as the job's sink will read it (the newest commit carrying a job id, see
    :func:`connectors.delta.log.table_owner`); a table of the same job name is its own (a re-created job
    resumes from it) and a table no job wrote is left to the sink's schema check. Reading the log is
    bounded by ``timeout_s``: past it the create goes on (logged) and the sink's own check at the job's
    first epoch still refuses a foreign table. Like :func:`check_sink_path`, messages name the path as sent.
    """
    import concurrent.futures

    from connectors.delta.log import table_owner

    sink = resolve(sink_path)
    for parent in sink.parents:
        if (parent / "_delta_log").is_dir():
            msg = (f"sink_path {sink_path!r} is inside an existing Delta table: a job's table must not be "
                   "a folder of another table")
            raise SinkConflictError(msg)
    if not (sink / "_delta_log").is_dir():
        return
    pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="sink-owner")
    try:
        owner = pool.submit(table_owner, str(sink)).result(timeout=timeout_s)
    except concurrent.futures.TimeoutError:
        logger.warning('sink owner not read in time sink_path=%r job="%s" timeout_s=%g; the sink checks it '
                       "at the job's first epoch", sink_path, job, timeout_s)
        return
    except Exception as exc:  # noqa: BLE001 - an unreadable log: the sink says so at its first epoch
        logger.warning('sink owner not readable sink_path=%r job="%s" error="%s"', sink_path, job, exc)
        return
    finally:
        pool.shutdown(wait=False)
    if owner is not None and owner != job:
        msg = (f'sink_path {sink_path!r} holds a Delta table written by job "{owner}": give job "{job}" its '
               "own sink path (or drop and re-create it under that name to resume the table)")
        raise SinkConflictError(msg)


def make_private_dir(path: Path) -> None:
    """Create ``path`` (and parents) if missing and make it ``0700``, whatever the umask.

    An existing folder open to its group or others is narrowed too (it holds the mutation log and the
    checkpoints); one owned by another user is left as it is (chmod would fail: that is logged by the caller).
    """
    path.mkdir(parents=True, exist_ok=True, mode=STATE_DIR_MODE)
    if stat.S_IMODE(path.stat().st_mode) != STATE_DIR_MODE:
        os.chmod(path, STATE_DIR_MODE)  # noqa: PTH101


def open_private(path: Path, flags: int) -> int:
    """``os.open`` a state file created ``0600`` whatever the umask (an existing one is narrowed to it)."""
    fd = os.open(path, flags | os.O_CREAT, STATE_FILE_MODE)
    try:
        if stat.S_IMODE(os.fstat(fd).st_mode) != STATE_FILE_MODE:
            os.fchmod(fd, STATE_FILE_MODE)
    except BaseException:
        os.close(fd)
        raise
    return fd


def redact(text: str, state_root: Path) -> str:
    """``text`` with the daemon's state root and working directory named, not spelled out.

    Job errors and health problems carry exception texts (Spark's, Delta's, the OS's) that may name the
    state root, the mutation log or the daemon's working directory; the API serves them (``/health``
    without a token unless ``api.guard_reads``). The log keeps the texts whole.
    """
    places = {}
    for label, path in (("<state_root>", Path(state_root)), ("<cwd>", Path.cwd())):
        for form in {str(path), str(path.resolve())}:
            if len(form) > 1:
                places[form] = label
    for form in sorted(places, key=len, reverse=True):  # the longer first: the state root may be in cwd
        text = text.replace(form, places[form])
    return text
