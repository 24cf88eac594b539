"""The ``source-backfill`` command: run the daemon, control its jobs over the API, watch backfill progress.

Exit codes: 0 ok, 1 the API refused the request (or could not be reached), 2 usage or configuration error,
3 ``verify`` found the table not exactly once.

One concern per module: :mod:`~source_backfill.cli.client` (the API client, :class:`CliError` and the exit
codes), :mod:`~source_backfill.cli.render` (the text of jobs, bars, tables, plans),
:mod:`~source_backfill.cli.commands` (the handlers), :mod:`~source_backfill.cli.parser` (the command
line); :func:`main` here runs one command.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from source_backfill.cli.client import EXIT_API, EXIT_DIFFERS, EXIT_OK, EXIT_USAGE, ApiClient, CliError
from source_backfill.cli.parser import DEFAULT_API, ENV_API, ENV_TOKEN, ENV_TOKEN_FILE, build_parser
from source_backfill.cli.render import (
    BAR_WIDTH,
    eta_text,
    job_line,
    latency_text,
    render_jobs,
    render_plan,
    render_table,
    split_bar,
    table_bar,
)

#: How often ``verify`` polls its run (read from here when it runs: set it here to change it).
VERIFY_POLL_S = 0.5

__all__ = [
    "BAR_WIDTH", "DEFAULT_API", "ENV_API", "ENV_TOKEN", "ENV_TOKEN_FILE", "EXIT_API", "EXIT_DIFFERS",
    "EXIT_OK", "EXIT_USAGE", "VERIFY_POLL_S", "ApiClient", "CliError", "build_parser", "eta_text",
    "job_line", "latency_text", "main", "render_jobs", "render_plan", "render_table", "split_bar",
    "table_bar",
]


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
