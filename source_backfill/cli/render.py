"""What the CLI prints of the API's JSON (pure text): job lines, split and table bars, tables, plans.

Every function takes the API's JSON as parsed (dicts) and returns text; none makes a request. A fraction
the API does not send is computed with :func:`source_backfill.core.progress.copied_fraction`, the one
definition of "copied over copied + left".
"""

from __future__ import annotations

from typing import Any

#: Characters of a progress bar.
BAR_WIDTH = 20


def _fraction(done: int, total: int) -> float:
    """``done`` of ``total`` as :func:`~source_backfill.core.progress.copied_fraction` defines it."""
    # imported here: the core (numpy) is not loaded for `--help` or a usage error
    from source_backfill.core.progress import copied_fraction

    return copied_fraction(done, total - done)


def split_bar(split: dict[str, Any], width: int = BAR_WIDTH) -> str:
    """``events:0  [#######===----------]  52.0%  5200/10000  backfilling``.

    Done = ``(offset + 1) / (target_offset + 1)`` (offsets are inclusive), where ``offset`` is the higher
    of ``backfilled_offset`` (committed: ``#``) and ``read_ahead_offset`` (copied by a read ahead whose
    commit waits for an epoch: ``=``); 100% once finished; ``?`` while the split's target is not known.
    """
    stage = str(split.get("stage", "?"))
    backfilled, target = split.get("backfilled_offset"), split.get("target_offset")
    ahead = split.get("read_ahead_offset")
    committed_frac = 1.0 if stage == "finished" else 0.0
    if target is None:
        frac: float | None = 1.0 if stage == "finished" else None
        counts = "-" if stage == "finished" else "?/?"
    else:
        total = int(target) + 1
        committed = total if stage == "finished" else (0 if backfilled is None else int(backfilled) + 1)
        committed = max(0, min(committed, total))
        done = max(committed, min(total, int(ahead) + 1)) if ahead is not None else committed
        # finished: committed = done = total, a fraction of 1.0
        frac = _fraction(done, total)
        committed_frac = _fraction(committed, total)
        counts = f"{done}/{total}"
    filled = round((frac or 0.0) * width)
    solid = min(filled, round(committed_frac * width))
    pct = f"{frac * 100:.1f}%" if frac is not None else "?%"
    bar = "#" * solid + "=" * (filled - solid) + "-" * (width - filled)
    return f"{split.get('split')}  [{bar}] {pct:>6}  {counts}  {stage}"


def table_bar(table: dict[str, Any], width: int = BAR_WIDTH) -> str:
    """``snapshot  [#####-----]  52.0%  rows 520/1000  vnodes 133/256  consuming_snapshot  lag 4 versions``.

    The fraction is the API's ``progress`` (rows copied of the snapshot's row count); vnodes completed of
    all when it has none. A copy by files shows ``files 3/20`` instead of the vnodes.
    """
    total = int(table.get("vnodes_total") or 0)
    done = int(table.get("vnodes_completed") or 0)
    frac = table.get("progress")
    if frac is None:
        frac = _fraction(done, total)
    frac = max(0.0, min(1.0, float(frac)))
    filled = round(frac * width)
    lag = table.get("lag_versions")
    rows = "" if table.get("rows_total") is None else \
        f"rows {table.get('rows_copied', 0)}/{table['rows_total']}  "
    files = table.get("files_copied")
    units = f"vnodes {done}/{total}" if files is None else f"files {files}/{table.get('files_total') or '?'}"
    return (f"{table.get('strategy')}  [{'#' * filled}{'-' * (width - filled)}] {frac * 100:5.1f}%  "
            f"{rows}{units}  {table.get('phase')}  lag {'?' if lag is None else lag} versions")


def eta_text(job: dict[str, Any]) -> str:
    """``42s``, ``paused`` (history stopped: paused or rate 0), or ``-`` (no rate known yet)."""
    if job.get("history_paused"):
        return "paused"
    eta = job.get("eta_seconds")
    return "-" if eta is None else f"{eta:.0f}s"


def latency_text(job: dict[str, Any]) -> str | None:
    """``p50 0.21s p99 0.84s`` (live latency over the API's window); None when the job has no figure."""
    lat = job.get("live_latency") or {}
    if lat.get("p50_s") is None or lat.get("p99_s") is None:
        return None
    return f"p50 {lat['p50_s']:.2f}s p99 {lat['p99_s']:.2f}s"


def tiers_text(job: dict[str, Any]) -> str | None:
    """Where a job reading its source's archive took its history from, else None.

    ``history from archive 390, kafka 400, gap 10; 6,400 bytes from the broker``: offsets per tier, then
    the record bytes its Kafka reads fetched.
    """
    tiers = job.get("history_tiers")
    if not tiers:
        return None
    fetched = job.get("history_broker_bytes")
    broker = f"; {fetched:,} bytes from the broker" if fetched is not None else ""
    return "history from " + _tiers_line(tiers) + broker


def _tiers_line(tiers: dict[str, int]) -> str:
    """``archive 390, kafka 400, gap 10``: the tiers holding offsets, in order (``nothing yet``: none)."""
    shown = [f"{tier} {tiers[tier]}" for tier in ("archive", "kafka", "gap", "loss") if tiers.get(tier)]
    return ", ".join(shown) if shown else "nothing yet"


def repair_text(repair: dict[str, Any]) -> str:
    """``repair 12 done: t:0 [50, 100) 50 rows removed, 50 added (version 17)`` (or why it failed)."""
    head = f"repair {repair.get('id')} {repair.get('state')}"
    if repair.get("state") == "failed":
        return f"{head}: {repair.get('error')}"
    ranges = repair.get("ranges") or {}
    if repair.get("state") == "pending" or not ranges:
        window = repair.get("window") or {}
        lo = window.get("from_offset", window.get("from_timestamp_ms"))
        hi = window.get("to_offset", window.get("to_timestamp_ms"))
        unit = "" if "from_offset" in window and window["from_offset"] is not None else " ms"
        splits = ", ".join(window.get("splits") or []) or "every split"
        note = "" if repair.get("state") == "pending" else " (nothing of the job's rows in it)"
        return f"{head}: {splits} [{lo}, {hi}){unit}{note}"
    shown = ", ".join(f"{s} [{r[0]}, {r[1]})" for s, r in sorted(ranges.items())[:3])
    more = f" and {len(ranges) - 3} more" if len(ranges) > 3 else ""
    return (f"{head}: {shown}{more} {repair.get('rows_removed')} rows removed, "
            f"{repair.get('rows_added')} added (version {repair.get('version')})")


def job_line(job: dict[str, Any]) -> str:
    """One summary line of a job; its percentage is the API's ``progress``."""
    flags = []
    if job.get("paused"):
        flags.append("paused")
    if job.get("rate_limit") is not None:
        flags.append(f"rate {job['rate_limit']:g}/s")
    if job.get("dropped"):
        flags.append("dropping")
    if job.get("pending_mutations"):
        flags.append(f"{job['pending_mutations']} pending")
    parts = [
        f"{job['name']}",
        f"{job['status']}",
        f"epoch {job['epoch'] if job.get('epoch') is not None else '-'}",
        f"splits {job.get('splits_finished', 0)}/{job.get('splits_total', 0)} finished",
        f"history {job.get('rows_history', 0)} rows"
        + (f" (+{job['rows_read_ahead']} read ahead)" if job.get("rows_read_ahead") else ""),
        f"live {job.get('rows_live', 0)} rows",
    ]
    if job.get("progress") is not None:
        parts.append(f"{job['progress'] * 100:.1f}%")
    parts.append(f"eta {eta_text(job)}")
    if job.get("status") == "backfilling" and job.get("history_rows_per_s") is not None:
        parts.append(f"history {job['history_rows_per_s']:.0f} rows/s")
    latency = latency_text(job)
    if latency is not None:
        parts.append(f"latency {latency}")
    line = "  ".join(parts)
    if flags:
        line += "  [" + ", ".join(flags) + "]"
    if job.get("error"):
        line += f"  error: {job['error']}"
    return line


def render_jobs(jobs: list[dict[str, Any]]) -> str:
    """Each job's summary line followed by one progress bar per split."""
    if not jobs:
        return "no jobs"
    out: list[str] = []
    for job in jobs:
        out.append(job_line(job))
        if job.get("table"):
            out.append("  " + table_bar(job["table"]))
        tiers = tiers_text(job)
        if tiers is not None:
            out.append("  " + tiers)
        out.extend("  " + repair_text(r) for r in (job.get("repairs") or [])[:3])
        width = max((len(str(s.get("split"))) for s in job.get("splits", [])), default=0)
        for s in job.get("splits", []):
            out.append("  " + split_bar({**s, "split": str(s.get("split")).ljust(width)}))
    return "\n".join(out)


def render_table(jobs: list[dict[str, Any]]) -> str:
    """``jobs list``: one row per job."""
    header = ("NAME", "SOURCE", "STATUS", "PAUSED", "RATE", "SPLITS", "HISTORY", "LIVE", "ETA", "LATENCY")
    rows = [header]
    for j in jobs:
        rows.append((
            j["name"], j["source"], j["status"] + (" (dropping)" if j.get("dropped") else ""),
            "yes" if j.get("paused") else "no",
            "-" if j.get("rate_limit") is None else f"{j['rate_limit']:g}",
            f"{j.get('splits_finished', 0)}/{j.get('splits_total', 0)}",
            str(j.get("rows_history", 0)), str(j.get("rows_live", 0)),
            eta_text(j),
            latency_text(j) or "-",
        ))
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows)


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    return f"{seconds:.1f} s" if seconds < 120 else f"{seconds / 60:.1f} min"


def render_plan(plan: dict[str, Any]) -> str:
    """A dry run's plan: per split offsets, total, the two time estimates, warnings.

    A job on a delta source: the version it would copy and how (by files on Spark, or by vnode).
    """
    job = plan["job"]
    lines = [f'dry run: job "{job["name"]}" on source "{job["source"]}" -> {job["sink_path"]}: every check '
             "passed; nothing was created"]
    for s in plan.get("splits", []):
        tiers = f"  ({_tiers_line(s['tiers'])})" if s.get("tiers") else ""
        lines.append(f"  {s['split']}  offsets {s['from_offset']}..{s['to_offset']}  {s['offsets']} to copy"
                     f"{tiers}")
    if plan.get("tiers_total"):
        lines.append(f"  history from {_tiers_line(plan['tiers_total'])}")
    table = plan.get("table")
    if table is not None:  # a job on a delta source: the version it would copy, and how
        rows = "? rows" if table.get("rows") is None else f"{table['rows']:,} rows"
        files = "" if table.get("files") is None else f" in {table['files']:,} files"
        lines.append(f"  version {table['version']}: {rows}{files}; copied by {table['copy_by']} with "
                     f"{table['engine']}{' (spilled to local disk by vnode)' if table.get('spilled') else ''}"
                     f": {table['why']}")
    else:
        total_bytes = plan.get("bytes_total")
        lines.append(f"  total {plan.get('offsets_total', 0)} offsets, "
                     + (f"{total_bytes} bytes" if total_bytes is not None else
                        f"bytes {plan.get('bytes_note') or 'unknown'}"))
    limit, asked = plan.get("rate_limit_rows_per_s"), job.get("rate_limit")
    startup = f" (startup {plan['startup_s']:g} s)" if plan.get("startup_s") else ""
    pace = f" ({limit:,.0f} at the source's epoch pace)" if limit is not None and limit != asked else ""
    lines.append("  at the rate limit: " + (
        "none (unlimited)" if limit is None else
        f"{asked if asked is not None else limit:,g} rows/s{pace}: "
        f"{_duration(plan.get('seconds_at_rate_limit'))}{startup}"))
    measured = plan.get("measured_rows_per_s")
    lines.append("  at the measured history rate: " + (
        (plan.get("measured_note") or "none") if measured is None else
        f"{measured:,.0f} rows/s: {_duration(plan.get('seconds_at_measured_rate'))}{startup}"))
    lines += [f"  warning: {w}" for w in plan.get("warnings", [])]
    return "\n".join(lines)
