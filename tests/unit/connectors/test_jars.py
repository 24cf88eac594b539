"""Where the JVM jars are (connectors/jars.py): names, the cache's stamp, and errors that say which command
fetches them."""

from __future__ import annotations

import pytest

from connectors import jars
from source_backfill.errors import JvmDependencyError


@pytest.mark.parametrize(("jar", "name"), [
    ("jackson-core-2.18.2.jar", "jackson-core"),
    ("spark-sql-kafka-0-10_2.13-4.2.0.jar", "spark-sql-kafka-0-10_2.13"),
    ("delta-spark_4.2_2.13-4.4.0.jar", "delta-spark_4.2_2.13"),
    ("zstd-jni-1.5.7-3.jar", "zstd-jni"),
    ("kafka_2.13-4.1.1.jar", "kafka_2.13"),
])
def test_artifact_name_drops_only_the_version(jar, name):
    assert jars.artifact_name(jar) == name


def test_missing_jars_name_the_command_that_fetches_them(tmp_path, monkeypatch):
    monkeypatch.setenv("SOURCE_BACKFILL_JARS", str(tmp_path))
    with pytest.raises(JvmDependencyError, match="make jars"):
        jars.broker_classpath()
    (tmp_path / "broker").mkdir()
    (tmp_path / "broker" / "kafka_2.13-4.1.1.jar").touch()
    with pytest.raises(JvmDependencyError, match="make jars"):  # no stamp: a fetch did not finish
        jars.broker_classpath()


def test_a_stamp_from_another_pom_means_fetch_again(tmp_path, monkeypatch):
    monkeypatch.setenv("SOURCE_BACKFILL_JARS", str(tmp_path))
    folder = tmp_path / "broker"
    folder.mkdir()
    (folder / "kafka_2.13-4.1.1.jar").touch()
    (folder / ".fetched").write_text("0123456789abcdef\n")
    assert not jars.fetched("broker")
    assert jars.broker_classpath().endswith("kafka_2.13-4.1.1.jar")  # usable, but a fetch refreshes it


def test_the_pom_pins_the_wheels_installed():
    props = jars.pom_properties()
    from importlib import metadata

    assert props["spark.version"] == metadata.version("pyspark")
    assert props["delta.version"] == metadata.version("delta-spark")
    assert props["delta.spark.binary"] == ".".join(props["spark.version"].split(".")[:2])
    jars.check_wheels()


def test_a_wheel_that_does_not_match_the_pom_is_refused(monkeypatch):
    real = jars.metadata.version
    monkeypatch.setattr(jars.metadata, "version", lambda d: "9.9.9" if d == "pyspark" else real(d))
    with pytest.raises(JvmDependencyError, match="pyspark 9.9.9 is installed but .* pins spark.version"):
        jars.check_wheels()
