"""The daemon as a real process: ``source-backfill run --config`` in a process group of its own.

Used by the crash suite (SIGKILL at random moments) and the load benchmark (peak RSS of the daemon and
its Spark JVM). The config is TOML text; the API port is chosen free and put in it by the caller.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx


def free_port() -> int:
    """A TCP port free on loopback now (the caller binds it soon after)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def processes_below(root: int) -> list[tuple[int, str]]:
    """``(pid, name)`` of every live process below ``root`` (not ``root``), from ``/proc``.

    A killed process stays a zombie until its parent reaps it: left out (its children are kept).
    """
    children: dict[int, list[int]] = {}
    names: dict[int, str] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        head, rest = stat.rsplit(")", 1)
        state, ppid = rest.split()[:2]
        children.setdefault(int(ppid), []).append(int(entry.name))
        if state not in ("Z", "X"):
            names[int(entry.name)] = head.split("(", 1)[1]
    found, todo = [], list(children.get(root, []))
    while todo:
        pid = todo.pop()
        todo.extend(children.get(pid, []))
        if pid in names:
            found.append((pid, names[pid]))
    return found


class DaemonProcess:
    """Start, probe, kill and stop one daemon process; its console output goes to ``log``."""

    def __init__(self, config: Path, port: int, log: Path, env: dict[str, str] | None = None) -> None:
        self.config = config
        self.url = f"http://127.0.0.1:{port}"
        self.log = log
        self.env = env  # extra environment (``SOURCE_BACKFILL_*`` settings) on top of this process's
        self.proc: subprocess.Popen[bytes] | None = None
        #: Where this start's output begins in ``log`` (a bind failure is looked for after it).
        self._log_from = 0

    @property
    def pid(self) -> int | None:
        """The daemon's pid while it runs."""
        return None if self.proc is None or self.proc.poll() is not None else self.proc.pid

    def start(self) -> None:
        """Start ``source-backfill run --config`` (the console script next to this interpreter)."""
        exe = Path(sys.executable).with_name("source-backfill")
        self._log_from = self.log.stat().st_size if self.log.exists() else 0
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(  # noqa: S603 - our own console script
                [str(exe), "run", "--config", str(self.config)],
                stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                env={**os.environ, **self.env} if self.env else None,
            )

    def get(self, path: str) -> httpx.Response | None:
        """GET ``path`` on the API, None when it does not answer."""
        try:
            return httpx.get(self.url + path, timeout=5)
        except httpx.HTTPError:
            return None

    def request(self, method: str, path: str, body: dict[str, Any] | None = None, *,
                timeout_s: float = 5.0) -> httpx.Response | None:
        """Any call on the API, None when it does not answer within ``timeout_s`` (a kill may land first)."""
        try:
            return httpx.request(method, self.url + path, json=body, timeout=timeout_s)
        except httpx.HTTPError:
            return None

    def wait_ready(self, timeout_s: float = 180.0) -> float:
        """Block until ``/ready`` is 200; return the seconds it took. A daemon that exits raises."""
        started = time.monotonic()
        deadline = started + timeout_s
        rebinds = 3
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None and rebinds and self._port_taken():
                # the port was free when it was chosen, then another process (a Spark JVM's ephemeral
                # port, say) took it before the daemon bound it: start again on a port free now
                rebinds -= 1
                port = free_port()
                self.url = f"http://127.0.0.1:{port}"
                self.env = {**(self.env or {}), "SOURCE_BACKFILL_API__PORT": str(port)}
                self.start()
                continue
            if self.proc is None or self.proc.poll() is not None:
                code = None if self.proc is None else self.proc.returncode
                msg = f"daemon exited with {code}; log tail:\n{self.tail()}"
                raise AssertionError(msg)
            r = self.get("/ready")
            if r is not None and r.status_code == 200:
                return time.monotonic() - started
            time.sleep(0.2)
        msg = f"daemon not ready within {timeout_s}s; log tail:\n{self.tail()}"
        raise AssertionError(msg)

    def _port_taken(self) -> bool:
        """Whether this start's output says the API's port was in use."""
        with self.log.open("rb") as f:
            f.seek(self._log_from)
            out = f.read()
        return b"cannot bind the API" in out and b"in use" in out

    def kill(self) -> None:
        """SIGKILL the whole process group (the daemon and its Spark JVM) and reap it."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(30)
        self.proc = None

    def stop(self, timeout_s: float = 60.0) -> int | None:
        """SIGTERM to the daemon (it finishes its epoch), SIGKILL to its process group after ``timeout_s``.

        Returns the daemon's exit code (None: it was not running, or had to be killed).

        The daemon alone, as Docker and Kubernetes do (to PID 1): a SIGTERM to the group reached Spark's
        JVM too, which shut down under the running epoch, so the daemon logged a dead JVM and exited 70.
        """
        code = None
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                code = self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(30)
        self.proc = None
        return code

    def tail(self, lines: int = 40) -> str:
        """The last lines of the daemon's console log."""
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def tree_rss_bytes(self) -> int:
        """Resident memory of the daemon and every process below it (Spark's JVM), from ``/proc``.

        Each process counts its proportional share (``Pss`` of ``smaps_rollup``: a page shared by n
        processes counts 1/n in each), so the tree's pages count once: a child the JVM forks to run a
        command (Hadoop's local file system does, without its native library) shares the JVM's pages
        until it execs, and its VmRSS alone would count the whole heap again. VmRSS where the kernel
        has no ``smaps_rollup``.
        """
        root = self.pid
        if root is None:
            return 0
        total = 0
        for pid in [root] + [pid for pid, _ in processes_below(root)]:
            total += _resident_bytes(pid)
        return total


def _resident_bytes(pid: int) -> int:
    """One process's proportional resident memory (``Pss``), else its VmRSS; 0 once it is gone."""
    for name, key in (("smaps_rollup", "Pss:"), ("status", "VmRSS:")):
        try:
            for line in Path(f"/proc/{pid}/{name}").read_text().splitlines():
                if line.startswith(key):
                    return int(line.split()[1]) * 1024
        except OSError:
            continue
    return 0
