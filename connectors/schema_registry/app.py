"""Where the built Schema Registry is: Apicurio Registry, a Quarkus application built once by Maven.

Its sources are one small Maven project, ``deploy/schema-registry/`` (a pom, a Maven settings file, one
Java class and an ``application.properties``; ``SOURCE_BACKFILL_REGISTRY_SOURCES`` names another copy).
``python -m source_backfill.runtime.schema_registry build`` (``make registry``) builds it into
``schema-registry/`` of the JVM cache (:func:`connectors.jars.jars_root`: ``var/jvm/`` unless
``SOURCE_BACKFILL_JARS`` names another): a runner jar, its ``lib/``, and a stamp holding the sources'
fingerprint, so a second build of the same sources does nothing.

This module only finds it (the embedded registry of :mod:`connectors.schema_registry.embedded` needs
that); :mod:`source_backfill.runtime.schema_registry` builds it.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from connectors.jars import ROOT, jars_root
from source_backfill.errors import JvmDependencyError

BUILD_HINT = "make registry  (or: python -m source_backfill.runtime.schema_registry build)"
#: The file a finished build leaves in the registry's folder: the sources' fingerprint.
STAMP = ".built"
#: The runner jar's name in the registry's folder (its ``lib/`` beside it).
RUNNER = "registry-runner.jar"
#: What of the sources is fingerprinted: everything but a stray ``target/`` of a manual Maven run.
_SKIPPED = ("target",)


def sources() -> Path:
    """The Maven project the registry is built from."""
    return Path(os.environ.get("SOURCE_BACKFILL_REGISTRY_SOURCES") or ROOT / "deploy" / "schema-registry")


def fingerprint(folder: Path) -> str:
    """A digest of every file under ``folder`` (paths and bytes, in path order), ``target/`` left out.

    Renaming, editing, adding or removing a file changes it; the files' times and modes do not.
    """
    digest = hashlib.sha256()
    files = sorted(p for p in folder.rglob("*")
                   if p.is_file() and p.relative_to(folder).parts[0] not in _SKIPPED)
    for path in files:
        digest.update(path.relative_to(folder).as_posix().encode() + b"\0")
        digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()[:16]


def registry_folder() -> Path:
    """The folder of the built registry in the JVM cache."""
    return jars_root() / "schema-registry"


def built(folder: Path | None = None, source: Path | None = None) -> bool:
    """True when the registry is built from the current sources (or built at all, when they are absent).

    As with the jars, a cache without the sources next to it (an image that baked it in) is trusted.
    """
    folder = registry_folder() if folder is None else folder
    source = sources() if source is None else source
    stamp = folder / STAMP
    if not stamp.exists() or not (folder / RUNNER).exists():
        return False
    return not source.exists() or stamp.read_text().strip() == fingerprint(source)


def runner_jar() -> Path:
    """The built registry's runner jar, or :class:`JvmDependencyError` naming the command that builds it."""
    folder = registry_folder()
    if not (folder / STAMP).exists() or not (folder / RUNNER).exists():
        msg = f"the Schema Registry is not built in {folder}; build it with: {BUILD_HINT}"
        raise JvmDependencyError(msg)
    return folder / RUNNER
