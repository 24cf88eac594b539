"""The test kit's broker order without an engine or a broker: ``KAFKA_BOOTSTRAP_SERVERS`` → a container →
the embedded broker (tests/containers/test_testcontainers.py takes the container branches for real)."""

from __future__ import annotations

import re
import warnings
from contextlib import contextmanager
from pathlib import Path

import pytest

import source_backfill.testing as kit

ROOT = Path(__file__).resolve().parents[2]


class _FakeEmbedded:
    bootstrap = "127.0.0.1:1"

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return None


@pytest.fixture
def no_embedded(monkeypatch):
    import connectors.kafka.embedded as embedded

    monkeypatch.setattr(embedded, "EmbeddedBroker", _FakeEmbedded)


def test_the_environment_wins_and_nothing_is_started(monkeypatch):
    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", "broker.test:9092")
    monkeypatch.setattr(kit, "_docker_answers", lambda: pytest.fail("the engine was asked"))
    with kit.kafka_broker() as bootstrap:
        assert bootstrap == "broker.test:9092"


def test_no_engine_means_the_embedded_broker_silently(monkeypatch, no_embedded):
    monkeypatch.delenv("KAFKA_BOOTSTRAP_SERVERS", raising=False)
    monkeypatch.setattr(kit, "_docker_answers", lambda: False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with kit.kafka_broker() as bootstrap:
            assert bootstrap == _FakeEmbedded.bootstrap


def test_an_engine_with_the_image_means_a_container(monkeypatch, no_embedded):
    monkeypatch.delenv("KAFKA_BOOTSTRAP_SERVERS", raising=False)
    monkeypatch.setenv("SOURCE_BACKFILL_KAFKA_IMAGE", "localhost/kafka-of-the-setting:1")
    monkeypatch.setattr(kit, "_docker_answers", lambda: True)
    monkeypatch.setattr(kit, "_image_missing", lambda image: None)
    started = []

    @contextmanager
    def container(image):
        started.append(image)
        yield "localhost:12345"

    monkeypatch.setattr(kit, "kafka_container", container)
    with kit.kafka_broker() as bootstrap:
        assert bootstrap == "localhost:12345"
    assert started == ["localhost/kafka-of-the-setting:1"]


def test_an_engine_without_the_image_falls_back_in_one_line(monkeypatch, no_embedded):
    monkeypatch.delenv("KAFKA_BOOTSTRAP_SERVERS", raising=False)
    monkeypatch.delenv("SOURCE_BACKFILL_KAFKA_IMAGE", raising=False)
    monkeypatch.setattr(kit, "_docker_answers", lambda: True)
    monkeypatch.setattr(kit, "_image_missing", lambda image: "pull access denied\n(no registry)")
    with pytest.warns(UserWarning) as caught:
        with kit.kafka_broker() as bootstrap:
            assert bootstrap == _FakeEmbedded.bootstrap
    assert len(caught) == 1
    line = str(caught[0].message)
    assert "\n" not in line
    assert kit.KAFKA_IMAGE in line and "using the embedded broker instead" in line


def test_the_default_image_is_the_broker_version_the_project_pins():
    pom = (ROOT / "deploy" / "jvm" / "pom.xml").read_text()
    version = re.search(r"<kafka.version>(.+)</kafka.version>", pom).group(1)
    assert kit.KAFKA_IMAGE == f"apache/kafka:{version}"
