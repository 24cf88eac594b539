"""The embedded Apache Kafka node: formatting a new log folder whatever cluster id it draws."""

from __future__ import annotations

import uuid

import pytest

from connectors.kafka import embedded
from connectors.kafka.admin import KafkaAdmin
from connectors.kafka.embedded import EmbeddedBroker

pytestmark = pytest.mark.integration


def test_cluster_ids_never_start_with_a_dash(monkeypatch):
    # 0xF8 is the byte whose first six bits encode as "-" in URL-safe base64.
    monkeypatch.setattr(uuid, "uuid4", lambda: uuid.UUID(bytes=b"\xf8" + bytes(15)))
    cid = embedded.new_cluster_id()
    assert len(cid) == 22
    assert not cid.startswith("-")


def test_a_cluster_id_starting_with_a_dash_still_formats_and_starts(monkeypatch, tmp_path):
    # One start in ~32 drew such an id and Kafka's argument parser took it for an option (CI, session 5).
    monkeypatch.setattr(embedded, "new_cluster_id", lambda: "-" + "A" * 21)
    broker = EmbeddedBroker(log_dir=tmp_path / "kafka").start()
    try:
        admin = KafkaAdmin(broker.bootstrap)
        try:
            admin.create_topic("dash", 1)
            assert admin.end_offsets(["dash:0"]) == {"dash:0": 0}
        finally:
            admin.close()  # before its broker stops
    finally:
        broker.stop()
    assert "-" + "A" * 21 in (tmp_path / "kafka" / "data" / "meta.properties").read_text()
