"""Building the Schema Registry once (runtime/schema_registry.py, ``make registry``), Maven stood in for."""

from __future__ import annotations

import os

import pytest

from connectors.schema_registry import app
from source_backfill.errors import JvmDependencyError
from source_backfill.runtime import schema_registry

REAL_CHECK_JAVA = schema_registry._check_java  # noqa: SLF001 - the project fixture stubs it

#: A stand-in for ``mvn ... package``: counts its runs, fails when the pom says FAIL, else leaves a runner
#: jar and lib/ in the project's target/ as Quarkus' legacy-jar build does.
FAKE_MVN = """#!/bin/sh
echo run >> "$COUNT"
while [ $# -gt 0 ]; do [ "$1" = "-f" ] && pom="$2"; shift; done
dir=$(dirname "$pom")
if grep -q FAIL "$pom"; then
  echo "[INFO] downloading"; echo "[ERROR] Failed to execute goal: boom"; exit 1
fi
mkdir -p "$dir/target/lib"
echo jar > "$dir/target/x-1-runner.jar"
echo lib > "$dir/target/lib/a.jar"
"""


@pytest.fixture
def project(tmp_path, monkeypatch):
    """Sources in tmp_path/src, the cache in tmp_path/jvm, a fake mvn counting into tmp_path/count."""
    src = tmp_path / "src"
    (src / "src" / "main" / "java").mkdir(parents=True)
    (src / "pom.xml").write_text("<project/>")
    (src / "settings.xml").write_text("<settings/>")
    (src / "src" / "main" / "java" / "A.java").write_text("class A {}")
    mvn = tmp_path / "mvn"
    mvn.write_text(FAKE_MVN)
    mvn.chmod(0o755)
    monkeypatch.setenv("SOURCE_BACKFILL_REGISTRY_SOURCES", str(src))
    monkeypatch.setenv("SOURCE_BACKFILL_JARS", str(tmp_path / "jvm"))
    monkeypatch.setenv("COUNT", str(tmp_path / "count"))
    monkeypatch.setattr(schema_registry.shutil, "which", lambda name: str(mvn) if name == "mvn" else None)
    monkeypatch.setattr(schema_registry, "_check_java", lambda: None)
    return src


def _runs(tmp_path):
    count = tmp_path / "count"
    return len(count.read_text().splitlines()) if count.exists() else 0


def test_a_build_leaves_runner_lib_and_stamp_and_a_second_one_is_a_no_op(project, tmp_path):
    folder = schema_registry.build()
    assert folder == tmp_path / "jvm" / "schema-registry"
    assert (folder / app.RUNNER).read_text() == "jar\n"
    assert (folder / "lib" / "a.jar").exists()
    assert (folder / app.STAMP).read_text().strip() == app.fingerprint(project)
    assert app.built() and app.runner_jar() == folder / app.RUNNER
    schema_registry.build()
    assert _runs(tmp_path) == 1
    assert [p.name for p in folder.parent.iterdir() if p.name.startswith(".schema-registry-")] == []


def test_changed_sources_build_again_and_force_does_too(project, tmp_path):
    schema_registry.build()
    (project / "src" / "main" / "java" / "A.java").write_text("class A { int x; }")
    assert not app.built()
    schema_registry.build()
    assert _runs(tmp_path) == 2
    schema_registry.build(force=True)
    assert _runs(tmp_path) == 3
    assert app.built()


def test_a_failed_build_says_mavens_errors_and_keeps_the_previous_build(project, tmp_path):
    folder = schema_registry.build()
    (project / "pom.xml").write_text("<project>FAIL</project>")
    with pytest.raises(JvmDependencyError, match=r"exit 1\).*\n\[ERROR\] Failed to execute goal: boom$"):
        schema_registry.build()
    assert (folder / app.RUNNER).exists()  # the old build is still there, just stale
    assert not app.built()
    assert "[INFO] downloading" in (folder.parent / "schema-registry-build.log").read_text()


def test_missing_maven_java_or_pom_is_said(project, monkeypatch):
    monkeypatch.setattr(schema_registry.shutil, "which", lambda name: None)
    with pytest.raises(JvmDependencyError, match=r"Maven \(mvn\) is not on PATH"):
        schema_registry.build()
    monkeypatch.setattr(schema_registry.shutil, "which", lambda name: "/bin/true" if name == "mvn" else None)
    monkeypatch.setattr(schema_registry, "_check_java", REAL_CHECK_JAVA)
    with pytest.raises(JvmDependencyError, match="java is not on PATH"):
        schema_registry.build()
    (project / "pom.xml").unlink()
    with pytest.raises(JvmDependencyError, match="pom.xml is missing"):
        schema_registry.build()


def test_an_unbuilt_registry_names_the_command_that_builds_it(project):
    with pytest.raises(JvmDependencyError, match="make registry"):
        app.runner_jar()


def test_a_cache_without_its_sources_is_trusted(project):
    """As the jars are: an image bakes the built registry in without deploy/schema-registry/."""
    schema_registry.build()
    for path in sorted(project.rglob("*"), reverse=True):
        path.rmdir() if path.is_dir() else path.unlink()
    project.rmdir()
    assert app.built()


def test_the_fingerprint_follows_names_and_bytes_not_times_nor_target(tmp_path):
    (tmp_path / "a").write_text("1")
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "b").write_text("2")
    first = app.fingerprint(tmp_path)
    os.utime(tmp_path / "a", (0, 0))
    (tmp_path / "target").mkdir()
    (tmp_path / "target" / "out.jar").write_text("built")
    assert app.fingerprint(tmp_path) == first
    (tmp_path / "d" / "b").rename(tmp_path / "d" / "c")
    assert app.fingerprint(tmp_path) != first
    (tmp_path / "d" / "c").rename(tmp_path / "d" / "b")
    assert app.fingerprint(tmp_path) == first
    (tmp_path / "a").write_text("1 ")
    assert app.fingerprint(tmp_path) != first


@pytest.mark.parametrize(("output", "major"), [
    ('openjdk version "17.0.15" 2025-04-15', 17),
    ('java version "1.8.0_392"', 8),
    ('openjdk version "21" 2023-09-19', 21),
    ("no version here", None),
])
def test_the_java_major_version_is_read_from_java_version(output, major):
    assert schema_registry.java_major(output) == major


def test_the_command_line(project, capsys):
    assert schema_registry.main(["build"]) == 0
    assert "Schema Registry ready in" in capsys.readouterr().out
    assert schema_registry.main(["path"]) == 0
    assert capsys.readouterr().out.strip().endswith("schema-registry")
    assert schema_registry.main([]) == 2
    (project / "pom.xml").write_text("<project>FAIL</project>")
    assert schema_registry.main(["build"]) == 1
    assert "error: mvn could not build the Schema Registry" in capsys.readouterr().err
