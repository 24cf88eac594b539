"""The embedded servers' child processes: the Kafka broker's and the Schema Registry's.

Free loopback ports, a child that dies with its parent, and a stop of its whole process group.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Self


def free_port() -> int:
    """A port free on 127.0.0.1 now (the OS's pick)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def port_free(port: int) -> bool:
    """Whether ``port`` can be bound on 127.0.0.1 as a server binds it (TIME_WAIT is fine)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    """``preexec_fn``: a process group of its own, and SIGTERM when the parent dies (Linux)."""
    os.setsid()
    if sys.platform.startswith("linux"):
        import ctypes

        with contextlib.suppress(Exception):
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def stop_group(proc: subprocess.Popen[bytes], kill: bool = False, grace_s: float = 20.0) -> None:
    """Stop ``proc``'s process group.

    SIGTERM (``kill``: SIGKILL), SIGKILL after ``grace_s``, then SIGKILL to anything left in the group.
    """
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL if kill else signal.SIGTERM)
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)


def java(what: str, error: type[Exception]) -> str:
    """The ``java`` to run ``what`` with: ``JAVA_HOME``'s, else the one on PATH; ``error`` if none."""
    home = os.environ.get("JAVA_HOME")
    if home and (Path(home) / "bin" / "java").exists():
        return str(Path(home) / "bin" / "java")
    found = shutil.which("java")
    if found is None:
        msg = f"java is not on PATH (and JAVA_HOME is unset): {what} needs Java 17+"
        raise error(msg)
    return found


class ChildServer:
    """What the embedded servers share: their process, its console log, a stop of its group, a context.

    A subclass sets ``_proc`` and ``_out`` in its ``start``, ``_log_dir`` and ``_keep`` (a given folder is
    kept) in ``__init__``, and says what stopped in :meth:`_stopped`.
    """

    _proc: subprocess.Popen[bytes] | None
    _out: Path | None
    _log_dir: Path | None
    _keep: bool

    def start(self) -> Self:
        """Start the server and wait until it answers (the subclass's)."""
        raise NotImplementedError

    def _stopped(self) -> None:
        """Log that the server stopped (its address)."""

    def log_tail(self, chars: int = 2000) -> str:
        """The last ``chars`` characters of the server's console log (for error messages)."""
        if self._out is None:
            return ""
        try:
            return self._out.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def stop(self, kill: bool = False) -> None:
        """Stop the server's process group (SIGTERM, then SIGKILL after 20 s; ``kill``: SIGKILL at once).

        A temp log folder is removed; a given ``log_dir`` is kept.
        """
        proc, self._proc = self._proc, None
        if proc is not None:
            stop_group(proc, kill)
            self._stopped()
        if not self._keep and self._log_dir is not None:
            shutil.rmtree(self._log_dir, ignore_errors=True)
            self._log_dir = None

    @property
    def running(self) -> bool:
        """Whether the server's process is alive."""
        return self._proc is not None and self._proc.poll() is None

    @property
    def pid(self) -> int | None:
        """The server's process id while it runs."""
        return self._proc.pid if self._proc is not None else None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
