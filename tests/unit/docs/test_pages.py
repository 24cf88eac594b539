"""Hand-written docs pages that must follow the files they describe."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[3]


def test_every_alert_has_a_runbook_line():
    rules = yaml.safe_load((ROOT / "deploy" / "prometheus" / "alerts.yml").read_text())
    alerts = [r["alert"] for group in rules["groups"] for r in group["rules"] if "alert" in r]
    page = (ROOT / "docs" / "operations" / "alerts.md").read_text()
    rows = {m.group(1): m.group(2) for m in re.finditer(r"^\| `(\w+)` \|(.*)\|\s*$", page, re.M)}
    assert sorted(rows) == sorted(alerts)
    assert all(len(row.split("|")) == 3 and row.split("|")[-1].strip() for row in rows.values())


def test_the_readme_stays_a_first_ten_minutes_read():
    """Issue 46: at most 250 lines; everything else is a docs page, and every link of it resolves."""
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 250
    targets = [t.split("#", 1)[0] for t in re.findall(r"\]\(([^)\s]+)\)", text) if not t.startswith("http")]
    assert targets and [t for t in targets if not (ROOT / t).exists()] == []


def test_the_readme_commands_are_make_targets():
    text = (ROOT / "README.md").read_text()
    targets = set(re.findall(r"^([a-z-]+):", (ROOT / "Makefile").read_text(), re.M))
    assert {"run", "test"} <= set(re.findall(r"^make ([a-z-]+) ", text, re.M))
    assert set(re.findall(r"`make ([a-z-]+)", text)) <= targets
