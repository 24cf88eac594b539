"""The HTTP control API: jobs (create, show, pause, resume, throttle, drop), health and Prometheus metrics.

Mutations are recorded durably by the registry before the call returns and take effect at the job's next
epoch boundary, so pause/resume/PATCH/DELETE answer ``202 Accepted`` with the job's accepted state
(``pending_mutations`` counts what the epoch loop has not applied yet). Every error is an
:class:`~source_backfill.api.models.ErrorBody` naming the offending field; how our errors map to status
codes is decided in one table, :data:`ERROR_STATUS`.
"""

# No ``from __future__ import annotations``: FastAPI must evaluate the route signatures, which close over
# locals of create_app (the bearer scheme).
import hmac
import logging
import uuid
from collections.abc import Callable, Iterable, Mapping
from importlib import resources
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Path, Query, Request, status
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, Response
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import SecretStr
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from source_backfill import metrics  # noqa: F401 - importing registers every metric with prometheus_client
from source_backfill.api.guard import ControlPlaneGuard
from source_backfill.api.models import DryRunView, ErrorBody, ErrorDetail, JobView, ThrottleBody, VerifyView
from source_backfill.config import LOOPBACK_HOSTS, NAME_PATTERN, JobSpec
from source_backfill.errors import (
    ConfigError,
    JobError,
    JobExistsError,
    JobNotFoundError,
    SinkConflictError,
    SinkPathError,
    SourceBackfillError,
    SourceNotFoundError,
    StateFormatError,
    StateWriteError,
)
from source_backfill.runtime.registry import JobRecord, JobRegistry
from source_backfill.runtime.verifications import Verifications

logger = logging.getLogger(__name__)

HTTP_422 = 422  # starlette renamed the constant (UNPROCESSABLE_ENTITY -> _CONTENT); the number is stable

#: Our errors -> (HTTP status, error type, request field it is about). Most specific first.
ERROR_STATUS: list[tuple[type[SourceBackfillError], int, str, str | None]] = [
    (JobNotFoundError, status.HTTP_404_NOT_FOUND, "job_not_found", "name"),
    (JobExistsError, status.HTTP_409_CONFLICT, "job_exists", "name"),
    (SourceNotFoundError, status.HTTP_404_NOT_FOUND, "source_not_found", "source"),
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
#: The errors each kind of operation answers besides its success (and 401 when a token is set), declared so
#: the OpenAPI schema is whole: clients and the schema fuzzer check every response against it.
#: 503: the mutation log is unwritable.
_ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorBody} for code in (404, 409, 422, 503)
}
#: Operations that read a body also answer 400 (not UTF-8, so not JSON at all) and 413 (over the limit).
_BODY_ERRORS: dict[int | str, dict[str, Any]] = {code: {"model": ErrorBody} for code in (400, 413)}
#: What ControlPlaneGuard answers: 421 to a Host the daemon does not serve (every operation but the probes
#: /live and /ready); on mutations 403 from another origin or site, 415 to a body that is not JSON.
_HOST_ERRORS: dict[int | str, dict[str, Any]] = {421: {"model": ErrorBody}}
_MUTATION_GUARD_ERRORS: dict[int | str, dict[str, Any]] = {code: {"model": ErrorBody} for code in (403, 415)}

#: The status page's headers: its own script and API only, no inline script (a job's data that slipped into
#: the markup would not run), not framed, no referrer.
_UI_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; connect-src 'self'; "
                               "style-src 'unsafe-inline'; img-src data:; base-uri 'none'; "
                               "form-action 'none'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}

JobName = Annotated[str, Path(pattern=NAME_PATTERN, description="The job's name.")]


def error_response(
    status_code: int, type_: str, message: str, field: str | None = None, *,
    details: list[dict[str, Any]] | None = None, headers: Mapping[str, str] | None = None,
) -> JSONResponse:
    """The one shape of every error the API returns."""
    body = ErrorBody(error=ErrorDetail(type=type_, message=message, field=field, details=details))
    return JSONResponse(body.model_dump(mode="json", exclude_none=True), status_code=status_code,
                        headers=headers)


def create_app(
    registry: JobRegistry,
    token: SecretStr | None = None,
    health: Callable[[], dict[str, Any]] | None = None,
    *,
    guard_reads: bool = False,
    max_body_bytes: int = 1 << 20,
    allowed_hosts: Iterable[str] = LOOPBACK_HOSTS,
    verifications: Verifications | None = None,
    dry_run: Callable[[JobSpec], dict[str, Any]] | None = None,
) -> FastAPI:
    """The control API over ``registry``.

    Mutating calls need ``Bearer <token>`` when ``token`` is set; with ``guard_reads`` the job reads and
    ``/metrics`` need it too (the probes ``/health``, ``/ready`` and ``/live`` never do). Bodies over
    ``max_body_bytes`` are refused with 413 before they are read. A request naming a ``Host`` not in
    ``allowed_hosts`` is refused (421; not the probes ``/live`` and ``/ready``), and so is a mutation from
    another origin (403) or with a body that is not JSON (415): :class:`ControlPlaneGuard`.
    ``verifications`` runs ``POST /jobs/{name}/verify`` (none: those routes answer 503); ``dry_run(spec)``
    checks a create and plans it for ``POST /jobs?dry_run=true`` (none: checked by the registry, no plan).
    """
    app = FastAPI(
        title="source-backfill",
        version="0.1.0",
        summary="Attach jobs to a live shared Kafka source; backfill history and hand over exactly once.",
    )
    app.add_middleware(BodyLimit, max_bytes=max_body_bytes)
    app.add_middleware(ControlPlaneGuard, allowed_hosts=tuple(allowed_hosts))  # added last: runs first
    expected = token.get_secret_value().encode() if token is not None else None
    bearer = HTTPBearer(auto_error=False, description="Needed on mutating calls when the daemon has a token.")

    def authorize(
        credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
    ) -> None:
        if expected is None:
            return
        given = credentials.credentials.encode() if credentials is not None else b""
        if credentials is None or not hmac.compare_digest(given, expected):  # an empty token opens nothing
            raise HTTPException(
                status.HTTP_401_UNAUTHORIZED,
                "missing or wrong bearer token" if credentials is not None else "missing bearer token",
                headers={"WWW-Authenticate": "Bearer"},
            )

    # Without a token nothing is guarded, and the schema says so (no security scheme, no 401).
    guard = [Depends(authorize)] if expected is not None else []
    unauthorized: dict[int | str, dict[str, Any]] = {401: {"model": ErrorBody}} if guard else {}
    mutating: dict[str, Any] = {
        "dependencies": guard,
        "responses": unauthorized | _ERROR_RESPONSES | _HOST_ERRORS | _MUTATION_GUARD_ERRORS,
    }
    with_body: dict[str, Any] = mutating | {"responses": mutating["responses"] | _BODY_ERRORS}
    read_guard = guard if guard_reads else []
    read_errors = (unauthorized if guard_reads else {}) | _HOST_ERRORS
    reading: dict[str, Any] = {"dependencies": read_guard, "responses": read_errors}

    def view(record: JobRecord) -> JobView:
        return JobView.of(record, registry.progress(record.name), registry.pending(record.name))

    # -- errors -----------------------------------------------------------------------------------------
    @app.exception_handler(SourceBackfillError)
    async def _our_error(_request: Request, exc: SourceBackfillError) -> JSONResponse:
        for kind, code, type_, field in ERROR_STATUS:
            if isinstance(exc, kind):
                if code == status.HTTP_500_INTERNAL_SERVER_ERROR:
                    return _internal_error(exc)
                if isinstance(exc, StateWriteError):
                    return _state_unwritable(exc)
                return error_response(code, type_, str(exc), field)
        raise exc  # unreachable: SourceBackfillError is the last row

    @app.exception_handler(RequestValidationError)
    async def _invalid(_request: Request, exc: RequestValidationError) -> JSONResponse:
        details = [{"field": _field(e.get("loc", ())), "message": _message(e)} for e in exc.errors()]
        first = details[0] if details else {"field": None, "message": "invalid request"}
        message = f"{first['field']}: {first['message']}" if first["field"] else str(first["message"])
        return error_response(
            HTTP_422, "validation_error", message, first["field"],
            details=details if len(details) > 1 else None,
        )

    @app.exception_handler(HTTPException)
    async def _http(_request: Request, exc: HTTPException) -> Response:
        if exc.status_code in (204, 304) or exc.status_code < 200:
            return Response(status_code=exc.status_code, headers=exc.headers)
        type_ = _HTTP_TYPES.get(exc.status_code, "http_error")
        return error_response(exc.status_code, type_, str(exc.detail), headers=exc.headers)

    @app.exception_handler(Exception)
    async def _bug(_request: Request, exc: Exception) -> JSONResponse:
        return _internal_error(exc)

    # -- routes -----------------------------------------------------------------------------------------
    # The status page: plain HTML and a script that polls GET /jobs (not API operations: not in the schema).
    page = resources.files(__package__).joinpath("ui.html").read_text("utf-8")
    page = page.replace("{{token_required}}", "true" if expected is not None else "false")
    script = resources.files(__package__).joinpath("ui.js").read_text("utf-8")

    @app.get("/ui", include_in_schema=False)
    def get_ui() -> HTMLResponse:
        return HTMLResponse(page, headers=_UI_HEADERS)

    @app.get("/ui.js", include_in_schema=False)
    def get_ui_script() -> Response:
        return Response(script, media_type="text/javascript", headers=_UI_HEADERS)

    unhealthy: dict[int | str, dict[str, Any]] = {503: {"description": "The daemon reports itself not ok."},
                                                  **_HOST_ERRORS}

    @app.get("/health", tags=["daemon"], responses=unhealthy)
    def get_health() -> JSONResponse:
        """Liveness and per-source epochs; 503 while the daemon reports itself not ok."""
        body: dict[str, Any] = {"ok": True}
        if health is not None:
            body.update(health())
        body.setdefault("jobs", len(registry.list()))
        code = status.HTTP_200_OK if body.get("ok", True) else status.HTTP_503_SERVICE_UNAVAILABLE
        return JSONResponse(body, status_code=code)

    @app.get("/ready", tags=["daemon"], responses={503: {"description": "Not ready yet, or unhealthy."}})
    def get_ready() -> JSONResponse:
        """Readiness (Kubernetes): 200 once every source has run an epoch and is healthy, else 503."""
        body = health() if health is not None else {"ready": True}
        ready = bool(body.get("ready", body.get("ok", True)))
        code = status.HTTP_200_OK if ready else status.HTTP_503_SERVICE_UNAVAILABLE
        return JSONResponse({"ready": ready, "sources": body.get("sources", {})}, status_code=code)

    @app.get("/live", tags=["daemon"], responses={503: {"description": "Spark's JVM is gone: restart."}})
    def get_live() -> JSONResponse:
        """Liveness (Kubernetes): 200 while Spark's JVM answers (a broker outage is no reason), else 503."""
        body = health() if health is not None else {}
        live = bool(body.get("live", True))
        return JSONResponse({"live": live, "error": body.get("jvm_error")}, status_code=200 if live else 503)

    @app.get("/metrics", tags=["daemon"], response_class=Response, **reading)
    def get_metrics() -> Response:
        """Prometheus metrics (text exposition format)."""
        return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)

    @app.get("/jobs", tags=["jobs"], **reading)
    def list_jobs() -> list[JobView]:
        """Every live job (not dropped), in creation order."""
        return [view(r) for r in registry.list()]

    planned: dict[int | str, dict[str, Any]] = {
        200: {"model": DryRunView, "description": "dry_run=true: checks passed; the plan, nothing created"}}

    @app.post("/jobs", tags=["jobs"], status_code=status.HTTP_201_CREATED, dependencies=guard,
              responses=with_body["responses"] | planned)
    def create_job(
        spec: JobSpec, response: Response,
        dry_run_: Annotated[bool, Query(alias="dry_run", description=(
            "Check everything a create checks and answer 200 with the plan (offsets per split, time at the "
            "rate limit and at the measured history rate, retention warnings); nothing is created"))] = False,
    ) -> JobView | DryRunView:
        """Register a job; it attaches to its source at the next epoch boundary (or, dry run, plan it)."""
        if dry_run_:
            if dry_run is None:
                registry.check_create(spec)
                plan: dict[str, Any] = {}
            else:
                plan = dry_run(spec)
            response.status_code = status.HTTP_200_OK
            return DryRunView(job=spec, **plan)
        record = registry.create(spec)
        response.headers["Location"] = f"/jobs/{record.name}"
        return view(record)

    @app.get("/jobs/{name}", tags=["jobs"], dependencies=read_guard,
             responses=read_errors | {code: {"model": ErrorBody} for code in (404, 422)})
    def show_job(name: JobName) -> JobView:
        """The job's state, rows and ETA, and per split: stage, backfilled offset, target, rows, lag."""
        return view(registry.get(name))

    @app.post("/jobs/{name}/pause", tags=["jobs"], status_code=status.HTTP_202_ACCEPTED, **mutating)
    def pause_job(name: JobName) -> JobView:
        """Stop reading history for the job (its live rows keep flowing)."""
        return view(registry.pause(name))

    @app.post("/jobs/{name}/resume", tags=["jobs"], status_code=status.HTTP_202_ACCEPTED, **mutating)
    def resume_job(name: JobName) -> JobView:
        """Read history again."""
        return view(registry.resume(name))

    @app.patch("/jobs/{name}", tags=["jobs"], status_code=status.HTTP_202_ACCEPTED, **with_body)
    def patch_job(name: JobName, patch: ThrottleBody) -> JobView:
        """Change the job's history rate limit (rows/s; null unlimited; 0 reads none and loses nothing)."""
        return view(registry.throttle(name, patch.rate_limit))

    @app.post("/jobs/{name}/retry", tags=["jobs"], status_code=status.HTTP_202_ACCEPTED, **mutating)
    def retry_job(name: JobName) -> JobView:
        """Run a failed job again: rebuilt from its table at the next epoch (no-op unless it failed)."""
        return view(registry.retry(name))

    @app.delete("/jobs/{name}", tags=["jobs"], status_code=status.HTTP_202_ACCEPTED, **mutating)
    def drop_job(name: JobName) -> JobView:
        """Detach the job at the next epoch boundary; its table is left as it is."""
        return view(registry.drop(name))

    # -- verify: a background run per job, polled -----------------------------------------------------------
    def runs() -> Verifications:
        if verifications is None:
            raise HTTPException(status.HTTP_503_SERVICE_UNAVAILABLE, "verify is not available on this daemon")
        return verifications

    verify_errors = {code: {"model": ErrorBody} for code in (404, 409, 422, 503)}

    @app.post("/jobs/{name}/verify", tags=["jobs"], status_code=status.HTTP_202_ACCEPTED,
              dependencies=guard, responses=mutating["responses"] | verify_errors)
    def start_verify(name: JobName, response: Response) -> VerifyView:
        """Start checking the job's table against its source, exactly once up to its committed positions.

        Answers at once with a run to poll (``GET /jobs/{name}/verify/{id}``); while a run of the job is
        going, that run. Refused (422, saying why) when the table cannot be checked: no table yet, or a
        transform that drops the topic/partition/offset columns. Changes nothing.
        """
        registry.get(name)
        run = runs().start(name)
        response.headers["Location"] = f"/jobs/{name}/verify/{run.id}"
        return VerifyView(**run.to_json())

    @app.get("/jobs/{name}/verify/{run_id}", tags=["jobs"], dependencies=read_guard,
             responses=read_errors | {code: {"model": ErrorBody} for code in (404, 422, 503)})
    def get_verify(name: JobName, run_id: Annotated[str, Path(pattern=r"^[0-9a-f]{1,32}$")]) -> VerifyView:
        """A verify run: running, done (ok, summary, per-split counts), refused or error (saying why)."""
        return VerifyView(**runs().get(name, run_id).to_json())

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
    cause = exc.__cause__
    reason = cause.strerror if isinstance(cause, OSError) and cause.strerror else "a write failed"
    message = (f"the daemon cannot write its mutation log ({reason}); nothing was changed: free space or fix "
               f"permissions under daemon.state_root, then retry (error {error_id} in the daemon's log)")
    return error_response(status.HTTP_503_SERVICE_UNAVAILABLE, "state_unwritable", message)


class _BodyTooLarge(HTTPException):
    """Raised while a streamed body is read; FastAPI passes HTTPExceptions through to the 413 handler."""

    def __init__(self, max_bytes: int) -> None:
        super().__init__(413, f"request body over {max_bytes} bytes")


class BodyLimit:
    """ASGI middleware refusing request bodies over ``max_bytes`` with 413, declared or streamed."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Refuse a declared or streamed body over the limit; pass everything else through."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > self.max_bytes):
            await self._refuse(scope, receive, send)
            return
        received = 0
        started = False

        async def limited() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    raise _BodyTooLarge(self.max_bytes)
            return message

        async def tracked(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, limited, tracked)
        except _BodyTooLarge:
            if not started:
                await self._refuse(scope, receive, send)

    async def _refuse(self, scope: Scope, receive: Receive, send: Send) -> None:
        response = error_response(413, "body_too_large", f"request body over {self.max_bytes} bytes")
        await response(scope, receive, send)


def _message(error: dict[str, Any]) -> str:
    """Pydantic's message without its ``Value error, `` prefix (our validators' messages stand alone)."""
    return str(error.get("msg", "invalid")).removeprefix("Value error, ")


def _field(loc: tuple[Any, ...] | list[Any]) -> str:
    """``("body", "start", "offsets")`` -> ``"start.offsets"``; the whole body when no field is named."""
    parts = [str(p) for p in loc]
    if parts and parts[0] in ("body", "path", "query", "header", "cookie"):
        parts = parts[1:]
    if parts and all(p.isdigit() for p in parts):  # a JSON decode error's character position
        parts = []
    return ".".join(parts) or "body"
