"""What the routes are given: the daemon's parts (:class:`ApiContext`) and the bearer-token check.

:func:`~source_backfill.api.app.create_app` stores one :class:`ApiContext` on ``app.state``; a route asks for
it with a :data:`Context` parameter. :func:`authorize` is applied to whole routers by ``create_app`` when the
daemon has a token (and only then, so a schema without a token names no security scheme and no 401).
"""

from __future__ import annotations

import hmac
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import Depends, Request, status
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from starlette.exceptions import HTTPException

from source_backfill.api.models import JobView
from source_backfill.config import JobSpec
from source_backfill.runtime.registry import JobRecord, JobRegistry
from source_backfill.runtime.verifications import Verifications

#: Health report: ``ok``, ``ready``, ``live``, ``jvm_error``, ``sources`` ... (the daemon's, or none).
HealthHook = Callable[[], dict[str, Any]]
#: A create checked and planned for ``POST /jobs?dry_run=true``.
DryRunHook = Callable[[JobSpec], dict[str, Any]]


@dataclass(frozen=True)
class ApiContext:
    """The daemon's parts the routes use, as :func:`~source_backfill.api.app.create_app` was given them."""

    registry: JobRegistry
    #: The bearer token's bytes; None: nothing is guarded.
    token: bytes | None
    health: HealthHook | None
    #: None: the verify routes answer 503.
    verifications: Verifications | None
    #: None: a dry run is checked by the registry and plans nothing.
    dry_run: DryRunHook | None
    #: The status page's markup (whether it asks for a token filled in) and script.
    page: str
    script: str

    def view(self, record: JobRecord) -> JobView:
        """The job as the API shows it: its record, its progress and its mutations not yet applied."""
        return JobView.of(record, self.registry.progress(record.name), self.registry.pending(record.name),
                          self.registry.repair_views(record.name))

    def runs(self) -> Verifications:
        """The verify runs; 503 when this daemon has none."""
        if self.verifications is None:
            raise HTTPException(status.HTTP_503_SERVICE_UNAVAILABLE, "verify is not available on this daemon")
        return self.verifications


def api_context(request: Request) -> ApiContext:
    """The app's :class:`ApiContext` (a FastAPI dependency)."""
    context: ApiContext = request.app.state.api
    return context


Context = Annotated[ApiContext, Depends(api_context)]

bearer = HTTPBearer(auto_error=False, description="Needed on mutating calls when the daemon has a token.")


def authorize(
    context: Context,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
) -> None:
    """Let the request through with ``Bearer <token>``; else 401 (nothing to check without a token)."""
    expected = context.token
    if expected is None:
        return
    given = credentials.credentials.encode() if credentials is not None else b""
    if credentials is None or not hmac.compare_digest(given, expected):  # an empty token opens nothing
        raise HTTPException(
            status.HTTP_401_UNAUTHORIZED,
            "missing or wrong bearer token" if credentials is not None else "missing bearer token",
            headers={"WWW-Authenticate": "Bearer"},
        )
