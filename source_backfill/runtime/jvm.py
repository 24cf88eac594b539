"""Where the JVM parts are: Spark's Kafka connector, delta-spark and the Apache Kafka broker.

They are pinned in one file, ``deploy/jvm/pom.xml``, and fetched from Maven Central by
``python -m source_backfill.runtime.jvm fetch`` (``make jars``, which ``make run`` and ``make test`` call)
into a cache folder, ``var/jvm/`` of the checkout unless ``SOURCE_BACKFILL_JARS`` names another (the
container image bakes them in at build time). Two sets, in two sub-folders:

* ``spark/``: jars added to every Spark session of the project (:func:`spark_jars`); jars that pyspark
  already ships (Hadoop, Jackson, Parquet, Scala, ...) are left out, so Spark's own versions win;
* ``broker/``: the classpath of the embedded Apache Kafka broker (:func:`broker_classpath`).

After the first fetch nothing needs the network: a fetch whose stamp matches the pom does nothing.
A missing jar raises :class:`JvmDependencyError` naming the command that fetches it.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET  # noqa: S405 - our own pom, not untrusted input
from importlib import metadata
from pathlib import Path

from source_backfill.errors import JvmDependencyError

logger = logging.getLogger(__name__)

ROOT = Path(__file__).resolve().parents[2]
POM = Path(os.environ.get("SOURCE_BACKFILL_JVM_POM", ROOT / "deploy" / "jvm" / "pom.xml"))
PROFILES = ("spark", "broker")
FETCH_HINT = "make jars  (or: python -m source_backfill.runtime.jvm fetch)"
_STAMP = ".fetched"
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


def _fingerprint() -> str:
    return hashlib.sha256(POM.read_bytes()).hexdigest()[:16] if POM.exists() else "no-pom"


def _folder(profile: str) -> Path:
    return jars_root() / profile


def fetched(profile: str) -> bool:
    """True when ``profile``'s jars are in the cache (fetched from the current pom, if it is here)."""
    stamp = _folder(profile) / _STAMP
    if not stamp.exists():
        return False
    return not POM.exists() or stamp.read_text().strip() == _fingerprint()


def _jars(profile: str) -> list[Path]:
    folder = _folder(profile)
    jars = sorted(folder.glob("*.jar")) if (folder / _STAMP).exists() else []
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


def _pyspark_jars() -> set[str]:
    import pyspark

    folder = Path(pyspark.__file__).parent / "jars"
    return {artifact_name(p.name) for p in folder.glob("*.jar")}


def fetch(profiles: tuple[str, ...] = PROFILES, force: bool = False) -> None:
    """Copy each profile's jars from Maven into the cache (a no-op when the stamp matches the pom)."""
    if not POM.exists():
        msg = f"{POM} is missing: the pinned JVM dependencies come from it"
        raise JvmDependencyError(msg)
    mvn = shutil.which("mvn")
    for profile in profiles:
        if fetched(profile) and not force:
            continue
        if mvn is None:
            msg = "Maven (mvn) is not on PATH; it fetches the JVM dependencies listed in " + str(POM)
            raise JvmDependencyError(msg)
        target = _folder(profile)
        target.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{profile}-", dir=target.parent))
        try:
            cmd = [mvn, "-q", "-B", "-f", str(POM), "-P", profile, "dependency:copy-dependencies",
                   "-DincludeScope=runtime", f"-DoutputDirectory={staging}"]
            done = subprocess.run(cmd, capture_output=True, text=True, check=False)
            if done.returncode != 0:
                out = done.stdout[-3000:]
                msg = f"mvn could not fetch the {profile} jars (exit {done.returncode}):\n{out}"
                raise JvmDependencyError(msg)
            if profile == "spark":
                shipped = _pyspark_jars()
                for jar in staging.glob("*.jar"):
                    if artifact_name(jar.name) in shipped:
                        jar.unlink()
            (staging / _STAMP).write_text(_fingerprint() + "\n")
            # mkdtemp made it 0700: readable by its owner only, the jars would be unreadable to any other
            # user (the image fetches them as root and runs as uid 10001: PermissionError on .fetched)
            staging.chmod(0o755)
            if target.exists():
                shutil.rmtree(target)
            staging.rename(target)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        logger.info('jvm jars fetched profile="%s" jars="%d" folder="%s"',
                    profile, len(list(target.glob("*.jar"))), target)


def main(argv: list[str] | None = None) -> int:
    """``python -m source_backfill.runtime.jvm fetch [--force] | path``."""
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["fetch"]:
        logging.basicConfig(level=logging.INFO, format="%(message)s")
        try:
            fetch(force="--force" in args)
        except JvmDependencyError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
        print(f"JVM jars ready in {jars_root()}")
        return 0
    if args[:1] == ["path"]:
        print(jars_root())
        return 0
    print("usage: python -m source_backfill.runtime.jvm fetch [--force] | path", file=sys.stderr)
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
