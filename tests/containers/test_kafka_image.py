"""The apache/kafka stand-in's launcher reads settings as the official image does (env to properties)."""

from __future__ import annotations

import pytest

pytestmark = [pytest.mark.containers]


def test_the_launcher_turns_kafka_variables_into_properties_as_apache_kafka_does(engine):
    image = engine.image("SOURCE_BACKFILL_KAFKA_IMAGE")
    env = {"KAFKA_NODE_ID": "7", "KAFKA_PROCESS_ROLES": "broker,controller",
           "KAFKA_LOG_RETENTION_MS": "1000", "KAFKA_SOME__UNDER__SCORED": "u", "KAFKA_SOME___DASHED": "d",
           "KAFKA_HEAP_OPTS": "-Xmx64m"}  # a JVM option, not a property
    args = [a for k, v in env.items() for a in ("-e", f"{k}={v}")]
    # the launcher writes the file, then the format step fails on the missing settings: print it anyway
    out = engine.run("run", "--rm", *args, image, "bash", "-c",
                     "/etc/kafka/docker/run >/dev/null 2>&1; cat /opt/kafka/config/server.properties").stdout
    props = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
    assert props["node.id"] == "7"
    assert props["process.roles"] == "broker,controller"
    assert props["log.retention.ms"] == "1000"
    assert props["some_under_scored"] == "u"
    assert props["some-dashed"] == "d"
    assert "heap.opts" not in props
    assert props["log.dirs"] == "/tmp/kraft-combined-logs"  # the official image's default


def test_without_settings_it_runs_the_default_single_node(engine):
    image = engine.image("SOURCE_BACKFILL_KAFKA_IMAGE")
    out = engine.run("run", "--rm", image, "bash", "-c",
                     "timeout 60 /etc/kafka/docker/run & sleep 1; "
                     "for i in $(seq 60); do kafka-broker-api-versions.sh --bootstrap-server localhost:9092 "
                     ">/dev/null 2>&1 && break; sleep 1; done; "
                     "kafka-topics.sh --bootstrap-server localhost:9092 --create --topic t1 --partitions 2; "
                     "kafka-topics.sh --bootstrap-server localhost:9092 --list", timeout=180).stdout
    assert "Created topic t1." in out and "t1" in out.splitlines()[-1], out[-2000:]
