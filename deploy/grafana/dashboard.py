r"""Generate the Grafana dashboard of source-backfill: ``python deploy/grafana/dashboard.py``.

Writes ``source-backfill.json`` next to this file (provisioned by ``provisioning/dashboards``); edit the
panels here, not in the JSON. ``--check`` exits 1 when the JSON is not what this file generates (a test
runs it). Metric names: ``source_backfill/metrics.py``; ``job`` is the source-backfill job (kept by
``honor_labels`` in ``deploy/prometheus/prometheus.yml``).

Namespaces (tenants): the job series carry ``job`` only, no ``namespace``. A regex on the name's prefix
(``job=~"$namespace\..*"``) cannot choose the ``default`` namespace, whose jobs have no prefix (and, on a
daemon without tenants, may have dots in their names). So the daemon exports ``job_namespace{job,
namespace} 1`` per job, and the filter goes through the ``job`` variable: ``namespace`` takes its values
from that series, ``job`` takes the jobs of the chosen namespaces from it
(``job_namespace{namespace=~"$namespace"}``), and every panel on job series selects ``job=~"$job"``. The
``job`` variable has no custom "All" value: All stands for the regex of its options (the chosen
namespaces' jobs), where ``.*`` would be every job whatever the namespace. A job created since the
variables were last refreshed (at each load and time range change) joins All at the next refresh.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

OUT = Path(__file__).with_name("source-backfill.json")
DS = {"type": "prometheus", "uid": "${datasource}"}
P = "source_backfill_"
JOB = 'job=~"$job"'
SOURCE = 'source=~"$source"'


def target(expr: str, legend: str, ref: str = "A") -> dict[str, Any]:
    """One PromQL query of a panel."""
    return {"datasource": DS, "expr": expr, "legendFormat": legend, "refId": ref, "range": True}


def panel(title: str, targets: list[dict[str, Any]], *, unit: str = "short", kind: str = "timeseries",
          description: str = "", stack: bool = False, **extra: Any) -> dict[str, Any]:
    """A panel of ``kind`` (placed later by :func:`layout`)."""
    for ref, t in zip("ABCDEFGH", targets, strict=False):
        t["refId"] = ref
    custom: dict[str, Any] = {}
    if kind == "timeseries":
        custom = {"drawStyle": "line", "lineWidth": 1, "fillOpacity": 10 if stack else 0,
                  "showPoints": "never", "stacking": {"mode": "normal" if stack else "none", "group": "A"}}
    return {
        "type": kind,
        "title": title,
        "description": description,
        "datasource": DS,
        "targets": targets,
        "fieldConfig": {"defaults": {"unit": unit, "custom": custom}, "overrides": []},
        "options": {"legend": {"displayMode": "table", "placement": "right", "calcs": ["lastNotNull"]},
                    "tooltip": {"mode": "multi", "sort": "desc"}} if kind == "timeseries" else {},
        **extra,
    }


def rows() -> list[tuple[str, list[dict[str, Any]]]]:
    """The dashboard, as (row title, panels)."""
    rate = "[$__rate_interval]"
    return [
        ("Jobs: progress", [
            panel("History rows written", [
                target(f'{P}job_rows{{{JOB}, kind="history"}}', "{{job}}")],
                description="Rows copied from history by each job since the daemon started (job_rows)."),
            panel("ETA of the backfill", [
                target(f"{P}job_eta_seconds{{{JOB}}} and on (instance, job) {P}job_backfilling{{{JOB}}} == 1",
                       "{{job}}")],
                unit="s", description="Estimated time left while a job backfills (job_eta_seconds); "
                                      "0 when unknown (no rate measured yet)."),
            panel("Splits by stage", [
                target(f"sum by (job, stage) ({P}job_splits{{{JOB}}})", "{{job}} {{stage}}")],
                stack=True, description="Backfilling, source_caching_up (history done, waiting for the "
                                        "live stream), finished (job_splits)."),
            state_panel(),
        ]),
        ("Splits", [
            panel("Offsets left to backfill", [
                target(f"{P}job_lag_offsets{{{JOB}}}", "{{job}} all splits"),
                target(f"{P}job_split_lag_max_offsets{{{JOB}}}", "{{job}} slowest split")],
                description="target - backfilled offset, summed over the job's splits (job_lag_offsets) and "
                            "of its slowest split (job_split_lag_max_offsets); the target follows the live "
                            "stream while a split backfills."),
            panel("Most lagging splits", [
                target(f"topk(10, {P}split_lag_offsets{{{JOB}}})", "{{job}} {{split}}")],
                description="Offsets left per split (split_lag_offsets), for the splits that have series of "
                            "their own: with metrics.per_split = auto (the default) the most lagging splits "
                            "not Finished, at most metrics.per_split_max per job. Every split: GET "
                            "/jobs/{name}."),
        ]),
        ("Live latency", [
            panel("Live latency p50 / p99", [
                target(f"histogram_quantile({q}, sum by (job, le) "
                       f"(rate({P}live_latency_seconds_bucket{{{JOB}}}[1m])))", f"{{{{job}}}} p{name}")
                for q, name in ((0.5, "50"), (0.99, "99"))
            ], unit="s", description="Live rows' record timestamp (CreateTime or LogAppendTime: "
                                     "GET /jobs/{name} live_latency.timestamp_type) to the Delta commit "
                                     "holding them, over the last minute (live_latency_seconds; history "
                                     "rows not counted). The same figure as GET /jobs/{name}: "
                                     "docs/guides/live-latency.md."),
            panel("Jobs backfilling", [
                target(f"count({P}job_backfilling{{{JOB}}} == 1)", "backfilling")],
                description="Jobs still backfilling (job_backfilling): a Finished job's live latency rising "
                            "while another backfills is what alert SourceBackfillLiveLatencyRises reports."),
        ]),
        ("Table jobs", [
            panel("Table rows/s by stage", [
                target(f"sum by (job, stage) (rate({P}table_backfill_rows_total{{{JOB}}}{rate}))",
                       "{{job}} {{stage}}")],
                unit="rowsps", stack=True,
                description="Rows a table-backfill job emits per second: consuming_snapshot (copied from the "
                            "pinned version), consuming_log_store (replayed from the change feed), "
                            "consume_upstream (live changes forwarded) (table_backfill_rows_total)."),
            panel("Table jobs: versions behind", [
                target(f"{P}table_backfill_lag_versions{{{JOB}}}", "{{job}}")],
                description="Source table versions the live stream delivered that the job has not emitted "
                            "yet (table_backfill_lag_versions); progress of the snapshot copy: GET "
                            "/jobs/{name} table.progress."),
        ]),
        ("Throughput", [
            panel("History vs live rows/s", [
                target(f'sum by (job) (rate({P}job_rows{{{JOB}, kind="history"}}{rate}))', "{{job}} history"),
                target(f'sum by (job) (rate({P}job_rows{{{JOB}, kind="live"}}{rate}))', "{{job}} live")],
                unit="rowsps", description="Rows per second written from history reads and from the live "
                                           "stream (job_rows: totals since the daemon started)."),
            panel("Commits/s", [
                target(f"sum by (job) (rate({P}commits_total{{{JOB}}}{rate}))", "{{job}}")],
                unit="ops", description="Delta commits per second per job (commits_total)."),
            panel("History reads ahead by outcome", [
                target(f"sum by (job, outcome) (increase({P}history_reads_ahead_total{{{JOB}}}{rate}))",
                       "{{job}} {{outcome}}")],
                stack=True, description="Reads ahead of the epochs: adopted (committed with an epoch), "
                                        "dropped, failed (history_reads_ahead_total)."),
            panel("Split changes", [
                target(f"sum by (job, change) (increase({P}split_changes_total{{{JOB}}}{rate}))",
                       "{{job}} {{change}}")],
                description="Partitions added to or removed from a job (split_changes_total)."),
        ]),
        ("Epochs", [
            panel("Epoch duration", [
                target(f"histogram_quantile({q}, sum by (source, le) "
                       f"(rate({P}epoch_duration_seconds_bucket{{{SOURCE}}}{rate})))",
                       f"{{{{source}}}} p{name}")
                for q, name in ((0.5, "50"), (0.9, "90"), (0.99, "99"))
            ] + [target(f"sum by (source) (rate({P}epoch_duration_seconds_sum{{{SOURCE}}}{rate})) / "
                        f"sum by (source) (rate({P}epoch_duration_seconds_count{{{SOURCE}}}{rate}))",
                        "{{source}} mean")],
                unit="s", description="Wall time of an epoch, all jobs included (epoch_duration_seconds); "
                                      "over the trigger interval, the live stream falls behind."),
            panel("Seconds since the last epoch", [
                target(f"{P}epoch_lag_seconds{{{SOURCE}}}", "{{source}}")],
                unit="s", description="Grows while a source is stalled (epoch_lag_seconds)."),
            panel("Epochs per minute", [
                target(f"sum by (source) (delta({P}epoch{{{SOURCE}}}[5m])) / 5", "{{source}}")],
                description="Completed epochs per minute, over 5 minutes (the epoch id's growth)."),
        ]),
        ("Errors", [
            panel("Reader errors", [
                target(f'sum by (job, error_type) (increase({P}source_errors_total{{job=~"$job|"}}{rate}))',
                       "{{job}} {{error_type}}")],
                description="History-read errors by type, each followed by a rebuild with backoff; job "
                            "empty and live_query: the source's live query (source_errors_total; the "
                            "chosen jobs' errors and the sources' own)."),
            panel("Failed jobs", [
                target(f"{P}job_failed{{{JOB}}} == 1", "{{job}}")],
                description="Jobs that stopped (job_failed): see GET /jobs/{name}, then retry or drop."),
            panel("Offsets lost (data loss)", [
                target(f"sum by (job) ({P}job_data_loss_offsets_total{{{JOB}}})", "{{job}}")],
                description="Offsets skipped below the log start with fail_on_data_loss = false "
                            "(job_data_loss_offsets_total, since the daemon started); per split: "
                            "data_loss_offsets_total, and GET /jobs/{name}."),
            panel("Commit conflicts", [
                target(f"sum by (job) (increase({P}commit_conflicts_total{{{JOB}}}{rate}))", "{{job}}")],
                description="Epoch commits retried because another writer committed to the table first "
                            "(commit_conflicts_total)."),
        ]),
    ]


def state_panel() -> dict[str, Any]:
    """Each job's state as a word (value mappings over job_failed * 2 + job_backfilling)."""
    words = {"0": ("finished", "green"), "1": ("backfilling", "blue"), "2": ("failed", "red"),
             "3": ("failed", "red")}
    mappings = [{"type": "value", "options": {k: {"text": t, "color": c, "index": i}
                                              for i, (k, (t, c)) in enumerate(words.items())}}]
    quarantined = {"type": "value", "options": {"1": {"text": "quarantined", "color": "dark-red", "index": 0},
                                                "0": {"text": "", "color": "transparent", "index": 1}}}
    board = panel("Job state", [
        target(f"2 * {P}job_failed{{{JOB}}} + on (instance, job) {P}job_backfilling{{{JOB}}}", "{{job}}"),
        target(f"{P}job_quarantined{{{JOB}}} == 1", "{{job}} quarantined")],
        kind="stat", description="finished, backfilling or failed per job (job_backfilling, job_failed); "
                                 "quarantined: failed after Spark's JVM died with its work in flight "
                                 "(job_quarantined; retry it).")
    board["fieldConfig"]["defaults"]["mappings"] = mappings
    board["fieldConfig"]["defaults"]["color"] = {"mode": "thresholds"}
    board["fieldConfig"]["overrides"] = [{"matcher": {"id": "byFrameRefID", "options": "B"},
                                          "properties": [{"id": "mappings", "value": [quarantined]}]}]
    board["options"] = {"colorMode": "background", "textMode": "value_and_name", "graphMode": "none",
                        "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False}}
    return board


def layout(sections: list[tuple[str, list[dict[str, Any]]]]) -> list[dict[str, Any]]:
    """Rows full width; their panels side by side, 24 grid units per line, 8 high."""
    panels: list[dict[str, Any]] = []
    y = 0
    for title, members in sections:
        panels.append({"type": "row", "title": title, "collapsed": False, "panels": [],
                       "gridPos": {"h": 1, "w": 24, "x": 0, "y": y}})
        y += 1
        width = 24 // len(members) if len(members) <= 3 else 12
        x = 0
        for member in members:
            if x + width > 24:
                x, y = 0, y + 8
            member["gridPos"] = {"h": 8, "w": width, "x": x, "y": y}
            x += width
            panels.append(member)
        y += 8
    for number, p in enumerate(panels, start=1):
        p["id"] = number
    return panels


def variable(name: str, query: str, label: str, *, all_value: str | None = ".*") -> dict[str, Any]:
    """A multi-value template variable over a label's values.

    ``all_value`` None: "All" is the regex of the variable's options (as Grafana builds it), not ``.*``.
    """
    return {"type": "query", "name": name, "label": label, "datasource": DS,
            "query": query, "definition": query, "refresh": 2,
            "multi": True, "includeAll": True, "allValue": all_value, "sort": 1,
            "current": {"selected": True, "text": ["All"], "value": ["$__all"]}}


def dashboard() -> dict[str, Any]:
    """The whole dashboard model."""
    return {
        "uid": "source-backfill",
        "title": "source-backfill",
        "description": "Jobs backfilling a shared Kafka source and following it live "
                       "(source_backfill/metrics.py)",
        "tags": ["source-backfill", "kafka", "spark", "delta"],
        "timezone": "browser",
        "schemaVersion": 39,
        "version": 1,
        "editable": True,
        "graphTooltip": 1,
        "refresh": "30s",
        "time": {"from": "now-3h", "to": "now"},
        "templating": {"list": [
            {"type": "datasource", "name": "datasource", "label": "Prometheus", "query": "prometheus",
             "current": {"selected": False, "text": "Prometheus", "value": "prometheus"}},
            variable("namespace", f"label_values({P}job_namespace, namespace)", "Namespace"),
            variable("job", f'label_values({P}job_namespace{{namespace=~"$namespace"}}, job)', "Job",
                     all_value=None),
            variable("source", f"label_values({P}epoch, source)", "Source"),
        ]},
        "annotations": {"list": []},
        "links": [],
        "panels": layout(rows()),
    }


def render() -> str:
    """The JSON text written to :data:`OUT`."""
    return json.dumps(dashboard(), indent=2, ensure_ascii=False) + "\n"


def main(argv: list[str]) -> int:
    """Write the dashboard, or with ``--check`` report whether the file is current."""
    text = render()
    if "--check" in argv:
        current = OUT.read_text(encoding="utf-8") if OUT.exists() else ""
        if current != text:
            print(f"{OUT} is out of date: run python {Path(__file__).as_posix()}", file=sys.stderr)
            return 1
        return 0
    OUT.write_text(text, encoding="utf-8")
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
