"""What the routes are given: the daemon's parts (:class:`ApiContext`).

:func:`~source_backfill.api.app.create_app` stores one :class:`ApiContext` on ``app.state``; a route asks for
it with a :data:`Context` parameter. Who may call what is :mod:`source_backfill.api.access`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any

from fastapi import Depends, Request, status
from starlette.exceptions import HTTPException

from source_backfill.api.models import JobView
from source_backfill.config import JobSpec
from source_backfill.runtime.registry import JobRecord, JobRegistry
from source_backfill.runtime.verifications import Verifications

if TYPE_CHECKING:
    from source_backfill.api.access import Authenticator

#: Health report: ``ok``, ``ready``, ``live``, ``jvm_error``, ``sources`` ... (the daemon's, or none).
HealthHook = Callable[[], dict[str, Any]]
#: A create checked and planned for ``POST /jobs?dry_run=true``.
DryRunHook = Callable[[JobSpec], dict[str, Any]]
#: ``POST /sources/{source}/reset``: the source's name and who asks, to what the reset did
#: (``runtime/source_reset.py``'s ``ResetOutcome``).
ResetHook = Callable[..., Any]


@dataclass(frozen=True)
class ApiContext:
    """The daemon's parts the routes use, as :func:`~source_backfill.api.app.create_app` was given them."""

    registry: JobRegistry
    #: The credentials the API accepts (none configured: nothing is guarded).
    auth: Authenticator
    health: HealthHook | None
    #: None: the verify routes answer 503.
    verifications: Verifications | None
    #: None: a dry run is checked by the registry and plans nothing.
    dry_run: DryRunHook | None
    #: The status page's markup (whether it asks for a token filled in) and script.
    page: str
    script: str
    #: None: ``POST /sources/{source}/reset`` answers 503 (no sources here: an API over a registry alone).
    reset_source: ResetHook | None = None

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
