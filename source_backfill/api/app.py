"""The HTTP control API: jobs (create, show, pause, resume, throttle, drop), health and Prometheus metrics.

:func:`create_app` assembles it: the routers of :mod:`source_backfill.api.routes` (``jobs``, ``verify``,
``ops``), the token guard applied to them, the middleware, the error handlers, and the
:class:`~source_backfill.api.context.ApiContext` the routes are given. Mutations are recorded durably by the
registry before the call returns and take effect at the job's next epoch boundary, so
pause/resume/PATCH/DELETE answer ``202 Accepted`` with the job's accepted state (``pending_mutations``
counts what the epoch loop has not applied yet). Every error is an
:class:`~source_backfill.api.models.ErrorBody` naming the offending field; how our errors map to status
codes is decided in one table, :data:`ERROR_STATUS`.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterable
from typing import Any

from fastapi import APIRouter, Depends, FastAPI, Request, status
from fastapi.exceptions import RequestValidationError
from fastapi.params import Depends as DependsParam
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import SecretStr
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Receive, Scope, Send

from source_backfill.api.access import Authenticator, authorize, principal_of, refused
from source_backfill.api.body_limit import BodyLimit
from source_backfill.api.context import ApiContext, DryRunHook, HealthHook, ResetHook
from source_backfill.api.guard import ControlPlaneGuard
from source_backfill.api.models import ErrorBody
from source_backfill.api.responses import Responses, error_response
from source_backfill.api.routes import jobs, ops, sources, verify
from source_backfill.config import LOOPBACK_HOSTS, validation_message
from source_backfill.errors import (
    ConfigError,
    JobError,
    JobExistsError,
    JobNotFailedError,
    JobNotFoundError,
    QuotaExceededError,
    SinkConflictError,
    SinkPathError,
    SourceBackfillError,
    SourceNotFoundError,
    SourceRunningError,
    StateFormatError,
    StateMoveError,
    StateWriteError,
)
from source_backfill.runtime.registry import JobRegistry
from source_backfill.runtime.verifications import Verifications

logger = logging.getLogger(__name__)

HTTP_422 = 422  # starlette renamed the constant (UNPROCESSABLE_ENTITY -> _CONTENT); the number is stable

#: Our errors -> (HTTP status, error type, request field it is about). Most specific first.
ERROR_STATUS: list[tuple[type[SourceBackfillError], int, str, str | None]] = [
    (JobNotFoundError, status.HTTP_404_NOT_FOUND, "job_not_found", "name"),
    (JobExistsError, status.HTTP_409_CONFLICT, "job_exists", "name"),
    (SourceNotFoundError, status.HTTP_404_NOT_FOUND, "source_not_found", "source"),
    (SourceRunningError, status.HTTP_409_CONFLICT, "source_running", "source"),
    (JobNotFailedError, status.HTTP_409_CONFLICT, "job_not_failed", "name"),
    (QuotaExceededError, status.HTTP_403_FORBIDDEN, "quota_exceeded", "namespace"),
    (SinkConflictError, status.HTTP_409_CONFLICT, "sink_conflict", "sink_path"),
    (SinkPathError, HTTP_422, "invalid_request", "sink_path"),
    (ConfigError, HTTP_422, "invalid_request", None),
    (JobError, status.HTTP_409_CONFLICT, "job_error", None),
    (StateWriteError, status.HTTP_503_SERVICE_UNAVAILABLE, "state_unwritable", None),
    (StateFormatError, status.HTTP_500_INTERNAL_SERVER_ERROR, "state_error", None),
    (SourceBackfillError, status.HTTP_500_INTERNAL_SERVER_ERROR, "internal_error", None),
]

_HTTP_TYPES = {401: "unauthorized", 403: "forbidden", 404: "not_found", 405: "method_not_allowed",
               413: "body_too_large"}


def create_app(
    registry: JobRegistry,
    token: SecretStr | None = None,
    health: HealthHook | None = None,
    *,
    guard_reads: bool = False,
    max_body_bytes: int = 1 << 20,
    allowed_hosts: Iterable[str] = LOOPBACK_HOSTS,
    verifications: Verifications | None = None,
    dry_run: DryRunHook | None = None,
    auth: Authenticator | None = None,
    reset_source: ResetHook | None = None,
) -> FastAPI:
    """The control API over ``registry``.

    Mutating calls need ``Bearer <token>`` when ``token`` is set; with ``guard_reads`` the job reads and
    ``/metrics`` need it too (the probes ``/health``, ``/ready`` and ``/live`` never do). ``auth`` (else
    the token alone) says which credentials are accepted; with principals of namespaces
    (:attr:`Authenticator.tenants`) reads are always guarded, each route by its rule
    (:data:`~source_backfill.api.access.RULES`), and the probes name no job. Bodies over
    ``max_body_bytes`` are refused with 413 before they are read. A request naming a ``Host`` not in
    ``allowed_hosts`` is refused (421; not the probes ``/live`` and ``/ready``), and so is a mutation from
    another origin (403) or with a body that is not JSON (415): :class:`ControlPlaneGuard`.
    ``verifications`` runs ``POST /jobs/{name}/verify`` (none: those routes answer 503); ``dry_run(spec)``
    checks a create and plans it for ``POST /jobs?dry_run=true`` (none: checked by the registry, no plan);
    ``reset_source(name, by=...)`` starts a source stopped for good over for ``POST /sources/{source}/reset``
    (none: that route answers 503).
    """
    app = FastAPI(
        title="source-backfill",
        version="0.1.0",
        summary="Attach jobs to a live shared Kafka source; backfill history and hand over exactly once.",
    )
    app.add_middleware(BodyLimit, max_bytes=max_body_bytes)
    app.add_middleware(ControlPlaneGuard, allowed_hosts=tuple(allowed_hosts))  # added last: runs first
    if auth is None:
        auth = Authenticator(token.get_secret_value().encode() if token is not None else None)
    guard_reads = guard_reads or auth.tenants
    page, script = ops.status_page(token_required=auth.configured)
    app.state.api = ApiContext(registry=registry, auth=auth, health=health, verifications=verifications,
                               dry_run=dry_run, page=page, script=script, reset_source=reset_source)
    app.exception_handler(SourceBackfillError)(_our_error)
    app.exception_handler(RequestValidationError)(_invalid)
    app.exception_handler(HTTPException)(_http)
    app.exception_handler(Exception)(_bug)

    # Without a credential nothing is guarded, and the schema says so (no security scheme, no 401).
    guard: list[DependsParam] = [Depends(authorize)] if auth.configured else []
    unauthorized: Responses = {401: {"model": ErrorBody}} if guard else {}
    if auth.tenants:
        unauthorized[403] = {"model": ErrorBody, "description": "The principal's role is too low here."}

    def include(router: APIRouter, guarded: bool) -> None:
        app.include_router(router, dependencies=guard if guarded else [],
                           responses=unauthorized if guarded else {})

    # In this order: the schema lists the operations (and 405 answers with the methods) as it always has.
    include(ops.unguarded, guarded=False)
    include(ops.reads, guarded=guard_reads)
    include(jobs.reads, guarded=guard_reads)
    include(jobs.mutations, guarded=True)
    include(verify.mutations, guarded=True)
    include(verify.reads, guarded=guard_reads)
    include(sources.mutations, guarded=True)
    return app


def create_metrics_app() -> ASGIApp:
    """The separate metrics port's app: ``GET /metrics`` (Prometheus text format) and nothing else.

    Served by an :class:`~source_backfill.api.server.ApiServer`, so it has the API's connection limits.
    It checks no Host: Prometheus scrapes it by address, and it changes nothing.
    """

    async def metrics_app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        response: Response
        if scope["path"] != "/metrics":
            response = error_response(404, "not_found", "only /metrics is served on this port")
        elif scope["method"] not in ("GET", "HEAD"):
            response = error_response(405, "method_not_allowed", "only GET", headers={"Allow": "GET, HEAD"})
        else:
            response = Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)
        await response(scope, receive, send)

    return metrics_app


# -- errors: every one answered as an ErrorBody -------------------------------------------------------------
async def _our_error(request: Request, exc: SourceBackfillError) -> JSONResponse:
    if isinstance(exc, QuotaExceededError):  # a refusal: audited like the access rules' own
        refused(request, principal_of(request), str(exc), status_code=status.HTTP_403_FORBIDDEN,
                namespace=exc.namespace)
    for kind, code, type_, field in ERROR_STATUS:
        if isinstance(exc, kind):
            if code == status.HTTP_500_INTERNAL_SERVER_ERROR:
                return _internal_error(exc)
            if isinstance(exc, StateWriteError):
                return _state_unwritable(exc)
            return error_response(code, type_, str(exc), field)
    raise exc  # unreachable: SourceBackfillError is the last row


async def _invalid(_request: Request, exc: RequestValidationError) -> JSONResponse:
    details = [{"field": _field(e.get("loc", ())), "message": validation_message(e)} for e in exc.errors()]
    first = details[0] if details else {"field": None, "message": "invalid request"}
    message = f"{first['field']}: {first['message']}" if first["field"] else str(first["message"])
    return error_response(
        HTTP_422, "validation_error", message, first["field"],
        details=details if len(details) > 1 else None,
    )


async def _http(_request: Request, exc: HTTPException) -> Response:
    if exc.status_code in (204, 304) or exc.status_code < 200:
        return Response(status_code=exc.status_code, headers=exc.headers)
    type_ = _HTTP_TYPES.get(exc.status_code, "http_error")
    return error_response(exc.status_code, type_, str(exc.detail), headers=exc.headers)


async def _bug(_request: Request, exc: Exception) -> JSONResponse:
    return _internal_error(exc)


def _internal_error(exc: BaseException) -> JSONResponse:
    """A 500 that names an id to find in the daemon's log, never the exception's text (it may hold paths)."""
    error_id = uuid.uuid4().hex[:12]
    logger.error('request failed error_id="%s" error_type="%s"', error_id, type(exc).__name__, exc_info=exc)
    message = f"internal error {error_id}; the daemon's log has the details"
    return error_response(500, "internal_error", message)


def _state_unwritable(exc: StateWriteError) -> JSONResponse:
    """A 503 saying why (the OS's reason) but not where: the mutation log's path stays in the log."""
    error_id = uuid.uuid4().hex[:12]
    logger.error('request failed error_id="%s" error_type="%s" error="%s"', error_id, type(exc).__name__, exc)
    if isinstance(exc, StateMoveError):  # its message names the source and the OS's reason, no path
        return error_response(status.HTTP_503_SERVICE_UNAVAILABLE, "state_unwritable",
                              f"{exc} (error {error_id} in the daemon's log)")
    cause = exc.__cause__
    reason = cause.strerror if isinstance(cause, OSError) and cause.strerror else "a write failed"
    message = (f"the daemon cannot write its mutation log ({reason}); nothing was changed: free space or fix "
               f"permissions under daemon.state_root, then retry (error {error_id} in the daemon's log)")
    return error_response(status.HTTP_503_SERVICE_UNAVAILABLE, "state_unwritable", message)


def _field(loc: tuple[Any, ...] | list[Any]) -> str:
    """``("body", "start", "offsets")`` -> ``"start.offsets"``; the whole body when no field is named."""
    parts = [str(p) for p in loc]
    if parts and parts[0] in ("body", "path", "query", "header", "cookie"):
        parts = parts[1:]
    if parts and all(p.isdigit() for p in parts):  # a JSON decode error's character position
        parts = []
    return ".".join(parts) or "body"
