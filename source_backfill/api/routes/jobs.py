"""Jobs: list, show, create (or plan: a dry run), pause, resume, throttle, re-transform, repair, retry, drop.

Mutations are recorded durably by the registry before the call returns and take effect at the job's next
epoch boundary, so they answer ``202 Accepted`` with the job's accepted state (``pending_mutations`` counts
what the epoch loop has not applied yet); a create answers ``201 Created``.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Body, Path, Query, Request, status
from fastapi.responses import Response

from source_backfill.api.access import actor_of, principal_of, require
from source_backfill.api.context import Context
from source_backfill.api.models import AuditView, DryRunView, JobView, PatchBody, RefusalView, RepairView
from source_backfill.api.responses import (
    BODY_ERRORS,
    HOST_ERRORS,
    MUTATION_ERRORS,
    Responses,
    error_responses,
)
from source_backfill.config import DEFAULT_NAMESPACE, NAME_PATTERN, JobSpec, RepairSpec, RetrySpec
from source_backfill.core.access import Role
from source_backfill.errors import ConfigError, SinkConflictError, SourceNotFoundError
from source_backfill.runtime.mutation_log import Actor

JobName = Annotated[str, Path(pattern=NAME_PATTERN, description="The job's name.")]

#: Guarded when reads are.
reads = APIRouter(tags=["jobs"])
#: Guarded whenever the daemon has a token.
mutations = APIRouter(tags=["jobs"])

_PLANNED: Responses = {
    200: {"model": DryRunView, "description": "dry_run=true: checks passed; the plan, nothing created"}}


@reads.get("/jobs", responses=HOST_ERRORS)
def list_jobs(request: Request, context: Context) -> list[JobView]:
    """Every live job (not dropped) of the namespaces the caller holds a role in, in creation order."""
    principal = principal_of(request)
    return [context.view(r) for r in context.registry.list() if principal.sees(r.spec.namespace)]


@reads.get("/audit", tags=["daemon"], responses=HOST_ERRORS | error_responses(422))
def list_audit(
    request: Request, context: Context,
    job: Annotated[str | None, Query(pattern=NAME_PATTERN, description="Only this job's.")] = None,
    limit: Annotated[int, Query(ge=1, le=10_000, description="The last this many.")] = 100,
) -> list[AuditView]:
    """Accepted mutations, oldest first: who asked what of which job, when (of the caller's namespaces).

    One row per accepted mutation id, also across crashes (``state_root/audit``); refused requests are at
    ``GET /audit/refused``.
    """
    principal = principal_of(request)
    rows = [r for r in context.registry.audit_rows()
            if principal.sees(r["namespace"]) and (job is None or r["job"] == job)]
    return [AuditView(**r) for r in rows[-limit:]]


@reads.get("/audit/refused", tags=["daemon"], responses=HOST_ERRORS | error_responses(422))
def list_refusals(
    request: Request, context: Context,
    job: Annotated[str | None, Query(pattern=NAME_PATTERN, description="Only those naming this job.")] = None,
    limit: Annotated[int, Query(ge=1, le=10_000, description="The last this many.")] = 100,
) -> list[RefusalView]:
    """Refused requests, oldest first: who was refused what, why, when (of the caller's namespaces).

    401s, 403s (a role too low, a quota) and the 404s of a job of another namespace, as rows of
    ``state_root/audit_refused`` written in batches every two seconds (the last seconds' before a crash
    are in the log only). A row about no namespace (a 401, a principal with no role) is shown to the
    admins of every namespace only.
    """
    principal = principal_of(request)
    table = context.registry.refusals
    rows = [] if table is None else table.rows()
    seen = [r for r in rows if (principal.sees(r["namespace"]) if r["namespace"] is not None
                                else principal.is_admin) and (job is None or r["job"] == job)]
    return [RefusalView(**r) for r in seen[-limit:]]


@reads.get("/jobs/{name}", responses=HOST_ERRORS | error_responses(404, 422))
def show_job(name: JobName, context: Context) -> JobView:
    """The job's state, rows and ETA, and per split: stage, backfilled offset, target, rows, lag."""
    return context.view(context.registry.get(name))


@mutations.post("/jobs", status_code=status.HTTP_201_CREATED,
                responses=MUTATION_ERRORS | BODY_ERRORS | _PLANNED)
def create_job(
    spec: JobSpec, request: Request, response: Response, context: Context,
    dry_run_: Annotated[bool, Query(alias="dry_run", description=(
        "Check everything a create checks and answer 200 with the plan (offsets per split, time at the "
        "rate limit and at the measured history rate, retention warnings); nothing is created"))] = False,
) -> JobView | DryRunView:
    """Register a job; it attaches to its source at the next epoch boundary (or, dry run, plan it)."""
    principal = principal_of(request)
    require(request, principal, Role.EDITOR, spec.namespace)
    if context.auth.tenants and spec.namespace == DEFAULT_NAMESPACE and "." in spec.name:
        # "team-a.x" in default would take a name of namespace team-a, and its create would learn of it
        msg = (f'job "{spec.name}": a name with a "." is a namespace\'s ("<namespace>.<name>"); '
               "name it without")
        raise ConfigError(msg)
    try:
        return _create(spec, response, context, dry_run_, actor_of(request))
    except SourceNotFoundError:
        if principal.is_admin:
            raise
        msg = f'unknown source "{spec.source}"'  # not the daemon's list of them
        raise SourceNotFoundError(msg) from None
    except SinkConflictError:
        if principal.is_admin or not context.auth.tenants:
            raise
        msg = f"sink_path {spec.sink_path!r} overlaps the daemon's state or another job's table"  # not whose
        raise SinkConflictError(msg) from None


def _create(
    spec: JobSpec, response: Response, context: Context, dry_run_: bool, by: Actor,
) -> JobView | DryRunView:
    if dry_run_:
        if context.dry_run is None:
            context.registry.check_create(spec)
            plan: dict[str, Any] = {}
        else:
            plan = context.dry_run(spec)
        response.status_code = status.HTTP_200_OK
        return DryRunView(job=spec, **plan)
    record = context.registry.create(spec, by=by)
    response.headers["Location"] = f"/jobs/{record.name}"
    return context.view(record)


@mutations.post("/jobs/{name}/pause", status_code=status.HTTP_202_ACCEPTED, responses=MUTATION_ERRORS)
def pause_job(name: JobName, request: Request, context: Context) -> JobView:
    """Stop reading history for the job (its live rows keep flowing)."""
    return context.view(context.registry.pause(name, by=actor_of(request)))


@mutations.post("/jobs/{name}/resume", status_code=status.HTTP_202_ACCEPTED, responses=MUTATION_ERRORS)
def resume_job(name: JobName, request: Request, context: Context) -> JobView:
    """Read history again."""
    return context.view(context.registry.resume(name, by=actor_of(request)))


@mutations.patch("/jobs/{name}", status_code=status.HTTP_202_ACCEPTED,
                 responses=MUTATION_ERRORS | BODY_ERRORS)
def patch_job(name: JobName, patch: PatchBody, request: Request, context: Context) -> JobView:
    """Change the job's history rate limit or its transform (or both).

    Rate limit: rows/s; null unlimited; 0 reads none and loses nothing (operator). Transform: checked
    like a create's; it applies from the job's next epoch (null: identity) (editor).
    """
    if "transform" in patch.model_fields_set:
        require(request, principal_of(request), Role.EDITOR, context.registry.get(name).spec.namespace)
        context.registry.retransform(name, patch.transform, by=actor_of(request))
    if "rate_limit" in patch.model_fields_set:
        context.registry.throttle(name, patch.rate_limit, by=actor_of(request))
    return context.view(context.registry.get(name))


@mutations.post("/jobs/{name}/repair", status_code=status.HTTP_202_ACCEPTED,
                responses=MUTATION_ERRORS | BODY_ERRORS)
def repair_job(name: JobName, repair: RepairSpec, request: Request, context: Context) -> RepairView:
    """Replace the job's rows of a window with a fresh copy (the job's current transform) in one commit.

    Accepted durably; it runs at the job's next epoch boundary where it can (its splits Finished), and
    ``GET /jobs/{name}`` shows it (``repairs``) until done or failed.
    """
    _, repair_id = context.registry.repair(name, repair, by=actor_of(request))
    return RepairView(id=repair_id, state="pending", window=repair.model_dump(mode="json"))


@mutations.post("/jobs/{name}/retry", status_code=status.HTTP_202_ACCEPTED,
                responses=MUTATION_ERRORS | BODY_ERRORS)
def retry_job(
    name: JobName, request: Request, context: Context,
    start_over: Annotated[RetrySpec | None, Body(description=(
        'None: resume the job from its table. `{"from": "earliest", "new_table": true}` (and `sink`): '
        "from the earliest offsets into a new table, the old one left as it is (editor)."))] = None,
) -> JobView:
    """Run a failed job again: rebuilt from its table at the next epoch (no-op unless it failed).

    With a body, from the earliest offsets into a new table instead (the job's spec changes: its
    ``sink_path`` and ``start``), for a job whose table cannot be resumed (its topic deleted and created
    again): only a failed job (else 409), and its new table is checked like a create's sink (editor).
    """
    if start_over is None:
        return context.view(context.registry.retry(name, by=actor_of(request)))
    principal = principal_of(request)
    require(request, principal, Role.EDITOR, context.registry.get(name).spec.namespace)
    try:
        record = context.registry.retry(name, by=actor_of(request), new_table=start_over)
    except SinkConflictError:
        if principal.is_admin or not context.auth.tenants or start_over.sink is None:
            raise
        msg = f"sink {start_over.sink!r} overlaps the daemon's state or another job's table"  # not whose
        raise SinkConflictError(msg) from None
    return context.view(record)


@mutations.delete("/jobs/{name}", status_code=status.HTTP_202_ACCEPTED, responses=MUTATION_ERRORS)
def drop_job(name: JobName, request: Request, context: Context) -> JobView:
    """Detach the job at the next epoch boundary; its table is left as it is."""
    return context.view(context.registry.drop(name, by=actor_of(request)))
