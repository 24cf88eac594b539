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
