"""processes_below: the one walk of /proc the test kit, the load bench and the JVM tests share."""

from __future__ import annotations

import subprocess
import time

from source_backfill.testing.process import processes_below


def test_the_processes_below_a_root_are_found_and_a_zombie_is_not():
    shell = subprocess.Popen(["bash", "-c", "sleep 30 & sleep 30 & wait"])
    try:
        deadline = time.monotonic() + 5
        while len(processes_below(shell.pid)) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        below = processes_below(shell.pid)
        assert sorted(name for _, name in below) == ["sleep", "sleep"]
        assert shell.pid not in [pid for pid, _ in below]
        victim = below[0][0]
        subprocess.run(["kill", "-STOP", str(shell.pid)], check=True)  # the shell cannot reap it now
        subprocess.run(["kill", "-9", str(victim)], check=True)
        deadline = time.monotonic() + 5
        while victim in [pid for pid, _ in processes_below(shell.pid)] and time.monotonic() < deadline:
            time.sleep(0.05)
        assert victim not in [pid for pid, _ in processes_below(shell.pid)]  # a zombie is gone already
    finally:
        subprocess.run(["kill", "-9", str(shell.pid)], check=False)
        shell.wait()


def test_a_daemon_whose_api_port_was_taken_meanwhile_starts_again_on_a_port_free_now(tmp_path, monkeypatch):
    """free_port() only says a port is free now: once, a Spark JVM's ephemeral port took it before the
    daemon bound it. wait_ready starts the daemon again on another (``SOURCE_BACKFILL_API__PORT``)."""
    import subprocess
    from types import SimpleNamespace

    from source_backfill.testing.process import DaemonProcess

    daemon = DaemonProcess(tmp_path / "config.toml", 1, tmp_path / "daemon.log")
    envs: list[dict | None] = []

    def start() -> None:
        daemon._log_from = daemon.log.stat().st_size if daemon.log.exists() else 0  # noqa: SLF001
        envs.append(daemon.env)
        if len(envs) == 1:
            daemon.log.write_text("error: the daemon did not start: cannot bind the API to 127.0.0.1:1: "
                                  "[Errno 98] Address already in use\n")
            daemon.proc = subprocess.Popen(["true"])  # noqa: S607
            daemon.proc.wait()
        else:
            daemon.proc = subprocess.Popen(["sleep", "5"], start_new_session=True)  # noqa: S607

    monkeypatch.setattr(daemon, "start", start)
    ready = SimpleNamespace(status_code=200)
    monkeypatch.setattr(daemon, "get", lambda path: ready if len(envs) == 2 else None)
    daemon.start()
    daemon.wait_ready(10)
    assert len(envs) == 2 and envs[1] is not None
    assert daemon.url == f"http://127.0.0.1:{envs[1]['SOURCE_BACKFILL_API__PORT']}"
    daemon.kill()
