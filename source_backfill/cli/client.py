"""The control API as the CLI calls it: one request, its JSON body, and any failure as one line.

The exit codes live here with :class:`CliError`, which carries one of them to ``main``.
"""

from __future__ import annotations

import json
from typing import Any

#: Exit codes: ok; the API refused the request (or could not be reached, or the daemon did not start);
#: usage or configuration error; ``verify`` found the table not exactly once.
EXIT_OK, EXIT_API, EXIT_USAGE, EXIT_DIFFERS = 0, 1, 2, 3


class CliError(Exception):
    """A failure to report on one line, with the process exit code."""

    def __init__(self, message: str, code: int = EXIT_API) -> None:
        super().__init__(message)
        self.code = code


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
