"""A job's table inside the embedded broker's log folder bricked the next start; now it is refused."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import write_deltalake

from connectors.kafka.embedded import EmbeddedBroker
from source_backfill.config import JobSpec
from source_backfill.errors import SinkPathError
from source_backfill.runtime.registry import JobRegistry

pytestmark = pytest.mark.integration


def test_a_sink_in_the_brokers_log_folder_is_refused_and_the_broker_restarts(tmp_path: Path) -> None:
    state = tmp_path / "state"
    EmbeddedBroker(log_dir=state / "kafka").start().stop()  # the daemon's embedded broker, formatted
    sink = state / "kafka" / "data" / "t"
    registry = JobRegistry(state, ["events"])
    refused = False
    try:
        registry.create(JobSpec(name="t", source="events", sink_path=str(sink)))
    except SinkPathError:
        refused = True
    else:  # what the job's first epoch commits there: a Delta table among Kafka's partition folders
        write_deltalake(str(sink), pa.table({"x": [1]}))
    finally:
        registry.close()
    registry = JobRegistry(state, ["events"])  # the restart
    registry.close()
    # before sinks were checked against the state, Kafka exited here: "t" is not a topic-partition folder
    EmbeddedBroker(log_dir=state / "kafka").start().stop()
    assert refused and not sink.exists()
