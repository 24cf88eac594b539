"""The project's Dockerfile, built and run with podman (make test-containers).

deploy/containers/setup.sh builds the Dockerfile unchanged but for its base, ``--build-arg
BASE_IMAGE=localhost/python-standin:3.11-slim-bookworm`` (a debootstrap stand-in of the default
``python:3.11-slim-bookworm``; no registry here), with ``--format docker`` (podman keeps ``HEALTHCHECK``
only in that format). The container runs as a user would run it: on a network with a Kafka (the
apache/kafka stand-in, ``broker:9092``), API and metrics ports published, the token and the brokers from
the environment, a named volume; nothing else is set. podman's health timer needs systemd, absent here,
so the test runs the image's own ``HEALTHCHECK`` command with ``podman healthcheck run`` at its interval.
"""

from __future__ import annotations

import json
import time

import httpx
import pytest

from source_backfill.testing.process import free_port
from tests.containers.kafka import create_and_fill, kafka_env, wait_kafka

pytestmark = [pytest.mark.containers]

TOKEN = "image-test-t0ken"
SHUTDOWN_TIMEOUT_S = 30  # deploy/image/config.toml daemon.shutdown_timeout_s
STOP_GRACE_S = 45  # podman's -t: longer than the shutdown timeout (podman's default is 10 s)
RECORDS = 3000


def _wait_healthy(engine, container: str, timeout_s: float = 300) -> float:
    """Run the image's HEALTHCHECK (its interval, 15 s; 5 s here to measure closer) until healthy."""
    started = time.monotonic()
    while True:
        engine.run("healthcheck", "run", container, check=False)
        if engine.health(container) == "healthy":
            return time.monotonic() - started
        running = engine.run("inspect", "--format", "{{.State.Running}}", container).stdout.strip()
        assert running == "true", f"the container exited; log:\n{engine.logs(container)}"
        waited = time.monotonic() - started
        assert waited < timeout_s, f"not healthy in {timeout_s}s:\n{engine.logs(container)}"
        time.sleep(5)


def _wait_job(api: str, name: str, timeout_s: float = 300) -> dict:
    deadline = time.monotonic() + timeout_s
    while True:
        job = httpx.get(f"{api}/jobs/{name}", timeout=5).json()
        if job["status"] == "finished":
            return job
        assert job["status"] != "failed", job
        assert time.monotonic() < deadline, f"job {name} not finished: {job}"
        time.sleep(1)


def test_the_image_runs_backfills_restarts_and_stops_cleanly(engine, capsys):
    from deltalake import DeltaTable

    from source_backfill.verify import check_exactly_once

    image = engine.image("SOURCE_BACKFILL_TEST_APP_IMAGE")
    inspected = json.loads(engine.run("image", "inspect", image).stdout)[0]
    assert inspected["Config"]["User"] == "10001:10001"
    assert inspected["Healthcheck"]["Test"][0] == "CMD"  # kept: built with --format docker

    net = engine.name("network", "sb-image")
    engine.run("network", "create", net)
    kafka, kafka_port = engine.name("container", "sb-image-kafka"), free_port()
    engine.run("run", "-d", "--name", kafka, "--network", net, "--network-alias", "broker",
               "-p", f"127.0.0.1:{kafka_port}:9094", *kafka_env(kafka_port),
               engine.image("SOURCE_BACKFILL_KAFKA_IMAGE"))
    bootstrap = f"127.0.0.1:{kafka_port}"
    wait_kafka(bootstrap)
    create_and_fill(bootstrap, "events", 4, RECORDS)  # the topic of the image's config (deploy/image)

    volume = engine.name("volume", "sb-image-data")
    engine.run("volume", "create", volume)
    app, api_port, metrics_port = engine.name("container", "sb-image-app"), free_port(), free_port()
    started = time.monotonic()
    engine.run("run", "-d", "--name", app, "--network", net,
               "-p", f"127.0.0.1:{api_port}:8080", "-p", f"127.0.0.1:{metrics_port}:9108",
               "-e", "KAFKA_BOOTSTRAP_SERVERS=broker:9092", "-e", f"SOURCE_BACKFILL_API__TOKEN={TOKEN}",
               "-v", f"{volume}:/var/lib/source-backfill", image)
    api = f"http://127.0.0.1:{api_port}"
    healthy_s = _wait_healthy(engine, app)
    assert engine.run("exec", app, "id", "-u").stdout.strip() == "10001"
    assert httpx.get(f"{api}/health", timeout=5).status_code == 200
    metrics = httpx.get(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5)
    assert metrics.status_code == 200 and "source_backfill_" in metrics.text

    # a job through the API: refused without the token, taken with it, backfilled onto the volume
    spec = {"name": "events-history", "source": "events",
            "sink_path": "/var/lib/source-backfill/tables/events-history"}
    assert httpx.post(f"{api}/jobs", json=spec, timeout=10).status_code == 401
    created = httpx.post(f"{api}/jobs", json=spec, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30)
    assert created.status_code == 201, created.text
    job = _wait_job(api, "events-history")
    assert job["rows_history"] >= RECORDS
    backfilled_s = time.monotonic() - started

    mount = engine.run("volume", "inspect", "--format", "{{.Mountpoint}}", volume).stdout.strip()
    table = f"{mount}/tables/events-history"
    report = check_exactly_once(table, bootstrap, ["events"])
    assert report.ok, report.summary()
    rows = DeltaTable(table).to_pyarrow_table().num_rows
    assert rows == RECORDS
    import os

    assert os.stat(table).st_uid == 10001  # written by the image's user
    assert os.path.isfile(f"{mount}/state/mutations.jsonl")  # the state is on the volume too

    # restart: the same state (the job, finished, its table) from the volume
    t = time.monotonic()
    engine.run("restart", "-t", str(STOP_GRACE_S), app, timeout=120)
    restart_s = time.monotonic() - t
    _wait_healthy(engine, app)
    again = httpx.get(f"{api}/jobs/events-history", timeout=5).json()
    assert again["status"] == "finished" and again["rows_history"] == job["rows_history"], again
    assert DeltaTable(table).to_pyarrow_table().num_rows == RECORDS

    # SIGTERM (the image's STOPSIGNAL): a clean exit within the daemon's shutdown timeout
    t = time.monotonic()
    engine.run("stop", "-t", str(STOP_GRACE_S), app, timeout=120)
    stop_s = time.monotonic() - t
    state = json.loads(engine.run("inspect", app).stdout)[0]["State"]
    assert state["ExitCode"] == 0, engine.logs(app)
    assert stop_s < SHUTDOWN_TIMEOUT_S, f"stop took {stop_s:.1f}s"
    assert "daemon stopped" in engine.logs(app, 20000)
    engine.run("stop", "-t", "10", kafka)
    with capsys.disabled():
        print(f"\nimage: healthy after {healthy_s:.0f}s, job finished {backfilled_s:.0f}s after start, "  # noqa: T201
              f"restart {restart_s:.1f}s, stop on SIGTERM {stop_s:.1f}s")


def test_the_stand_in_is_the_release_and_python_of_the_dockerfiles_default_base(engine):
    """The Dockerfile's default base and the stand-in it is built on here: same Debian release and Python."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    default = re.search(r"^ARG BASE_IMAGE=(\S+)$", (root / "Dockerfile").read_text(), re.M).group(1)
    release = re.search(r"^RELEASE=(\w+)", (root / "deploy/containers/setup.sh").read_text(), re.M).group(1)
    assert default == f"python:3.11-slim-{release}"
    stand_in = engine.image("SOURCE_BACKFILL_TEST_PYTHON_IMAGE")
    assert stand_in.endswith(f":3.11-slim-{release}")
    out = engine.run("run", "--rm", stand_in, "sh", "-c",
                     ". /etc/os-release; echo $VERSION_CODENAME; python --version; pip --version").stdout
    codename, python, pip = out.splitlines()[:3]
    assert codename == release
    assert python.startswith("Python 3.11.")
    assert "python 3.11" in pip
