"""deploy/compose/compose.yaml, up with podman-compose (PyPI) on podman, with the stand-in images.

``podman-compose -f deploy/compose/compose.yaml -f deploy/compose/compose.standins.yaml up -d``: the
override names the local images (compose.yaml is the user's, unchanged) and leaves Grafana out (no image can
be made from Debian's packages; its provisioning is checked by tests/integration/deploy). A project name of
its own, so a user's stack of the same file is not touched. The stack publishes compose.yaml's ports (9094,
8080, 9108, 9090): they must be free.

Debian 12's podman (4.3) has two gaps podman-compose meets: it cannot start a container whose
``--requires`` (podman-compose's form of ``depends_on``) lead to an exited one (kafka-init: "generating
dependency graph ... not found in input list"), and it has no ``podman wait --condition=healthy``. So
the services are brought up in compose.yaml's order with ``up -d --no-deps SERVICE``, the test waiting
for each ``depends_on`` condition itself: kafka healthy (its healthcheck, run with ``podman healthcheck
run``: podman's health timers need systemd), kafka-init exited 0, then the daemon and Prometheus.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import httpx
import pytest

from tests.containers.kafka import wait_kafka

pytestmark = [pytest.mark.containers]

ROOT = Path(__file__).resolve().parents[2]
FILES = ["-f", str(ROOT / "deploy/compose/compose.yaml"),
         "-f", str(ROOT / "deploy/compose/compose.standins.yaml")]
TOKEN = "compose-test-t0ken"
PORTS = (9094, 8080, 9108, 9090)


def _port_taken(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


def _compose(engine, project: str, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    env = {**engine.env, "SOURCE_BACKFILL_API_TOKEN": TOKEN}
    return subprocess.run(  # noqa: S603 - podman-compose of this interpreter's environment
        [sys.executable, "-m", "podman_compose", "-p", project, *FILES, *args], cwd=ROOT, env=env,
        capture_output=True, text=True, timeout=timeout, check=False,
    )


def _up(engine, project: str, *services: str) -> None:
    up = _compose(engine, project, "up", "-d", "--no-deps", *services)
    assert up.returncode == 0, (up.stdout + up.stderr)[-4000:]


def _container(engine, project: str, service: str) -> str:
    names = engine.run("ps", "-a", "--filter", f"label=io.podman.compose.project={project}", "--filter",
                       f"label=io.podman.compose.service={service}", "--format", "{{.Names}}").stdout.split()
    assert len(names) == 1, (service, names)
    return names[0]


def _healthy(engine, container: str, timeout_s: float) -> float:
    started = time.monotonic()
    while engine.run("healthcheck", "run", container, check=False).returncode != 0:
        assert time.monotonic() - started < timeout_s, f"{container} not healthy:\n{engine.logs(container)}"
        time.sleep(5)
    return time.monotonic() - started


def test_the_compose_stack_runs_scrapes_and_loads_its_alerts(engine, capsys):
    taken = [p for p in PORTS if _port_taken(p)]
    assert not taken, f"compose.yaml publishes ports {taken}, which something on this machine holds"
    project = f"sbcompose{uuid.uuid4().hex[:6]}"
    started = time.monotonic()
    try:
        # compose.yaml's order and conditions: kafka healthy, kafka-init exited 0, the daemon, prometheus
        _up(engine, project, "kafka")
        kafka = _container(engine, project, "kafka")
        kafka_s = _healthy(engine, kafka, 180)  # compose.yaml's kafka-broker-api-versions.sh check
        _up(engine, project, "kafka-init")
        init = _container(engine, project, "kafka-init")
        assert engine.run("wait", init, timeout=180).stdout.strip() == "0", engine.logs(init)
        _up(engine, project, "source-backfill", "prometheus")
        names = engine.run("ps", "-a", "--filter", f"label=io.podman.compose.project={project}",
                           "--format", "{{.Names}}").stdout.split()
        assert len(names) == 4, names  # grafana is left out by the override
        by_service = {s: _container(engine, project, s) for s in ("kafka", "source-backfill", "prometheus")}
        wait_kafka("127.0.0.1:9094")
        daemon_s = _healthy(engine, by_service["source-backfill"], 300)  # its /ready check
        ready_s = time.monotonic() - started

        # records produced from the host (localhost:9094) reach the configured job's table
        records = 500
        _produce_to(records)
        deadline = time.monotonic() + 180
        while True:
            job = httpx.get("http://127.0.0.1:8080/jobs/events-copy", timeout=5).json()
            if job["rows_history"] + job["rows_live"] >= records:
                break
            assert time.monotonic() < deadline, job
            time.sleep(2)

        # Prometheus: the daemon's target up, the alert rules loaded
        deadline = time.monotonic() + 120
        while True:
            targets = httpx.get("http://127.0.0.1:9090/api/v1/targets", timeout=5).json()["data"]
            health = {t["labels"].get("job"): t["health"] for t in targets["activeTargets"]}
            if health.get("source-backfill") == "up":
                break
            assert time.monotonic() < deadline, targets
            time.sleep(2)
        rules = httpx.get("http://127.0.0.1:9090/api/v1/rules", timeout=5).json()["data"]["groups"]
        assert rules and all(g["rules"] for g in rules), rules
        alerts = {r["name"] for g in rules for r in g["rules"] if r["type"] == "alerting"}
        assert alerts, rules
        prometheus = "http://127.0.0.1:9090/api/v1"
        version = httpx.get(f"{prometheus}/status/buildinfo", timeout=5).json()["data"]["version"]
        up_value = httpx.get(f"{prometheus}/query", params={"query": 'up{job="source-backfill"}'},
                             timeout=5).json()["data"]["result"]
        assert up_value and up_value[0]["value"][1] == "1", up_value
    finally:
        down = _compose(engine, project, "down", "-v", "-t", "45")
    assert down.returncode == 0, (down.stdout + down.stderr)[-3000:]
    left = engine.run("ps", "-a", "--filter", f"label=io.podman.compose.project={project}", "--format",
                      "{{.Names}}").stdout.split()
    assert left == []
    with capsys.disabled():
        print(f"\ncompose: kafka healthy {kafka_s:.0f}s, daemon ready {daemon_s:.0f}s later, stack ready in "  # noqa: T201
              f"{ready_s:.0f}s; Prometheus {version}, {len(alerts)} alert rules; "
              f"whole test {time.monotonic() - started:.0f}s")


def _produce_to(records: int) -> None:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": "127.0.0.1:9094", "linger.ms": 5, "log_level": 3})
    try:
        for i in range(records):
            producer.produce("events", value=f'{{"n": {i}}}'.encode())
        assert producer.flush(30) == 0
    finally:
        del producer

