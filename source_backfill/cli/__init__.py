"""The ``source-backfill`` command: run the daemon, control its jobs over the API, watch backfill progress.

Exit codes: 0 ok, 1 the API refused the request (or could not be reached), 2 usage or configuration error,
3 ``verify`` found the table not exactly once.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO, Any

logger = logging.getLogger(__name__)

ENV_API = "SOURCE_BACKFILL_API_URL"
ENV_TOKEN = "SOURCE_BACKFILL_API_TOKEN"  # noqa: S105 - the name of an environment variable, not a secret
ENV_TOKEN_FILE = "SOURCE_BACKFILL_API_TOKEN_FILE"  # noqa: S105 - the name of an environment variable
DEFAULT_API = "http://127.0.0.1:8080"
BAR_WIDTH = 20

EXIT_OK, EXIT_API, EXIT_USAGE, EXIT_DIFFERS = 0, 1, 2, 3
#: How often ``verify`` polls its run.
VERIFY_POLL_S = 0.5


class CliError(Exception):
    """A failure to report on one line, with the process exit code."""

    def __init__(self, message: str, code: int = EXIT_API) -> None:
        super().__init__(message)
        self.code = code


# -- API client ---------------------------------------------------------------------------------------
class ApiClient:
    """The control API over httpx; every non-2xx answer becomes a one-line :class:`CliError`."""

    def __init__(self, url: str, token: str | None, timeout_s: float = 10.0) -> None:
        import httpx

        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.url = url.rstrip("/")
        self._http = httpx.Client(base_url=self.url, headers=headers, timeout=timeout_s)

    def close(self) -> None:
        """Close the connection pool."""
        self._http.close()

    def call(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        """Send one request and return its JSON body; raise CliError on any failure."""
        import httpx

        try:
            r = self._http.request(method, path, json=body)
        except httpx.HTTPError as exc:
            msg = f"cannot reach the API at {self.url}: {type(exc).__name__}: {exc}"
            raise CliError(msg) from exc
        if r.status_code >= 400:
            raise CliError(_describe_error(r.status_code, r.text))
        return r.json() if r.content else None


def _describe_error(status: int, text: str) -> str:
    """``job "a" already exists (HTTP 409 job_exists, field name)`` from the API's error body."""
    try:
        err = json.loads(text)["error"]
        where = f", field {err['field']}" if err.get("field") else ""
        return f"{err['message']} (HTTP {status} {err['type']}{where})"
    except (ValueError, KeyError, TypeError):
        first = text.strip().splitlines()[0][:200] if text.strip() else "no body"
        return f"HTTP {status}: {first}"


# -- rendering ------------------------------------------------------------------------------------------
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
        frac = 1.0 if stage == "finished" or total <= 0 else done / total
        committed_frac = 1.0 if stage == "finished" or total <= 0 else committed / total
        counts = f"{done}/{total}"
    filled = round((frac or 0.0) * width)
    solid = min(filled, round(committed_frac * width))
    pct = f"{frac * 100:.1f}%" if frac is not None else "?%"
    bar = "#" * solid + "=" * (filled - solid) + "-" * (width - filled)
    return f"{split.get('split')}  [{bar}] {pct:>6}  {counts}  {stage}"


def table_bar(table: dict[str, Any], width: int = BAR_WIDTH) -> str:
    """``snapshot  [#####-----]  52.0%  rows 520/1000  vnodes 133/256  consuming_snapshot  lag 4 versions``.

    The fraction is the API's ``progress`` (rows copied of the snapshot's row count); vnodes completed of
    all when it has none.
    """
    total = int(table.get("vnodes_total") or 0)
    done = int(table.get("vnodes_completed") or 0)
    frac = table.get("progress")
    if frac is None:
        frac = 1.0 if total <= 0 else done / total
    frac = max(0.0, min(1.0, float(frac)))
    filled = round(frac * width)
    lag = table.get("lag_versions")
    rows = "" if table.get("rows_total") is None else \
        f"rows {table.get('rows_copied', 0)}/{table['rows_total']}  "
    return (f"{table.get('strategy')}  [{'#' * filled}{'-' * (width - filled)}] {frac * 100:5.1f}%  "
            f"{rows}vnodes {done}/{total}  {table.get('phase')}  lag {'?' if lag is None else lag} versions")


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


def job_line(job: dict[str, Any]) -> str:
    """One summary line of a job."""
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


# -- commands -------------------------------------------------------------------------------------------
def _cmd_run(args: argparse.Namespace, _out: IO[str]) -> int:
    from source_backfill.config import load_settings
    from source_backfill.errors import ConfigError

    try:
        settings = load_settings(args.config)
    except ConfigError as exc:
        raise CliError(str(exc), EXIT_USAGE) from exc
    from source_backfill.daemon import run_daemon
    from source_backfill.errors import SourceBackfillError, one_line

    try:
        return int(run_daemon(settings))
    except SourceBackfillError as exc:  # e.g. a damaged mutation log: one line, what it left stopped
        msg = f"the daemon did not start: {one_line(exc, limit=2000)}"
        raise CliError(msg, EXIT_API) from exc


def _cmd_jobs_list(args: argparse.Namespace, out: IO[str]) -> int:
    jobs = _client(args).call("GET", "/jobs")
    print(json.dumps(jobs, indent=2) if args.json else render_table(jobs), file=out)
    return EXIT_OK


def _cmd_jobs_create(args: argparse.Namespace, out: IO[str]) -> int:
    start: dict[str, Any] = {"kind": "earliest"}
    if args.start_offsets is not None:
        start = {"kind": "offsets", "offsets": args.start_offsets}
    elif args.start_timestamp is not None:
        start = {"kind": "timestamp", "timestamp_ms": args.start_timestamp}
    elif args.start_latest:
        start = {"kind": "latest"}
    # a relative --sink means relative to where the command runs, not to the daemon's working directory
    # (joined, not normalized: a '..' after a symlink is the daemon's to resolve, as its path rules do)
    sink = args.sink if os.path.isabs(args.sink) else os.path.join(os.getcwd(), args.sink)  # noqa: PTH118
    body: dict[str, Any] = {"name": args.name, "source": args.source, "sink_path": sink, "start": start}
    if args.rate_limit is not None:
        body["rate_limit"] = args.rate_limit
    if args.max_rows_per_epoch is not None:
        body["max_rows_per_epoch"] = args.max_rows_per_epoch
    if args.transform is not None:
        body["transform"] = args.transform
    if args.strategy is not None:
        body["strategy"] = args.strategy
    if args.mode is not None:
        body["mode"] = args.mode
    if args.dry_run:
        plan = _client(args).call("POST", "/jobs?dry_run=true", body)
        print(json.dumps(plan, indent=2) if args.json else render_plan(plan), file=out)
        return EXIT_OK
    job = _client(args).call("POST", "/jobs", body)
    print(f'created job "{job["name"]}" on source "{job["source"]}" -> {job["sink_path"]}; '
          "it attaches at the next epoch", file=out)
    return EXIT_OK


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    return f"{seconds:.1f} s" if seconds < 120 else f"{seconds / 60:.1f} min"


def render_plan(plan: dict[str, Any]) -> str:
    """A dry run's plan: per split offsets, total, the two time estimates, warnings."""
    job = plan["job"]
    lines = [f'dry run: job "{job["name"]}" on source "{job["source"]}" -> {job["sink_path"]}: every check '
             "passed; nothing was created"]
    for s in plan.get("splits", []):
        lines.append(f"  {s['split']}  offsets {s['from_offset']}..{s['to_offset']}  {s['offsets']} to copy")
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


def _cmd_jobs_show(args: argparse.Namespace, out: IO[str]) -> int:
    job = _client(args).call("GET", f"/jobs/{args.name}")
    if args.json:
        print(json.dumps(job, indent=2), file=out)
        return EXIT_OK
    print(render_jobs([job]), file=out)
    start = job.get("start") or {}
    print(f"  source {job['source']}  sink {job['sink_path']}  start {json.dumps(start)}"
          f"  transform {job.get('transform') or 'identity'}", file=out)
    return EXIT_OK


Handler = Callable[[argparse.Namespace, IO[str]], int]


def _mutation(
    verb: str, method: str, path: str, body: Callable[[argparse.Namespace], Any] | None = None
) -> Handler:
    def run(args: argparse.Namespace, out: IO[str]) -> int:
        job = _client(args).call(method, path.format(name=args.name), body(args) if body else None)
        extra = ""
        if verb == "throttled":
            extra = " to " + ("unlimited" if job["rate_limit"] is None else f"{job['rate_limit']:g} rows/s")
        print(f'{verb} job "{job["name"]}"{extra} (applies at the next epoch boundary)', file=out)
        return EXIT_OK

    return run


def _cmd_verify(args: argparse.Namespace, out: IO[str]) -> int:
    """Start a verify run, poll it to its end, print its summary; exit 3 if not exactly once."""
    client = _client(args)
    run = client.call("POST", f"/jobs/{args.job}/verify")
    while run["status"] == "running":
        time.sleep(VERIFY_POLL_S)
        run = client.call("GET", f"/jobs/{args.job}/verify/{run['id']}")
    if args.json:
        print(json.dumps(run, indent=2), file=out)
    if run["status"] != "done":
        msg = f'verify of job "{args.job}" {run["status"]}: {run.get("error")}'
        raise CliError(msg)
    if not args.json:
        print(run["summary"], file=out)
    return EXIT_OK if run["ok"] else EXIT_DIFFERS


def _cmd_status(args: argparse.Namespace, out: IO[str]) -> int:
    client = _client(args)

    def fetch() -> list[dict[str, Any]]:
        if args.job:
            return [client.call("GET", f"/jobs/{args.job}")]
        return list(client.call("GET", "/jobs"))

    if args.watch is None:
        print(render_jobs(fetch()), file=out)
        return EXIT_OK
    clear = out.isatty()
    try:
        while True:
            jobs = fetch()
            frame = render_jobs(jobs)
            if clear:
                out.write("\x1b[H\x1b[2J")
            print(f"{time.strftime('%H:%M:%S')}  {client.url}\n{frame}\n", file=out, flush=True)
            if args.until_finished and jobs and all(j["status"] in ("finished", "failed") for j in jobs):
                return EXIT_OK
            time.sleep(args.watch)
    except KeyboardInterrupt:
        return EXIT_OK


# -- parsing --------------------------------------------------------------------------------------------
def _offsets(value: str) -> dict[str, Any]:
    try:
        offsets = json.loads(value)
    except ValueError as exc:
        msg = f'needs a JSON object like \'{{"topic:0": 42}}\': {exc}'
        raise argparse.ArgumentTypeError(msg) from exc
    if not isinstance(offsets, dict):
        msg = 'needs a JSON object like \'{"topic:0": 42}\''
        raise argparse.ArgumentTypeError(msg)
    return offsets


def _timestamp(value: str) -> int:
    if not value.isdigit():
        msg = f"needs milliseconds since the epoch (an integer >= 0), got {value!r}"
        raise argparse.ArgumentTypeError(msg)
    return int(value)


def _seconds(value: str) -> float:
    try:
        seconds = float(value)
    except ValueError:
        seconds = -1.0
    if not seconds > 0 or seconds == float("inf"):
        msg = f"needs a number of seconds > 0, got {value!r}"
        raise argparse.ArgumentTypeError(msg)
    return seconds


def _rate(value: str) -> float | None:
    if value.lower() in ("none", "unlimited", "null"):
        return None
    try:
        return float(value)
    except ValueError as exc:
        msg = f"rate must be rows/s (a number) or 'none' for unlimited, got {value!r}"
        raise argparse.ArgumentTypeError(msg) from exc


def _token(args: argparse.Namespace) -> str | None:
    """``--token``, else the contents of ``--token-file`` (the secret stays out of ``ps`` and history)."""
    if args.token or not args.token_file:
        return args.token
    try:
        return Path(args.token_file).read_text(encoding="utf-8").strip() or None
    except OSError as exc:
        msg = f"token file {args.token_file} cannot be read: {exc.strerror}"
        raise CliError(msg, EXIT_USAGE) from None


def _client(args: argparse.Namespace) -> ApiClient:
    client = ApiClient(args.api, _token(args), args.timeout)
    args._clients.append(client)  # closed by main  # noqa: SLF001
    return client


def _api_flags(parser: argparse.ArgumentParser, *, top: bool) -> None:
    """``--api``, ``--token``, ``--timeout``: env defaults on the top parser, repeatable after a command."""

    def default(value: Any) -> Any:
        return value if top else argparse.SUPPRESS

    parser.add_argument("--api", metavar="URL", default=default(os.environ.get(ENV_API, DEFAULT_API)),
                        help=f"control API base URL (default {DEFAULT_API}) [env: {ENV_API}]")
    parser.add_argument("--token", default=default(os.environ.get(ENV_TOKEN) or None),
                        help=f"bearer token for mutating calls [env: {ENV_TOKEN}]")
    parser.add_argument("--token-file", metavar="PATH",
                        default=default(os.environ.get(ENV_TOKEN_FILE) or None),
                        help=f"read the bearer token from a file [env: {ENV_TOKEN_FILE}]")
    parser.add_argument("--timeout", type=float, metavar="S", default=default(10.0),
                        help="HTTP timeout in seconds (default 10)")


def build_parser() -> argparse.ArgumentParser:
    """The whole command line."""
    parser = argparse.ArgumentParser(
        prog="source-backfill",
        description="Attach jobs to a live shared Kafka source; backfill history, hand over exactly once.",
        epilog="exit codes: 0 ok, 1 API error or the daemon could not start, 2 usage or configuration error, "
               "3 verify found differences",
    )
    _api_flags(parser, top=True)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    run = sub.add_parser("run", help="run the daemon (until SIGTERM/SIGINT)")
    run.add_argument("--config", required=True, metavar="FILE",
                     help="TOML config file (SOURCE_BACKFILL_* environment variables override it)")
    run.set_defaults(handler=_cmd_run)

    jobs = sub.add_parser("jobs", help="list, create, show and control jobs")
    jobs_sub = jobs.add_subparsers(dest="jobs_command", metavar="ACTION")
    jobs.set_defaults(handler=None, parser=jobs)

    def action(name: str, help_: str, handler: Any, *, job: bool = True) -> argparse.ArgumentParser:
        p = jobs_sub.add_parser(name, help=help_, description=help_)
        _api_flags(p, top=False)
        if job:
            p.add_argument("name", metavar="NAME", help="job name")
        p.set_defaults(handler=handler)
        return p

    p = action("list", "list every job", _cmd_jobs_list, job=False)
    p.add_argument("--json", action="store_true", help="print the API's JSON")
    p = action("create", "create a job (it attaches at the next epoch boundary)", _cmd_jobs_create)
    p.add_argument("--source", required=True, help="name of a configured source")
    p.add_argument("--sink", required=True, metavar="PATH",
                   help="Delta table path of the job's output (a relative one is taken from this "
                   "command's working directory)")
    start = p.add_mutually_exclusive_group()
    start.add_argument("--start-offsets", type=_offsets, metavar="JSON",
                       help="start offset per split, e.g. '{\"topic:0\": 42}' (others: earliest)")
    start.add_argument("--start-timestamp", type=_timestamp, metavar="MS",
                       help="start at the first record at or after this Kafka timestamp (ms)")
    start.add_argument("--start-latest", action="store_true",
                       help="no history: only records after the job attaches")
    p.add_argument("--rate-limit", type=float, metavar="R", help="history rows/s (0 = read none for now)")
    p.add_argument("--max-rows-per-epoch", type=int, metavar="N", help="history rows per epoch at most")
    p.add_argument("--transform", metavar="SQL", help="Spark SQL over {source}, e.g. 'SELECT key, value FROM "
                   "{source}'")
    p.add_argument("--strategy", choices=("snapshot", "arrangement", "chain"),
                   help="jobs on a delta source: how the table is copied")
    p.add_argument("--dry-run", action="store_true",
                   help="check everything a create checks and print the plan (offsets per split, time at the "
                   "rate limit and at the measured history rate); create nothing")
    p.add_argument("--json", action="store_true", help="with --dry-run: print the API's JSON")
    p.add_argument("--mode", choices=("merge", "changelog"),
                   help="jobs on a delta source: the table copied by key (merge, default) or a changelog")
    p = action("show", "show a job with per-split progress", _cmd_jobs_show)
    p.add_argument("--json", action="store_true", help="print the API's JSON")
    action("pause", "stop reading history (live rows keep flowing)",
           _mutation("paused", "POST", "/jobs/{name}/pause"))
    action("resume", "read history again", _mutation("resumed", "POST", "/jobs/{name}/resume"))
    p = action("throttle", "set the history rate limit",
               _mutation("throttled", "PATCH", "/jobs/{name}", lambda a: {"rate_limit": a.rate}))
    p.add_argument("rate", metavar="RATE", type=_rate, help="rows/s, 0 to read none, 'none' for unlimited")
    action("retry", "run a failed job again (rebuilt from its table at the next epoch)",
           _mutation("retried", "POST", "/jobs/{name}/retry"))
    action("drop", "detach the job at the next epoch boundary (its table stays)",
           _mutation("dropped", "DELETE", "/jobs/{name}"))

    verify = sub.add_parser(
        "verify", help="check a job's table holds its source exactly once (exit 3 if not)",
        description="Check, offset by offset, that the job's table holds its Kafka log exactly once up to "
                    "the job's committed positions; the daemon runs it in the background, this command "
                    "polls it and prints one summary line (and the differences, counted, with examples).")
    _api_flags(verify, top=False)
    verify.add_argument("job", metavar="JOB", help="job name")
    verify.add_argument("--json", action="store_true", help="print the API's JSON of the finished run")
    verify.set_defaults(handler=_cmd_verify)

    status = sub.add_parser("status", help="per-split backfill progress bars")
    _api_flags(status, top=False)
    status.add_argument("job", nargs="?", metavar="JOB", help="only this job")
    status.add_argument("--watch", type=_seconds, metavar="SECONDS",
                        help="refresh every SECONDS until Ctrl-C")
    status.add_argument("--until-finished", action="store_true",
                        help="with --watch: stop once every shown job is finished (or failed)")
    status.set_defaults(handler=_cmd_status)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``source-backfill``; returns the exit code."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # usage errors (2) and --help (0)
        return int(exc.code) if isinstance(exc.code, int) else EXIT_USAGE
    handler = getattr(args, "handler", None)
    if handler is None:
        (getattr(args, "parser", None) or parser).print_help(sys.stderr)
        return EXIT_USAGE
    args._clients = []  # noqa: SLF001
    try:
        return int(handler(args, sys.stdout))
    except CliError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.code
    finally:
        for client in args._clients:  # noqa: SLF001
            client.close()


if __name__ == "__main__":
    raise SystemExit(main())
