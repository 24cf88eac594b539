"""The command handlers: each takes the parsed arguments and the output stream, returns the exit code.

A handler raises :class:`~source_backfill.cli.client.CliError` for a failure ``main`` prints on one line.
The API clients a handler opens are kept on ``args._clients``, which ``main`` closes.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from source_backfill.cli.client import EXIT_API, EXIT_DIFFERS, EXIT_OK, EXIT_USAGE, ApiClient, CliError
from source_backfill.cli.render import render_jobs, render_plan, render_table, repair_text

#: The least HTTP timeout of ``sources reset`` (s): it stops the source and starts its streaming query.
RESET_TIMEOUT_S = 120.0

#: A command handler: the parsed arguments and where to print, to the exit code.
Handler = Callable[[argparse.Namespace, IO[str]], int]


def _token(args: argparse.Namespace) -> str | None:
    """``--token``, else the contents of ``--token-file`` (the secret stays out of ``ps`` and history)."""
    if args.token or not args.token_file:
        token: str | None = args.token
        return token
    try:
        return Path(args.token_file).read_text(encoding="utf-8").strip() or None
    except OSError as exc:
        msg = f"token file {args.token_file} cannot be read: {exc.strerror}"
        raise CliError(msg, EXIT_USAGE) from None


def _client(args: argparse.Namespace) -> ApiClient:
    client = ApiClient(args.api, _token(args), args.timeout)
    args._clients.append(client)  # closed by main  # noqa: SLF001
    return client


def _verify_poll_s() -> float:
    """How often ``verify`` polls its run: ``source_backfill.cli.VERIFY_POLL_S``, read when it runs.

    The setting lives on the package, the name callers (and tests, to poll faster) change.
    """
    from source_backfill import cli

    return float(cli.VERIFY_POLL_S)


def cmd_new_token(args: argparse.Namespace, out: IO[str]) -> int:
    """``token``: a new random token, and its ``api.principals_file`` entry (the file holds its hash only)."""
    from source_backfill.api.principals import new_token
    from source_backfill.core.access import parse_roles

    roles: dict[str, str] = {}
    for given in args.role:
        namespace, sep, role = given.partition("=")
        if not sep:
            msg = f"--role {given!r}: give NAMESPACE=ROLE, e.g. team-a=editor"
            raise CliError(msg, EXIT_USAGE)
        roles[namespace] = role
    try:
        parse_roles(roles)
    except ValueError as exc:
        msg = f"--role: {exc}"
        raise CliError(msg, EXIT_USAGE) from exc
    token, digest = new_token()
    entry = {"name": args.name, "token_sha256": digest, "roles": roles}
    out.write(f"token (give it to {args.name}; it is not stored anywhere): {token}\n")
    out.write(f"entry for api.principals_file: {json.dumps(entry)}\n")
    return EXIT_OK


def cmd_run(args: argparse.Namespace, _out: IO[str]) -> int:
    """``run``: load the config and run the daemon until it stops; exit 2 on a bad config, 1 if it fails."""
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


def cmd_jobs_list(args: argparse.Namespace, out: IO[str]) -> int:
    """``jobs list``: one row per job (or the API's JSON)."""
    jobs = _client(args).call("GET", "/jobs")
    if args.namespace is not None:
        jobs = [j for j in jobs if j.get("namespace", "default") == args.namespace]
    print(json.dumps(jobs, indent=2) if args.json else render_table(jobs), file=out)
    return EXIT_OK


def cmd_audit(args: argparse.Namespace, out: IO[str]) -> int:
    """``audit``: the accepted mutations, oldest first: when, who, what, which job (or the API's JSON)."""
    from urllib.parse import urlencode

    query = urlencode({k: v for k, v in (("job", args.job), ("limit", args.limit)) if v is not None})
    rows = _client(args).call("GET", f"/audit/refused?{query}" if args.refused else f"/audit?{query}")
    if args.json:
        print(json.dumps(rows, indent=2), file=out)
        return EXIT_OK
    if args.refused:
        for r in rows:
            print(f"{r['at']}  {r['status']}  {r['by'] or '-'}  {r['method']} {r['path']}  {r['reason']}",
                  file=out)
        return EXIT_OK
    for r in rows:
        detail = "" if r["detail"] in ("{}", "") else f" {r['detail']}"
        print(f"{r['at']}  #{r['id']}  {r['by'] or '(daemon)'}  {r['kind']}  {r['job']}{detail}", file=out)
    return EXIT_OK


def cmd_jobs_create(args: argparse.Namespace, out: IO[str]) -> int:
    """``jobs create``: the request body from the flags; ``--dry-run`` prints the plan instead."""
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
    if args.namespace is not None:  # its jobs are named NS.<name>: given without, the prefix is added
        body["namespace"] = args.namespace
        if not args.name.startswith(f"{args.namespace}."):
            body["name"] = f"{args.namespace}.{args.name}"
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


def cmd_jobs_show(args: argparse.Namespace, out: IO[str]) -> int:
    """``jobs show``: the job's line, its bars, and its spec (or the API's JSON)."""
    job = _client(args).call("GET", f"/jobs/{args.name}")
    if args.json:
        print(json.dumps(job, indent=2), file=out)
        return EXIT_OK
    print(render_jobs([job]), file=out)
    start = job.get("start") or {}
    print(f"  source {job['source']}  sink {job['sink_path']}  start {json.dumps(start)}"
          f"  transform {job.get('transform') or 'identity'}", file=out)
    return EXIT_OK


def mutation(
    verb: str, method: str, path: str, body: Callable[[argparse.Namespace], Any] | None = None
) -> Handler:
    """The handler of ``jobs pause|resume|throttle|transform|retry|drop``: one request, one line."""

    def run(args: argparse.Namespace, out: IO[str]) -> int:
        job = _client(args).call(method, path.format(name=args.name), body(args) if body else None)
        extra = ""
        if verb == "re-transformed":
            extra = " to " + (job["transform"] or "identity")
        if verb == "throttled":
            extra = " to " + ("unlimited" if job["rate_limit"] is None else f"{job['rate_limit']:g} rows/s")
        print(f'{verb} job "{job["name"]}"{extra} (applies at the next epoch boundary)', file=out)
        return EXIT_OK

    return run


def cmd_jobs_retry(args: argparse.Namespace, out: IO[str]) -> int:
    """``jobs retry``: resume a failed job from its table, or (``--from earliest --new-table``) start over."""
    if args.sink is not None and not args.new_table:
        msg = "--sink is the new table's path: give it with --from earliest --new-table"
        raise CliError(msg, EXIT_USAGE)
    if bool(args.start_from) != args.new_table:
        msg = "--from earliest and --new-table go together (a retry never re-reads into the old table)"
        raise CliError(msg, EXIT_USAGE)
    body: dict[str, Any] | None = None
    if args.new_table:
        body = {"from": args.start_from, "new_table": True}
        if args.sink is not None:  # relative to where the command runs, as a create's --sink
            body["sink"] = args.sink if os.path.isabs(args.sink) else os.path.join(os.getcwd(), args.sink)  # noqa: PTH118
    job = _client(args).call("POST", f"/jobs/{args.name}/retry", body)
    into = f" from the earliest offsets into a new table {job['sink_path']}" if body is not None else ""
    print(f'retried job "{job["name"]}"{into} (applies at the next epoch boundary)', file=out)
    return EXIT_OK


def cmd_sources_reset(args: argparse.Namespace, out: IO[str]) -> int:
    """``sources reset``: start a source stopped for good over; exit 1 if it did not start again."""
    args.timeout = max(args.timeout, RESET_TIMEOUT_S)  # it stops and starts a streaming query
    done = _client(args).call("POST", f"/sources/{args.source}/reset")
    kept = f"<state_root>/{done['moved_to']}"
    if done["state"] != "running":
        msg = (f'source "{done["source"]}" was reset (its old folder kept at {kept}) but did not start '
               f"again: {done.get('error')}; reset it again once that is fixed")
        raise CliError(msg)
    print(f'reset source "{done["source"]}": its old folder is kept at {kept}, and it reads the new log. '
          "Its jobs stay failed: run each again with "
          "'source-backfill jobs retry NAME --from earliest --new-table'", file=out)
    return EXIT_OK


def cmd_jobs_repair(args: argparse.Namespace, out: IO[str]) -> int:
    """``jobs repair``: accept a repair; with ``--wait``, poll the job until it is done (exit 1 if failed)."""
    body: dict[str, Any] = {"splits": args.splits}
    if args.offsets is not None:
        body["from_offset"], body["to_offset"] = args.offsets
    else:
        body["from_timestamp_ms"], body["to_timestamp_ms"] = args.timestamps
    client = _client(args)
    repair = client.call("POST", f"/jobs/{args.name}/repair", body)
    if not args.wait:
        print(f'repair {repair["id"]} of job "{args.name}" accepted (runs at its next epoch boundary)',
              file=out)
        return EXIT_OK
    while repair["state"] == "pending":
        time.sleep(_verify_poll_s())
        job = client.call("GET", f"/jobs/{args.name}")
        repair = next((r for r in job.get("repairs") or [] if r["id"] == repair["id"]), repair)
    print(repair_text(repair), file=out)
    if repair["state"] == "failed":
        msg = f'repair {repair["id"]} of job "{args.name}" failed: the table is as it was'
        raise CliError(msg)
    return EXIT_OK


def cmd_verify(args: argparse.Namespace, out: IO[str]) -> int:
    """Start a verify run, poll it to its end, print its summary; exit 3 if not exactly once."""
    client = _client(args)
    run = client.call("POST", f"/jobs/{args.job}/verify")
    while run["status"] == "running":
        time.sleep(_verify_poll_s())
        run = client.call("GET", f"/jobs/{args.job}/verify/{run['id']}")
    if args.json:
        print(json.dumps(run, indent=2), file=out)
    if run["status"] != "done":
        msg = f'verify of job "{args.job}" {run["status"]}: {run.get("error")}'
        raise CliError(msg)
    if not args.json:
        print(run["summary"], file=out)
    return EXIT_OK if run["ok"] else EXIT_DIFFERS


def cmd_status(args: argparse.Namespace, out: IO[str]) -> int:
    """``status``: the jobs' lines and bars, once or every ``--watch`` seconds until Ctrl-C."""
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
