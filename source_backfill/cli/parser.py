"""The command line: every command, its arguments and their checks, and the handler each one runs."""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

from source_backfill.cli.commands import (
    Handler,
    cmd_audit,
    cmd_jobs_create,
    cmd_jobs_list,
    cmd_jobs_repair,
    cmd_jobs_retry,
    cmd_jobs_show,
    cmd_new_token,
    cmd_run,
    cmd_sources_reset,
    cmd_status,
    cmd_verify,
    mutation,
)

ENV_API = "SOURCE_BACKFILL_API_URL"
ENV_TOKEN = "SOURCE_BACKFILL_API_TOKEN"  # noqa: S105 - the name of an environment variable, not a secret
ENV_TOKEN_FILE = "SOURCE_BACKFILL_API_TOKEN_FILE"  # noqa: S105 - the name of an environment variable
DEFAULT_API = "http://127.0.0.1:8080"


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


def _transform(value: str) -> str | None:
    return None if value.strip().lower() == "identity" else value


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
    run.set_defaults(handler=cmd_run)

    jobs = sub.add_parser("jobs", help="list, create, show and control jobs")
    jobs_sub = jobs.add_subparsers(dest="jobs_command", metavar="ACTION")
    jobs.set_defaults(handler=None, parser=jobs)

    def action(name: str, help_: str, handler: Handler, *, job: bool = True) -> argparse.ArgumentParser:
        p = jobs_sub.add_parser(name, help=help_, description=help_)
        _api_flags(p, top=False)
        if job:
            p.add_argument("name", metavar="NAME", help="job name")
        p.set_defaults(handler=handler)
        return p

    p = action("list", "list every job (your token's namespaces')", cmd_jobs_list, job=False)
    p.add_argument("--json", action="store_true", help="print the API's JSON")
    p.add_argument("--namespace", metavar="NS", help="only this namespace's jobs")
    p = action("create", "create a job (it attaches at the next epoch boundary)", cmd_jobs_create)
    p.add_argument("--source", required=True, help="name of a configured source")
    p.add_argument("--namespace", metavar="NS",
                   help="the job's namespace (its name is then NS.<name>); default: default")
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
    p = action("show", "show a job with per-split progress", cmd_jobs_show)
    p.add_argument("--json", action="store_true", help="print the API's JSON")
    action("pause", "stop reading history (live rows keep flowing)",
           mutation("paused", "POST", "/jobs/{name}/pause"))
    action("resume", "read history again", mutation("resumed", "POST", "/jobs/{name}/resume"))
    p = action("throttle", "set the history rate limit",
               mutation("throttled", "PATCH", "/jobs/{name}", lambda a: {"rate_limit": a.rate}))
    p.add_argument("rate", metavar="RATE", type=_rate, help="rows/s, 0 to read none, 'none' for unlimited")
    p = action("transform", "change the job's transform (from its next epoch; older rows keep the old one)",
               mutation("re-transformed", "PATCH", "/jobs/{name}", lambda a: {"transform": a.sql}))
    p.add_argument("sql", metavar="SQL", type=_transform,
                   help="Spark SQL over {source}, checked like a create's; 'identity' for none")
    p = action("repair", "replace a window of the job's rows with a fresh copy (its current transform), "
               "in one commit", cmd_jobs_repair)
    p.add_argument("--split", action="append", default=[], metavar="TOPIC:PARTITION", dest="splits",
                   help="a split to repair (repeat it; none: every split of the job)")
    window = p.add_mutually_exclusive_group(required=True)
    window.add_argument("--offsets", nargs=2, type=int, metavar=("FROM", "TO"),
                        help="offsets [FROM, TO) (TO exclusive)")
    window.add_argument("--timestamps", nargs=2, type=_timestamp, metavar=("FROM_MS", "TO_MS"),
                        help="records with Kafka timestamps in [FROM_MS, TO_MS) (where Kafka holds them)")
    p.add_argument("--wait", action="store_true", help="wait for the repair to finish and print what it did")
    p = action("retry", "run a failed job again (rebuilt from its table at the next epoch; with --from "
               "earliest --new-table, from the start into a new table)", cmd_jobs_retry)
    p.add_argument("--from", dest="start_from", choices=("earliest",), metavar="earliest",
                   help="with --new-table: start again from the earliest offsets")
    p.add_argument("--new-table", action="store_true",
                   help="with --from earliest: write a new table, the old one left as it is (for a job whose "
                   "topic was deleted and created again)")
    p.add_argument("--sink", metavar="PATH",
                   help="with --new-table: the new table's path (default: the old one with -2, -3, ... "
                   "appended, the first free)")

    sources = sub.add_parser("sources", help="start a source stopped for good over")
    sources_sub = sources.add_subparsers(dest="sources_command", metavar="ACTION")
    sources.set_defaults(handler=None, parser=sources)
    p = sources_sub.add_parser(
        "reset", help="start a source stopped for good over (its topic deleted and created again)",
        description="Move the source's folder (checkpoint, topic ids, anchors) aside under the state root, "
                    "kept for inspection, and start the source again in the running daemon: it reads the "
                    "new log. Only for a source stopped for good. Its jobs stay failed: run each again with "
                    "'jobs retry NAME --from earliest --new-table'.")
    _api_flags(p, top=False)
    p.add_argument("source", metavar="SRC", help="source name")
    p.set_defaults(handler=cmd_sources_reset)
    action("drop", "detach the job at the next epoch boundary (its table stays)",
           mutation("dropped", "DELETE", "/jobs/{name}"))

    verify = sub.add_parser(
        "verify", help="check a job's table holds its source exactly once (exit 3 if not)",
        description="Check, offset by offset, that the job's table holds its Kafka log exactly once up to "
                    "the job's committed positions; the daemon runs it in the background, this command "
                    "polls it and prints one summary line (and the differences, counted, with examples).")
    _api_flags(verify, top=False)
    verify.add_argument("job", metavar="JOB", help="job name")
    verify.add_argument("--json", action="store_true", help="print the API's JSON of the finished run")
    verify.set_defaults(handler=cmd_verify)

    audit = sub.add_parser(
        "audit", help="who changed which job, when (the accepted mutations, oldest first)",
        description="Print the daemon's audit table: one line per accepted mutation (when, its id, the "
                    "principal, what, which job), of the namespaces your token holds a role in; with "
                    "--refused, one per refused request (when, the answer, the principal, the request, "
                    "why).")
    _api_flags(audit, top=False)
    audit.add_argument("--job", metavar="JOB", help="only this job's")
    audit.add_argument("--limit", type=int, metavar="N", help="the last N (default 100)")
    audit.add_argument("--refused", action="store_true",
                       help="the refused requests instead (401, 403, 404 of another namespace's job)")
    audit.add_argument("--json", action="store_true", help="print the API's JSON")
    audit.set_defaults(handler=cmd_audit)

    token = sub.add_parser(
        "token", help="make a token for a principal of api.principals_file",
        description="Print a new random token and the principals-file entry that holds its SHA-256 (add "
                    "the entry to the file, then SIGHUP the daemon; the token itself is stored nowhere).")
    token.add_argument("name", metavar="PRINCIPAL", help="the principal's name (in the log)")
    token.add_argument("--role", action="append", default=[], metavar="NAMESPACE=ROLE",
                       help="a role in a namespace (viewer, operator, editor, admin; '*' for every "
                            "namespace); repeatable")
    token.set_defaults(handler=cmd_new_token)

    status = sub.add_parser("status", help="per-split backfill progress bars")
    _api_flags(status, top=False)
    status.add_argument("job", nargs="?", metavar="JOB", help="only this job")
    status.add_argument("--watch", type=_seconds, metavar="SECONDS",
                        help="refresh every SECONDS until Ctrl-C")
    status.add_argument("--until-finished", action="store_true",
                        help="with --watch: stop once every shown job is finished (or failed)")
    status.set_defaults(handler=cmd_status)
    return parser
