"""The container tests' engine: podman from Debian's packages and the images made here (make test-containers).

``engine`` (session) runs deploy/containers/setup.sh: it installs podman/runc/debootstrap when missing,
writes the project's containers.conf and builds the images that no registry can give here (stand-ins named
so); without root it exits 3 and every test here skips, saying why. ``podman_socket`` serves podman's
Docker-compatible API on a unix socket under var/containers for the session (testcontainers reaches it
through ``DOCKER_HOST``), and stops it after.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
STATE = ROOT / "var" / "containers"
SETUP = ROOT / "deploy" / "containers" / "setup.sh"


@dataclass
class Engine:
    """podman with the project's containers.conf, and the names of the images setup.sh built."""

    settings: dict[str, str]
    created: list[tuple[str, str]] = field(default_factory=list)  # (kind, name) to remove at the end

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "CONTAINERS_CONF": self.settings["CONTAINERS_CONF"]}

    def image(self, key: str) -> str:
        return self.settings[key]

    def run(self, *args: str, timeout: float = 300, check: bool = True) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(["podman", *args], capture_output=True, text=True, timeout=timeout,
                              env=self.env, check=False)
        if check and done.returncode != 0:
            msg = f"podman {' '.join(args)} -> {done.returncode}: {done.stdout[-1500:]}{done.stderr[-1500:]}"
            raise AssertionError(msg)
        return done

    def name(self, kind: str, prefix: str) -> str:
        """A fresh name for a container, volume or network, removed at the end of the session."""
        name = f"{prefix}-{uuid.uuid4().hex[:8]}"
        self.created.append((kind, name))
        return name

    def health(self, container: str) -> str:
        return self.run("inspect", "--format", "{{.State.Health.Status}}", container).stdout.strip()

    def logs(self, container: str, chars: int = 3000) -> str:
        done = self.run("logs", container, check=False)
        return (done.stdout + done.stderr)[-chars:]

    def cleanup(self) -> None:
        order = {"container": 0, "pod": 1, "volume": 2, "network": 3}
        for kind, name in sorted(self.created, key=lambda c: order[c[0]]):
            args = {"container": ("rm", "-f", "-t", "0", name), "volume": ("volume", "rm", "-f", name),
                    "network": ("network", "rm", "-f", name), "pod": ("pod", "rm", "-f", name)}[kind]
            self.run(*args, check=False)
        self.created.clear()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The first test here also builds the images (minutes on a fresh machine): 30 min, not pytest's 10."""
    for item in items:
        if item.get_closest_marker("containers") is not None:
            item.add_marker(pytest.mark.timeout(1800))


@pytest.fixture(scope="session")
def engine() -> Iterator[Engine]:
    """podman and the local images (deploy/containers/setup.sh), or a skip saying why there are none."""
    if os.geteuid() != 0 and shutil.which("podman") is None:
        pytest.skip("no podman, and installing it (Debian's package) needs root: "
                    "run make test-containers as root")
    STATE.mkdir(parents=True, exist_ok=True)
    env_file = STATE / "env"
    log = STATE / "setup.log"
    started = time.monotonic()
    with log.open("w") as out:
        done = subprocess.run(["bash", str(SETUP), str(env_file)], stdout=out, stderr=subprocess.STDOUT,
                              timeout=1500, check=False)
    text = log.read_text(errors="replace")
    if done.returncode == 3:  # no root / no apt-get: said in its last line
        pytest.skip(text.strip().splitlines()[-1])
    assert done.returncode == 0, f"deploy/containers/setup.sh failed ({done.returncode}):\n{text[-4000:]}"
    settings = dict(line.split("=", 1) for line in env_file.read_text().splitlines() if "=" in line)
    print(f"\ncontainers: images ready in {time.monotonic() - started:.0f}s")  # noqa: T201
    eng = Engine(settings)
    yield eng
    eng.cleanup()


@pytest.fixture(scope="session")
def podman_socket(engine: Engine) -> Iterator[str]:
    """``unix://...``: podman's Docker-compatible API, served for the session (``podman system service``)."""
    sock = STATE / f"podman-{os.getpid()}.sock"
    with contextlib.suppress(FileNotFoundError):
        sock.unlink()
    url = f"unix://{sock}"
    proc = subprocess.Popen(["podman", "system", "service", "--time=0", url], env=engine.env,  # noqa: S603
                            stdout=subprocess.DEVNULL, stderr=(STATE / "podman-service.log").open("wb"),
                            start_new_session=True)
    try:
        import docker

        deadline = time.monotonic() + 30
        while True:
            try:
                if sock.exists() and docker.DockerClient(base_url=url, timeout=3).ping():
                    break
            except Exception:  # noqa: BLE001 - not serving yet
                pass
            assert proc.poll() is None, f"podman system service exited {proc.returncode}"
            assert time.monotonic() < deadline, "podman system service did not answer within 30s"
            time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)
        with contextlib.suppress(FileNotFoundError):
            sock.unlink()
