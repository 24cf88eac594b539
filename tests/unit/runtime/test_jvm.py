"""Fetching the JVM jars (runtime/jvm.py, ``make jars``) with a stand-in for Maven."""

from __future__ import annotations

from connectors import jars
from source_backfill.runtime import jvm


def test_fetched_jars_are_readable_by_other_users(tmp_path, monkeypatch):
    """The image fetches them as root and runs as uid 10001: the folder must not keep mkdtemp's 0700."""
    import stat

    fake = tmp_path / "mvn"
    fake.write_text('#!/bin/sh\nfor a; do case "$a" in -DoutputDirectory=*) d=${a#*=};; esac; done\n'
                    'touch "$d/kafka_2.13-4.1.1.jar"\n')
    fake.chmod(0o755)
    monkeypatch.setenv("SOURCE_BACKFILL_JARS", str(tmp_path / "jars"))
    monkeypatch.setattr(jvm.shutil, "which", lambda name: str(fake) if name == "mvn" else None)
    jvm.fetch(("broker",))
    mode = stat.S_IMODE((tmp_path / "jars" / "broker").stat().st_mode)
    assert mode & 0o055 == 0o055, oct(mode)
    assert jars.fetched("broker")
