"""The Spark conf a daemon asks for: the table daemon's collector, the user's conf over it."""

from __future__ import annotations

from source_backfill.runtime.spark import DEFAULT_CONF, TABLE_DAEMON_CONF, daemon_conf

JAVA = "spark.driver.extraJavaOptions"


def test_a_daemon_of_table_copies_alone_runs_the_serial_collector_on_a_tight_heap():
    conf = daemon_conf({}, kafka=False)
    assert "-XX:+UseSerialGC" in conf[JAVA] and "-XX:MaxHeapFreeRatio=20" in conf[JAVA]


def test_a_daemon_with_a_kafka_source_keeps_the_jvm_default_collector():
    # its live stream commits every trigger: no stop-the-world collection of the whole heap
    assert JAVA not in daemon_conf({}, kafka=True)
    assert JAVA not in DEFAULT_CONF


def test_the_users_spark_conf_wins_over_the_table_daemons():
    mine = {JAVA: "-XX:+UseG1GC", "spark.driver.memory": "1g"}
    assert daemon_conf(mine, kafka=False) == mine
    assert daemon_conf({"spark.driver.memory": "1g"}, kafka=False) == {**TABLE_DAEMON_CONF,
                                                                        "spark.driver.memory": "1g"}
