"""A dead-letter Avro job SIGKILLed at random moments: every offset in exactly one of its two tables.

The crash suite's way (``tests/chaos``), on one job: the daemon as a real process, a topic of Avro records
1 % of which are cut short, the job rate limited so its backfill spans the cycles, the process group
killed after a delay drawn from the seed (printed), restarted, killed again — during its history reads,
between its dead-letter table's commit and its own, while a live tail arrives. At the end the job
catches up and the union of the two tables must hold the Kafka log offset by offset, nothing twice.

Slow (``make test-slow``): it needs the registry.
"""

from __future__ import annotations

import os
import random
import time

import pytest

from source_backfill.config import DEAD_LETTER_SUFFIX
from source_backfill.testing.process import DaemonProcess, free_port
from tests.integration.daemon.conftest import both_tables, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(900)]

HISTORY = 20_000
#: History rows/s: 20k take ~20 s of daemon uptime, spread over the cycles.
RATE = 1_000
CYCLES = 4


def test_dead_letters_and_rows_exactly_once_through_kills(avro_topic, kafka_bootstrap, tmp_path):
    seed = int(os.environ.get("CHAOS_SEED") or random.randrange(1 << 30))
    print(f"avro crash seed={seed}")  # noqa: T201 - a failing run is replayed with CHAOS_SEED
    rng = random.Random(seed)
    topic = avro_topic(4)
    topic.send(1, HISTORY, partitions=4, corrupt_every=100)
    main, dead = tmp_path / "dl", tmp_path / f"dl{DEAD_LETTER_SUFFIX}"
    config = tmp_path / "config.toml"
    config.write_text(f"""
[daemon]
state_root = "{tmp_path / 'state'}"
shutdown_timeout_s = 10
[spark]
master = "local[2]"
[metrics]
port = false
[[sources]]
name = "src"
bootstrap_servers = "{kafka_bootstrap}"
topics = ["{topic.topic}"]
trigger_interval_s = 0.5
schema_registry = {{ url = "{topic.registry}" }}
[[jobs]]
name = "dl"
source = "src"
sink_path = "{main}"
rate_limit = {RATE}
max_rows_per_epoch = 2000
format = {{ value = "avro", on_decode_error = "dead_letter" }}
""")
    daemon = DaemonProcess(config, free_port(), tmp_path / "daemon.log",
                           env={"SOURCE_BACKFILL_API__PORT": "0"})
    try:
        for cycle in range(CYCLES):
            daemon.env = {"SOURCE_BACKFILL_API__PORT": str(port := free_port())}
            daemon.url = f"http://127.0.0.1:{port}"
            daemon.start()
            daemon.wait_ready()
            if cycle == CYCLES // 2:
                topic.send(1, 500, partitions=4, corrupt_every=100)  # a live tail among the kills
            time.sleep(rng.uniform(0.5, 6.0))
            daemon.kill()
        daemon.env = {"SOURCE_BACKFILL_API__PORT": str(port := free_port())}
        daemon.url = f"http://127.0.0.1:{port}"
        daemon.start()
        daemon.wait_ready()
        report = wait_for(lambda: (r := both_tables(main, dead, kafka_bootstrap, topic.topic)).ok and r,
                          timeout=300, interval=2.0, what="every offset in exactly one of the two tables")
        assert daemon.stop() == 0
    except BaseException:
        print(daemon.tail(80))  # noqa: T201
        raise
    finally:
        daemon.kill()
    assert sum(s.log_records for s in report.splits.values()) == HISTORY + 500
    from deltalake import DeltaTable

    letters = DeltaTable(str(dead)).to_pyarrow_table(columns=["offset", "error"]).num_rows
    assert letters == (HISTORY + 500) // 100  # each cut record once, whatever the kills
