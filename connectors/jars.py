"""Where the JVM parts are: Spark's Kafka connector, delta-spark and the Apache Kafka broker.

They are pinned in one file, ``deploy/jvm/pom.xml``, and fetched from Maven Central by
``python -m source_backfill.runtime.jvm fetch`` (``make jars``, which ``make run`` and ``make test`` call)
into a cache folder, ``var/jvm/`` of the checkout unless ``SOURCE_BACKFILL_JARS`` names another (the
container image bakes them in at build time). Two sets, in two sub-folders:

* ``spark/``: jars added to every Spark session of the project (:func:`spark_jars`); jars that pyspark
  already ships (Hadoop, Jackson, Parquet, Scala, ...) are left out, so Spark's own versions win;
* ``broker/``: the classpath of the embedded Apache Kafka broker (:func:`broker_classpath`).

This module only finds them (the embedded broker of :mod:`connectors.kafka.embedded` and the Spark
session of :mod:`source_backfill.runtime.spark` both need it); :mod:`source_backfill.runtime.jvm` fetches
them. A missing jar raises :class:`JvmDependencyError` naming the command that fetches it.
"""

from __future__ import annotations

import hashlib
import os
import re
import xml.etree.ElementTree as ET  # noqa: S405 - our own pom, not untrusted input
from importlib import metadata
from pathlib import Path

from source_backfill.errors import JvmDependencyError

ROOT = Path(__file__).resolve().parents[1]
POM = Path(os.environ.get("SOURCE_BACKFILL_JVM_POM", ROOT / "deploy" / "jvm" / "pom.xml"))
PROFILES = ("spark", "broker")
FETCH_HINT = "make jars  (or: python -m source_backfill.runtime.jvm fetch)"
#: The file a finished fetch leaves in a profile's folder: the pom's fingerprint.
STAMP = ".fetched"
_VERSION = re.compile(r"-\d+\.\d+.*\.jar$")


def jars_root() -> Path:
    """The cache folder holding ``spark/`` and ``broker/``."""
    return Path(os.environ.get("SOURCE_BACKFILL_JARS") or ROOT / "var" / "jvm")


def pom_properties(pom: Path = POM) -> dict[str, str]:
    """The ``<properties>`` of the pom (the pinned versions)."""
    ns = {"m": "http://maven.apache.org/POM/4.0.0"}
    props = ET.parse(pom).getroot().find("m:properties", ns)  # noqa: S314
    if props is None:
        return {}
    return {el.tag.split("}", 1)[-1]: (el.text or "").strip() for el in props}


def artifact_name(jar: str) -> str:
    """``jackson-core-2.18.2.jar`` -> ``jackson-core`` (the Maven artifact id, version dropped)."""
    return _VERSION.sub("", jar)


def pom_fingerprint() -> str:
    """What a profile's :data:`STAMP` holds once fetched from the current pom."""
    return hashlib.sha256(POM.read_bytes()).hexdigest()[:16] if POM.exists() else "no-pom"


def profile_folder(profile: str) -> Path:
    """The folder of ``profile``'s jars in the cache."""
    return jars_root() / profile


def fetched(profile: str) -> bool:
    """True when ``profile``'s jars are in the cache (fetched from the current pom, if it is here)."""
    stamp = profile_folder(profile) / STAMP
    if not stamp.exists():
        return False
    return not POM.exists() or stamp.read_text().strip() == pom_fingerprint()


def _jars(profile: str) -> list[Path]:
    folder = profile_folder(profile)
    jars = sorted(folder.glob("*.jar")) if (folder / STAMP).exists() else []
    if not jars:
        msg = f"the {profile} jars are missing from {folder}; fetch them with: {FETCH_HINT}"
        raise JvmDependencyError(msg)
    return jars


def spark_jars() -> list[Path]:
    """The jars every Spark session of the project adds (``spark.jars``)."""
    check_wheels()
    return _jars("spark")


def broker_classpath() -> str:
    """The classpath of the embedded Apache Kafka broker."""
    return os.pathsep.join(str(j) for j in _jars("broker"))


def check_wheels() -> None:
    """The pyspark and delta-spark wheels have the versions the pom pins (else the jars do not fit)."""
    if not POM.exists():
        return
    props = pom_properties()
    for dist, key in (("pyspark", "spark.version"), ("delta-spark", "delta.version")):
        try:
            have = metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
        if props.get(key) and have != props[key]:
            msg = (f"{dist} {have} is installed but {POM} pins {key}={props[key]}; install "
                   f"{dist}=={props[key]} (pyproject.toml) or change the pom, then run: {FETCH_HINT}")
            raise JvmDependencyError(msg)
