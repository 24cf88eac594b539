"""The image's way of installing and starting the daemon, without Docker (no engine on these machines).

As the Dockerfile does: build the wheel, install it into a fresh virtualenv, start the console script with
the image's own config (deploy/image/config.toml) and environment (its ``ENV`` lines), the brokers from
``KAFKA_BOOTSTRAP_SERVERS``. Paths under the image's volume ``/var/lib/source-backfill`` and jar folder
``/opt/source-backfill/jvm`` are mapped to a temporary folder and this checkout's jars; nothing else changes.
Then ``/health`` answers 200 and the job's Delta table is under the volume.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from source_backfill.testing.process import DaemonProcess, free_port
from tests.integration.deploy.test_deploy_files import _dockerfile_env

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[3]
VOLUME = "/var/lib/source-backfill"
JARS = "/opt/source-backfill/jvm"


def _run(*argv: str, cwd: Path) -> None:
    done = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=900, check=False)  # noqa: S603
    assert done.returncode == 0, f"{argv}: {done.stdout[-2000:]}{done.stderr[-2000:]}"


def test_the_wheel_installed_as_the_image_does_runs_the_image_config(tmp_path, kafka_bootstrap, kafka_admin):
    from connectors.jars import jars_root

    # what the image's build stage and runtime stage do
    _run(sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--wheel-dir", str(tmp_path / "wheels"),
         str(ROOT), cwd=tmp_path)
    wheels = sorted((tmp_path / "wheels").glob("source_backfill-*.whl"))
    assert len(wheels) == 1
    _run(sys.executable, "-m", "venv", str(tmp_path / "venv"), cwd=tmp_path)
    _run(str(tmp_path / "venv" / "bin" / "pip"), "install", "-q", str(wheels[0]), cwd=tmp_path)
    exe = tmp_path / "venv" / "bin" / "source-backfill"
    assert exe.is_file()

    volume = tmp_path / "volume"
    volume.mkdir()
    config = tmp_path / "config.toml"
    config.write_text((ROOT / "deploy" / "image" / "config.toml").read_text().replace(VOLUME, str(volume)))
    kafka_admin.create_topic("events", 2)
    port = free_port()
    image_env = _dockerfile_env()
    env = {k: v.replace(VOLUME, str(volume)).replace(JARS, str(jars_root())) for k, v in image_env.items()}
    env |= {
        "KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap,
        "SOURCE_BACKFILL_API__TOKEN": "image-t0ken",
        "SOURCE_BACKFILL_API__PORT": str(port),  # published ports of the container, free ones here
        "SOURCE_BACKFILL_METRICS__PORT": str(free_port()),
        "SOURCE_BACKFILL_SPARK__MASTER": "local[2]",
        "PATH": f"{exe.parent}:{os.environ['PATH']}",
    }
    daemon = DaemonProcess(config, port, tmp_path / "daemon.log", env)
    daemon.proc = subprocess.Popen(  # noqa: S603 - the fresh virtualenv's console script, as ENTRYPOINT
        [str(exe), "run", "--config", str(config)], stdout=(tmp_path / "daemon.log").open("wb"),
        stderr=subprocess.STDOUT, start_new_session=True, env={**os.environ, **env},
    )
    try:
        daemon.wait_ready(240)
        assert httpx.get(f"{daemon.url}/health", timeout=5).status_code == 200
        job = httpx.get(f"{daemon.url}/jobs/events-copy", timeout=5).json()
        assert job["sink_path"] == f"{volume}/tables/events-copy"
        table = volume / "tables" / "events-copy" / "_delta_log"
        deadline = time.monotonic() + 120
        while not table.is_dir():
            assert time.monotonic() < deadline, f"no table under the volume; log:\n{daemon.tail()}"
            time.sleep(0.5)
        assert (volume / "state" / "mutations.jsonl").is_file()  # the state is on the volume too
        pause = httpx.post(f"{daemon.url}/jobs/events-copy/pause", timeout=5)
        assert pause.status_code == 401  # the image serves 0.0.0.0: a token is needed
    finally:
        daemon.stop()
