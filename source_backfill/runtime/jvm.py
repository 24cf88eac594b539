"""Fetch the JVM parts: Spark's Kafka connector, delta-spark and the Apache Kafka broker (``make jars``).

They are pinned in one file, ``deploy/jvm/pom.xml``, and fetched from Maven Central by
``python -m source_backfill.runtime.jvm fetch`` (``make jars``, which ``make run`` and ``make test`` call)
into the cache folder :mod:`connectors.jars` finds them in: ``var/jvm/`` of the checkout unless
``SOURCE_BACKFILL_JARS`` names another (the container image bakes them in at build time), a sub-folder
per profile (``spark/``, ``broker/``). Jars that pyspark already ships are left out of ``spark/``, so
Spark's own versions win.

After the first fetch nothing needs the network: a fetch whose stamp matches the pom does nothing.
"""

from __future__ import annotations

import logging
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from connectors.jars import (
    POM,
    PROFILES,
    STAMP,
    artifact_name,
    fetched,
    jars_root,
    pom_fingerprint,
    profile_folder,
)
from source_backfill.errors import JvmDependencyError

logger = logging.getLogger(__name__)


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
        target = profile_folder(profile)
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
            (staging / STAMP).write_text(pom_fingerprint() + "\n")
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
