"""The daemon's own operations: the status page, the probes (``/health``, ``/ready``, ``/live``), metrics."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from importlib import resources
from typing import Any

from fastapi import APIRouter, Request, status
from fastapi.responses import HTMLResponse, JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest
from prometheus_client.metrics_core import Metric

from source_backfill import metrics  # noqa: F401 - importing registers every metric with prometheus_client
from source_backfill.api.access import principal_of
from source_backfill.api.context import Context
from source_backfill.api.responses import HOST_ERRORS, Responses
from source_backfill.core.access import ALL_NAMESPACES, Role

#: The status page's headers: its own script and API only, no inline script (a job's data that slipped into
#: the markup would not run), not framed, no referrer.
UI_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; connect-src 'self'; "
                               "style-src 'unsafe-inline'; img-src data:; base-uri 'none'; "
                               "form-action 'none'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}

#: Never guarded: the status page (it asks for the token itself) and the probes.
unguarded = APIRouter()
#: Guarded when reads are.
reads = APIRouter()


def status_page(token_required: bool) -> tuple[str, str]:
    """The status page's markup (saying whether to ask for a token) and its script."""
    files = resources.files("source_backfill.api")
    page = files.joinpath("ui.html").read_text("utf-8")
    page = page.replace("{{token_required}}", "true" if token_required else "false")
    return page, files.joinpath("ui.js").read_text("utf-8")


# The status page: plain HTML and a script that polls GET /jobs (not API operations: not in the schema).
@unguarded.get("/ui", include_in_schema=False)
def get_ui(context: Context) -> HTMLResponse:
    """The status page."""
    return HTMLResponse(context.page, headers=UI_HEADERS)


@unguarded.get("/ui.js", include_in_schema=False)
def get_ui_script(context: Context) -> Response:
    """The status page's script."""
    return Response(context.script, media_type="text/javascript", headers=UI_HEADERS)


_UNHEALTHY: Responses = {503: {"description": "The daemon reports itself not ok."}, **HOST_ERRORS}


def _probe_body(context: Context) -> dict[str, Any]:
    """The daemon's health; with namespaces (tenants), each source's jobs as counts, not names.

    The probes need no credential, so on a daemon shared by tenants they must not tell one tenant which
    jobs another runs (or which failed).
    """
    body = context.health() if context.health is not None else {}
    if context.auth.tenants:
        for source in body.get("sources", {}).values():
            for key, value in list(source.items()):
                if key.endswith("jobs") and isinstance(value, list | dict):
                    source[key] = len(value)
    return body


@unguarded.get("/health", tags=["daemon"], responses=_UNHEALTHY)
def get_health(context: Context) -> JSONResponse:
    """Liveness and per-source epochs; 503 while the daemon reports itself not ok."""
    body: dict[str, Any] = {"ok": True}
    body.update(_probe_body(context))
    body.setdefault("jobs", len(context.registry.list()))
    code = status.HTTP_200_OK if body.get("ok", True) else status.HTTP_503_SERVICE_UNAVAILABLE
    return JSONResponse(body, status_code=code)


@unguarded.get("/ready", tags=["daemon"], responses={503: {"description": "Not ready yet, or unhealthy."}})
def get_ready(context: Context) -> JSONResponse:
    """Readiness (Kubernetes): 200 once every source has run an epoch and is healthy, else 503."""
    body = _probe_body(context) if context.health is not None else {"ready": True}
    ready = bool(body.get("ready", body.get("ok", True)))
    code = status.HTTP_200_OK if ready else status.HTTP_503_SERVICE_UNAVAILABLE
    return JSONResponse({"ready": ready, "sources": body.get("sources", {})}, status_code=code)


@unguarded.get("/live", tags=["daemon"], responses={503: {"description": "Spark's JVM is gone: restart."}})
def get_live(context: Context) -> JSONResponse:
    """Liveness (Kubernetes): 200 while Spark's JVM answers (a broker outage is no reason), else 503."""
    body = context.health() if context.health is not None else {}
    live = bool(body.get("live", True))
    return JSONResponse({"live": live, "error": body.get("jvm_error")}, status_code=200 if live else 503)


@reads.get("/metrics", tags=["daemon"], response_class=Response, responses=HOST_ERRORS)
def get_metrics(request: Request, context: Context) -> Response:
    """Prometheus metrics (text exposition format).

    A principal without a role on every namespace gets its namespaces' jobs' series, and those that name
    no job, source or namespace.
    """
    principal = principal_of(request)
    if principal.may(Role.VIEWER, ALL_NAMESPACES):
        return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)
    visible = {r.name for r in context.registry.list() if principal.sees(r.spec.namespace)}
    return Response(generate_latest(_Visible(visible, principal.sees)), media_type=CONTENT_TYPE_LATEST)


class _Visible:
    """The default registry's series a tenant may see, by allow-list on their labels.

    A series is kept when its ``job`` is one of the principal's jobs and its ``namespace`` one of its
    namespaces; one labelled by a source (or anything else that names what another tenant runs) is not.
    """

    def __init__(self, jobs: set[str], sees: Callable[[str], bool]) -> None:
        self.jobs = jobs
        self.sees = sees

    def _keep(self, labels: dict[str, str]) -> bool:
        for key, value in labels.items():
            if key == "job" and value not in self.jobs:
                return False
            if key == "namespace" and not self.sees(value):
                return False
            if key not in _TENANT_LABELS:
                return False
        return True

    def collect(self) -> Iterator[Metric]:
        """Each metric with the samples kept (metrics left with none are left out)."""
        for metric in REGISTRY.collect():
            samples = [s for s in metric.samples if self._keep(s.labels)]
            if samples:
                kept = Metric(metric.name, metric.documentation, metric.type, metric.unit)
                kept.samples = samples
                yield kept


#: Labels a tenant's series may carry (besides which job and namespace): what its own jobs do.
_TENANT_LABELS = frozenset({"job", "namespace", "split", "le", "stage", "outcome", "tier", "change",
                            "error_type", "quota", "kind"})
