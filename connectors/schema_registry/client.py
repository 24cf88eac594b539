"""A Schema Registry client for decoding: writer schemas by id (cached), a subject's latest version.

Confluent's REST API (``GET /schemas/ids/{id}``, ``GET /subjects/{subject}/versions/latest``), as
Confluent's registry, Apicurio's ``/apis/ccompat/v7`` and Karapace serve it. A schema id names one
schema for ever, so each is fetched once per client and kept. A registry that does not answer (refused,
timed out, 5xx, 429) is retried with exponential backoff until ``deadline_s``, then
:class:`~source_backfill.errors.RegistryUnavailableError`: a registry down for a while delays a batch,
never fails or skips it. An id or subject the registry does not know, and a refused login, are not
retried: they will not change by waiting (:class:`~source_backfill.errors.SchemaNotFoundError`,
:class:`~source_backfill.errors.SchemaRegistryError`).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
from tenacity import Retrying, retry_if_exception_type, stop_after_delay, wait_exponential

from source_backfill.errors import RegistryUnavailableError, SchemaNotFoundError, SchemaRegistryError

#: Statuses a registry answers while it is starting, overloaded or failing over: worth asking again.
_RETRIED_STATUS = frozenset({408, 425, 429, 500, 502, 503, 504})


class _Unavailable(Exception):
    """One attempt that found the registry unavailable (retried)."""


@dataclass(frozen=True)
class SubjectVersion:
    """A subject's version: its global schema id, its version number and the schema's JSON."""

    subject: str
    id: int
    version: int
    schema: str


class RegistryClient:
    """Writer schemas by id and latest versions from one Schema Registry. Thread-safe."""

    def __init__(self, url: str, *, username: str | None = None, password: str | None = None,
                 ca_file: Path | str | None = None, timeout_s: float = 10.0,
                 deadline_s: float = 120.0) -> None:
        self.url = url.rstrip("/")
        self.deadline_s = deadline_s
        auth = httpx.BasicAuth(username, password or "") if username else None
        verify: Any = str(ca_file) if ca_file else True
        self._http = httpx.Client(base_url=self.url, auth=auth, verify=verify, timeout=timeout_s,
                                  headers={"Accept": "application/vnd.schemaregistry.v1+json"})
        self._schemas: dict[int, str] = {}
        self._lock = threading.Lock()
        #: requests sent (each attempt counts): what a test checks the cache by
        self.requests = 0

    def schema(self, schema_id: int) -> str:
        """The writer schema (its JSON) of ``schema_id``; fetched once, then from the cache."""
        with self._lock:
            cached = self._schemas.get(schema_id)
        if cached is not None:
            return cached
        body = self._get(f"/schemas/ids/{int(schema_id)}", f"schema id {schema_id}")
        schema = str(body["schema"])
        with self._lock:
            self._schemas[schema_id] = schema
        return schema

    def schemas(self, ids: Iterable[int]) -> dict[int, str]:
        """The writer schema of each of ``ids`` (a batch's), each fetched at most once per client."""
        return {sid: self.schema(sid) for sid in sorted(set(ids))}

    def latest(self, subject: str) -> SubjectVersion:
        """The subject's latest version (what a job reads onto when it names no version)."""
        body = self._get(f"/subjects/{quote(subject, safe='')}/versions/latest", f"subject {subject!r}")
        version = SubjectVersion(subject, int(body["id"]), int(body["version"]), str(body["schema"]))
        with self._lock:
            self._schemas.setdefault(version.id, version.schema)
        return version

    def version(self, subject: str, number: int) -> SubjectVersion:
        """Version ``number`` of the subject (a job that names its reader schema's version)."""
        what = f"version {number} of subject {subject!r}"
        body = self._get(f"/subjects/{quote(subject, safe='')}/versions/{int(number)}", what)
        version = SubjectVersion(subject, int(body["id"]), int(body["version"]), str(body["schema"]))
        with self._lock:
            self._schemas.setdefault(version.id, version.schema)
        return version

    def versions(self, subject: str) -> list[SubjectVersion]:
        """Every version of the subject, oldest first."""
        what = f"the versions of subject {subject!r}"
        numbers = self._get(f"/subjects/{quote(subject, safe='')}/versions", what, listing=True)
        return [self.version(subject, int(n)) for n in numbers]

    def close(self) -> None:
        """Close the client's connections."""
        self._http.close()

    def __enter__(self) -> RegistryClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- requests ------------------------------------------------------------------------------------------
    def _get(self, path: str, what: str, *, listing: bool = False) -> Any:
        """``GET path``'s JSON, retried while the registry is unavailable, up to ``deadline_s``.

        A schema's (an object with ``schema``), or with ``listing`` a list of version numbers.
        """
        last: list[str] = []
        try:
            for attempt in Retrying(retry=retry_if_exception_type(_Unavailable),
                                    stop=stop_after_delay(self.deadline_s),
                                    wait=wait_exponential(multiplier=0.2, max=5), reraise=True):
                with attempt:
                    return self._once(path, what, last, listing)
        except _Unavailable:
            msg = (f"Schema Registry at {self.url} unavailable for {self.deadline_s:g} s while asking for "
                   f"{what}: {last[-1] if last else 'no answer'}")
            raise RegistryUnavailableError(msg) from None
        msg = "tenacity's Retrying ended without an attempt"  # pragma: no cover - it returns or raises
        raise AssertionError(msg)

    def _once(self, path: str, what: str, last: list[str], listing: bool = False) -> Any:
        self.requests += 1
        try:
            response = self._http.get(path)
        except httpx.TransportError as exc:
            last.append(f"{type(exc).__name__}: {exc}")
            raise _Unavailable from exc
        if response.status_code in _RETRIED_STATUS:
            last.append(f"HTTP {response.status_code}")
            raise _Unavailable
        if response.status_code == 404:
            msg = f"the Schema Registry at {self.url} has no {what} ({_error_text(response)})"
            raise SchemaNotFoundError(msg)
        if response.status_code in (401, 403):
            msg = (f"the Schema Registry at {self.url} refused the request for {what}: HTTP "
                   f"{response.status_code} (its user and password: format.registry)")
            raise SchemaRegistryError(msg)
        if response.status_code != 200:
            msg = f"the Schema Registry at {self.url} answered HTTP {response.status_code} for {what}"
            raise SchemaRegistryError(msg)
        body = response.json()
        if listing:
            if not isinstance(body, list) or not all(isinstance(n, int) and not isinstance(n, bool)
                                                     for n in body):
                msg = f"the Schema Registry at {self.url} answered for {what} with {str(body)[:200]}"
                raise SchemaRegistryError(msg)
            return body
        if not isinstance(body, dict) or "schema" not in body:
            msg = f"the Schema Registry at {self.url} answered for {what} without a schema: {str(body)[:200]}"
            raise SchemaRegistryError(msg)
        return body


def _error_text(response: httpx.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        return f"HTTP {response.status_code}"
    if isinstance(body, dict) and "message" in body:
        return f"{body.get('error_code', response.status_code)}: {body['message']}"
    return f"HTTP {response.status_code}"
