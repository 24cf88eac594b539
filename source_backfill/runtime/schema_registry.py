"""Build the Schema Registry the tests start (``make registry``), once, into the JVM cache.

Apicurio Registry is on Maven Central as a Quarkus application jar without a runner;
``deploy/schema-registry/pom.xml`` makes one with Quarkus' ``build`` goal (its comment says what it
repairs). :func:`build`:

1. does nothing when the cache holds a build of the same sources
   (:func:`connectors.schema_registry.app.built`), checked again under a file lock, so that two test
   workers starting at once build it once;
2. checks that ``java`` (17+) and ``mvn`` are there, else says which is missing;
3. copies the sources into a staging folder beside the cache folder and runs
   ``mvn -s settings.xml package`` there (``settings.xml`` sends every repository to Maven Central);
4. moves the runner jar and its ``lib/`` into a fresh folder with the stamp, and swaps it in for the old
   one with a rename, so a build killed half-way leaves the previous build (or none), never a torn one.

The Maven output of the last build is kept in ``schema-registry-build.log`` beside the folder. The first
build downloads about 300 jars into Maven's local repository; later builds of changed sources reuse them.
"""

from __future__ import annotations

import fcntl
import logging
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from connectors.schema_registry.app import RUNNER, STAMP, built, fingerprint, registry_folder, sources
from source_backfill.errors import JvmDependencyError

logger = logging.getLogger(__name__)

#: The oldest Java the pom compiles for (``maven.compiler.release``).
JAVA_MAJOR = 17
#: A bound on one build: a fresh machine takes 1-2 min, most of it downloading.
BUILD_TIMEOUT_S = 1800.0


def java_major(version_output: str) -> int | None:
    """The major version in ``java -version``'s output (``1.8.0_392`` -> 8, ``17.0.15`` -> 17), or None."""
    found = re.search(r'version "(\d+)(?:\.(\d+))?', version_output)
    if found is None:
        return None
    major = int(found.group(1))
    return int(found.group(2) or 0) if major == 1 else major


def _check_java() -> None:
    java = shutil.which("java")
    if java is None:
        msg = f"java is not on PATH: building and running the Schema Registry needs Java {JAVA_MAJOR}+"
        raise JvmDependencyError(msg)
    done = subprocess.run([java, "-version"], capture_output=True, text=True, check=False, timeout=60)
    major = java_major(done.stderr + done.stdout)
    if major is not None and major < JAVA_MAJOR:
        msg = f"{java} is Java {major}: the Schema Registry needs Java {JAVA_MAJOR}+"
        raise JvmDependencyError(msg)


def build(force: bool = False) -> Path:
    """Build the registry into the cache unless it holds a build of the same sources; its folder."""
    target = registry_folder()
    src = sources()
    if not force and built(target, src):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with (target.parent / ".schema-registry.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if not force and built(target, src):
            return target
        return _build(target, src)


def _build(target: Path, src: Path) -> Path:
    if not (src / "pom.xml").exists():
        msg = (f"{src / 'pom.xml'} is missing: the Schema Registry is built from it (a checkout's "
               "deploy/schema-registry/, or the folder SOURCE_BACKFILL_REGISTRY_SOURCES names)")
        raise JvmDependencyError(msg)
    mvn = shutil.which("mvn")
    if mvn is None:
        msg = f"Maven (mvn) is not on PATH; it builds the Schema Registry from {src / 'pom.xml'}"
        raise JvmDependencyError(msg)
    _check_java()
    log = target.parent / "schema-registry-build.log"
    staging = Path(tempfile.mkdtemp(prefix=".schema-registry-", dir=target.parent))
    started = time.monotonic()
    try:
        project = staging / "project"
        shutil.copytree(src, project, ignore=shutil.ignore_patterns("target"))
        stamp = fingerprint(project)
        cmd = [mvn, "-B", "-s", str(project / "settings.xml"), "-f", str(project / "pom.xml"),
               "package", "-Dmaven.test.skip=true"]
        logger.info('schema registry build started sources="%s" log="%s"', src, log)
        with log.open("w") as out:
            try:
                done = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, check=False,
                                      timeout=BUILD_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                msg = f"the Schema Registry build took over {BUILD_TIMEOUT_S:.0f}s; Maven's output: {log}"
                raise JvmDependencyError(msg) from None
        if done.returncode != 0:
            msg = (f"mvn could not build the Schema Registry (exit {done.returncode}); the end of its "
                   f"output ({log}):\n{_errors(log)}")
            raise JvmDependencyError(msg)
        out_dir = staging / "built"
        out_dir.mkdir()
        runners = list((project / "target").glob("*-runner.jar"))
        if len(runners) != 1 or not (project / "target" / "lib").is_dir():
            msg = f"the Schema Registry build left no runner jar and lib/ in {project / 'target'} (see {log})"
            raise JvmDependencyError(msg)
        runners[0].rename(out_dir / RUNNER)
        (project / "target" / "lib").rename(out_dir / "lib")
        (out_dir / STAMP).write_text(stamp + "\n")
        out_dir.chmod(0o755)  # readable by a user other than the builder (an image builds as root)
        old = staging / "old"
        if target.exists():
            target.rename(old)
        out_dir.rename(target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    logger.info('schema registry built folder="%s" seconds="%.1f"', target, time.monotonic() - started)
    return target


def _errors(log: Path, chars: int = 3000) -> str:
    """Maven's ``[ERROR]`` lines from ``log`` (its last lines when it has none), at most ``chars``."""
    text = log.read_text(errors="replace")
    errors = "\n".join(line for line in text.splitlines() if line.startswith("[ERROR]"))
    return (errors or text)[-chars:]


def main(argv: list[str] | None = None) -> int:
    """``python -m source_backfill.runtime.schema_registry build [--force] | path``."""
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["build"]:
        logging.basicConfig(level=logging.INFO, format="%(message)s")
        try:
            folder = build(force="--force" in args)
        except JvmDependencyError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
        print(f"Schema Registry ready in {folder}")
        return 0
    if args[:1] == ["path"]:
        print(registry_folder())
        return 0
    print("usage: python -m source_backfill.runtime.schema_registry build [--force] | path", file=sys.stderr)
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
