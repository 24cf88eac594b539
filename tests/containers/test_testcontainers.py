"""The test kit's testcontainers path, for real: podman's Docker-compatible API as ``DOCKER_HOST``.

testcontainers' reaper (Ryuk) is turned off here (``TESTCONTAINERS_RYUK_DISABLED=true``): its image cannot
be pulled (no registry), and it needs the engine's socket mounted into a privileged container; the kit
removes its Kafka container itself when the session ends (and labels it ``io.source-backfill.test-kit``,
so a run killed before that leaves containers this module finds and removes).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest

pytestmark = [pytest.mark.containers]

ROOT = Path(__file__).resolve().parents[2]
LABEL = "io.source-backfill.test-kit"


@pytest.fixture
def docker_env(engine, podman_socket, monkeypatch):
    """This process as a user's test session with podman's socket as its Docker engine."""
    from testcontainers.core.config import testcontainers_config

    monkeypatch.delenv("KAFKA_BOOTSTRAP_SERVERS", raising=False)
    monkeypatch.setenv("DOCKER_HOST", podman_socket)
    monkeypatch.setenv("TESTCONTAINERS_RYUK_DISABLED", "true")
    monkeypatch.setattr(testcontainers_config, "ryuk_disabled", True)
    yield engine
    _remove_kit_containers(engine)


def _kit_containers(engine) -> list[str]:
    done = engine.run("ps", "-a", "--filter", f"label={LABEL}", "--format", "{{.Names}}")
    return done.stdout.split()


def _remove_kit_containers(engine) -> None:
    for name in _kit_containers(engine):
        engine.run("rm", "-f", "-t", "0", name, check=False)


def test_the_container_path_starts_the_kafka_image_of_the_setting(docker_env, monkeypatch):
    from confluent_kafka.admin import AdminClient, NewTopic

    from source_backfill.testing import kafka_broker

    image = docker_env.image("SOURCE_BACKFILL_KAFKA_IMAGE")  # the stand-in of apache/kafka
    monkeypatch.setenv("SOURCE_BACKFILL_KAFKA_IMAGE", image)
    started = time.monotonic()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no fallback warning on this path
        with kafka_broker() as bootstrap:
            up_s = time.monotonic() - started
            assert _kit_containers(docker_env), "no container labelled by the kit runs"
            admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 0})
            admin.create_topics([NewTopic("kit-order", 2)])["kit-order"].result(30)
            # the controller has committed the topic; the broker's metadata follows a moment later (once,
            # in CI, a query right after the creation listed no topic), so it is asked until it shows
            for _ in range(20):
                if "kit-order" in admin.list_topics(timeout=10).topics:
                    break
                time.sleep(0.5)
            assert "kit-order" in admin.list_topics(timeout=10).topics
            del admin
    assert _kit_containers(docker_env) == []  # removed on exit
    print(f"\ntestcontainers: Kafka container answered in {up_s:.1f}s")  # noqa: T201


def test_an_engine_without_the_image_falls_back_to_the_embedded_broker_in_one_line(docker_env, monkeypatch):
    from source_backfill.testing import kafka_broker

    # an image no engine has and no registry serves (here the default, apache/kafka, could not be pulled
    # either; a name that cannot exist keeps the test the same on a machine with a registry)
    monkeypatch.setenv("SOURCE_BACKFILL_KAFKA_IMAGE", "localhost/no-such-kafka:0")
    started = time.monotonic()
    with pytest.warns(UserWarning, match=r"cannot be had .*; using the embedded broker instead") as caught:
        with kafka_broker() as bootstrap:
            assert bootstrap.startswith("127.0.0.1:")
            assert _kit_containers(docker_env) == []
    lines = [str(w.message) for w in caught if "embedded broker" in str(w.message)]
    assert len(lines) == 1 and "\n" not in lines[0], lines
    print(f"\nfallback: {time.monotonic() - started:.1f}s; {lines[0]}")  # noqa: T201


def test_the_example_passes_on_the_testcontainers_path_as_a_user_runs_it(engine, podman_socket, tmp_path):
    image = engine.image("SOURCE_BACKFILL_KAFKA_IMAGE")
    env = {k: v for k, v in os.environ.items() if k != "KAFKA_BOOTSTRAP_SERVERS"}
    env |= {"PYTHONPATH": str(ROOT), "DOCKER_HOST": podman_socket, "SOURCE_BACKFILL_KAFKA_IMAGE": image,
            "TESTCONTAINERS_RYUK_DISABLED": "true"}
    since = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(time.time() - 1))
    started = time.monotonic()
    done = subprocess.run(  # noqa: S603 - the documented command for the example, in a fresh folder
        [sys.executable, "-m", "pytest", "-p", "source_backfill.testing", "-q", "-p", "no:cacheprovider",
         "--rootdir", str(tmp_path), str(ROOT / "examples" / "test_my_pipeline.py")],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900, check=False,
    )
    took = time.monotonic() - started
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-4000:]
    assert "1 passed" in done.stdout, out[-3000:]
    assert "embedded broker instead" not in out
    assert "Connection refused" not in out
    # the broker was a container of the stand-in image, started by the kit, and is gone. The engine's
    # event log is asked until the start shows (once, in CI, a query right after the run returned none)
    def started_images() -> list[str]:
        return engine.run("events", "--since", since, "--stream=false", "--filter", "event=start",
                          "--filter", f"label={LABEL}=kafka", "--format", "{{.Image}}").stdout.split()

    for _ in range(10):
        events = started_images()
        if image in events or image.removeprefix("localhost/") in " ".join(events):
            break
        time.sleep(1)
    assert image in events or image.removeprefix("localhost/") in " ".join(events), events
    assert _kit_containers(engine) == []
    print(f"\nexample on testcontainers: {took:.0f}s")  # noqa: T201
